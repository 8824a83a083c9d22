"""Document-level pass: packaging tokens, process type, resources and formulas, the start and its trigger.

Seed 004 section 7.2 steps 1-2 on the normalized document of
:func:`nexusflow.flows.frontend.parse_flow_document`: what the flow is
(process type, rejected interactive elements), its resources (formulas and
text templates parsed here), and its ``<start>``: the record trigger
(object, trigger type, filters, scheduled paths) and the entry connectors.
Objects and fields are checked against a strict metadata view.
"""
from __future__ import annotations

from typing import Any

from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key

from .. import formula as fx
from .constants import (
    OPERATORS,
    PACKAGING_TOKEN,
    PROCESS_TYPE_REASONS,
    RECORD_TRIGGER_TYPES,
    REJECTED_ELEMENTS,
    RESOURCE_KINDS,
    SUPPORTED_PROCESS_TYPES,
    TRIGGER_TYPES,
    VALUE_KINDS,
)
from .context import CompileContext
from .values import _as_list, _bool_text, _normalize_logic, _target, normalize_value


def check_packaging_tokens(ctx: CompileContext, data: dict[str, Any]) -> None:
    """``unresolved_packaging_token`` for every ``%%%...%%%`` placeholder left in the start or an element."""

    def walk(value: Any, element: str | None) -> None:
        if isinstance(value, str):
            if PACKAGING_TOKEN in value:
                ctx.diag("unresolved_packaging_token", element,
                         "a %%%...%%% packaging placeholder must be resolved before the flow is compiled")
        elif isinstance(value, dict):
            for v in value.values():
                walk(v, element)
        elif isinstance(value, list):
            for v in value:
                walk(v, element)

    walk(data.get("start"), "start")
    for _kind, named in data["elements"].items():
        for name, body in named.items():
            walk(body, name)


def check_process_type(ctx: CompileContext, data: dict[str, Any]) -> None:
    """Reject a process type other than an autolaunched flow, and every interactive or foreign element."""
    process_type = data.get("process_type")
    if process_type not in SUPPORTED_PROCESS_TYPES:
        reason = PROCESS_TYPE_REASONS.get(process_type or "", "only autolaunched flows are compiled")
        ctx.diag(f"unsupported_process_type:{process_type or 'none'}", None, reason)
    for kind, what in REJECTED_ELEMENTS.items():
        for name in ctx.doc.elements(kind):
            ctx.diag(f"unsupported_element:{kind}", name, f"{what} elements are parsed and rejected")
    for tag in data["other"]:
        ctx.diag(f"unsupported_element:{tag}", None, f"<{tag}> is not part of the compiled metadata")


def collect_resources(ctx: CompileContext) -> None:
    """Index the resources (variables, constants, formulas, templates...) by name; parse formulas and templates."""
    for kind in RESOURCE_KINDS:
        for name, body in ctx.doc.elements(kind).items():
            ctx.resources[name] = (kind, body)
            if kind == "formulas":
                formula_ast(ctx, name, body.get("expression"))
            elif kind == "textTemplates":
                try:
                    fx.parse_template(body.get("text") or "")
                except fx.FormulaError as exc:
                    ctx.diag(f"{exc.code}", name, exc.detail)


def formula_ast(ctx: CompileContext, element: str, expression: Any) -> list | None:
    """The parsed formula ``expression`` of ``element``, or None after reporting why it does not parse."""
    if not isinstance(expression, str):
        ctx.diag("formula_syntax", element, "formula has no expression")
        return None
    if PACKAGING_TOKEN in expression:
        return None  # reported once as unresolved_packaging_token
    try:
        return fx.parse_formula(expression)
    except fx.FormulaError as exc:
        code = f"unknown_function:{exc.detail.upper()}" if exc.code == "unknown_function" else exc.code
        ctx.diag(code, element, exc.detail if exc.code != "unknown_function"
                 else f"function {exc.detail} is not implemented by the expression evaluator")
        return None


