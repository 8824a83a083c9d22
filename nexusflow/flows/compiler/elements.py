"""Element pass: each executable element resolved to its catalog entry, its data and its edges (section 7.2 steps 2-3).

:func:`resolve_elements` reads every named element of an executable kind
into a :class:`~.context._Node`: normalized values and conditions, record
filters and assignments, action inputs checked against the catalog
descriptor, wait events, and the success / fault / rule / loop / wait edges.
A subflow element compiles the flow it names (recursion and depth checked)
and inherits its unknown capabilities and blockers.
"""
from __future__ import annotations

from typing import Any

from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key

from ..catalog import CatalogEntry, action_key
from ..errors import Diagnostic
from ..producers import RECORD_ID_INPUT, change_event_object
from .constants import (
    ASSIGNMENT_OPERATORS,
    ELEMENT_ENTRY,
    MAX_SUBFLOW_DEPTH,
    NAME_RE,
    OPERATORS,
    RECORD_ID_REF,
    REJECTED_ELEMENTS,
    VALUE_KINDS,
)
from .context import CompileContext, _Node
from .document import check_object, check_object_field, check_record_field, filter_of, formula_ast
from .values import _as_list, _bool_text, _normalize_logic, _target, normalize_value


def resolve_elements(ctx: CompileContext) -> None:
    """Read every element into ``ctx.nodes`` with its catalog entry (or unknown capability) and its edges."""
    for kind in ("assignments", "decisions", "loops", "collectionProcessors", "recordLookups",
                 "recordCreates", "recordUpdates", "recordDeletes", "actionCalls", "subflows", "waits"):
        for name, body in ctx.doc.elements(kind).items():
            if not NAME_RE.match(name):
                ctx.diag("invalid_element_name", name, "element names are letters, digits and '_'")
                continue
            for dup in body.get("__duplicated__", []):
                ctx.diag(f"duplicate_element:{dup}", name, f"<{dup}> appears more than once")
            node = _Node(name, kind, body)
            _READERS[kind](ctx, node)
            if kind in ELEMENT_ENTRY:
                node.entry = ctx.catalog.entries.get(ELEMENT_ENTRY[kind])
                if node.entry is None:
                    node.unknown = ELEMENT_ENTRY[kind]
            ctx.nodes[name] = node
    for kind in REJECTED_ELEMENTS:
        for name, body in ctx.doc.elements(kind).items():
            node = _Node(name, kind, body)
            node.edges = [("success", _target(body.get("connector")))] if isinstance(body, dict) else []
            ctx.nodes[name] = node
    for node in ctx.nodes.values():
        if node.unknown:
            ctx.analysis.unknown_capabilities.append(node.unknown)
        if isinstance(node.body, dict) and "faultConnector" in node.body:
            node.edges.append(("fault", _target(node.body.get("faultConnector"))))


def resolve_value(ctx: CompileContext, raw: Any, element: str) -> dict[str, Any] | None:
    """A ``<value>`` normalized, its formula parsed; None when absent."""
    value = normalize_value(raw)
    if value is None:
        return None
    if value["kind"] not in VALUE_KINDS:
        ctx.diag(f"unsupported_value:{value['kind']}", element)
    elif value["kind"] == "formulaExpression":
        value["ast"] = formula_ast(ctx, element, value["value"])
    return value


def condition_of(ctx: CompileContext, raw: Any, element: str) -> dict[str, Any] | None:
    """One decision condition as ``{"left", "operator", "right"}``; None for an empty condition."""
    if not isinstance(raw, dict):
        ctx.diag("invalid_decision:condition", element, "empty condition")
        return None
    left, op = raw.get("leftValueReference"), raw.get("operator")
    if op not in OPERATORS:
        ctx.diag(f"unsupported_operator:{op}", element)
    if isinstance(left, str) and left.startswith("$Record.") and left.count(".") == 1:
        check_record_field(ctx, left.split(".", 1)[1], element)
    return {"left": left, "operator": op, "right": resolve_value(ctx, raw.get("rightValue"), element)}


def conditions_of(ctx: CompileContext, raw: dict[str, Any], element: str, where: str) -> tuple[list, Any]:
    """The conditions of ``raw`` and their logic (``and``/``or`` or a custom logic AST)."""
    conds = [c for c in (condition_of(ctx, x, element) for x in _as_list(raw.get("conditions"))) if c]
    try:
        logic = _normalize_logic(raw.get("conditionLogic"), len(conds))
    except ValueError as exc:
        ctx.diag(f"unsupported_condition_logic:{where}", element, str(exc))
        logic = "and"
    return conds, logic


