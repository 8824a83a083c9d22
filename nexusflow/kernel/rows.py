"""Rows read and inserted by SQL built once per model, not by a queryset compiled per call.

The stores' locking reads and :func:`nexusflow.kernel.models.insert` run on
every claim, grant, dispatch and step transaction. Compiling a queryset for
each of them (Django's ``SQLCompiler.as_sql``, its converters, ``save()``'s
insert query) was the largest share of a worker's CPU per confirmed effect
(docs/performance.md "Rows without a compiled queryset"). This module keeps,
per model and database, the column list, the converters Django would apply to
each column and the ``INSERT`` statement, and builds instances with
``Model.from_db`` as a queryset does: the same rows, values, types and errors,
no compilation per call.

Only plain equality on a model's own columns is built here; anything else
(lookups, related objects, expressions) stays with the ORM.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.db import connections, models, router

__all__ = ["RowShape", "every_row", "fetch_where", "first_row", "row_shape"]


class RowShape:
    """One model's columns on one database: the ``SELECT`` list, per-column converters and the ``INSERT``.

    Build with :func:`row_shape` (one per ``(model, alias)`` per process).
    """

    def __init__(self, model: type[models.Model], alias: str):
        self.model, self.alias = model, alias
        meta = model._meta
        self.table = meta.db_table
        self.fields = tuple(meta.concrete_fields)
        self.columns_sql = ", ".join(f"`{f.column}`" for f in self.fields)
        connection = connections[alias]
        converters = []
        for index, field in enumerate(self.fields):
            col = field.get_col(self.table)
            funcs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if funcs:
                converters.append((index, col, tuple(funcs)))
        self.converters = tuple(converters)
        #: ``column name or attname or name -> field`` for the equality filters :meth:`where` accepts.
        self.by_name = {}
        for field in self.fields:
            self.by_name.update({field.column: field, field.attname: field, field.name: field})
        self.by_name["pk"] = meta.pk
        self.insert_fields = tuple(f for f in self.fields if f is not meta.auto_field)
        self.insert_sql = (f"INSERT INTO `{self.table}` ({', '.join(f'`{f.column}`' for f in self.insert_fields)}) "
                           f"VALUES ({', '.join(['%s'] * len(self.insert_fields))})")
        pk = meta.pk
        self.pk_converters = tuple(pk.get_db_converters(connection)) if meta.auto_field is pk else ()

    def select_sql(self, where: str, *, extra: str = "", suffix: str = "") -> str:
        """``SELECT <every column>{extra} FROM <table> WHERE {where}{suffix}``."""
        return f"SELECT {self.columns_sql}{extra} FROM `{self.table}` WHERE {where}{suffix}"

    def where(self, filters: dict[str, Any]) -> tuple[str, list[Any]] | None:
        """``(sql, params)`` for ``filters`` (``column = value`` joined by AND), or ``None`` when a filter is not
        plain equality on one of the model's own columns (the caller then uses the ORM).

        Each value is prepared as a lookup would prepare it (``get_db_prep_value``: an identity column's
        canonical check, a typed id's class check, the backend's adaptation).

        Raises:
            InvalidIdentity: a value the column's lookup refuses (before SQL).
        """
        connection = connections[self.alias]
        parts, params = [], []
        for name, value in filters.items():
            field = self.by_name.get(name)
            if field is None or value is None or hasattr(value, "resolve_expression"):
                return None
            if isinstance(value, models.Model):
                # A related row stands for its key, as in a lookup; any other model object is the ORM's to refuse.
                if not (field.is_relation and isinstance(value, field.related_model)) or value.pk is None:
                    return None
                value = value.pk
            parts.append(f"`{field.column}` = %s")
            params.append(field.get_db_prep_value(value, connection, prepared=False))
        return " AND ".join(parts) or "1", params

    def fetch(self, sql: str, params: Sequence[Any], *, extra_columns: int = 0) -> list:
        """Run ``sql`` (from :meth:`select_sql`) and return model instances, as a queryset would build them.

        With ``extra_columns`` the last that many columns of each row are not the model's: each row is then
        ``(instance, (extra values...))``, the extras as the driver returned them.
        """
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            raw = cursor.fetchall()
        return [self.build(row, connection, extra_columns) for row in raw]

    def build(self, row: Sequence[Any], connection, extra_columns: int = 0):
        """One instance from a row of :attr:`columns_sql` (and ``extra_columns`` trailing values)."""
        count = len(self.fields)
        values = list(row[:count])
        for index, col, funcs in self.converters:
            value = values[index]
            for func in funcs:
                value = func(value, col, connection)
            values[index] = value
        instance = self.model.from_db(self.alias, None, values)
        if extra_columns:
            return instance, tuple(row[count:count + extra_columns])
        return instance

    def insert(self, obj: models.Model) -> None:
        """Insert ``obj`` (its primary key unset) as ``save(force_insert=True)`` would, and set its key.

        Each field's ``pre_save`` runs (``auto_now`` stamps) and its value is prepared with
        ``get_db_prep_save``; the key comes back from the driver as the key column's type.
        """
        connection = connections[self.alias]
        params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in self.insert_fields]
        with connection.cursor() as cursor:
            cursor.execute(self.insert_sql, params)
            key = cursor.lastrowid
        for func in self.pk_converters:
            key = func(key, None, connection)
        setattr(obj, self.model._meta.pk.attname, key)
        obj._state.adding = False
        obj._state.db = self.alias


@functools.cache
def _shape(model: type[models.Model], alias: str) -> RowShape:
    return RowShape(model, alias)


def row_shape(model: type[models.Model], alias: str = "default") -> RowShape:
    """The :class:`RowShape` of ``model`` on database ``alias``, built once per process."""
    return _shape(model, alias)


def fetch_where(model: type[models.Model], filters: dict[str, Any], *, alias: str | None = None, order: str = "",
                limit: int | None = None, suffix: str = "", extra: str = "", extra_params: Sequence[Any] = ()
                ) -> list | None:
    """Instances of ``model`` matching equality ``filters``, read by SQL built once per model.

    Args:
        alias: the database (default: the model's read database).
        order: an ``ORDER BY`` list of the model's columns (e.g. ``"`id`"``, ``"`generation` DESC"``).
        limit: at most that many rows.
        suffix: appended last (``" FOR UPDATE"``, ``" LOCK IN SHARE MODE"``...).
        extra: ``", (<sql>) AS `name`"`` read with each row (its parameters ``extra_params``): each row is then
            ``(instance, (value,))``, the value as the driver returned it.

    Returns:
        The rows, or ``None`` when a filter is not plain equality on an own column (the caller then reads
        through the ORM).

    Raises:
        InvalidIdentity: a value the column's lookup refuses (before SQL).
    """
    shape = row_shape(model, alias or router.db_for_read(model))
    built = shape.where(filters)
    if built is None:
        return None
    where, params = built
    tail = (f" ORDER BY {order}" if order else "") + (f" LIMIT {int(limit)}" if limit else "") + suffix
    return shape.fetch(shape.select_sql(where, extra=extra, suffix=tail), [*extra_params, *params],
                       extra_columns=1 if extra else 0)


def first_row(model: type[models.Model], **filters: Any):
    """``model.objects.filter(**filters).first()``: the matching row with the lowest key, or ``None``.

    Plain equality on the model's own columns is read by SQL built once per model; any other filter, or a
    model with a default ordering, goes through the ORM as written. Reads from the model's read database.

    Raises:
        InvalidIdentity: a value the column's lookup refuses (before SQL).
    """
    rows = None if model._meta.ordering else fetch_where(model, filters, order=f"`{model._meta.pk.column}`", limit=1)
    if rows is None:
        return model.objects.filter(**filters).first()
    return rows[0] if rows else None


def every_row(model: type[models.Model], **filters: Any) -> list:
    """``list(model.objects.filter(**filters).order_by("pk"))`` (see :func:`first_row` for what is built here)."""
    rows = fetch_where(model, filters, order=f"`{model._meta.pk.column}`")
    if rows is None:
        return list(model.objects.filter(**filters).order_by("pk"))
    return rows
