"""Execute: run one claimed step to its committed outcome (seed 004 sections 12.2, 13 and 5.2).

:func:`flow_step_execute` starts the claimed step (``Claimed -> Running``),
runs the executor of its kind in the step transaction
(:mod:`.step_txn`) and classifies the result: committed, proven rollback
(durable backoff or ``Failed``), or commit/rollback unknown (resolved under
the fence, else ``Quarantined``). Graph steps (compute, current read,
bounded mutation, decision) and the terminal step run here; the effect steps
run in :mod:`.effects`. Workers call :func:`flow_try_run_step_one`; the
operator's ``flows run`` calls :func:`flow_run_drive`.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction

from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import FenceRejected, NexusError, StaleVersion
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.logs import log_context
from nexusflow.kernel.pressure import mutation_admission
from nexusflow.kernel.rows import first_row
from nexusflow.kernel.scope import OrgScope
from nexusflow.kernel.tuning import setting_number
from runtime_outbox.policy import runtime_policy

from .. import policy, reasons, wakeups
from .. import transitions as t
from ..authorization import FlowAccessDenied, reauthorize_step, system_identity
from ..compiler import (
    ATOMIC_MAX_WRITES,
    KIND_CURRENT_READ,
    KIND_DEPENDENCY_WAIT,
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_MUTATION,
    KIND_PURE_COMPUTE,
    KIND_TERMINAL,
)
from ..errors import FlowExecutionError, FlowRunNotFound, LateLockDiscovery, PlanMismatch
from ..interpreter import Outcome, relationship_field, run_graph
from ..models import FlowExecutionPlan, FlowRun, FlowStepAttempt
from ..selectors import flow_plan_of, flow_subflow_payloads
from ..store import FlowAttemptStore, FlowRunStore, FlowStepStore
from .admission import _SAVE_ORIGIN, _SaveOrigin, _step_def
from .claim import StepClaim, _claim, flow_lease_admission, flow_step_claim_batch
from .effects import _exec_effect_completion, _exec_effect_submit
from .step_txn import (
    FP_BEFORE_COMMIT,
    _attempt_fences,
    _commit_step,
    _CommitUnknown,
    _lock_fenced,
    _lock_live_step,
    _RollbackUnknown,
    _step_fences,
    _step_inputs,
    _step_txn,
    _verify_root,
    claims_with_inputs,
)
from .time_waits import _exec_dependency_wait
from .waits import flow_try_wake_one

log = logging.getLogger("nexusflow.flows")

FP_AFTER_CLAIM = failpoints.declare("flow.step.after_claim")
FP_AFTER_COMMIT = failpoints.declare("flow.step.after_commit")
FP_AFTER_BUSINESS_LOCKS = failpoints.declare("flow.step.after_business_locks")
FP_FIRST_BUSINESS_LOCK = failpoints.declare("flow.step.first_business_lock")
FP_AFTER_ROLLBACK = failpoints.declare("flow.step.after_rollback")


def _start(claim: StepClaim) -> StepClaim:
    """Lifecycle-only transaction: step Claimed -> Running under the claim fence."""
    with transaction.atomic(durable=True):
        run, _step, now = _lock_live_step(claim, "lease expired before execution started")
        version = FlowStepStore.transition(
            org_id=claim.org_id, pk=claim.step_id, src=t.STEP_CLAIMED, dst=t.STEP_RUNNING,
            version=claim.step_version,
            fences={"lease_token_digest": claim.lease_token_digest, "ownership_epoch": claim.ownership_epoch},
            set_fields={"updated_at": now},
        )
    return dataclasses.replace(claim, step_version=version, save_depth=run.save_depth)


def _start_batch(claims: list[StepClaim]) -> dict[int, StepClaim | FenceRejected]:
    """One lifecycle-only transaction starting every claim of a batch (one org): roots in id order, then
    steps, each verified exactly as :func:`_start` verifies one before its ``Claimed -> Running`` CAS.

    Returns:
        ``{step id: started claim}``, or the :class:`FenceRejected` a claim whose fence moved gets (its
        row is left as it is; the others still start).
    """
    org_id = claims[0].org_id
    out: dict[int, StepClaim | FenceRejected] = {}
    with transaction.atomic(durable=True):
        locked, now = FlowRunStore.lock_many_at_clock(org_id, [c.run_id for c in claims])
        runs = {int(run.pk): run for run in locked}
        live = []
        for claim in claims:
            run = runs.get(int(claim.run_id))
            try:
                if run is None:
                    raise FenceRejected(f"run {claim.run_id}: gone")
                _verify_root(run, claim)
                live.append(claim)
            except FenceRejected as exc:
                out[int(claim.step_id)] = exc
        steps = {int(step.pk): step for step in FlowStepStore.lock_many(org_id, [c.step_id for c in live])}
        for claim in live:
            step = steps.get(int(claim.step_id))
            if (step is None or step.state != t.STEP_CLAIMED or step.version != claim.step_version
                    or step.lease_token_digest != claim.lease_token_digest
                    or step.ownership_epoch != claim.ownership_epoch):
                out[int(claim.step_id)] = FenceRejected(f"step {claim.step_id}: lease or version moved")
                continue
            if step.lease_expires_at is None or step.lease_expires_at <= now:
                out[int(claim.step_id)] = FenceRejected(
                    f"step {claim.step_id}: lease expired before execution started")
                continue
            version = FlowStepStore.transition(
                org_id=org_id, pk=claim.step_id, src=t.STEP_CLAIMED, dst=t.STEP_RUNNING, version=claim.step_version,
                fences=_step_fences(claim), set_fields={"updated_at": now},
            )
            out[int(claim.step_id)] = dataclasses.replace(claim, step_version=version,
                                                          save_depth=runs[int(claim.run_id)].save_depth)
    return out


class _CurrentReader:
    """Non-locking current reads of live records of the run's org (seed 004 section 12.2 step 5)."""

    def __init__(self, org_id: str):
        self.org_id = org_id
        #: The objects this step read records of (reauthorized before the step commits, seed 004 section 17.2).
        self.objects_read: set[str] = set()

    def related(self, object_name: str, relationship: str, record: dict[str, Any]) -> dict[str, Any] | None:
        """The live record ``record``'s lookup behind ``relationship`` names (``None``: empty or gone).

        Raises:
            FlowExecutionError: no such lookup in the metadata view (``flow_relationship_unknown``).
        """
        from nexusflow.records.metadata import current_view
        from nexusflow.records.models import Record

        field, target = relationship_field(current_view(), object_name, relationship)
        self.objects_read.add(target)
        key = record.get(field)
        if not key:
            return None
        fields = (Record.objects.filter(org_id=self.org_id, object_name=target, record_key=key, is_deleted=False)
                  .values_list("fields", flat=True).first())
        return None if fields is None else {"Id": key, "__object": target, **(fields or {})}

    #: Rows read per page of a filtered scan.
    PAGE = 500

    def query(self, object_name: str, predicate, *, limit: int) -> list[dict[str, Any]]:
        """The first ``limit`` live records of ``object_name`` (record key order) that ``predicate`` keeps.

        Every live record is considered: the scan reads pages of :attr:`PAGE` rows in key order until it
        has ``limit`` matches or the object has no more rows (a match past any fixed window is never
        missed; the caller's fan-out bound is ``limit``).
        """
        from nexusflow.records.models import Record

        out: list[dict[str, Any]] = []
        self.objects_read.add(object_name)
        rows = Record.objects.filter(org_id=self.org_id, object_name=object_name, is_deleted=False)
        after = None
        while True:
            page = list((rows if after is None else rows.filter(record_key__gt=after))
                        .order_by("record_key").values_list("record_key", "fields")[: self.PAGE])
            for key, fields in page:
                rec = {"Id": key, "__object": object_name, **(fields or {})}
                if predicate(rec):
                    out.append(rec)
                    if len(out) >= limit:
                        return out
            if len(page) < self.PAGE:
                return out
            after = page[-1][0]


