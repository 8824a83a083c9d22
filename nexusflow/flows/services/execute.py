"""Flow Runtime V2 use cases (seed 004 sections 7, 10, 12, 14 and 15).

Deployment: :func:`flow_plan_compile`, :func:`flow_activate`, :func:`flow_deploy`.
Admission: :func:`flow_trigger_on_record_saved` (the records after-save hook)
and :func:`flow_run_start` (an operator starts an autolaunched flow with inputs).
Workers, one unit per call, each returning True when it did work:
:func:`flow_try_run_step_one`, :func:`flow_try_wake_one`,
:func:`flow_try_recover_expired_one`.
Producer entry point: :func:`flow_wake_signal_accept`.

Transactions are short and never span I/O: a claim transaction, a
lifecycle-only start transaction, then one step transaction that takes the
business record lock first (when the step needs one), then root -> step ->
attempt -> dependency -> wake signal / effect link (section 12), and commits
the step result, checkpoint and next-step pointer atomically.
"""
from __future__ import annotations

import contextvars
import dataclasses
from contextlib import contextmanager
import datetime as dt
import logging
import secrets
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, F, Max, OuterRef, Q

from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import PROFILE_V2, digest_json_v2, digest_v2
from nexusflow.kernel.errors import FenceRejected, InvalidIdentity, NexusError, StaleVersion
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.metadata import current_view

from .. import policy, reasons
from .. import transitions as t
from ..binding import RuntimeWorkBinding, flow_runtime_binding, scope_of
from ..catalog import CatalogMismatch, catalog_current, catalog_seal, catalog_snapshot_from_row
from ..compiler import (
    ATOMIC_MAX_FANOUT,
    ATOMIC_MAX_WRITES,
    KIND_CURRENT_READ,
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_EMBEDDED,
    KIND_MUTATION,
    KIND_PURE_COMPUTE,
    KIND_TERMINAL,
    PROFILE_EMBEDDED,
    CompiledPlan,
    compile_flow,
    trigger_binding_digest_of,
    trigger_matches,
)
from ..handlers import binary_supports, engine_support_diagnostics
from ..errors import (
    ActivationRejected,
    FlowAdmissionRejected,
    FlowExecutionError,
    FlowInputRejected,
    FlowNotStartable,
    FlowRunNotFound,
    FlowStartConflict,
    LateLockDiscovery,
    PlanMismatch,
    WakeSignalConflict,
    WakeSignalRejected,
)
from ..interpreter import Outcome, run_graph, to_field_text
from ..models import (
    FlowActivation,
    FlowCheckpoint,
    FlowDependency,
    FlowEffectLink,
    FlowExecutionPlan,
    FlowRun,
    FlowRuntimeMetadataView,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)
from ..store import (
    FlowActivationStore,
    FlowAttemptStore,
    audit_insert,
    FlowDependencyStore,
    FlowRunStore,
    FlowStepStore,
    FlowWakeSignalStore,
    checkpoint_insert,
    effect_link_insert,
    metadata_view_insert,
    plan_insert,
    wake_signal_insert,
)

log = logging.getLogger("nexusflow.flows")

FP_AFTER_CLAIM = failpoints.declare("flow.step.after_claim")
FP_BEFORE_COMMIT = failpoints.declare("flow.step.before_commit")
FP_AFTER_COMMIT = failpoints.declare("flow.step.after_commit")
FP_AFTER_BUSINESS_LOCKS = failpoints.declare("flow.step.after_business_locks")
FP_AFTER_ROLLBACK = failpoints.declare("flow.step.after_rollback")

EXECUTION_OWNER = "flow_runtime_v2"
PRODUCER_RUNTIME_INTENT = "runtime.intent_result"
EFFECT_OWNER_KIND = "runtime.outbound_command"
EFFECT_GENERATION_ID = "1"
TRIGGER_CHECKPOINT_SEQUENCE = 1
SUCCESS_OUTCOMES = frozenset({"remote_confirmed", "finalized", "superseded"})


@dataclass(frozen=True)
class _SaveOrigin:
    """The Flow run whose record writes are being applied (the cause of the saves they make)."""

    run_id: int
    save_depth: int


#: Set while a step applies its record writes (:func:`_apply_writes`), in the step transaction: a run
#: admitted by one of those saves is a recursive save of the writer's logical save, one level deeper.
_SAVE_ORIGIN: contextvars.ContextVar[_SaveOrigin | None] = contextvars.ContextVar("flow_save_origin", default=None)


# =============================================================================
# Deployment: compile, persist, activate (seed 004 section 7)
# =============================================================================
@dataclass(frozen=True)
class DeployResult:
    plan: FlowExecutionPlan
    activation: FlowActivation
    plan_created: bool
    activated: bool


def flow_compile_check(*, source: bytes | str, flow_api_name: str, org: OrgScope,
                       subflows: dict[str, bytes] | None = None, requested_profile: str | None = None) -> CompiledPlan:
    """Compile ``source`` for ``org`` against the shipped catalog without writing anything.

    The same compiler call as :func:`flow_plan_compile` (seed 004 section 7.4:
    activation and setup verification share one compiler contract).

    Raises:
        CompileError: the stable diagnostics of seed 004 section 7.2.
        CatalogError: the shipped catalog source is invalid.
    """
    view = current_view()
    binding = flow_runtime_binding(org_id=org.org_id, metadata_view_digest=view.digest)
    return compile_flow(source=source, flow_api_name=flow_api_name, catalog=catalog_current(binding=binding),
                        view=view, subflows=subflows, requested_profile=requested_profile)


def metadata_view_seal(*, org: OrgScope, view) -> FlowRuntimeMetadataView:
    """Persist the content-addressed RuntimeMetadataView artifact of ``view`` for ``org`` (idempotent).

    Runs in the caller's transaction (savepoint for the insert race).

    Raises:
        PlanMismatch: a row with that digest holds another schema.
    """
    payload = {name: {"fields": sorted(obj.fields)} for name, obj in sorted(view.objects.items())}
    existing = FlowRuntimeMetadataView.objects.filter(org_id=org.org_id, view_digest=view.digest).first()
    if existing is None:
        try:
            with transaction.atomic():
                return metadata_view_insert(org_id=org.org_id, view_digest=view.digest, digest_profile=PROFILE_V2,
                                            objects_payload=payload, created_at=db_now())
        except IntegrityError:
            existing = FlowRuntimeMetadataView.objects.get(org_id=org.org_id, view_digest=view.digest)
    if existing.objects_payload != payload and not existing.objects_payload.get("backfilled"):
        raise PlanMismatch(f"metadata view {view.digest} holds another schema")
    return existing


