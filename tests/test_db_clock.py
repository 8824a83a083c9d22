"""``db_clock_advance`` moves the database clock the code reads (``db_now``), never real time (tests/db_clock.py)."""
import datetime as dt

import pytest
from django.db import connection

from nexusflow.kernel import clock, selectors
from nexusflow.kernel.clock import db_now
from tests.concurrency import run_at_once
from tests.conftest import run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CHILD_READS_THE_CLOCK = "from nexusflow.kernel.clock import db_now; print(db_now().isoformat())"


def _unmoved() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT UTC_TIMESTAMP(6)")
        return cursor.fetchone()[0].replace(tzinfo=dt.UTC)


def _child_now(env: dict) -> dt.datetime:
    child = run_manage(["shell", "-c", CHILD_READS_THE_CLOCK], env, timeout=60)
    assert child.returncode == 0, child.stderr[-2000:]
    return dt.datetime.fromisoformat(child.stdout.strip().splitlines()[-1])


def test_the_moved_clock_is_read_in_this_thread_other_threads_and_later_child_processes(db_clock_advance):
    start = _unmoved()
    env_before = subprocess_env()
    db_clock_advance(3600)
    db_clock_advance(1800)
    assert 5400 <= (db_now() - start).total_seconds() < 5400 + 60
    assert 5400 <= (db_now(using="control") - start).total_seconds() < 5400 + 60
    (seen,), errors = run_at_once(db_now)
    assert not errors, errors
    assert 5400 <= (seen - start).total_seconds() < 5400 + 60
    assert 5400 <= (_child_now(subprocess_env()) - start).total_seconds() < 5400 + 60
    assert (_child_now(env_before) - start).total_seconds() < 60  # an environment built before the move
    assert (_unmoved() - start).total_seconds() < 60  # no real time was spent


def test_the_clock_only_moves_forward(db_clock_advance):
    for seconds in (0, -1):
        with pytest.raises(ValueError, match="only moves forward"):
            db_clock_advance(seconds)
    assert abs((db_now() - _unmoved()).total_seconds()) < 60


def test_the_next_test_reads_the_unmoved_clock_again():
    assert clock.database_utc_timestamp is selectors.database_utc_timestamp
    assert "DJANGO_SETTINGS_MODULE" not in subprocess_env() or subprocess_env()["DJANGO_SETTINGS_MODULE"] != \
        "tests.db_clock_settings"
    assert abs((db_now() - _unmoved()).total_seconds()) < 60
