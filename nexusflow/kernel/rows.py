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

__all__ = ["RowShape", "every_row", "fetch_joined", "fetch_where", "first_row", "get_joined",
           "get_row", "row_exists", "row_max", "row_shape"]


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
        self.converters_of = {self.fields[index]: (col, funcs) for index, col, funcs in self.converters}
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

    def columns_as(self, alias: str) -> str:
        """The ``SELECT`` list of every column qualified by the table alias ``alias`` (for a join)."""
        return ", ".join(f"{alias}.`{f.column}`" for f in self.fields)

    def select_sql(self, where: str, *, extra: str = "", suffix: str = "") -> str:
        """``SELECT <every column>{extra} FROM <table> WHERE {where}{suffix}``."""
        return f"SELECT {self.columns_sql}{extra} FROM `{self.table}` WHERE {where}{suffix}"

    def where(self, filters: dict[str, Any], *, prefix: str = "") -> tuple[str, list[Any]] | None:
        """``(sql, params)`` for ``filters`` joined by AND, each ``column = value`` or (``column__in``) ``column
        IN (values)``, the columns qualified by ``prefix`` (``"T0."``); ``None`` when a filter is another lookup
        or not on one of the model's own columns (the caller then uses the ORM).

        Each value is prepared as a lookup would prepare it (``get_db_prep_value``: an identity column's
        canonical check, a typed id's class check, the backend's adaptation). ``__in`` an empty list, tuple or
        set matches nothing, as the ORM answers it.

        Raises:
            InvalidIdentity: a value the column's lookup refuses (before SQL).
        """
        connection = connections[self.alias]
        parts, params = [], []
        for name, value in filters.items():
            many = name.endswith("__in")
            field = self.by_name.get(name[:-4] if many else name)
            built = None if field is None else _condition(field, value, many, prefix, connection)
            if built is None:
                return None
            parts.append(built[0])
            params.extend(built[1])
        return " AND ".join(parts) or "1", params

    def convert(self, field, value: Any, connection) -> Any:
        """``value`` of column ``field`` as the driver returned it, through Django's converters for it."""
        funcs = self.converters_of.get(field)
        if funcs is not None and value is not None:
            col, funcs = funcs
            for func in funcs:
                value = func(value, col, connection)
        return value

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


def _condition(field, value: Any, many: bool, prefix: str, connection) -> tuple[str, list[Any]] | None:
    """``(sql, params)`` of one equality (or, ``many``, ``IN``) filter on ``field``; ``None`` when not plain."""
    if many and not isinstance(value, (list, tuple, set, frozenset)):
        return None
    prepared = [_prepared(field, one, connection) for one in (value if many else [value])]
    if None in prepared:
        return None
    if not many:
        return f"{prefix}`{field.column}` = %s", [prepared[0][0]]
    if not prepared:
        return "0", []
    return f"{prefix}`{field.column}` IN ({', '.join(['%s'] * len(prepared))})", [one[0] for one in prepared]


def _prepared(field, value: Any, connection) -> tuple[Any] | None:
    """``(value prepared as an equality lookup on field prepares it,)``, or ``None`` when it is not plain."""
    if value is None or hasattr(value, "resolve_expression"):
        return None
    if isinstance(value, models.Model):
        # A related row stands for its key, as in a lookup; any other model object is the ORM's to refuse.
        if not (field.is_relation and isinstance(value, field.related_model)) or value.pk is None:
            return None
        value = value.pk
    return (field.get_db_prep_value(value, connection, prepared=False),)


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


def row_exists(model: type[models.Model], **filters: Any) -> bool:
    """``model.objects.filter(**filters).exists()``, by SQL built once per model when the filters are plain
    equality (see :func:`first_row`).

    Raises:
        InvalidIdentity: a value the column's lookup refuses (before SQL).
    """
    shape = row_shape(model, router.db_for_read(model))
    built = shape.where(filters)
    if built is None:
        return model.objects.filter(**filters).exists()
    with connections[shape.alias].cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM `{shape.table}` WHERE {built[0]} LIMIT 1", built[1])
        return cursor.fetchone() is not None