def flow_plan_compile(*, org: OrgScope, source: bytes | str, flow_api_name: str,
                      subflows: dict[str, bytes] | None = None,
                      requested_profile: str | None = None) -> tuple[FlowExecutionPlan, bool]:
    """Compile ``source`` and persist its immutable plan (idempotent).

    Seals the catalog generation and the RuntimeMetadataView artifact first
    (seed 004 sections 7.4 and 8.4), then inserts the ``FlowExecutionPlan`` or
    returns the existing row with the same plan digest. Runs in the caller's
    transaction if there is one.

    Returns:
        ``(plan, created)``.

    Raises:
        CompileError: compilation failed; nothing but the catalog is written.
        PlanMismatch: an existing row with this digest references another catalog.
    """
    view = current_view()
    binding = flow_runtime_binding(org_id=org.org_id, metadata_view_digest=view.digest)
    snapshot = catalog_current(binding=binding)
    compiled = compile_flow(source=source, flow_api_name=flow_api_name, catalog=snapshot, view=view,
                            subflows=subflows, requested_profile=requested_profile)
    catalog_row = catalog_seal(snapshot=snapshot)
    view_row = metadata_view_seal(org=org, view=view)
    existing = FlowExecutionPlan.objects.filter(org_id=org.org_id, plan_digest=compiled.plan_digest).first()
    if existing is None:
        try:
            with transaction.atomic():
                existing = plan_insert(
                    org_id=binding.org_id, app_installation_id=binding.app_installation_id,
                    runtime_capability_id=binding.runtime_capability_id,
                    runtime_work_binding_digest=binding.digest, runtime_work_binding=binding.as_dict(),
                    plan_id=compiled.plan_id, flow_api_name=compiled.flow_api_name,
                    flow_version=compiled.metadata_digest, metadata_digest=compiled.metadata_digest,
                    compiler_version=compiled.compiler_version, catalog=catalog_row,
                    catalog_digest=catalog_row.digest, trigger_object_name=compiled.trigger.get("object") or "-",
                    trigger_binding_digest=compiled.trigger_binding_digest,
                    metadata_view_digest=compiled.metadata_view_digest, metadata_view=view_row,
                    policy_version=compiled.policy_version,
                    execution_profile=compiled.execution_profile, digest_profile=compiled.digest_profile,
                    plan_digest=compiled.plan_digest, plan_payload=compiled.payload,
                    bound_summary=compiled.bound_summary, diagnostic_summary=compiled.diagnostic_summary,
                    created_at=db_now(),
                )
            return existing, True
        except IntegrityError:
            existing = FlowExecutionPlan.objects.get(org_id=org.org_id, plan_digest=compiled.plan_digest)
    if existing.catalog_id != catalog_row.pk or existing.catalog_digest != catalog_row.digest:
        raise PlanMismatch(f"plan {existing.plan_id} references another catalog generation")
    return existing, False


def _persisted_snapshot(plan: FlowExecutionPlan):
    """The sealed read view of ``plan``'s own catalog generation, verified against its scope.

    Raises:
        CatalogMismatch / InvalidIdentity: the scope or digest does not reproduce.
    """
    binding = RuntimeWorkBinding(**plan.runtime_work_binding)
    if binding.digest != plan.runtime_work_binding_digest:
        raise CatalogMismatch("plan binding does not reproduce its digest")
    row = plan.catalog
    if row.digest != plan.catalog_digest:
        raise CatalogMismatch("plan pins another catalog digest")
    return catalog_snapshot_from_row(binding=binding, row=row)


def flow_activate(*, org: OrgScope, plan: FlowExecutionPlan) -> tuple[FlowActivation, bool]:
    """Make ``plan`` the active plan of its Flow in ``org``; supersede the previous one.

    In-flight runs keep the plan they were accepted with. Activating the
    already-active plan is a no-op. Runs in the caller's transaction.

    Returns:
        ``(activation, changed)``.

    Raises:
        PlanMismatch: ``plan`` belongs to another org.
        StaleVersion: a concurrent activation moved the previous row.
    """
    if plan.org_id != org.org_id:
        raise PlanMismatch("plan belongs to another org")
    blockers = engine_support_diagnostics(plan.plan_payload, _persisted_snapshot(plan))
    if blockers:
        raise ActivationRejected(blockers)
    with transaction.atomic():
        current = FlowActivationStore.lock_active(org.org_id, plan.flow_api_name)
        if current is not None and current.plan_id == plan.pk:
            return current, False
        now = db_now()
        if current is not None:
            FlowActivationStore.transition(
                org_id=org.org_id, pk=current.pk, src=t.ACTIVATION_ACTIVE, dst=t.ACTIVATION_SUPERSEDED,
                version=current.version, set_fields={"active_slot": None, "superseded_at": now},
            )
        activation = FlowActivationStore.create(
            org_id=org.org_id, flow_api_name=plan.flow_api_name, plan=plan, state=t.ACTIVATION_ACTIVE,
            active_slot=plan.flow_api_name, created_at=now,
            runtime_work_binding_digest=plan.runtime_work_binding_digest,
            trigger_binding_digest=plan.trigger_binding_digest,
        )
        return activation, True


