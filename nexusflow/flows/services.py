"""Flow Runtime V2 use cases (seed 004 sections 7, 10, 12, 14 and 15).

Deployment: :func:`flow_plan_compile`, :func:`flow_activate`, :func:`flow_deploy`.
Admission: :func:`flow_trigger_on_record_saved` (the records after-save hook).
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

import dataclasses
import datetime as dt
import logging
import secrets
from dataclasses import dataclass
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

from . import policy, reasons
from . import transitions as t
from .binding import RuntimeWorkBinding, flow_runtime_binding, scope_of
from .catalog import CatalogMismatch, catalog_current, catalog_seal, catalog_snapshot_from_row
from .compiler import (
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_PURE_COMPUTE,
    KIND_TERMINAL,
    CompiledPlan,
    compile_flow,
    conditions_hold,
    trigger_binding_digest_of,
    trigger_matches,
)
from .handlers import binary_supports, engine_support_diagnostics
from .errors import ActivationRejected, FlowAdmissionRejected, PlanMismatch, WakeSignalConflict, WakeSignalRejected
from .models import (
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
from .store import (
    FlowActivationStore,
    FlowAttemptStore,
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

EXECUTION_OWNER = "flow_runtime_v2"
PRODUCER_RUNTIME_INTENT = "runtime.intent_result"
EFFECT_OWNER_KIND = "runtime.outbound_command"
EFFECT_GENERATION_ID = "1"
TRIGGER_CHECKPOINT_SEQUENCE = 1
SUCCESS_OUTCOMES = frozenset({"remote_confirmed", "finalized"})


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
    ``(org, plan, record key, record version)``.

    Raises:
        FlowAdmissionRejected: an activation for this object is bound to
            another metadata view; the save fails closed rather than run a
            stale plan.
    """
    activations = list(
        FlowActivation.objects.filter(org_id=org.org_id, state=t.ACTIVATION_ACTIVE,
                                      plan__trigger_object_name=record.object_name)
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
            _run_admit(org=org, plan=plan, record=record)


def _run_admit(*, org: OrgScope, plan: FlowExecutionPlan, record) -> FlowRun | None:
    now = db_now()
    entry = _step_def(plan, plan.plan_payload["entry_step"])
    snapshot = {
        "record": {"object": record.object_name, "record_key": record.record_key,
                   "record_version": record.version, "fields": record.fields},
        "cursor": entry["key"],
    }
    try:
        with transaction.atomic():
            run = FlowRunStore.create(
                org_id=org.org_id, app_installation_id=plan.app_installation_id,
                runtime_capability_id=plan.runtime_capability_id, binding_digest=plan.runtime_work_binding_digest,
                plan=plan, plan_digest=plan.plan_digest, execution_profile=plan.execution_profile,
                execution_owner=EXECUTION_OWNER, state=t.RUN_ACCEPTED, trigger_object_name=record.object_name,
                record_key=record.record_key, record_version=record.version, created_at=now, updated_at=now,
            )
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
    except IntegrityError:
        log.info("flow run already admitted", extra={"org_id": org.org_id, "plan_id": plan.plan_id,
                                                     "record_key": record.record_key})
        return None
    return run


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
            plan_digest=run.plan_digest, started_at=now,
        )
    return StepClaim(
        org_id=org_id, run_id=run.pk, step_id=step.pk, step_key=step.plan_step_key, step_kind=step.step_kind,
        attempt_id=attempt.pk, attempt_number=attempt_number, lease_owner=worker_id, lease_token=token,
        lease_token_digest=token_digest, ownership_epoch=step.ownership_epoch, root_version=root_version,
        step_version=step_version, attempt_version=attempt.version, lease_expires_at=expires,
    )


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
    return dataclasses.replace(claim, step_version=version)


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
) -> FlowCheckpoint:
    """Insert the checkpoint and move attempt, step and root together (fenced CAS)."""
    sequence = (FlowCheckpoint.objects.filter(org_id=claim.org_id, run_id=claim.run_id)
                .aggregate(m=Max("sequence"))["m"] or 0) + 1
    payload = {"step": claim.step_key, "output": output, "cursor": next_key}
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
        current_step_id = FlowStepStore.create(
            org_id=claim.org_id, run=run, plan_step_key=nxt["key"], step_kind=nxt["kind"], state=t.STEP_PENDING,
            input_checkpoint=checkpoint, run_after=now, created_at=now, updated_at=now,
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


def _exec_decision(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    trigger = FlowCheckpoint.objects.get(org_id=claim.org_id, run_id=claim.run_id,
                                         sequence=TRIGGER_CHECKPOINT_SEQUENCE)
    fields = trigger.context_payload["record"]["fields"]
    chosen, rule_name = step_def["default_next"], None
    for rule in step_def["rules"]:
        if conditions_hold(rule["conditions"], rule["logic"], fields):
            chosen, rule_name = rule["next"], rule["name"]
            break
    with transaction.atomic(durable=True):
        now = db_now()
        run, _step, attempt = _lock_fenced(claim)
        _commit_step(claim, plan, run, attempt, now, output={"rule": rule_name, "next": chosen},
                     step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=chosen)
        failpoints.hit(FP_BEFORE_COMMIT)
    return "succeeded"


def _exec_terminal(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    with transaction.atomic(durable=True):
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
    from nexusflow.records.services import record_lock
    from runtime_outbox.services import outbound_command_author

    if not _handler_binding_matches(plan, step_def):
        # Fail closed before any business lock or mutation; never dispatch through another handler.
        with transaction.atomic(durable=True):
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
    with transaction.atomic(durable=True):
        now = db_now()
        try:
            # Business lock first (section 13.1), before the Flow root.
            record = record_lock(org=OrgScope(claim.org_id), object_name=identity.trigger_object_name,
                                 record_key=identity.record_key)
        except Record.DoesNotExist:
            record = None
        run, _step, attempt = _lock_fenced(claim)
        if record is None:
            _commit_step(claim, plan, run, attempt, now, output={"failure": reasons.TRIGGER_RECORD_DELETED},
                         step_dst=t.STEP_FAILED, root_dst=t.RUN_TERMINAL_FAILED, next_key=None,
                         cause=reasons.TRIGGER_RECORD_DELETED)
            failpoints.hit(FP_BEFORE_COMMIT)
            return "failed"
        scope = scope_of(run)
        command = outbound_command_author(
            scope=scope, effect_root_id=effect_root_id, effect_slot_id=step_def["key"],
            effect_generation_id=EFFECT_GENERATION_ID, contract_key=step_def["inputs"]["contract"], record=record,
            origin_flow_run_id=run.pk, origin_dependency_key=None,
        )
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
    with transaction.atomic(durable=True):
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
                ("accepts", "remote_confirmed|finalized|no_effect|quarantined"),
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
    KIND_PURE_COMPUTE: _exec_decision,
    KIND_TERMINAL: _exec_terminal,
    KIND_EFFECT_SUBMIT: _exec_effect_submit,
    KIND_EFFECT_COMPLETION: _exec_effect_completion,
}


def flow_step_execute(*, claim: StepClaim) -> str:
    """Run one claimed step to its committed outcome (seed 004 section 12.2).

    Returns:
        ``"succeeded"``, ``"waiting"``, ``"failed"``, ``"quarantined"`` or
        ``"rolled_back"`` (the step transaction failed and a retry was scheduled
        or the step failed terminally after ``NEXUS_FLOW_MAX_ATTEMPTS``).

    Raises:
        FenceRejected / StaleVersion: the claim lost its fence (lease
            recovered, root moved); nothing from this attempt was committed.
    """
    failpoints.hit(FP_AFTER_CLAIM)
    claim = _start(claim)
    plan = FlowExecutionPlan.objects.get(org_id=claim.org_id, runs__pk=claim.run_id)
    step_def = _step_def(plan, claim.step_key)
    executor = EXECUTORS.get(step_def["kind"])
    try:
        if executor is None or step_def["kind"] != claim.step_kind:
            raise PlanMismatch(f"no executor for step kind {step_def['kind']!r}")
        outcome = executor(claim, plan, step_def)
    except StaleVersion:
        raise
    except Exception as exc:  # the step transaction rolled back; record it under the fence
        log.warning("flow step rolled back: %s", getattr(exc, "code", type(exc).__name__),
                    extra={"org_id": claim.org_id, "run_id": claim.run_id, "step": claim.step_key},
                    exc_info=not isinstance(exc, NexusError))
        _record_rollback(claim, exc)
        return "rolled_back"
    failpoints.hit(FP_AFTER_COMMIT)
    return outcome


def _record_rollback(claim: StepClaim, exc: BaseException) -> None:
    """Proven rollback: attempt RolledBack, step RetryScheduled (or Failed), root back to Runnable.

    Safe even when the commit outcome is unknown: the fence check fails if the
    step transaction did commit, because that commit moved root, step and
    attempt together.
    """
    connection.close_if_unusable_or_obsolete()
    code = str(getattr(exc, "code", type(exc).__name__))[:64]
    try:
        with transaction.atomic(durable=True):
            now = db_now()
            _lock_fenced(claim)
            definite = bool(getattr(exc, "definite", False))
            exhausted = definite or claim.attempt_number >= policy.max_attempts()
            FlowAttemptStore.transition(
                org_id=claim.org_id, pk=claim.attempt_id, src=t.ATTEMPT_STARTED, dst=t.ATTEMPT_ROLLED_BACK,
                version=claim.attempt_version, fences=_attempt_fences(claim),
                set_fields={"finished_at": now, "failure_class": "terminal" if exhausted else "retryable",
                            "safe_error_code": code, "retry_decision": "terminal" if exhausted else "scheduled"},
            )
            root_fences = {"current_step_id": claim.step_id, "is_deleted": False, "delete_requested_at": None}
            if exhausted:
                # The handler's own code stays on the attempt (safe_error_code); the closed reason says why.
                cause = reasons.STEP_DEFINITE_REFUSAL if definite else reasons.STEP_RETRY_EXHAUSTED
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


__all__ = [
    "DeployResult", "StepClaim", "effect_root_id_for", "flow_activate", "flow_compile_check",
    "flow_deploy", "flow_plan_compile", "flow_step_claim_one", "flow_step_execute",
    "flow_trigger_on_record_saved", "flow_try_recover_expired_one", "flow_try_run_step_one", "flow_try_wake_one",
    "flow_wake_signal_accept",
]
