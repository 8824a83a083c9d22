"""State and fencing proofs of the complete durable executor (seed 004 sections 10-13, 22.2, 22.3).

Real MariaDB, committed transactions (``transaction=True``): races use real
threads with their own connections; crashes kill a real worker process at a
named failpoint; a severed connection is a real ``KILL`` of the worker's
server session.
"""
from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import FlowRunNotFound
from nexusflow.flows.models import (
    FlowAuditEvent,
    FlowCheckpoint,
    FlowDependency,
    FlowRun,
    FlowStepAttempt,
    FlowStepExecution,
)
from nexusflow.flows.selectors import flow_run_get, flow_runs_for_record, flow_runs_projection_divergent
from nexusflow.flows.services import (
    admission,
    execute,
    flow_deploy,
    flow_run_delete,
    flow_run_support_read,
    flow_step_claim_one,
    flow_step_execute,
    flow_step_heartbeat,
    flow_try_cancel_cleanup_one,
    flow_try_recover_expired_one,
    step_txn,
)
from nexusflow.flows.store import FlowAttemptStore, FlowRunStore
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import FenceRejected, IllegalTransition, ImmutableRow
from nexusflow.kernel.models import insert
from nexusflow.records.models import Record
from tests.conftest import ROOT, subprocess_env

from . import executor_flows as ef
from .conftest import decision_flow_xml, run_until_idle, save_record, update_record, wait_for_recovery

pytestmark = pytest.mark.django_db(transaction=True)

CUSTOMER = {"lifecyclestage": "customer", "email": "a@example.com"}


def _run_of(org, record) -> FlowRun:
    return FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key).order_by("id").first()


def _record(record) -> Record:
    return Record.objects.get(pk=record.pk)


def _in_thread(fn, results: dict, key: str) -> threading.Thread:
    def body():
        try:
            results[key] = fn()
        except BaseException as exc:  # surfaced by the test's assertions
            results[key] = exc
        finally:
            connection.close()

    th = threading.Thread(target=body, name=key)
    th.start()
    return th


def _wait_expired(step_id) -> None:
    step = FlowStepExecution.objects.get(pk=step_id)
    deadline = time.monotonic() + 10
    while db_now() <= step.lease_expires_at:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _pause_in(monkeypatch, module, name: str, worker: str) -> tuple[threading.Event, threading.Event]:
    """Pause the ``module.<name>`` seam while ``worker``'s claim runs it; return (paused, release)."""
    paused, release = threading.Event(), threading.Event()
    real = getattr(module, name)

    def seam(*args, **kwargs):
        if threading.current_thread().name == worker:
            paused.set()
            assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, seam)
    return paused, release


@pytest.fixture
def atomic(org):
    return flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name").plan


# --- S004-22.2-04 / 22.2-05 / 22.3-01 -------------------------------------------------------------
def test_lease_expiry_inside_the_mutation_transaction_fences_the_stale_worker_after_its_replacement(
        org, atomic, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    record = save_record(org, CUSTOMER)
    version_before = _record(record).version
    paused, release = _pause_in(monkeypatch, execute, "before_lifecycle_locks", "stale")
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    stale = flow_step_claim_one(worker_id="stale")
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "60")
    results: dict = {}
    stale_thread = _in_thread(lambda: flow_step_execute(claim=stale), results, "stale")
    assert paused.wait(10)  # inside its mutation transaction, holding the trigger record's lock
    wait_for_recovery()  # root -> step -> attempt; needs no business lock
    assert FlowStepAttempt.objects.get(pk=stale.attempt_id).state == t.ATTEMPT_FENCED
    # An ordinary record write contends on the same business row and waits for it.
    ordinary = _in_thread(lambda: update_record(org, record, {"email": "b@example.com"}), results, "ordinary")
    fresh = flow_step_claim_one(worker_id="fresh")
    assert fresh is not None and fresh.step_id == stale.step_id and fresh.attempt_number == 2
    fresh_thread = _in_thread(lambda: flow_step_execute(claim=fresh), results, "fresh")
    ordinary.join(0.5)
    assert ordinary.is_alive()  # blocked behind the stale worker's record lock
    release.set()
    for th in (stale_thread, ordinary, fresh_thread):
        th.join(30)
    assert isinstance(results["stale"], FenceRejected)
    assert results["fresh"] == "succeeded"
    assert not isinstance(results["ordinary"], BaseException)
    stored = _record(record)
    # The flow wrote only its own field exactly once; the ordinary write survives.
    assert (stored.fields["firstname"], stored.fields["email"]) == ("Flowed", "b@example.com")
    assert stored.version == version_before + 2
    step = FlowStepExecution.objects.get(pk=stale.step_id)
    assert step.state == t.STEP_SUCCEEDED
    assert [a.state for a in FlowStepAttempt.objects.filter(step=step).order_by("attempt_number")] == [
        t.ATTEMPT_FENCED, t.ATTEMPT_COMMITTED]
    assert FlowCheckpoint.objects.filter(step=step).count() == 1
    assert FlowAuditEvent.objects.filter(step=step, event="step_committed").count() == 1


