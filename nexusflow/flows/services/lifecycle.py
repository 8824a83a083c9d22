"""Run lifecycle beside execution: lease heartbeat, authorized delete, cancel cleanup (seed 004 sections 10-12).

:func:`flow_step_heartbeat` extends a running step's lease;
:func:`flow_run_delete` cancels and soft-deletes one run;
:func:`flow_try_cancel_cleanup_one` completes a ``CancelRequested`` run once
no lease of it is live.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now, db_now_sql
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.scope import OrgScope

from .. import policy
from .. import transitions as t
from ..errors import FlowRunNotFound
from ..models import FlowDependency, FlowRun, FlowStepAttempt, FlowStepExecution
from ..producers import PRODUCER_SUBFLOW
from ..store import FlowAttemptStore, FlowDependencyStore, FlowRunStore, FlowStepStore, audit_insert
from .claim import StepClaim
from .step_txn import _lock_live_step, _step_fences

FP_CANCEL_BEFORE_COMMIT = failpoints.declare("flow.cancel.before_commit")


# =============================================================================
# Heartbeat (seed 004 section 12.3)
# =============================================================================
def flow_step_heartbeat(*, claim: StepClaim) -> StepClaim:
    """Extend a running step's lease during long pure compute; return the claim with its new step version.

    A lifecycle-only root -> step transaction: the lease token, epoch,
    attempt and root version (the commit fence) stay the same; the lease
    deadline moves to the database clock plus the policy lease. Mutation
    transactions never depend on it.

    Raises:
        FenceRejected: the root moved (cancelled, recovered) or the lease is
            no longer this claim's, or it already expired (recovery may own it).
    """
    with transaction.atomic(durable=True):
        _run, _step, now = _lock_live_step(claim, "lease already expired")
        expires = now + dt.timedelta(seconds=policy.lease_seconds())
        version = FlowStepStore.touch(
            org_id=claim.org_id, pk=claim.step_id, state=t.STEP_RUNNING, version=claim.step_version,
            fences=_step_fences(claim), set_fields={"lease_expires_at": expires, "updated_at": now},
        )
    return dataclasses.replace(claim, step_version=version, lease_expires_at=expires)


# =============================================================================
# Authorized delete = cancellation + soft delete (seed 004 sections 10.1 and 11.1)
# =============================================================================
@dataclass(frozen=True)
class CancelResult:
    """Outcome of :func:`flow_run_delete`: ``state`` is the root state after the call."""

    run_id: FlowRun.Id
    state: str
    is_deleted: bool
    delete_requested_at: dt.datetime
    changed: bool

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": int(self.run_id), "state": self.state, "is_deleted": self.is_deleted,
                "delete_requested_at": self.delete_requested_at.isoformat(), "changed": self.changed}


def flow_run_delete(*, org: OrgScope, run_id: FlowRun.Id | int) -> CancelResult:
    """Cancel and soft-delete one run of the trusted org (the public ``DeleteFlowInterview``).

    Seed 004 section 10.1 steps 1-5, in one root -> step -> attempt
    transaction: a non-terminal root takes ``IsDeleted=true``,
    ``DeleteRequestedAt`` and ``CancelRequested`` (version +1); its active step
    becomes ``Cancelled`` (``Pending``/``RetryScheduled``) or
    ``CancelRequested`` (``Claimed``/``Running``, whose ``Started`` attempt
    compare-and-swaps to ``Cancelled``; ``Waiting``). A terminal root only
    records the soft-delete fact. Repeating it returns the same outcome
    (``changed=False``). Cleanup to ``Cancelled`` follows at once when no
    lease is live, else :func:`flow_try_cancel_cleanup_one` completes it.

    Args:
        org: the trusted org (from authentication, never from the payload).
        run_id: a ``FlowRun.Id`` or positive int.

    Raises:
        InvalidIdentity: ``run_id`` is not a FlowRun id (before SQL).
        FlowRunNotFound: no such run in ``org``.
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    with transaction.atomic(durable=True):
        now = db_now()
        try:
            run = FlowRunStore.lock(org.org_id, run_id)
        except FlowRun.DoesNotExist:
            raise FlowRunNotFound(f"no flow run {int(run_id)} in this org") from None
        if run.state in t.FLOW_RUN.terminal or run.state == t.RUN_CANCEL_REQUESTED:
            if run.is_deleted:
                return CancelResult(run.pk, run.state, True, run.delete_requested_at, False)
            FlowRunStore.touch(org_id=org.org_id, pk=run.pk, state=run.state, version=run.version,
                               set_fields={"is_deleted": True, "delete_requested_at": now, "updated_at": now})
            audit_insert(org_id=org.org_id, run=run, step=None, attempt=None, event="run_soft_deleted",
                         detail={"state": run.state}, created_at=now)
            return CancelResult(run.pk, run.state, True, now, True)
        step = FlowStepStore.lock(org.org_id, run.current_step_id) if run.current_step_id else None
        live = None
        if step is not None and step.state in (t.STEP_CLAIMED, t.STEP_RUNNING):
            started = FlowStepAttempt.objects.filter(org_id=org.org_id, step_id=step.pk,
                                                     state=t.ATTEMPT_STARTED).order_by("attempt_number").first()
            live = FlowAttemptStore.lock(org.org_id, started.pk) if started is not None else None
        FlowRunStore.transition(
            org_id=org.org_id, pk=run.pk, src=run.state, dst=t.RUN_CANCEL_REQUESTED, version=run.version,
            fences={"is_deleted": False, "delete_requested_at": None},
            set_fields={"is_deleted": True, "delete_requested_at": now, "updated_at": now},
        )
        if step is not None:
            if step.state in (t.STEP_PENDING, t.STEP_RETRY_SCHEDULED):
                FlowStepStore.transition(org_id=org.org_id, pk=step.pk, src=step.state, dst=t.STEP_CANCELLED,
                                         version=step.version, set_fields={"updated_at": now})
            elif step.state in (t.STEP_CLAIMED, t.STEP_RUNNING, t.STEP_WAITING):
                FlowStepStore.transition(org_id=org.org_id, pk=step.pk, src=step.state, dst=t.STEP_CANCEL_REQUESTED,
                                         version=step.version, set_fields={"updated_at": now})
            if live is not None:
                FlowAttemptStore.transition(
                    org_id=org.org_id, pk=live.pk, src=t.ATTEMPT_STARTED, dst=t.ATTEMPT_CANCELLED,
                    version=live.version, fences={"lease_token_digest": live.lease_token_digest,
                                                  "ownership_epoch": live.ownership_epoch},
                    set_fields={"finished_at": now, "failure_class": "cancelled", "retry_decision": "none"},
                )
        audit_insert(org_id=org.org_id, run=run, step=step, attempt=live, event="run_cancel_requested",
                     detail={"from_state": run.state, "step_state": step.state if step else None}, created_at=now)
        failpoints.hit(FP_CANCEL_BEFORE_COMMIT)
    _cancel_cleanup(org_id=org.org_id, run_id=run.pk)
    state = FlowRun.objects.values_list("state", flat=True).get(org_id=org.org_id, pk=run.pk)
    return CancelResult(run.pk, state, True, now, True)


