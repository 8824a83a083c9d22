"""Admission: a saved record or an operator start admits a FlowRun (seed 004 sections 7.4 and 10.1).

:func:`flow_trigger_on_record_saved` is the records after-save hook: one run
per matching active activation, inside the saving transaction;
:func:`flow_trigger_on_record_deleting` (a records before-delete hook) does the
same for delete-triggered flows inside the deleting transaction.
:func:`flow_run_start` admits one run of an autolaunched flow with validated
input variables. Both write the run's first checkpoint and first step and
leave the run ``Runnable`` for :func:`.claim.flow_step_claim_one`.
"""
from __future__ import annotations

import contextvars
import datetime as dt
import logging
import secrets
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_json_v2, digest_v2
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import current_view

from .. import transitions as t
from ..authorization import run_identity
from ..binding import flow_runtime_binding
from ..compiler import PROFILE_EMBEDDED, TERMINAL_STEP_KEY, trigger_binding_digest_of
from ..conditions import filters_hold_unchanged, trigger_matches
from ..errors import FlowAdmissionRejected, FlowInputRejected, FlowNotStartable, FlowStartConflict, PlanMismatch
from ..interpreter import to_field_text
from ..models import FlowActivation, FlowCheckpoint, FlowExecutionPlan, FlowRun
from ..selectors import flow_activations_on
from ..store import FlowRunStore, FlowStepStore, checkpoint_insert
from .wait_resolution import IMMEDIATE_PATH, scheduled_paths_recheck

log = logging.getLogger("nexusflow.flows")

EXECUTION_OWNER = "flow_runtime_v2"
TRIGGER_CHECKPOINT_SEQUENCE = 1


@dataclass(frozen=True)
class _SaveOrigin:
    """The Flow run whose record writes are being applied (the cause of the saves they make)."""

    run_id: int
    save_depth: int


#: Set while a step applies its record writes (:func:`.execute._apply_writes`), in the step transaction: a run
#: admitted by one of those saves is a recursive save of the writer's logical save, one level deeper.
_SAVE_ORIGIN: contextvars.ContextVar[_SaveOrigin | None] = contextvars.ContextVar("flow_save_origin", default=None)


# =============================================================================
# Admission: the after-save trigger (seed 004 sections 7.4 and 10.1)
# =============================================================================
def _checkpoint_digest(payload: dict[str, Any]) -> str:
    return digest_json_v2("flows.checkpoint", canonical_json.dumps(payload)).hexdigest


def _step_def(plan: FlowExecutionPlan, key: str) -> dict[str, Any]:
    for step in plan.plan_payload["steps"]:
        if step["key"] == key:
            return step
    raise PlanMismatch(f"plan {plan.plan_id} has no step {key!r}")


def flow_trigger_on_record_saved(*, org: OrgScope, record, change) -> None:
    """Admit one FlowRun per matching active activation (records after-save hook).

    Runs inside the saving transaction, after the record row is written and
    locked: inserts only; an update also makes the record's waiting
    scheduled paths look again right after it commits
    (:func:`.wait_resolution.scheduled_paths_recheck`). (The runs whose Wait
    element watches the record are signalled by a hook of their own,
    :func:`.waits.record_saved_signal`, registered before this one.) Idempotent per
    ``(org, plan, record key, record version, entry path)``: one run for the
    start connector and one per scheduled path, each waiting for its time. The trigger snapshot freezes
    the saved values and ``change.prior_fields`` (the values this save
    replaced; ``None`` on create), which ``$Record__Prior``, ``ISCHANGED``
    and ``PRIORVALUE`` read in every step. A save made by a Flow run's own
    record write admits its runs one recursive-save level deeper than that
    run (``save_depth``, ``triggered_by_run``; docs/operations.md "Flows that save their
    own records").

    Raises:
        FlowAdmissionRejected: an activation for this object is bound to
            another metadata view; the save fails closed rather than run a
            stale plan.
    """
    if not change.created:
        scheduled_paths_recheck(org=org, record=record, change=change)
    for activation in _active_for(org, record.object_name):
        plan = activation.plan
        if trigger_matches(plan.plan_payload["trigger"], object_name=record.object_name, created=change.created,
                           fields=record.fields, prior=change.prior_fields):
            paths = plan.plan_payload.get("scheduled_paths") or []
            if not paths or plan.plan_payload["entry_step"] != TERMINAL_STEP_KEY:
                _run_admit(org=org, plan=plan, record=record, prior_fields=change.prior_fields)
            for path in paths:  # each scheduled path is a run of its own, first waiting for its time
                _run_admit(org=org, plan=plan, record=record, prior_fields=change.prior_fields,
                           entry_path=path["name"], entry_key=path["step"])


