"""Trigger admission, claim, fencing, recovery and crashes of the durable executor (seed 004 section 12).

These tests commit for real (``transaction=True``): races use real threads
with their own connections and crashes kill a real worker process.
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading

import pytest
from django.db import connection, transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import KIND_EFFECT_COMPLETION, KIND_PURE_COMPUTE, KIND_TERMINAL
from nexusflow.flows.errors import WakeSignalConflict, WakeSignalRejected
from nexusflow.flows.models import (
    FlowCheckpoint,
    FlowExecutionPlan,
    FlowRun,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)
from nexusflow.flows.selectors import flow_run_summary, flow_runs_nonterminal_count
from nexusflow.flows.services import (
    admission,
    deploy,
    execute,
    flow_deploy,
    flow_run_delete,
    flow_step_claim_batch,
    flow_step_claim_one,
    flow_step_execute,
    flow_trigger_on_record_saved,
    flow_try_recover_expired_one,
    flow_try_run_step_one,
    flow_wake_signal_accept,
)
from nexusflow.flows.store import FlowRunStore, FlowStepStore
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import FenceRejected, IllegalTransition, LockOrderViolation
from nexusflow.kernel.scope import TrustedRuntimeWorkScope
from nexusflow.records.services import RecordChange
from tests.conftest import ROOT, subprocess_env

from .conftest import decision_flow_xml, run_until_idle, save_record, update_record, wait_for_recovery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def decide_plan(org):
    return flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only").plan


def _run_of(org, record) -> FlowRun:
    return FlowRun.objects.get(org_id=org.org_id, record_key=record.record_key)


# --- admission --------------------------------------------------------------------
def test_trigger_creates_exactly_one_run_for_a_matching_save(org, decide_plan):
    matching = save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    save_record(org, {"lifecyclestage": "lead", "email": "b@example.com"})
    save_record(org, {"email": "c@example.com"})
    assert FlowRun.objects.filter(org_id=org.org_id).count() == 1
    run = _run_of(org, matching)
    assert (run.state, run.version, run.plan_id, run.record_version) == (t.RUN_RUNNABLE, 2, decide_plan.pk, 1)
    assert (run.app_installation_id, run.runtime_capability_id) == ("core", "flow-runtime")
    assert run.binding_digest == decide_plan.runtime_work_binding_digest
    step = run.current_step
    assert (step.plan_step_key, step.step_kind, step.state) == ("decide:Has_Email", KIND_PURE_COMPUTE, t.STEP_PENDING)
    trigger = FlowCheckpoint.objects.get(run=run)
    assert trigger.sequence == 1 and trigger.step_id is None and step.input_checkpoint_id == trigger.pk
    assert trigger.context_payload["record"]["fields"]["email"] == "a@example.com"
    # The same saved version admits once even if the hook runs again.
    matching.refresh_from_db()
    with transaction.atomic():
        flow_trigger_on_record_saved(org=org, record=matching, change=RecordChange(True, frozenset()))
    assert FlowRun.objects.filter(org_id=org.org_id).count() == 1
    # An update that still matches is a new record version: a new run.
    update_record(org, matching, {"firstname": "Ann"})
    assert FlowRun.objects.filter(org_id=org.org_id, record_key=matching.record_key).count() == 2


def test_record_trigger_type_and_other_orgs(org):
    flow_deploy(org=org, source=decision_flow_xml(record_trigger_type="Update"), flow_api_name="Decide_Only")
    record = save_record(org, {"lifecyclestage": "customer"})
    assert not FlowRun.objects.exists()
    update_record(org, record, {"email": "x@example.com"})
    assert FlowRun.objects.filter(record_version=2).count() == 1
    from nexusflow.kernel.scope import OrgScope

    save_record(OrgScope("flows-other-org"), {"lifecyclestage": "customer"})
    assert FlowRun.objects.count() == 1


def test_decision_flow_runs_to_succeeded(org, decide_plan):
    with_email = save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    without = save_record(org, {"lifecyclestage": "customer"})
    assert flow_runs_nonterminal_count(org_id=org.org_id) == 2
    assert run_until_idle() == 1  # one claim batch takes both runs; each decision also finishes its run
    for record, rule in ((with_email, "Yes"), (without, None)):
        run = _run_of(org, record)
        assert run.state == t.RUN_SUCCEEDED and run.completed_at is not None
        steps = list(FlowStepExecution.objects.filter(run=run).order_by("id"))
        assert [(s.plan_step_key, s.state) for s in steps] == [("decide:Has_Email", t.STEP_SUCCEEDED),
                                                               ("end", t.STEP_SUCCEEDED)]
        assert steps[0].output_checkpoint.context_payload["output"] == {"rule": rule, "next": "end"}
        assert list(FlowCheckpoint.objects.filter(run=run).order_by("sequence").values_list("sequence", flat=True)) \
            == [1, 2, 3]
        assert list(FlowStepAttempt.objects.filter(step__run=run).values_list("step_id", "state")) == [
            (steps[0].pk, t.ATTEMPT_COMMITTED)]  # the Terminal step, inserted finished, takes no attempt
        assert steps[-1].output_checkpoint.context_payload["output"] == {"terminal": True}
        assert run.current_step_id == steps[-1].pk
    assert flow_runs_nonterminal_count(org_id=org.org_id) == 0
    assert flow_run_summary()[t.RUN_SUCCEEDED] == 2


@contextlib.contextmanager
def _root_held(org_id: str, run_id, *, seconds: float):
    """Another thread's open transaction holds the run's root lock for the block (at most ``seconds``)."""
    held, done = threading.Event(), threading.Event()

    def hold_root():
        try:
            with transaction.atomic():
                FlowRunStore.lock(org_id, run_id)
                held.set()
                done.wait(seconds)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_root)
    holder.start()
    assert held.wait(10)
    try:
        yield
    finally:
        done.set()
        holder.join(10)


# --- claim -----------------------------------------------------------------------
def test_claim_sets_lease_attempt_and_fences(org, decide_plan):
    record = save_record(org, {"lifecyclestage": "customer"})
    before = db_now()
    claim = flow_step_claim_one(worker_id="worker-1")
    assert claim is not None
    run = _run_of(org, record)
    step = FlowStepExecution.objects.get(pk=claim.step_id)
    attempt = FlowStepAttempt.objects.get(pk=claim.attempt_id)
    assert run.state == t.RUN_RUNNING and run.version == claim.root_version and run.started_at is not None
    assert step.state == t.STEP_CLAIMED and step.lease_owner == "worker-1" and step.attempt_count == 1
    assert step.lease_expires_at > before
    assert step.lease_token_digest == claim.lease_token_digest != claim.lease_token
    assert (attempt.state, attempt.attempt_number, attempt.root_state_version_at_claim) == (
        t.ATTEMPT_STARTED, 1, run.version)
    assert attempt.lease_token_digest == step.lease_token_digest and attempt.plan_digest == decide_plan.plan_digest
    assert flow_step_claim_one(worker_id="worker-2") is None  # nothing else is due
    assert flow_step_execute(claim=claim) == "succeeded"


def test_threads_racing_for_the_same_steps_claim_each_exactly_once(org, decide_plan):
    for i in range(4):
        save_record(org, {"lifecyclestage": "customer", "email": f"{i}@example.com"})
    barrier = threading.Barrier(3)
    claims: dict[str, list] = {"a": [], "b": [], "c": []}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            barrier.wait()
            while (claim := flow_step_claim_one(worker_id=name)) is not None:
                claims[name].append(claim.step_id)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in claims]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors
    won = [step_id for ids in claims.values() for step_id in ids]
    assert len(won) == len(set(won)) == 4
    assert FlowStepAttempt.objects.count() == 4
    assert set(FlowStepExecution.objects.values_list("attempt_count", "state")) == {(1, t.STEP_CLAIMED)}


def test_batch_claims_skip_a_root_another_transaction_holds_and_each_claim_is_its_own_fence(org, decide_plan):
    for i in range(5):
        save_record(org, {"lifecyclestage": "customer", "email": f"{i}@example.com"})
    runs = list(FlowRun.objects.filter(org_id=org.org_id).order_by("id"))
    with _root_held(org.org_id, runs[1].pk, seconds=30):  # a real concurrent transaction holds the root
        claims = flow_step_claim_batch(worker_id="batch", limit=4)
    # Never waited for the held root: the other three of the first four are claimed, in discovery order.
    assert [c.run_id for c in claims] == [runs[0].pk, runs[2].pk, runs[3].pk]
    assert len({c.lease_token for c in claims}) == 3
    assert FlowRun.objects.get(pk=runs[1].pk).state == t.RUN_RUNNABLE
    assert [c.run_id for c in flow_step_claim_batch(worker_id="other", limit=4)] == [runs[1].pk, runs[4].pk]
    # Each claim is its own fence: another claim's lost fence does not move it.
    flow_run_delete(org=org, run_id=claims[0].run_id)
    with pytest.raises(FenceRejected):
        flow_step_execute(claim=claims[0])
    assert [flow_step_execute(claim=c) for c in claims[1:]] == ["succeeded", "succeeded"]
    with pytest.raises(ValueError):
        flow_step_claim_batch(worker_id="batch", limit=0)


def test_a_batch_starts_together_and_a_claim_whose_fence_moved_is_left_out(org, decide_plan):
    for i in range(3):
        save_record(org, {"lifecyclestage": "customer", "email": f"{i}@example.com"})
    claims = flow_step_claim_batch(worker_id="batch", limit=3)
    assert len(claims) == 3
    flow_run_delete(org=org, run_id=claims[1].run_id)  # the middle claim's root moves before the start
    starts = execute._start_batch(claims)
    assert isinstance(starts[claims[1].step_id], FenceRejected)
    assert FlowStepExecution.objects.get(pk=claims[1].step_id).state == t.STEP_CANCEL_REQUESTED
    for claim in (claims[0], claims[2]):
        started = starts[claim.step_id]
        step = FlowStepExecution.objects.get(pk=claim.step_id)
        assert (step.state, step.version) == (t.STEP_RUNNING, started.step_version) != (t.STEP_CLAIMED,
                                                                                         claim.step_version)
        assert flow_step_execute(claim=claim, started=started) == "succeeded"
    assert execute._start_batch([claims[0]])[claims[0].step_id].__class__ is FenceRejected  # already done


# --- fencing and recovery ------------------------------------------------------------
def test_stale_attempt_commit_is_fenced_after_recovery(org, decide_plan, short_lease):
    record = save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    stale = execute._start(flow_step_claim_one(worker_id="slow"))  # Running under a 1 s lease
    wait_for_recovery()
    step = FlowStepExecution.objects.get(pk=stale.step_id)
    assert step.state == t.STEP_RETRY_SCHEDULED and step.lease_token_digest is None
    assert FlowStepAttempt.objects.get(pk=stale.attempt_id).state == t.ATTEMPT_FENCED
    assert _run_of(org, record).state == t.RUN_RUNNABLE
    fresh = flow_step_claim_one(worker_id="fast")
    assert fresh is not None and fresh.step_id == stale.step_id and fresh.attempt_number == 2
    plan = FlowExecutionPlan.objects.get(pk=decide_plan.pk)
    step_def = admission._step_def(plan, stale.step_key)
    with pytest.raises(FenceRejected):
        execute._exec_decision(stale, plan, step_def)  # the old worker reaches its final fence
    with pytest.raises(FenceRejected):
        flow_step_execute(claim=stale)
    assert not FlowCheckpoint.objects.filter(step_id=stale.step_id).exists()
    assert flow_step_execute(claim=fresh) == "succeeded"
    run_until_idle()
    assert _run_of(org, record).state == t.RUN_SUCCEEDED
    assert FlowCheckpoint.objects.filter(step_id=stale.step_id).count() == 1


def test_recovery_keeps_the_backoff_floor(org, decide_plan, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "30")
    save_record(org, {"lifecyclestage": "customer"})
    claim = flow_step_claim_one(worker_id="doomed")
    floor_ms = FlowStepAttempt.objects.get(pk=claim.attempt_id).recovery_backoff_floor_ms
    assert 30_000 <= floor_ms <= 33_000
    wait_for_recovery()
    step = FlowStepExecution.objects.get(pk=claim.step_id)
    assert step.state == t.STEP_RETRY_SCHEDULED
    assert (step.run_after - db_now()).total_seconds() > 25
    assert flow_step_claim_one(worker_id="eager") is None  # not due before its floor
    assert flow_try_recover_expired_one() is False


def test_a_rolled_back_step_is_retried_then_fails_terminally(org, decide_plan, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    monkeypatch.setenv("NEXUS_FLOW_MAX_ATTEMPTS", "2")
    failures = {"left": 1}
    real = execute.EXECUTORS[KIND_PURE_COMPUTE]

    def flaky(claim, plan, step_def):
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("transient")
        return real(claim, plan, step_def)

    monkeypatch.setitem(execute.EXECUTORS, KIND_PURE_COMPUTE, flaky)
    ok = save_record(org, {"lifecyclestage": "customer"})
    claim = flow_step_claim_one(worker_id="w")
    assert flow_step_execute(claim=claim) == "rolled_back"
    attempt = FlowStepAttempt.objects.get(pk=claim.attempt_id)
    assert (attempt.state, attempt.safe_error_code, attempt.retry_decision) == (
        t.ATTEMPT_ROLLED_BACK, "RuntimeError", "scheduled")
    assert FlowStepExecution.objects.get(pk=claim.step_id).state == t.STEP_RETRY_SCHEDULED
    run_until_idle()
    assert _run_of(org, ok).state == t.RUN_SUCCEEDED

    def broken(claim, plan, step_def):
        raise RuntimeError("always")

    monkeypatch.setitem(execute.EXECUTORS, KIND_PURE_COMPUTE, broken)
    doomed = save_record(org, {"lifecyclestage": "customer"})
    run_until_idle()
    run = _run_of(org, doomed)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_step_retry_exhausted")
    assert list(FlowStepAttempt.objects.filter(step__run=run).values_list("state", flat=True)) == [
        t.ATTEMPT_ROLLED_BACK, t.ATTEMPT_ROLLED_BACK]


def test_lifecycle_lock_order_is_enforced(org, decide_plan):
    record = save_record(org, {"lifecyclestage": "customer"})
    run = _run_of(org, record)
    with transaction.atomic():
        FlowStepStore.lock(org.org_id, run.current_step_id)
        with pytest.raises(LockOrderViolation):
            FlowRunStore.lock(org.org_id, run.pk)


@pytest.mark.parametrize("failpoint", ["flow.step.after_claim", "flow.step.before_commit",
                                       "flow.step.after_commit"])
def test_worker_killed_at_a_failpoint_is_recovered_and_commits_once(org, decide_plan, short_lease, failpoint):
    record = save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    env = subprocess_env(NEXUS_FAILPOINTS=failpoint, NEXUS_FLOW_LEASE_SECONDS="1",
                         NEXUS_FLOW_RETRY_BASE_SECONDS="0", DJANGO_SETTINGS_MODULE="nexusflow.settings")
    code = "from nexusflow.flows.services import flow_try_run_step_one; flow_try_run_step_one(worker_id='doomed')"
    proc = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run = _run_of(org, record)
    decide = FlowStepExecution.objects.get(run=run, plan_step_key="decide:Has_Email")
    if failpoint == "flow.step.after_commit":
        assert decide.state == t.STEP_SUCCEEDED  # committed before the crash: nothing to recover
        assert run.state == t.RUN_SUCCEEDED  # with its Terminal step
    else:
        assert decide.state in (t.STEP_CLAIMED, t.STEP_RUNNING) and decide.lease_owner == "doomed"
        assert not FlowCheckpoint.objects.filter(step=decide).exists()
        wait_for_recovery()
        assert FlowStepExecution.objects.get(pk=decide.pk).state == t.STEP_RETRY_SCHEDULED
    run_until_idle()
    run.refresh_from_db()
    assert run.state == t.RUN_SUCCEEDED
    assert FlowCheckpoint.objects.filter(step=decide).count() == 1
    states = list(FlowStepAttempt.objects.filter(step=decide).order_by("attempt_number").values_list("state", flat=True))
    assert states == ([t.ATTEMPT_COMMITTED] if failpoint == "flow.step.after_commit"
                      else [t.ATTEMPT_FENCED, t.ATTEMPT_COMMITTED])


# --- wake signal acceptance -----------------------------------------------------------
def test_wake_signal_acceptance_is_idempotent_and_scoped(org, decide_plan):
    record = save_record(org, {"lifecyclestage": "customer"})
    run = _run_of(org, record)
    scope = TrustedRuntimeWorkScope(run.org_id, run.app_installation_id, run.runtime_capability_id,
                                    run.binding_digest)
    with transaction.atomic():
        flow_wake_signal_accept(scope=scope, flow_run_id=run.pk, dependency_key="17", receipt_id=5)
        flow_wake_signal_accept(scope=scope, flow_run_id=run.pk, dependency_key="17", receipt_id=5)
    signal_row = FlowWakeSignal.objects.get()
    assert (signal_row.state, signal_row.receipt_id, signal_row.org_id) == (t.SIGNAL_UNMATCHED, 5, org.org_id)
    with pytest.raises(WakeSignalConflict):
        flow_wake_signal_accept(scope=scope, flow_run_id=run.pk, dependency_key="17", receipt_id=6)
    for other in (TrustedRuntimeWorkScope("flows-other-org", scope.app_installation_id,
                                          scope.runtime_capability_id, scope.binding_digest),
                  TrustedRuntimeWorkScope(scope.org_id, "another-installation", scope.runtime_capability_id,
                                          scope.binding_digest),
                  TrustedRuntimeWorkScope(scope.org_id, scope.app_installation_id, "another-capability",
                                          scope.binding_digest),
                  TrustedRuntimeWorkScope(scope.org_id, scope.app_installation_id, scope.runtime_capability_id,
                                          "f" * 64)):
        with pytest.raises(WakeSignalRejected):
            flow_wake_signal_accept(scope=other, flow_run_id=run.pk, dependency_key="17", receipt_id=5)
    assert FlowWakeSignal.objects.count() == 1
    # Accepting a wake takes no lock on the run: it succeeds while another transaction holds the root.
    with _root_held(org.org_id, run.pk, seconds=10), transaction.atomic():
        flow_wake_signal_accept(scope=scope, flow_run_id=run.pk, dependency_key="18", receipt_id=9)
    assert FlowWakeSignal.objects.count() == 2
    assert flow_try_run_step_one(worker_id="w")
    assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED


def test_handler_binding_mismatch_quarantines_before_any_effect(org, demo_source, monkeypatch):
    from nexusflow.flows.catalog import catalog_build, catalog_source_load

    source = catalog_source_load()
    other_release = {**source, "entries": [
        {**e, "handler_version": "99"} if e["action_name"] == "PushToConnector" else e for e in source["entries"]]}
    from nexusflow.flows import handlers

    with monkeypatch.context() as mp:  # the plan is compiled and activated by a release with another handler version
        mp.setattr(deploy, "catalog_current", lambda *, binding: catalog_build(binding=binding, source=other_release))
        mp.setitem(handlers.IN_BINARY_HANDLERS, "runtime_outbox.services.outbound_command_author", "99")
        flow_deploy(org=org, source=demo_source, flow_api_name="Contact_Push_Customer_To_Billing")
    record = save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    assert flow_try_run_step_one(worker_id="w")
    run = _run_of(org, record)
    assert (run.state, run.reason_code) == (t.RUN_QUARANTINED, "flow_handler_binding_mismatch")
    from runtime_outbox.models import OutboundCommand

    assert not OutboundCommand.objects.exists()


def test_only_the_terminal_step_is_inserted_finished_and_only_the_completion_step_waiting(org, decide_plan):
    record = save_record(org, {"lifecyclestage": "customer"})
    run = _run_of(org, record)
    now = db_now()
    common = {"org_id": org.org_id, "run": run, "created_at": now, "updated_at": now}
    for state, kind in ((t.STEP_SUCCEEDED, KIND_PURE_COMPUTE), (t.STEP_WAITING, KIND_PURE_COMPUTE),
                        (t.STEP_SUCCEEDED, KIND_EFFECT_COMPLETION), (t.STEP_RUNNING, KIND_TERMINAL)):
        with pytest.raises(IllegalTransition):
            FlowStepStore.create(plan_step_key=f"x:{state}:{kind}", step_kind=kind, state=state, **common)
    assert FlowStepStore.create(plan_step_key="end", step_kind=KIND_TERMINAL, state=t.STEP_SUCCEEDED,
                                **common).state == t.STEP_SUCCEEDED
