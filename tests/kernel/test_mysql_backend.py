"""The database backend opens each atomic() with START TRANSACTION and no SET autocommit (nexusflow/kernel/mysql)."""
from __future__ import annotations

import pytest
from django.db import connection, transaction

pytestmark = pytest.mark.django_db(transaction=True)


def _status() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS WHERE Variable_name IN ('Com_set_option', 'Com_begin', 'Com_commit', "
                       "'Com_rollback')")
        return {name: int(value) for name, value in cursor.fetchall()}


def _session() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@autocommit, @@in_transaction")
        return tuple(cursor.fetchone())


def test_an_atomic_block_is_one_real_transaction_without_set_autocommit():
    connection.ensure_connection()
    before = _status()
    with transaction.atomic():
        assert _session() == (1, 1)  # the session stays in autocommit; START TRANSACTION opened one
        with transaction.atomic():  # a savepoint inside it
            assert _session() == (1, 1)
    assert _session() == (1, 0)
    after = _status()
    # _status() itself adds nothing to these counters; the block was START TRANSACTION ... COMMIT only.
    assert {k: after[k] - before[k] for k in before} == {
        "Com_set_option": 0, "Com_begin": 1, "Com_commit": 1, "Com_rollback": 0}


def test_a_rolled_back_block_keeps_nothing_and_a_new_connection_starts_in_autocommit():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE backend_probe (id INT PRIMARY KEY) ENGINE=InnoDB")
    with pytest.raises(RuntimeError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO backend_probe VALUES (1)")
        raise RuntimeError("roll back")
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM backend_probe")
        assert cursor.fetchone()[0] == 0
    assert _session() == (1, 0)
    # A connection closed inside a transaction: the next one is put in autocommit for real (mysqlclient
    # connects with autocommit off), not left as the closed one's transaction flag says.
    with transaction.atomic():
        connection.close()
    connection.ensure_connection()
    assert _session() == (1, 0)
