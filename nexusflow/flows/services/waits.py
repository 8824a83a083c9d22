"""Waits and wakes (seed 004 section 14).

A waiting step commits its dependency with :func:`_wait`. A producer accepts
its wake durably with :func:`flow_wake_signal_accept` (in its own
transaction, locking no Flow row); :func:`flow_try_wake_one` matches an
accepted signal to the waiting dependency and makes the run ``Runnable``.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.rows import first_row, row_exists
from nexusflow.kernel.scope import TrustedRuntimeWorkScope

from .. import policy, reasons
from .. import transitions as t
from ..binding import scope_of
from ..errors import WakeSignalConflict, WakeSignalRejected
from ..models import FlowDependency, FlowRun, FlowStepExecution, FlowWakeSignal
from ..producers import PRODUCER_RECORD, PRODUCER_RUNTIME_INTENT, producer_contract
from ..selectors import flow_wake_candidates
from ..store import (
    FlowAttemptStore,
    FlowDependencyStore,
    FlowRunStore,
    FlowStepStore,
    FlowWakeSignalStore,
    audit_insert,
    wake_signal_insert,
)
from .admission import _SAVE_ORIGIN
from .claim import StepClaim
from .record_waits import record_wait_signals_write, record_wake_verdict
from .step_txn import _attempt_fences, _step_fences
from .wait_resolution import resume_waiting, root_waits_on, satisfy_and_resume

FP_WAKE_BEFORE_COMMIT = failpoints.declare("flow.wake.before_commit")
FP_RECORD_PRODUCER_MATCH = failpoints.declare("flow.wake.record_producer_match")


def _wait(claim: StepClaim, run: FlowRun, step: FlowStepExecution, now: dt.datetime,
          dependency: FlowDependency | None, dependency_key: str, scope: TrustedRuntimeWorkScope) -> None:
    """Commit the durable wait: dependency, attempt Committed, step and root Waiting (section 14.2 step 3)."""
    if dependency is None:
        completion_dependency_create(run=run, step_id=step.pk, dependency_key=dependency_key, scope=scope, now=now)
    _enter_waiting(claim, now)


def completion_dependency_create(*, run: FlowRun, step_id: int, dependency_key: str,
                                 scope: TrustedRuntimeWorkScope, now: dt.datetime) -> FlowDependency:
    """Insert the ``runtime.intent_result`` dependency of an EffectCompletion step (caller's transaction).

    Seed 004 sections 10.5 and 15.1 step 3: bound to the completion step,
    keyed by the intent (``dependency_key``), expiring after the runtime
    policy's deadline under the ``quarantine`` policy (an effect whose
    receipt never came may or may not have happened).
    """
    producer_contract(PRODUCER_RUNTIME_INTENT)
    return FlowDependencyStore.create(
        org_id=scope.org_id, app_installation_id=scope.app_installation_id,
        runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest, run=run,
        step_id=step_id, producer_kind=PRODUCER_RUNTIME_INTENT, dependency_key=dependency_key,
        condition_digest=digest_v2("flows.dependency-condition", [
            ("producer_kind", PRODUCER_RUNTIME_INTENT), ("dependency_key", dependency_key),
            ("accepts", "remote_confirmed|finalized|superseded|no_effect|quarantined"),
        ]).hexdigest,
        expiry_policy="quarantine", state=t.DEP_WAITING,
        deadline=now + dt.timedelta(seconds=policy.dependency_deadline_seconds()), created_at=now,
    )


def _scope_filter(run: FlowRun) -> dict[str, Any]:
    scope = scope_of(run)
    return dict(org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest)


def _wait_create(claim: StepClaim, run: FlowRun, step, *, producer_kind: str, key: str, condition: dict[str, Any],
                 expiry_policy: str, deadline: dt.datetime, now: dt.datetime) -> None:
    """Insert the step's dependency on a registered producer and enter ``Waiting`` (in the step transaction)."""
    producer_contract(producer_kind)
    FlowDependencyStore.create(
        **_scope_filter(run), run=run, step=step, producer_kind=producer_kind, dependency_key=key,
        condition=condition,
        condition_digest=digest_v2("flows.dependency-condition", [
            ("producer_kind", producer_kind), ("dependency_key", key),
            ("condition", canonical_json.dumps(condition)),
        ]).hexdigest,
        expiry_policy=expiry_policy, state=t.DEP_WAITING, deadline=deadline, created_at=now,
    )
    _enter_waiting(claim, now)


