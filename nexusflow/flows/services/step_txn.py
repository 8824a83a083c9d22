"""The step transaction every executor runs in (seed 004 sections 5.2 and 12.2).

:func:`_lock_fenced` locks root -> step -> attempt and verifies the whole
claim fence; :func:`_commit_step` writes audit evidence and the checkpoint and
moves attempt, step and root together (fenced CAS), creating the next step;
:func:`_step_txn` is the durable transaction around it and tells a failed
COMMIT (:class:`_CommitUnknown`) and a rollback on a lost session
(:class:`_RollbackUnknown`) from a proven rollback.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction
from django.db.models import Q

from nexusflow.kernel import failpoints
from nexusflow.kernel.errors import FenceRejected
from nexusflow.kernel.rows import row_max

from .. import transitions as t
from ..compiler import KIND_TERMINAL
from ..models import FlowCheckpoint, FlowExecutionPlan, FlowRun, FlowStepAttempt, FlowStepExecution
from ..selectors import flow_checkpoints_with_top
from ..store import FlowAttemptStore, FlowRunStore, FlowStepStore, audit_insert, checkpoint_insert
from .admission import TRIGGER_CHECKPOINT_SEQUENCE, _checkpoint_digest, _step_def
from .claim import StepClaim

FP_BEFORE_COMMIT = failpoints.declare("flow.step.before_commit")


def _verify_root(run: FlowRun, claim: StepClaim) -> None:
    if (run.state != t.RUN_RUNNING or run.version != claim.root_version or run.current_step_id != claim.step_id
            or run.is_deleted or run.delete_requested_at is not None):
        raise FenceRejected(
            f"run {claim.run_id}: root moved (state {run.state} v{run.version}, expected Running v{claim.root_version})"
        )


def _lock_live_step(claim: StepClaim, expired: str) -> tuple[FlowRun, FlowStepExecution, dt.datetime]:
    """Lock root then step (lifecycle-only transactions) and refuse a claim whose lease has run out.

    Returns:
        ``(run, step, now)``: ``now`` is the database clock read with the root lock.

    Raises:
        FenceRejected: the root moved, or the step's lease ended at or before ``now`` (``expired`` says how).
    """
    run, now = FlowRunStore.lock_at_clock(claim.org_id, claim.run_id)
    _verify_root(run, claim)
    step = FlowStepStore.lock(claim.org_id, claim.step_id)
    if step.lease_expires_at is None or step.lease_expires_at <= now:
        raise FenceRejected(f"step {claim.step_id}: {expired}")
    return run, step, now


def _lock_fenced(claim: StepClaim, *, with_clock: bool = False):
    """Lock root -> step -> attempt and verify the complete claim fence.

    Returns:
        ``(run, step, attempt)``; with ``with_clock`` (a transaction whose first lock is the root),
        ``(run, step, attempt, now)``: ``now`` is the database clock the root's locking read read
        (:meth:`CasStore.lock_at_clock`), one round trip fewer than a ``db_now()`` before it.

    Raises:
        FenceRejected: any of root version/pointer, step lease/version or
            attempt fence is no longer the claim's.
    """
    if with_clock:
        run, now = FlowRunStore.lock_at_clock(claim.org_id, claim.run_id)
    else:
        run, now = FlowRunStore.lock(claim.org_id, claim.run_id), None
    _verify_root(run, claim)
    step = FlowStepStore.lock(claim.org_id, claim.step_id)
    if (step.state != t.STEP_RUNNING or step.version != claim.step_version
            or step.lease_token_digest != claim.lease_token_digest or step.ownership_epoch != claim.ownership_epoch):
        raise FenceRejected(f"step {claim.step_id}: lease or version moved")
    attempt = FlowAttemptStore.lock(claim.org_id, claim.attempt_id)
    if (attempt.state != t.ATTEMPT_STARTED or attempt.version != claim.attempt_version
            or attempt.lease_token_digest != claim.lease_token_digest
            or attempt.root_state_version_at_claim != claim.root_version):
        raise FenceRejected(f"attempt {claim.attempt_id}: no longer the live attempt")
    return (run, step, attempt, now) if with_clock else (run, step, attempt)


def _input_state(claim: StepClaim) -> dict[str, Any]:
    """The interpreter state the step starts from: its input checkpoint's context (``{}`` when it has none)."""
    return _step_inputs(claim)[1]


