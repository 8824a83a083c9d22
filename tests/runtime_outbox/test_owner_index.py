"""Seed 000: the owner-leading intent index is added by a migration that keeps retained rows, and
``manage.py schema_check`` rejects index drift against the live database."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from runtime_outbox.models import OutboundCommand
from tests.conftest import ORG
from tests.connectors.push_helpers import contact, push_env, save

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

TABLE = "runtime_outbox_outboundcommand"
INDEX = "outbound_command_owner_idx"
OWNER_LEADING = ("org_id", "source_object", "source_record_key", "id")
BEFORE = ("runtime_outbox", "0005_outbound_effects")
AFTER = ("runtime_outbox", "0006_owner_leading_intent_index")


def _index_columns() -> tuple[str, ...]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() "
                       "AND TABLE_NAME = %s AND INDEX_NAME = %s ORDER BY SEQ_IN_INDEX", [TABLE, INDEX])
        return tuple(row[0] for row in cursor.fetchall())


def _migrate(target) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


def _latest() -> tuple[str, str]:
    """The app's newest migration: the schema every later test expects."""
    executor = MigrationExecutor(connection)
    [leaf] = executor.loader.graph.leaf_nodes("runtime_outbox")
    return leaf


def _schema_check() -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("schema_check", stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_the_owner_leading_index_migration_keeps_retained_rows_back_and_forward(billing_sandbox,
                                                                              hubspot_crm_sandbox):
    push_env(billing_sandbox, hubspot_crm_sandbox)
    commands = [save(contact(f"p{i}@x.io"), deliver=False) for i in range(3)]
    retained = sorted(OutboundCommand.objects.filter(org_id=ORG).values_list("pk", "idempotency_key"))
    assert _index_columns() == OWNER_LEADING

    _migrate(BEFORE)
    assert _index_columns() == OWNER_LEADING[:3]
    _migrate(AFTER)
    assert _index_columns() == OWNER_LEADING
    assert sorted(OutboundCommand.objects.filter(org_id=ORG).values_list("pk", "idempotency_key")) == retained
    assert len(retained) == len(commands)
    _migrate(_latest())
    assert _schema_check()[0] == 0


def test_schema_check_names_a_drifted_or_missing_index_and_passes_once_restored():
    assert _schema_check()[0] == 0
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} DROP INDEX {INDEX}, "
                           f"ADD INDEX {INDEX} (source_record_key, org_id, source_object)")
        code, out = _schema_check()
        assert code == 1
        [line] = [line for line in out.splitlines() if INDEX in line]
        assert line.split("\t")[:3] == ["index_columns", TABLE, INDEX]
        assert "live (source_record_key, org_id, source_object)" in line

        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} DROP INDEX {INDEX}")
        code, out = _schema_check()
        assert code == 1 and f"missing_index\t{TABLE}\t{INDEX}\t" in out

        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} ADD INDEX stray_owner_idx (source_record_key)")
        code, out = _schema_check()
        assert f"unexpected_index\t{TABLE}\tstray_owner_idx\t" in out
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() "
                           "AND TABLE_NAME = %s AND INDEX_NAME IN (%s, 'stray_owner_idx')", [TABLE, INDEX])
            for (name,) in set(cursor.fetchall()):
                cursor.execute(f"ALTER TABLE {TABLE} DROP INDEX {name}")
            cursor.execute(f"ALTER TABLE {TABLE} ADD INDEX {INDEX} ({', '.join(OWNER_LEADING)})")
    assert _schema_check() == (0, "schema matches the declared indexes and unique constraints\n")
