"""Test helpers for generation and epoch tests: simulate owner rows mutated outside their owner."""
from __future__ import annotations

from django.db import connection


def tamper_row(model, pk, **columns) -> None:
    """Overwrite ``columns`` of one row with raw SQL, as a broken writer or restore would (never via the ORM)."""
    table = connection.ops.quote_name(model._meta.db_table)
    assignments = ", ".join(f"{connection.ops.quote_name(model._meta.get_field(name).column)} = %s"
                            for name in columns)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {assignments} WHERE id = %s", [*columns.values(), int(pk)])
        assert cursor.rowcount == 1