# --- S004-22.2-18 (delete wins) / 22.3-08 ------------------------------------------------------------
def test_delete_winning_the_root_fence_rolls_back_the_workers_whole_transaction(org, atomic, monkeypatch):
    record = save_record(org, CUSTOMER)
    before = _record(record)
    run = _run_of(org, record)
    paused, release = _pause_in(monkeypatch, execute, "before_lifecycle_locks", "worker")
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    claim = flow_step_claim_one(worker_id="worker")
    results: dict = {}
    worker = _in_thread(lambda: flow_step_execute(claim=claim), results, "worker")
    assert paused.wait(10)
    # Cancellation starts at the root and takes no business lock: it completes while the worker
    # holds the record lock (no root -> business reverse edge, no wait).
    outcome = flow_run_delete(org=org, run_id=run.pk)
    assert (outcome.state, outcome.is_deleted, outcome.changed) == (t.RUN_CANCEL_REQUESTED, True, True)
    release.set()
    worker.join(30)
    assert isinstance(results["worker"], FenceRejected)
    after = _record(record)
    assert (after.version, after.fields) == (before.version, before.fields)  # business write rolled back
    step = FlowStepExecution.objects.get(pk=claim.step_id)
    assert step.state == t.STEP_CANCEL_REQUESTED
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_CANCELLED
    assert not FlowCheckpoint.objects.filter(step=step).exists()
    assert not FlowAuditEvent.objects.filter(step=step, event="step_committed").exists()
    assert flow_try_recover_expired_one() is False  # recovery never makes a cancelled step runnable
    deadline = time.monotonic() + 10
    while not flow_try_cancel_cleanup_one():  # cleanup waits for the old lease to lapse
        assert time.monotonic() < deadline
        time.sleep(0.1)
    run.refresh_from_db()
    step.refresh_from_db()
    assert (run.state, run.legacy_status, step.state) == (t.RUN_CANCELLED, t.LEGACY_ERROR, t.STEP_CANCELLED)
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_CANCELLED  # never rewritten


# --- S004-22.2-18 (commit wins) ---------------------------------------------------------------------
def _commit_racing_delete(org, run, monkeypatch, results: dict):
    """Pause a worker's step transaction right before COMMIT, start a delete, let the commit go first."""
    paused, release = _pause_in(monkeypatch, step_txn, "before_step_commit", "worker")
    claim = flow_step_claim_one(worker_id="worker")
    worker = _in_thread(lambda: flow_step_execute(claim=claim), results, "worker")
    assert paused.wait(10)  # business writes, audit and checkpoint done; root/step/attempt locked
    deleter = _in_thread(lambda: flow_run_delete(org=org, run_id=run.pk), results, "delete")
    deleter.join(0.5)
    assert deleter.is_alive()  # serialized on the root row
    release.set()
    worker.join(30)
    deleter.join(30)
    assert results["worker"] == "succeeded"
    assert FlowStepExecution.objects.get(pk=claim.step_id).state == t.STEP_SUCCEEDED
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_COMMITTED
    assert FlowCheckpoint.objects.filter(step_id=claim.step_id).count() == 1
    return claim


def test_commit_winning_the_root_fence_is_kept_and_delete_of_the_finished_run_only_soft_deletes(org, atomic,
                                                                                               monkeypatch):
    record = save_record(org, CUSTOMER)
    run = _run_of(org, record)
    results: dict = {}
    _commit_racing_delete(org, run, monkeypatch, results)
    assert _record(record).fields["firstname"] == "Flowed"
    # The atomic step's transaction also finished the run (its Terminal step): the delete finds it terminal.
    assert (results["delete"].state, results["delete"].changed) == (t.RUN_SUCCEEDED, True)
    end = FlowStepExecution.objects.get(run=run, plan_step_key="end")
    assert end.state == t.STEP_SUCCEEDED and not FlowStepAttempt.objects.filter(step=end).exists()
    run.refresh_from_db()
    assert run.is_deleted and run.state == t.RUN_SUCCEEDED


def test_commit_winning_the_root_fence_is_kept_and_delete_cancels_only_what_follows(org, monkeypatch):
    flow_deploy(org=org, source=ef.durable_counter(), flow_api_name="Durable_Counter")
    record = save_record(org, CUSTOMER)
    run = _run_of(org, record)
    results: dict = {}
    claim = _commit_racing_delete(org, run, monkeypatch, results)
    assert claim.step_key == "assign:Count"
    assert results["delete"].state == t.RUN_CANCELLED
    following = FlowStepExecution.objects.get(run=run, plan_step_key="decide:Is_One")
    assert following.state == t.STEP_CANCELLED and not FlowStepAttempt.objects.filter(step=following).exists()
    assert not FlowStepExecution.objects.filter(run=run, plan_step_key__in=["write:Mark", "end"]).exists()
    run.refresh_from_db()
    assert run.is_deleted and run.state == t.RUN_CANCELLED