def _el_assignments(ctx: CompileContext, node: _Node) -> None:
    items = []
    for item in _as_list(node.body.get("assignmentItems")):
        if not isinstance(item, dict):
            continue
        op = item.get("operator")
        if op not in ASSIGNMENT_OPERATORS:
            ctx.diag(f"unsupported_operator:{op}", node.name)
        items.append({"target": item.get("assignToReference"), "operator": op,
                      "value": resolve_value(ctx, item.get("value"), node.name)})
    if not items:
        ctx.diag("invalid_decision:assignment", node.name, "an assignment needs at least one item")
    node.data = {"items": items}
    node.edges = [("success", _target(node.body.get("connector")))]


def _el_decisions(ctx: CompileContext, node: _Node) -> None:
    rules = []
    for rule in _as_list(node.body.get("rules")):
        if not isinstance(rule, dict) or not isinstance(rule.get("name"), str):
            ctx.diag("missing_element_name", node.name, "a rule has no name")
            continue
        if not rule.get("conditions"):
            ctx.diag(f"invalid_decision:{rule['name']}", node.name, "a rule needs at least one condition")
        conds, logic = conditions_of(ctx, rule, node.name, rule["name"])
        rules.append({"name": rule["name"], "logic": logic, "conditions": conds,
                      "requires_change": _bool_text(rule.get("doesRequireRecordChangedToMeetCriteria"))})
        node.edges.append((f"rule:{rule['name']}", _target(rule.get("connector"))))
    if not rules:
        ctx.diag(f"invalid_decision:{node.name}", node.name, "a decision needs at least one rule")
    node.edges.append(("default", _target(node.body.get("defaultConnector"))))
    node.data = {"rules": rules}


def _el_loops(ctx: CompileContext, node: _Node) -> None:
    coll = node.body.get("collectionReference")
    if not isinstance(coll, str):
        ctx.diag("invalid_loop:collection", node.name, "a loop needs a collectionReference")
    node.data = {"collection": coll, "order": node.body.get("iterationOrder") or "Asc",
                 "item": node.body.get("assignNextValueToReference")}
    node.edges = [("loop_next", _target(node.body.get("nextValueConnector"))),
                  ("loop_done", _target(node.body.get("noMoreValuesConnector")))]


def _el_collectionProcessors(ctx: CompileContext, node: _Node) -> None:  # named after the element
    conds, logic = conditions_of(ctx, node.body, node.name, node.name)
    sort = [{"field": o.get("sortField"), "order": o.get("sortOrder") or "Asc",
             "nulls_first": _bool_text(o.get("doesPutEmptyStringAndNullFirst"))}
            for o in _as_list(node.body.get("sortOptions")) if isinstance(o, dict)]
    limit = node.body.get("limit")
    node.data = {"collection": node.body.get("collectionReference"),
                 "processor": node.body.get("collectionProcessorType"), "conditions": conds, "logic": logic,
                 "current_item": node.body.get("assignNextValueToReference"), "sort": sort,
                 "limit": int(limit) if isinstance(limit, str) and limit.isdigit() else None}
    node.edges = [("success", _target(node.body.get("connector")))]


def _record_element(ctx: CompileContext, node: _Node) -> None:
    body = node.body
    obj = body.get("object")
    if obj is not None:
        check_object(ctx, obj, node.name)
    filters = [filter_of(ctx, f, node.name, record_object=False) for f in _as_list(body.get("filters"))]
    filters = [f for f in filters if f is not None]
    try:
        logic = _normalize_logic(body.get("filterLogic"), len(filters))
    except ValueError as exc:
        ctx.diag("unsupported_filter_logic", node.name, str(exc))
        logic = "and"
    assignments = [{"field": a.get("field"), "value": resolve_value(ctx, a.get("value"), node.name)}
                   for a in _as_list(body.get("inputAssignments")) if isinstance(a, dict)]
    # The fields an element writes or filters on must exist on its object: the named object, or the
    # trigger object for an Update Records on $Record.
    target = obj if obj is not None else (ctx.trigger.get("object") if body.get("inputReference") == "$Record"
                                          else None)
    for name in [a["field"] for a in assignments] + [f["field"] for f in filters]:
        check_object_field(ctx, target, name, node.name)
    node.data = {"object": obj, "input_reference": body.get("inputReference"), "filters": filters,
                 "filter_logic": logic, "assignments": assignments,
                 "first_only": _bool_text(body.get("getFirstRecordOnly")),
                 "output_reference": body.get("outputReference"),
                 "fields": sorted(x for x in _as_list(body.get("queriedFields")) if isinstance(x, str))}
    if obj is None and body.get("inputReference") is None:
        ctx.diag("unresolved_reference:object", node.name, "names neither an object nor an inputReference")
    node.edges = [("success", _target(body.get("connector")))]


