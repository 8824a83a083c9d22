"""Effect steps: hand one external effect to its owner and complete on its receipt (seed 004 sections 7.5 and 15).

``EffectSubmit`` (:func:`_exec_effect_submit`) re-verifies the plan's pinned
handler binding, takes the record owner fence, and in one transaction
(section 15.1) authors the one ``OutboundCommand`` with its canonical
``flow.effect.submit`` outbox message, writes the effect link and the
checkpoint, commits its attempt and step, and inserts the bound
``EffectCompletion`` step ``Waiting`` on its ``runtime.intent_result``
dependency with the root ``Waiting`` on it. When the receipt's wake resolves
the dependency, ``EffectCompletion`` (:func:`_exec_effect_completion`)
continues, fails or quarantines on the receipt's outcome; it has no path that
authors another intent.
"""
from __future__ import annotations

import functools
from typing import Any

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.scope import OrgScope

from .. import reasons
from .. import transitions as t
from ..binding import scope_of
from ..handlers import binary_supports
from ..models import FlowEffectLink, FlowExecutionPlan, FlowRun, FlowWakeSignal
from ..producers import PRODUCER_RUNTIME_INTENT
from ..selectors import flow_plan_of
from ..step_values import action_call_inputs
from ..store import FlowDependencyStore, FlowWakeSignalStore, effect_link_insert
from .claim import StepClaim
from .deploy import _persisted_snapshot
from .step_txn import FP_BEFORE_COMMIT, _commit_step, _input_state, _lock_fenced, _step_inputs, _step_txn
from .waits import _wait, completion_dependency_create, flow_wake_reconcile

FP_WAIT_COMMITTED = failpoints.declare("flow.effect.wait_committed")

EFFECT_OWNER_KIND = "runtime.outbound_command"
EFFECT_GENERATION_ID = "1"
#: The catalog ``effect_owner`` of platform deliveries (``emailSimple``, ``customNotificationAction``).
DELIVERY_EFFECT_OWNER = "runtime_delivery"
SUCCESS_OUTCOMES = frozenset({"remote_confirmed", "finalized", "superseded"})