def _step_dependency(claim: StepClaim, run: FlowRun) -> FlowDependency | None:
    """The claimed step's dependency in the run's complete work scope, locked (after root -> step -> attempt)."""
    scope = _scope_filter(run)
    dependency = FlowDependency.objects.filter(
        org_id=claim.org_id, step_id=claim.step_id, **{k: v for k, v in scope.items() if k != "org_id"}).first()
    return None if dependency is None else FlowDependencyStore.lock(claim.org_id, dependency.pk)


def _enter_waiting(claim: StepClaim, now: dt.datetime) -> None:
    """Attempt Committed, step Running -> Waiting and root Running -> Waiting, under the claim fence.

    Runs in the step transaction that commits the dependency (seed 004 section 14.2 step 3).
    """
    FlowAttemptStore.transition(
        org_id=claim.org_id, pk=claim.attempt_id, src=t.ATTEMPT_STARTED, dst=t.ATTEMPT_COMMITTED,
        version=claim.attempt_version, fences=_attempt_fences(claim), set_fields={"finished_at": now},
    )
    FlowStepStore.transition(
        org_id=claim.org_id, pk=claim.step_id, src=t.STEP_RUNNING, dst=t.STEP_WAITING, version=claim.step_version,
        fences=_step_fences(claim), set_fields={"lease_expires_at": None, "updated_at": now},
    )
    FlowRunStore.transition(
        org_id=claim.org_id, pk=claim.run_id, src=t.RUN_RUNNING, dst=t.RUN_WAITING, version=claim.root_version,
        fences={"current_step_id": claim.step_id, "is_deleted": False, "delete_requested_at": None},
        set_fields={"updated_at": now},
    )


def flow_wake_signal_accept(*, scope: TrustedRuntimeWorkScope, flow_run_id: FlowRun.Id | int, dependency_key: str,
                            receipt_id: int) -> None:
    """Durably accept a producer's wake for ``(scope, flow_run_id, dependency_key)``.

    Called inside the producer's transaction (seed 004 section 14.2 step 1):
    inserts or finds the ``FlowWakeSignal`` and locks no existing Flow row.
    Matching the dependency is left to :func:`flow_try_wake_one` or to the
    waiting step itself.

    Args:
        scope: the producer's complete trusted Runtime work scope.
        flow_run_id: the originating run (``OutboundCommand.origin_flow_run_id``),
            a ``FlowRun.Id`` or a plain positive int.
        dependency_key: the producer key, e.g. ``str(command.pk)``.
        receipt_id: the producer's durable ``IntentResultReceipt`` id (or a
            plain positive int).

    Raises:
        InvalidIdentity: ``dependency_key`` is not canonical, or
            ``flow_run_id`` is an id of another model (before SQL).
        WakeSignalRejected: no such run in that complete scope, or
            ``receipt_id`` is not an IntentResultReceipt id.
        WakeSignalConflict: the key was accepted before with another receipt.
    """
    validate_key(dependency_key, field="dependency_key", max_length=128)
    flow_run_id = require_id(flow_run_id, FlowRun, field="flow_run_id")
    try:
        receipt_id = require_id(receipt_id, "runtime_outbox.IntentResultReceipt", field="receipt_id")
    except InvalidIdentity as exc:
        raise WakeSignalRejected(str(exc)) from exc
    scope_filter = dict(org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                        runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest)
    if not row_exists(FlowRun, pk=flow_run_id, **scope_filter):
        raise WakeSignalRejected("no flow run in this work scope")
    key = dict(flow_run_id=flow_run_id, dependency_key=dependency_key, wake_version=0, **scope_filter)
    existing = first_row(FlowWakeSignal, **key)
    if existing is None:
        try:
            with transaction.atomic():
                wake_signal_insert(
                    **key, producer_kind=PRODUCER_RUNTIME_INTENT, receipt_id=receipt_id,
                    evidence_digest=digest_v2("flows.wake-evidence", [
                        ("producer_kind", PRODUCER_RUNTIME_INTENT), ("dependency_key", dependency_key),
                        ("receipt_id", receipt_id),
                    ]).hexdigest,
                    state=t.SIGNAL_UNMATCHED, received_at=db_now(),
                )
            return
        except IntegrityError:
            existing = FlowWakeSignal.objects.get(**key)
    if existing.receipt_id != receipt_id:
        raise WakeSignalConflict(f"dependency {dependency_key} was accepted with another receipt")


