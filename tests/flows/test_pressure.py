"""Database pressure pauses new durable mutation work; the cold lanes keep moving (seed 004 sections 16.2, 22.7).

Pressure is made for real: threads of this process block on a row lock another thread's open
transaction holds (running statements on this test database), or hold idle connections to it. The
tests wait until the database itself shows that state (``information_schema.PROCESSLIST``), never for
a time, and count what a claim round did by the rows it wrote.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowDependency, FlowExecutionPlan, FlowRun, FlowStepAttempt
from nexusflow.flows.services import flow_deploy, flow_run_start, flow_try_resume_due_one, flow_try_run_step_one
from nexusflow.kernel import pressure
from nexusflow.kernel.scope import OrgScope
from tests.bench import capacity_flows as cf
from tests.flows.conftest import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

#: Statements blocked on the held row lock: the running-statement bound the tests configure.
BLOCKED = 3
#: Idle connections opened beside the test's own for the connection-share case.
IDLE = 4
#: The longest a proven state may take to appear before the test fails (it is never waited out).
STATE_DEADLINE_SECONDS = 30.0


def _until(what: str, done) -> None:
    """Poll ``done()`` until it is true; fail after :data:`STATE_DEADLINE_SECONDS` (a stuck state, not a slow one)."""
    deadline = time.monotonic() + STATE_DEADLINE_SECONDS
    while not done():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.02)


@contextmanager
def _blocked_statements(row_pk: int, count: int):
    """``count`` threads each run ``SELECT ... FOR UPDATE`` of one FlowExecutionPlan row while another thread's
    open transaction holds it: ``count`` running statements on this database until the block ends."""
    held, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold():
        try:
            with transaction.atomic():
                FlowExecutionPlan.objects.select_for_update().get(pk=row_pk)
                held.set()
                release.wait(STATE_DEADLINE_SECONDS * 2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    def wait_for_row():
        try:
            with transaction.atomic():
                FlowExecutionPlan.objects.select_for_update().get(pk=row_pk)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(STATE_DEADLINE_SECONDS)
    waiters = [threading.Thread(target=wait_for_row) for _ in range(count)]
    for waiter in waiters:
        waiter.start()
    try:
        _until(f"{count} statements blocked", lambda: pressure.read_pressure().active_statements >= count)
        yield
    finally:
        release.set()
        for thread in (holder, *waiters):
            thread.join(STATE_DEADLINE_SECONDS)
    assert not errors, errors


@contextmanager
def _idle_connections(count: int):
    """``count`` threads each hold an open, idle connection to this database for the block."""
    opened, release = threading.Semaphore(0), threading.Event()

    def idle():
        try:
            connection.ensure_connection()
            opened.release()
            release.wait(STATE_DEADLINE_SECONDS * 2)
        finally:
            connection.close()

    threads = [threading.Thread(target=idle) for _ in range(count)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert opened.acquire(timeout=STATE_DEADLINE_SECONDS)
    try:
        yield
    finally:
        release.set()
        for thread in threads:
            thread.join(STATE_DEADLINE_SECONDS)


@pytest.fixture
def pressure_bounds(settings):
    """Bounds a test can reach: ``BLOCKED`` running statements; every round reads the signals afresh."""
    settings.NEXUS_PRESSURE_ACTIVE_STATEMENTS = BLOCKED
    settings.NEXUS_PRESSURE_READ_SECONDS = 0
    return settings


def _chain_runs(org: OrgScope, count: int) -> list[int]:
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain_One")
    return [flow_run_start(org=org, flow_api_name="Chain_One", inputs={"counter": 0}).run.pk for _ in range(count)]


def _attempts(run_ids: list[int]) -> int:
    return FlowStepAttempt.objects.filter(step__run_id__in=run_ids).count()


def test_running_statements_at_the_bound_pause_new_step_claims_until_they_finish(pressure_bounds):
    """Proof 22.7-05 (running statements): with ``BLOCKED`` statements running on the database, a claim
    round admits no new mutation work (no attempt, every run still ``Runnable``) although runs are due and
    connections are far from the server's limit; once the statements finish, the next round claims."""
    org = OrgScope("pressure-org")
    runs = _chain_runs(org, 3)
    plan_pk = FlowRun.objects.get(pk=runs[0]).plan_id
    with _blocked_statements(plan_pk, BLOCKED):
        reading = pressure.read_pressure()
        assert reading.reason == pressure.PRESSURE_ACTIVE_STATEMENTS
        assert reading.connections < reading.max_connections  # paused long before the server refuses anyone
        assert flow_try_run_step_one(worker_id="pressure-worker") is False
        assert pressure.mutation_admission() == pressure.PRESSURE_ACTIVE_STATEMENTS
        assert _attempts(runs) == 0
        assert set(FlowRun.objects.filter(pk__in=runs).values_list("state", flat=True)) == {t.RUN_RUNNABLE}
    _until("the blocked statements finished", lambda: pressure.read_pressure().reason == "")
    assert flow_try_run_step_one(worker_id="pressure-worker") is True
    assert _attempts(runs) >= 1
    run_until_idle()
    assert set(FlowRun.objects.filter(pk__in=runs).values_list("state", flat=True)) == {t.RUN_SUCCEEDED}


