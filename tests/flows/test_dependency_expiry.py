"""Dependency expiry and terminal convergence (seed 004 section 14.3), on the effect-completion wait.

The run waits in ``EffectCompletion`` for the Runtime intent receipt of its
push; that dependency's compiled expiry policy is ``quarantine`` (an effect
whose receipt never came may or may not have happened). Time passes by
moving the database clock. The races use real concurrent transactions: one
side is held at a named failpoint while the other queues on the run's row.

Bug report reproduced here: two recoveries of one waiting run with the
producer's signal arriving at the timeout boundary; exactly one branch wins,
the signal is consumed at most once, and the final status matches the branch
that ran; the same with the expiring transaction's connection severed.
"""
from __future__ import annotations

import pytest
from django.db import connection, transaction

from nexusflow.flows import policy
from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowAuditEvent, FlowDependency, FlowRun, FlowStepExecution, FlowWakeSignal
from nexusflow.flows.services import flow_try_expire_one, flow_try_repair_one, flow_try_run_step_one, flow_try_wake_one
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.models import OutboundCommand
from runtime_outbox.services import intent_result_record
from tests.concurrency import Worker, race_behind_hold, run_at_once
from tests.conftest import ORG, make_serving_org

from .conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

COMPLETE = "complete:Push_Customer_To_Billing"