# --- S004-22.2-19 / 22.2-20 ---------------------------------------------------------------------------
def test_claimed_and_waiting_steps_enter_cancel_requested_and_only_cleanup_cancels(org, rows, monkeypatch):
    flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only")
    record = save_record(org, {"lifecyclestage": "customer"})
    run = _run_of(org, record)
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    claim = flow_step_claim_one(worker_id="stale")
    flow_run_delete(org=org, run_id=run.pk)
    step = FlowStepExecution.objects.get(pk=claim.step_id)
    attempt = FlowStepAttempt.objects.get(pk=claim.attempt_id)
    assert (step.state, attempt.state, attempt.version) == (t.STEP_CANCEL_REQUESTED, t.ATTEMPT_CANCELLED, 2)
    with pytest.raises(FenceRejected):
        flow_step_execute(claim=claim)
    execute._record_rollback(claim, RuntimeError("stale"))  # a stale worker cannot reschedule it
    assert FlowStepExecution.objects.get(pk=step.pk).state == t.STEP_CANCEL_REQUESTED
    _wait_expired(step.pk)
    assert flow_try_recover_expired_one() is False
    assert FlowStepAttempt.objects.get(pk=attempt.pk).state == t.ATTEMPT_CANCELLED
    assert flow_try_cancel_cleanup_one() is True
    assert FlowStepExecution.objects.get(pk=step.pk).state == t.STEP_CANCELLED
    # A waiting step: CancelRequested, its dependency cancelled by cleanup in the same transaction.
    waiting_run = rows.run(t.RUN_WAITING)
    waiting = rows.step(t.STEP_WAITING, run=waiting_run)
    with transaction.atomic():
        FlowRunStore.touch(org_id=org.org_id, pk=waiting_run.pk, state=t.RUN_WAITING, version=waiting_run.version,
                           set_fields={"current_step_id": waiting.pk})
    dep = insert(FlowDependency, org_id=org.org_id, app_installation_id=waiting_run.app_installation_id,
                 runtime_capability_id=waiting_run.runtime_capability_id, binding_digest=waiting_run.binding_digest,
                 run=waiting_run, step=waiting, producer_kind="runtime.intent_result", dependency_key="77",
                 condition_digest="c" * 64, expiry_policy="quarantine", state=t.DEP_WAITING, version=1,
                 deadline=db_now(), created_at=db_now())
    result = flow_run_delete(org=org, run_id=waiting_run.pk)
    assert result.state == t.RUN_CANCELLED  # no live lease: cleanup ran at once
    assert FlowStepExecution.objects.get(pk=waiting.pk).state == t.STEP_CANCELLED
    assert FlowDependency.objects.get(pk=dep.pk).state == t.DEP_CANCELLED
    assert flow_runs_projection_divergent(org_id=org.org_id) == []


# --- S004-22.2-13 / 22.2-14 -----------------------------------------------------------------------------
def test_two_terminal_updates_race_on_one_started_attempt_and_exactly_one_wins(org, rows):
    attempt = rows.attempt()
    barrier = threading.Barrier(2)
    results: dict = {}

    def finish(dst):
        def go():
            with transaction.atomic():
                barrier.wait(10)
                return FlowAttemptStore.transition(org_id=org.org_id, pk=attempt.pk, src=t.ATTEMPT_STARTED, dst=dst,
                                                   version=1, fences={"lease_token_digest": "a" * 64})
        return go

    threads = [_in_thread(finish(t.ATTEMPT_COMMITTED), results, "commit"),
               _in_thread(finish(t.ATTEMPT_FENCED), results, "fence")]
    for th in threads:
        th.join(30)
    outcomes = sorted(type(v).__name__ for v in results.values())
    assert outcomes == ["FenceRejected", "int"], results
    final = FlowStepAttempt.objects.get(pk=attempt.pk)
    winner = t.ATTEMPT_COMMITTED if results["commit"] == 2 else t.ATTEMPT_FENCED
    assert (final.state, final.version) == (winner, 2)
    # A terminal outcome cannot be overwritten: not from Started again, not to another terminal.
    with pytest.raises(FenceRejected):
        FlowAttemptStore.transition(org_id=org.org_id, pk=attempt.pk, src=t.ATTEMPT_STARTED,
                                    dst=t.ATTEMPT_ROLLED_BACK, version=2)
    for dst in t.FLOW_STEP_ATTEMPT.states - {winner}:
        with pytest.raises(IllegalTransition):
            FlowAttemptStore.transition(org_id=org.org_id, pk=attempt.pk, src=winner, dst=dst, version=2)
    assert FlowStepAttempt.objects.get(pk=attempt.pk).state == winner