def flow_wake_reconcile(*, org_id: str, run_id: FlowRun.Id | int, dependency_key: str) -> bool:
    """Match the run's unmatched signals for ``dependency_key`` now, in a fresh transaction (section 14.2 step 4).

    Called right after a waiting step's dependency committed, and by a
    producer right after its signal committed (step 2). Newest wake version
    first; a signal that does not resolve the wait (stale, or its record no
    longer meets the condition) is expired on the way. True when a signal
    resolved the wait; False when there is none yet (or another resolver won).
    """
    signal_ids = list(FlowWakeSignal.objects.filter(org_id=org_id, flow_run_id=run_id, dependency_key=dependency_key,
                                                    state=t.SIGNAL_UNMATCHED)
                      .order_by("-wake_version", "-id").values_list("pk", flat=True)[: policy.CLAIM_BATCH])
    return any(_wake(org_id=org_id, run_id=run_id, signal_id=signal_id) for signal_id in signal_ids)


def flow_try_wake_one() -> bool:
    """Resolve one waiting dependency from an accepted wake signal (section 14.2 step 6).

    Discovers a candidate without locks, then locks root -> step ->
    dependency -> signal, satisfies the dependency, consumes the signal and
    moves step Waiting -> Pending and root Waiting -> Runnable.
    """
    for signal in flow_wake_candidates(limit=policy.CLAIM_BATCH):
        if _wake(org_id=signal.org_id, run_id=signal.flow_run_id, signal_id=signal.pk,
                 dependency_key=signal.dependency_key):
            return True
    return False


def _wake(*, org_id: str, run_id: int, signal_id: int, dependency_key: str | None = None) -> bool:
    """Resolve the waiting dependency of run ``run_id`` that signal ``signal_id`` names; True when it did.

    ``dependency_key`` is the signal's (an immutable column) as its discovery read it; ``None``: read it
    here. Either way the locked signal is verified against the run, its complete work scope and that key.
    """
    with transaction.atomic(durable=True):
        run, now = FlowRunStore.lock_at_clock(org_id, run_id)
        if run.current_step_id is None or not root_waits_on(run, run.current_step_id):
            return False
        step = FlowStepStore.lock(org_id, run.current_step_id)
        if step.state != t.STEP_WAITING:
            return False
        scope = scope_of(run)
        scope_filter = dict(org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                            runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest)
        if dependency_key is None:
            dependency_key = (FlowWakeSignal.objects.filter(pk=signal_id, flow_run_id=run.pk, **scope_filter)
                              .values_list("dependency_key", flat=True).first())
            if dependency_key is None:
                return False
        dependencies = FlowDependencyStore.lock_all(org_id, step_id=step.pk, run_id=run.pk,
                                                    dependency_key=dependency_key,
                                                    **{k: v for k, v in scope_filter.items() if k != "org_id"})
        if not dependencies:
            return False
        dependency = dependencies[0]
        signal = FlowWakeSignalStore.lock(org_id, signal_id)
        if (int(signal.flow_run_id) != int(run.pk) or signal.dependency_key != dependency_key
                or any(getattr(signal, k) != v for k, v in scope_filter.items())):
            return False
        if (dependency.state != t.DEP_WAITING or signal.state != t.SIGNAL_UNMATCHED
                or signal.producer_kind != dependency.producer_kind):
            return False
        if dependency.producer_kind == PRODUCER_RECORD:
            resolved = _record_wake(run, step, dependency, signal, now)
            if resolved:
                failpoints.hit(FP_WAKE_BEFORE_COMMIT)
            return resolved
        FlowDependencyStore.transition(
            org_id=org_id, pk=dependency.pk, src=t.DEP_WAITING, dst=t.DEP_SATISFIED, version=dependency.version,
            set_fields={"resolved_at": now, "resolution_receipt_id": signal.receipt_id},
        )
        FlowWakeSignalStore.transition(
            org_id=org_id, pk=signal.pk, src=t.SIGNAL_UNMATCHED, dst=t.SIGNAL_CONSUMED, version=signal.version,
            set_fields={"consumed_at": now, "dependency_id": dependency.pk},
        )
        resume_waiting(run, step, now=now)
        failpoints.hit(FP_WAKE_BEFORE_COMMIT)
    return True