def read_start(ctx: CompileContext, data: dict[str, Any]) -> None:
    """Read ``<start>`` into ``ctx.trigger`` (the normalized trigger subscription) and ``ctx.entry_edges``."""
    start = data.get("start")
    ref = data.get("start_element_reference")
    if start is None and ref is None:
        ctx.diag("missing_start", None, "no <start> and no startElementReference")
        return
    if start is None:
        ctx.entry_edges = [("success", ref)]
        return
    if not isinstance(start, dict):
        ctx.diag("unsupported_start:shape", "start", "<start> is empty")
        return
    known = {"connector", "filterLogic", "filters", "object", "recordTriggerType", "triggerType",
             "doesRequireRecordChangedToMeetCriteria", "filterFormula", "scheduledPaths", "schedule",
             "triggerOrder", "__duplicated__"}
    for tag in start:
        if tag not in known:
            ctx.diag(f"unsupported_start:{tag}", "start", f"<start><{tag}> is not supported")
    trigger_type = start.get("triggerType")
    ctx.entry_edges = [("success", _target(start.get("connector")))] if start.get("connector") else []
    if trigger_type is None:
        if start.get("object") is not None or start.get("filters"):
            ctx.diag("unsupported_start:object_without_trigger", "start", "an object needs a trigger type")
        return
    if trigger_type not in TRIGGER_TYPES:
        ctx.diag(f"unsupported_trigger_type:{trigger_type}", "start",
                 "supported: record before/after save, scheduled, platform event")
        return
    trigger: dict[str, Any] = {"trigger_type": trigger_type}
    object_name = start.get("object")
    if object_name is None:
        ctx.diag("unknown_object:none", "start", "the trigger names no object")
    else:
        check_object(ctx, object_name, "start", trigger=True)
    trigger["object"] = object_name
    rtt = start.get("recordTriggerType")
    if trigger_type.startswith("Record"):
        if rtt not in RECORD_TRIGGER_TYPES or (rtt == "Delete") != (trigger_type == "RecordBeforeDelete"):
            ctx.diag(f"unsupported_record_trigger_type:{rtt or 'none'}", "start",
                     "a delete trigger is RecordBeforeDelete with recordTriggerType Delete")
        trigger["record_trigger_type"] = rtt
    trigger["requires_change"] = _bool_text(start.get("doesRequireRecordChangedToMeetCriteria"))
    filters = [filter_of(ctx, f, "start", record_object=True) for f in _as_list(start.get("filters"))]
    trigger["filters"] = [f for f in filters if f is not None]
    try:
        trigger["filter_logic"] = _normalize_logic(start.get("filterLogic"), len(trigger["filters"]))
    except ValueError as exc:
        ctx.diag("unsupported_filter_logic", "start", str(exc))
        trigger["filter_logic"] = "and"
    formula = start.get("filterFormula")
    trigger["filter_formula"] = formula_ast(ctx, "start", formula) if formula is not None else None
    schedule = start.get("schedule")
    trigger["schedule"] = schedule if isinstance(schedule, dict) else None
    if trigger_type == "Scheduled" and not isinstance(schedule, dict):
        ctx.diag("unsupported_start:schedule", "start", "a scheduled trigger needs a schedule")
    paths = []
    for path in _as_list(start.get("scheduledPaths")):
        if not isinstance(path, dict):
            continue
        label = path.get("name") or path.get("pathType") or "path"
        paths.append({"name": label, "path_type": path.get("pathType"),
                      "offset": path.get("offsetNumber"), "unit": path.get("offsetUnit"),
                      "time_source": path.get("timeSource"), "record_field": path.get("recordField")})
        ctx.entry_edges.append((f"scheduled:{label}", _target(path.get("connector"))))
    trigger["scheduled_paths"] = paths
    if paths and trigger_type != "RecordAfterSave":
        ctx.diag("unsupported_start:scheduledPaths", "start", "scheduled paths need an after-save trigger")
    ctx.trigger = trigger


def check_object(ctx: CompileContext, name: Any, element: str, *, trigger: bool = False) -> None:
    """Check an object name; a strict view must define it (the trigger object's fields are kept)."""
    if not isinstance(name, str):
        ctx.diag("unknown_object:invalid", element, "object name is not text")
        return
    if PACKAGING_TOKEN in name:
        return  # reported once as unresolved_packaging_token
    try:
        validate_key(name, field="object", max_length=80)
    except InvalidIdentity as exc:
        ctx.diag("unknown_object:invalid", element, str(exc))
        return
    if ctx.schema != "strict":
        return
    if name not in ctx.view.objects:
        ctx.diag(f"unknown_object:{name}", element, "object is not in the metadata view")
    elif trigger:
        ctx.object_fields = set(ctx.view.objects[name].fields)


def check_record_field(ctx: CompileContext, field_name: Any, element: str) -> None:
    """``unknown_field:<field>`` when a strict view's trigger object does not define ``field_name``."""
    if ctx.schema == "strict" and ctx.object_fields is not None and field_name not in ctx.object_fields:
        ctx.diag(f"unknown_field:{field_name}", element, "field is not defined on the trigger object")


def check_object_field(ctx: CompileContext, object_name: Any, field_name: Any, element: str) -> None:
    """``unknown_field:<field>`` when a strict view defines ``object_name`` but not ``field_name``.

    ``Id`` (the record key every record has) always resolves; an object the
    view does not define is reported once by :meth:`_object`.
    """
    if ctx.schema != "strict" or field_name == "Id" or not isinstance(object_name, str):
        return
    definition = ctx.view.objects.get(object_name)
    if definition is not None and field_name not in definition.fields:
        ctx.diag(f"unknown_field:{field_name}", element, f"field is not defined on {object_name}")


def filter_of(ctx: CompileContext, raw: Any, element: str, *, record_object: bool) -> dict[str, Any] | None:
    """One record filter as ``{"field", "operator", "value"}``; None for an empty filter."""
    if not isinstance(raw, dict):
        ctx.diag("unsupported_value:filter", element, "empty filter")
        return None
    field_name, op = raw.get("field"), raw.get("operator")
    if op not in OPERATORS:
        ctx.diag(f"unsupported_operator:{op}", element)
    if record_object:
        check_record_field(ctx, field_name, element)
    value = normalize_value(raw.get("value"))
    if value is not None and value["kind"] not in VALUE_KINDS:
        ctx.diag(f"unsupported_value:{value['kind']}", element)
    return {"field": field_name, "operator": op, "value": value}