def test_delete_and_recovery_race_on_an_expired_attempt_and_one_terminal_outcome_wins(org, monkeypatch):
    flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only")
    record = save_record(org, {"lifecyclestage": "customer"})
    run = _run_of(org, record)
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    claim = execute._start(flow_step_claim_one(worker_id="gone"))
    _wait_expired(claim.step_id)
    barrier = threading.Barrier(2)
    results: dict = {}

    def after_barrier(fn):
        def go():
            barrier.wait(10)
            return fn()
        return go

    threads = [_in_thread(after_barrier(lambda: flow_run_delete(org=org, run_id=run.pk)), results, "delete"),
               _in_thread(after_barrier(flow_try_recover_expired_one), results, "recover")]
    for th in threads:
        th.join(30)
    assert not any(isinstance(v, BaseException) for v in results.values()), results
    attempt = FlowStepAttempt.objects.get(pk=claim.attempt_id)
    assert attempt.version == 2 and attempt.state in (t.ATTEMPT_CANCELLED, t.ATTEMPT_FENCED)
    # Recovery uses Fenced only when it won; cancellation uses Cancelled only when it won.
    assert (attempt.state == t.ATTEMPT_FENCED) == (results["recover"] is True)
    run.refresh_from_db()
    assert run.state == t.RUN_CANCELLED and run.is_deleted
    assert FlowStepExecution.objects.get(pk=claim.step_id).state == t.STEP_CANCELLED