def _el_actionCalls(ctx: CompileContext, node: _Node) -> None:
    action_type, action_name = node.body.get("actionType"), node.body.get("actionName")
    if not isinstance(action_type, str) or not isinstance(action_name, str):
        ctx.diag("unknown_action:none", node.name, "an action call names actionType and actionName")
        return
    key = action_key(action_type, action_name)
    entry = ctx.catalog.entries.get(key)
    node.edges = [("success", _target(node.body.get("connector")))]
    params = {p.get("name"): p.get("value") for p in _as_list(node.body.get("inputParameters"))
              if isinstance(p, dict)}
    quick = ctx.view.quick_actions.get(action_name) if action_type == QUICK_ACTION else None
    if quick is not None:
        _quick_action_create(ctx, node, quick, params)
        return
    node.data = {"action_key": key, "inputs": {}}
    if entry is None:
        node.unknown = key
        ctx.diag(f"unknown_action:{key}", node.name,
                 "no capability descriptor in the sealed catalog; unknown capabilities fail closed")
        return
    if not entry.executable:
        ctx.diag(f"capability_not_executable:{key}", node.name, "reserved, contract-only action")
    node.entry = entry
    node.data["inputs"] = _action_inputs(ctx, node.name, entry, params)


#: The ``actionType`` of a quick action call.
QUICK_ACTION = "quickAction"
#: The quick action input that names the record the action runs in the context of.
QUICK_ACTION_CONTEXT = "contextId"


def _quick_action_create(ctx: CompileContext, node: _Node, quick, given: dict[str, Any]) -> None:
    """Lower a record-creating quick action the metadata view declares to a Create Records element.

    The element creates one ``quick.target_object`` record: the action's field defaults, ``contextId`` in
    its context field, any other input named after a target field. It then runs under the sealed catalog's
    Create Records capability (``element:recordCreates``), like any Create Records element.
    """
    values: dict[str, Any] = {name: {"kind": "stringValue", "value": value}
                              for name, value in sorted(quick.field_defaults.items())}
    for pname in sorted(k for k in given if isinstance(k, str)):
        field = quick.context_field if pname == QUICK_ACTION_CONTEXT else pname
        if field is None:
            ctx.diag(f"unexpected_action_input:{pname}", node.name, f"{quick.name} takes no context record")
            continue
        check_object_field(ctx, quick.target_object, field, node.name)
        values[field] = resolve_value(ctx, given[pname], node.name)
    node.kind = "recordCreates"
    node.entry = ctx.catalog.entries.get(ELEMENT_ENTRY["recordCreates"])
    if node.entry is None:
        node.unknown = ELEMENT_ENTRY["recordCreates"]
    node.data = {"object": quick.target_object, "input_reference": None, "filters": [], "filter_logic": "and",
                 "assignments": [{"field": f, "value": v} for f, v in sorted(values.items())],
                 "first_only": False, "output_reference": None, "fields": [], "quick_action": quick.name}


def _action_inputs(ctx: CompileContext, name: str, entry: CatalogEntry, given: dict[str, Any]) -> dict[str, Any]:
    declared = {n: (s, r) for n, s, r in entry.inputs}
    resolved: dict[str, Any] = {}
    for pname in sorted(k for k in given if isinstance(k, str)):
        if pname not in declared:
            ctx.diag(f"unexpected_action_input:{pname}", name)
    for pname, (source, required) in sorted(declared.items()):
        if pname not in given:
            if required:
                ctx.diag(f"missing_action_input:{pname}", name)
            continue
        value = normalize_value(given[pname])
        kind, text = (value["kind"], value["value"]) if value else (None, None)
        if source == "string_literal":
            try:
                if kind != "stringValue":
                    raise InvalidIdentity("expected a string literal")
                resolved[pname] = validate_key(text, field=pname, max_length=80)
            except InvalidIdentity as exc:
                ctx.diag(f"invalid_action_input:{pname}", name, str(exc))
        elif source == "trigger_record_id":
            if kind != "elementReference" or (text or "").strip() != RECORD_ID_REF:
                ctx.diag(f"invalid_action_input:{pname}", name, f"expected {RECORD_ID_REF}")
            else:
                resolved[pname] = RECORD_ID_REF
        else:
            resolved[pname] = resolve_value(ctx, given[pname], name)
    return resolved