def flow_deploy(*, org: OrgScope, source: bytes | str, flow_api_name: str,
                subflows: dict[str, bytes] | None = None, requested_profile: str | None = None) -> DeployResult:
    """Compile, persist and activate one Flow in one transaction (idempotent).

    Raises:
        CompileError: compilation failed (including an unsafe RunAtomically
            request); nothing is written or activated.
        ActivationRejected: the plan compiles but this engine generation
            cannot run it (``engine_unsupported:*``); nothing is activated.
    """
    with transaction.atomic(durable=True):
        plan, created = flow_plan_compile(org=org, source=source, flow_api_name=flow_api_name, subflows=subflows,
                                          requested_profile=requested_profile)
        activation, activated = flow_activate(org=org, plan=plan)
    return DeployResult(plan=plan, activation=activation, plan_created=created, activated=activated)


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
    locked: inserts only, no lock on any existing Flow row. Idempotent per
    ``(org, plan, record key, record version)``. The trigger snapshot freezes
    the saved values and ``change.prior_fields`` (the values this save
    replaced; ``None`` on create), which ``$Record__Prior``, ``ISCHANGED``
    and ``PRIORVALUE`` read in every step. A save made by a Flow run's own
    record write admits its runs one recursive-save level deeper than that
    run (``save_depth``, ``triggered_by_run``; README "Flows that save their
    own records").

    Raises:
        FlowAdmissionRejected: an activation for this object is bound to
            another metadata view; the save fails closed rather than run a
            stale plan.
    """
    activations = list(
        FlowActivation.objects.filter(org_id=org.org_id, state=t.ACTIVATION_ACTIVE,
                                      plan__trigger_object_name=record.object_name)
        .exclude(plan__execution_profile=PROFILE_EMBEDDED)  # before-save flows run in flow_before_save
        .select_related("plan").order_by("id")
    )
    if not activations:
        return
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
        if trigger_matches(plan.plan_payload["trigger"], object_name=record.object_name, created=change.created,
                           fields=record.fields):
            _run_admit(org=org, plan=plan, record=record, prior_fields=change.prior_fields)


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


def _run_admit(*, org: OrgScope, plan: FlowExecutionPlan, record, prior_fields: dict | None) -> FlowRun | None:
    now = db_now()
    entry = _step_def(plan, plan.plan_payload["entry_step"])
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
                record_key=record.record_key, record_version=record.version, created_at=now, updated_at=now,
                triggered_by_run_id=None if origin is None else origin.run_id,
                save_depth=0 if origin is None else origin.save_depth + 1,
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
    inputs_digest = _checkpoint_digest({"inputs": frozen})

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
            )
            _admit_first_step(org=org, run=run, entry=entry, snapshot=snapshot, now=now)
    except IntegrityError:
        # A concurrent start with the same request id won the unique run key: converge on its run.
        found = existing() if request_id is not None else None
        if found is None:
            raise
        return found
    return StartResult(run=FlowRun.objects.get(org_id=org.org_id, pk=run.pk), created=True)


# =============================================================================
# Claim (seed 004 section 12.1)
# =============================================================================
@dataclass(frozen=True)
class StepClaim:
    """What a worker holds after a confirmed claim. ``lease_token`` never leaves memory."""

    org_id: str
    run_id: FlowRun.Id
    step_id: FlowStepExecution.Id
    step_key: str
    step_kind: str
    attempt_id: FlowStepAttempt.Id
    attempt_number: int
    lease_owner: str
    lease_token: str
    lease_token_digest: str
    ownership_epoch: int
    root_version: int
    step_version: int
    attempt_version: int
    lease_expires_at: dt.datetime
    #: The attempt's admitted business lock plan: sorted ``(object_name, record_key)`` pairs.
    lock_plan: tuple[tuple[str, str], ...] = ()
    #: The run's recursive-save level (``FlowRun.save_depth``), read with the root by :func:`_start`.
    save_depth: int = 0


def _lease_digest(token: str) -> str:
    return digest_v2("flows.lease-token", [("token", token)]).hexdigest


def flow_step_claim_one(*, worker_id: str) -> StepClaim | None:
    """Claim one due step: lease, Claimed step, Running root and a Started attempt.

    Discovery is a non-locking read; the claim transaction then locks root ->
    step and re-verifies everything (seed 004 section 12.1).

    Returns:
        The confirmed claim, or ``None`` when no step is due or another
        worker won every candidate.
    """
    validate_key(worker_id, field="worker_id", max_length=128)
    now = db_now()
    candidates = list(
        FlowStepExecution.objects.filter(
            state__in=(t.STEP_PENDING, t.STEP_RETRY_SCHEDULED),
            run__state=t.RUN_RUNNABLE, run__current_step_id=F("id"), run__is_deleted=False,
            run__delete_requested_at__isnull=True,
        ).filter(Q(run_after__isnull=True) | Q(run_after__lte=now))
        .order_by("run_after", "id").values_list("org_id", "run_id", "id")[: policy.CLAIM_BATCH]
    )
    for org_id, run_id, step_id in candidates:
        claim = _claim(org_id=org_id, run_id=run_id, step_id=step_id, worker_id=worker_id)
        if claim is not None:
            return claim
    return None


def _claim(*, org_id: str, run_id: int, step_id: int, worker_id: str) -> StepClaim | None:
    with transaction.atomic(durable=True):
        now = db_now()
        run = FlowRunStore.lock(org_id, run_id)
        if (run.state != t.RUN_RUNNABLE or run.current_step_id != step_id or run.is_deleted
                or run.delete_requested_at is not None):
            return None
        step = FlowStepStore.lock(org_id, step_id)
        if (step.run_id != run.pk or step.state not in (t.STEP_PENDING, t.STEP_RETRY_SCHEDULED)
                or (step.run_after is not None and step.run_after > now)):
            return None
        plan = run.plan
        if (plan.org_id != run.org_id or plan.plan_digest != run.plan_digest
                or plan.runtime_work_binding_digest != run.binding_digest):
            log.error("flow claim refused: run and plan bindings differ", extra={"org_id": org_id, "run_id": run_id})
            return None
        token = secrets.token_urlsafe(32)
        token_digest = _lease_digest(token)
        expires = now + dt.timedelta(seconds=policy.lease_seconds())
        attempt_number = step.attempt_count + 1
        lock_plan = _lock_plan_for(run, step)
        step_version = FlowStepStore.transition(
            org_id=org_id, pk=step.pk, src=step.state, dst=t.STEP_CLAIMED, version=step.version,
            set_fields={"lease_owner": worker_id, "lease_token_digest": token_digest, "lease_expires_at": expires,
                        "attempt_count": attempt_number, "updated_at": now},
        )
        root_version = FlowRunStore.transition(
            org_id=org_id, pk=run.pk, src=t.RUN_RUNNABLE, dst=t.RUN_RUNNING, version=run.version,
            fences={"current_step_id": step.pk, "is_deleted": False, "delete_requested_at": None},
            set_fields={"started_at": run.started_at or now, "updated_at": now},
        )
        attempt = FlowAttemptStore.create(
            org_id=org_id, step=step, attempt_number=attempt_number, state=t.ATTEMPT_STARTED,
            lease_owner=worker_id, lease_token_digest=token_digest, ownership_epoch=step.ownership_epoch,
            root_state_version_at_claim=root_version, retry_policy_digest=policy.retry_policy_digest(),
            recovery_backoff_floor_ms=policy.recovery_backoff_floor_ms(step_id=step.pk, attempt_number=attempt_number),
            plan_digest=run.plan_digest, started_at=now, lock_plan=[list(r) for r in lock_plan],
            lock_plan_digest=_lock_plan_digest(lock_plan),
        )
    return StepClaim(
        org_id=org_id, run_id=run.pk, step_id=step.pk, step_key=step.plan_step_key, step_kind=step.step_kind,
        attempt_id=attempt.pk, attempt_number=attempt_number, lease_owner=worker_id, lease_token=token,
        lease_token_digest=token_digest, ownership_epoch=step.ownership_epoch, root_version=root_version,
        step_version=step_version, attempt_version=attempt.version, lease_expires_at=expires, lock_plan=lock_plan,
    )


#: Step kinds whose transaction starts by locking the trigger record (seed 004 section 13.1 step 2).
LOCKING_KINDS = frozenset({KIND_MUTATION})


def _lock_plan_for(run: FlowRun, step: FlowStepExecution) -> tuple[tuple[str, str], ...]:
    """The declared resource plan of the next attempt: trigger record plus earlier late discoveries.

    Seed 004 section 13.3 step 4: a retry after a late discovery admits the
    expanded plan, read from the rolled-back attempts' evidence.
    """
    resources: set[tuple[str, str]] = set()
    if step.step_kind in LOCKING_KINDS and run.trigger_object_name != START_OBJECT:
        resources.add((run.trigger_object_name, run.record_key))
    for summary in FlowStepAttempt.objects.filter(org_id=run.org_id, step_id=step.pk).values_list(
            "metrics_summary", flat=True):
        for obj, key in (summary or {}).get("discovered", []):
            resources.add((obj, key))
    return tuple(sorted(resources, key=lambda r: (r[0].encode(), r[1].encode())))


def _lock_plan_digest(lock_plan) -> str:
    return digest_v2("flows.lock-plan", [("resource", f"{o}\x00{k}") for o, k in lock_plan]).hexdigest


# =============================================================================
# Execute (seed 004 section 12.2)
# =============================================================================
def _start(claim: StepClaim) -> StepClaim:
    """Lifecycle-only transaction: step Claimed -> Running under the claim fence."""
    with transaction.atomic(durable=True):
        now = db_now()
        run = FlowRunStore.lock(claim.org_id, claim.run_id)
        _verify_root(run, claim)
        step = FlowStepStore.lock(claim.org_id, claim.step_id)
        if step.lease_expires_at is None or step.lease_expires_at <= now:
            raise FenceRejected(f"step {claim.step_id}: lease expired before execution started")
        version = FlowStepStore.transition(
            org_id=claim.org_id, pk=claim.step_id, src=t.STEP_CLAIMED, dst=t.STEP_RUNNING,
            version=claim.step_version,
            fences={"lease_token_digest": claim.lease_token_digest, "ownership_epoch": claim.ownership_epoch},
            set_fields={"updated_at": now},
        )
    return dataclasses.replace(claim, step_version=version, save_depth=run.save_depth)


def _verify_root(run: FlowRun, claim: StepClaim) -> None:
    if (run.state != t.RUN_RUNNING or run.version != claim.root_version or run.current_step_id != claim.step_id
            or run.is_deleted or run.delete_requested_at is not None):
        raise FenceRejected(
            f"run {claim.run_id}: root moved (state {run.state} v{run.version}, expected Running v{claim.root_version})"
        )


def _lock_fenced(claim: StepClaim) -> tuple[FlowRun, FlowStepExecution, FlowStepAttempt]:
    """Lock root -> step -> attempt and verify the complete claim fence.

    Raises:
        FenceRejected: any of root version/pointer, step lease/version or
            attempt fence is no longer the claim's.
    """
    run = FlowRunStore.lock(claim.org_id, claim.run_id)
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
    return run, step, attempt


def _attempt_fences(claim: StepClaim) -> dict[str, Any]:
    return {"lease_token_digest": claim.lease_token_digest, "ownership_epoch": claim.ownership_epoch,
            "root_state_version_at_claim": claim.root_version}


def _step_fences(claim: StepClaim) -> dict[str, Any]:
    return {"lease_token_digest": claim.lease_token_digest, "ownership_epoch": claim.ownership_epoch}


def _commit_step(
    claim: StepClaim, plan: FlowExecutionPlan, run: FlowRun, attempt: FlowStepAttempt, now: dt.datetime, *,
    output: dict[str, Any], step_dst: str, root_dst: str, next_key: str | None, cause: str = "",
    context: dict[str, Any] | None = None,
) -> FlowCheckpoint:
    """Insert audit evidence and the checkpoint, then move attempt, step and root together (fenced CAS).

    Seed 004 section 12.2 steps 11-12: runs inside the step transaction after
    the business writes; any failure here (audit, checkpoint, a lost fence)
    rolls the whole transaction back, business writes included.
    """
    sequence = (FlowCheckpoint.objects.filter(org_id=claim.org_id, run_id=claim.run_id)
                .aggregate(m=Max("sequence"))["m"] or 0) + 1
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
    if next_key is not None:
        nxt = _step_def(plan, next_key)
        # A durable loop revisits its steps: each visit is the next invocation of that plan step.
        ordinal = (FlowStepExecution.objects.filter(org_id=claim.org_id, run_id=claim.run_id, plan_step_key=nxt["key"])
                   .aggregate(m=Max("invocation_ordinal"))["m"] or 0) + 1
        current_step_id = FlowStepStore.create(
            org_id=claim.org_id, run=run, plan_step_key=nxt["key"], step_kind=nxt["kind"], state=t.STEP_PENDING,
            input_checkpoint=checkpoint, run_after=now, created_at=now, updated_at=now, invocation_ordinal=ordinal,
        ).pk
    root_fields: dict[str, Any] = {"current_step_id": current_step_id, "current_checkpoint_id": checkpoint.pk,
                                   "updated_at": now, "run_after": now}
    if root_dst in t.FLOW_RUN.terminal:
        root_fields.update({"completed_at": now, "reason_code": cause})
    FlowRunStore.transition(
        org_id=claim.org_id, pk=claim.run_id, src=t.RUN_RUNNING, dst=root_dst, version=claim.root_version,
        fences={"current_step_id": claim.step_id, "is_deleted": False, "delete_requested_at": None},
        set_fields=root_fields,
    )
    return checkpoint


class _CurrentReader:
    """Non-locking current reads of live records of the run's org (seed 004 section 12.2 step 5)."""

    def __init__(self, org_id: str):
        self.org_id = org_id

    def query(self, object_name: str, predicate, *, limit: int) -> list[dict[str, Any]]:
        from nexusflow.records.models import Record

        out = []
        for key, fields in (Record.objects.filter(org_id=self.org_id, object_name=object_name, is_deleted=False)
                            .order_by("record_key").values_list("record_key", "fields")[: 5 * limit]):
            rec = {"Id": key, "__object": object_name, **(fields or {})}
            if predicate(rec):
                out.append(rec)
                if len(out) >= limit:
                    break
        return out


def _trigger_snapshot(claim: StepClaim) -> dict[str, Any]:
    return FlowCheckpoint.objects.get(org_id=claim.org_id, run_id=claim.run_id,
                                      sequence=TRIGGER_CHECKPOINT_SEQUENCE).context_payload["record"]


def _input_state(claim: StepClaim) -> dict[str, Any]:
    """The interpreter state the step starts from: its input checkpoint's context, else the trigger record."""
    step = FlowStepExecution.objects.only("input_checkpoint_id").get(org_id=claim.org_id, pk=claim.step_id)
    payload = FlowCheckpoint.objects.values_list("context_payload", flat=True).get(
        org_id=claim.org_id, pk=step.input_checkpoint_id)
    return payload.get("context") or {}


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
    snapshot = _trigger_snapshot(claim)
    record = {"Id": snapshot["record_key"], **snapshot["fields"]}
    prior = snapshot.get("prior_fields")
    graph, entry = _graph_of(plan, step_def)
    outcome = run_graph(plan_payload=plan.plan_payload, graph=graph, entry=entry, record=record,
                        object_name=snapshot["object"], now=now, reader=reader, state=_input_state(claim),
                        prior=None if prior is None else {"Id": snapshot["record_key"], **prior},
                        is_new=snapshot.get("record_version") == 1, fan_out_limit=ATOMIC_MAX_FANOUT)
    if "graph" in step_def:
        next_key = step_def.get("next")
    else:
        next_key = outcome.next_step
        if next_key is None and step_def.get("type") != "decisions":
            next_key = (step_def.get("next") or {}).get("success")
    return outcome, next_key or "end"


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
    return locked


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
    from nexusflow.records.services import record_create, record_update

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
            else:
                created = record_create(org=org, object_name=write.object_name, values=write.values)
                done.append({"op": "create", "object": write.object_name, "record_key": created.record_key})
    except (UnknownObject, UnknownField, InvalidFieldValue) as exc:
        raise FlowExecutionError(f"record write refused: {exc.code}", code="flow_record_write_refused") from exc
    finally:
        _SAVE_ORIGIN.reset(token)
    return done


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
    except Exception:  # noqa: BLE001 - a dead handle has no session
        return None


def _same_session(session: int | None) -> bool:
    """Is the connection still the live server session ``session`` (so its ROLLBACK was acknowledged)?"""
    if session is None or connection.connection is None:
        return False
    try:
        return connection.is_usable() and connection.connection.thread_id() == session
    except Exception:  # noqa: BLE001
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
    commit-unknown is resolved under the fence (:func:`_record_unknown`).
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


def _exec_graph(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """Run a compute, read or bounded-mutation step (durable element or Bounded Atomic graph).

    Seed 004 sections 9.2 and 12.2: lock the admitted business records in
    canonical order, interpret the element graph with current reads, refuse a
    write outside the admitted plan (late discovery rolls the whole step back,
    section 13.3), then lock root -> step -> attempt, apply the writes and
    commit them with audit, checkpoint and the fenced state CAS.
    """
    reader = _CurrentReader(claim.org_id) if step_def["kind"] in (KIND_MUTATION, KIND_CURRENT_READ) else None
    with _step_txn():
        now = db_now()
        locked = _lock_business(claim)
        outcome, next_key = _interpret(claim, plan, step_def, now, reader)
        for write in outcome.writes:
            if write.op == "update" and (write.object_name, write.record_key) not in locked:
                raise LateLockDiscovery(f"{write.object_name} record outside the admitted lock plan",
                                        resource=[write.object_name, write.record_key])
            if write.op == "update" and locked[(write.object_name, write.record_key)] is None:
                raise FlowExecutionError("the record to update no longer exists", code="flow_record_missing")
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

    README "Flows that save their own records": a run whose ``save_depth``
    exceeds :data:`policy.RECURSIVE_SAVE_LIMIT` takes no business lock and
    makes no write, so it admits no further run; its step ends ``Failed`` and
    the run ``TerminalFailed`` with ``flow_recursion_limit`` (visible in the
    support read, ``reason_codes`` and the admin).
    """
    with _step_txn():
        now = db_now()
        run, _step, attempt = _lock_fenced(claim)
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
        now = db_now()
        run, _step, attempt = _lock_fenced(claim)
        _commit_step(claim, plan, run, attempt, now, output={"terminal": True}, step_dst=t.STEP_SUCCEEDED,
                     root_dst=t.RUN_SUCCEEDED, next_key=None)
        failpoints.hit(FP_BEFORE_COMMIT)
    return "succeeded"


def effect_root_id_for(*, org_id: str, plan_id: str, run_id: FlowRun.Id | int) -> str:
    """The deterministic effect root of one run's effects (v2 digest over org, plan, run).

    Raises:
        InvalidIdentity: ``run_id`` is not a FlowRun id (or a positive int).
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    return digest_v2("flows.effect-root", [("org_id", org_id), ("plan_id", plan_id), ("flow_run_id", run_id)]).hexdigest


def _handler_binding_matches(plan: FlowExecutionPlan, step_def: dict[str, Any]) -> bool:
    """Does the persisted generation and this binary's handler equal what the plan pinned? (section 8.4).

    Rebuilds the sealed read view from the plan's own ``FlowActionCatalogGeneration``
    (scope and digest verified), never from the shipped catalog or another registry.
    """
    try:
        entry = _persisted_snapshot(plan).entries.get(step_def["action_key"])
    except NexusError:
        return False
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
            now = db_now()
            run, _step, attempt = _lock_fenced(claim)
            _commit_step(claim, plan, run, attempt, now, output={"failure": reasons.HANDLER_BINDING_MISMATCH},
                         step_dst=t.STEP_QUARANTINED, root_dst=t.RUN_QUARANTINED, next_key=None,
                         cause=reasons.HANDLER_BINDING_MISMATCH)
            failpoints.hit(FP_BEFORE_COMMIT)
        return "quarantined"
    identity = FlowRun.objects.only("org_id", "trigger_object_name", "record_key").get(
        org_id=claim.org_id, pk=claim.run_id)
    effect_root_id = effect_root_id_for(org_id=claim.org_id, plan_id=plan.plan_id, run_id=claim.run_id)
    with _step_txn():
        now = db_now()
        try:
            # Business lock first (section 13.1), before the Flow root: the record owner fence (seed 000),
            # taken on the row live or deleted so that a committed deletion is seen, not a missing row.
            record = record_lock_owner(org=OrgScope(claim.org_id), object_name=identity.trigger_object_name,
                                       record_key=identity.record_key)
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
        effect_link_insert(
            org_id=scope.org_id, app_installation_id=scope.app_installation_id,
            runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest, run=run,
            step_id=claim.step_id, effect_owner_kind=EFFECT_OWNER_KIND, outbound_command_id=command.pk,
            effect_handoff_key=command.idempotency_key, submission_attempt=attempt, created_at=now,
        )
        _commit_step(
            claim, plan, run, attempt, now,
            output={"outbound_command_id": command.pk, "effect_handoff_key": command.idempotency_key,
                    "dependency_key": str(command.pk)},
            step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=step_def["next"],
        )
        failpoints.hit(FP_BEFORE_COMMIT)
    return "succeeded"


def _exec_effect_completion(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    from runtime_outbox.selectors import intent_result_receipt_for

    link = FlowEffectLink.objects.get(org_id=claim.org_id, run_id=claim.run_id,
                                      step__plan_step_key=step_def["submit_step"])
    dependency_key = str(link.outbound_command_id)
    with _step_txn():
        now = db_now()
        run, step, attempt = _lock_fenced(claim)
        scope = scope_of(run)
        scope_filter = dict(org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                            runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest)
        dependency = FlowDependency.objects.filter(step_id=claim.step_id, **scope_filter).first()
        if dependency is not None:
            dependency = FlowDependencyStore.lock(claim.org_id, dependency.pk)
        receipt_id = dependency.resolution_receipt_id if (
            dependency is not None and dependency.state == t.DEP_SATISFIED) else None
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
        receipt = intent_result_receipt_for(org_id=claim.org_id, command_id=link.outbound_command_id)
        evidence = {"outbound_command_id": link.outbound_command_id, "receipt_id": receipt_id}
        if receipt is None or receipt.pk != receipt_id:
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": None},
                         step_dst=t.STEP_QUARANTINED, root_dst=t.RUN_QUARANTINED, next_key=None,
                         cause=reasons.EFFECT_RECEIPT_MISSING)
            result = "quarantined"
        elif receipt.outcome in SUCCESS_OUTCOMES:
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": receipt.outcome},
                         step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=step_def["next"])
            result = "succeeded"
        elif receipt.outcome == "no_effect":
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": receipt.outcome},
                         step_dst=t.STEP_FAILED, root_dst=t.RUN_TERMINAL_FAILED, next_key=None,
                         cause=reasons.EFFECT_NO_EFFECT)
            result = "failed"
        else:
            _commit_step(claim, plan, run, attempt, now, output={**evidence, "outcome": receipt.outcome},
                         step_dst=t.STEP_QUARANTINED, root_dst=t.RUN_QUARANTINED, next_key=None,
                         cause=reasons.EFFECT_QUARANTINED)
            result = "quarantined"
        failpoints.hit(FP_BEFORE_COMMIT)
    return result


