"""Dependency expiry and terminal convergence (seed 004 section 14.3).

:func:`flow_try_expire_one` (worker unit ``flow.expire``) finds a waiting
producer dependency whose deadline has passed without locking it, then locks
root -> step -> dependency (never entering through the dependency) and
commits exactly one outcome of the dependency's ``expiry_policy`` in one
transaction:

- ``quarantine``: the producer's outcome is unknown (an effect whose receipt
  never came may or may not have happened): dependency ``quarantined``, step
  and run ``Quarantined`` with ``flow_dependency_expired_unknown``;
- ``terminal_failure``: dependency ``expired``, step ``Failed``, run
  ``TerminalFailed`` with ``flow_dependency_expired``;
- ``fault_path``: dependency ``expired``, step ``Failed``, the compiled fault
  successor (``condition["fault_step"]``) ``Pending`` and the run
  ``Runnable`` on it.

Resolution (:mod:`.waits`, :mod:`.wait_resolution`), expiry and
cancellation lock the same rows in the same order and compare the same
versions, so exactly one wins and the losers find the terminal fact.
Waits with a time event (``runtime.clock``, and a record event beside
AlarmEvents: policy ``fires``) do not expire: their deadline is their time.

:func:`flow_try_repair_one` (worker unit ``flow.repair``) treats a run still
``Waiting`` on a step whose dependency is already terminal as invariant
corruption and replays the root-first finalizer of that dependency's state.
"""
from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import Max

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now, db_now_sql

from .. import policy, reasons
from .. import transitions as t
from ..models import FlowDependency, FlowRun, FlowStepExecution
from ..store import FlowDependencyStore, FlowRunStore, FlowStepStore, audit_insert
from .admission import _step_def
from .wait_resolution import EXPIRY_FIRES, lock_waiting, resume_waiting

log = logging.getLogger("nexusflow.flows")

EXPIRY_QUARANTINE = "quarantine"
EXPIRY_TERMINAL = "terminal_failure"
EXPIRY_FAULT_PATH = "fault_path"
#: The expiry policies this module applies.
EXPIRY_POLICIES = (EXPIRY_QUARANTINE, EXPIRY_TERMINAL, EXPIRY_FAULT_PATH)

FP_EXPIRE_BEFORE_COMMIT = failpoints.declare("flow.dependency.expire_before_commit")

_ROOT_FENCES = {"is_deleted": False, "delete_requested_at": None}


def flow_try_expire_one() -> bool:
    """Expire one due producer dependency under its compiled policy. True when one expired.

    Discovery reads without locks (oldest deadline first, a bounded batch);
    a candidate that moved meanwhile is skipped.
    """
    now = db_now_sql()  # discovery reads the database clock in its own statement
    candidates = list(
        FlowDependency.objects.filter(state=t.DEP_WAITING, deadline__lte=now).exclude(expiry_policy=EXPIRY_FIRES)
        .order_by("deadline", "id").values_list("org_id", "run_id", "step_id", "id")[: policy.CLAIM_BATCH]
    )
    for org_id, run_id, step_id, dependency_id in candidates:
        if _expire(org_id=org_id, run_id=run_id, step_id=step_id, dependency_id=dependency_id):
            return True
    return False


def _expire(*, org_id: str, run_id: int, step_id: int, dependency_id: int) -> bool:
    with transaction.atomic(durable=True):
        now = db_now()
        locked = lock_waiting(org_id=org_id, run_id=run_id, step_id=step_id, dependency_id=dependency_id)
        if locked is None:
            return False
        run, step, dependency = locked
        if dependency.deadline > now or dependency.expiry_policy == EXPIRY_FIRES:
            return False
        outcome = _finalize(run, step, dependency, now)
        audit_insert(org_id=org_id, run=run, step_id=step.pk, attempt=None, event="dependency_expired",
                     detail={"dependency": int(dependency.pk), "policy": dependency.expiry_policy,
                             "outcome": outcome, "deadline": dependency.deadline.isoformat()}, created_at=now)
        failpoints.hit(FP_EXPIRE_BEFORE_COMMIT)
    return True