def _graph_of(plan: FlowExecutionPlan, step_def: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """The element graph of a step: the atomic graph, or one durable element whose edges name step keys."""
    if "graph" in step_def:
        return step_def["graph"], step_def.get("entry_element")
    node = {k: v for k, v in step_def.items() if k not in ("key", "kind", "next", "rules", "default_next")}
    node["type"] = step_def.get("type")
    if step_def.get("type") == "decisions":
        node["rules"] = step_def["rules"]
        node["edges"] = ([{"kind": f"rule:{r['name']}", "to": r["next"]} for r in step_def["rules"]]
                         + [{"kind": "default", "to": step_def["default_next"]}])
    else:
        node["edges"] = [{"kind": k, "to": v} for k, v in (step_def.get("next") or {}).items()]
    return [node], step_def.get("element")


def _interpret(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any], now: dt.datetime,
               reader) -> tuple[Outcome, str]:
    snapshot, state = _step_inputs(claim)
    record = {"Id": snapshot["record_key"], **snapshot["fields"]}
    prior = snapshot.get("prior_fields")
    graph, entry = _graph_of(plan, step_def)
    outcome = run_graph(plan_payload=plan.plan_payload, graph=graph, entry=entry, record=record,
                        object_name=snapshot["object"], now=now, reader=reader, state=state,
                        prior=None if prior is None else {"Id": snapshot["record_key"], **prior},
                        is_new=snapshot.get("record_version") == 1,
                        fan_out_limit=runtime_policy(claim.org_id).max_fan_out,
                        interview_start=claim.interview_start, subflows=_inline_subflows(claim, graph))
    if "graph" in step_def:
        next_key = step_def.get("next")
    else:
        next_key = outcome.next_step
        if next_key is None and step_def.get("type") != "decisions":
            next_key = (step_def.get("next") or {}).get("success")
    return outcome, next_key or "end"


