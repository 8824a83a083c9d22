"""Recompile the active Flows whose plan-eligibility bounds a runtime policy generation changed (seed 004
section 16.3: "changing a bound that affects plan eligibility makes a new policy generation and recompiles
dependent plans"; docs/operations.md "The runtime policy").

Registered as the runtime policy's published hook (:func:`runtime_outbox.policy.register_policy_published`):
for each org the new generation covers (one org, or every org with an active Flow for the environment's
chain), every active Flow whose plan was compiled under other bounds than the org's policy now sets is
deployed again from the source it was deployed from (:class:`~nexusflow.flows.models.FlowDeploymentSource`),
in its own transaction: a new plan whose ``policy_version`` names the bounds, activated in place of the old
one (runs already admitted keep their plan). A Flow the new bounds refuse keeps its active plan and is
reported with the compiler's diagnostics.
"""
from __future__ import annotations

from typing import Any

from nexusflow.kernel.scope import OrgScope

from .. import transitions as t
from ..errors import ActivationRejected, CompileError
from ..models import FlowActivation, FlowDeploymentSource
from .deploy import flow_deploy, plan_bounds_for


def flow_plans_recompile(*, scope: str) -> list[dict[str, Any]]:
    """Recompile what a new generation of ``scope`` (``*`` or an org id) changed; one report per Flow looked at
    whose bounds differ: ``{"org_id", "flow", "status": "recompiled" | "refused" | "source_missing",
    "from_plan", "to_plan", "from_profile", "to_profile", "policy_version", "diagnostics"}``."""
    active = FlowActivation.objects.filter(state=t.ACTIVATION_ACTIVE)
    if scope != "*":
        active = active.filter(org_id=scope)
    reports: list[dict[str, Any]] = []
    for org_id in sorted(set(active.values_list("org_id", flat=True))):
        org = OrgScope(org_id)
        bounds = plan_bounds_for(org)
        for activation in (FlowActivation.objects.filter(org_id=org_id, state=t.ACTIVATION_ACTIVE)
                           .select_related("plan").order_by("flow_api_name")):
            plan = activation.plan
            if plan.policy_version == bounds.version:
                continue
            report: dict[str, Any] = {"org_id": org_id, "flow": activation.flow_api_name, "from_plan": plan.plan_id,
                                      "from_profile": plan.execution_profile, "policy_version": bounds.version}
            kept = FlowDeploymentSource.objects.filter(org_id=org_id, plan=plan).order_by("-created_at").first()
            if kept is None:
                reports.append({**report, "status": "source_missing"})
                continue
            try:
                result = flow_deploy(org=org, source=kept.source, flow_api_name=activation.flow_api_name,
                                     subflows={name: text.encode() for name, text in kept.subflows.items()} or None,
                                     requested_profile=kept.requested_profile or None)
            except (CompileError, ActivationRejected) as exc:
                reports.append({**report, "status": "refused", "code": exc.code,
                                "diagnostics": [{"code": d.code, "element": d.element, "detail": d.message}
                                                for d in getattr(exc, "diagnostics", [])]})
                continue
            reports.append({**report, "status": "recompiled", "to_plan": result.plan.plan_id,
                            "to_profile": result.plan.execution_profile,
                            "diagnostics": [result.plan.diagnostic_summary]})
    return reports