@pytest.fixture
def waiting(billing_sandbox):
    """A run waiting in EffectCompletion for its intent receipt (the push itself is never dispatched)."""
    org = make_serving_org(billing_sandbox.base_url)
    save_record(org, {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee", "lifecyclestage": "customer"})
    assert flow_try_run_step_one(worker_id="w")  # EffectSubmit commits the completion step already waiting
    run = FlowRun.objects.get(org_id=ORG)
    assert run.state == t.RUN_WAITING
    return run


def _dependency(run) -> FlowDependency:
    return FlowDependency.objects.get(org_id=ORG, run_id=run.pk)


def _signal(run) -> None:
    """The producer's receipt for the run's intent (its wake signal commits with it; no Flow row is locked)."""
    command = OutboundCommand.objects.get(origin_flow_run_id=run.pk)
    with transaction.atomic():
        intent_result_record(command=command, outcome="finalized", remote_id="cus_1", evidence={"test": "late"})


def _past_deadline(db_clock_advance) -> None:
    db_clock_advance(policy.dependency_deadline_seconds() + 1)


def test_a_receipt_that_never_comes_quarantines_dependency_step_and_run_together(waiting, db_clock_advance):
    dependency = _dependency(waiting)
    assert (dependency.expiry_policy, dependency.state) == ("quarantine", t.DEP_WAITING)
    db_clock_advance(policy.dependency_deadline_seconds() - 60)
    assert flow_try_expire_one() is False  # not yet due
    db_clock_advance(120)
    assert flow_try_expire_one() is True and flow_try_expire_one() is False
    run = FlowRun.objects.get(pk=waiting.pk)
    step = FlowStepExecution.objects.get(pk=run.current_step_id)
    dependency = _dependency(run)
    assert (run.state, step.state, dependency.state) == (t.RUN_QUARANTINED, t.STEP_QUARANTINED, t.DEP_QUARANTINED)
    assert {run.reason_code, step.reason_code, dependency.reason_code} == {"flow_dependency_expired_unknown"}
    assert FlowAuditEvent.objects.filter(run_id=run.pk, event="dependency_expired").count() == 1
    _signal(run)  # a receipt after expiry is kept, never consumed
    assert flow_try_wake_one() is False
    assert FlowWakeSignal.objects.get().state == t.SIGNAL_UNMATCHED
    assert FlowRun.objects.get(pk=run.pk).state == t.RUN_QUARANTINED


@pytest.mark.parametrize("policy_name", ["terminal_failure", "fault_path"])
def test_terminal_and_fault_path_expiry_move_step_and_root_out_of_waiting_atomically(waiting, db_clock_advance,
                                                                                    policy_name):
    """The other two compiled policies, set on the waiting dependency's row (test setup only)."""
    dependency = _dependency(waiting)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE flows_flowdependency SET expiry_policy = %s, `condition` = %s WHERE id = %s",
                       [policy_name, '{"fault_step": "end"}', dependency.pk])
    _past_deadline(db_clock_advance)
    assert flow_try_expire_one() is True
    run = FlowRun.objects.get(pk=waiting.pk)
    waited = FlowStepExecution.objects.get(run=run, plan_step_key=COMPLETE)
    assert (_dependency(run).state, waited.state, waited.reason_code) == (
        t.DEP_EXPIRED, t.STEP_FAILED, "flow_dependency_expired")
    if policy_name == "terminal_failure":
        assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_dependency_expired")
    else:  # the compiled fault successor is the current step, Pending, and the run Runnable, in the same commit
        successor = FlowStepExecution.objects.get(pk=run.current_step_id)
        assert (run.state, successor.plan_step_key, successor.state) == (t.RUN_RUNNABLE, "end", t.STEP_PENDING)
        run_until_idle()
        assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED


def test_expiry_queued_behind_the_wake_finds_the_run_resumed(waiting, holds, db_clock_advance):
    _past_deadline(db_clock_advance)
    _signal(waiting)  # the signal arrives at the timeout boundary
    wake, expire = race_behind_hold(holds, "flow.wake.before_commit", flow_try_wake_one, flow_try_expire_one,
                                    "flows_flowrun")
    assert (wake.error, expire.error, wake.result, expire.result) == (None, None, True, False)
    assert FlowWakeSignal.objects.get().state == t.SIGNAL_CONSUMED
    assert _dependency(waiting).state == t.DEP_SATISFIED
    run_until_idle()
    run = FlowRun.objects.get(pk=waiting.pk)
    assert (run.state, run.reason_code) == (t.RUN_SUCCEEDED, "")
    assert not FlowAuditEvent.objects.filter(run_id=run.pk, event="dependency_expired").exists()


def test_the_wake_queued_behind_expiry_finds_the_run_quarantined(waiting, holds, db_clock_advance):
    _past_deadline(db_clock_advance)
    _signal(waiting)
    expire, wake = race_behind_hold(holds, "flow.dependency.expire_before_commit", flow_try_expire_one,
                                    flow_try_wake_one, "flows_flowrun")
    assert (expire.error, wake.error, expire.result, wake.result) == (None, None, True, False)
    assert FlowWakeSignal.objects.get().state == t.SIGNAL_UNMATCHED  # consumed zero times
    run_until_idle()
    run = FlowRun.objects.get(pk=waiting.pk)
    assert (run.state, _dependency(run).state) == (t.RUN_QUARANTINED, t.DEP_QUARANTINED)


def test_two_expiry_sweeps_and_a_wake_at_the_boundary_end_in_exactly_one_branch(waiting, db_clock_advance):
    _past_deadline(db_clock_advance)
    _signal(waiting)
    results, errors = run_at_once(flow_try_expire_one, flow_try_expire_one, flow_try_wake_one)
    assert errors == []
    expired, woke = sum(results[:2]), results[2]
    assert expired + woke == 1 and expired in (0, 1)
    run_until_idle()
    run = FlowRun.objects.get(pk=waiting.pk)
    signal = FlowWakeSignal.objects.get()
    if woke:
        assert (run.state, signal.state, _dependency(run).state) == (
            t.RUN_SUCCEEDED, t.SIGNAL_CONSUMED, t.DEP_SATISFIED)
    else:
        assert (run.state, signal.state, _dependency(run).state) == (
            t.RUN_QUARANTINED, t.SIGNAL_UNMATCHED, t.DEP_QUARANTINED)
    assert FlowAuditEvent.objects.filter(run_id=run.pk, event="dependency_expired").count() == expired


def test_a_severed_connection_during_expiry_commits_nothing_and_the_wake_then_wins(waiting, holds,
                                                                                   db_clock_advance):
    _past_deadline(db_clock_advance)
    _signal(waiting)
    holds.arm("flow.dependency.expire_before_commit")
    expire = Worker(flow_try_expire_one, "expire")
    expire.start()
    marker = holds.wait_held("flow.dependency.expire_before_commit")
    with connection.cursor() as cursor:  # sever the expiring transaction's session from the server side
        cursor.execute("KILL CONNECTION %s", [expire.connection_id])
    holds.release(marker)
    expire.join(60)
    assert expire.error is not None  # its COMMIT never happened
    assert _dependency(waiting).state == t.DEP_WAITING
    assert flow_try_wake_one() is True
    run_until_idle()
    run = FlowRun.objects.get(pk=waiting.pk)
    assert (run.state, FlowWakeSignal.objects.get().state) == (t.RUN_SUCCEEDED, t.SIGNAL_CONSUMED)
    assert not FlowAuditEvent.objects.filter(run_id=run.pk, event="dependency_expired").exists()


@pytest.mark.parametrize("held", ["expiry", "cancel"])
def test_dependency_expiry_racing_cancel_ends_in_exactly_one_of_them(waiting, holds, db_clock_advance, held):
    """Seed 004 22.3-07: both lock the run first; the one queued behind finds the other's terminal fact."""
    from nexusflow.flows.services import flow_run_delete

    _past_deadline(db_clock_advance)

    def cancel():
        return flow_run_delete(org=OrgScope(ORG), run_id=waiting.pk)

    if held == "expiry":
        first, second = race_behind_hold(holds, "flow.dependency.expire_before_commit", flow_try_expire_one, cancel,
                                         "flows_flowrun")
    else:
        first, second = race_behind_hold(holds, "flow.cancel.before_commit", cancel, flow_try_expire_one,
                                         "flows_flowrun")
    assert (first.error, second.error) == (None, None)
    run_until_idle()
    run = FlowRun.objects.get(pk=waiting.pk)
    dependency = _dependency(run)
    assert run.is_deleted  # the cancel is the public delete either way
    if held == "expiry":
        assert first.result is True
        assert (run.state, dependency.state) == (t.RUN_QUARANTINED, t.DEP_QUARANTINED)  # terminal: only soft-deleted
    else:
        assert second.result is False
        assert (run.state, dependency.state) == (t.RUN_CANCELLED, t.DEP_CANCELLED)
        assert not FlowAuditEvent.objects.filter(run_id=run.pk, event="dependency_expired").exists()


def test_a_run_left_waiting_on_a_satisfied_dependency_is_repaired_root_first(waiting):
    """Invariant corruption (a terminal dependency under a Waiting root) is repaired by replaying the finalizer."""
    dependency = _dependency(waiting)
    with connection.cursor() as cursor:  # the corruption: only the dependency row moved
        cursor.execute("UPDATE flows_flowdependency SET state = %s, version = version + 1 WHERE id = %s",
                       [t.DEP_SATISFIED, dependency.pk])
    _signal(waiting)
    assert flow_try_repair_one() is True and flow_try_repair_one() is False
    run = FlowRun.objects.get(pk=waiting.pk)
    assert (run.state, FlowStepExecution.objects.get(pk=run.current_step_id).state) == (
        t.RUN_RUNNABLE, t.STEP_PENDING)
    assert FlowAuditEvent.objects.filter(run_id=run.pk, event="dependency_repaired").count() == 1


def test_a_run_left_waiting_on_a_quarantined_dependency_is_quarantined_by_repair(waiting):
    dependency = _dependency(waiting)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE flows_flowdependency SET state = %s, reason_code = %s WHERE id = %s",
                       [t.DEP_QUARANTINED, "flow_dependency_expired_unknown", dependency.pk])
    assert flow_try_repair_one() is True
    run = FlowRun.objects.get(pk=waiting.pk)
    assert (run.state, run.reason_code) == (t.RUN_QUARANTINED, "flow_dependency_expired_unknown")