# --- S004-22.2-15 ------------------------------------------------------------------------------------------
def test_root_and_step_projection_never_diverge(org, atomic, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    flow_deploy(org=org, source=ef.durable_counter(), flow_api_name="Durable_Counter")
    records = [save_record(org, {**CUSTOMER, "email": f"{i}@example.com"}) for i in range(3)]
    cancelled = _run_of(org, records[0])
    flow_run_delete(org=org, run_id=cancelled.pk)
    assert flow_runs_projection_divergent(org_id=org.org_id) == []
    claim = flow_step_claim_one(worker_id="w")
    assert flow_runs_projection_divergent(org_id=org.org_id) == []  # Running root, Claimed step
    flow_step_execute(claim=claim)
    run_until_idle(max_rounds=400)
    states = {r.state for r in FlowRun.objects.filter(org_id=org.org_id)}
    assert states >= {t.RUN_SUCCEEDED, t.RUN_CANCELLED}
    assert flow_runs_projection_divergent(org_id=org.org_id) == []
    for run in FlowRun.objects.filter(org_id=org.org_id):
        assert run.legacy_status == t.legacy_status_of(run.state)
    # The database refuses a root whose legacy projection is written apart from its state ...
    run = FlowRun.objects.filter(org_id=org.org_id, state=t.RUN_SUCCEEDED).first()
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE flows_flowrun SET state = 'Waiting' WHERE id = %s", [int(run.pk)])
    # ... the store never lets a caller write it ...
    with pytest.raises(ValueError), transaction.atomic():
        FlowRunStore.touch(org_id=org.org_id, pk=run.pk, state=run.state, version=run.version,
                           set_fields={"legacy_status": t.LEGACY_PAUSED})
    # ... and the divergence check does see a step moved behind its root's back.
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE flows_flowstepexecution SET state = 'Pending' WHERE id = %s", [int(run.current_step_id)])
    assert [d["run_id"] for d in flow_runs_projection_divergent(org_id=org.org_id)] == [int(run.pk)]


# --- S004-22.2-16 ------------------------------------------------------------------------------------------
def test_generic_crud_bulk_upsert_and_physical_delete_reject_every_flow_run_write(org, atomic):
    record = save_record(org, CUSTOMER)
    run = _run_of(org, record)
    before = FlowRun.objects.filter(pk=run.pk).values().get()
    attempts = {
        "create": lambda: FlowRun.objects.create(org_id=org.org_id, state=t.RUN_ACCEPTED),
        "save": lambda: run.save(),
        "save_update_fields": lambda: run.save(update_fields=["state"]),
        "instance_delete": lambda: run.delete(),
        "queryset_update": lambda: FlowRun.objects.filter(pk=run.pk).update(state=t.RUN_CANCELLED),
        "queryset_delete": lambda: FlowRun.objects.filter(pk=run.pk).delete(),
        "bulk_create": lambda: FlowRun.objects.bulk_create([FlowRun(org_id=org.org_id)]),
        "bulk_update": lambda: FlowRun.objects.bulk_update([run], ["state"]),
        "update_or_create": lambda: FlowRun.objects.update_or_create(pk=run.pk, defaults={"state": "Cancelled"}),
        "get_or_create": lambda: FlowRun.objects.get_or_create(pk=run.pk + 1000, defaults={"org_id": "x"}),
        "raw_delete": lambda: FlowRun.objects.filter(pk=run.pk)._raw_delete("default"),
        "save_base": lambda: FlowRun.save_base(run),
    }
    for _name, attempt in attempts.items():
        with pytest.raises(ImmutableRow), transaction.atomic():
            attempt()
    # The typed store itself refuses the immutable identity and the projection fields.
    for column in ("plan_id", "record_key", "execution_owner", "legacy_status"):
        with pytest.raises(ValueError), transaction.atomic():
            FlowRunStore.touch(org_id=org.org_id, pk=run.pk, state=run.state, version=run.version,
                               set_fields={column: before[column]})
    assert FlowRun.objects.filter(pk=run.pk).values().get() == before


# --- S004-22.2-17 / 22.2-21 / 22.2-22 -----------------------------------------------------------------------
def test_public_delete_is_idempotent_hides_the_run_and_keeps_lineage(org, atomic):
    record = save_record(org, CUSTOMER)
    run = _run_of(org, record)
    first = flow_run_delete(org=org, run_id=run.pk)
    assert (first.state, first.changed) == (t.RUN_CANCELLED, True)
    again = flow_run_delete(org=org, run_id=run.pk)
    assert (again.state, again.changed, again.delete_requested_at) == (t.RUN_CANCELLED, False,
                                                                        first.delete_requested_at)
    # Every normal read path consumes the one IsDeleted fact ...
    assert flow_run_get(org=org, run_id=run.pk) is None
    assert flow_runs_for_record(org=org, object_name="Contact", record_key=record.record_key) == []
    with pytest.raises(FlowRunNotFound):
        flow_run_support_read(org=org, run_id=run.pk)
    # ... an authorized include-deleted read still reconstructs the lineage.
    read = flow_run_support_read(org=org, run_id=run.pk, include_deleted=True)
    assert read["is_deleted"] and read["state"] == t.RUN_CANCELLED and read["legacy_status"] == t.LEGACY_ERROR
    assert [s["state"] for s in read["steps"]] == [t.STEP_CANCELLED]
    assert read["current_checkpoint"]["sequence"] == 1 and "context_payload" not in read["current_checkpoint"]
    assert FlowCheckpoint.objects.filter(run=run).count() == 1  # durable lineage retained
    # A terminal run gets only the soft-delete fact; its outcome is never relabelled.
    done = save_record(org, {**CUSTOMER, "email": "z@example.com"})
    run_until_idle()
    finished = _run_of(org, done)
    assert finished.state == t.RUN_SUCCEEDED
    result = flow_run_delete(org=org, run_id=finished.pk)
    finished.refresh_from_db()
    assert (result.state, finished.state, finished.is_deleted) == (t.RUN_SUCCEEDED, t.RUN_SUCCEEDED, True)
    # Other orgs cannot see or delete it; there is no second visibility/tombstone field.
    from nexusflow.kernel.scope import OrgScope

    with pytest.raises(FlowRunNotFound):
        flow_run_delete(org=OrgScope("flows-other-org"), run_id=finished.pk)
    names = {f.name for f in FlowRun._meta.get_fields()}
    assert not {n for n in names if "visib" in n or "tombstone" in n}
    assert {"is_deleted", "delete_requested_at"} <= names


# --- S004-22.2-02 ---------------------------------------------------------------------------------------------
def test_lease_expiring_before_execution_refuses_to_start(org, atomic, monkeypatch):
    record = save_record(org, CUSTOMER)
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    claim = flow_step_claim_one(worker_id="late")
    _wait_expired(claim.step_id)
    with pytest.raises(FenceRejected):
        flow_step_execute(claim=claim)
    assert FlowStepExecution.objects.get(pk=claim.step_id).state == t.STEP_CLAIMED
    assert flow_try_recover_expired_one() is True
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_FENCED
    assert _record(record).fields.get("firstname") is None


# --- S004-22.2-03 ---------------------------------------------------------------------------------------------
def test_lease_expiring_during_pure_compute_fences_the_commit_and_heartbeat_keeps_it(org, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    flow_deploy(org=org, source=ef.durable_counter(), flow_api_name="Durable_Counter")
    record = save_record(org, CUSTOMER)
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    claim = flow_step_claim_one(worker_id="slow")
    assert claim.step_key == "assign:Count"
    real = execute.run_graph
    recovered: dict = {}

    def slow_compute(**kwargs):
        out = real(**kwargs)
        _wait_expired(claim.step_id)
        _in_thread(flow_try_recover_expired_one, recovered, "recover").join(30)
        return out

    monkeypatch.setattr(execute, "run_graph", slow_compute)
    with pytest.raises(FenceRejected):
        flow_step_execute(claim=claim)
    assert recovered["recover"] is True
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_FENCED
    assert not FlowCheckpoint.objects.filter(step_id=claim.step_id).exists()
    monkeypatch.setattr(execute, "run_graph", real)
    # A worker that heartbeats through long compute keeps its lease: recovery finds nothing.
    hb = execute._start(flow_step_claim_one(worker_id="steady"))
    for _ in range(3):
        time.sleep(0.5)
        hb = flow_step_heartbeat(claim=hb)
    assert flow_try_recover_expired_one() is False
    assert execute._exec_graph(hb, FlowRun.objects.get(pk=hb.run_id).plan,
                                admission._step_def(FlowRun.objects.get(pk=hb.run_id).plan, hb.step_key)) == "succeeded"
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "60")
    run_until_idle()
    run = _run_of(org, record)
    assert run.state == t.RUN_SUCCEEDED
    assert _record(record).fields["lastname"] == "counted-once"


# --- S004-22.2-08 ---------------------------------------------------------------------------------------------
def test_proven_rollback_schedules_durable_backoff_and_a_due_claim_resumes(org, atomic, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "1")
    record = save_record(org, CUSTOMER)
    run = _run_of(org, record)
    real = execute.before_lifecycle_locks
    calls = {"n": 0}

    def fail_once(claim):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("transient")
        real(claim)

    monkeypatch.setattr(execute, "before_lifecycle_locks", fail_once)
    claim = flow_step_claim_one(worker_id="w")
    observed = db_now()
    assert flow_step_execute(claim=claim) == "rolled_back"
    attempt = FlowStepAttempt.objects.get(pk=claim.attempt_id)
    step = FlowStepExecution.objects.get(pk=claim.step_id)
    run.refresh_from_db()
    assert (attempt.state, attempt.retry_decision) == (t.ATTEMPT_ROLLED_BACK, "scheduled")
    assert step.state == t.STEP_RETRY_SCHEDULED
    assert step.run_after >= observed + dt.timedelta(milliseconds=attempt.recovery_backoff_floor_ms)
    assert (run.state, run.current_step_id, run.run_after) == (t.RUN_RUNNABLE, step.pk, step.run_after)
    assert _record(record).fields.get("firstname") is None
    assert flow_step_claim_one(worker_id="eager") is None  # not due yet: no stranded Running root
    run.refresh_from_db()
    assert run.state == t.RUN_RUNNABLE
    while db_now() < step.run_after:
        time.sleep(0.1)
    due = flow_step_claim_one(worker_id="due")
    assert due is not None and due.step_id == step.pk and due.attempt_number == 2
    assert flow_step_execute(claim=due) == "succeeded"
    assert _record(record).fields["firstname"] == "Flowed"


# --- S004-22.2-09 ---------------------------------------------------------------------------------------------
def test_duplicate_delivery_of_one_claim_commits_once(org, atomic):
    record = save_record(org, CUSTOMER)
    claim = flow_step_claim_one(worker_id="w")
    assert flow_step_execute(claim=claim) == "succeeded"
    version = _record(record).version
    with pytest.raises(FenceRejected):
        flow_step_execute(claim=claim)
    with pytest.raises(FenceRejected):
        execute._exec_graph(claim, FlowRun.objects.get(pk=claim.run_id).plan,
                             admission._step_def(FlowRun.objects.get(pk=claim.run_id).plan, claim.step_key))
    assert _record(record).version == version
    assert FlowCheckpoint.objects.filter(step_id=claim.step_id).count() == 1


# --- S004-22.2-07 / 22.2-12 ---------------------------------------------------------------------------------------
def _kill_worker(failpoint: str, **env: str) -> subprocess.CompletedProcess:
    code = "from nexusflow.flows.services import flow_try_run_step_one; flow_try_run_step_one(worker_id='doomed')"
    return subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT,
                          env=subprocess_env(NEXUS_FAILPOINTS=failpoint, DJANGO_SETTINGS_MODULE="nexusflow.settings",
                                             **env),
                          capture_output=True, text=True, timeout=120)