def effect_root_id_for(*, org_id: str, plan_id: str, run_id: FlowRun.Id | int) -> str:
    """The deterministic effect root of one run's effects (v2 digest over org, plan, run).

    Raises:
        InvalidIdentity: ``run_id`` is not a FlowRun id (or a positive int).
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    return digest_v2("flows.effect-root", [("org_id", org_id), ("plan_id", plan_id), ("flow_run_id", run_id)]).hexdigest


@functools.lru_cache(maxsize=256)
def _verified_snapshot(org_id: str, plan_id: int, plan_digest: str):
    """The sealed read view of the plan's own catalog generation, verified once per process (a plan and the
    generation it pins by digest never change; a view that fails verification raises and is not kept)."""
    return _persisted_snapshot(flow_plan_of(org_id=org_id, plan_id=plan_id, plan_digest=plan_digest))


def _handler_binding_matches(plan: FlowExecutionPlan, step_def: dict[str, Any]) -> bool:
    """Does the persisted generation and this binary's handler equal what the plan pinned? (section 8.4).

    Rebuilds the sealed read view from the plan's own ``FlowActionCatalogGeneration``
    (scope and digest verified), never from the shipped catalog or another registry; once per plan and
    process (:func:`_verified_snapshot`).
    """
    try:
        snapshot = _verified_snapshot(plan.org_id, int(plan.pk), plan.plan_digest)
    except NexusError:
        return False
    entry = snapshot.entries.get(step_def["action_key"])
    return (entry is not None and entry.entry_digest == step_def["entry_digest"]
            and entry.binding_fingerprint == step_def["binding_fingerprint"] and binary_supports(entry))


def _exec_effect_submit(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock_owner
    from runtime_outbox.owner import OwnerDeleted
    from runtime_outbox.services import outbound_command_author

    if not _handler_binding_matches(plan, step_def):
        # Fail closed before any business lock or mutation; never dispatch through another handler.
        with _step_txn():
            run, _step, attempt, now = _lock_fenced(claim, with_clock=True)
            _commit_step(claim, plan, run, attempt, now, output={"failure": reasons.HANDLER_BINDING_MISMATCH},
                         step_dst=t.STEP_QUARANTINED, root_dst=t.RUN_QUARANTINED, next_key=None,
                         cause=reasons.HANDLER_BINDING_MISMATCH)
            failpoints.hit(FP_BEFORE_COMMIT)
        return "quarantined"
    if step_def.get("effect_owner") == DELIVERY_EFFECT_OWNER:
        return _exec_delivery_submit(claim, plan, step_def)
    if claim.trigger is not None:  # read with the root at the claim (fixed at insert)
        trigger_object_name, record_key = claim.trigger
    else:
        identity = FlowRun.objects.only("org_id", "trigger_object_name", "record_key").get(
            org_id=claim.org_id, pk=claim.run_id)
        trigger_object_name, record_key = identity.trigger_object_name, identity.record_key
    context = _input_state(claim)  # the variables the steps after the effect read
    effect_root_id = effect_root_id_for(org_id=claim.org_id, plan_id=plan.plan_id, run_id=claim.run_id)
    with _step_txn():
        now = db_now()
        try:
            # Business lock first (section 13.1), before the Flow root: the record owner fence (seed 000),
            # taken on the row live or deleted so that a committed deletion is seen, not a missing row.
            record = record_lock_owner(org=OrgScope(claim.org_id), object_name=trigger_object_name,
                                       record_key=record_key)
        except Record.DoesNotExist:
            record = None
        run, _step, attempt = _lock_fenced(claim)
        scope = scope_of(run)
        command = refusal = None
        if record is not None:
            try:
                command = outbound_command_author(
                    scope=scope, effect_root_id=effect_root_id, effect_slot_id=step_def["key"],
                    effect_generation_id=EFFECT_GENERATION_ID, contract_key=step_def["inputs"]["contract"],
                    record=record, origin_flow_run_id=run.pk, origin_dependency_key=None,
                    origin={"flow_developer_name": plan.flow_api_name, "flow_action_name": step_def["key"],
                            "flow_version_id": plan.flow_version},
                )
            except OwnerDeleted as exc:
                # Definite refusal (seed 000): the step ends failed instead of retrying forever.
                refusal = exc.code
        if command is None:
            output = {"failure": reasons.TRIGGER_RECORD_DELETED}
            if refusal is not None:
                output["refusal"] = refusal
            _commit_step(claim, plan, run, attempt, now, output=output,
                         step_dst=t.STEP_FAILED, root_dst=t.RUN_TERMINAL_FAILED, next_key=None,
                         cause=reasons.TRIGGER_RECORD_DELETED)
            failpoints.hit(FP_BEFORE_COMMIT)
            return "failed"
        _submitted(claim, plan, step_def, run, attempt, now, command, context)
    return "waiting"


def _submitted(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any], run: FlowRun, attempt,
               now, command, context: dict[str, Any]) -> None:
    """The rest of a submit's transaction once its intent exists: the effect link, the step's commit and the
    completion step ``Waiting`` on the intent's ``runtime.intent_result`` dependency (section 15.1)."""
    scope = scope_of(run)
    effect_link_insert(
        org_id=scope.org_id, app_installation_id=scope.app_installation_id,
        runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest, run=run,
        step_id=claim.step_id, effect_owner_kind=EFFECT_OWNER_KIND, outbound_command_id=command.pk,
        effect_handoff_key=command.idempotency_key, submission_attempt=attempt, created_at=now,
    )
    dependency_key = str(command.pk)
    completion = _commit_step(
        claim, plan, run, attempt, now,
        output={"outbound_command_id": command.pk, "effect_handoff_key": command.idempotency_key,
                "dependency_key": dependency_key},
        step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_WAITING, next_key=step_def["next"], context=context,
        next_state=t.STEP_WAITING,
    )
    completion_dependency_create(run=run, step_id=completion, dependency_key=dependency_key, scope=scope,
                                 now=now)
    failpoints.hit(FP_BEFORE_COMMIT)


