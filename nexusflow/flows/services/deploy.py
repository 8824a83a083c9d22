"""Deployment: compile, persist and activate a Flow (seed 004 section 7).

:func:`flow_compile_check` compiles without writing; :func:`flow_plan_compile`
seals the catalog generation and the RuntimeMetadataView artifact and persists
the immutable plan; :func:`flow_activate` makes a plan the active one of its
Flow; :func:`flow_deploy` does both in one transaction.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import current_view

from .. import transitions as t
from ..authorization import system_identity_refusal
from ..binding import RuntimeWorkBinding, flow_runtime_binding
from ..catalog import CatalogMismatch, catalog_current, catalog_seal, catalog_snapshot_from_row
from ..compiler import CompiledPlan, PlanBounds, compile_flow
from ..errors import ActivationRejected, Diagnostic, PlanMismatch
from ..handlers import engine_support_diagnostics
from ..models import FlowActivation, FlowDeploymentSource, FlowExecutionPlan, FlowRuntimeMetadataView
from ..selectors import flow_subflow_payloads
from ..store import FlowActivationStore, deployment_source_insert, metadata_view_insert, plan_insert


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
                        view=view, subflows=subflows, requested_profile=requested_profile,
                        bounds=plan_bounds_for(org))


def plan_bounds_for(org: OrgScope) -> PlanBounds:
    """The plan-eligibility bounds of ``org``'s runtime policy (``plan_bounds``; the compiler's own when none
    is published), which every compilation for the org applies (docs/operations.md "The runtime policy")."""
    from runtime_outbox.policy import runtime_policy

    return PlanBounds(**runtime_policy(org.org_id).plan_bounds)


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

    The plans of the subflows it calls are persisted beside it (not
    activated): a subflow element runs the plan it was compiled against.

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
                            subflows=subflows, requested_profile=requested_profile, bounds=plan_bounds_for(org))
    catalog_row = catalog_seal(snapshot=snapshot)
    view_row = metadata_view_seal(org=org, view=view)
    # The plans of the subflows it calls, exactly as compiled with it: a subflow resolves by plan digest.
    for child in _subflow_plans(compiled):
        _plan_persist(org=org, binding=binding, compiled=child, catalog_row=catalog_row, view_row=view_row)
    return _plan_persist(org=org, binding=binding, compiled=compiled, catalog_row=catalog_row, view_row=view_row)


def _subflow_plans(compiled: CompiledPlan) -> list[CompiledPlan]:
    """Every subflow plan ``compiled`` calls, transitively, innermost first."""
    out: dict[str, CompiledPlan] = {}

    def visit(plan: CompiledPlan) -> None:
        for digest, child in sorted(plan.subflow_plans.items()):
            if digest not in out:
                visit(child)
                out[digest] = child

    visit(compiled)
    return list(out.values())


def _plan_persist(*, org: OrgScope, binding: RuntimeWorkBinding, compiled: CompiledPlan, catalog_row,
                  view_row) -> tuple[FlowExecutionPlan, bool]:
    """Insert the ``FlowExecutionPlan`` of ``compiled`` or return the row with its digest (caller's transaction).

    Raises:
        PlanMismatch: an existing row with this digest references another catalog.
    """
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
        ActivationRejected: the engine cannot run the plan (``engine_unsupported:*``), or the org's access policy
            does not declare the system identity its steps run as (``flow_system_identity_undeclared``).
        StaleVersion: a concurrent activation moved the previous row.
    """
    if plan.org_id != org.org_id:
        raise PlanMismatch("plan belongs to another org")
    blockers = engine_support_diagnostics(plan.plan_payload, _persisted_snapshot(plan),
                                          flow_subflow_payloads(org_id=org.org_id, payload=plan.plan_payload))
    undeclared = system_identity_refusal(org_id=org.org_id)
    if undeclared is not None:  # a system-mode step needs an explicit declared identity (S004-22.6-09)
        blockers = [*blockers, Diagnostic("flow_system_identity_undeclared", None, undeclared)]
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
        _source_keep(org=org, plan=plan, source=source, subflows=subflows, requested_profile=requested_profile)
    return DeployResult(plan=plan, activation=activation, plan_created=created, activated=activated)


_FLOW_NAME_REF = re.compile(r"<flowName>\s*([A-Za-z][A-Za-z0-9_]*)\s*</flowName>")


def _text(source: bytes | str) -> str:
    return source.decode("utf-8") if isinstance(source, bytes) else source


def _source_keep(*, org: OrgScope, plan: FlowExecutionPlan, source: bytes | str,
                 subflows: dict[str, bytes] | None, requested_profile: str | None) -> None:
    """Keep the source ``plan`` was compiled from, with the subflows it calls transitively (idempotent)."""
    text = _text(source)
    called: dict[str, str] = {}
    pending = _FLOW_NAME_REF.findall(text)
    while pending:
        name = pending.pop()
        if name in called or name not in (subflows or {}):
            continue
        called[name] = _text(subflows[name])
        pending += _FLOW_NAME_REF.findall(called[name])
    digest = digest_v2("flows.deployment-source", [
        ("source", text), ("subflows", canonical_json.dumps(called).decode()),
        ("requested_profile", requested_profile or "")]).hexdigest
    if FlowDeploymentSource.objects.filter(org_id=org.org_id, plan=plan, source_digest=digest).exists():
        return
    with transaction.atomic():
        try:
            deployment_source_insert(org_id=org.org_id, flow_api_name=plan.flow_api_name, plan=plan, source=text,
                                     subflows=called, requested_profile=requested_profile or "",
                                     source_digest=digest, created_at=db_now())
        except IntegrityError:
            pass  # the same source kept by a concurrent deploy