def _inline_subflows(claim: StepClaim, graph: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The deployed plans of the subflows ``graph`` runs inline, by plan digest (none: no read)."""
    if not any(node.get("type") == "subflows" for node in graph):
        return {}
    return flow_subflow_payloads(org_id=claim.org_id, payload={"steps": [{"graph": graph}]})


def _lock_business(claim: StepClaim, extra: tuple[tuple[str, str], ...] = ()) -> dict[tuple[str, str], Any]:
    """Lock the attempt's declared records in canonical key order (business class, before the Flow root)."""
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock

    locked: dict[tuple[str, str], Any] = {}
    org = OrgScope(claim.org_id)
    for obj, key in sorted(set(claim.lock_plan) | set(extra), key=lambda r: (r[0].encode(), r[1].encode())):
        try:
            locked[(obj, key)] = record_lock(org=org, object_name=obj, record_key=key)
        except Record.DoesNotExist:
            locked[(obj, key)] = None
        if len(locked) == 1 and len(claim.lock_plan) > 1:
            failpoints.hit(FP_FIRST_BUSINESS_LOCK)  # one row of a multi-row plan held (lock-order tests pause here)
    return locked


def _reserve_history(claim: StepClaim, outcome: Outcome, locked: dict[tuple[str, str], Any]) -> None:
    """Reserve the history sequences of the locked records this step writes, before the Flow root (seed 004
    section 13.1 step 3: history after business rows, before Flow lifecycle rows)."""
    from nexusflow.records.services import record_history_reserve

    org = OrgScope(claim.org_id)
    for write in outcome.writes:
        record = locked.get((write.object_name, write.record_key)) if write.op in ("update", "delete") else None
        if record is not None:
            record_history_reserve(org=org, object_name=write.object_name, record_key=write.record_key,
                                   changes=write.values if write.op == "update" else None, fields=record.fields)


def before_lifecycle_locks(claim: StepClaim) -> None:
    """Seam between the business locks and the Flow root lock of a mutation step (tests pause here)."""
    failpoints.hit(FP_AFTER_BUSINESS_LOCKS)


def _apply_writes(claim: StepClaim, run: FlowRun, outcome: Outcome,
                  locked: dict[tuple[str, str], Any]) -> list[dict[str, Any]]:
    """Apply the graph's record writes to the already-locked rows (seed 004 section 12.2 step 11).

    The saves these writes make are recursive saves caused by ``run``: the
    runs they admit carry ``triggered_by_run=run`` and ``run.save_depth + 1``.

    Raises:
        FlowExecutionError: a write does not fit the metadata (definite).
    """
    from nexusflow.records.metadata import InvalidFieldValue, UnknownField, UnknownObject
    from nexusflow.records.services import record_create, record_delete, record_update

    org = OrgScope(claim.org_id)
    done = []
    token = _SAVE_ORIGIN.set(_SaveOrigin(run_id=int(run.pk), save_depth=run.save_depth))
    try:
        for write in outcome.writes:
            if write.op == "update":
                record = locked[(write.object_name, write.record_key)]
                change = record_update(org=org, record=record, changes=write.values)
                done.append({"op": "update", "object": write.object_name, "record_key": write.record_key,
                             "changed": sorted(change.changed_fields)})
            elif write.op == "delete":
                record = locked[(write.object_name, write.record_key)]
                if record is not None:  # already gone: nothing to delete (recorded as such)
                    record_delete(org=org, record=record)
                done.append({"op": "delete", "object": write.object_name, "record_key": write.record_key,
                             "deleted": record is not None})
            else:
                created = record_create(org=org, object_name=write.object_name, values=write.values)
                done.append({"op": "create", "object": write.object_name, "record_key": created.record_key})
    except (UnknownObject, UnknownField, InvalidFieldValue) as exc:
        raise FlowExecutionError(f"record write refused: {exc.code}", code="flow_record_write_refused") from exc
    finally:
        _SAVE_ORIGIN.reset(token)
    return done


def _execution_principal(claim: StepClaim) -> str:
    """The identity the claimed run's steps act as (``execution_principal``; the system identity if unset)."""
    principal = (FlowRun.objects.filter(org_id=claim.org_id, pk=claim.run_id)
                 .values_list("execution_principal", flat=True).first())
    return principal or system_identity()


def _exec_graph(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """Run a compute, read or bounded-mutation step (durable element or Bounded Atomic graph).

    Seed 004 sections 9.2 and 12.2: lock the admitted business records in
    canonical order, interpret the element graph with current reads, refuse a
    write outside the admitted plan (late discovery rolls the whole step back,
    section 13.3), then lock root -> step -> attempt, apply the writes and
    commit them with audit, checkpoint and the fenced state CAS.
    """
    # Every graph step reads current records (non-locking; a pure step only through a relationship path).
    reader = _CurrentReader(claim.org_id)
    with _step_txn():
        now = db_now()
        locked = _lock_business(claim)
        outcome, next_key = _interpret(claim, plan, step_def, now, reader)
        for write in outcome.writes:
            if write.op in ("update", "delete") and (write.object_name, write.record_key) not in locked:
                raise LateLockDiscovery(f"{write.object_name} record outside the admitted lock plan",
                                        resource=[write.object_name, write.record_key])
            if write.op == "update" and locked[(write.object_name, write.record_key)] is None:
                raise FlowExecutionError("the record to update no longer exists", code="flow_record_missing")
        if outcome.writes or reader.objects_read:  # seed 004 section 17.2: reauthorized under the policy in force
            reauthorize_step(org_id=claim.org_id, principal_id=_execution_principal(claim), writes=outcome.writes,
                             locked=locked, objects_read=reader.objects_read)
        _reserve_history(claim, outcome, locked)
        before_lifecycle_locks(claim)
        run, _step, attempt = _lock_fenced(claim)
        writes = _apply_writes(claim, run, outcome, locked)
        output: dict[str, Any] = {"next": next_key}
        if step_def.get("type") == "decisions":
            output = {"rule": outcome.rule, "next": next_key}
        elif writes or outcome.path:
            output.update(writes=writes, path=outcome.path)
        _commit_step(claim, plan, run, attempt, now, output=output, step_dst=t.STEP_SUCCEEDED,
                     root_dst=t.RUN_RUNNABLE, next_key=next_key, context=outcome.state)
        failpoints.hit(FP_BEFORE_COMMIT)
    return "succeeded"


#: The decision step executor of the walking slice is the generic one now.
_exec_decision = _exec_graph


def _exec_recursion_limited(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """End a run admitted past the recursive-save bound before it runs any element.

    docs/operations.md "Flows that save their own records": a run whose ``save_depth``
    exceeds :data:`policy.RECURSIVE_SAVE_LIMIT` takes no business lock and
    makes no write, so it admits no further run; its step ends ``Failed`` and
    the run ``TerminalFailed`` with ``flow_recursion_limit`` (visible in the
    support read, ``reason_codes`` and the admin).
    """
    with _step_txn():
        run, _step, attempt, now = _lock_fenced(claim, with_clock=True)
        _commit_step(claim, plan, run, attempt, now,
                     output={"failure": reasons.RECURSION_LIMIT, "save_depth": run.save_depth,
                             "limit": policy.RECURSIVE_SAVE_LIMIT,
                             "triggered_by_run": run.triggered_by_run_id},
                     step_dst=t.STEP_FAILED, root_dst=t.RUN_TERMINAL_FAILED, next_key=None,
                     cause=reasons.RECURSION_LIMIT)
        failpoints.hit(FP_BEFORE_COMMIT)
    return "failed"


def _exec_terminal(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    with _step_txn():
        run, _step, attempt, now = _lock_fenced(claim, with_clock=True)
        _commit_step(claim, plan, run, attempt, now, output={"terminal": True}, step_dst=t.STEP_SUCCEEDED,
                     root_dst=t.RUN_SUCCEEDED, next_key=None)
        failpoints.hit(FP_BEFORE_COMMIT)
    return "succeeded"


EXECUTORS: dict[str, Callable[[StepClaim, FlowExecutionPlan, dict[str, Any]], str]] = {
    KIND_PURE_COMPUTE: _exec_graph,
    KIND_CURRENT_READ: _exec_graph,
    KIND_MUTATION: _exec_graph,
    KIND_TERMINAL: _exec_terminal,
    KIND_EFFECT_SUBMIT: _exec_effect_submit,
    KIND_EFFECT_COMPLETION: _exec_effect_completion,
    KIND_DEPENDENCY_WAIT: _exec_dependency_wait,
}


def flow_step_execute(*, claim: StepClaim, started: StepClaim | None = None) -> str:
    """Run one claimed step to its committed outcome (seed 004 section 12.2).

    ``started`` is the claim already moved ``Claimed -> Running`` by :func:`_start_batch` (a batch's
    claims start together); without it the step starts in its own lifecycle-only transaction.

    Outcome classification (seed 004 sections 5.2, 11.3 and 13.4):

    - the step transaction raised and rolled back on a live connection: a
      proven rollback, recorded as ``RolledBack`` with durable backoff
      (``"rolled_back"``), or ``Failed`` once definite or exhausted;
    - the step raised and the connection was lost (rollback unknown), or the
      COMMIT itself failed (commit unknown): resolved under the fence; if the
      commit provably won, ``"committed"``; otherwise the attempt becomes
      ``RollbackUnknown``/``CommitUnknown`` and step and run ``Quarantined``.

    Returns:
        ``"succeeded"``, ``"waiting"``, ``"failed"``, ``"quarantined"``,
        ``"rolled_back"`` or ``"committed"``.

    Raises:
        FenceRejected / StaleVersion: the claim lost its fence (lease
            recovered, root moved or cancelled); nothing from this attempt was
            committed.
    """
    with log_context(org_id=claim.org_id, run_id=int(claim.run_id), step_id=int(claim.step_id),
                     attempt_id=int(claim.attempt_id), plan_id=claim.plan_id or None, trace_id=claim.trace_id or None,
                     unit="flow.step"):
        return _step_execute(claim, started)


def _step_execute(claim: StepClaim, started: StepClaim | None) -> str:
    failpoints.hit(FP_AFTER_CLAIM)
    claim = _start(claim) if started is None else started
    if claim.inputs is None:
        claim = claims_with_inputs([claim])[0]
    plan = flow_plan_of(org_id=claim.org_id, plan_id=claim.plan_id, plan_digest=claim.plan_digest)
    step_def = _step_def(plan, claim.step_key)
    executor = (_exec_recursion_limited if claim.save_depth > policy.RECURSIVE_SAVE_LIMIT
                else EXECUTORS.get(step_def["kind"]))
    try:
        if executor is None or step_def["kind"] != claim.step_kind:
            raise PlanMismatch(f"no executor for step kind {step_def['kind']!r}")
        outcome = executor(claim, plan, step_def)
    except _CommitUnknown as exc:
        log.error("flow step commit outcome unknown: %s", exc, extra={"org_id": claim.org_id, "run_id": claim.run_id})
        return _record_unknown(claim, t.ATTEMPT_COMMIT_UNKNOWN, reasons.COMMIT_UNKNOWN)
    except _RollbackUnknown as exc:
        log.error("flow step rollback outcome unknown: %s", exc, extra={"org_id": claim.org_id, "run_id": claim.run_id})
        return _record_unknown(claim, t.ATTEMPT_ROLLBACK_UNKNOWN, reasons.ROLLBACK_UNKNOWN)
    except StaleVersion:
        raise
    except Exception as exc:  # the step transaction rolled back; record it under the fence
        # An expected outcome (nothing to do) is recorded, not a warning.
        level = logging.INFO if getattr(exc, "expected_outcome", False) else logging.WARNING
        log.log(level, "flow step rolled back: %s", getattr(exc, "code", type(exc).__name__),
                extra={"org_id": claim.org_id, "run_id": claim.run_id, "step": claim.step_key},
                exc_info=not isinstance(exc, NexusError))
        failpoints.hit(FP_AFTER_ROLLBACK)
        _record_rollback(claim, exc)
        return "rolled_back"
    failpoints.hit(FP_AFTER_COMMIT)
    return outcome


def _record_unknown(claim: StepClaim, attempt_dst: str, cause: str) -> str:
    """Resolve an unknown transaction outcome under the fence (seed 004 sections 5.2.6, 9.2, 11.3).

    Locks root -> step -> attempt on a fresh connection. If the attempt is
    ``Committed`` the commit won (returns ``"committed"``). If the fence still
    holds, no commit became visible, yet replay is not proven safe: the
    attempt takes ``attempt_dst`` and step and run are ``Quarantined`` with
    ``cause`` (returns ``"quarantined"``).

    Raises:
        FenceRejected: the fence moved for another reason (recovery, cancel).
    """
    connection.close()
    with transaction.atomic(durable=True):
        now = db_now()
        try:
            _lock_fenced(claim)
        except FenceRejected:
            state = FlowStepAttempt.objects.values_list("state", flat=True).get(org_id=claim.org_id,
                                                                               pk=claim.attempt_id)
            if state == t.ATTEMPT_COMMITTED:
                return "committed"
            raise
        FlowAttemptStore.transition(
            org_id=claim.org_id, pk=claim.attempt_id, src=t.ATTEMPT_STARTED, dst=attempt_dst,
            version=claim.attempt_version, fences=_attempt_fences(claim),
            set_fields={"finished_at": now, "failure_class": "ambiguous", "retry_decision": "quarantined",
                        "safe_error_code": cause},
        )
        FlowStepStore.transition(
            org_id=claim.org_id, pk=claim.step_id, src=t.STEP_RUNNING, dst=t.STEP_QUARANTINED,
            version=claim.step_version, fences=_step_fences(claim),
            set_fields={"failure_class": "ambiguous", "lease_expires_at": None, "updated_at": now,
                        "reason_code": cause},
        )
        FlowRunStore.transition(
            org_id=claim.org_id, pk=claim.run_id, src=t.RUN_RUNNING, dst=t.RUN_QUARANTINED,
            version=claim.root_version,
            fences={"current_step_id": claim.step_id, "is_deleted": False, "delete_requested_at": None},
            set_fields={"reason_code": cause, "completed_at": now, "updated_at": now},
        )
    return "quarantined"


def _record_rollback(claim: StepClaim, exc: BaseException) -> None:
    """Proven rollback: attempt RolledBack, step RetryScheduled (or Failed), root back to Runnable.

    Seed 004 sections 12.2 and 13.3-13.4. A late lock discovery stores the
    discovered resource on the attempt (``metrics_summary``) so the next claim
    admits the expanded plan; a discovery beyond the plan's declared bound or
    resource class fails the step (``flow_lock_plan_exceeded``). Definite
    errors fail at once (``flow_step_execution_error`` for an unrunnable
    graph). The fence check fails if the step transaction did commit, because
    that commit moved root, step and attempt together.
    """
    connection.close_if_unusable_or_obsolete()
    code = str(getattr(exc, "code", type(exc).__name__))[:64]
    try:
        with transaction.atomic(durable=True):
            now = db_now()
            run, _step, _attempt = _lock_fenced(claim)
            definite = bool(getattr(exc, "definite", False))
            metrics: dict[str, Any] = {}
            cause = ""
            if isinstance(exc, LateLockDiscovery):
                metrics = {"discovered": [exc.resource]}
                if not _discovery_admissible(run, claim, exc.resource):
                    definite, cause = True, reasons.LOCK_PLAN_EXCEEDED
            elif isinstance(exc, FlowAccessDenied):  # the run ends with the access decision's own reason code
                cause = reasons.ACCESS_DENIED if exc.code == reasons.ACCESS_DENIED else reasons.PRINCIPAL_DISABLED
            elif isinstance(exc, FlowExecutionError):
                cause = reasons.STEP_EXECUTION_ERROR
            exhausted = definite or claim.attempt_number >= policy.max_attempts(claim.org_id, claim.plan_id)
            FlowAttemptStore.transition(
                org_id=claim.org_id, pk=claim.attempt_id, src=t.ATTEMPT_STARTED, dst=t.ATTEMPT_ROLLED_BACK,
                version=claim.attempt_version, fences=_attempt_fences(claim),
                set_fields={"finished_at": now, "failure_class": "terminal" if exhausted else "retryable",
                            "safe_error_code": code, "retry_decision": "terminal" if exhausted else "scheduled",
                            "metrics_summary": canonical_json.dumps(metrics).decode()},
            )
            root_fences = {"current_step_id": claim.step_id, "is_deleted": False, "delete_requested_at": None}
            if exhausted:
                # The handler's own code stays on the attempt (safe_error_code); the closed reason says why.
                if not cause or not definite:
                    cause = reasons.STEP_DEFINITE_REFUSAL if definite else reasons.STEP_RETRY_EXHAUSTED
                    if definite and getattr(exc, "expected_outcome", False):
                        cause = reasons.STEP_EXPECTED_REFUSAL
                FlowStepStore.transition(
                    org_id=claim.org_id, pk=claim.step_id, src=t.STEP_RUNNING, dst=t.STEP_FAILED,
                    version=claim.step_version, fences=_step_fences(claim),
                    set_fields={"failure_class": "terminal", "lease_expires_at": None, "updated_at": now,
                                "reason_code": cause},
                )
                FlowRunStore.transition(
                    org_id=claim.org_id, pk=claim.run_id, src=t.RUN_RUNNING, dst=t.RUN_TERMINAL_FAILED,
                    version=claim.root_version, fences=root_fences,
                    set_fields={"reason_code": cause, "completed_at": now, "updated_at": now},
                )
                return
            floor = FlowStepAttempt.objects.values_list("recovery_backoff_floor_ms", flat=True).get(
                org_id=claim.org_id, pk=claim.attempt_id)
            run_after = now + dt.timedelta(milliseconds=floor)
            FlowStepStore.transition(
                org_id=claim.org_id, pk=claim.step_id, src=t.STEP_RUNNING, dst=t.STEP_RETRY_SCHEDULED,
                version=claim.step_version, fences=_step_fences(claim),
                set_fields={"run_after": run_after, "failure_class": "retryable", "lease_owner": None,
                            "lease_token_digest": None, "lease_expires_at": None, "updated_at": now},
            )
            FlowRunStore.transition(
                org_id=claim.org_id, pk=claim.run_id, src=t.RUN_RUNNING, dst=t.RUN_RUNNABLE,
                version=claim.root_version, fences=root_fences, set_fields={"run_after": run_after, "updated_at": now},
            )
    except StaleVersion:
        log.info("rollback record lost its fence; recovery or a commit already moved the step",
                 extra={"org_id": claim.org_id, "run_id": claim.run_id})


def _discovery_admissible(run: FlowRun, claim: StepClaim, resource: list[str]) -> bool:
    """May a retry admit ``resource`` (seed 004 section 13.3 step 4)?

    Only within the plan's declared maximum: the object must be one the step's
    graph writes, and the expanded plan must stay within the declared write
    bound (``bound_summary.writes``, else the Bounded Atomic policy bound) plus
    the trigger record.
    """
    plan = run.plan
    step_def = _step_def(plan, claim.step_key)
    graph, _entry = _graph_of(plan, step_def)
    for child in _inline_subflows(claim, graph).values():  # a subflow's writes belong to the calling step
        graph = graph + [n for s in child["steps"] for n in s.get("graph", [])]
    writers = ("recordUpdates", "recordDeletes")
    objects = {n["object"] for n in graph if n.get("type") in writers + ("recordLookups",) and n.get("object")}
    if any(n.get("type") in writers and n.get("input_reference") == "$Record" for n in graph):
        objects.add(run.trigger_object_name)
    # An Update or Delete Records of a record (collection) variable writes records of the variable's declared
    # object; of a Get Records element's result, records of that element's object (wherever it runs).
    declared = (plan.plan_payload.get("checkpoint_schema") or {}).get("variables") or {}
    lookups = {n["element"]: n.get("object") for s in plan.plan_payload["steps"] for n in s.get("graph", [s])
               if n.get("type") == "recordLookups"}
    for n in graph:
        if n.get("type") in writers and n.get("input_reference") not in (None, "$Record"):
            head = n["input_reference"].split(".", 1)[0]
            objects.add((declared.get(head) or {}).get("object") or lookups.get(head))
    objects.discard(None)
    writes = plan.bound_summary.get("writes")
    bound = (writes if isinstance(writes, int) else ATOMIC_MAX_WRITES) + 1
    expanded = set(claim.lock_plan) | {tuple(resource)}
    return resource[0] in objects and len(expanded) <= bound


def flow_try_run_step_one(*, worker_id: str) -> bool:
    """Claim a bounded batch of due steps and execute each. Returns True when a step was claimed.

    Seed 004 sections 12.1-12.2; the worker loop (``run_workers --role flow``) calls this repeatedly. The
    claims are taken in one transaction (:func:`.claim.flow_step_claim_batch`, up to
    :func:`policy.claim_batch`) and started in one lifecycle-only transaction (:func:`_start_batch`); then
    each runs its own step transaction under its own fence, in discovery order. A lost fence is logged, not
    raised. Under database pressure (:func:`nexusflow.kernel.pressure.mutation_admission`, seed 004 section
    16.2) it claims nothing and returns False, so the worker backs off instead of adding load.
    """
    # Database pressure under the runtime policy's bounds: no new mutation work now (the cold lanes never ask).
    bounds = runtime_policy().pressure
    if mutation_admission(bounds) or flow_lease_admission(bounds):
        return False
    claims = claims_with_inputs(flow_step_claim_batch(worker_id=worker_id))
    starts = _start_batch(claims) if len(claims) > 1 else {}
    for claim in claims:
        try:
            started = starts.get(int(claim.step_id))
            if isinstance(started, FenceRejected):
                raise started
            flow_step_execute(claim=claim, started=started)
        except StaleVersion as exc:
            log.warning("flow step fenced: %s", exc, extra={"org_id": claim.org_id, "run_id": claim.run_id})
    return bool(claims)


#: Seconds an idle ``flow.step`` unit listens for a wake hint before it reports no work
#: (``NEXUS_FLOW_WAKE_WAIT_SECONDS``, 0 to 1, default 0.25).
WAKE_WAIT_SECONDS = 0.25


def wake_wait_seconds() -> float:
    """How long an idle ``flow.step`` unit listens for a wake hint (``NEXUS_FLOW_WAKE_WAIT_SECONDS``, 0 to 1)."""
    return max(0.0, min(1.0, float(setting_number("NEXUS_FLOW_WAKE_WAIT_SECONDS", WAKE_WAIT_SECONDS))))


def flow_try_run_step_or_wait_one(*, worker_id: str, seconds: float | None = None) -> bool:
    """Run a batch of due steps (:func:`flow_try_run_step_one`); with none due, listen for a wake hint.

    The ``flow.step`` unit of ``run_workers --role flow``. When nothing is due it waits up to ``seconds``
    (default :func:`wake_wait_seconds`) on this process's wake hint socket (:mod:`..wakeups`): a committed
    start, resumed wait or accepted wake signal is then claimed at once instead of at the worker's next
    poll after its idle sleep. A hint is only a reason to look again: the work is discovered and claimed
    through the rows, under their fences (seed 004 sections 12.1 and 14.2); a ``SIGNAL`` hint first runs
    :func:`.waits.flow_try_wake_one`.

    Returns:
        True when a step was claimed or a wake resolved; False when nothing came within ``seconds``.

    Raises:
        InvalidIdentity: a bad ``worker_id`` (before SQL).
    """
    seconds = wake_wait_seconds() if seconds is None else seconds
    hints = wakeups.listener() if seconds > 0 else None
    # Hints that came while this worker was busy: a wake signal is resolved now, not when flow.wake's turn
    # comes round again.
    woke = hints is not None and _wake_on(hints.drain())
    if flow_try_run_step_one(worker_id=worker_id) or woke:
        return True
    if hints is None:
        return False
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        kinds = hints.wait(left)
        if not kinds:
            return False
        woke = _wake_on(kinds)
        if flow_try_run_step_one(worker_id=worker_id) or woke:
            return True
    return False


def _wake_on(kinds: frozenset[bytes]) -> bool:
    """Resolve accepted wake signals (up to :data:`policy.CLAIM_BATCH`) when ``kinds`` holds a signal hint."""
    if wakeups.SIGNAL not in kinds:
        return False
    woke = False
    for _ in range(policy.CLAIM_BATCH):
        if not flow_try_wake_one():
            break
        woke = True
    return woke


def flow_run_drive(*, org: OrgScope, run_id: FlowRun.Id | int, worker_id: str, max_steps: int = 100) -> str:
    """Claim and execute the due steps of one run in this process until it stops; return its state.

    The operator's ``flows run``: each step goes through the normal claim
    (seed 004 section 12.1) and execute protocol; a step not yet due, a
    wait, a terminal state or ``max_steps`` ends the loop.

    Raises:
        InvalidIdentity: bad ``run_id`` or ``worker_id`` (before SQL).
        FlowRunNotFound: no visible run ``run_id`` in ``org``.
        ValueError: ``max_steps`` below 1.
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    validate_key(worker_id, field="worker_id", max_length=128)
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    for _ in range(max_steps):
        run = first_row(FlowRun, org_id=org.org_id, pk=run_id, is_deleted=False)
        if run is None:
            raise FlowRunNotFound(f"no flow run {int(run_id)} in this org")
        if run.state != t.RUN_RUNNABLE or run.current_step_id is None:
            return run.state
        claim = _claim(org_id=org.org_id, run_id=run.pk, step_id=run.current_step_id, worker_id=worker_id)
        if claim is None:
            break
        try:
            flow_step_execute(claim=claim)
        except StaleVersion as exc:
            log.warning("flow step fenced: %s", exc, extra={"org_id": org.org_id, "run_id": int(run_id)})
    return FlowRun.objects.values_list("state", flat=True).get(org_id=org.org_id, pk=run_id)
