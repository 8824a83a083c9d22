"""Embedded Before-Save (seed 004 section 9.1): the records before-save hook.

:func:`flow_before_save` runs the org's active Embedded Before-Save flows on a
record about to be saved, in the caller's record transaction, and returns the
record's new field values.
"""
from __future__ import annotations

from typing import Any

from nexusflow.kernel.clock import db_now
from nexusflow.kernel.scope import OrgScope
from nexusflow.kernel.tuning import setting_number
from nexusflow.records.metadata import current_view
from runtime_outbox.policy import runtime_policy

from ..binding import flow_runtime_binding
from ..compiler import KIND_EMBEDDED, PROFILE_EMBEDDED
from ..conditions import trigger_matches
from ..errors import FlowAdmissionRejected, FlowExecutionError
from ..interpreter import run_graph
from ..selectors import flow_activations_on
from .admission import _step_def
from .execute import _CurrentReader


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
    activations = [activation for activation in flow_activations_on(org_id=org.org_id, object_name=object_name)
                   if activation.plan.execution_profile == PROFILE_EMBEDDED]
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
        if not trigger_matches(trigger, object_name=object_name, created=created, fields=current, prior=prior):
            continue
        step = _step_def(plan, plan.plan_payload["entry_step"])
        if step["kind"] != KIND_EMBEDDED:
            raise FlowExecutionError(f"{plan.flow_api_name}: entry step is {step['kind']}, not embedded")
        outcome = run_graph(plan_payload=plan.plan_payload, graph=step["graph"], entry=step.get("entry_element"),
                            record={"Id": record_key, **current}, object_name=object_name, now=now,
                            reader=_CurrentReader(org.org_id), prior=prior, is_new=created,
                            budget=policy_embedded_budget(), fan_out_limit=runtime_policy(org.org_id).max_fan_out)
        for write in outcome.writes:
            if write.op != "update" or write.object_name != object_name or write.record_key != record_key:
                raise FlowExecutionError(f"{plan.flow_api_name}: before-save output is the trigger record only")
            current.update(write.values)
        for name in outcome.state.get("dirty", []):
            current[name] = outcome.state["record"].get(name)
    return current


def policy_embedded_budget() -> int:
    """Element visits one before-save flow may make (seed 004 section 9.1 "execution budget")."""
    return int(setting_number("NEXUS_FLOW_EMBEDDED_BUDGET", 500))
