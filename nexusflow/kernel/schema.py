"""Schema reconciliation: declared model indexes and unique constraints against the live database.

Seed 000 "The owner-leading intent index is added through existing schema
reconciliation, preserving retained data and rejecting index drift".
Migrations change the schema; this module only reads
``information_schema.STATISTICS`` and reports where the live indexes differ
from what the models declare (``manage.py schema_check``).
"""
from __future__ import annotations

from dataclasses import dataclass

from django.apps import apps
from django.db import connections, router
from django.db.models import UniqueConstraint

from .selectors import live_foreign_key_names, live_indexes


@dataclass(frozen=True)
class Drift:
    """One difference between a model's declaration and the live database."""

    kind: str  # missing_table | missing_index | index_columns | index_uniqueness | missing_unique | unexpected_index
    table: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.kind}\t{self.table}\t{self.name}\t{self.detail}"


@dataclass(frozen=True)
class _Expected:
    name: str | None  # None: Django picks the name (unique=True fields, unique_together)
    columns: tuple[str, ...]  # "col" ascending, "col DESC" descending
    unique: bool


def _declared(model) -> list[_Expected]:
    opts = model._meta
    expected: list[_Expected] = []
    for index in opts.indexes:
        if not index.fields:
            continue  # expression indexes are not compared
        columns = []
        for name in index.fields:
            descending = name.startswith("-")
            column = opts.get_field(name.lstrip("-")).column
            columns.append(f"{column} DESC" if descending else column)
        expected.append(_Expected(index.name, tuple(columns), False))
    for constraint in opts.constraints:
        if isinstance(constraint, UniqueConstraint) and constraint.fields and constraint.condition is None \
                and not constraint.expressions:
            expected.append(_Expected(constraint.name, tuple(opts.get_field(f).column for f in constraint.fields),
                                      True))
    for together in opts.unique_together:
        expected.append(_Expected(None, tuple(opts.get_field(f).column for f in together), True))
    for field in opts.local_fields:
        if field.unique and not field.primary_key:
            expected.append(_Expected(None, (field.column,), True))
    return expected


def _implicit_columns(model) -> set[tuple[str, ...]]:
    """Single-column indexes Django or InnoDB create without a declaration (db_index, foreign keys)."""
    columns = set()
    for field in model._meta.local_fields:
        if field.db_index or field.is_relation:
            columns.add((field.column,))
    return columns


def schema_drift(*, using: str | None = None) -> list[Drift]:
    """Compare every managed model's declared indexes and unique constraints with the live database.

    Args:
        using: only models routed to this database alias (default: every alias).

    Returns:
        The findings, sorted by table and name; empty when the schema matches.
        Named indexes and constraints are compared by name (columns in order,
        uniqueness); Django-named unique columns and ``unique_together`` by
        column list; a live index that nothing declares or implies (a
        ``db_index`` or foreign key column, a foreign key constraint) is
        ``unexpected_index``.
    """
    findings: list[Drift] = []
    for model in apps.get_models():
        opts = model._meta
        if not opts.managed or opts.proxy or opts.swapped:
            continue
        alias = router.db_for_write(model)
        if using is not None and alias != using:
            continue
        if not router.allow_migrate_model(alias, model):
            continue
        table = opts.db_table
        live = live_indexes(connections[alias], table)
        if live is None:
            findings.append(Drift("missing_table", table, "-", f"model {opts.label} has no table in {alias!r}"))
            continue
        expected = _declared(model)
        accounted = {"PRIMARY"}
        for item in expected:
            if item.name is not None:
                accounted.add(item.name)
                found = live.get(item.name)
                if found is None:
                    findings.append(Drift("missing_index", table, item.name, f"expected ({', '.join(item.columns)})"))
                    continue
                if found[0] != item.columns:
                    findings.append(Drift("index_columns", table, item.name,
                                          f"live ({', '.join(found[0])}) expected ({', '.join(item.columns)})"))
                if found[1] != item.unique:
                    findings.append(Drift("index_uniqueness", table, item.name,
                                          f"live {'unique' if found[1] else 'non-unique'}, expected "
                                          f"{'unique' if item.unique else 'non-unique'}"))
            else:
                names = [name for name, (cols, uniq) in live.items() if cols == item.columns and uniq]
                if not names:
                    findings.append(Drift("missing_unique", table, "-", f"expected unique ({', '.join(item.columns)})"))
                accounted.update(names)
        implicit = _implicit_columns(model)
        accounted |= live_foreign_key_names(connections[alias], table)
        for name, (cols, _uniq) in live.items():
            if name in accounted or cols in implicit:
                continue
            findings.append(Drift("unexpected_index", table, name, f"live ({', '.join(cols)}) is not declared"))
    return sorted(findings, key=lambda d: (d.table, d.name, d.kind))
