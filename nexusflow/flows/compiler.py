"""Flow metadata compiler (seed 004 section 7).

``compile_flow`` turns one Flow metadata document into an immutable
:class:`CompiledPlan`: it parses and normalizes the XML, resolves every
element and action reference through the sealed capability catalog, builds
the control-flow graph from ``start`` along ``connector/targetReference``,
expands each external-effect action into one ``EffectSubmit`` ->
``EffectCompletion`` pair (section 7.5), validates the graph and computes the
plan identity of section 7.3.

The supported subset today: record-triggered after-save start with
EqualTo/NotEqualTo/IsNull filters joined by and/or, catalog actions, and
decisions over ``$Record.<field>``. Every other construct is rejected with a
stable diagnostic code ``<family>:<detail>``; the compiler never raises
anything but :class:`CompileError`.

Element names are matched by XML local name; the metadata namespace is data.
The compiler reads no tenant record and no runtime traffic.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any
from xml.parsers import expat

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2, digest_json_v2, digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.records.metadata import MetadataView

from .binding import RuntimeWorkBinding
from .catalog import CatalogEntry, CatalogSnapshot

COMPILER_VERSION = "flows.compiler.v1"
POLICY_VERSION = "flows.policy.v1"
PAYLOAD_SCHEMA = "flows.plan-payload.v1"
PROFILE_DURABLE = "durable_orchestration"
MAX_SOURCE_BYTES = 1_000_000
MAX_STEPS = 200

# Step kinds (seed 004 section 7.5); the executor runs the first four today.
KIND_EFFECT_SUBMIT = "EffectSubmit"
KIND_EFFECT_COMPLETION = "EffectCompletion"
KIND_PURE_COMPUTE = "PureCompute"
KIND_TERMINAL = "Terminal"
STEP_KINDS = frozenset({
    "EmbeddedTransform", KIND_PURE_COMPUTE, "CurrentRead", "VerifiedSnapshotRead", "BoundedMutation",
    "DependencyWait", KIND_EFFECT_SUBMIT, KIND_EFFECT_COMPLETION, "ExplicitFault", KIND_TERMINAL,
})
TERMINAL_STEP_KEY = "end"

# Closed set of diagnostic families: every code is "<family>" or "<family>:<detail>".
DIAGNOSTIC_FAMILIES = frozenset({
    "xml_too_large", "xml_forbidden_declaration", "xml_malformed", "not_a_flow", "invalid_flow_api_name",
    "binding_mismatch", "unsupported_process_type", "missing_start", "unsupported_start",
    "unsupported_trigger_type", "unsupported_record_trigger_type", "unknown_object", "unknown_field",
    "unsupported_operator", "unsupported_value", "unsupported_filter_logic", "unsupported_condition_logic",
    "unsupported_element", "unsupported_attribute", "missing_element_name", "invalid_element_name",
    "duplicate_element", "unresolved_reference", "unreachable_element", "cycle_detected", "unknown_action",
    "missing_action_input", "invalid_action_input", "unexpected_action_input", "unsupported_reference",
    "unsupported_fault_connector", "unsupported_action_output", "invalid_decision", "invalid_effect_pair",
    "too_many_steps", "compiler_internal_error",
})

SUPPORTED_NODES = {"actionCalls", "decisions"}
# Top-level metadata that does not change the executable graph of the subset.
IGNORED_TOP_LEVEL = {
    "apiVersion", "description", "label", "interviewLabel", "environments", "processMetadataValues", "status",
    "isTemplate", "areMetricsLoggedToDataCloud", "sourceTemplate", "variables", "constants", "formulas",
    "textTemplates", "timeZoneSidKey", "isAdditionalPermissionRequiredToRun", "migratedFromWorkflowRuleName",
    "fullName", "triggerOrder", "runInMode", "isOverridable",
}
LAYOUT_TAGS = {"locationX", "locationY"}
START_CHILDREN = {"connector", "filterLogic", "filters", "object", "recordTriggerType", "triggerType",
                  "doesRequireRecordChangedToMeetCriteria"}
ACTION_CHILDREN = {"name", "label", "description", "actionName", "actionType", "connector", "inputParameters",
                   "storeOutputAutomatically", "flowTransactionModel", "nameSegment", "versionSegment"}
DECISION_CHILDREN = {"name", "label", "description", "rules", "defaultConnector", "defaultConnectorLabel"}
RULE_CHILDREN = {"name", "label", "description", "conditionLogic", "conditions", "connector",
                 "doesRequireRecordChangedToMeetCriteria"}
RECORD_TRIGGER_TYPES = {"Create", "Update", "CreateAndUpdate"}
OPERATORS = {"EqualTo", "NotEqualTo", "IsNull"}
LOGIC = {"and", "or"}
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
RECORD_REF_PREFIX = "$Record."
RECORD_ID_REF = "$Record.Id"


@dataclass(frozen=True)
class Diagnostic:
    """One compiler finding; ``code`` is stable and machine-readable."""

    code: str
    element: str | None = None
    message: str = ""

    @property
    def family(self) -> str:
        return self.code.split(":", 1)[0]

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code, "element": self.element, "message": self.message}

    def __str__(self) -> str:
        where = f" [{self.element}]" if self.element else ""
        return f"{self.code}{where}: {self.message}" if self.message else f"{self.code}{where}"


class CompileError(NexusError):
    """Compilation failed; ``diagnostics`` lists every stable finding."""

    code = "flow_compile_failed"

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("; ".join(str(d) for d in self.diagnostics) or self.code)


@dataclass(frozen=True)
class CompiledPlan:
    """Everything a ``FlowExecutionPlan`` row holds, computed without the database."""

    binding: RuntimeWorkBinding
    flow_api_name: str
    metadata_digest: str
    compiler_version: str
    catalog_generation_id: str
    catalog_digest: str
    trigger_binding_digest: str
    metadata_view_digest: str
    policy_version: str
    execution_profile: str
    payload: dict[str, Any]
    payload_digest: str
    plan_digest: str
    bound_summary: dict[str, Any]
    diagnostic_summary: str
    digest_profile: str = PROFILE_V2

    @property
    def plan_id(self) -> str:
        return f"plan_{self.plan_digest[:32]}"

    @property
    def trigger(self) -> dict[str, Any]:
        return self.payload["trigger"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.payload["steps"]


class _Abort(Exception):
    """Stop compiling: the collected diagnostics are final."""


def _local(tag: Any) -> str:
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


def _children(el: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in el if _local(c.tag) == name]


def _child(el: ET.Element, name: str) -> ET.Element | None:
    found = _children(el, name)
    return found[0] if found else None


def _text(el: ET.Element, name: str) -> str | None:
    c = _child(el, name)
    if c is None:
        return None
    return c.text if c.text is not None else ""


def _target(el: ET.Element, connector: str) -> str | None:
    c = _child(el, connector)
    if c is None:
        return None
    ref = _text(c, "targetReference")
    return ref.strip() if ref is not None else None


def _normalize(el: ET.Element) -> list[Any]:
    """Canonical, layout-free form of an element for the metadata digest."""
    attrs = sorted((_local(k), v) for k, v in el.attrib.items())
    kids = [c for c in el if isinstance(c.tag, str) and _local(c.tag) not in LAYOUT_TAGS]
    if kids:
        return [_local(el.tag), attrs, None, [_normalize(c) for c in kids]]
    return [_local(el.tag), attrs, el.text or "", []]


class _ForbiddenDeclaration(Exception):
    pass


def _forbid(*_args: Any) -> None:
    raise _ForbiddenDeclaration()


def parse_flow_xml(source: bytes | str) -> ET.Element:
    """Parse Flow XML with DOCTYPE/ENTITY declarations refused.

    Raises:
        CompileError: too large, forbidden declaration, or malformed.
    """
    if isinstance(source, str):
        source = source.encode("utf-8")
    if not isinstance(source, (bytes, bytearray)):
        raise CompileError([Diagnostic("xml_malformed", None, "source must be bytes")])
    source = bytes(source)
    if len(source) > MAX_SOURCE_BYTES:
        raise CompileError([Diagnostic("xml_too_large", None, f"more than {MAX_SOURCE_BYTES} bytes")])
    upper = source.upper()
    if b"<!DOCTYPE" in upper or b"<!ENTITY" in upper:
        raise CompileError([Diagnostic("xml_forbidden_declaration", None, "DOCTYPE and ENTITY are refused")])
    scanner = expat.ParserCreate()
    scanner.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    scanner.StartDoctypeDeclHandler = _forbid
    scanner.EntityDeclHandler = _forbid
    scanner.UnparsedEntityDeclHandler = _forbid
    scanner.ExternalEntityRefHandler = _forbid
    try:
        scanner.Parse(source, True)
    except _ForbiddenDeclaration:
        raise CompileError([Diagnostic("xml_forbidden_declaration", None, "DOCTYPE and ENTITY are refused")]) from None
    except expat.ExpatError as exc:
        raise CompileError([Diagnostic("xml_malformed", None, str(exc))]) from None
    try:
        return ET.fromstring(source)
    except ET.ParseError as exc:
        raise CompileError([Diagnostic("xml_malformed", None, str(exc))]) from None


@dataclass
class _Node:
    name: str
    kind: str  # "action" | "decision"
    targets: list[str | None]
    data: dict[str, Any] = field(default_factory=dict)


class _Compiler:
    def __init__(self, *, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot, view: MetadataView):
        self.source = source
        self.flow_api_name = flow_api_name
        self.catalog = catalog
        self.view = view
        self.diags: list[Diagnostic] = []
        self.object_fields: set[str] | None = None

    # -- diagnostics --------------------------------------------------------
    def diag(self, code: str, element: str | None = None, message: str = "") -> None:
        d = Diagnostic(code, element, message)
        if d not in self.diags:
            self.diags.append(d)

    def abort_if_failed(self) -> None:
        if self.diags:
            raise _Abort()

    # -- pipeline -----------------------------------------------------------
    def run(self) -> CompiledPlan:
        try:
            return self._run()
        except _Abort:
            raise CompileError(self.diags) from None

    def _run(self) -> CompiledPlan:
        if not isinstance(self.flow_api_name, str) or not NAME_RE.match(self.flow_api_name):
            self.diag("invalid_flow_api_name", None, "flow API name must start with a letter, use only letters, digits and '_', "
                                                        "and be at most 80 characters")
        if self.catalog.binding.metadata_view_digest != self.view.digest:
            self.diag("binding_mismatch", None, "catalog generation is bound to another metadata view")
        self.abort_if_failed()
        root = parse_flow_xml(self.source)
        if _local(root.tag) != "Flow":
            self.diag("not_a_flow", None, f"root element is {_local(root.tag)!r}")
            self.abort_if_failed()
        metadata_digest = digest_json_v2("flows.flow-metadata", canonical_json.dumps(_normalize(root))).hexdigest

        starts: list[ET.Element] = []
        node_elements: list[tuple[str, ET.Element]] = []
        process_type: str | None = None
        for child in root:
            if not isinstance(child.tag, str):
                continue
            tag = _local(child.tag)
            if tag in IGNORED_TOP_LEVEL:
                continue
            if tag == "processType":
                process_type = (child.text or "").strip()
            elif tag == "start":
                starts.append(child)
            elif tag in SUPPORTED_NODES:
                node_elements.append((tag, child))
            else:
                self.diag(f"unsupported_element:{tag}", _text(child, "name"), f"<{tag}> is not supported yet")
        if process_type != "AutoLaunchedFlow":
            self.diag(f"unsupported_process_type:{process_type or 'none'}", None,
                      "only record-triggered AutoLaunchedFlow is supported")
        if not starts:
            self.diag("missing_start", None, "no <start> element")
        elif len(starts) > 1:
            self.diag("unsupported_start:multiple", None, "more than one <start>")
        # Keep collecting: one report names every blocker in the document.
        trigger, entry_target = self._start(starts[0]) if len(starts) == 1 else ({}, None)
        nodes = self._nodes(node_elements)
        self.abort_if_failed()
        order = self._graph(nodes, entry_target)
        self.abort_if_failed()
        steps, edges = self._steps(nodes, order, entry_target)
        self._validate_effect_pairs(steps, edges)
        if len(steps) > MAX_STEPS:
            self.diag("too_many_steps", None, f"{len(steps)} steps exceed the bound of {MAX_STEPS}")
        self.abort_if_failed()
        return self._plan(metadata_digest, trigger, steps, edges, entry_target)

    # -- start ----------------------------------------------------------------
    def _start(self, start: ET.Element) -> tuple[dict[str, Any], str | None]:
        for child in start:
            tag = _local(child.tag)
            if isinstance(child.tag, str) and tag not in START_CHILDREN and tag not in LAYOUT_TAGS:
                self.diag(f"unsupported_start:{tag}", "start", f"<start><{tag}> is not supported yet")
        trigger_type = _text(start, "triggerType")
        if trigger_type != "RecordAfterSave":
            self.diag(f"unsupported_trigger_type:{trigger_type or 'none'}", "start",
                      "only RecordAfterSave triggers are supported")
        record_trigger_type = _text(start, "recordTriggerType")
        if record_trigger_type not in RECORD_TRIGGER_TYPES:
            self.diag(f"unsupported_record_trigger_type:{record_trigger_type or 'none'}", "start")
        if (_text(start, "doesRequireRecordChangedToMeetCriteria") or "false").strip() != "false":
            self.diag("unsupported_start:doesRequireRecordChangedToMeetCriteria", "start")
        object_name = _text(start, "object")
        if object_name is None:
            self.diag("unknown_object:none", "start", "record trigger names no object")
        else:
            try:
                validate_key(object_name, field="object", max_length=80)
            except InvalidIdentity as exc:
                self.diag("unknown_object:invalid", "start", str(exc))
            else:
                if object_name in self.view.objects:
                    self.object_fields = set(self.view.objects[object_name].fields)
                else:
                    self.diag(f"unknown_object:{object_name}", "start", "object is not in the metadata view")
        filters = []
        for f in _children(start, "filters"):
            cond = self._condition(f, "start", left=_text(f, "field"), left_is_reference=False,
                                   value=_child(f, "value"))
            if cond is not None:
                filters.append(cond)
        raw_logic = _text(start, "filterLogic")
        logic = "and" if raw_logic is None else raw_logic.strip().lower()
        if logic not in LOGIC:
            self.diag("unsupported_filter_logic", "start", f"filter logic {raw_logic!r} is not and/or")
        trigger = {
            "object": object_name,
            "record_trigger_type": record_trigger_type,
            "filter_logic": logic,
            "filters": filters,
        }
        return trigger, _target(start, "connector")

    def _condition(self, el: ET.Element, element: str, *, left: str | None, left_is_reference: bool,
                   value: ET.Element | None) -> dict[str, Any] | None:
        if left is None:
            self.diag("unknown_field:none", element, "condition names no field")
            return None
        left = left.strip()
        if left_is_reference:
            if not left.startswith(RECORD_REF_PREFIX) or "." in left[len(RECORD_REF_PREFIX):]:
                self.diag(f"unsupported_reference:{left}", element, "only $Record.<field> references are supported")
                return None
            field_name = left[len(RECORD_REF_PREFIX):]
        else:
            field_name = left
        if self.object_fields is not None and field_name not in self.object_fields:
            self.diag(f"unknown_field:{field_name}", element, "field is not defined on the trigger object")
        operator = (_text(el, "operator") or "").strip()
        if operator not in OPERATORS:
            self.diag(f"unsupported_operator:{operator or 'none'}", element)
            return None
        kinds = [c for c in (value if value is not None else []) if isinstance(c.tag, str)]
        if len(kinds) != 1:
            self.diag(f"unsupported_value:{field_name}", element, "condition needs exactly one literal value")
            return None
        kind, literal = _local(kinds[0].tag), kinds[0].text
        if operator == "IsNull":
            if kind != "booleanValue" or (literal or "").strip() not in ("true", "false"):
                self.diag(f"unsupported_value:{field_name}", element, "IsNull takes a boolean literal")
                return None
            return {"field": field_name, "operator": operator, "value": (literal or "").strip() == "true"}
        if kind != "stringValue":
            self.diag(f"unsupported_value:{field_name}", element, f"{operator} takes a string literal")
            return None
        return {"field": field_name, "operator": operator, "value": literal or ""}

    # -- elements -------------------------------------------------------------
    def _name(self, el: ET.Element, tag: str) -> str | None:
        name = _text(el, "name")
        if name is None or not name.strip():
            self.diag(f"missing_element_name:{tag}", None)
            return None
        if not NAME_RE.match(name):
            self.diag("invalid_element_name", name, "element names must match [A-Za-z][A-Za-z0-9_]*")
            return None
        return name

    def _nodes(self, node_elements: list[tuple[str, ET.Element]]) -> dict[str, _Node]:
        nodes: dict[str, _Node] = {}
        for tag, el in node_elements:
            name = self._name(el, tag)
            if name is None:
                continue
            if name in nodes or name == TERMINAL_STEP_KEY:
                self.diag(f"duplicate_element:{name}", name)
                continue
            node = self._action(name, el) if tag == "actionCalls" else self._decision(name, el)
            if node is not None:
                nodes[name] = node
        return nodes

    def _action(self, name: str, el: ET.Element) -> _Node | None:
        for child in el:
            tag = _local(child.tag)
            if not isinstance(child.tag, str) or tag in LAYOUT_TAGS or tag in ACTION_CHILDREN:
                continue
            if tag == "faultConnector":
                self.diag(f"unsupported_fault_connector:{name}", name, "fault paths are not supported yet")
            elif tag == "outputParameters":
                self.diag(f"unsupported_action_output:{name}", name)
            else:
                self.diag(f"unsupported_attribute:actionCalls.{tag}", name)
        action_type = (_text(el, "actionType") or "").strip()
        action_name = (_text(el, "actionName") or "").strip()
        entry = self.catalog.entry(action_type, action_name)
        if entry is None:
            self.diag(f"unknown_action:{action_type or 'none'}:{action_name or 'none'}", name,
                      "action is not in the sealed capability catalog")
            return None
        inputs = self._action_inputs(name, el, entry)
        return _Node(name, "action", [_target(el, "connector")], {"entry": entry, "inputs": inputs})

    def _action_inputs(self, name: str, el: ET.Element, entry: CatalogEntry) -> dict[str, str]:
        given: dict[str, ET.Element | None] = {}
        for param in _children(el, "inputParameters"):
            pname = (_text(param, "name") or "").strip()
            if pname in given:
                self.diag(f"invalid_action_input:{pname}", name, "input given twice")
            given[pname] = _child(param, "value")
        declared = dict(entry.inputs)
        for pname in given:
            if pname not in declared:
                self.diag(f"unexpected_action_input:{pname or 'none'}", name)
        resolved: dict[str, str] = {}
        for pname, source in entry.inputs:
            if pname not in given:
                self.diag(f"missing_action_input:{pname}", name)
                continue
            value = given[pname]
            kids = [c for c in (value if value is not None else []) if isinstance(c.tag, str)]
            kind = _local(kids[0].tag) if len(kids) == 1 else None
            text = kids[0].text if len(kids) == 1 else None
            if source == "string_literal":
                try:
                    if kind != "stringValue":
                        raise InvalidIdentity("expected a string literal")
                    resolved[pname] = validate_key(text, field=pname, max_length=80)
                except InvalidIdentity as exc:
                    self.diag(f"invalid_action_input:{pname}", name, str(exc))
            elif source == "trigger_record_id":
                if kind != "elementReference" or (text or "").strip() != RECORD_ID_REF:
                    self.diag(f"invalid_action_input:{pname}", name, f"expected {RECORD_ID_REF}")
                else:
                    resolved[pname] = RECORD_ID_REF
        return resolved

    def _decision(self, name: str, el: ET.Element) -> _Node | None:
        for child in el:
            tag = _local(child.tag)
            if isinstance(child.tag, str) and tag not in LAYOUT_TAGS and tag not in DECISION_CHILDREN:
                self.diag(f"unsupported_attribute:decisions.{tag}", name)
        rules = []
        targets: list[str | None] = []
        rule_names: set[str] = set()
        for rule in _children(el, "rules"):
            for child in rule:
                tag = _local(child.tag)
                if isinstance(child.tag, str) and tag not in RULE_CHILDREN:
                    self.diag(f"unsupported_attribute:rules.{tag}", name)
            if (_text(rule, "doesRequireRecordChangedToMeetCriteria") or "false").strip() != "false":
                self.diag("unsupported_attribute:rules.doesRequireRecordChangedToMeetCriteria", name)
            rname = self._name(rule, "rules")
            if rname is None:
                continue
            if rname in rule_names:
                self.diag(f"duplicate_element:{rname}", name)
                continue
            rule_names.add(rname)
            raw_logic = _text(rule, "conditionLogic")
            logic = "and" if raw_logic is None else raw_logic.strip().lower()
            if logic not in LOGIC:
                self.diag(f"unsupported_condition_logic:{rname}", name, f"condition logic {raw_logic!r}")
            conditions = []
            for cond_el in _children(rule, "conditions"):
                cond = self._condition(cond_el, name, left=_text(cond_el, "leftValueReference"),
                                       left_is_reference=True, value=_child(cond_el, "rightValue"))
                if cond is not None:
                    conditions.append(cond)
            if not _children(rule, "conditions"):
                self.diag(f"invalid_decision:{rname}", name, "a rule needs at least one condition")
            target = _target(rule, "connector")
            rules.append({"name": rname, "logic": logic, "conditions": conditions, "target": target})
            targets.append(target)
        if not rules:
            self.diag(f"invalid_decision:{name}", name, "a decision needs at least one rule")
        default_target = _target(el, "defaultConnector")
        targets.append(default_target)
        return _Node(name, "decision", targets, {"rules": rules, "default_target": default_target})

    # -- graph ------------------------------------------------------------------
    def _graph(self, nodes: dict[str, _Node], entry: str | None) -> list[str]:
        for node in nodes.values():
            for target in node.targets:
                if target is not None and target not in nodes:
                    self.diag(f"unresolved_reference:{target}", node.name, "connector targets no supported element")
        if entry is not None and entry not in nodes:
            self.diag(f"unresolved_reference:{entry}", "start", "start connector targets no supported element")
        if self.diags:
            return []
        order: list[str] = []
        colour: dict[str, int] = {}
        # Iterative DFS with an explicit stack: grey = on the current path.
        if entry is not None:
            stack: list[tuple[str, int]] = [(entry, 0)]
            colour[entry] = 1
            order.append(entry)
            while stack:
                name, idx = stack[-1]
                targets = [t for t in nodes[name].targets if t is not None]
                if idx >= len(targets):
                    colour[name] = 2
                    stack.pop()
                    continue
                stack[-1] = (name, idx + 1)
                nxt = targets[idx]
                state = colour.get(nxt, 0)
                if state == 1:
                    self.diag(f"cycle_detected:{nxt}", name, "connectors form a cycle; loops are not supported yet")
                elif state == 0:
                    colour[nxt] = 1
                    order.append(nxt)
                    stack.append((nxt, 0))
        for name in nodes:
            if name not in colour:
                self.diag(f"unreachable_element:{name}", name, "element is not reachable from start")
        return order

    @staticmethod
    def _entry_key(nodes: dict[str, _Node], target: str | None) -> str:
        if target is None:
            return TERMINAL_STEP_KEY
        node = nodes[target]
        return f"submit:{target}" if node.kind == "action" else f"decide:{target}"

    def _steps(self, nodes: dict[str, _Node], order: list[str], entry: str | None):
        steps: list[dict[str, Any]] = []
        edges: list[dict[str, str]] = []
        for name in order:
            node = nodes[name]
            if node.kind == "action":
                entry_: CatalogEntry = node.data["entry"]
                submit, complete = f"submit:{name}", f"complete:{name}"
                nxt = self._entry_key(nodes, node.targets[0])
                steps.append({
                    "key": submit, "kind": KIND_EFFECT_SUBMIT, "element": name,
                    "action_key": entry_.action_key, "entry_digest": entry_.entry_digest,
                    "binding_fingerprint": entry_.binding_fingerprint, "effect_family": entry_.effect_family,
                    "inputs": node.data["inputs"], "completion_step": complete, "next": complete,
                })
                steps.append({
                    "key": complete, "kind": KIND_EFFECT_COMPLETION, "element": name, "submit_step": submit,
                    "next": nxt, "on_no_effect": "terminal_failure", "on_quarantined": "quarantine",
                })
                edges.append({"from": submit, "to": complete, "kind": "effect"})
                edges.append({"from": complete, "to": nxt, "kind": "success"})
            else:
                rules = []
                for rule in node.data["rules"]:
                    nxt = self._entry_key(nodes, rule["target"])
                    rules.append({"name": rule["name"], "logic": rule["logic"], "conditions": rule["conditions"],
                                  "next": nxt})
                    edges.append({"from": f"decide:{name}", "to": nxt, "kind": f"rule:{rule['name']}"})
                default_next = self._entry_key(nodes, node.data["default_target"])
                edges.append({"from": f"decide:{name}", "to": default_next, "kind": "default"})
                steps.append({"key": f"decide:{name}", "kind": KIND_PURE_COMPUTE, "element": name,
                              "rules": rules, "default_next": default_next})
        steps.append({"key": TERMINAL_STEP_KEY, "kind": KIND_TERMINAL})
        return steps, edges

    def _validate_effect_pairs(self, steps: list[dict[str, Any]], edges: list[dict[str, str]]) -> None:
        by_key = {s["key"]: s for s in steps}
        outgoing: dict[str, list[dict[str, str]]] = {}
        for e in edges:
            outgoing.setdefault(e["from"], []).append(e)
        for s in steps:
            if s["kind"] == KIND_EFFECT_SUBMIT:
                out = outgoing.get(s["key"], [])
                completion = by_key.get(s["completion_step"])
                if (len(out) != 1 or out[0]["to"] != s["completion_step"] or completion is None
                        or completion["kind"] != KIND_EFFECT_COMPLETION or completion["submit_step"] != s["key"]):
                    self.diag(f"invalid_effect_pair:{s['key']}", s["element"])
            elif s["kind"] == KIND_EFFECT_COMPLETION:
                submit = by_key.get(s["submit_step"])
                if submit is None or submit.get("completion_step") != s["key"]:
                    self.diag(f"invalid_effect_pair:{s['key']}", s["element"])
                for e in outgoing.get(s["key"], []):
                    if by_key.get(e["to"], {}).get("kind") == KIND_EFFECT_SUBMIT and e["to"] == s["submit_step"]:
                        self.diag(f"invalid_effect_pair:{s['key']}", s["element"], "completion returns to its submit")

    # -- identity ---------------------------------------------------------------
    def _plan(self, metadata_digest: str, trigger: dict[str, Any], steps: list[dict[str, Any]],
              edges: list[dict[str, str]], entry: str | None) -> CompiledPlan:
        binding = self.catalog.binding
        trigger_binding_digest = digest_v2("flows.trigger-binding", [
            ("object", trigger["object"]),
            ("record_trigger_type", trigger["record_trigger_type"]),
            ("filter_logic", trigger["filter_logic"]),
            ("filters", canonical_json.dumps(trigger["filters"])),
            ("metadata_view_digest", self.view.digest),
        ]).hexdigest
        payload = {
            "schema": PAYLOAD_SCHEMA,
            "flow_api_name": self.flow_api_name,
            "trigger": trigger,
            "entry_step": steps[0]["key"] if entry is not None else TERMINAL_STEP_KEY,
            "steps": steps,
            "edges": edges,
        }
        payload_digest = digest_json_v2("flows.plan-payload", canonical_json.dumps(payload)).hexdigest
        effects = sum(1 for s in steps if s["kind"] == KIND_EFFECT_SUBMIT)
        profile = PROFILE_DURABLE
        plan_digest = digest_v2("flows.execution-plan", [
            ("org_id", binding.org_id),
            ("app_installation_id", binding.app_installation_id),
            ("runtime_capability_id", binding.runtime_capability_id),
            ("runtime_work_binding_digest", binding.digest),
            ("flow_api_name", self.flow_api_name),
            ("metadata_digest", metadata_digest),
            ("compiler_version", COMPILER_VERSION),
            ("catalog_generation_id", self.catalog.generation_id),
            ("catalog_digest", self.catalog.digest),
            ("trigger_binding_digest", trigger_binding_digest),
            ("metadata_view_digest", self.view.digest),
            ("policy_version", POLICY_VERSION),
            ("execution_profile", profile),
            ("payload_digest", payload_digest),
        ]).hexdigest
        bound_summary = {
            "max_steps": len(steps),
            "effects": effects,
            "decisions": sum(1 for s in steps if s["kind"] == KIND_PURE_COMPUTE),
            "reads": 0,
            "writes": 0,
            "fan_out": 1,
            "lock_classes": ["BUSINESS_RECORD", "FLOW_LIFECYCLE", "RUNTIME"] if effects else ["FLOW_LIFECYCLE"],
        }
        summary = (f"{self.flow_api_name}: {profile}, {len(steps)} steps, {effects} external effect(s); "
                   f"after-save {trigger['record_trigger_type']} on {trigger['object']} "
                   f"with {len(trigger['filters'])} filter(s)")
        return CompiledPlan(
            binding=binding, flow_api_name=self.flow_api_name, metadata_digest=metadata_digest,
            compiler_version=COMPILER_VERSION, catalog_generation_id=self.catalog.generation_id,
            catalog_digest=self.catalog.digest, trigger_binding_digest=trigger_binding_digest,
            metadata_view_digest=self.view.digest, policy_version=POLICY_VERSION, execution_profile=profile,
            payload=payload, payload_digest=payload_digest, plan_digest=plan_digest,
            bound_summary=bound_summary, diagnostic_summary=summary,
        )


def compile_flow(*, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot,
                 view: MetadataView) -> CompiledPlan:
    """Compile one Flow metadata document against a sealed catalog and metadata view.

    Args:
        source: the ``.flow-meta.xml`` bytes (or text).
        flow_api_name: the Flow's API name (from its file name).
        catalog: the sealed capability-catalog snapshot, bound to the plan's
            RuntimeWorkBinding (seed 004 section 8.2).
        view: the exact ``RuntimeMetadataView`` the binding names.

    Returns:
        The immutable compiled plan; identical inputs give an identical plan
        digest (seed 004 section 7.3).

    Raises:
        CompileError: with every stable diagnostic; no other exception escapes.
    """
    try:
        return _Compiler(source=source, flow_api_name=flow_api_name, catalog=catalog, view=view).run()
    except CompileError:
        raise
    except Exception as exc:  # the compile contract: only CompileError leaves
        raise CompileError([Diagnostic("compiler_internal_error", None, type(exc).__name__)]) from exc


# --- trigger evaluation (used by dispatch; pure) -------------------------------
def condition_holds(condition: dict[str, Any], fields: dict[str, Any]) -> bool:
    """Evaluate one normalized EqualTo/NotEqualTo/IsNull condition against record fields."""
    value = fields.get(condition["field"])
    op = condition["operator"]
    if op == "IsNull":
        return (value is None) == condition["value"]
    if op == "EqualTo":
        return value is not None and value == condition["value"]
    if op == "NotEqualTo":
        return value is None or value != condition["value"]
    raise ValueError(f"unknown operator {op}")


def conditions_hold(conditions: list[dict[str, Any]], logic: str, fields: dict[str, Any]) -> bool:
    """Combine conditions with ``and``/``or``; an empty list holds."""
    if not conditions:
        return True
    results = (condition_holds(c, fields) for c in conditions)
    return all(results) if logic == "and" else any(results)


def trigger_matches(trigger: dict[str, Any], *, object_name: str, created: bool, fields: dict[str, Any]) -> bool:
    """Return True when a saved record matches a plan's record-trigger selection."""
    if trigger["object"] != object_name:
        return False
    rtt = trigger["record_trigger_type"]
    if created and rtt not in ("Create", "CreateAndUpdate"):
        return False
    if not created and rtt not in ("Update", "CreateAndUpdate"):
        return False
    return conditions_hold(trigger["filters"], trigger["filter_logic"], fields)