def _active_for(org: OrgScope, object_name: str) -> list[FlowActivation]:
    """The org's active non-embedded activations on ``object_name``, verified against the request-bound view.

    Raises:
        FlowAdmissionRejected: an activation is bound to another binding or trigger set (fail closed).
    """
    # Before-save flows run in flow_before_save; each plan is the immutable one, read once per process.
    activations = [activation for activation in flow_activations_on(org_id=org.org_id, object_name=object_name)
                   if activation.plan.execution_profile != PROFILE_EMBEDDED]
    if not activations:
        return []
    view = current_view()  # the request-bound view: read once, at the start of this save
    expected = flow_runtime_binding(org_id=org.org_id, metadata_view_digest=view.digest).digest
    for activation in activations:
        plan = activation.plan
        if (plan.org_id != org.org_id or activation.runtime_work_binding_digest != expected
                or plan.runtime_work_binding_digest != expected
                or activation.trigger_binding_digest != plan.trigger_binding_digest
                or trigger_binding_digest_of(plan.plan_payload["trigger"], view.digest) != plan.trigger_binding_digest):
            raise FlowAdmissionRejected(
                f"activation {activation.pk} of {plan.flow_api_name} is bound to another runtime binding or "
                "trigger set; recompile and activate it for the current metadata view"
            )
    return activations


def flow_trigger_on_record_deleting(*, org: OrgScope, record) -> None:
    """Records before-delete hook: admit one run per active delete-triggered flow (``RecordBeforeDelete``)
    whose entry filters hold on the record being deleted, inside the deleting transaction.

    The run's trigger snapshot is the record as it was deleted (``$Record``; no prior record); it runs
    after the deletion commits, like any admitted run, and a refused deletion rolls it back with it. The
    same hook serves every deletion through :func:`nexusflow.records.services.record_delete` (REST,
    ``records delete``, a Flow's Delete Records). A deletion made by a Flow run's own write admits its runs
    one recursive level deeper (``save_depth``).

    Raises:
        FlowAdmissionRejected: see :func:`_active_for`; the deletion fails closed.
    """
    for activation in _active_for(org, record.object_name):
        trigger = activation.plan.plan_payload["trigger"]
        if (trigger.get("trigger_type") == "RecordBeforeDelete" and trigger.get("object") == record.object_name
                and filters_hold_unchanged(trigger, record.fields)):
            _run_admit(org=org, plan=activation.plan, record=record, prior_fields=None)


def _admit_first_step(*, org: OrgScope, run: FlowRun, entry: dict[str, Any], snapshot: dict[str, Any],
                      now: dt.datetime) -> None:
    """Write an admitted run's first checkpoint and first step and make it ``Runnable`` (caller's transaction)."""
    checkpoint = checkpoint_insert(
        org_id=org.org_id, run=run, step=None, sequence=TRIGGER_CHECKPOINT_SEQUENCE,
        plan_cursor=entry["key"], context_payload=snapshot, context_digest=_checkpoint_digest(snapshot),
        created_at=now,
    )
    first = FlowStepStore.create(
        org_id=org.org_id, run=run, plan_step_key=entry["key"], step_kind=entry["kind"],
        state=t.STEP_PENDING, input_checkpoint=checkpoint, run_after=now, created_at=now, updated_at=now,
    )
    FlowRunStore.transition(
        org_id=org.org_id, pk=run.pk, src=t.RUN_ACCEPTED, dst=t.RUN_RUNNABLE, version=run.version,
        set_fields={"current_step_id": first.pk, "current_checkpoint_id": checkpoint.pk,
                    "run_after": now, "updated_at": now},
    )