def _wait(claim: StepClaim, run: FlowRun, step: FlowStepExecution, now: dt.datetime,
          dependency: FlowDependency | None, dependency_key: str, scope: TrustedRuntimeWorkScope) -> None:
    """Commit the durable wait: dependency, attempt Committed, step and root Waiting (section 14.2 step 3)."""
    if dependency is None:
        FlowDependencyStore.create(
            org_id=scope.org_id, app_installation_id=scope.app_installation_id,
            runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest, run=run,
            step=step, producer_kind=PRODUCER_RUNTIME_INTENT, dependency_key=dependency_key,
            condition_digest=digest_v2("flows.dependency-condition", [
                ("producer_kind", PRODUCER_RUNTIME_INTENT), ("dependency_key", dependency_key),
                ("accepts", "remote_confirmed|finalized|superseded|no_effect|quarantined"),
            ]).hexdigest,
            expiry_policy="quarantine", state=t.DEP_WAITING,
            deadline=now + dt.timedelta(seconds=policy.dependency_deadline_seconds()), created_at=now,
        )
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


EXECUTORS: dict[str, Callable[[StepClaim, FlowExecutionPlan, dict[str, Any]], str]] = {
    KIND_PURE_COMPUTE: _exec_graph,
    KIND_CURRENT_READ: _exec_graph,
    KIND_MUTATION: _exec_graph,
    KIND_TERMINAL: _exec_terminal,
    KIND_EFFECT_SUBMIT: _exec_effect_submit,
    KIND_EFFECT_COMPLETION: _exec_effect_completion,
}