def _exec_delivery_submit(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """Submit a platform delivery effect (``emailSimple``, ``customNotificationAction``): the action's inputs
    are evaluated in the run's state; the message record (a business row) is inserted first
    (:func:`runtime_outbox.delivery.delivery_message_create`), then the Flow root is locked, the one intent
    authored (:func:`runtime_outbox.delivery.delivery_intent_author`, which locks the serving gate) and the
    submit commits like any other (:func:`_submitted`). A definite refusal of the inputs or of the
    delivering contract raises out of the transaction, which writes nothing; the step fails on it.
    """
    from runtime_outbox.delivery import delivery_intent_author, delivery_intent_existing, delivery_message_create

    snapshot, context = _step_inputs(claim)
    scope = scope_of(FlowRun.objects.only("org_id", "app_installation_id", "runtime_capability_id",
                                          "binding_digest").get(org_id=claim.org_id, pk=claim.run_id))
    record = {"Id": snapshot.get("record_key"), **(snapshot.get("fields") or {})}
    effect = dict(effect_root_id=effect_root_id_for(org_id=claim.org_id, plan_id=plan.plan_id, run_id=claim.run_id),
                  effect_slot_id=step_def["key"], effect_generation_id=EFFECT_GENERATION_ID)
    with _step_txn():
        now = db_now()
        command = delivery_intent_existing(scope=scope, **effect)
        message = None
        if command is None:  # business row first (section 13.1): the message record, then the Flow root
            inputs = action_call_inputs(plan_payload=plan.plan_payload, inputs=step_def.get("inputs") or {},
                                        record=record, object_name=snapshot.get("object") or "", now=now,
                                        interview_start=claim.interview_start, state=context)
            message = delivery_message_create(scope=scope, family=step_def["effect_family"], inputs=inputs)
        run, _step, attempt = _lock_fenced(claim)
        if message is not None:
            command = delivery_intent_author(
                scope=scope, message=message, origin_flow_run_id=run.pk, **effect,
                origin={"flow_developer_name": plan.flow_api_name, "flow_action_name": step_def["key"],
                        "flow_version_id": plan.flow_version})
        _submitted(claim, plan, step_def, run, attempt, now, command, context)
    return "waiting"


def no_effect_route(step_def: dict[str, Any]) -> str | None:
    """The step an EffectCompletion continues to when its effect proved not to happen (the element's fault
    connector, compiled as ``on_no_effect``), or None: the run ends ``TerminalFailed``."""
    route = step_def.get("on_no_effect")
    return None if route in (None, "terminal_failure") else route


def _exec_effect_completion(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """Continue on the intent's receipt, or wait for it; right after a wait commits, match a signal afresh.

    The submit commits this step already ``Waiting`` on its dependency
    (section 15.1), so a claim normally finds the dependency satisfied. A run
    whose submit committed under an earlier release, without the dependency,
    waits here instead; section 14.2 step 4 then applies: the receipt's
    signal may have committed after this step's in-transaction read and
    before its dependency committed, so a fresh-snapshot match runs right
    after the commit (the periodic ``flow.wake`` sweep remains for a crash in
    between).
    """
    result = _complete_or_wait(claim, plan, step_def)
    if result == "waiting":
        link = FlowEffectLink.objects.get(org_id=claim.org_id, run_id=claim.run_id,
                                          step__plan_step_key=step_def["submit_step"])
        failpoints.hit(FP_WAIT_COMMITTED)
        flow_wake_reconcile(org_id=claim.org_id, run_id=claim.run_id, dependency_key=str(link.outbound_command_id))
    return result


def _complete_or_wait(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    from runtime_outbox.selectors import intent_result_receipt_for

    with _step_txn():
        run, step, attempt, now = _lock_fenced(claim, with_clock=True)
        scope = scope_of(run)
        scope_filter = dict(org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                            runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest)
        # The step's one dependency (unique per work scope and step), locked by that key in one read.
        dependency = next(iter(FlowDependencyStore.lock_all(
            claim.org_id, step_id=claim.step_id, **{k: v for k, v in scope_filter.items() if k != "org_id"})), None)
        receipt_id = dependency.resolution_receipt_id if (
            dependency is not None and dependency.state == t.DEP_SATISFIED) else None
        if (receipt_id is not None and dependency.producer_kind == PRODUCER_RUNTIME_INTENT
                and dependency.dependency_key.isdigit()):
            # The submit keyed the dependency by its intent (``str(command.pk)``, section 15.1); the receipt
            # read below must be the one that resolved it, or the step quarantines.
            command_id = int(dependency.dependency_key)
        else:  # the submit's immutable effect link names the intent
            command_id = FlowEffectLink.objects.values_list("outbound_command_id", flat=True).get(
                org_id=claim.org_id, run_id=claim.run_id, step__plan_step_key=step_def["submit_step"])
        dependency_key = str(command_id)
        if receipt_id is None:
            # Checked while holding the root: a wake arriving later finds the dependency.
            signal = FlowWakeSignal.objects.filter(flow_run_id=run.pk, dependency_key=dependency_key,
                                                   **scope_filter).first()
            if signal is not None:
                signal = FlowWakeSignalStore.lock(claim.org_id, signal.pk)
                if dependency is not None and dependency.state == t.DEP_WAITING:
                    FlowDependencyStore.transition(
                        org_id=claim.org_id, pk=dependency.pk, src=t.DEP_WAITING, dst=t.DEP_SATISFIED,
                        version=dependency.version,
                        set_fields={"resolved_at": now, "resolution_receipt_id": signal.receipt_id},
                    )
                if signal.state == t.SIGNAL_UNMATCHED:
                    FlowWakeSignalStore.transition(
                        org_id=claim.org_id, pk=signal.pk, src=t.SIGNAL_UNMATCHED, dst=t.SIGNAL_CONSUMED,
                        version=signal.version,
                        set_fields={"consumed_at": now, "dependency_id": dependency.pk if dependency else None},
                    )
                receipt_id = signal.receipt_id
        if receipt_id is None:
            _wait(claim, run, step, now, dependency, dependency_key, scope)
            failpoints.hit(FP_BEFORE_COMMIT)
            return "waiting"
        receipt = intent_result_receipt_for(org_id=claim.org_id, command_id=command_id)
        evidence = {"outbound_command_id": command_id, "receipt_id": receipt_id}
        if receipt is None or receipt.pk != receipt_id:
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": None},
                         step_dst=t.STEP_QUARANTINED, root_dst=t.RUN_QUARANTINED, next_key=None,
                         cause=reasons.EFFECT_RECEIPT_MISSING)
            result = "quarantined"
        elif receipt.outcome in SUCCESS_OUTCOMES:
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": receipt.outcome},
                         step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=step_def["next"],
                         context=_input_state(claim))
            result = "succeeded"
        elif receipt.outcome == "no_effect":
            # The element's fault connector, if any, is the Flow's explicit compensation path (section 15.2).
            fault = no_effect_route(step_def)
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": receipt.outcome},
                         step_dst=t.STEP_FAILED, root_dst=t.RUN_TERMINAL_FAILED if fault is None else t.RUN_RUNNABLE,
                         next_key=fault, cause=reasons.EFFECT_NO_EFFECT,
                         context=None if fault is None else _input_state(claim))
            result = "failed"
        else:
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": receipt.outcome},
                         step_dst=t.STEP_QUARANTINED, root_dst=t.RUN_QUARANTINED, next_key=None,
                         cause=reasons.EFFECT_QUARANTINED)
            result = "quarantined"
        failpoints.hit(FP_BEFORE_COMMIT)
    return result