def row_max(model: type[models.Model], column: str, **filters: Any):
    """``model.objects.filter(**filters).aggregate(m=Max(column))["m"]`` (``None`` when no row matches), by SQL
    built once per model when the filters are plain equality (see :func:`first_row`).

    Raises:
        InvalidIdentity: a value the column's lookup refuses (before SQL).
    """
    shape = row_shape(model, router.db_for_read(model))
    field = shape.by_name[column]
    built = shape.where(filters)
    if built is None:
        from django.db.models import Max

        return model.objects.filter(**filters).aggregate(m=Max(column))["m"]
    connection = connections[shape.alias]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MAX(`{field.column}`) FROM `{shape.table}` WHERE {built[0]}", built[1])
        return shape.convert(field, cursor.fetchone()[0], connection)


#: ``get_row``'s ``lock`` values: the locking clause and the queryset call it stands for.
_LOCKS = {"": ("", lambda qs: qs), "update": (" FOR UPDATE", lambda qs: qs.select_for_update()),
          "update_nowait": (" FOR UPDATE NOWAIT", lambda qs: qs.select_for_update(nowait=True))}


def get_row(model: type[models.Model], filters: dict[str, Any], *, lock: str = ""):
    """``model.objects.get(**filters)``, or with ``lock="update"`` (``"update_nowait"``)
    ``model.objects.select_for_update([nowait=True]).get(**filters)``, built as :func:`first_row` is.

    Raises:
        model.DoesNotExist: no row matches.
        model.MultipleObjectsReturned: more than one row matches.
        django.db.OperationalError: ``update_nowait`` and another transaction holds the row.
        InvalidIdentity: a value the column's lookup refuses (before SQL).
    """
    suffix, queryset = _LOCKS[lock]
    rows = fetch_where(model, filters, limit=_GET_LIMIT, suffix=suffix)
    if rows is None:
        return queryset(model.objects.all()).get(**filters)
    return _the_one(model, rows)


#: Rows a ``get()`` reads at most, as Django's own (``MAX_GET_RESULTS``).
_GET_LIMIT = 21


def _the_one(model: type[models.Model], rows: list):
    """The one row of ``rows``, or ``get()``'s errors (``rows`` read with at most :data:`_GET_LIMIT`)."""
    if not rows:
        raise model.DoesNotExist(f"{model._meta.object_name} matching query does not exist.")
    if len(rows) > 1:
        raise model.MultipleObjectsReturned(f"get() returned more than one {model._meta.object_name} -- it "
                                            f"returned {len(rows) if len(rows) < _GET_LIMIT else 'more than 20'}!")
    return rows[0]


def every_row(model: type[models.Model], **filters: Any) -> list:
    """``list(model.objects.filter(**filters).order_by("pk"))`` (see :func:`first_row` for what is built here)."""
    rows = fetch_where(model, filters, order=f"`{model._meta.pk.column}`")
    if rows is None:
        return list(model.objects.filter(**filters).order_by("pk"))
    return rows