def claims_with_inputs(claims: list[StepClaim]) -> list[StepClaim]:
    """Return ``claims`` with their step inputs and their runs' highest checkpoint sequence, read in one statement.

    Seed 004 section 12.2 step 1 (the worker loads the input checkpoint): for every claim of a batch, the
    run's trigger snapshot, the step's input checkpoint context (both immutable rows) and the highest
    checkpoint sequence of its run (:attr:`StepClaim.checkpoint_sequence`), one read for the whole batch
    instead of two per step transaction. Call it after the claims committed. A claim whose trigger
    checkpoint is not found is returned as it is (its step reads its inputs itself, as before).

    Args:
        claims: confirmed claims (any orgs).

    Returns:
        The claims in the same order, each with ``inputs`` and ``checkpoint_sequence`` set when found.
    """
    out = list(claims)
    by_org: dict[str, list[int]] = {}
    for index, claim in enumerate(out):
        if claim.inputs is None:
            by_org.setdefault(claim.org_id, []).append(index)
    for org_id, indexes in by_org.items():
        runs = sorted({int(out[i].run_id) for i in indexes})
        own = sorted({int(out[i].input_checkpoint_id) for i in indexes if out[i].input_checkpoint_id is not None})
        # Two reads per batch, each through its own key whatever the runs' lengths: the trigger snapshots by
        # (org, run, sequence), the input checkpoints by id (one statement with an OR of the two let the
        # optimizer pick an index merge for some batches and not for others).
        rows = flow_checkpoints_with_top(org_id=org_id, runs=runs, sequence=TRIGGER_CHECKPOINT_SEQUENCE)
        if own:
            rows += flow_checkpoints_with_top(org_id=org_id, runs=runs, ids=own)
        triggers, payloads, tops = {}, {}, {}
        for run_id, pk, sequence, payload, highest in rows:
            payloads[int(pk)] = (int(run_id), payload)
            tops[int(run_id)] = int(highest)
            if sequence == TRIGGER_CHECKPOINT_SEQUENCE:
                triggers[int(run_id)] = payload
        for i in indexes:
            claim = out[i]
            trigger = triggers.get(int(claim.run_id))
            if trigger is None:
                continue
            found = payloads.get(int(claim.input_checkpoint_id)) if claim.input_checkpoint_id is not None else None
            context = (found[1].get("context") or {}) if found is not None and found[0] == int(claim.run_id) else {}
            out[i] = dataclasses.replace(claim, inputs=(trigger.get("record") or {}, context),
                                         checkpoint_sequence=tops[int(claim.run_id)])
    return out


