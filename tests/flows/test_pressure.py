"""Database pressure pauses new durable mutation work; the cold lanes keep moving (seed 004 sections 16.2, 22.7).

Pressure is made for real: threads of this process block on a row lock another thread's open
transaction holds (running statements on this test database), or hold idle connections to it. The
tests wait until the database itself shows that state (``information_schema.PROCESSLIST``), never for
a time, and count what a claim round did by the rows it wrote.
"""
from __future__ import annotations

import pytest
from django.core.management import call_command

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowDependency, FlowRun, FlowStepAttempt
from nexusflow.flows.services import flow_deploy, flow_run_start, flow_try_resume_due_one, flow_try_run_step_one
from nexusflow.kernel import pressure
from nexusflow.kernel.scope import OrgScope
from tests.bench import capacity_flows as cf
from tests.flows.conftest import run_until_idle
from tests.pressure_support import blocked_statements as _blocked_statements
from tests.pressure_support import idle_connections as _idle_connections
from tests.pressure_support import until as _until

pytestmark = pytest.mark.django_db(transaction=True)

#: Statements blocked on the held row lock: the running-statement bound the tests configure.
BLOCKED = 3
#: Idle connections opened beside the test's own for the connection-share case.
IDLE = 4


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


def test_the_published_runtime_policy_sets_the_pressure_bound(settings, capsys):
    """The environment's runtime policy generation, not the built-in setting, bounds the claims: with the
    setting far out of reach, a published bound of ``BLOCKED`` running statements pauses claims; a later
    generation raising it admits them again at once (read every time: ``read_seconds`` 0)."""
    from runtime_outbox.policy import runtime_policy_publish

    settings.NEXUS_PRESSURE_ACTIVE_STATEMENTS = 10_000
    settings.NEXUS_POLICY_READ_SECONDS = 0
    org = OrgScope("pressure-org")
    runs = _chain_runs(org, 1)
    runtime_policy_publish(scope="*", document={"pressure": {"active_statements": BLOCKED, "read_seconds": 0}},
                           authored_by="ops", reason="tight")
    with _blocked_statements(FlowRun.objects.get(pk=runs[0]).plan_id, BLOCKED):
        assert flow_try_run_step_one(worker_id="pressure-worker") is False
        assert _attempts(runs) == 0
        call_command("flows", "pressure", "--json")
        assert '"policy_version": "env.1"' in capsys.readouterr().out
        runtime_policy_publish(scope="*", document={"pressure": {"active_statements": 100, "read_seconds": 0}},
                               authored_by="ops", reason="relaxed")
        assert flow_try_run_step_one(worker_id="pressure-worker") is True
    assert _attempts(runs) == 1


def test_row_lock_waits_at_the_policys_bound_pause_new_step_claims(settings):
    """The server's current row lock waits (``Innodb_row_lock_current_waits``) are a pressure signal of their
    own: with the running-statement bound out of reach, ``BLOCKED`` transactions waiting on a held row lock
    pause claims with ``db_pressure_lock_waits``; a generation raising the bound admits them again."""
    from runtime_outbox.policy import runtime_policy, runtime_policy_publish

    settings.NEXUS_POLICY_READ_SECONDS = 0
    org = OrgScope("pressure-org")
    runs = _chain_runs(org, 1)
    runtime_policy_publish(scope="*", document={"pressure": {"active_statements": 10_000, "lock_waits": BLOCKED,
                                                             "read_seconds": 0}}, authored_by="ops", reason="waits")
    with _blocked_statements(FlowRun.objects.get(pk=runs[0]).plan_id, BLOCKED):
        reading = pressure.read_pressure(runtime_policy().pressure)
        assert reading.lock_waits >= BLOCKED and reading.reason == pressure.PRESSURE_LOCK_WAITS
        assert flow_try_run_step_one(worker_id="pressure-worker") is False and _attempts(runs) == 0
        runtime_policy_publish(scope="*", document={"pressure": {"active_statements": 10_000, "lock_waits": 10_000,
                                                                 "read_seconds": 0}}, authored_by="ops", reason="up")
        assert flow_try_run_step_one(worker_id="pressure-worker") is True
    assert _attempts(runs) == 1