class _Joined:
    """A model read with forward foreign keys followed (``select_related``'s rows), its SQL built once.

    Table aliases are ``T0`` (the model) and ``T1``... (each related model, in the order the paths name them);
    a key that may be null, or one reached through such a key, is a ``LEFT OUTER JOIN``, any other an inner
    join, as Django joins them.
    """

    def __init__(self, model: type[models.Model], related: tuple[str, ...], alias: str):
        self.base = row_shape(model, alias)
        #: ``(path, parent index, field, shape, outer)``; index 0 is the model itself.
        self.nodes: list[tuple[str, int, Any, RowShape, bool]] = [("", -1, None, self.base, False)]
        index = {"": 0}
        for path in related:
            parts = path.split("__")
            for depth in range(len(parts)):
                sub, parent = "__".join(parts[:depth + 1]), "__".join(parts[:depth])
                if sub in index:
                    continue
                parent_node = self.nodes[index[parent]]
                field = parent_node[3].model._meta.get_field(parts[depth])
                if not (field.concrete and (field.many_to_one or field.one_to_one)):
                    raise ValueError(f"{path}: {field.name} is not a forward foreign key of {parent_node[3].model}")
                outer = bool(field.null or parent_node[4])
                index[sub] = len(self.nodes)
                self.nodes.append((sub, index[parent], field, row_shape(field.related_model, alias), outer))
        self.index = index
        columns, joins = [], []
        for i, (_path, parent, field, shape, outer) in enumerate(self.nodes):
            columns.append(shape.columns_as(f"T{i}"))
            if i:
                joins.append(f" {'LEFT OUTER' if outer else 'INNER'} JOIN `{shape.table}` T{i} "
                             f"ON (T{parent}.`{field.column}` = T{i}.`{field.target_field.column}`)")
        self.head = f"SELECT {', '.join(columns)} FROM `{self.base.table}` T0{''.join(joins)}"

    def where(self, filters: dict[str, Any]) -> tuple[str, list[Any]] | None:
        """As :meth:`RowShape.where`, a filter naming its model by path (``"plan__trigger_object_name"``)."""
        parts, params = [], []
        for name, value in filters.items():
            path, _, column = name.removesuffix("__in").rpartition("__")
            node = self.index.get(path) if path else 0
            built = None if node is None else self.nodes[node][3].where(
                {name[len(path) + 2:] if path else name: value}, prefix=f"T{node}.")
            if built is None:
                return None
            parts.append(built[0])
            params.extend(built[1])
        return " AND ".join(parts) or "1", params

    def build(self, row: Sequence[Any], connection):
        objects, at = [], 0
        for _path, parent, field, shape, _outer in self.nodes:
            count = len(shape.fields)
            values = row[at:at + count]
            at += count
            pk_at = shape.fields.index(shape.model._meta.pk)
            obj = None if values[pk_at] is None else shape.build(values, connection)
            objects.append(obj)
            if field is not None and objects[parent] is not None:
                field.set_cached_value(objects[parent], obj)
                if obj is not None and field.one_to_one:
                    field.remote_field.set_cached_value(obj, objects[parent])
        return objects[0]


@functools.cache
def _joined(model: type[models.Model], related: tuple[str, ...], alias: str) -> _Joined:
    return _Joined(model, related, alias)


def fetch_joined(model: type[models.Model], related: Sequence[str], filters: dict[str, Any], *, order: str = "",
                 limit: int | None = None, suffix: str = "") -> list | None:
    """``model.objects.select_related(*related).filter(**filters)`` by SQL built once per model and paths.

    Args:
        related: forward foreign-key paths (``"projection__event__epoch"``); each related instance is cached
            on its parent as ``select_related`` caches it (``None`` where a nullable key is null).
        filters: plain equality on a column of the model (``"state"``) or of a related model on those paths
            (``"plan__trigger_object_name"``), or ``__in`` a list, tuple or set of values (empty: no row).
        order: an ``ORDER BY`` list naming columns by table alias (``"T0.`id`"``).

    Returns:
        The instances, or ``None`` when a filter is not plain equality on such a column (the caller then
        reads through the ORM).

    Raises:
        ValueError: a path is not a chain of forward foreign keys (a programming error).
        InvalidIdentity: a value the column's lookup refuses (before SQL).
    """
    alias = router.db_for_read(model)
    joined = _joined(model, tuple(related), alias)
    built = joined.where(filters)
    if built is None:
        return None
    where, params = built
    sql = (f"{joined.head} WHERE {where}" + (f" ORDER BY {order}" if order else "")
           + (f" LIMIT {int(limit)}" if limit else "") + suffix)
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        raw = cursor.fetchall()
    return [joined.build(row, connection) for row in raw]


def get_joined(model: type[models.Model], related: Sequence[str], **filters: Any):
    """``model.objects.select_related(*related).get(**filters)`` (see :func:`fetch_joined`).

    Raises:
        model.DoesNotExist: no row matches.
        model.MultipleObjectsReturned: more than one row matches.
    """
    rows = fetch_joined(model, related, filters, limit=_GET_LIMIT)
    if rows is None:
        return model.objects.select_related(*related).get(**filters)
    return _the_one(model, rows)