def test_connections_at_their_share_of_max_connections_pause_new_step_claims(pressure_bounds):
    """Proof 22.7-05 (connections): once this account's sessions reach the configured share of
    ``max_connections`` (here: half of ``IDLE`` below the sessions open while ``IDLE`` more are held),
    claims pause, with connections still to spare below the server's limit; closing them resumes claims."""
    org = OrgScope("pressure-org")
    runs = _chain_runs(org, 2)
    with _idle_connections(IDLE):
        held = pressure.read_pressure()
        assert held.connections >= IDLE and held.max_connections > held.connections + 1
        pressure_bounds.NEXUS_PRESSURE_CONNECTION_SHARE = (held.connections - IDLE // 2) / held.max_connections
        reading = pressure.read_pressure()
        assert reading.reason == pressure.PRESSURE_CONNECTIONS and reading.connections < reading.max_connections
        assert flow_try_run_step_one(worker_id="pressure-worker") is False
        assert _attempts(runs) == 0
    _until("the idle connections closed", lambda: pressure.read_pressure().reason == "")
    assert flow_try_run_step_one(worker_id="pressure-worker") is True


def test_due_waits_complete_under_pressure_while_new_steps_wait(pressure_bounds, db_clock_advance):
    """Proof 22.7-06: under mutation pressure the dependency lane keeps moving. A run waiting on a time
    wait that falls due is resumed (its dependency satisfied, the run ``Runnable`` again) while a claim
    round admits no step of it or of any other run; with the pressure gone both runs finish."""
    org = OrgScope("pressure-org")
    flow_deploy(org=org, source=cf.wait_days(2), flow_api_name="Wait_Days")
    waiting = flow_run_start(org=org, flow_api_name="Wait_Days", inputs={}).run.pk
    run_until_idle()
    assert FlowRun.objects.get(pk=waiting).state == t.RUN_WAITING
    runs = _chain_runs(org, 2)
    db_clock_advance(2 * 86400 + 60)
    attempts_before = _attempts([waiting, *runs])
    plan_pk = FlowRun.objects.get(pk=waiting).plan_id
    with _blocked_statements(plan_pk, BLOCKED):
        assert flow_try_run_step_one(worker_id="pressure-worker") is False
        assert flow_try_resume_due_one() is True
        assert FlowRun.objects.get(pk=waiting).state == t.RUN_RUNNABLE
        assert set(FlowDependency.objects.filter(run_id=waiting).values_list("state", flat=True)) == {
            t.DEP_SATISFIED}
        assert flow_try_run_step_one(worker_id="pressure-worker") is False
        assert _attempts([waiting, *runs]) == attempts_before
    _until("the blocked statements finished", lambda: pressure.read_pressure().reason == "")
    run_until_idle()
    assert set(FlowRun.objects.filter(pk__in=[waiting, *runs]).values_list("state", flat=True)) == {
        t.RUN_SUCCEEDED}


def test_flows_pressure_reports_the_reading_and_the_bounds(pressure_bounds, capsys):
    with _blocked_statements(_plan_pk_for_command(), BLOCKED):
        call_command("flows", "pressure", "--json")
    out = capsys.readouterr().out
    assert '"reason": "db_pressure_active_statements"' in out and '"admitted": false' in out
    _until("the blocked statements finished", lambda: pressure.read_pressure().reason == "")
    call_command("flows", "pressure")
    assert "new durable mutation work: admitted" in capsys.readouterr().out


def _plan_pk_for_command() -> int:
    org = OrgScope("pressure-org")
    return flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain_One").plan.pk