def test_worker_dying_after_rollback_before_rolled_back_keeps_the_backoff_floor(org, monkeypatch):
    flow_deploy(org=org, source=ef.atomic_touch_partners(), flow_api_name="Touch_Partners")
    save_record(org, {"lifecyclestage": "lead", "email": "partner@example.com"})
    record = save_record(org, CUSTOMER)
    proc = _kill_worker("flow.step.after_rollback", NEXUS_FLOW_LEASE_SECONDS="1", NEXUS_FLOW_RETRY_BASE_SECONDS="30")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run = _run_of(org, record)
    step = FlowStepExecution.objects.get(pk=run.current_step_id)
    attempt = FlowStepAttempt.objects.get(step=step)
    assert (step.state, attempt.state) == (t.STEP_RUNNING, t.ATTEMPT_STARTED)  # died before recording RolledBack
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "30")
    wait_for_recovery()
    observed = db_now()
    step.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state == t.ATTEMPT_FENCED and attempt.recovery_backoff_floor_ms >= 30_000
    assert step.state == t.STEP_RETRY_SCHEDULED
    assert (step.run_after - observed).total_seconds() > 25  # the precommitted floor, not an immediate retry
    assert flow_step_claim_one(worker_id="eager") is None
    assert not Record.objects.filter(org_id=org.org_id, fields__lifecyclestage="touched").exists()


def test_worker_killed_holding_the_business_lock_commits_nothing_and_recovers(org, atomic, monkeypatch):
    record = save_record(org, CUSTOMER)
    before = _record(record)
    proc = _kill_worker("flow.step.after_business_locks", NEXUS_FLOW_LEASE_SECONDS="1",
                        NEXUS_FLOW_RETRY_BASE_SECONDS="0")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert _record(record).version == before.version  # nothing from the killed transaction is visible
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    wait_for_recovery()
    run_until_idle()
    run = _run_of(org, record)
    assert run.state == t.RUN_SUCCEEDED
    atomic_step = FlowStepExecution.objects.get(run=run, plan_step_key="atomic")
    assert [a.state for a in FlowStepAttempt.objects.filter(step=atomic_step).order_by("attempt_number")] == [
        t.ATTEMPT_FENCED, t.ATTEMPT_COMMITTED]
    assert _record(record).version == before.version + 1