def _finalize(run: FlowRun, step: FlowStepExecution, dependency: FlowDependency, now, *,
              policy_name: str | None = None, fault_step: str | None = None,
              unknown_cause: str = reasons.DEPENDENCY_EXPIRED_UNKNOWN, definite_cause: str = reasons.DEPENDENCY_EXPIRED,
              definite_state: str = t.DEP_EXPIRED) -> str:
    """Commit one policy outcome for ``dependency`` (rows already locked root -> step -> dependency).

    Without ``policy_name`` the dependency's own compiled ``expiry_policy``
    (and its condition's ``fault_step``) applies, with the expiry causes;
    the effect-handoff finalizer (:mod:`.handoff`) passes its own policy,
    causes and the dependency's definite state (``rejected``).
    """
    org_id = run.org_id
    if policy_name is None:
        policy_name = dependency.expiry_policy if dependency.expiry_policy in EXPIRY_POLICIES else EXPIRY_QUARANTINE
        fault_step = (dependency.condition or {}).get("fault_step")
    if policy_name == EXPIRY_FAULT_PATH and not fault_step:
        policy_name = EXPIRY_TERMINAL  # no compiled successor: the run cannot continue
    if policy_name == EXPIRY_QUARANTINE:
        cause = unknown_cause
        if dependency.state == t.DEP_WAITING:
            FlowDependencyStore.transition(org_id=org_id, pk=dependency.pk, src=t.DEP_WAITING, dst=t.DEP_QUARANTINED,
                                           version=dependency.version,
                                           set_fields={"resolved_at": now, "reason_code": cause})
        FlowStepStore.transition(org_id=org_id, pk=step.pk, src=t.STEP_WAITING, dst=t.STEP_QUARANTINED,
                                 version=step.version, set_fields={"failure_class": "ambiguous", "updated_at": now,
                                                                   "reason_code": cause})
        FlowRunStore.transition(org_id=org_id, pk=run.pk, src=t.RUN_WAITING, dst=t.RUN_QUARANTINED,
                                version=run.version, fences={"current_step_id": step.pk, **_ROOT_FENCES},
                                set_fields={"reason_code": cause, "completed_at": now, "updated_at": now})
        return "quarantined"
    cause = definite_cause
    if dependency.state == t.DEP_WAITING:
        FlowDependencyStore.transition(org_id=org_id, pk=dependency.pk, src=t.DEP_WAITING, dst=definite_state,
                                       version=dependency.version, set_fields={"resolved_at": now, "reason_code": cause})
    FlowStepStore.transition(org_id=org_id, pk=step.pk, src=t.STEP_WAITING, dst=t.STEP_FAILED, version=step.version,
                             set_fields={"failure_class": "terminal", "updated_at": now, "reason_code": cause})
    if policy_name == EXPIRY_TERMINAL:
        FlowRunStore.transition(org_id=org_id, pk=run.pk, src=t.RUN_WAITING, dst=t.RUN_TERMINAL_FAILED,
                                version=run.version, fences={"current_step_id": step.pk, **_ROOT_FENCES},
                                set_fields={"reason_code": cause, "completed_at": now, "updated_at": now})
        return "terminal_failure"
    nxt = _step_def(run.plan, fault_step)
    ordinal = (FlowStepExecution.objects.filter(org_id=org_id, run_id=run.pk, plan_step_key=nxt["key"])
               .aggregate(m=Max("invocation_ordinal"))["m"] or 0) + 1
    successor = FlowStepStore.create(
        org_id=org_id, run=run, plan_step_key=nxt["key"], step_kind=nxt["kind"], state=t.STEP_PENDING,
        input_checkpoint_id=step.input_checkpoint_id, run_after=now, created_at=now, updated_at=now,
        invocation_ordinal=ordinal)
    FlowRunStore.transition(org_id=org_id, pk=run.pk, src=t.RUN_WAITING, dst=t.RUN_RUNNABLE, version=run.version,
                            fences={"current_step_id": step.pk, **_ROOT_FENCES},
                            set_fields={"current_step_id": successor.pk, "run_after": now, "updated_at": now})
    return "fault_path"


def flow_try_repair_one() -> bool:
    """Replay the finalizer of one run left ``Waiting`` on a terminal dependency (section 14.3). True if repaired.

    A satisfied dependency wakes the step (``Pending``, run ``Runnable``);
    an expired or quarantined one applies its expiry outcome; a cancelled
    one leaves the run to cancellation. Root -> step -> dependency locks.
    """
    stuck = list(
        FlowDependency.objects.filter(state__in=(t.DEP_SATISFIED, t.DEP_EXPIRED, t.DEP_QUARANTINED),
                                      step__state=t.STEP_WAITING, run__state=t.RUN_WAITING)
        .order_by("id").values_list("org_id", "run_id", "step_id", "id")[: policy.CLAIM_BATCH]
    )
    for org_id, run_id, step_id, dependency_id in stuck:
        if _repair(org_id=org_id, run_id=run_id, step_id=step_id, dependency_id=dependency_id):
            return True
    return False


def _repair(*, org_id: str, run_id: int, step_id: int, dependency_id: int) -> bool:
    with transaction.atomic(durable=True):
        now = db_now()
        run = FlowRunStore.lock(org_id, run_id)
        if run.state != t.RUN_WAITING or run.current_step_id != step_id:
            return False
        step = FlowStepStore.lock(org_id, step_id)
        dependency = FlowDependencyStore.lock(org_id, dependency_id)
        if step.state != t.STEP_WAITING or dependency.step_id != step.pk or dependency.state == t.DEP_WAITING:
            return False
        detail: dict[str, Any] = {"dependency": int(dependency.pk), "dependency_state": dependency.state}
        log.error("run %s waits on terminal dependency %s (%s); replaying its finalizer", run_id, dependency_id,
                  dependency.state, extra={"org_id": org_id, "run_id": run_id})
        if dependency.state == t.DEP_SATISFIED:
            resume_waiting(run, step, now=now)
            detail["outcome"] = "resumed"
        elif dependency.state in (t.DEP_EXPIRED, t.DEP_QUARANTINED):
            if dependency.state == t.DEP_QUARANTINED:
                dependency.expiry_policy = EXPIRY_QUARANTINE
            detail["outcome"] = _finalize(run, step, dependency, now)
        else:
            return False
        audit_insert(org_id=org_id, run=run, step_id=step.pk, attempt=None, event="dependency_repaired",
                     detail=detail, created_at=now)
    return True
