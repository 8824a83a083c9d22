"""Subflow calls of a Durable Orchestration plan: a child FlowRun and a wait on its end (seed 004 sections
10.5, 14.1-14.2; docs/operations.md "Subflows").

A Bounded Atomic or Embedded graph runs a subflow inline, in its own
transaction (:meth:`nexusflow.flows.interpreter._Run._el_subflows`). A durable
plan's subflow element is a ``DependencyWait`` step of type ``subflows``:

1. First visit (:func:`_exec_subflow`, one step transaction): evaluate the
   element's input assignments in the calling run's state, admit the child
   FlowRun of the plan the element was compiled against (by plan digest, among
   the org's deployed plans; ``parent_run`` set, run key ``subflow:<step id>``
   so a step invocation starts at most one child), and commit a
   ``subflow`` dependency keyed ``subflow:<child run id>`` with the step and
   root ``Waiting``. The child's rows commit with the wait, or neither does.
2. The child runs like any run. The transaction that moves it into a terminal
   state writes the parent's ``FlowWakeSignal`` (:func:`subflow_run_ended`,
   called by :class:`..store.FlowRunStore`; it locks no parent row) and
   matches it right after commit; the ``flow.wake`` sweep repeats the match
   after a crash.
3. Resumed, the step reads the child's end: ``Succeeded`` copies its output
   variables into the calling run (``outputAssignments``, or the element's
   own ``<Element>.<variable>`` with ``storeOutputAutomatically``) and takes
   the element's connector; any other end fails the step and the run with
   ``flow_subflow_failed`` (the child keeps its own reason code).

Cancelling the parent cancels its live children first (``subflow_children_cancel``,
called by the cancel cleanup in :mod:`.lifecycle`), so no child outlives a cancelled caller.
"""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import IntegrityError, transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.scope import OrgScope

from .. import policy, reasons
from .. import transitions as t
from ..errors import FlowExecutionError, PlanMismatch
from ..models import FlowCheckpoint, FlowExecutionPlan, FlowRun
from ..producers import PRODUCER_SUBFLOW
from ..step_values import subflow_call_inputs, subflow_call_outputs
from ..store import PARENT_UNREAD, FlowRunStore, wake_signal_insert
from .admission import EXECUTION_OWNER, START_OBJECT, START_RECORD_VERSION, _admit_first_step, _step_def
from .claim import StepClaim
from .expiry import EXPIRY_TERMINAL
from .step_txn import FP_BEFORE_COMMIT, _commit_step, _lock_fenced, _step_inputs, _step_txn
from .waits import _enter_waiting, _step_dependency, _wait_create, flow_wake_reconcile

log = logging.getLogger("nexusflow.flows")

FP_SUBFLOW_STARTED = failpoints.declare("flow.subflow.child_started")
FP_SUBFLOW_SIGNALLED = failpoints.declare("flow.subflow.parent_signalled")

#: ``FlowDependency.condition["kind"]`` of a subflow wait.
CONDITION_SUBFLOW = "subflow"


def subflow_dependency_key(child_run_id: int) -> str:
    """The dependency (and wake) key of a wait on child run ``child_run_id``."""
    return f"subflow:{int(child_run_id)}"


def _final_vars(org_id: str, run_id: int) -> dict[str, Any]:
    """The variables of a finished run's last checkpoint that carries an interpreter context."""
    for payload in (FlowCheckpoint.objects.filter(org_id=org_id, run_id=run_id).order_by("-sequence")
                    .values_list("context_payload", flat=True)):
        if "context" in payload:
            return payload["context"].get("vars") or {}
    return {}


def _child_admit(*, org_id: str, parent: FlowRun, step_id: int, plan: FlowExecutionPlan, inputs: dict[str, Any],
                 now: dt.datetime) -> FlowRun:
    """Insert the child run of a subflow step with its first checkpoint and step, ``Runnable`` (caller's txn)."""
    entry = _step_def(plan, plan.plan_payload["entry_step"])
    child = FlowRunStore.create(
        org_id=org_id, app_installation_id=plan.app_installation_id,
        runtime_capability_id=plan.runtime_capability_id, binding_digest=plan.runtime_work_binding_digest,
        plan=plan, plan_digest=plan.plan_digest, execution_profile=plan.execution_profile,
        execution_owner=EXECUTION_OWNER, state=t.RUN_ACCEPTED, trigger_object_name=START_OBJECT,
        record_key=f"subflow:{int(step_id)}", record_version=START_RECORD_VERSION, parent_run=parent,
        triggered_by_run_id=parent.triggered_by_run_id, save_depth=parent.save_depth,
        created_at=now, updated_at=now, principal_mode=parent.principal_mode,
        execution_principal=parent.execution_principal, initiating_principal=parent.initiating_principal,
        authorization_digest=parent.authorization_digest,
    )
    snapshot = {
        "record": {"object": None, "record_key": None, "record_version": START_RECORD_VERSION, "fields": {}},
        "cursor": entry["key"],
        "start": {"request": "subflow", "parent_run": int(parent.pk), "parent_step": int(step_id)},
        "context": {"vars": inputs},
    }
    _admit_first_step(org=OrgScope(org_id), run=child, entry=entry, snapshot=snapshot, now=now)
    return child