def _initiator_of(org: OrgScope, origin: _SaveOrigin | None) -> str:
    """Who caused a run a save admits: the causing run's initiator when a Flow's own write saved, else the user
    the save is made for (an operator over REST, an account's integration user), else unknown (``""``)."""
    if origin is None:
        from nexusflow.records.access import ACTING_PRINCIPAL

        return ACTING_PRINCIPAL.get() or ""
    return (FlowRun.objects.filter(org_id=org.org_id, pk=origin.run_id).values_list("initiating_principal", flat=True)
            .first() or "")


def _run_admit(*, org: OrgScope, plan: FlowExecutionPlan, record, prior_fields: dict | None,
               entry_path: str = IMMEDIATE_PATH, entry_key: str | None = None) -> FlowRun | None:
    now = db_now()
    entry = _step_def(plan, entry_key or plan.plan_payload["entry_step"])
    snapshot = {
        "record": {"object": record.object_name, "record_key": record.record_key,
                   "record_version": record.version, "fields": record.fields,
                   "prior_fields": None if prior_fields is None else dict(prior_fields)},
        "cursor": entry["key"],
    }
    origin = _SAVE_ORIGIN.get()
    try:
        with transaction.atomic():
            run = FlowRunStore.create(
                org_id=org.org_id, app_installation_id=plan.app_installation_id,
                runtime_capability_id=plan.runtime_capability_id, binding_digest=plan.runtime_work_binding_digest,
                plan=plan, plan_digest=plan.plan_digest, execution_profile=plan.execution_profile,
                execution_owner=EXECUTION_OWNER, state=t.RUN_ACCEPTED, trigger_object_name=record.object_name,
                record_key=record.record_key, record_version=record.version, entry_path=entry_path,
                created_at=now, updated_at=now, triggered_by_run_id=None if origin is None else origin.run_id,
                save_depth=0 if origin is None else origin.save_depth + 1,
                **run_identity(org_id=org.org_id, initiating_principal=_initiator_of(org, origin)),
            )
            _admit_first_step(org=org, run=run, entry=entry, snapshot=snapshot, now=now)
    except IntegrityError:
        log.info("flow run already admitted", extra={"org_id": org.org_id, "plan_id": plan.plan_id,
                                                     "record_key": record.record_key})
        return None
    return run


# =============================================================================
# Admission: an operator starts an autolaunched flow with input variables
# =============================================================================
#: ``trigger_object_name`` of a started run (the plan's own marker for "no start object").
START_OBJECT = "-"
#: ``record_version`` of a started run: no record version admitted it.
START_RECORD_VERSION = 0
_NUMBER_TYPES = frozenset({"Number", "Currency"})
_TEXT_TYPES = frozenset({"String", "Picklist", "Multipicklist", "LongTextArea"})


@dataclass(frozen=True)
class StartResult:
    run: FlowRun
    #: False when ``request_id`` had already started this run (a retried start).
    created: bool