def _record_wake(run: FlowRun, step: FlowStepExecution, dependency: FlowDependency, signal: FlowWakeSignal,
                 now: dt.datetime) -> bool:
    """Decide one ``record.condition`` signal on rows locked root -> step -> dependency -> signal (section 14.2).

    The record as it is now decides (:func:`.record_waits.record_wake_verdict`):
    ``met`` satisfies the dependency with the event, consumes the signal and
    makes step ``Pending`` and root ``Runnable``; ``deleted`` consumes the
    signal and applies the wait's compiled policy for a record that can no
    longer meet it (fault path, or terminal failure ``flow_wait_producer_deleted``);
    ``stale`` and ``unmet`` expire the signal and leave the wait as it is.
    True when the wait resolved or ended.
    """
    from .expiry import EXPIRY_TERMINAL, _finalize

    org_id = run.org_id
    verdict, record_version = record_wake_verdict(dependency, signal)
    condition = dependency.condition or {}
    if verdict in ("stale", "unmet"):
        FlowWakeSignalStore.transition(org_id=org_id, pk=signal.pk, src=t.SIGNAL_UNMATCHED, dst=t.SIGNAL_EXPIRED,
                                       version=signal.version, set_fields={"consumed_at": now})
        return False
    FlowWakeSignalStore.transition(
        org_id=org_id, pk=signal.pk, src=t.SIGNAL_UNMATCHED, dst=t.SIGNAL_CONSUMED, version=signal.version,
        set_fields={"consumed_at": now, "dependency_id": dependency.pk},
    )
    if verdict == "deleted":
        outcome = _finalize(run, step, dependency, now, policy_name=condition.get("on_deleted", EXPIRY_TERMINAL),
                            fault_step=condition.get("fault_step"), definite_cause=reasons.WAIT_PRODUCER_DELETED)
        audit_insert(org_id=org_id, run=run, step_id=step.pk, attempt=None, event="wait_producer_deleted",
                     detail={"dependency": int(dependency.pk), "signal": int(signal.pk),
                             "wake_version": int(signal.wake_version), "outcome": outcome}, created_at=now)
        return True
    satisfy_and_resume(run, step, dependency, now=now, resolution={
        "event": condition["event"], "record_version": record_version, "signal": int(signal.pk),
        "wake_version": int(signal.wake_version), "resolved_at": now.isoformat()})
    return True


# =============================================================================
# The record.condition producer's hooks on record saves and deletions (seed 004 section 14.2 steps 1-2)
# =============================================================================

def record_saved_signal(*, org, record, change) -> int:
    """Records after-save hook: signal the live runs whose Wait element watches ``record`` (an update only).

    Writes the signals in the saving transaction
    (:func:`.record_waits.record_wait_signals_write`; a run's own record write
    does not signal that run) and matches them right after it commits.
    Registered before the Flow admission hook, so the runs this save admits
    are not signalled by it. Returns how many signals it wrote.
    """
    if change.created:
        return 0
    origin = _SAVE_ORIGIN.get()
    return _signal(org=org, record=record, deleting=False, saving_run_id=None if origin is None else origin.run_id)


def record_deleting_signal(*, org, record) -> int:
    """Records before-delete hook (``DELETE_STAGE_FLOW_WAITS``): signal each live run watching ``record``.

    The signals commit with the deletion (a refused deletion rolls them back);
    the match right after the commit finds the record gone and ends each
    such wait under its policy. Returns how many signals it wrote.
    """
    return _signal(org=org, record=record, deleting=True, saving_run_id=None)


def _signal(*, org, record, deleting: bool, saving_run_id: int | None) -> int:
    key, run_ids = record_wait_signals_write(org=org, record=record, deleting=deleting, saving_run_id=saving_run_id)
    if run_ids:
        transaction.on_commit(lambda: _match_after_commit(org_id=org.org_id, run_ids=run_ids, key=key), robust=True)
    return len(run_ids)


def _match_after_commit(*, org_id: str, run_ids: list[int], key: str) -> None:
    """The producer path's fresh-transaction match (section 14.2 step 2); the sweep repeats it after a crash."""
    failpoints.hit(FP_RECORD_PRODUCER_MATCH)  # the save committed its signals; a crash here leaves them to the sweep
    for run_id in run_ids:
        flow_wake_reconcile(org_id=org_id, run_id=run_id, dependency_key=key)
