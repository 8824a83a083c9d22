"""A deadlock victim's whole transaction runs again (nexusflow.kernel.retry), on a real MariaDB deadlock."""
from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection, transaction

from nexusflow.kernel.retry import retry_deadlock_victim
from tests.concurrency import run_at_once

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def probe():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE retry_probe (id INT PRIMARY KEY, hits INT NOT NULL) ENGINE=InnoDB")
        cursor.execute("INSERT INTO retry_probe VALUES (1, 0), (2, 0)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE retry_probe")


def _crossing(calls: list[str]):
    """Two transactions that lock rows 1 and 2 in opposite orders, each after both hold their first row."""
    both_hold_first = threading.Barrier(2)

    def locker(first: int, second: int):
        def run():
            rerun = f"{first}->{second}" in calls
            calls.append(f"{first}->{second}")
            with transaction.atomic(durable=True), connection.cursor() as cursor:
                cursor.execute("SELECT id FROM retry_probe WHERE id = %s FOR UPDATE", [first])
                if not rerun:  # the first runs meet here, so each holds one row and wants the other's
                    both_hold_first.wait(timeout=60)
                cursor.execute("SELECT id FROM retry_probe WHERE id = %s FOR UPDATE", [second])
                cursor.execute("UPDATE retry_probe SET hits = hits + 1 WHERE id IN (1, 2)")
            return True
        return run

    return locker(1, 2), locker(2, 1)


def _hits() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT hits FROM retry_probe ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


def test_without_the_retry_one_of_two_crossing_transactions_is_a_deadlock_victim(probe):
    calls: list[str] = []
    results, errors = run_at_once(*_crossing(calls))
    assert len(errors) == 1 and isinstance(errors[0], OperationalError) and errors[0].args[0] == 1213
    assert _hits() == [1, 1]  # the victim's update was rolled back whole


def test_the_victim_runs_again_and_both_transactions_commit_once(probe):
    calls: list[str] = []
    results, errors = run_at_once(*(retry_deadlock_victim(fn) for fn in _crossing(calls)))
    assert errors == [] and results == [True, True]
    assert len(calls) == 3  # two first runs and the victim's second
    assert _hits() == [2, 2]


def test_the_retry_refuses_to_run_inside_a_callers_transaction(probe):
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside one"):
        retry_deadlock_victim(lambda: True)()