def _step_inputs(claim: StepClaim) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's trigger snapshot (``record``: object, key, fields, prior fields, version) and the step's
    input context (``{}`` when it has none): the claim's (:func:`claims_with_inputs`), else read together
    (one statement)."""
    if claim.inputs is not None:
        return claim.inputs
    rows = {pk: (sequence, payload) for pk, sequence, payload in FlowCheckpoint.objects.filter(
        Q(pk=claim.input_checkpoint_id) | Q(sequence=TRIGGER_CHECKPOINT_SEQUENCE),
        org_id=claim.org_id, run_id=claim.run_id).values_list("pk", "sequence", "context_payload")}
    trigger = next(payload for sequence, payload in rows.values() if sequence == TRIGGER_CHECKPOINT_SEQUENCE)
    own = rows.get(claim.input_checkpoint_id) if claim.input_checkpoint_id is not None else None
    context = (own[1].get("context") or {}) if own is not None else {}
    return trigger.get("record") or {}, context


def _attempt_fences(claim: StepClaim) -> dict[str, Any]:
    return {"lease_token_digest": claim.lease_token_digest, "ownership_epoch": claim.ownership_epoch,
            "root_state_version_at_claim": claim.root_version}


def _step_fences(claim: StepClaim) -> dict[str, Any]:
    return {"lease_token_digest": claim.lease_token_digest, "ownership_epoch": claim.ownership_epoch}


def _commit_step(
    claim: StepClaim, plan: FlowExecutionPlan, run: FlowRun, attempt: FlowStepAttempt, now: dt.datetime, *,
    output: dict[str, Any], step_dst: str, root_dst: str, next_key: str | None, cause: str = "",
    context: dict[str, Any] | None = None, next_state: str = t.STEP_PENDING,
) -> int:
    """Insert audit evidence and the checkpoint, then move attempt, step and root together (fenced CAS).

    Seed 004 section 12.2 steps 11-12: runs inside the step transaction after
    the business writes; any failure here (audit, checkpoint, a lost fence)
    rolls the whole transaction back, business writes included. The next
    step is inserted in ``next_state`` (``Waiting`` only for the
    EffectCompletion step an EffectSubmit commits, seed 004 section 15.1).

    When the next step is the plan's Terminal step (no user work) and the run would become ``Runnable``, the
    same transaction inserts it ``Succeeded`` and finishes the run (``root_dst`` becomes ``Succeeded``): no
    claim, start and step transactions for a step that only ends the run.

    Returns:
        The id of the run's current step after the commit: the next step, or this one when there is none.
    """
    nxt = None if next_key is None else _step_def(plan, next_key)
    finishes = (nxt is not None and nxt["kind"] == KIND_TERMINAL and root_dst == t.RUN_RUNNABLE
                and next_state == t.STEP_PENDING)
    if finishes:
        root_dst, next_state = t.RUN_SUCCEEDED, t.STEP_SUCCEEDED
    sequence = (claim.checkpoint_sequence if claim.checkpoint_sequence is not None else (
        row_max(FlowCheckpoint, "sequence", org_id=claim.org_id, run_id=claim.run_id) or 0)) + 1
    payload = {"step": claim.step_key, "output": output, "cursor": next_key}
    if context is not None:
        payload["context"] = context
    audit_insert(org_id=claim.org_id, run=run, step_id=claim.step_id, attempt=attempt, event="step_committed",
                 detail={"step": claim.step_key, "step_state": step_dst, "run_state": root_dst,
                         "attempt": claim.attempt_number, "cause": cause}, created_at=now)
    checkpoint = checkpoint_insert(
        org_id=claim.org_id, run=run, step_id=claim.step_id, sequence=sequence, plan_cursor=next_key,
        context_payload=payload, context_digest=_checkpoint_digest(payload), created_by_attempt=attempt,
        created_at=now,
    )
    FlowAttemptStore.transition(
        org_id=claim.org_id, pk=claim.attempt_id, src=t.ATTEMPT_STARTED, dst=t.ATTEMPT_COMMITTED,
        version=claim.attempt_version, fences=_attempt_fences(claim), set_fields={"finished_at": now},
    )
    FlowStepStore.transition(
        org_id=claim.org_id, pk=claim.step_id, src=t.STEP_RUNNING, dst=step_dst, version=claim.step_version,
        fences=_step_fences(claim),
        set_fields={"output_checkpoint_id": checkpoint.pk, "lease_expires_at": None, "updated_at": now,
                    "failure_class": "terminal" if step_dst == t.STEP_FAILED else "", "reason_code": cause},
    )
    current_step_id = claim.step_id
    if nxt is not None:
        # A durable loop revisits its steps: each visit is the next invocation of that plan step (the Terminal
        # step is visited once).
        ordinal = 1 if finishes else (row_max(FlowStepExecution, "invocation_ordinal", org_id=claim.org_id,
                                              run_id=claim.run_id, plan_step_key=nxt["key"]) or 0) + 1
        current_step_id = FlowStepStore.create(
            org_id=claim.org_id, run=run, plan_step_key=nxt["key"], step_kind=nxt["kind"], state=next_state,
            input_checkpoint=checkpoint, run_after=None if finishes else now, created_at=now, updated_at=now,
            invocation_ordinal=ordinal,
        ).pk
        if finishes:  # the Terminal step's own output checkpoint, as if it had run (it takes no attempt)
            payload = {"step": nxt["key"], "output": {"terminal": True}, "cursor": None}
            checkpoint = checkpoint_insert(
                org_id=claim.org_id, run=run, step_id=current_step_id, sequence=sequence + 1, plan_cursor=None,
                context_payload=payload, context_digest=_checkpoint_digest(payload), created_by_attempt=attempt,
                created_at=now)
            FlowStepStore.touch(org_id=claim.org_id, pk=current_step_id, state=t.STEP_SUCCEEDED, version=1,
                                set_fields={"output_checkpoint_id": checkpoint.pk})
            audit_insert(org_id=claim.org_id, run=run, step_id=current_step_id, attempt=None, event="step_committed",
                         detail={"step": nxt["key"], "step_state": t.STEP_SUCCEEDED, "run_state": root_dst,
                                 "attempt": 0, "cause": "", "committed_with": claim.step_key}, created_at=now)
    root_fields: dict[str, Any] = {"current_step_id": current_step_id, "current_checkpoint_id": checkpoint.pk,
                                   "updated_at": now, "run_after": now}
    if root_dst in t.FLOW_RUN.terminal:
        root_fields.update({"completed_at": now, "reason_code": cause})
    FlowRunStore.transition(
        org_id=claim.org_id, pk=claim.run_id, src=t.RUN_RUNNING, dst=root_dst, version=claim.root_version,
        fences={"current_step_id": claim.step_id, "is_deleted": False, "delete_requested_at": None},
        set_fields=root_fields, locked=run,
    )
    return current_step_id


# Lost-connection client errors: after one of these the server's outcome is unknown to this worker.
_CONNECTION_LOST_CODES = frozenset({2006, 2013, 2055, 4031})


class _CommitUnknown(Exception):
    """The step transaction's COMMIT (or its response) failed: the outcome is unknown to the worker."""