def plan_inputs(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The input variables of a plan: ``{name: {"data_type", "collection", "object"}}`` (``isInput`` true)."""
    variables = (payload.get("checkpoint_schema") or {}).get("variables") or {}
    return {name: {"data_type": d.get("data_type"), "collection": bool(d.get("collection")), "object": d.get("object")}
            for name, d in sorted(variables.items()) if d.get("kind") == "variables" and d.get("input")}


def _input_scalar(org: OrgScope, name: str, decl: dict[str, Any], value: Any) -> Any:
    """One input value as the interpreter holds it (text, bool, or a stored record dict)."""
    from nexusflow.records.models import Record

    kind = decl["data_type"]
    if value is None:
        return None

    def wrong(why: str) -> FlowInputRejected:
        return FlowInputRejected(f"input {name} ({kind}): {why}", code="flow_input_type")

    if kind in _TEXT_TYPES:
        if not isinstance(value, str):
            raise wrong(f"expected text, got {type(value).__name__}")
        return value
    if kind in _NUMBER_TYPES:
        if isinstance(value, bool) or not isinstance(value, (int, str, float)):
            raise wrong(f"expected a number, got {type(value).__name__}")
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            raise wrong(f"{value!r} is not a number") from None
        if not number.is_finite():
            raise wrong(f"{value!r} is not a finite number")
        return to_field_text(number)
    if kind == "Boolean":
        if isinstance(value, bool):
            return value
        if value in ("true", "false"):
            return value == "true"
        raise wrong(f"expected true or false, got {value!r}")
    if kind in ("Date", "DateTime"):
        parse = dt.date.fromisoformat if kind == "Date" else dt.datetime.fromisoformat
        try:
            parse(value) if isinstance(value, str) else parse(None)
        except (TypeError, ValueError):
            raise wrong(f"{value!r} is not an ISO {kind.lower()}") from None
        return value
    if kind == "SObject":
        # A record input is the local record key of a live record of the variable's object.
        if not isinstance(value, str):
            raise wrong(f"expected the record key of a {decl['object']} record, got {type(value).__name__}")
        validate_key(value, field=f"input {name}", max_length=64)
        row = (Record.objects.filter(org_id=org.org_id, object_name=decl["object"], record_key=value,
                                     is_deleted=False).values_list("fields", flat=True).first())
        if row is None and not Record.objects.filter(org_id=org.org_id, object_name=decl["object"],
                                                     record_key=value, is_deleted=False).exists():
            raise FlowInputRejected(f"input {name}: no {decl['object']} record {value!r}",
                                    code="flow_input_record_missing")
        return {"Id": value, "__object": decl["object"], **(row or {})}
    raise wrong("this data type is not accepted as a start input")


def flow_start_inputs(*, org: OrgScope, payload: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """Validate ``inputs`` against the plan's input variables; return the frozen values.

    Every scalar input must be given (an explicit ``None`` leaves it empty);
    a collection input defaults to the empty list. Record (SObject) inputs
    are local record keys, read once here and frozen with their fields.

    Raises:
        FlowInputRejected: ``flow_input_unknown``, ``flow_input_type``,
            ``flow_input_missing`` or ``flow_input_record_missing``.
    """
    if not isinstance(inputs, dict):
        raise FlowInputRejected("inputs must be an object of name -> value", code="flow_input_type")
    declared = plan_inputs(payload)
    unknown = sorted(set(inputs) - set(declared))
    if unknown:
        raise FlowInputRejected(f"no input variable {', '.join(map(str, unknown))}; inputs: "
                                f"{', '.join(declared) or 'none'}", code="flow_input_unknown")
    missing = sorted(name for name, decl in declared.items() if not decl["collection"] and name not in inputs)
    if missing:
        raise FlowInputRejected(f"missing input {', '.join(missing)}", code="flow_input_missing")
    frozen: dict[str, Any] = {}
    for name, decl in declared.items():
        value = inputs.get(name)
        if decl["collection"]:
            if value is None:
                frozen[name] = []
                continue
            if not isinstance(value, list):
                raise FlowInputRejected(f"input {name} ({decl['data_type']}): expected a list",
                                        code="flow_input_type")
            frozen[name] = [_input_scalar(org, name, decl, item) for item in value]
        else:
            frozen[name] = _input_scalar(org, name, decl, value)
    return frozen


def _start_identity(frozen: dict[str, Any], declared: dict[str, dict]) -> dict[str, Any]:
    """What a start's request id binds: the validated inputs with each record input named by its key, not
    by the fields read at the start (a retried start of the same records after the run changed them is the
    same start)."""
    def key(value: Any) -> Any:
        return value.get("Id") if isinstance(value, dict) else value

    return {name: ([key(v) for v in value] if isinstance(value, list) else key(value))
            if declared[name]["data_type"] == "SObject" else value for name, value in frozen.items()}


def _start_key(flow_api_name: str, request_id: str | None) -> str:
    """The run key of a start: derived from the operator's request id, else unique to this call."""
    if request_id is None:
        return f"start:{secrets.token_hex(16)}"
    validate_key(request_id, field="request_id", max_length=128)
    return "start:" + digest_v2("flows.start-request", [("flow", flow_api_name),
                                                         ("request_id", request_id)]).hexdigest[:40]


def flow_run_start(*, org: OrgScope, flow_api_name: str, inputs: dict[str, Any],
                   request_id: str | None = None, text_inputs: dict[str, list[str]] | None = None) -> StartResult:
    """Admit one FlowRun of the active autolaunched plan of ``flow_api_name`` with ``inputs``.

    The validated inputs are frozen in the run's first checkpoint (its
    context variables), so every step, retry and recovery reads the same
    values. ``request_id`` makes a retried start converge: the same id for the
    same Flow in the same org returns the run it started (any plan), as long
    as the inputs are the same. ``text_inputs`` are command-line values by
    name (they override ``inputs``): the list of a collection input, exactly
    one value of a scalar input.

    Raises:
        FlowNotStartable: no active plan, or the active plan has a record trigger.
        FlowInputRejected: the inputs do not fit the plan (nothing written).
        FlowStartConflict: ``request_id`` already started a run with other inputs.
        InvalidIdentity: a malformed ``request_id`` or record key.
    """
    validate_key(flow_api_name, field="flow_api_name", max_length=255)
    key = _start_key(flow_api_name, request_id)
    activation = (FlowActivation.objects.filter(org_id=org.org_id, flow_api_name=flow_api_name,
                                                state=t.ACTIVATION_ACTIVE).select_related("plan").first())
    if activation is None:
        raise FlowNotStartable(f"{flow_api_name} has no active plan in this org")
    plan = activation.plan
    if plan.plan_payload["trigger"].get("trigger_type") != "none" or plan.execution_profile == PROFILE_EMBEDDED:
        raise FlowNotStartable(f"{flow_api_name} is record-triggered: saves of its records start it")
    if not isinstance(inputs, dict):
        raise FlowInputRejected("inputs must be an object of name -> value", code="flow_input_type")
    inputs = dict(inputs)
    declared = plan_inputs(plan.plan_payload)
    for name, values in (text_inputs or {}).items():
        if name in declared and declared[name]["collection"]:
            inputs[name] = list(values)
        elif name in declared and len(values) != 1:
            raise FlowInputRejected(f"input {name} takes one value, got {len(values)}", code="flow_input_type")
        else:
            inputs[name] = values[0]
    frozen = flow_start_inputs(org=org, payload=plan.plan_payload, inputs=inputs)
    inputs_digest = _checkpoint_digest({"inputs": _start_identity(frozen, declared)})

    def existing() -> StartResult | None:
        run = (FlowRun.objects.filter(org_id=org.org_id, trigger_object_name=START_OBJECT, record_key=key,
                                      record_version=START_RECORD_VERSION, plan__flow_api_name=flow_api_name)
               .order_by("id").first())
        if run is None:
            return None
        first = FlowCheckpoint.objects.values_list("context_payload", flat=True).get(
            org_id=org.org_id, run_id=run.pk, sequence=TRIGGER_CHECKPOINT_SEQUENCE)
        if first.get("start", {}).get("inputs_digest") != inputs_digest:
            raise FlowStartConflict(f"request id already started run {run.pk} of {flow_api_name} with other inputs")
        return StartResult(run=run, created=False)

    if request_id is not None and (found := existing()) is not None:
        return found
    now = db_now()
    entry = _step_def(plan, plan.plan_payload["entry_step"])
    snapshot = {
        "record": {"object": None, "record_key": None, "record_version": START_RECORD_VERSION, "fields": {}},
        "cursor": entry["key"],
        "start": {"inputs_digest": inputs_digest, "request": "operator" if request_id is not None else "none"},
        "context": {"vars": frozen},
    }
    try:
        with transaction.atomic(durable=True):
            run = FlowRunStore.create(
                org_id=org.org_id, app_installation_id=plan.app_installation_id,
                runtime_capability_id=plan.runtime_capability_id, binding_digest=plan.runtime_work_binding_digest,
                plan=plan, plan_digest=plan.plan_digest, execution_profile=plan.execution_profile,
                execution_owner=EXECUTION_OWNER, state=t.RUN_ACCEPTED, trigger_object_name=START_OBJECT,
                record_key=key, record_version=START_RECORD_VERSION, created_at=now, updated_at=now,
                **run_identity(org_id=org.org_id),
            )
            _admit_first_step(org=org, run=run, entry=entry, snapshot=snapshot, now=now)
    except IntegrityError:
        # A concurrent start with the same request id won the unique run key: converge on its run.
        found = existing() if request_id is not None else None
        if found is None:
            raise
        return found
    return StartResult(run=FlowRun.objects.get(org_id=org.org_id, pk=run.pk), created=True)
