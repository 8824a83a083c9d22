"""Expired-attempt recovery (seed 004 section 12.4).

:func:`flow_try_recover_expired_one` fences one attempt whose lease expired
(or whose holder is proven terminated) and schedules its step for retry
after the recovery backoff floor; repeated expiry ends the run
``TerminalFailed`` and commit evidence on a running step quarantines it.
"""
from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction

from nexusflow.kernel.clock import db_now, db_now_sql

from .. import policy, reasons
from .. import transitions as t
from ..models import FlowCheckpoint, FlowStepAttempt, FlowStepExecution
from ..store import FlowAttemptStore, FlowRunStore, FlowStepStore

log = logging.getLogger("nexusflow.flows")


def flow_try_recover_expired_one() -> bool:
    """Fence one attempt whose lease expired and schedule its step for retry.

    Locks root -> step -> attempt. The step transaction commits the checkpoint
    and the step transition atomically, so a step still Claimed/Running under
    the expired token with no checkpoint of its own proves no commit; the old
    attempt becomes ``Fenced``, the step ``RetryScheduled`` with ``run_after >=
    now + RecoveryBackoffFloor`` and the root ``Runnable``. Repeated expiry
    ends the run ``TerminalFailed``; commit evidence on a running step
    quarantines it.
    """
    now = db_now_sql()  # discovery reads the database clock in its own statement
    candidates = list(
        FlowStepExecution.objects.filter(state__in=(t.STEP_CLAIMED, t.STEP_RUNNING), lease_expires_at__lt=now)
        .order_by("lease_expires_at", "id").values_list("org_id", "run_id", "id", "lease_token_digest")
        [: policy.CLAIM_BATCH]
    )
    for org_id, run_id, step_id, token_digest in candidates:
        if _recover(org_id=org_id, run_id=run_id, step_id=step_id, token_digest=token_digest):
            return True
    # A holder proven terminated cannot commit either: recover it without waiting for the lease.
    from nexusflow.kernel.workers import holder_termination_proof

    live = (FlowStepExecution.objects.filter(state__in=(t.STEP_CLAIMED, t.STEP_RUNNING), lease_expires_at__gte=now)
            .order_by("lease_expires_at", "id").values_list("org_id", "run_id", "id", "lease_token_digest", "lease_owner")
            [: policy.CLAIM_BATCH])
    for org_id, run_id, step_id, token_digest, owner in live:
        if owner and holder_termination_proof(owner) is not None:
            if _recover(org_id=org_id, run_id=run_id, step_id=step_id, token_digest=token_digest, holder_dead=True):
                return True
    return False


def _recover(*, org_id: str, run_id: int, step_id: int, token_digest: str, holder_dead: bool = False) -> bool:
    with transaction.atomic(durable=True):
        now = db_now()
        run = FlowRunStore.lock(org_id, run_id)
        step = FlowStepStore.lock(org_id, step_id)
        if (step.state not in (t.STEP_CLAIMED, t.STEP_RUNNING) or step.lease_token_digest != token_digest
                or step.lease_expires_at is None or (step.lease_expires_at >= now and not holder_dead)):
            return False
        live = FlowStepAttempt.objects.filter(org_id=org_id, step_id=step.pk, state=t.ATTEMPT_STARTED,
                                              lease_token_digest=token_digest).first()
        if live is None:
            log.error("expired step has no live attempt", extra={"org_id": org_id, "step_id": step_id})
            return False
        attempt = FlowAttemptStore.lock(org_id, live.pk)
        if (run.state != t.RUN_RUNNING or run.version != attempt.root_state_version_at_claim
                or run.current_step_id != step.pk):
            # Cancellation or another root transition won; never make the step runnable here.
            return False
        root_fences = {"current_step_id": step.pk, "is_deleted": False, "delete_requested_at": None}
        attempt_fences = {"lease_token_digest": token_digest, "ownership_epoch": attempt.ownership_epoch,
                          "root_state_version_at_claim": attempt.root_state_version_at_claim}
        committed = FlowCheckpoint.objects.filter(org_id=org_id, step_id=step.pk).exists()
        if committed and step.state == t.STEP_RUNNING:
            FlowAttemptStore.transition(
                org_id=org_id, pk=attempt.pk, src=t.ATTEMPT_STARTED, dst=t.ATTEMPT_COMMIT_UNKNOWN,
                version=attempt.version, fences=attempt_fences,
                set_fields={"finished_at": now, "failure_class": "ambiguous", "retry_decision": "quarantined"},
            )
            FlowStepStore.transition(
                org_id=org_id, pk=step.pk, src=t.STEP_RUNNING, dst=t.STEP_QUARANTINED, version=step.version,
                fences={"lease_token_digest": token_digest},
                set_fields={"lease_expires_at": None, "updated_at": now, "reason_code": reasons.RECOVERY_COMMIT_EVIDENCE},
            )
            FlowRunStore.transition(
                org_id=org_id, pk=run.pk, src=t.RUN_RUNNING, dst=t.RUN_QUARANTINED, version=run.version,
                fences=root_fences, set_fields={"reason_code": reasons.RECOVERY_COMMIT_EVIDENCE,
                                                "completed_at": now, "updated_at": now},
            )
            return True
        exhausted = step.attempt_count >= policy.max_attempts(org_id, run.plan_id) and step.state == t.STEP_RUNNING
        FlowAttemptStore.transition(
            org_id=org_id, pk=attempt.pk, src=t.ATTEMPT_STARTED, dst=t.ATTEMPT_FENCED, version=attempt.version,
            fences=attempt_fences,
            set_fields={"finished_at": now, "failure_class": "fenced",
                        "retry_decision": "terminal" if exhausted else "scheduled"},
        )
        if exhausted:
            FlowStepStore.transition(
                org_id=org_id, pk=step.pk, src=t.STEP_RUNNING, dst=t.STEP_FAILED, version=step.version,
                fences={"lease_token_digest": token_digest},
                set_fields={"failure_class": "terminal", "lease_owner": None, "lease_token_digest": None,
                            "lease_expires_at": None, "updated_at": now, "reason_code": reasons.LEASE_EXPIRY_EXHAUSTED},
            )
            FlowRunStore.transition(
                org_id=org_id, pk=run.pk, src=t.RUN_RUNNING, dst=t.RUN_TERMINAL_FAILED, version=run.version,
                fences=root_fences, set_fields={"reason_code": reasons.LEASE_EXPIRY_EXHAUSTED,
                                                "completed_at": now, "updated_at": now},
            )
            return True
        run_after = now + dt.timedelta(milliseconds=attempt.recovery_backoff_floor_ms)
        FlowStepStore.transition(
            org_id=org_id, pk=step.pk, src=step.state, dst=t.STEP_RETRY_SCHEDULED, version=step.version,
            fences={"lease_token_digest": token_digest},
            set_fields={"run_after": run_after, "failure_class": "fenced", "lease_owner": None,
                        "lease_token_digest": None, "lease_expires_at": None, "updated_at": now},
        )
        FlowRunStore.transition(
            org_id=org_id, pk=run.pk, src=t.RUN_RUNNING, dst=t.RUN_RUNNABLE, version=run.version,
            fences=root_fences, set_fields={"run_after": run_after, "updated_at": now},
        )
    return True
