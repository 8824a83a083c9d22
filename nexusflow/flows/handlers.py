"""Handler bindings this runtime binary can execute, and what its engine generation runs (seed 004 section 8.4).

Handler functions are never serialized. This module publishes, per handler
reference, the implementation version compiled into this binary
(:data:`IN_BINARY_HANDLERS`). At claim the runtime rebuilds the sealed read
view from the persisted ``FlowActionCatalogGeneration`` and accepts a step
only when the plan's pinned entry digest and binding fingerprint equal the
persisted entry *and* the fingerprint recomputed from this binary's own
handler version (:func:`binary_supports`). A mismatch never falls back to a
current registry.

:func:`engine_support_diagnostics` is the activation gate of the current
engine generation: a plan compiles for any profile, but only the shapes the
executor implements today may be activated: the interpreter's elements
(:mod:`.interpreter`) in all three profiles, and PushToConnector effects.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .catalog import CatalogEntry, CatalogSnapshot, binding_fingerprint_of
from .compiler import (
    KIND_CURRENT_READ,
    KIND_DEPENDENCY_WAIT,
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_EMBEDDED,
    KIND_MUTATION,
    KIND_PURE_COMPUTE,
    KIND_TERMINAL,
    PROFILE_ATOMIC,
    PROFILE_DURABLE,
    PROFILE_EMBEDDED,
    Diagnostic,
)
from .interpreter import (
    FILTER_PROCESSOR,
    SORT_PROCESSOR,
    SUPPORTED_ASSIGNMENT_OPERATORS,
    SUPPORTED_ELEMENTS,
    is_relationship,
)
from .producers import RECORD_ID_INPUT, TRIGGER_RECORD_ID, change_event_object
from .schedule import SCHEDULED, ScheduleInvalid, schedule_start
from .step_values import ALARM_OFFSET_UNITS

#: handler_ref -> implementation version compiled into this binary.
IN_BINARY_HANDLERS: dict[str, str] = {
    "nexusflow.flows.handlers.assignments": "1",
    "nexusflow.flows.handlers.decisions": "1",
    "nexusflow.flows.handlers.loops": "1",
    "nexusflow.flows.handlers.collectionProcessors": "1",
    "nexusflow.flows.handlers.recordLookups": "1",
    "nexusflow.flows.handlers.recordCreates": "1",
    "nexusflow.flows.handlers.recordUpdates": "1",
    "nexusflow.flows.handlers.recordDeletes": "1",
    "runtime_outbox.services.outbound_command_author": "1",
    "runtime_outbox.delivery.email_send": "1",
    "runtime_outbox.delivery.notification_send": "1",
}
#: Condition operators the executor evaluates on the trigger record alone.
ENGINE_OPERATORS = frozenset({
    "EqualTo", "NotEqualTo", "IsNull", "IsBlank", "GreaterThan", "GreaterThanOrEqualTo", "LessThan",
    "LessThanOrEqualTo", "Contains", "StartsWith", "EndsWith",
})
#: Operators only data elements' record filters take (Get, Update and Create Records): a collection value.
FILTER_ONLY_OPERATORS = frozenset({"In", "NotIn"})
LITERAL_KINDS = frozenset({"stringValue", "booleanValue", "numberValue"})
#: Value kinds the interpreter computes (formulas also need a compiled AST).
VALUE_KINDS_RUN = LITERAL_KINDS | {"dateValue", "dateTimeValue", "elementReference", "formulaExpression"}
#: Step kinds the executor runs through the element interpreter.
RUNNABLE_KINDS = frozenset({KIND_EMBEDDED, KIND_PURE_COMPUTE, KIND_CURRENT_READ, KIND_MUTATION})
#: The trigger type of an autolaunched flow (no start object): admitted by an operator start, not a save.
AUTOLAUNCHED = "none"


def binary_supports(entry: CatalogEntry, handlers: dict[str, str] | None = None) -> bool:
    """True when this binary executes ``entry`` with exactly the pinned binding fingerprint."""
    table = IN_BINARY_HANDLERS if handlers is None else handlers
    version = table.get(entry.handler_ref or "")
    if version is None or version != entry.handler_version:
        return False
    return binding_fingerprint_of(owner_registration_id=entry.owner_registration_id, handler_ref=entry.handler_ref,
                                  handler_version=version,
                                  descriptor_digest=entry.descriptor_digest) == entry.binding_fingerprint


def published_bindings(snapshot: CatalogSnapshot) -> list[tuple[str, str, str, str, str, str]]:
    """The ``(binding digest, generation, action type, handler ref, entry digest, fingerprint)`` tuples
    this binary can execute for one sealed generation (section 8.4)."""
    return sorted(
        (snapshot.binding.digest, snapshot.generation_id, e.action_type, e.handler_ref or "", e.entry_digest,
         e.binding_fingerprint)
        for e in snapshot.entries.values() if binary_supports(e)
    )


def _condition_ok(c: dict[str, Any]) -> bool:
    """A trigger filter the admission hook evaluates on the saved record alone."""
    right = c.get("right", c.get("value"))
    left = c.get("left", "$Record." + str(c.get("field")))
    return (c.get("operator") in ENGINE_OPERATORS and isinstance(left, str) and left.startswith("$Record.")
            and left.count(".") == 1 and (right is None or right.get("kind") in LITERAL_KINDS))


def _value_ok(value: dict[str, Any] | None) -> bool:
    if value is None:
        return True
    if value.get("kind") == "formulaExpression":
        return value.get("ast") is not None
    return value.get("kind") in VALUE_KINDS_RUN


#: Node keys whose text value is a reference the interpreter resolves.
REFERENCE_KEYS = frozenset({"left", "target", "collection", "input_reference", "output_reference", "item"})


def traverses_relationship(ref: Any) -> bool:
    """Does ``ref`` read past a record's own fields (``$Record.Property__r.Broker__r.Name``)?

    The interpreter resolves each relationship segment of such a path by
    reading the related record (its lookup field, from the metadata view);
    :func:`_traversal_blockers` refuses a path whose inner segment is not a
    relationship, and an assignment into a related record.
    """
    if not isinstance(ref, str):
        return False
    _head, _, rest = ref.partition(".")
    return len([part for part in rest.split(".") if part]) > 1


def _references(value: Any) -> list[str]:
    """Every reference named in a node, a value or a formula AST (``["ref", name]``)."""
    out: list[str] = []
    if isinstance(value, dict):
        if value.get("kind") == "elementReference" and isinstance(value.get("value"), str):
            out.append(value["value"])
        for key, inner in value.items():
            if key in REFERENCE_KEYS and isinstance(inner, str):
                out.append(inner)
            elif isinstance(inner, (dict, list)):
                out.extend(_references(inner))
    elif isinstance(value, list):
        if len(value) == 2 and value[0] == "ref" and isinstance(value[1], str):
            out.append(value[1])
        else:
            for inner in value:
                out.extend(_references(inner))
    return out


def _traversal_blockers(value: Any) -> list[tuple[str, str]]:
    """``(feature, detail)`` for each path that reads past a value that is not a relationship."""
    out = []
    for ref in dict.fromkeys(_references(value)):
        if traverses_relationship(ref):
            inner = [part for part in ref.split(".")[1:-1] if part]
            bad = [part for part in inner if not is_relationship(part)]
            if bad:
                out.append(("reference", f"{ref}: {bad[0]} is not a relationship; only a relationship "
                                         "(X__r, or a standard one) is read through"))
    return out


def _node_blockers(node: dict[str, Any]) -> list[tuple[str, str]]:
    """``(feature, detail)`` for each part of one element the interpreter cannot run."""
    kind = node.get("type")
    out: list[tuple[str, str]] = []
    if kind not in SUPPORTED_ELEMENTS:
        return [(f"element:{kind}", f"the executor has no {kind} interpreter")]
    out.extend(_traversal_blockers(node))
    if kind == "assignments":
        for item in node.get("items", []):
            if traverses_relationship(item.get("target")):
                out.append(("reference", f"{item.get('target')}: a related record's field is not assigned"))
            if item.get("operator") not in SUPPORTED_ASSIGNMENT_OPERATORS:
                out.append(("assignment", f"operator {item.get('operator')} is not executed"))
            if not _value_ok(item.get("value")):
                out.append(("value", f"{item.get('target')}: value kind {item.get('value', {}).get('kind')}"))
    elif kind == "decisions":
        for rule in node.get("rules", []):
            if rule.get("requires_change"):
                out.append(("decision", f"rule {rule.get('name')} needs the record's change set"))
            for c in rule.get("conditions", []):
                if c.get("operator") not in ENGINE_OPERATORS or not _value_ok(c.get("right")):
                    out.append(("decision", f"rule {rule.get('name')}: {c.get('operator')} is not evaluated"))
    elif kind == "collectionProcessors":
        if node.get("processor") not in (FILTER_PROCESSOR, SORT_PROCESSOR):
            out.append(("collection_processor", f"{node.get('processor')} is not executed"))
        for c in node.get("conditions", []):
            if c.get("operator") not in ENGINE_OPERATORS or not _value_ok(c.get("right")):
                out.append(("collection_processor", f"condition {c.get('operator')} is not evaluated"))
    elif kind in ("recordLookups", "recordUpdates", "recordCreates", "recordDeletes"):
        for f in node.get("filters", []):
            if f.get("operator") not in ENGINE_OPERATORS | FILTER_ONLY_OPERATORS or not _value_ok(f.get("value")):
                out.append(("record_filter", f"{f.get('field')} {f.get('operator')} is not evaluated"))
        for a in node.get("assignments", []):
            if not _value_ok(a.get("value")):
                out.append(("value", f"{a.get('field')}: value kind {a.get('value', {}).get('kind')}"))
    return out


def _record_event_blockers(event: dict[str, Any], trigger: dict[str, Any]) -> list[tuple[str, str]]:
    """``(feature, detail)`` for a record event (``<Object>ChangeEvent``) the executor cannot wait on.

    Runs: an event on the flow's own trigger object, watching the triggering
    record (``RecordId`` absent or ``$Record.Id``), whose other inputs are
    ``field = value`` resume conditions with a literal or reference value
    (docs/operations.md "Waiting for a record").
    """
    name, inputs = event.get("name"), event.get("inputs") or {}
    object_name = change_event_object(event.get("event_type"))
    if trigger.get("trigger_type") != "RecordAfterSave" or object_name != trigger.get("object"):
        return [("wait_event:record", f"event {name}: {event.get('event_type')} waits on a record of "
                                      f"{object_name}; only a record-triggered flow's own trigger object is watched")]
    out = []
    record_id = inputs.get(RECORD_ID_INPUT)
    if record_id is not None and (record_id.get("kind"), record_id.get("value")) != ("elementReference",
                                                                                      TRIGGER_RECORD_ID):
        out.append(("wait_event:RecordId", f"event {name}: RecordId must be {TRIGGER_RECORD_ID} (the triggering "
                                           "record)"))
    match = {k: v for k, v in inputs.items() if k != RECORD_ID_INPUT}
    if not match:
        out.append(("wait_event:resume_condition", f"event {name}: a record event needs at least one "
                                                   "field = value resume condition"))
    for field, value in sorted(match.items()):
        if not _value_ok(value) or (value or {}).get("kind") == "formulaExpression":
            out.append(("wait_event:resume_condition", f"event {name}: {field} needs a literal or reference value"))
    return out


def _alarm_event_blockers(event: dict[str, Any]) -> list[tuple[str, str]]:
    """``(feature, detail)`` for an ``AlarmEvent`` whose time the executor cannot compute."""
    name, inputs = event.get("name"), event.get("inputs") or {}
    out = []
    if inputs.get("AlarmTime") is None or not _value_ok(inputs["AlarmTime"]):
        out.append(("wait_event:AlarmTime", f"event {name}: AlarmTime needs a value the executor reads"))
    unit = inputs.get("TimeOffsetUnit")
    if inputs.get("TimeOffset") is not None:
        if not _value_ok(inputs["TimeOffset"]) or (inputs["TimeOffset"].get("kind") not in (
                "numberValue", "elementReference", "formulaExpression")):
            out.append(("wait_event:TimeOffset", f"event {name}: TimeOffset is not a number"))
        if unit is None or unit.get("kind") != "stringValue" or unit.get("value") not in ALARM_OFFSET_UNITS:
            out.append(("wait_event:TimeOffsetUnit",
                        f"event {name}: TimeOffsetUnit must be one of {', '.join(sorted(ALARM_OFFSET_UNITS))}"))
    return out


def _wait_blockers(step: dict[str, Any], trigger: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """``(feature, detail)`` for each part of a Wait element the wait executor cannot run.

    Runs: ``AlarmEvent`` events with an ``AlarmTime`` value and, when a
    ``TimeOffset`` is given, a literal ``TimeOffsetUnit`` of Hours or Days;
    at most one record event (:func:`_record_event_blockers`); waiting
    conditions the decision evaluator runs.
    """
    out: list[tuple[str, str]] = _traversal_blockers(step)
    record_events = [e for e in step.get("events") or [] if change_event_object(e.get("event_type"))]
    if len(record_events) > 1:
        out.append(("wait_event:record", f"wait {step.get('element')}: at most one record event per Wait element"))
    for event in step.get("events") or []:
        name = event.get("name")
        if change_event_object(event.get("event_type")):
            out += _record_event_blockers(event, trigger or {})
        elif event.get("event_type") == "AlarmEvent":
            out += _alarm_event_blockers(event)
        else:
            out.append((f"wait_event:{event.get('event_type')}",
                        f"event {name}: only AlarmEvent (a time) and <Object>ChangeEvent (a record) waits "
                        "in this engine generation"))
            continue
        for c in event.get("conditions") or []:
            if c.get("operator") not in ENGINE_OPERATORS or not _value_ok(c.get("right")):
                out.append(("wait_event:condition", f"event {name}: {c.get('operator')} is not evaluated"))
    return out


#: Seconds per ``offsetUnit`` of a record-triggered scheduled path.
PATH_OFFSET_UNITS = {"Minutes": 60, "Hours": 3600, "Days": 86400}
#: The scheduled-path time sources the executor reads: the triggering save, or a date/time field of the record.
PATH_TIME_SOURCES = ("RecordTriggerEvent", "RecordField")
#: The largest offset of a scheduled path, in seconds (100 years either way): a larger one is refused at activation.
PATH_MAX_OFFSET_SECONDS = 100 * 366 * 86400


def _scheduled_path_blockers(path: dict[str, Any]) -> list[tuple[str, str]]:
    """``(feature, detail)`` for a scheduled path the executor cannot time (docs/operations.md "Scheduled paths")."""
    name = path.get("name")
    if path.get("path_type") == "AsyncAfterCommit":
        return []
    out = []
    if path.get("time_source") not in PATH_TIME_SOURCES:
        out.append(("scheduled_path:time_source", f"path {name}: time source {path.get('time_source')} "
                                                  f"is not one of {', '.join(PATH_TIME_SOURCES)}"))
    if path.get("time_source") == "RecordField" and not isinstance(path.get("record_field"), str):
        out.append(("scheduled_path:record_field", f"path {name}: a RecordField time source names its field"))
    if path.get("unit") not in PATH_OFFSET_UNITS:
        out.append(("scheduled_path:unit", f"path {name}: offset unit {path.get('unit')} is not one of "
                                           f"{', '.join(PATH_OFFSET_UNITS)}"))
    try:
        offset = int(str(path.get("offset")))
    except ValueError:
        out.append(("scheduled_path:offset", f"path {name}: offset {path.get('offset')!r} is not a whole number"))
    else:
        if abs(offset) * PATH_OFFSET_UNITS.get(path.get("unit"), 1) > PATH_MAX_OFFSET_SECONDS:
            out.append(("scheduled_path:offset", f"path {name}: offset {offset} {path.get('unit')} is more than "
                                                 f"{PATH_MAX_OFFSET_SECONDS // 86400} days"))
    return out


def subflow_digests_of(payload: dict[str, Any]) -> list[str]:
    """The plan digests of the subflows a plan payload calls directly (durable steps and graph nodes), sorted."""
    found = set()
    for step in payload.get("steps", []):
        for node in step.get("graph", [step]):
            if node.get("type") == "subflows" and node.get("subflow_plan_digest"):
                found.add(node["subflow_plan_digest"])
    return sorted(found)


def compiled_subflow_payloads(compiled) -> dict[str, dict[str, Any]]:
    """The plan payloads of every subflow a :class:`CompiledPlan` calls, transitively, by plan digest."""
    out: dict[str, dict[str, Any]] = {}
    pending = list(compiled.subflow_plans.values())
    while pending:
        child = pending.pop()
        if child.plan_digest not in out:
            out[child.plan_digest] = child.payload
            pending.extend(child.subflow_plans.values())
    return out


def _subflow_blockers(node: dict[str, Any], snapshot: CatalogSnapshot, subflows: Mapping[str, dict[str, Any]],
                      *, inline: bool) -> list[Diagnostic]:
    """What keeps a subflow element from running: its plan missing from the deployed set, a durable child
    called inside one transaction (``inline``), or any blocker of the child plan itself (its element path
    prefixed with ``<element> > <flow>``)."""
    element, flow = node.get("element"), node.get("flow")
    child = subflows.get(node.get("subflow_plan_digest"))
    if child is None:
        return [Diagnostic("engine_unsupported:subflow_missing", element,
                           f"the plan of subflow {flow} ({node.get('subflow_plan_digest')}) is not deployed in "
                           "this org; deploy it with its caller")]
    out = []
    if inline and "graph" not in child["steps"][0]:
        out.append(Diagnostic("engine_unsupported:subflow", element, f"subflow {flow} is a "
                              f"{child.get('profile')} plan; a {PROFILE_ATOMIC} graph runs its subflows inline"))
    if child.get("trigger", {}).get("trigger_type") != AUTOLAUNCHED:
        out.append(Diagnostic("engine_unsupported:subflow", element, f"subflow {flow} has a start trigger; only "
                              "an autolaunched flow is called as a subflow"))
    for d in engine_support_diagnostics(child, snapshot, subflows):
        out.append(Diagnostic(d.code, f"{element} > {flow}" + (f" > {d.element}" if d.element else ""), d.message))
    return out


def engine_support_diagnostics(payload: dict[str, Any], snapshot: CatalogSnapshot,
                               subflows: Mapping[str, dict[str, Any]] | None = None) -> list[Diagnostic]:
    """What in a compiled plan this engine generation cannot run (empty list: activatable).

    The executor runs (seed 004 sections 9.1-9.3): Embedded Before-Save plans
    on before-save record triggers; Bounded Atomic and Durable Orchestration
    plans on after-save record triggers (with scheduled paths and
    changed-record entry criteria), on schedule-triggered starts (``Once``,
    ``Daily`` or ``Weekly``: one run per matching record per occurrence), or autolaunched (no start object,
    started by ``flows start`` with input variables), whose elements are assignments,
    decisions, loops, record lookups/updates/creates, PushToConnector
    effects and Wait elements of ``AlarmEvent`` time events. A reference that reads through a relationship
    (``engine_unsupported:reference``) is refused in every profile. Codes:
    ``engine_unsupported:<feature>``; ``element`` names the step element (or
    the formula). A subflow element runs when the plan it was compiled against
    is among ``subflows`` (plan payloads by plan digest: the org's deployed
    plans at activation, the folder's at inventory) and that plan runs too.
    """
    out: list[Diagnostic] = []
    subflows = subflows or {}

    def bad(feature: str, element: str | None, detail: str) -> None:
        out.append(Diagnostic(f"engine_unsupported:{feature}", element, detail))

    profile = payload.get("profile")
    trigger = payload.get("trigger", {})
    wanted = (("RecordBeforeSave",) if profile == PROFILE_EMBEDDED
              else ("RecordAfterSave", "RecordBeforeDelete", AUTOLAUNCHED, SCHEDULED))
    if profile not in (PROFILE_EMBEDDED, PROFILE_ATOMIC, PROFILE_DURABLE):
        bad("profile", None, f"unknown profile {profile}")
    if trigger.get("trigger_type") not in wanted or (trigger.get("trigger_type") == AUTOLAUNCHED
                                                     and trigger.get("object")):
        bad("trigger", "start", f"{profile} plans are admitted on {' or '.join(wanted)} starts, "
                                f"not {trigger.get('trigger_type')}")
    if trigger.get("filter_formula"):
        bad("trigger", "start", "filter formulas are not admitted yet")
    if trigger.get("trigger_type") == SCHEDULED:
        try:
            schedule_start(trigger.get("schedule"))
        except ScheduleInvalid as exc:
            bad("schedule", "start", str(exc))
    for path in trigger.get("scheduled_paths") or []:
        for feature, detail in _scheduled_path_blockers(path):
            bad(feature, "start", detail)
    for f in trigger.get("filters", []):
        if f.get("operator") == "IsChanged" and trigger.get("trigger_type") in ("RecordAfterSave", "RecordBeforeSave") \
                and (f.get("value") or {}).get("kind") == "booleanValue":
            continue  # a save's admission compares the values being saved with the ones they replace
        if not _condition_ok(f):
            bad("trigger", "start", f"filter {f.get('field')} {f.get('operator')} is not evaluated at admission")
    for name, ast in sorted((payload.get("formulas") or {}).items()):
        for feature, detail in _traversal_blockers(ast):
            bad(feature, name, detail)
    for step in payload.get("steps", []):
        kind, element = step.get("kind"), step.get("element")
        if kind == KIND_TERMINAL or kind == KIND_EFFECT_COMPLETION:
            continue
        if kind == KIND_EFFECT_SUBMIT:
            entry = snapshot.entries.get(step.get("action_key"))
            if entry is None or not binary_supports(entry):
                bad("handler", element, f"{step.get('action_key')} has no handler binding in this binary")
            continue
        if kind == KIND_DEPENDENCY_WAIT and step.get("type") == "scheduled_path":
            continue  # its path is checked with the trigger above
        if kind == KIND_DEPENDENCY_WAIT and step.get("type") == "waits":
            for feature, detail in _wait_blockers(step, trigger):
                bad(feature, element, detail)
            continue
        if kind == KIND_DEPENDENCY_WAIT and step.get("type") == "subflows":  # a child FlowRun
            for feature, detail in _traversal_blockers(step):
                bad(feature, element, detail)
            out.extend(_subflow_blockers(step, snapshot, subflows, inline=False))
            continue
        if kind not in RUNNABLE_KINDS:
            bad(f"step:{kind}", element, f"the executor has no {kind} handler for {step.get('type', kind)} yet")
            continue
        nodes = step.get("graph") if "graph" in step else [step]
        for node in nodes:
            for feature, detail in _node_blockers(node):
                bad(feature, node.get("element"), detail)
            if node.get("type") == "subflows":
                out.extend(_subflow_blockers(node, snapshot, subflows, inline=True))
            entry = snapshot.entries.get(node.get("action_key")) if node.get("action_key") else None
            if node.get("action_key") and (entry is None or not binary_supports(entry)):
                bad("handler", node.get("element"), f"{node.get('action_key')} has no handler binding in this binary")
    return out