def _exec_subflow(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """Execute a durable subflow step (module docstring). Returns ``"waiting"``, ``"succeeded"`` or ``"failed"``.

    Raises:
        FlowExecutionError: the child plan is not deployed (``flow_subflow_missing``), or an input or output
            assignment does not fit the child's variables (definite: the step fails).
        PlanMismatch: the step's dependency is in a state no claim should see.
    """
    snapshot, context = _step_inputs(claim)
    record = {"Id": snapshot.get("record_key"), **(snapshot.get("fields") or {})}
    prior = snapshot.get("prior_fields")
    with _step_txn():
        now = db_now()
        run, step, attempt = _lock_fenced(claim)
        evaluation = dict(plan_payload=plan.plan_payload, node=step_def, record=record,
                          object_name=snapshot.get("object") or "", now=now,
                          interview_start=run.started_at or run.created_at, state=context)
        dependency = _step_dependency(claim, run)
        if dependency is None:
            child_plan = FlowExecutionPlan.objects.filter(
                org_id=claim.org_id, plan_digest=step_def.get("subflow_plan_digest")).first()
            if child_plan is None:
                raise FlowExecutionError(f"{step_def.get('element')}: the plan of subflow {step_def.get('flow')} "
                                         "is not deployed", code="flow_subflow_missing")
            inputs = subflow_call_inputs(**evaluation, child_payload=child_plan.plan_payload,
                                         prior=None if prior is None else {"Id": record["Id"], **prior},
                                         is_new=snapshot.get("record_version") == 1)
            child = _child_admit(org_id=claim.org_id, parent=run, step_id=claim.step_id, plan=child_plan,
                                 inputs=inputs, now=now)
            _wait_create(claim, run, step, producer_kind=PRODUCER_SUBFLOW, key=subflow_dependency_key(child.pk),
                         condition={"kind": CONDITION_SUBFLOW, "flow": step_def.get("flow"),
                                    "plan_digest": child_plan.plan_digest, "child_run": int(child.pk)},
                         expiry_policy=EXPIRY_TERMINAL,
                         deadline=now + dt.timedelta(seconds=policy.max_wait_age_seconds()), now=now)
            failpoints.hit(FP_SUBFLOW_STARTED)
            return "waiting"
        if dependency.state == t.DEP_WAITING:
            _enter_waiting(claim, now)  # a re-claimed waiting step waits again on the same child
            failpoints.hit(FP_BEFORE_COMMIT)
            return "waiting"
        if dependency.state != t.DEP_SATISFIED or dependency.producer_kind != PRODUCER_SUBFLOW:
            raise PlanMismatch(f"subflow dependency {dependency.pk} is {dependency.state}")
        child_id = dependency.condition["child_run"]
        child = FlowRun.objects.only("state", "reason_code", "plan_digest").get(
            org_id=claim.org_id, pk=child_id, parent_run_id=run.pk)
        ended = {"subflow": step_def.get("flow"), "child_run": int(child_id), "child_state": child.state}
        if child.state != t.RUN_SUCCEEDED:
            _commit_step(claim, plan, run, attempt, now, output={**ended, "child_reason": child.reason_code},
                         step_dst=t.STEP_FAILED, root_dst=t.RUN_TERMINAL_FAILED, next_key=None,
                         cause=reasons.SUBFLOW_FAILED)
            failpoints.hit(FP_BEFORE_COMMIT)
            return "failed"
        child_payload = FlowExecutionPlan.objects.values_list("plan_payload", flat=True).get(
            org_id=claim.org_id, plan_digest=child.plan_digest)
        state = subflow_call_outputs(**evaluation, child_payload=child_payload,
                                     values=_final_vars(claim.org_id, child_id))
        _commit_step(claim, plan, run, attempt, now, output=ended, step_dst=t.STEP_SUCCEEDED,
                     root_dst=t.RUN_RUNNABLE, next_key=(step_def.get("next") or {}).get("success") or "end",
                     context=state)
        failpoints.hit(FP_BEFORE_COMMIT)
        return "succeeded"


def subflow_run_ended(*, org_id: str, run_id: int, state: str, parent_run_id=PARENT_UNREAD) -> None:
    """:class:`..store.FlowRunStore` hook, in the transaction that ends run ``run_id``: when it is a subflow's
    child, accept the parent's wake (producer ``subflow``; no parent row is locked) and match it after commit.

    ``parent_run_id`` is the ending run's parent as the caller's locked root holds it (``None``: none), or
    :data:`..store.PARENT_UNREAD`: read it here."""
    parent_id = parent_run_id if parent_run_id is not PARENT_UNREAD else (
        FlowRun.objects.filter(org_id=org_id, pk=run_id).values_list("parent_run_id", flat=True).first())
    if parent_id is None:
        return
    scope = FlowRun.objects.values("app_installation_id", "runtime_capability_id", "binding_digest").get(
        org_id=org_id, pk=parent_id)
    key = subflow_dependency_key(run_id)
    try:
        with transaction.atomic():
            wake_signal_insert(
                org_id=org_id, **scope, flow_run_id=parent_id, producer_kind=PRODUCER_SUBFLOW, dependency_key=key,
                wake_version=0, receipt_id=None, state=t.SIGNAL_UNMATCHED, received_at=db_now(),
                evidence_digest=digest_v2("flows.wake-evidence", [
                    ("producer_kind", PRODUCER_SUBFLOW), ("dependency_key", key), ("child_state", state),
                ]).hexdigest,
            )
    except IntegrityError:  # already accepted (a run ends once; a replayed hook finds its own signal)
        return

    def match() -> None:
        failpoints.hit(FP_SUBFLOW_SIGNALLED)  # the child's end committed its signal; a crash leaves it to the sweep
        flow_wake_reconcile(org_id=org_id, run_id=parent_id, dependency_key=key)

    transaction.on_commit(match, robust=True)