class _RollbackUnknown(Exception):
    """The step failed and its server session did not survive: the rollback is not proven."""


def _session_id() -> int | None:
    raw = connection.connection
    try:
        return raw.thread_id() if raw is not None else None
    except Exception:  # a dead handle has no session
        return None


def _same_session(session: int | None) -> bool:
    """Is the connection still the live server session ``session`` (so its ROLLBACK was acknowledged)?"""
    if session is None or connection.connection is None:
        return False
    try:
        return connection.is_usable() and connection.connection.thread_id() == session
    except Exception:
        return False


def _connection_lost(exc: BaseException) -> bool:
    from django.db import InterfaceError, OperationalError

    while exc is not None:
        if isinstance(exc, InterfaceError):
            return True
        if isinstance(exc, OperationalError) and exc.args and exc.args[0] in _CONNECTION_LOST_CODES:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def before_step_commit(claim_hint: Any = None) -> None:
    """Seam run inside the step transaction right before COMMIT (tests sever the connection here)."""


def after_step_commit(claim_hint: Any = None) -> None:
    """Seam run right after COMMIT returned (tests lose the commit response here)."""


@contextmanager
def _step_txn():
    """The step transaction; a failure of the COMMIT itself becomes :class:`_CommitUnknown`.

    Seed 004 section 5.2 items 5-6: only a proven rollback permits replay;
    commit-unknown is resolved under the fence (:func:`.execute._record_unknown`).
    """
    body_done = False
    session = None
    try:
        with transaction.atomic(durable=True):
            session = _session_id()
            yield
            before_step_commit()
            body_done = True
        after_step_commit()
    except Exception as exc:
        if body_done:
            raise _CommitUnknown(str(exc)) from exc
        if _connection_lost(exc) or not _same_session(session):
            raise _RollbackUnknown(str(exc)) from exc
        raise