# --- S004-22.3-04 / 22.3-05 ---------------------------------------------------------------------------------------
def test_retry_admits_a_late_discovered_record_within_the_plan_bound(org, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    flow_deploy(org=org, source=ef.atomic_touch_partners(), flow_api_name="Touch_Partners")
    partner = save_record(org, {"lifecyclestage": "lead", "email": "partner@example.com"})
    record = save_record(org, CUSTOMER)
    run_until_idle()
    run = _run_of(org, record)
    assert run.state == t.RUN_SUCCEEDED
    step = FlowStepExecution.objects.get(run=run, plan_step_key="atomic")
    first, second = FlowStepAttempt.objects.filter(step=step).order_by("attempt_number")
    assert (first.state, first.safe_error_code) == (t.ATTEMPT_ROLLED_BACK, "flow_late_lock_discovery")
    assert first.metrics_summary == {"discovered": [["Contact", partner.record_key]]}
    assert second.state == t.ATTEMPT_COMMITTED
    assert ["Contact", partner.record_key] in second.lock_plan and ["Contact", record.record_key] in second.lock_plan
    assert first.lock_plan_digest != second.lock_plan_digest
    assert _record(partner).fields["lifecyclestage"] == "touched"


def test_discovery_beyond_the_declared_bound_fails_the_step(org, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    flow_deploy(org=org, source=ef.atomic_touch_partners(), flow_api_name="Touch_Partners")
    partners = [save_record(org, {"lifecyclestage": "lead", "email": "partner@example.com"}) for _ in range(2)]
    record = save_record(org, CUSTOMER)
    run_until_idle()
    run = _run_of(org, record)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_lock_plan_exceeded")
    step = FlowStepExecution.objects.get(run=run, plan_step_key="atomic")
    assert [a.retry_decision for a in FlowStepAttempt.objects.filter(step=step).order_by("attempt_number")] == [
        "scheduled", "terminal"]
    assert all(_record(p).fields["lifecyclestage"] == "lead" for p in partners)


# --- S004-22.3-09 / 22.3-10 / 22.3-11 -------------------------------------------------------------------------------
def _sever_own_connection() -> None:
    tid = connection.connection.thread_id()
    killed: dict = {}

    def kill():
        with connection.cursor() as cur:
            cur.execute("KILL CONNECTION %s", [tid])

    _in_thread(kill, killed, "killer").join(30)
    assert killed["killer"] is None


def test_connection_severed_during_commit_quarantines_with_commit_unknown(org, atomic, monkeypatch):
    record = save_record(org, CUSTOMER)
    before = _record(record)
    monkeypatch.setattr(step_txn, "before_step_commit", lambda *a: _sever_own_connection())
    claim = flow_step_claim_one(worker_id="w")
    assert flow_step_execute(claim=claim) == "quarantined"
    run = FlowRun.objects.get(pk=claim.run_id)
    assert (run.state, run.reason_code, run.legacy_status) == (t.RUN_QUARANTINED, "flow_commit_unknown",
                                                               t.LEGACY_ERROR)
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_COMMIT_UNKNOWN
    assert FlowStepExecution.objects.get(pk=claim.step_id).state == t.STEP_QUARANTINED
    assert _record(record).version == before.version  # the server rolled the severed transaction back
    assert flow_step_claim_one(worker_id="w") is None  # never replayed automatically


def test_lost_commit_response_resolves_to_the_commit_that_won(org, atomic, monkeypatch):
    record = save_record(org, CUSTOMER)

    def lose_response(*_a):
        raise OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(step_txn, "after_step_commit", lose_response)
    claim = flow_step_claim_one(worker_id="w")
    assert flow_step_execute(claim=claim) == "committed"
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_COMMITTED
    assert FlowRun.objects.get(pk=claim.run_id).state == t.RUN_SUCCEEDED
    assert _record(record).fields["firstname"] == "Flowed"


def test_lost_rollback_response_quarantines_with_rollback_unknown(org, atomic, monkeypatch):
    record = save_record(org, CUSTOMER)
    before = _record(record)

    def die(claim):
        _sever_own_connection()
        raise RuntimeError("the step failed and its connection is gone")

    monkeypatch.setattr(execute, "before_lifecycle_locks", die)
    claim = flow_step_claim_one(worker_id="w")
    assert flow_step_execute(claim=claim) == "quarantined"
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_ROLLBACK_UNKNOWN
    assert FlowRun.objects.get(pk=claim.run_id).reason_code == "flow_rollback_unknown"
    assert _record(record).version == before.version


# --- S004-22.3-12 -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("broken", ["checkpoint_insert", "audit_insert"])
def test_audit_or_checkpoint_failure_rolls_back_the_business_write(org, atomic, monkeypatch, broken):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    record = save_record(org, CUSTOMER)
    before = _record(record)
    real = getattr(step_txn, broken)
    writes_seen = {}

    def fail(**values):
        writes_seen["firstname"] = Record.objects.get(pk=record.pk).fields.get("firstname")  # inside the txn
        raise RuntimeError(f"{broken} failed")

    monkeypatch.setattr(step_txn, broken, fail)
    claim = flow_step_claim_one(worker_id="w")
    assert flow_step_execute(claim=claim) == "rolled_back"
    assert writes_seen["firstname"] == "Flowed"  # the business write had been applied in that transaction
    after = _record(record)
    assert (after.version, after.fields) == (before.version, before.fields)
    assert FlowStepAttempt.objects.get(pk=claim.attempt_id).state == t.ATTEMPT_ROLLED_BACK
    monkeypatch.setattr(step_txn, broken, real)
    run_until_idle()
    assert _record(record).fields["firstname"] == "Flowed"


def test_checkpoint_with_credential_material_is_refused_and_nothing_commits(org, monkeypatch):
    flow_deploy(org=org, source=ef.atomic_password_variable(), flow_api_name="Password_Var")
    record = save_record(org, CUSTOMER)
    run_until_idle()
    run = _run_of(org, record)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_step_definite_refusal")
    attempt = FlowStepAttempt.objects.get(step__run=run)
    assert attempt.safe_error_code == "flow_checkpoint_credential"
    assert _record(record).fields.get("firstname") is None
    assert not FlowCheckpoint.objects.filter(run=run, context_payload__context__vars__password="hunter2").exists()


# --- S004-22.3-06 -----------------------------------------------------------------------------------------------------
def test_deadlock_victim_rolls_back_and_retries_from_the_same_checkpoint(org, monkeypatch):
    from nexusflow.records import services as record_services

    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    flow_deploy(org=org, source=ef.atomic_touch_partners(), flow_api_name="Touch_Partners")
    partner = save_record(org, {"lifecyclestage": "lead", "email": "partner@example.com"})
    ballast = [save_record(org, {"lifecyclestage": "lead"}) for _ in range(5)]
    record = save_record(org, CUSTOMER)
    first_claim = flow_step_claim_one(worker_id="w")
    assert flow_step_execute(claim=first_claim) == "rolled_back"  # late discovery admits the partner
    claim = flow_step_claim_one(worker_id="w")
    assert claim.attempt_number == 2 and len(claim.lock_plan) == 2
    low, high = claim.lock_plan
    input_checkpoint = FlowStepExecution.objects.get(pk=claim.step_id).input_checkpoint
    worker_holds_low, other_holds_high = threading.Event(), threading.Event()
    real_lock = record_services.record_lock

    def lock_then_pause(*, org, object_name, record_key, nowait=False):
        row = real_lock(org=org, object_name=object_name, record_key=record_key, nowait=nowait)
        if threading.current_thread().name == "worker" and record_key == low[1]:
            worker_holds_low.set()
            assert other_holds_high.wait(10)
            time.sleep(0.5)  # the other transaction is now waiting for the row this worker holds
        return row

    monkeypatch.setattr(record_services, "record_lock", lock_then_pause)
    results: dict = {}

    def ordinary():
        with transaction.atomic():
            for extra in ballast:  # a heavier transaction: InnoDB picks the lighter worker as the victim
                row = real_lock(org=org, object_name="Contact", record_key=extra.record_key)
                record_services.record_update(org=org, record=row, changes={"firstname": "ballast"})
            row = real_lock(org=org, object_name="Contact", record_key=high[1])
            record_services.record_update(org=org, record=row, changes={"lastname": "other"})
            assert worker_holds_low.wait(10)
            other_holds_high.set()
            real_lock(org=org, object_name="Contact", record_key=low[1])  # reverse order: the deadlock
        return "committed"

    other = _in_thread(ordinary, results, "ordinary")
    worker = _in_thread(lambda: flow_step_execute(claim=claim), results, "worker")
    worker.join(60)
    other.join(60)
    assert results["worker"] == "rolled_back", results
    assert results["ordinary"] == "committed", results
    victim = FlowStepAttempt.objects.get(pk=claim.attempt_id)
    assert (victim.state, victim.retry_decision) == (t.ATTEMPT_ROLLED_BACK, "scheduled")
    assert victim.safe_error_code == "OperationalError"  # the deadlock victim's error, a proven rollback
    monkeypatch.setattr(record_services, "record_lock", real_lock)
    run_until_idle(max_rounds=200)
    step = FlowStepExecution.objects.get(pk=claim.step_id)
    assert step.state == t.STEP_SUCCEEDED and step.input_checkpoint_id == input_checkpoint.pk
    assert FlowCheckpoint.objects.get(pk=input_checkpoint.pk).context_digest == input_checkpoint.context_digest
    assert [a.state for a in FlowStepAttempt.objects.filter(step=step).order_by("attempt_number")] == [
        t.ATTEMPT_ROLLED_BACK, t.ATTEMPT_ROLLED_BACK, t.ATTEMPT_COMMITTED]
    stored = Record.objects.get(pk=partner.pk).fields
    assert stored["lifecyclestage"] == "touched"
    assert _record(record).fields.get("lastname") in (None, "other")