def flow_step_execute(*, claim: StepClaim) -> str:
    """Run one claimed step to its committed outcome (seed 004 section 12.2).

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
    failpoints.hit(FP_AFTER_CLAIM)
    claim = _start(claim)
    plan = FlowExecutionPlan.objects.get(org_id=claim.org_id, runs__pk=claim.run_id)
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
            elif isinstance(exc, FlowExecutionError):
                cause = reasons.STEP_EXECUTION_ERROR
            exhausted = definite or claim.attempt_number >= policy.max_attempts()
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
    objects = {n["object"] for n in graph if n.get("type") in ("recordUpdates", "recordLookups") and n.get("object")}
    if any(n.get("type") == "recordUpdates" and n.get("input_reference") == "$Record" for n in graph):
        objects.add(run.trigger_object_name)
    writes = plan.bound_summary.get("writes")
    bound = (writes if isinstance(writes, int) else ATOMIC_MAX_WRITES) + 1
    expanded = set(claim.lock_plan) | {tuple(resource)}
    return resource[0] in objects and len(expanded) <= bound


def flow_try_run_step_one(*, worker_id: str) -> bool:
    """Claim and execute one due step. Returns True when a step was claimed.

    Seed 004 sections 12.1-12.2; the worker loop (``run_workers --role flow``)
    calls this repeatedly. A lost fence is logged, not raised.
    """
    claim = flow_step_claim_one(worker_id=worker_id)
    if claim is None:
        return False
    try:
        flow_step_execute(claim=claim)
    except StaleVersion as exc:
        log.warning("flow step fenced: %s", exc, extra={"org_id": claim.org_id, "run_id": claim.run_id})
    return True


# =============================================================================
# Waits and wakes (seed 004 section 14)
# =============================================================================
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
    if not FlowRun.objects.filter(pk=flow_run_id, **scope_filter).exists():
        raise WakeSignalRejected("no flow run in this work scope")
    key = dict(flow_run_id=flow_run_id, dependency_key=dependency_key, **scope_filter)
    existing = FlowWakeSignal.objects.filter(**key).first()
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


def flow_try_wake_one() -> bool:
    """Resolve one waiting dependency from an accepted wake signal (section 14.2 step 6).

    Discovers a candidate without locks, then locks root -> step ->
    dependency -> signal, satisfies the dependency, consumes the signal and
    moves step Waiting -> Pending and root Waiting -> Runnable.
    """
    waiting = FlowDependency.objects.filter(
        org_id=OuterRef("org_id"), app_installation_id=OuterRef("app_installation_id"),
        runtime_capability_id=OuterRef("runtime_capability_id"), binding_digest=OuterRef("binding_digest"),
        run_id=OuterRef("flow_run_id"), dependency_key=OuterRef("dependency_key"), state=t.DEP_WAITING,
    )
    candidates = list(
        FlowWakeSignal.objects.filter(state=t.SIGNAL_UNMATCHED).filter(Exists(waiting))
        .order_by("id").values_list("id", "org_id", "flow_run_id")[: policy.CLAIM_BATCH]
    )
    for signal_id, org_id, run_id in candidates:
        if _wake(org_id=org_id, run_id=run_id, signal_id=signal_id):
            return True
    return False


def _wake(*, org_id: str, run_id: int, signal_id: int) -> bool:
    with transaction.atomic(durable=True):
        now = db_now()
        run = FlowRunStore.lock(org_id, run_id)
        if run.state != t.RUN_WAITING or run.current_step_id is None:
            return False
        step = FlowStepStore.lock(org_id, run.current_step_id)
        if step.state != t.STEP_WAITING:
            return False
        scope = scope_of(run)
        scope_filter = dict(org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                            runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest)
        seen = FlowWakeSignal.objects.filter(pk=signal_id, flow_run_id=run.pk, **scope_filter).first()
        if seen is None:
            return False
        dependency = FlowDependency.objects.filter(step_id=step.pk, run_id=run.pk,
                                                   dependency_key=seen.dependency_key, **scope_filter).first()
        if dependency is None:
            return False
        dependency = FlowDependencyStore.lock(org_id, dependency.pk)
        signal = FlowWakeSignalStore.lock(org_id, signal_id)
        if dependency.state != t.DEP_WAITING or signal.state != t.SIGNAL_UNMATCHED:
            return False
        FlowDependencyStore.transition(
            org_id=org_id, pk=dependency.pk, src=t.DEP_WAITING, dst=t.DEP_SATISFIED, version=dependency.version,
            set_fields={"resolved_at": now, "resolution_receipt_id": signal.receipt_id},
        )
        FlowWakeSignalStore.transition(
            org_id=org_id, pk=signal.pk, src=t.SIGNAL_UNMATCHED, dst=t.SIGNAL_CONSUMED, version=signal.version,
            set_fields={"consumed_at": now, "dependency_id": dependency.pk},
        )
        FlowStepStore.transition(
            org_id=org_id, pk=step.pk, src=t.STEP_WAITING, dst=t.STEP_PENDING, version=step.version,
            set_fields={"run_after": now, "updated_at": now},
        )
        FlowRunStore.transition(
            org_id=org_id, pk=run.pk, src=t.RUN_WAITING, dst=t.RUN_RUNNABLE, version=run.version,
            fences={"current_step_id": step.pk}, set_fields={"run_after": now, "updated_at": now},
        )
    return True


# =============================================================================
# Expired-attempt recovery (seed 004 section 12.4)
# =============================================================================
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
    now = db_now()
    candidates = list(
        FlowStepExecution.objects.filter(state__in=(t.STEP_CLAIMED, t.STEP_RUNNING), lease_expires_at__lt=now)
        .order_by("lease_expires_at", "id").values_list("org_id", "run_id", "id", "lease_token_digest")
        [: policy.CLAIM_BATCH]
    )
    for org_id, run_id, step_id, token_digest in candidates:
        if _recover(org_id=org_id, run_id=run_id, step_id=step_id, token_digest=token_digest):
            return True
    # A holder proven terminated cannot commit either: recover it without waiting for the lease.
    from connectors.workers import holder_termination_proof

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
        exhausted = step.attempt_count >= policy.max_attempts() and step.state == t.STEP_RUNNING
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
        now = db_now()
        run = FlowRunStore.lock(claim.org_id, claim.run_id)
        _verify_root(run, claim)
        step = FlowStepStore.lock(claim.org_id, claim.step_id)
        if step.lease_expires_at is None or step.lease_expires_at <= now:
            raise FenceRejected(f"step {claim.step_id}: lease already expired")
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
    _cancel_cleanup(org_id=org.org_id, run_id=run.pk)
    state = FlowRun.objects.values_list("state", flat=True).get(org_id=org.org_id, pk=run.pk)
    return CancelResult(run.pk, state, True, now, True)


def _cancel_cleanup(*, org_id: str, run_id: FlowRun.Id) -> bool:
    """``CancelRequested -> Cancelled`` once no lease of the run is live (seed 004 sections 10.1, 11.1).

    Locks root, its ``CancelRequested`` steps (id order), then their waiting
    dependencies; cancels those and the root. A step whose old lease is still
    live waits (its attempt is already ``Cancelled``; the old worker's fence
    cannot commit), so cleanup alone enters ``Cancelled``.
    """
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


def flow_try_cancel_cleanup_one() -> bool:
    """Complete one ``CancelRequested`` run whose old leases have lapsed (worker unit)."""
    now = db_now()
    candidates = list(FlowRun.objects.filter(state=t.RUN_CANCEL_REQUESTED).order_by("updated_at", "id")
                      .values_list("org_id", "id")[: policy.CLAIM_BATCH])
    for org_id, run_id in candidates:
        if FlowStepExecution.objects.filter(org_id=org_id, run_id=run_id, state=t.STEP_CANCEL_REQUESTED,
                                            lease_expires_at__gt=now).exists():
            continue
        if _cancel_cleanup(org_id=org_id, run_id=run_id):
            return True
    return False


# =============================================================================
# Embedded Before-Save (seed 004 section 9.1): the records before-save hook
# =============================================================================
def flow_before_save(*, org: OrgScope, object_name: str, record_key: str | None, fields: dict[str, Any],
                     prior: dict[str, Any] | None, created: bool) -> dict[str, Any]:
    """Run the org's active Embedded Before-Save flows on a record about to be saved; return its new fields.

    Runs in the caller's record transaction: no FlowRun root, no second
    transaction, no wait or effect; only the trigger record's in-memory fields
    change. Flows run in activation order, each seeing the previous output.

    Args:
        fields: the field values about to be written (``{name: text|None}``).
        prior: the stored fields before this save, ``None`` on create.

    Returns:
        The transformed fields (only the fields the flows assigned differ).

    Raises:
        FlowExecutionError: a flow cannot run (unsupported element, budget
            exhausted, a write other than the trigger record): the record
            mutation fails deterministically, as section 9.1 requires.
        FlowAdmissionRejected: an activation is bound to another metadata view.
    """
    activations = list(
        FlowActivation.objects.filter(org_id=org.org_id, state=t.ACTIVATION_ACTIVE,
                                      plan__trigger_object_name=object_name,
                                      plan__execution_profile=PROFILE_EMBEDDED)
        .select_related("plan").order_by("id")
    )
    if not activations:
        return fields
    view = current_view()
    expected = flow_runtime_binding(org_id=org.org_id, metadata_view_digest=view.digest).digest
    current = dict(fields)
    now = db_now()
    for activation in activations:
        plan = activation.plan
        if activation.runtime_work_binding_digest != expected or plan.runtime_work_binding_digest != expected:
            raise FlowAdmissionRejected(f"activation {activation.pk} of {plan.flow_api_name} is bound to another "
                                        "runtime binding; recompile and activate it for the current view")
        trigger = plan.plan_payload["trigger"]
        if not trigger_matches(trigger, object_name=object_name, created=created, fields=current):
            continue
        step = _step_def(plan, plan.plan_payload["entry_step"])
        if step["kind"] != KIND_EMBEDDED:
            raise FlowExecutionError(f"{plan.flow_api_name}: entry step is {step['kind']}, not embedded")
        outcome = run_graph(plan_payload=plan.plan_payload, graph=step["graph"], entry=step.get("entry_element"),
                            record={"Id": record_key, **current}, object_name=object_name, now=now,
                            reader=_CurrentReader(org.org_id), prior=prior, is_new=created,
                            budget=policy_embedded_budget(), fan_out_limit=ATOMIC_MAX_FANOUT)
        for write in outcome.writes:
            if write.op != "update" or write.object_name != object_name or write.record_key != record_key:
                raise FlowExecutionError(f"{plan.flow_api_name}: before-save output is the trigger record only")
            current.update(write.values)
        for name in outcome.state.get("dirty", []):
            current[name] = outcome.state["record"].get(name)
    return current


def policy_embedded_budget() -> int:
    """Element visits one before-save flow may make (seed 004 section 9.1 "execution budget")."""
    return int(policy._number("NEXUS_FLOW_EMBEDDED_BUDGET", 500))


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
        run = FlowRun.objects.filter(org_id=org.org_id, pk=run_id, is_deleted=False).first()
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


# =============================================================================
# Support read (seed 004 section 19)
# =============================================================================
def flow_run_support_read(*, org: OrgScope, run_id: FlowRun.Id | int, include_deleted: bool = False) -> dict[str, Any]:
    """The section 19 support read of one run of the trusted org, as a JSON-safe dict.

    Returns the immutable plan identity, canonical run state and legacy
    projection, current step, current checkpoint metadata (no raw context),
    every step with its attempt history, dependency and effect correlation
    and the safe terminal cause.

    Args:
        include_deleted: an authorized include-deleted read; otherwise a
            soft-deleted run is not found (``IsDeleted`` is the one filter).

    Raises:
        InvalidIdentity: ``run_id`` is not a FlowRun id (before SQL).
        FlowRunNotFound: no visible run ``run_id`` in ``org``.
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    qs = FlowRun.objects.filter(org_id=org.org_id, pk=run_id).select_related("plan", "current_checkpoint")
    if not include_deleted:
        qs = qs.filter(is_deleted=False)
    run = qs.first()
    if run is None:
        raise FlowRunNotFound(f"no flow run {int(run_id)} in this org")
    cp = run.current_checkpoint

    def ts(value):
        return value.isoformat() if value is not None else None

    steps = []
    for step in FlowStepExecution.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("id"):
        attempts = [{
            "attempt_id": int(a.pk), "attempt_number": a.attempt_number, "outcome": a.state,
            "lease_owner": a.lease_owner, "lease_correlation": a.lease_token_digest[:12],
            "ownership_epoch": a.ownership_epoch, "root_state_version_at_claim": a.root_state_version_at_claim,
            "failure_class": a.failure_class, "safe_error_code": a.safe_error_code,
            "retry_decision": a.retry_decision, "recovery_backoff_floor_ms": a.recovery_backoff_floor_ms,
            "lock_plan_digest": a.lock_plan_digest, "started_at": ts(a.started_at), "finished_at": ts(a.finished_at),
        } for a in FlowStepAttempt.objects.filter(org_id=org.org_id, step_id=step.pk).order_by("attempt_number")]
        steps.append({"step_id": int(step.pk), "plan_step_key": step.plan_step_key, "step_kind": step.step_kind,
                      "state": step.state, "version": step.version, "attempt_count": step.attempt_count,
                      "run_after": ts(step.run_after), "reason_code": step.reason_code, "attempts": attempts})
    dependencies = [{"dependency_id": int(d.pk), "step_id": int(d.step_id), "producer_kind": d.producer_kind,
                     "dependency_key": d.dependency_key, "state": d.state, "deadline": ts(d.deadline)}
                    for d in FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("id")]
    effects = [{"effect_link_id": int(e.pk), "step_id": int(e.step_id), "effect_owner_kind": e.effect_owner_kind,
                "outbound_command_id": int(e.outbound_command_id), "effect_handoff_key": e.effect_handoff_key}
               for e in FlowEffectLink.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("id")]
    return {
        "run_id": int(run.pk), "org_id": run.org_id,
        "plan": {"plan_id": run.plan.plan_id, "plan_digest": run.plan_digest, "flow_api_name": run.plan.flow_api_name,
                 "flow_version": run.plan.flow_version, "execution_profile": run.execution_profile},
        "execution_owner": run.execution_owner, "state": run.state, "legacy_status": run.legacy_status,
        "state_version": run.version, "ownership_epoch": run.ownership_epoch,
        "current_step_id": int(run.current_step_id) if run.current_step_id else None,
        "current_checkpoint": None if cp is None else {
            "checkpoint_id": int(cp.pk), "sequence": cp.sequence, "plan_cursor": cp.plan_cursor,
            "context_digest": cp.context_digest, "context_schema_version": cp.context_schema_version},
        "terminal_cause": run.reason_code, "is_deleted": run.is_deleted,
        "delete_requested_at": ts(run.delete_requested_at), "started_at": ts(run.started_at),
        "completed_at": ts(run.completed_at), "trigger": {"object": run.trigger_object_name,
                                                          "record_key": run.record_key,
                                                          "record_version": run.record_version,
                                                          "save_depth": run.save_depth,
                                                          "triggered_by_run_id": run.triggered_by_run_id},
        "steps": steps, "dependencies": dependencies, "effects": effects,
    }


__all__ = [
    "CancelResult", "flow_before_save", "flow_run_drive", "flow_run_delete", "flow_run_support_read", "flow_step_heartbeat",
    "flow_try_cancel_cleanup_one",
    "DeployResult", "StepClaim", "effect_root_id_for", "flow_activate", "flow_compile_check",
    "flow_deploy", "flow_plan_compile", "flow_step_claim_one", "flow_step_execute",
    "flow_trigger_on_record_saved", "flow_try_recover_expired_one", "flow_try_run_step_one", "flow_try_wake_one",
    "flow_wake_signal_accept",
]