def _el_subflows(ctx: CompileContext, node: _Node) -> None:
    flow_name = node.body.get("flowName")
    node.edges = [("success", _target(node.body.get("connector")))]
    node.data = {"flow": flow_name,
                 "inputs": {a.get("name"): resolve_value(ctx, a.get("value"), node.name)
                            for a in _as_list(node.body.get("inputAssignments")) if isinstance(a, dict)}}
    # The child's output variables copied back into the parent's: {parent reference: child variable}. With
    # storeOutputAutomatically the element itself holds them (``<Element>.<variable>``).
    outputs = {a.get("assignToReference"): a.get("name")
               for a in _as_list(node.body.get("outputAssignments")) if isinstance(a, dict)}
    if outputs:
        node.data["outputs"] = outputs
    if _bool_text(node.body.get("storeOutputAutomatically")):
        node.data["store_output"] = True
    if not isinstance(flow_name, str) or not NAME_RE.match(flow_name):
        ctx.diag("unknown_subflow:invalid", node.name, "flowName is not a flow API name")
        return
    if flow_name in ctx.stack or flow_name == ctx.flow_api_name:
        chain = " > ".join((*ctx.stack, ctx.flow_api_name, flow_name))
        ctx.diag(f"recursive_subflow:{flow_name}", node.name, f"subflow cycle {chain}")
        return
    if len(ctx.stack) >= MAX_SUBFLOW_DEPTH:
        ctx.diag("subflow_too_deep", node.name, f"more than {MAX_SUBFLOW_DEPTH} nested subflows")
        return
    source = ctx.subflows.get(flow_name)
    if source is None:
        node.unknown = f"subflow:{flow_name}"
        ctx.diag(f"unknown_subflow:{flow_name}", node.name,
                 "the subflow is not among the compiled flows; its capabilities are unknown")
        return
    child = ctx.analyze(source=source, flow_api_name=flow_name, catalog=ctx.catalog, view=ctx.view,
                        subflows=ctx.subflows, requested_profile=None, schema=ctx.schema,
                        stack=(*ctx.stack, ctx.flow_api_name), bounds=ctx.bounds)
    node.child = child
    for key in child.unknown_capabilities:
        node.unknown = node.unknown or key
    if child.rejected:
        first = child.errors[0] if child.errors else Diagnostic("subflow_rejected", None, "")
        # One diagnostic per child blocker: the path names the exact transitive blocker.
        for d in child.errors:
            if d.family in ("recursive_subflow",):
                ctx.diag(d.code, f"{node.name} > {flow_name} > {d.element}" if d.element else node.name,
                         d.message)
        ctx.diag(f"subflow_rejected:{flow_name}", f"{node.name} > {flow_name}"
                 + (f" > {first.element}" if first.element else ""), f"{first.code}: {first.message}")


def _el_waits(ctx: CompileContext, node: _Node) -> None:
    events = []
    for ev in _as_list(node.body.get("waitEvents")):
        if not isinstance(ev, dict):
            continue
        event_type = ev.get("eventType")
        ev_name = ev.get("name") or "event"
        params = {p.get("name"): resolve_value(ctx, p.get("value"), node.name)
                  for p in _as_list(ev.get("inputParameters")) if isinstance(p, dict)}
        kind = "time" if event_type in ("AlarmEvent", "DateRefAlarmEvent") else "producer"
        watched = change_event_object(event_type)
        if watched is not None:  # a record event: its resume conditions name fields of the watched object
            check_object(ctx, watched, node.name)
            for field_name in sorted(k for k in params if k != RECORD_ID_INPUT):
                check_object_field(ctx, watched, field_name, node.name)
        # The event's waiting conditions: the run waits for it only while they hold (else it is skipped).
        conds, logic = conditions_of(ctx, ev, node.name, ev_name)
        events.append({"name": ev_name, "event_type": event_type, "class": kind, "inputs": params,
                       "conditions": conds, "logic": logic})
        node.edges.append((f"wait:{ev_name}", _target(ev.get("connector"))))
    if not events:
        ctx.diag("unsupported_wait_event:none", node.name, "a wait needs at least one event")
    node.edges.append(("default", _target(node.body.get("defaultConnector"))))
    node.data = {"events": events}


#: Element kind -> the reader that fills its node (the record kinds share one reader).
_READERS = {
    "assignments": _el_assignments, "decisions": _el_decisions, "loops": _el_loops,
    "collectionProcessors": _el_collectionProcessors, "recordLookups": _record_element,
    "recordCreates": _record_element, "recordUpdates": _record_element, "recordDeletes": _record_element,
    "actionCalls": _el_actionCalls, "subflows": _el_subflows, "waits": _el_waits,
}