def _cancel_cleanup(*, org_id: str, run_id: FlowRun.Id) -> bool:
    """``CancelRequested -> Cancelled`` once no lease of the run is live (seed 004 sections 10.1, 11.1).

    Locks root, its ``CancelRequested`` steps (id order), then their waiting
    dependencies; cancels those and the root. A step whose old lease is still
    live waits (its attempt is already ``Cancelled``; the old worker's fence
    cannot commit), so cleanup alone enters ``Cancelled``. The live child
    runs of its waiting subflow steps are cancelled first
    (:func:`subflow_children_cancel`).
    """
    subflow_children_cancel(org_id=org_id, run_id=run_id)
    with transaction.atomic(durable=True):
        now = db_now()
        run = FlowRunStore.lock(org_id, run_id)
        if run.state != t.RUN_CANCEL_REQUESTED:
            return False
        steps = FlowStepStore.lock_all(org_id, run_id=run.pk, state=t.STEP_CANCEL_REQUESTED)
        if any(s.lease_expires_at is not None and s.lease_expires_at > now for s in steps):
            return False
        deps = FlowDependencyStore.lock_all(org_id, run_id=run.pk, state=t.DEP_WAITING)
        for step in steps:
            FlowStepStore.transition(org_id=org_id, pk=step.pk, src=t.STEP_CANCEL_REQUESTED, dst=t.STEP_CANCELLED,
                                     version=step.version,
                                     set_fields={"lease_owner": None, "lease_token_digest": None,
                                                 "lease_expires_at": None, "updated_at": now})
        for dep in deps:
            FlowDependencyStore.transition(org_id=org_id, pk=dep.pk, src=t.DEP_WAITING, dst=t.DEP_CANCELLED,
                                           version=dep.version, set_fields={"resolved_at": now})
        FlowRunStore.transition(org_id=org_id, pk=run.pk, src=t.RUN_CANCEL_REQUESTED, dst=t.RUN_CANCELLED,
                                version=run.version, set_fields={"completed_at": now, "updated_at": now})
        audit_insert(org_id=org_id, run=run, step=None, attempt=None, event="run_cancelled",
                     detail={"steps": len(steps), "dependencies": len(deps)}, created_at=now)
    return True


def subflow_children_cancel(*, org_id: str, run_id: int) -> int:
    """Cancel the live child runs the waiting subflow steps of run ``run_id`` started; how many were cancelled.

    Called before the parent's cancel cleanup commits (each child in its own root-first transaction,
    :func:`.lifecycle.flow_run_delete`); a crash in between leaves the parent ``CancelRequested`` and the
    cleanup sweep repeats it.
    """
    children = [dep["child_run"] for dep in FlowDependency.objects.filter(
        org_id=org_id, run_id=run_id, producer_kind=PRODUCER_SUBFLOW, state=t.DEP_WAITING)
        .values_list("condition", flat=True) if isinstance(dep, dict) and dep.get("child_run")]
    cancelled = 0
    for child_id in children:
        if flow_run_delete(org=OrgScope(org_id), run_id=child_id).changed:
            cancelled += 1
    return cancelled


def flow_try_cancel_cleanup_one() -> bool:
    """Complete one ``CancelRequested`` run whose old leases have lapsed (worker unit)."""
    now = db_now_sql()  # discovery reads the database clock in its own statement
    candidates = list(FlowRun.objects.filter(state=t.RUN_CANCEL_REQUESTED).order_by("updated_at", "id")
                      .values_list("org_id", "id")[: policy.CLAIM_BATCH])
    for org_id, run_id in candidates:
        if FlowStepExecution.objects.filter(org_id=org_id, run_id=run_id, state=t.STEP_CANCEL_REQUESTED,
                                            lease_expires_at__gt=now).exists():
            continue
        if _cancel_cleanup(org_id=org_id, run_id=run_id):
            return True
    return False
