"""``run_workers`` counts the statements of each unit, split into work and idle polls (docs/performance.md)."""
from __future__ import annotations

import json

import pytest
from django.db import connection

from runtime_outbox.management.commands.run_workers import UnitStatements
from tests.conftest import run_manage, subprocess_env


@pytest.mark.django_db(transaction=True)
def test_each_statement_goes_to_the_unit_that_issued_it_and_to_work_or_idle():
    counter = UnitStatements()
    connection.ensure_connection()  # a connection opened inside the wrapper would count its session set-up too
    with connection.execute_wrapper(counter), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.execute("SELECT 2")
        counter.record("a.unit", worked=True)
        cursor.execute("SELECT 3")
        counter.record("a.unit", worked=False)
        counter.record("b.unit", worked=False)  # a unit that issued nothing
        cursor.execute("SELECT 4")
        counter.record("a.unit", worked=True)
    assert counter.summary() == {
        "a.unit": {"worked_statements": 3, "idle_statements": 1, "units": 2},
        "b.unit": {"worked_statements": 0, "idle_statements": 0, "units": 0},
    }


@pytest.mark.django_db(transaction=True)
def test_the_stop_line_of_a_real_worker_reports_its_idle_polls():
    result = run_manage(["run_workers", "--role", "runtime", "--once"], subprocess_env())
    assert result.returncode == 0, result.stderr[-2000:]
    stop = next(json.loads(line[line.index("{"):]) for line in result.stderr.splitlines()
                if '"worker.stop"' in line)
    statements = stop["statements"]
    assert statements, stop
    assert all(figures["units"] == 0 and figures["worked_statements"] == 0 for figures in statements.values())
    assert sum(figures["idle_statements"] for figures in statements.values()) > 0
