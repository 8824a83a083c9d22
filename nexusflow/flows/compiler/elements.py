"""Flow compiler: normalized Flow metadata -> immutable, profile-aware plan (seed 004 sections 7 and 9).

:func:`analyze_flow` runs the section 7.2 algorithm and never raises: it
returns an :class:`Analysis` with the selected profile or the rejection
reasons, the unknown capabilities, the loop and fan-out proof, the step count
and the migration cohort (section 20.7). :func:`compile_flow` is the same
analysis for activation: it returns the :class:`CompiledPlan` or raises
:class:`CompileError` with every blocking diagnostic.

Pipeline: front end (:mod:`.frontend`) -> resolve elements, actions and
subflows through the sealed catalog -> control-flow graph with success,
fault, wait and terminal edges -> cycle and recursive-subflow detection ->
capability annotation from catalog entries, propagated through subflows and
loops -> loop and fan-out bounds -> profile selection (Embedded Before-Save,
Bounded Atomic, Durable Orchestration; a requested profile that cannot be
proven is a rejection) -> step grouping with each external effect expanded to
one ``EffectSubmit`` -> ``EffectCompletion`` pair (section 7.5) -> plan
identity over every section 7.3 input.

Diagnostic codes are ``<family>`` or ``<family>:<detail>`` with the family in
:data:`DIAGNOSTIC_FAMILIES`; ``element`` names the element (for a transitive
blocker, the path ``Flow > element > Subflow > element``). The compiler reads
no tenant record and no runtime traffic.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Mapping

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2, digest_json_v2, digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.records.metadata import MetadataView

from .. import formula as fx
from ..binding import RuntimeWorkBinding
from ..catalog import CatalogEntry, CatalogSnapshot, action_key
from ..frontend import FlowDocument, FrontEndError, parse_flow_document, value_of

COMPILER_VERSION = "flows.compiler.v2"
POLICY_VERSION = "flows.policy.v2"
PAYLOAD_SCHEMA = "flows.plan-payload.v2"

PROFILE_EMBEDDED = "embedded_before_save"
PROFILE_ATOMIC = "bounded_atomic"
PROFILE_DURABLE = "durable_orchestration"
PROFILES = (PROFILE_EMBEDDED, PROFILE_ATOMIC, PROFILE_DURABLE)

# Policy bounds of POLICY_VERSION (seed 004 sections 9.1, 9.2 and 16.3).
MAX_STEPS = 200
ATOMIC_MAX_READS = 10
ATOMIC_MAX_WRITES = 10
ATOMIC_MAX_FANOUT = 200
EMBEDDED_MAX_READS = 5
MAX_SUBFLOW_DEPTH = 8

# Step kinds (seed 004 section 7.5).
KIND_EMBEDDED = "EmbeddedTransform"
KIND_PURE_COMPUTE = "PureCompute"
KIND_CURRENT_READ = "CurrentRead"
KIND_SNAPSHOT_READ = "VerifiedSnapshotRead"
KIND_MUTATION = "BoundedMutation"
KIND_DEPENDENCY_WAIT = "DependencyWait"
KIND_EFFECT_SUBMIT = "EffectSubmit"
KIND_EFFECT_COMPLETION = "EffectCompletion"
KIND_EXPLICIT_FAULT = "ExplicitFault"
KIND_TERMINAL = "Terminal"
STEP_KINDS = frozenset({
    KIND_EMBEDDED, KIND_PURE_COMPUTE, KIND_CURRENT_READ, KIND_SNAPSHOT_READ, KIND_MUTATION, KIND_DEPENDENCY_WAIT,
    KIND_EFFECT_SUBMIT, KIND_EFFECT_COMPLETION, KIND_EXPLICIT_FAULT, KIND_TERMINAL,
})
TERMINAL_STEP_KEY = "end"

# Closed set of diagnostic families: every code is "<family>" or "<family>:<detail>".
DIAGNOSTIC_FAMILIES = frozenset({
    "xml_too_large", "xml_forbidden_declaration", "xml_malformed", "not_a_flow", "invalid_flow_api_name",
    "binding_mismatch", "unsupported_process_type", "missing_start", "unsupported_start",
    "unsupported_trigger_type", "unsupported_record_trigger_type", "unknown_object", "unknown_field",
    "unsupported_operator", "unsupported_value", "unsupported_filter_logic", "unsupported_condition_logic",
    "unsupported_element", "missing_element_name", "invalid_element_name", "duplicate_element",
    "unresolved_reference", "unreachable_element", "cycle_detected", "unknown_action", "unknown_capability",
    "capability_not_executable", "missing_action_input", "invalid_action_input", "unexpected_action_input",
    "unsupported_reference", "invalid_decision", "invalid_effect_pair", "too_many_steps", "compiler_internal_error",
    "formula_syntax", "formula_reference", "formula_arity", "unknown_function", "unresolved_packaging_token",
    "recursive_subflow", "unknown_subflow", "subflow_rejected", "subflow_too_deep", "before_save_unsafe",
    "unsafe_atomic_request", "unsafe_profile_request", "invalid_profile_request", "unsupported_wait_event",
    "invalid_loop", "engine_unsupported",
})

SUPPORTED_PROCESS_TYPES = {"AutoLaunchedFlow"}
PROCESS_TYPE_REASONS = {
    "Flow": "screen flow: runs interactively with a user, not on the durable executor",
    "Workflow": "legacy Process Builder process: migrate it to a record-triggered flow",
    "InvocableProcess": "legacy invocable process: migrate it to an autolaunched flow",
    "Orchestrator": "orchestration: interactive stages and steps are not compiled",
    "PromptFlow": "prompt template flow: invoked by a generative capability, not by records",
}
#: Interactive or foreign elements: parsed, never compiled.
REJECTED_ELEMENTS = {
    "screens": "interactive screen", "orchestratedStages": "orchestration stage", "stages": "interactive stage",
    "steps": "legacy step element", "apexPluginCalls": "legacy plugin call", "customErrors": "custom error",
    "recordRollbacks": "record rollback", "transforms": "transform element",
}
#: Resource kinds that are referenced, not executed.
RESOURCE_KINDS = ("variables", "constants", "formulas", "textTemplates", "choices", "dynamicChoiceSets")
#: Executable element kinds and the built-in catalog entry each resolves to.
ELEMENT_ENTRY = {
    "assignments": "element:assignments", "decisions": "element:decisions", "loops": "element:loops",
    "collectionProcessors": "element:collectionProcessors", "recordLookups": "element:recordLookups",
    "recordCreates": "element:recordCreates", "recordUpdates": "element:recordUpdates",
    "recordDeletes": "element:recordDeletes", "waits": "element:waits",
}
STEP_PREFIX = {
    "assignments": "assign", "decisions": "decide", "loops": "loop", "collectionProcessors": "collect",
    "recordLookups": "read", "recordCreates": "write", "recordUpdates": "write", "recordDeletes": "write",
    "waits": "wait", "subflows": "subflow", "actionCalls": "call",
}
GLOBAL_ROOTS = frozenset({
    "$Record", "$Record__Prior", "$Flow", "$User", "$Setup", "$Label", "$Api", "$Organization", "$Profile",
    "$Permission", "$System", "$GlobalConstant", "$UserRole", "$CustomMetadata",
})
RECORD_TRIGGER_TYPES = {"Create", "Update", "CreateAndUpdate"}
TRIGGER_TYPES = {"RecordBeforeSave", "RecordAfterSave", "Scheduled", "PlatformEvent"}
OPERATORS = frozenset({
    "EqualTo", "NotEqualTo", "IsNull", "GreaterThan", "GreaterThanOrEqualTo", "LessThan", "LessThanOrEqualTo",
    "Contains", "StartsWith", "EndsWith", "IsChanged", "In", "NotIn", "IsBlank", "IsEmpty", "WasSet",
})
ASSIGNMENT_OPERATORS = frozenset({
    "Assign", "Add", "Subtract", "AddItem", "AddAtStart", "RemoveAll", "RemoveFirst", "RemoveAfterFirst",
    "RemoveBeforeFirst", "RemoveUncommon", "RemovePosition", "AssignCount", "Multiply", "Divide",
})
VALUE_KINDS = frozenset({"stringValue", "booleanValue", "numberValue", "dateValue", "dateTimeValue",
                         "elementReference", "formulaExpression", "apexValue", "sobjectValue"})
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
REF_RE = re.compile(r"^\$?[A-Za-z_][A-Za-z0-9_]*(?:\.\$?[A-Za-z_][A-Za-z0-9_]*)*$")
PACKAGING_TOKEN = "%%%"
RECORD_ID_REF = "$Record.Id"
STRUCTURAL_ELEMENT_KEYS = frozenset({"name", "label", "description", "__duplicated__"})

# 20.7 cohorts
COHORT_METADATA_ONLY = 1
COHORT_PURE_AUTOLAUNCHED = 2
COHORT_EMBEDDED = 3
COHORT_SMALL_ATOMIC = 4
COHORT_TIME_WAITS = 5
COHORT_PRODUCER_WAITS = 6
COHORT_EXTERNAL_EFFECTS = 7
COHORT_LARGE_COMPLEX = 8


@dataclass(frozen=True)
class Diagnostic:
    """One compiler finding; ``code`` is stable and machine-readable; warnings never block."""

    code: str
    element: str | None = None
    message: str = ""
    severity: str = "error"

    @property
    def family(self) -> str:
        return self.code.split(":", 1)[0]

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code, "element": self.element, "detail": self.message}

    def __str__(self) -> str:
        where = f" [{self.element}]" if self.element else ""
        return f"{self.code}{where}: {self.message}" if self.message else f"{self.code}{where}"


class CompileError(NexusError):
    """Compilation failed; ``diagnostics`` lists every stable blocking finding."""

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
    subflow_plan_digests: dict[str, str] = field(default_factory=dict)
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


@dataclass
class Analysis:
    """The compile-only result of one Flow (seed 004 section 20.4)."""

    flow_api_name: str
    diagnostics: list[Diagnostic]
    plan: CompiledPlan | None = None
    profile: str | None = None
    unknown_capabilities: list[str] = field(default_factory=list)
    loops: list[dict[str, Any]] = field(default_factory=list)
    fan_out: str = "static:1"
    steps: int = 0
    cohort: int = COHORT_METADATA_ONLY
    # transitive facts a calling flow inherits (section 7.2 step 6)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def rejected(self) -> bool:
        return bool(self.errors) or self.plan is None


class _Abort(Exception):
    """Stop compiling: the collected diagnostics are final."""


@dataclass
class _Node:
    name: str
    kind: str  # element kind ("decisions", "actionCalls", ...)
    body: dict[str, Any]
    edges: list[tuple[str, str | None]] = field(default_factory=list)  # (edge kind, target element)
    entry: CatalogEntry | None = None
    unknown: str | None = None  # unknown capability key
    data: dict[str, Any] = field(default_factory=dict)
    in_loops: list[str] = field(default_factory=list)
    child: Analysis | None = None


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _target(conn: Any) -> str | None:
    if isinstance(conn, dict):
        ref = conn.get("targetReference")
        return ref if isinstance(ref, str) and ref else None
    return None


def _bool_text(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    return str(value).strip().lower() == "true"


def normalize_value(value: Any) -> dict[str, Any] | None:
    """A ``<value>`` as ``{"kind", "value"}`` (numbers canonical text); None when absent."""
    kv = value_of(value)
    if kv is None:
        return None
    kind, text = kv
    if kind == "numberValue":
        try:
            text = format(Decimal(str(text)).normalize(), "f")
        except InvalidOperation:
            return {"kind": "invalid", "value": text}
    if kind == "booleanValue":
        text = str(text).strip().lower()
    return {"kind": kind, "value": text}


def parse_logic(text: str, count: int) -> Any:
    """Parse custom condition logic (``"(1 OR 2) AND 3"``) into ``["and"|"or"|"not", ...]`` / index.

    Raises:
        ValueError: syntax error or an index outside ``1..count``.
    """
    tokens = re.findall(r"\(|\)|\d+|[A-Za-z]+|\S", text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos].upper() if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("unexpected end of logic")
        pos += 1
        return tokens[pos - 1].upper()

    def expr(depth: int = 0) -> Any:
        if depth > 32:
            raise ValueError("logic nests too deeply")
        left = term(depth)
        while peek() == "OR":
            take()
            left = ["or", left, term(depth)]
        return left

    def term(depth: int) -> Any:
        left = factor(depth)
        while peek() == "AND":
            take()
            left = ["and", left, factor(depth)]
        return left

    def factor(depth: int) -> Any:
        tok = take()
        if tok == "NOT":
            return ["not", factor(depth + 1)]
        if tok == "(":
            inner = expr(depth + 1)
            if take() != ")":
                raise ValueError("missing ')'")
            return inner
        if tok.isdigit():
            index = int(tok)
            if not 1 <= index <= count:
                raise ValueError(f"condition {index} does not exist")
            return index
        raise ValueError(f"unexpected {tok!r}")

    tree = expr()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return tree


def _normalize_logic(raw: Any, count: int) -> Any:
    """``and``/``or`` stay text; custom logic becomes an AST. Raises ValueError."""
    if raw is None:
        return "and"
    text = str(raw).strip()
    low = text.lower()
    if low in ("and", "or"):
        return low
    if low == "no_conditions":
        return "and"
    return parse_logic(text, count)


class _Compiler:
    def __init__(self, *, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot, view: MetadataView,
                 subflows: Mapping[str, bytes] | None, requested_profile: str | None, schema: str,
                 stack: tuple[str, ...]):
        self.source = source
        self.flow_api_name = flow_api_name
        self.catalog = catalog
        self.view = view
        self.subflows = subflows or {}
        self.option_profile = requested_profile
        self.schema = schema
        self.stack = stack
        self.diags: list[Diagnostic] = []
        self.doc: FlowDocument | None = None
        self.nodes: dict[str, _Node] = {}
        self.resources: dict[str, tuple[str, dict[str, Any]]] = {}
        self.trigger: dict[str, Any] = {"trigger_type": "none"}
        self.entry_edges: list[tuple[str, str | None]] = []
        self.object_fields: set[str] | None = None
        self.analysis = Analysis(flow_api_name=flow_api_name, diagnostics=self.diags)

    # -- diagnostics --------------------------------------------------------
    def diag(self, code: str, element: str | None = None, message: str = "", severity: str = "error") -> None:
        d = Diagnostic(code, element, message, severity)
        if d not in self.diags:
            self.diags.append(d)

    def failed(self) -> bool:
        return any(d.severity == "error" for d in self.diags)

    def abort_if_failed(self) -> None:
        if self.failed():
            raise _Abort()

    # -- pipeline -----------------------------------------------------------
    def run(self) -> Analysis:
        try:
            self._run()
        except _Abort:
            pass
        except FrontEndError as exc:
            self.diag(exc.code, exc.element, exc.detail)
        except Exception as exc:  # the compile contract: findings, never a crash
            self.diag("compiler_internal_error", None, f"{type(exc).__name__}: {exc}")
        if self.failed():
            self.analysis.plan = None
            self.analysis.profile = None
            self.analysis.cohort = COHORT_METADATA_ONLY
            self.analysis.fan_out = "unproven"
            # Estimated step boundaries of a rejected flow: one per executable element,
            # two per external effect, plus the terminal step.
            executable = [n for n in self.nodes.values() if n.kind not in REJECTED_ELEMENTS]
            effects = sum(1 for n in executable if n.entry is not None and n.entry.kind == "effect")
            self.analysis.steps = len(executable) + effects + 1 if executable else 0
        return self.analysis

    def _run(self) -> None:
        if not isinstance(self.flow_api_name, str) or not NAME_RE.match(self.flow_api_name):
            self.diag("invalid_flow_api_name", None, "flow API name must start with a letter, use only letters, "
                                                     "digits and '_', and be at most 80 characters")
        if self.catalog.binding.metadata_view_digest != self.view.digest:
            self.diag("binding_mismatch", None, "catalog generation is bound to another metadata view")
        self.abort_if_failed()
        self.doc = parse_flow_document(self.source)
        for code, element, detail in self.doc.findings:
            self.diag(code, element, detail)
        data = self.doc.data
        self._packaging_tokens(data)
        self._process_type(data)
        self._resources()
        self._start(data)
        self._elements()
        self._references()
        self.abort_if_failed()
        order = self._graph()
        self.abort_if_failed()
        self._loops(order)
        self._propagate()
        self.abort_if_failed()
        profile = self._select_profile()
        self.abort_if_failed()
        steps, edges = self._steps(order, profile)
        self._validate_effect_pairs(steps, edges)
        if len(steps) > MAX_STEPS:
            self.diag("too_many_steps", None, f"{len(steps)} steps exceed the bound of {MAX_STEPS}")
        self.abort_if_failed()
        self.analysis.plan = self._plan(profile, steps, edges)
        self.analysis.profile = profile
        self.analysis.steps = len(steps)
        self.analysis.cohort = self._cohort(profile)

    # -- document level -------------------------------------------------------
    def _packaging_tokens(self, data: dict[str, Any]) -> None:
        def walk(value: Any, element: str | None) -> None:
            if isinstance(value, str):
                if PACKAGING_TOKEN in value:
                    self.diag("unresolved_packaging_token", element,
                              "a %%%...%%% packaging placeholder must be resolved before the flow is compiled")
            elif isinstance(value, dict):
                for v in value.values():
                    walk(v, element)
            elif isinstance(value, list):
                for v in value:
                    walk(v, element)

        walk(data.get("start"), "start")
        for kind, named in data["elements"].items():
            for name, body in named.items():
                walk(body, name)

    def _process_type(self, data: dict[str, Any]) -> None:
        process_type = data.get("process_type")
        if process_type not in SUPPORTED_PROCESS_TYPES:
            reason = PROCESS_TYPE_REASONS.get(process_type or "", "only autolaunched flows are compiled")
            self.diag(f"unsupported_process_type:{process_type or 'none'}", None, reason)
        for kind, what in REJECTED_ELEMENTS.items():
            for name in self.doc.elements(kind):
                self.diag(f"unsupported_element:{kind}", name, f"{what} elements are parsed and rejected")
        for tag in data["other"]:
            self.diag(f"unsupported_element:{tag}", None, f"<{tag}> is not part of the compiled metadata")

    def _resources(self) -> None:
        for kind in RESOURCE_KINDS:
            for name, body in self.doc.elements(kind).items():
                self.resources[name] = (kind, body)
                if kind == "formulas":
                    self._formula(name, body.get("expression"))
                elif kind == "textTemplates":
                    try:
                        fx.parse_template(body.get("text") or "")
                    except fx.FormulaError as exc:
                        self.diag(f"{exc.code}", name, exc.detail)

    def _formula(self, element: str, expression: Any) -> list | None:
        if not isinstance(expression, str):
            self.diag("formula_syntax", element, "formula has no expression")
            return None
        if PACKAGING_TOKEN in expression:
            return None  # reported once as unresolved_packaging_token
        try:
            return fx.parse_formula(expression)
        except fx.FormulaError as exc:
            code = f"unknown_function:{exc.detail.upper()}" if exc.code == "unknown_function" else exc.code
            self.diag(code, element, exc.detail if exc.code != "unknown_function"
                      else f"function {exc.detail} is not implemented by the expression evaluator")
            return None

    # -- start ----------------------------------------------------------------
    def _start(self, data: dict[str, Any]) -> None:
        start = data.get("start")
        ref = data.get("start_element_reference")
        if start is None and ref is None:
            self.diag("missing_start", None, "no <start> and no startElementReference")
            return
        if start is None:
            self.entry_edges = [("success", ref)]
            return
        if not isinstance(start, dict):
            self.diag("unsupported_start:shape", "start", "<start> is empty")
            return
        known = {"connector", "filterLogic", "filters", "object", "recordTriggerType", "triggerType",
                 "doesRequireRecordChangedToMeetCriteria", "filterFormula", "scheduledPaths", "schedule",
                 "triggerOrder", "__duplicated__"}
        for tag in start:
            if tag not in known:
                self.diag(f"unsupported_start:{tag}", "start", f"<start><{tag}> is not supported")
        trigger_type = start.get("triggerType")
        self.entry_edges = [("success", _target(start.get("connector")))] if start.get("connector") else []
        if trigger_type is None:
            if start.get("object") is not None or start.get("filters"):
                self.diag("unsupported_start:object_without_trigger", "start", "an object needs a trigger type")
            return
        if trigger_type not in TRIGGER_TYPES:
            self.diag(f"unsupported_trigger_type:{trigger_type}", "start",
                      "supported: record before/after save, scheduled, platform event")
            return
        trigger: dict[str, Any] = {"trigger_type": trigger_type}
        object_name = start.get("object")
        if object_name is None:
            self.diag("unknown_object:none", "start", "the trigger names no object")
        else:
            self._object(object_name, "start", trigger=True)
        trigger["object"] = object_name
        rtt = start.get("recordTriggerType")
        if trigger_type.startswith("Record"):
            if rtt not in RECORD_TRIGGER_TYPES:
                self.diag(f"unsupported_record_trigger_type:{rtt or 'none'}", "start")
            trigger["record_trigger_type"] = rtt
        trigger["requires_change"] = _bool_text(start.get("doesRequireRecordChangedToMeetCriteria"))
        filters = [self._filter(f, "start", record_object=True) for f in _as_list(start.get("filters"))]
        trigger["filters"] = [f for f in filters if f is not None]
        try:
            trigger["filter_logic"] = _normalize_logic(start.get("filterLogic"), len(trigger["filters"]))
        except ValueError as exc:
            self.diag("unsupported_filter_logic", "start", str(exc))
            trigger["filter_logic"] = "and"
        formula = start.get("filterFormula")
        trigger["filter_formula"] = self._formula("start", formula) if formula is not None else None
        schedule = start.get("schedule")
        trigger["schedule"] = schedule if isinstance(schedule, dict) else None
        if trigger_type == "Scheduled" and not isinstance(schedule, dict):
            self.diag("unsupported_start:schedule", "start", "a scheduled trigger needs a schedule")
        paths = []
        for path in _as_list(start.get("scheduledPaths")):
            if not isinstance(path, dict):
                continue
            label = path.get("name") or path.get("pathType") or "path"
            paths.append({"name": label, "path_type": path.get("pathType"),
                          "offset": path.get("offsetNumber"), "unit": path.get("offsetUnit"),
                          "time_source": path.get("timeSource"), "record_field": path.get("recordField")})
            self.entry_edges.append((f"scheduled:{label}", _target(path.get("connector"))))
        trigger["scheduled_paths"] = paths
        if paths and trigger_type != "RecordAfterSave":
            self.diag("unsupported_start:scheduledPaths", "start", "scheduled paths need an after-save trigger")
        self.trigger = trigger

    def _object(self, name: Any, element: str, *, trigger: bool = False) -> None:
        if not isinstance(name, str):
            self.diag("unknown_object:invalid", element, "object name is not text")
            return
        if PACKAGING_TOKEN in name:
            return  # reported once as unresolved_packaging_token
        try:
            validate_key(name, field="object", max_length=80)
        except InvalidIdentity as exc:
            self.diag("unknown_object:invalid", element, str(exc))
            return
        if self.schema != "strict":
            return
        if name not in self.view.objects:
            self.diag(f"unknown_object:{name}", element, "object is not in the metadata view")
        elif trigger:
            self.object_fields = set(self.view.objects[name].fields)

    def _record_field(self, field_name: Any, element: str) -> None:
        if self.schema == "strict" and self.object_fields is not None and field_name not in self.object_fields:
            self.diag(f"unknown_field:{field_name}", element, "field is not defined on the trigger object")

    def _object_field(self, object_name: Any, field_name: Any, element: str) -> None:
        """``unknown_field:<field>`` when a strict view defines ``object_name`` but not ``field_name``.

        ``Id`` (the record key every record has) always resolves; an object the
        view does not define is reported once by :meth:`_object`.
        """
        if self.schema != "strict" or field_name == "Id" or not isinstance(object_name, str):
            return
        definition = self.view.objects.get(object_name)
        if definition is not None and field_name not in definition.fields:
            self.diag(f"unknown_field:{field_name}", element, f"field is not defined on {object_name}")

    def _filter(self, raw: Any, element: str, *, record_object: bool) -> dict[str, Any] | None:
        if not isinstance(raw, dict):
            self.diag("unsupported_value:filter", element, "empty filter")
            return None
        field_name, op = raw.get("field"), raw.get("operator")
        if op not in OPERATORS:
            self.diag(f"unsupported_operator:{op}", element)
        if record_object:
            self._record_field(field_name, element)
        value = normalize_value(raw.get("value"))
        if value is not None and value["kind"] not in VALUE_KINDS:
            self.diag(f"unsupported_value:{value['kind']}", element)
        return {"field": field_name, "operator": op, "value": value}

    # -- elements ---------------------------------------------------------------
    def _elements(self) -> None:
        for kind in ("assignments", "decisions", "loops", "collectionProcessors", "recordLookups",
                     "recordCreates", "recordUpdates", "recordDeletes", "actionCalls", "subflows", "waits"):
            for name, body in self.doc.elements(kind).items():
                if not NAME_RE.match(name):
                    self.diag("invalid_element_name", name, "element names are letters, digits and '_'")
                    continue
                for dup in body.get("__duplicated__", []):
                    self.diag(f"duplicate_element:{dup}", name, f"<{dup}> appears more than once")
                node = _Node(name, kind, body)
                getattr(self, f"_el_{kind}")(node)
                if kind in ELEMENT_ENTRY:
                    node.entry = self.catalog.entries.get(ELEMENT_ENTRY[kind])
                    if node.entry is None:
                        node.unknown = ELEMENT_ENTRY[kind]
                self.nodes[name] = node
        for kind in REJECTED_ELEMENTS:
            for name, body in self.doc.elements(kind).items():
                node = _Node(name, kind, body)
                node.edges = [("success", _target(body.get("connector")))] if isinstance(body, dict) else []
                self.nodes[name] = node
        for name, node in self.nodes.items():
            if node.unknown:
                self.analysis.unknown_capabilities.append(node.unknown)
            if isinstance(node.body, dict) and "faultConnector" in node.body:
                node.edges.append(("fault", _target(node.body.get("faultConnector"))))

    def _value(self, raw: Any, element: str) -> dict[str, Any] | None:
        value = normalize_value(raw)
        if value is None:
            return None
        if value["kind"] not in VALUE_KINDS:
            self.diag(f"unsupported_value:{value['kind']}", element)
        elif value["kind"] == "formulaExpression":
            value["ast"] = self._formula(element, value["value"])
        return value

    def _condition(self, raw: Any, element: str) -> dict[str, Any] | None:
        if not isinstance(raw, dict):
            self.diag("invalid_decision:condition", element, "empty condition")
            return None
        left, op = raw.get("leftValueReference"), raw.get("operator")
        if op not in OPERATORS:
            self.diag(f"unsupported_operator:{op}", element)
        if isinstance(left, str) and left.startswith("$Record.") and left.count(".") == 1:
            self._record_field(left.split(".", 1)[1], element)
        return {"left": left, "operator": op, "right": self._value(raw.get("rightValue"), element)}

    def _conditions(self, raw: dict[str, Any], element: str, where: str) -> tuple[list, Any]:
        conds = [c for c in (self._condition(x, element) for x in _as_list(raw.get("conditions"))) if c]
        try:
            logic = _normalize_logic(raw.get("conditionLogic"), len(conds))
        except ValueError as exc:
            self.diag(f"unsupported_condition_logic:{where}", element, str(exc))
            logic = "and"
        return conds, logic

    def _el_assignments(self, node: _Node) -> None:
        items = []
        for item in _as_list(node.body.get("assignmentItems")):
            if not isinstance(item, dict):
                continue
            op = item.get("operator")
            if op not in ASSIGNMENT_OPERATORS:
                self.diag(f"unsupported_operator:{op}", node.name)
            items.append({"target": item.get("assignToReference"), "operator": op,
                          "value": self._value(item.get("value"), node.name)})
        if not items:
            self.diag("invalid_decision:assignment", node.name, "an assignment needs at least one item")
        node.data = {"items": items}
        node.edges = [("success", _target(node.body.get("connector")))]

    def _el_decisions(self, node: _Node) -> None:
        rules = []
        for rule in _as_list(node.body.get("rules")):
            if not isinstance(rule, dict) or not isinstance(rule.get("name"), str):
                self.diag("missing_element_name", node.name, "a rule has no name")
                continue
            if not rule.get("conditions"):
                self.diag(f"invalid_decision:{rule['name']}", node.name, "a rule needs at least one condition")
            conds, logic = self._conditions(rule, node.name, rule["name"])
            rules.append({"name": rule["name"], "logic": logic, "conditions": conds,
                          "requires_change": _bool_text(rule.get("doesRequireRecordChangedToMeetCriteria"))})
            node.edges.append((f"rule:{rule['name']}", _target(rule.get("connector"))))
        if not rules:
            self.diag(f"invalid_decision:{node.name}", node.name, "a decision needs at least one rule")
        node.edges.append(("default", _target(node.body.get("defaultConnector"))))
        node.data = {"rules": rules}

    def _el_loops(self, node: _Node) -> None:
        coll = node.body.get("collectionReference")
        if not isinstance(coll, str):
            self.diag("invalid_loop:collection", node.name, "a loop needs a collectionReference")
        node.data = {"collection": coll, "order": node.body.get("iterationOrder") or "Asc",
                     "item": node.body.get("assignNextValueToReference")}
        node.edges = [("loop_next", _target(node.body.get("nextValueConnector"))),
                      ("loop_done", _target(node.body.get("noMoreValuesConnector")))]

    def _el_collectionProcessors(self, node: _Node) -> None:  # noqa: N802 - named after the element
        conds, logic = self._conditions(node.body, node.name, node.name)
        node.data = {"collection": node.body.get("collectionReference"),
                     "processor": node.body.get("collectionProcessorType"), "conditions": conds, "logic": logic}
        node.edges = [("success", _target(node.body.get("connector")))]

    def _record_element(self, node: _Node) -> None:
        body = node.body
        obj = body.get("object")
        if obj is not None:
            self._object(obj, node.name)
        filters = [self._filter(f, node.name, record_object=False) for f in _as_list(body.get("filters"))]
        filters = [f for f in filters if f is not None]
        try:
            logic = _normalize_logic(body.get("filterLogic"), len(filters))
        except ValueError as exc:
            self.diag("unsupported_filter_logic", node.name, str(exc))
            logic = "and"
        assignments = [{"field": a.get("field"), "value": self._value(a.get("value"), node.name)}
                       for a in _as_list(body.get("inputAssignments")) if isinstance(a, dict)]
        # The fields an element writes or filters on must exist on its object: the named object, or the
        # trigger object for an Update Records on $Record.
        target = obj if obj is not None else (self.trigger.get("object") if body.get("inputReference") == "$Record"
                                              else None)
        for name in [a["field"] for a in assignments] + [f["field"] for f in filters]:
            self._object_field(target, name, node.name)
        node.data = {"object": obj, "input_reference": body.get("inputReference"), "filters": filters,
                     "filter_logic": logic, "assignments": assignments,
                     "first_only": _bool_text(body.get("getFirstRecordOnly")),
                     "output_reference": body.get("outputReference"),
                     "fields": sorted(x for x in _as_list(body.get("queriedFields")) if isinstance(x, str))}
        if obj is None and body.get("inputReference") is None:
            self.diag("unresolved_reference:object", node.name, "names neither an object nor an inputReference")
        node.edges = [("success", _target(body.get("connector")))]

    _el_recordLookups = _record_element  # noqa: N815
    _el_recordCreates = _record_element  # noqa: N815
    _el_recordUpdates = _record_element  # noqa: N815
    _el_recordDeletes = _record_element  # noqa: N815

    def _el_actionCalls(self, node: _Node) -> None:  # noqa: N802
        action_type, action_name = node.body.get("actionType"), node.body.get("actionName")
        if not isinstance(action_type, str) or not isinstance(action_name, str):
            self.diag("unknown_action:none", node.name, "an action call names actionType and actionName")
            return
        key = action_key(action_type, action_name)
        entry = self.catalog.entries.get(key)
        node.edges = [("success", _target(node.body.get("connector")))]
        params = {p.get("name"): p.get("value") for p in _as_list(node.body.get("inputParameters"))
                  if isinstance(p, dict)}
        node.data = {"action_key": key, "inputs": {}}
        if entry is None:
            node.unknown = key
            self.diag(f"unknown_action:{key}", node.name,
                      "no capability descriptor in the sealed catalog; unknown capabilities fail closed")
            return
        if not entry.executable:
            self.diag(f"capability_not_executable:{key}", node.name, "reserved, contract-only action")
        node.entry = entry
        node.data["inputs"] = self._action_inputs(node.name, entry, params)

    def _action_inputs(self, name: str, entry: CatalogEntry, given: dict[str, Any]) -> dict[str, Any]:
        declared = {n: (s, r) for n, s, r in entry.inputs}
        resolved: dict[str, Any] = {}
        for pname in sorted(k for k in given if isinstance(k, str)):
            if pname not in declared:
                self.diag(f"unexpected_action_input:{pname}", name)
        for pname, (source, required) in sorted(declared.items()):
            if pname not in given:
                if required:
                    self.diag(f"missing_action_input:{pname}", name)
                continue
            value = normalize_value(given[pname])
            kind, text = (value["kind"], value["value"]) if value else (None, None)
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
            else:
                resolved[pname] = self._value(given[pname], name)
        return resolved

    def _el_subflows(self, node: _Node) -> None:
        flow_name = node.body.get("flowName")
        node.edges = [("success", _target(node.body.get("connector")))]
        node.data = {"flow": flow_name,
                     "inputs": {a.get("name"): self._value(a.get("value"), node.name)
                                for a in _as_list(node.body.get("inputAssignments")) if isinstance(a, dict)}}
        if not isinstance(flow_name, str) or not NAME_RE.match(flow_name):
            self.diag("unknown_subflow:invalid", node.name, "flowName is not a flow API name")
            return
        if flow_name in self.stack or flow_name == self.flow_api_name:
            chain = " > ".join((*self.stack, self.flow_api_name, flow_name))
            self.diag(f"recursive_subflow:{flow_name}", node.name, f"subflow cycle {chain}")
            return
        if len(self.stack) >= MAX_SUBFLOW_DEPTH:
            self.diag("subflow_too_deep", node.name, f"more than {MAX_SUBFLOW_DEPTH} nested subflows")
            return
        source = self.subflows.get(flow_name)
        if source is None:
            node.unknown = f"subflow:{flow_name}"
            self.diag(f"unknown_subflow:{flow_name}", node.name,
                      "the subflow is not among the compiled flows; its capabilities are unknown")
            return
        child = _Compiler(source=source, flow_api_name=flow_name, catalog=self.catalog, view=self.view,
                          subflows=self.subflows, requested_profile=None, schema=self.schema,
                          stack=(*self.stack, self.flow_api_name)).run()
        node.child = child
        for key in child.unknown_capabilities:
            node.unknown = node.unknown or key
        if child.rejected:
            first = child.errors[0] if child.errors else Diagnostic("subflow_rejected", None, "")
            # One diagnostic per child blocker: the path names the exact transitive blocker.
            for d in child.errors:
                if d.family in ("recursive_subflow",):
                    self.diag(d.code, f"{node.name} > {flow_name} > {d.element}" if d.element else node.name,
                              d.message)
            self.diag(f"subflow_rejected:{flow_name}", f"{node.name} > {flow_name}"
                      + (f" > {first.element}" if first.element else ""), f"{first.code}: {first.message}")

    def _el_waits(self, node: _Node) -> None:
        events = []
        for ev in _as_list(node.body.get("waitEvents")):
            if not isinstance(ev, dict):
                continue
            event_type = ev.get("eventType")
            ev_name = ev.get("name") or "event"
            params = {p.get("name"): normalize_value(p.get("value")) for p in _as_list(ev.get("inputParameters"))
                      if isinstance(p, dict)}
            kind = "time" if event_type in ("AlarmEvent", "DateRefAlarmEvent") else "producer"
            events.append({"name": ev_name, "event_type": event_type, "class": kind, "inputs": params})
            node.edges.append((f"wait:{ev_name}", _target(ev.get("connector"))))
        if not events:
            self.diag("unsupported_wait_event:none", node.name, "a wait needs at least one event")
        node.edges.append(("default", _target(node.body.get("defaultConnector"))))
        node.data = {"events": events}

    # -- references ---------------------------------------------------------------
    def _references(self) -> None:
        names = set(self.nodes) | set(self.resources)

        def nested_names(value: Any) -> None:
            if isinstance(value, dict):
                if isinstance(value.get("name"), str):
                    names.add(value["name"])
                for v in value.values():
                    nested_names(v)
            elif isinstance(value, list):
                for v in value:
                    nested_names(v)

        for kind in REJECTED_ELEMENTS:
            nested_names(list(self.doc.elements(kind).values()))
        record_trigger = self.trigger.get("trigger_type", "none").startswith("Record")

        def check(ref: Any, element: str) -> None:
            if not isinstance(ref, str) or not ref:
                return
            if PACKAGING_TOKEN in ref:
                return
            if not REF_RE.match(ref):
                self.diag(f"unresolved_reference:{ref[:60]}", element, "not a reference path")
                return
            root = ref.split(".", 1)[0]
            if root.startswith("$"):
                if root not in GLOBAL_ROOTS:
                    self.diag(f"unsupported_reference:{root}", element, "unknown global")
                elif root in ("$Record", "$Record__Prior") and not record_trigger and not self.trigger.get("object"):
                    self.diag(f"unresolved_reference:{root}", element, "the flow has no triggering record")
                elif root == "$Record__Prior" and self.trigger.get("record_trigger_type") == "Create":
                    self.diag(f"unresolved_reference:{root}", element, "a create trigger has no prior record")
                elif root in ("$Record", "$Record__Prior") and ref.count(".") == 1:
                    self._object_field(self.trigger.get("object"), ref.split(".", 1)[1], element)
                return
            if root not in names:
                self.diag(f"unresolved_reference:{root}", element, "names no element or resource")

        def value_refs(value: Any, element: str) -> None:
            if not isinstance(value, dict):
                return
            if value.get("kind") == "elementReference":
                check(value.get("value"), element)
            if value.get("ast"):
                for r in fx.references(value["ast"]):
                    check(r, element)

        for name, (kind, body) in self.resources.items():
            if kind == "formulas" and isinstance(body.get("expression"), str):
                try:
                    for r in fx.references(fx.parse_formula(body["expression"])):
                        check(r, name)
                except fx.FormulaError:
                    pass
            elif kind == "textTemplates" and isinstance(body.get("text"), str):
                try:
                    for r in fx.references(fx.parse_template(body["text"])):
                        check(r, name)
                except fx.FormulaError:
                    pass
            elif kind in ("variables", "constants"):
                value_refs(self._value(body.get("value"), name) if isinstance(body, dict) else None, name)
        if self.trigger.get("filter_formula"):
            for r in fx.references(self.trigger["filter_formula"]):
                check(r, "start")
        for node in self.nodes.values():
            d = node.data
            for item in d.get("items", []):
                check(item["target"], node.name)
                value_refs(item["value"], node.name)
            for rule in d.get("rules", []):
                for c in rule["conditions"]:
                    check(c["left"], node.name)
                    value_refs(c["right"], node.name)
            for c in d.get("conditions", []):
                value_refs(c["right"], node.name)
            if node.kind in ("loops", "collectionProcessors"):
                check(d.get("collection"), node.name)
                check(d.get("item"), node.name)
            for key in ("input_reference", "output_reference"):
                check(d.get(key), node.name)
            for f in d.get("filters", []):
                value_refs(f["value"], node.name)
            for a in d.get("assignments", []):
                value_refs(a["value"], node.name)
            for v in d.get("inputs", {}).values():
                if isinstance(v, dict):
                    value_refs(v, node.name)
            for ev in d.get("events", []):
                for v in ev["inputs"].values():
                    value_refs(v, node.name)

    # -- graph --------------------------------------------------------------------
    def _graph(self) -> list[str]:
        for node in self.nodes.values():
            for kind, target in node.edges:
                if target is not None and target not in self.nodes:
                    self.diag(f"unresolved_reference:{target}", node.name, f"{kind} connector targets no element")
        for kind, target in self.entry_edges:
            if target is not None and target not in self.nodes:
                self.diag(f"unresolved_reference:{target}", "start", "start connector targets no element")
        if self.failed():
            return []
        order: list[str] = []
        colour: dict[str, int] = {}
        for _kind, entry in self.entry_edges:
            if entry is None or entry in colour:
                continue
            stack: list[tuple[str, int]] = [(entry, 0)]
            colour[entry] = 1
            order.append(entry)
            while stack:
                name, idx = stack[-1]
                targets = [t for _k, t in self.nodes[name].edges if t is not None]
                if idx >= len(targets):
                    colour[name] = 2
                    stack.pop()
                    continue
                stack[-1] = (name, idx + 1)
                nxt = targets[idx]
                state = colour.get(nxt, 0)
                if state == 1:
                    if self.nodes[nxt].kind != "loops":
                        self.diag(f"cycle_detected:{nxt}", name,
                                  "connectors form a cycle that does not pass through a loop element")
                elif state == 0:
                    colour[nxt] = 1
                    order.append(nxt)
                    stack.append((nxt, 0))
        for name in self.nodes:
            if name not in colour:
                self.diag(f"unreachable_element:{name}", name, "not reachable from start; not compiled",
                          severity="warning")
        return order

    def _reach(self, start: str | None, *, avoid: str) -> set[str]:
        seen: set[str] = set()
        todo = [start] if start else []
        while todo:
            n = todo.pop()
            if n in seen or n == avoid or n not in self.nodes:
                continue
            seen.add(n)
            todo.extend(t for _k, t in self.nodes[n].edges if t)
        return seen

    def _loops(self, order: list[str]) -> None:
        """Loop bodies, loop bounds (proven or unknown) and per-node fan-out (section 7.2 step 7)."""
        reachable = set(order)
        self.reachable = reachable
        loops = [n for n in order if self.nodes[n].kind == "loops"]
        for name in loops:
            nxt = dict(self.nodes[name].edges).get("loop_next")
            body = {n for n in self._reach(nxt, avoid=name) if name in self._reach_any(n)}
            self.nodes[name].data["body"] = sorted(body)
            for n in sorted(body):
                self.nodes[n].in_loops.append(name)
        for name in loops:
            node = self.nodes[name]
            bound, why = self._loop_bound(node)
            node.data["bound"] = bound
            self.analysis.loops.append({"element": name, "collection": node.data.get("collection"),
                                        "bound": bound, "proof": why, "body": node.data["body"]})

    def _reach_any(self, start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            n = todo.pop()
            for _k, t in self.nodes[n].edges:
                if t and t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    def _loop_bound(self, loop: _Node) -> tuple[str, str]:
        return self._collection_bound(loop.data.get("collection"))

    def _collection_bound(self, coll: Any) -> tuple[str, str]:
        """Prove a static maximum size of a collection, or say why it is unknown."""
        if not isinstance(coll, str):
            return "unknown", "no collection"
        root = coll.split(".", 1)[0]
        src = self.nodes.get(root)
        if src is not None and src.kind == "recordLookups":
            if src.data.get("first_only"):
                return "static:1", f"{root} stores the first record only"
            return "unknown", f"{root} returns every matching record: no metadata bound"
        if src is not None:
            return "unknown", f"{root} is the output of a {src.kind} element"
        resource = self.resources.get(root)
        if resource is None:
            return "unknown", f"{root} is not a flow resource"
        kind, body = resource
        if kind != "variables" or _bool_text(body.get("isInput")):
            return "unknown", f"{root} is supplied by the caller"
        adds = 0
        for node in self.nodes.values():
            if node.kind != "assignments" or node.name not in self.reachable:
                continue
            for item in node.data.get("items", []):
                if item["target"] != root:
                    continue
                op, value = item["operator"], item["value"] or {}
                if op.startswith("Remove"):
                    continue
                if node.in_loops:
                    return "unknown", f"{root} grows inside loop {node.in_loops[0]} ({node.name})"
                if op in ("Add", "AddItem", "AddAtStart") and not (
                        value.get("kind") == "elementReference" and self._is_collection(value.get("value"))):
                    adds += 1
                    continue
                return "unknown", f"{root} is filled from a collection by {node.name} ({op})"
        for node in self.nodes.values():
            if node.data.get("output_reference") == root:
                return "unknown", f"{root} is filled by {node.name}"
        return f"static:{max(adds, 1)}", f"{root} receives at most {adds} item(s) outside any loop"

    def _is_collection(self, ref: Any) -> bool:
        if not isinstance(ref, str):
            return False
        root = ref.split(".", 1)[0]
        if root in self.nodes:
            n = self.nodes[root]
            return n.kind == "recordLookups" and not n.data.get("first_only")
        res = self.resources.get(root)
        return bool(res and _bool_text(res[1].get("isCollection")))

    def _fanout(self, node: _Node) -> str:
        total = 1
        for loop in node.in_loops:
            bound = self.nodes[loop].data.get("bound", "unknown")
            if bound == "unknown":
                return "unknown"
            total *= int(bound.split(":", 1)[1])
        return f"static:{total}"

    # -- capabilities ----------------------------------------------------------------
    def _propagate(self) -> None:
        """Annotate reachable nodes and fold in subflow facts (section 7.2 steps 5-6)."""
        facts = {"effects": [], "waits": [], "time_waits": 0, "producer_waits": 0, "reads": 0, "writes": 0,
                 "fanout_unknown": [], "unknown": list(self.analysis.unknown_capabilities), "tx_forbidden": [],
                 "not_replay_safe": [], "subflows": 0, "mutating_nodes": [], "non_record_mutations": []}
        for name in sorted(self.reachable):
            node = self.nodes[name]
            fan = self._fanout(node)
            node.data["fan_out"] = fan
            weight = None if fan == "unknown" else int(fan.split(":", 1)[1])
            caps = node.entry.capabilities if node.entry else None
            if node.kind == "subflows" and node.child is not None:
                cf = node.child.facts
                facts["subflows"] += 1
                for key in ("effects", "waits", "fanout_unknown", "tx_forbidden", "not_replay_safe",
                            "mutating_nodes"):
                    facts[key] += [f"{name} > {node.child.flow_api_name} > {x}" for x in cf.get(key, [])]
                facts["unknown"] += cf.get("unknown", [])
                facts["time_waits"] += cf.get("time_waits", 0)
                facts["producer_waits"] += cf.get("producer_waits", 0)
                for key in ("reads", "writes"):
                    facts[key] = None if facts[key] is None or cf.get(key) is None or weight is None \
                        else facts[key] + cf[key] * weight
                facts["non_record_mutations"].append(name)
                if fan == "unknown" and (cf.get("reads") or cf.get("writes") or cf.get("effects")):
                    facts["fanout_unknown"].append(name)
                continue
            if caps is None:
                continue
            cls = caps["execution_class"]
            label = f"{name} ({node.entry.action_key}: {cls})"
            if cls == "external_effect":
                facts["effects"].append(label)
            elif cls == "wait":
                facts["waits"].append(label)
                for ev in node.data.get("events", []):
                    facts["time_waits" if ev["class"] == "time" else "producer_waits"] += 1
            elif cls == "record_read":
                facts["reads"] = None if facts["reads"] is None or weight is None else facts["reads"] + weight
            elif cls == "record_mutation":
                facts["writes"] = None if facts["writes"] is None or weight is None else facts["writes"] + weight
                facts["mutating_nodes"].append(label)
                if not (node.kind == "recordUpdates" and node.data.get("input_reference") == "$Record"):
                    facts["non_record_mutations"].append(name)
            if cls != "pure_compute" and fan == "unknown":
                facts["fanout_unknown"].append(f"{name} (in unbounded loop {node.in_loops[0]})")
            if caps["transaction_policy"] == "transaction_forbidden" and cls != "wait":
                facts["tx_forbidden"].append(label)
            if caps["replay_policy"] in ("at_most_once", "not_replayable"):
                facts["not_replay_safe"].append(label)
            if caps["fanout_bound"] == "unknown":
                facts["fanout_unknown"].append(label)
        for lp in self.analysis.loops:
            if lp["bound"] == "unknown":
                facts["fanout_unknown"].append(f"{lp['element']} (loop bound unknown: {lp['proof']})")
        for name in sorted(self.reachable):
            node = self.nodes[name]
            ref = node.data.get("input_reference") if node.kind in ("recordCreates", "recordUpdates",
                                                                     "recordDeletes") else None
            if isinstance(ref, str) and self._is_collection(ref):
                bound, why = self._collection_bound(ref)
                if bound == "unknown":
                    facts["fanout_unknown"].append(f"{name} (bulk {node.kind} over {ref}: {why})")
        if self.trigger.get("trigger_type") == "Scheduled":
            facts["fanout_unknown"].append("start (scheduled trigger over every matching record)")
        for path in self.trigger.get("scheduled_paths", []):
            facts["waits"].append(f"start (scheduled path {path['name']})")
            facts["time_waits"] += 1
        facts["unknown"] = sorted(set(facts["unknown"]))
        self.analysis.unknown_capabilities = facts["unknown"]
        self.analysis.facts = facts
        self.analysis.fan_out = "unknown" if facts["fanout_unknown"] else "bounded"
        for key in facts["unknown"]:
            if key.startswith("subflow:") or any(d.code.endswith(key) for d in self.diags):
                continue
            self.diag(f"unknown_capability:{key}", None, "capability unknown to the sealed catalog")

    def _atomic_blockers(self) -> list[tuple[str, str]]:
        f = self.analysis.facts
        out: list[tuple[str, str]] = []
        out += [(x, "external effect: its network call cannot run inside a Flow transaction") for x in f["effects"]]
        out += [(x, "wait: a transaction cannot cross a wait") for x in f["waits"]]
        out += [(x, "fan-out is not bounded") for x in f["fanout_unknown"]]
        out += [(x, "transaction forbidden by its capability") for x in f["tx_forbidden"]]
        out += [(x, "not replay-safe under the root retry owner") for x in f["not_replay_safe"]]
        if f["reads"] is not None and f["reads"] > ATOMIC_MAX_READS:
            out.append(("reads", f"{f['reads']} reads exceed the policy bound {ATOMIC_MAX_READS}"))
        if f["writes"] is not None and f["writes"] > ATOMIC_MAX_WRITES:
            out.append(("writes", f"{f['writes']} writes exceed the policy bound {ATOMIC_MAX_WRITES}"))
        if self.trigger.get("trigger_type") == "PlatformEvent":
            out.append(("start", "platform-event trigger: producer-backed delivery"))
        return out

    def _select_profile(self) -> str:
        """Section 9 profile selection; a request that cannot be proven is a rejection."""
        requested = self.option_profile or self.doc.data.get("requested_profile")
        if requested is not None and requested not in PROFILES:
            self.diag("invalid_profile_request", None, f"unknown profile {requested!r}")
            return PROFILE_DURABLE
        if self.analysis.unknown_capabilities:
            for key in self.analysis.unknown_capabilities:
                if requested == PROFILE_ATOMIC:
                    self.diag("unsafe_atomic_request", key, "unknown capabilities fail closed for Bounded Atomic")
            return PROFILE_DURABLE  # rejected anyway: unknown capabilities cannot execute
        if self.trigger.get("trigger_type") == "RecordBeforeSave":
            f = self.analysis.facts
            blockers = [(x, "external effect") for x in f["effects"]] + [(x, "wait") for x in f["waits"]]
            blockers += [(x, "fan-out is not bounded") for x in f["fanout_unknown"]]
            blockers += [(x, "mutates records other than the trigger record")
                         for x in f["non_record_mutations"]]
            if f["reads"] is None or f["reads"] > EMBEDDED_MAX_READS:
                blockers.append(("reads", f"reads exceed the embedded bound {EMBEDDED_MAX_READS}"))
            for name in self.reachable:
                node = self.nodes[name]
                caps = node.entry.capabilities if node.entry else None
                if caps and caps["transaction_policy"] not in ("caller_transaction", "profile_dependent"):
                    blockers.append((name, "does not permit the caller transaction"))
            for where, why in blockers:
                self.diag("before_save_unsafe", where, f"before-save output is the trigger record only: {why}")
            if requested not in (None, PROFILE_EMBEDDED):
                self.diag("unsafe_profile_request", None, "a before-save flow runs in the caller transaction")
            return PROFILE_EMBEDDED
        if requested == PROFILE_EMBEDDED:
            self.diag("unsafe_profile_request", None, "Embedded Before-Save needs a before-save record trigger")
        blockers = self._atomic_blockers()
        if requested == PROFILE_ATOMIC:
            for where, why in blockers:
                self.diag("unsafe_atomic_request", where, f"RunAtomically cannot be proven: {why}")
            return PROFILE_ATOMIC
        if requested == PROFILE_DURABLE or blockers:
            return PROFILE_DURABLE
        return PROFILE_ATOMIC

    # -- steps ----------------------------------------------------------------------
    def _node_json(self, node: _Node) -> dict[str, Any]:
        out = {"element": node.name, "type": node.kind, **{k: v for k, v in node.data.items()}}
        if node.entry is not None:
            out.update(action_key=node.entry.action_key, entry_digest=node.entry.entry_digest,
                       binding_fingerprint=node.entry.binding_fingerprint)
        if node.child is not None and node.child.plan is not None:
            out["subflow_plan_digest"] = node.child.plan.plan_digest
            out["subflow_profile"] = node.child.profile
        out["edges"] = [{"kind": k, "to": t} for k, t in node.edges]
        return out

    def _entry_key(self, target: str | None) -> str:
        if target is None:
            return TERMINAL_STEP_KEY
        node = self.nodes[target]
        if node.kind == "actionCalls" and node.entry and node.entry.kind == "effect":
            return f"submit:{target}"
        return f"{STEP_PREFIX[node.kind]}:{target}"

    def _steps(self, order: list[str], profile: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        if profile in (PROFILE_EMBEDDED, PROFILE_ATOMIC):
            graph = [self._node_json(self.nodes[n]) for n in order]
            entry = next((t for k, t in self.entry_edges if t), None)
            kinds = {self.nodes[n].entry.capabilities["execution_class"] for n in order if self.nodes[n].entry}
            if profile == PROFILE_EMBEDDED:
                key, kind = "transform", KIND_EMBEDDED
            elif kinds & {"record_mutation"} or any(self.nodes[n].kind == "subflows" for n in order):
                key, kind = "atomic", KIND_MUTATION
            elif "record_read" in kinds:
                key, kind = "atomic", KIND_CURRENT_READ
            else:
                key, kind = "atomic", KIND_PURE_COMPUTE
            steps = [{"key": key, "kind": kind, "entry_element": entry, "graph": graph, "next": TERMINAL_STEP_KEY},
                     {"key": TERMINAL_STEP_KEY, "kind": KIND_TERMINAL}]
            return steps, [{"from": key, "to": TERMINAL_STEP_KEY, "kind": "success"}]
        steps: list[dict[str, Any]] = []
        edges: list[dict[str, str]] = []
        for name in order:
            node = self.nodes[name]
            out_edges = [(k, self._entry_key(t)) for k, t in node.edges]
            fault = [(k, t) for k, t in out_edges if k == "fault"]
            if node.kind == "actionCalls" and node.entry is not None and node.entry.kind == "effect":
                entry = node.entry
                submit, complete = f"submit:{name}", f"complete:{name}"
                nxt = next(t for k, t in out_edges if k == "success")
                steps.append({
                    "key": submit, "kind": KIND_EFFECT_SUBMIT, "element": name,
                    "action_key": entry.action_key, "entry_digest": entry.entry_digest,
                    "binding_fingerprint": entry.binding_fingerprint, "effect_family": entry.effect_family,
                    "effect_owner": entry.capabilities["effect_owner"], "inputs": node.data["inputs"],
                    "completion_step": complete, "next": complete, "fan_out": node.data.get("fan_out"),
                })
                steps.append({
                    "key": complete, "kind": KIND_EFFECT_COMPLETION, "element": name, "submit_step": submit,
                    "next": nxt, "on_no_effect": fault[0][1] if fault else "terminal_failure",
                    "on_quarantined": "quarantine",
                })
                edges.append({"from": submit, "to": complete, "kind": "effect"})
                edges.append({"from": complete, "to": nxt, "kind": "success"})
                edges += [{"from": complete, "to": t, "kind": "fault"} for _k, t in fault]
                continue
            key = self._entry_key(name)
            step = self._node_json(node)
            step.pop("edges")
            step.pop("element")
            step = {"key": key, "kind": self._durable_kind(node), "element": name, **step}
            if node.kind == "decisions":
                rules = []
                for rule, (_k, nxt) in zip(node.data["rules"], out_edges):
                    rules.append({**rule, "next": nxt})
                step["rules"] = rules
                step["default_next"] = out_edges[-1][1]
            else:
                step["next"] = {k: t for k, t in out_edges}
            steps.append(step)
            edges += [{"from": key, "to": t, "kind": k} for k, t in out_edges]
        steps.append({"key": TERMINAL_STEP_KEY, "kind": KIND_TERMINAL})
        return steps, edges

    def _durable_kind(self, node: _Node) -> str:
        if node.kind in ("waits", "subflows"):
            return KIND_DEPENDENCY_WAIT
        cls = node.entry.capabilities["execution_class"] if node.entry else "pure_compute"
        return {"record_read": KIND_CURRENT_READ, "record_mutation": KIND_MUTATION,
                "wait": KIND_DEPENDENCY_WAIT}.get(cls, KIND_PURE_COMPUTE)

    def _validate_effect_pairs(self, steps: list[dict[str, Any]], edges: list[dict[str, str]]) -> None:
        """Section 7.5: one submit -> one completion; no self-wait; nothing returns from completion to submit."""
        by_key = {s["key"]: s for s in steps}
        outgoing: dict[str, list[dict[str, str]]] = {}
        for e in edges:
            outgoing.setdefault(e["from"], []).append(e)
        completions_of: dict[str, list[str]] = {}
        for s in steps:
            if s["kind"] == KIND_EFFECT_COMPLETION:
                completions_of.setdefault(s.get("submit_step"), []).append(s["key"])
        for s in steps:
            if s["kind"] == KIND_EFFECT_SUBMIT:
                out = outgoing.get(s["key"], [])
                completion = by_key.get(s.get("completion_step"))
                if (len(out) != 1 or out[0]["to"] != s.get("completion_step") or completion is None
                        or completion["kind"] != KIND_EFFECT_COMPLETION or completion.get("submit_step") != s["key"]
                        or completions_of.get(s["key"]) != [s.get("completion_step")]
                        or s.get("completion_step") == s["key"]):
                    self.diag(f"invalid_effect_pair:{s['key']}", s.get("element"),
                              "a submit step has exactly one completion step and waits on nothing else")
            elif s["kind"] == KIND_EFFECT_COMPLETION:
                submit = by_key.get(s.get("submit_step"))
                if submit is None or submit.get("completion_step") != s["key"]:
                    self.diag(f"invalid_effect_pair:{s['key']}", s.get("element"),
                              "a completion step has no matching submit")
                if submit is not None and self._returns_to(s["key"], submit["key"], outgoing):
                    self.diag(f"invalid_effect_pair:{s['key']}", s.get("element"),
                              "an edge path returns from the completion to its submit (an external effect "
                              "inside a loop needs one effect per item, which this compiler does not plan)")

    @staticmethod
    def _returns_to(start: str, target: str, outgoing: dict[str, list[dict[str, str]]]) -> bool:
        seen: set[str] = set()
        todo = [e["to"] for e in outgoing.get(start, [])]
        while todo:
            n = todo.pop()
            if n == target:
                return True
            if n in seen:
                continue
            seen.add(n)
            todo += [e["to"] for e in outgoing.get(n, [])]
        return False

    # -- identity ---------------------------------------------------------------------
    def _cohort(self, profile: str) -> int:
        f = self.analysis.facts
        if profile == PROFILE_EMBEDDED:
            return COHORT_EMBEDDED
        if profile == PROFILE_ATOMIC:
            pure = not f["mutating_nodes"] and not f["reads"] and self.trigger.get("trigger_type") == "none"
            return COHORT_PURE_AUTOLAUNCHED if pure else COHORT_SMALL_ATOMIC
        if f["fanout_unknown"] or f["subflows"]:
            return COHORT_LARGE_COMPLEX
        if f["effects"]:
            return COHORT_EXTERNAL_EFFECTS
        if f["producer_waits"]:
            return COHORT_PRODUCER_WAITS
        if f["time_waits"]:
            return COHORT_TIME_WAITS
        return COHORT_LARGE_COMPLEX

    def _plan(self, profile: str, steps: list[dict[str, Any]], edges: list[dict[str, str]]) -> CompiledPlan:
        binding = self.catalog.binding
        trigger = self.trigger
        trigger_binding_digest = trigger_binding_digest_of(trigger, self.view.digest)
        subflow_digests = {n.data["flow"]: n.child.plan.plan_digest for n in self.nodes.values()
                           if n.child is not None and n.child.plan is not None and n.name in self.reachable}
        variables = {name: {"kind": kind, "data_type": body.get("dataType"),
                            "collection": _bool_text(body.get("isCollection")),
                            "input": _bool_text(body.get("isInput")), "output": _bool_text(body.get("isOutput")),
                            "object": body.get("objectType")}
                     for name, (kind, body) in sorted(self.resources.items()) if kind in ("variables", "constants")}
        formulas = {name: self._formula(name, body.get("expression"))
                    for name, (kind, body) in sorted(self.resources.items()) if kind == "formulas"}
        templates = {name: fx.parse_template(body.get("text") or "")
                     for name, (kind, body) in sorted(self.resources.items()) if kind == "textTemplates"}
        dependencies = [{"step": s["key"], "producer": "runtime.intent_result"} for s in steps
                        if s["kind"] == KIND_EFFECT_COMPLETION]
        dependencies += [{"step": s["key"], "producer": "subflow" if s.get("type") == "subflows" else "wait"}
                         for s in steps if s["kind"] == KIND_DEPENDENCY_WAIT]
        referenced = sorted({(s["action_key"], s["entry_digest"], s["binding_fingerprint"])
                             for s in _all_step_nodes(steps) if s.get("action_key") and s.get("entry_digest")})
        payload = {
            "schema": PAYLOAD_SCHEMA,
            "flow_api_name": self.flow_api_name,
            "profile": profile,
            "trigger": trigger,
            "entry_step": steps[0]["key"],
            "steps": steps,
            "edges": edges,
            "checkpoint_schema": {"record": trigger.get("object"), "variables": variables},
            "formulas": formulas,
            "templates": templates,
            "dependencies": dependencies,
            "referenced_entries": [list(r) for r in referenced],
            "loops": self.analysis.loops,
        }
        payload_digest = digest_json_v2("flows.plan-payload", canonical_json.dumps(payload)).hexdigest
        fields: list[tuple[str, Any]] = [
            ("org_id", binding.org_id),
            ("app_installation_id", binding.app_installation_id),
            ("runtime_capability_id", binding.runtime_capability_id),
            ("engine_generation", binding.engine_generation),
            ("runtime_work_binding_digest", binding.digest),
            ("flow_api_name", self.flow_api_name),
            ("metadata_digest", self.doc.digest),
            ("compiler_version", COMPILER_VERSION),
            ("catalog_generation_id", self.catalog.generation_id),
            ("catalog_digest", self.catalog.digest),
            ("trigger_binding_digest", trigger_binding_digest),
            ("metadata_view_digest", self.view.digest),
            ("policy_version", POLICY_VERSION),
            ("execution_profile", profile),
        ]
        for key, entry_digest, fingerprint in referenced:
            fields += [("entry", key), ("entry_digest", entry_digest), ("binding_fingerprint", fingerprint)]
        for name in sorted(subflow_digests):
            fields += [("subflow", name), ("subflow_plan_digest", subflow_digests[name])]
        fields.append(("payload_digest", payload_digest))
        plan_digest = digest_v2("flows.execution-plan", fields).hexdigest
        f = self.analysis.facts
        effects = sum(1 for s in steps if s["kind"] == KIND_EFFECT_SUBMIT) or len(f["effects"])
        lock_classes = ["FLOW_LIFECYCLE"]
        if f["reads"] or f["writes"] or f["effects"] or trigger.get("object"):
            lock_classes = ["BUSINESS_RECORD", "FLOW_LIFECYCLE"]
        if f["effects"]:
            lock_classes.append("RUNTIME")
        bound_summary = {
            "max_steps": len(steps),
            "effects": effects,
            "decisions": sum(1 for n in self.reachable if self.nodes[n].kind == "decisions"),
            "reads": "unknown" if f["reads"] is None else f["reads"],
            "writes": "unknown" if f["writes"] is None else f["writes"],
            "fan_out": self.analysis.fan_out,
            "loops": [{"element": lp["element"], "bound": lp["bound"]} for lp in self.analysis.loops],
            "lock_classes": lock_classes,
        }
        where = (f"{trigger.get('trigger_type')} {trigger.get('record_trigger_type') or ''} on {trigger.get('object')}"
                 if trigger.get("object") else "autolaunched")
        summary = (f"{self.flow_api_name}: {profile}, {len(steps)} steps, {effects} external effect(s), "
                   f"fan-out {self.analysis.fan_out}; {where.strip()}")
        return CompiledPlan(
            binding=binding, flow_api_name=self.flow_api_name, metadata_digest=self.doc.digest,
            compiler_version=COMPILER_VERSION, catalog_generation_id=self.catalog.generation_id,
            catalog_digest=self.catalog.digest, trigger_binding_digest=trigger_binding_digest,
            metadata_view_digest=self.view.digest, policy_version=POLICY_VERSION, execution_profile=profile,
            payload=payload, payload_digest=payload_digest, plan_digest=plan_digest,
            bound_summary=bound_summary, diagnostic_summary=summary, subflow_plan_digests=subflow_digests,
        )


def validate_effect_pairs(steps: list[dict[str, Any]], edges: list[dict[str, str]]) -> list[Diagnostic]:
    """Section 7.5 plan validation on its own: the ``invalid_effect_pair`` findings of a step graph."""
    checker = _Compiler.__new__(_Compiler)
    checker.diags = []
    checker._validate_effect_pairs(steps, edges)
    return list(checker.diags)


def trigger_binding_digest_of(trigger: dict[str, Any], metadata_view_digest: str) -> str:
    """TriggerBindingDigest: the normalized trigger subscription and the view it was selected from (section 7.4)."""
    return digest_v2("flows.trigger-binding", [
        ("trigger", canonical_json.dumps(trigger)),
        ("metadata_view_digest", metadata_view_digest),
    ]).hexdigest


def _all_step_nodes(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in steps:
        out.append(s)
        out.extend(s.get("graph", []))
    return out


def analyze_flow(*, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot, view: MetadataView,
                 subflows: Mapping[str, bytes] | None = None, requested_profile: str | None = None,
                 schema: str = "strict") -> Analysis:
    """Run the compiler and return its findings; never raises (seed 004 sections 7.2 and 20.4).

    Args:
        source: the ``.flow-meta.xml`` bytes.
        flow_api_name: the Flow's API name.
        catalog: the sealed capability-catalog snapshot of the plan's binding.
        view: the exact RuntimeMetadataView the binding names.
        subflows: API name -> source of every flow a subflow element may call.
        requested_profile: a profile requested by the caller (``bounded_atomic``
            = RunAtomically); the document's own request applies otherwise.
        schema: ``"strict"`` checks objects and trigger fields against ``view``;
            ``"open"`` (compile-only inventory of foreign metadata) does not.

    Returns:
        The :class:`Analysis`; ``plan`` is set only when nothing blocks.
    """
    return _Compiler(source=source, flow_api_name=flow_api_name, catalog=catalog, view=view, subflows=subflows,
                     requested_profile=requested_profile, schema=schema, stack=()).run()


def compile_flow(*, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot, view: MetadataView,
                 subflows: Mapping[str, bytes] | None = None, requested_profile: str | None = None,
                 schema: str = "strict") -> CompiledPlan:
    """Compile one Flow metadata document against a sealed catalog and metadata view (seed 004 section 7).

    Same arguments as :func:`analyze_flow`.

    Returns:
        The immutable compiled plan; identical inputs give an identical plan
        digest (section 7.3), whatever the XML formatting.

    Raises:
        CompileError: with every blocking diagnostic; no other exception escapes.
    """
    result = analyze_flow(source=source, flow_api_name=flow_api_name, catalog=catalog, view=view,
                          subflows=subflows, requested_profile=requested_profile, schema=schema)
    if result.rejected:
        raise CompileError(result.errors or [Diagnostic("compiler_internal_error", None, "no plan")])
    return result.plan


# --- condition evaluation (used by dispatch and the executor; pure) ------------------
def _literal(value: dict[str, Any] | None) -> Any:
    if value is None:
        return None
    kind, text = value.get("kind"), value.get("value")
    if kind == "booleanValue":
        return text == "true"
    if kind == "numberValue":
        return Decimal(text)
    return text


def _compare(op: str, left: Any, right: Any) -> bool:
    if op == "IsNull":
        return (left is None or left == "") == bool(right)
    if op == "IsBlank":
        return (left is None or left == "") == bool(right)
    if op == "EqualTo":
        return left is not None and fx._equal(left, right)
    if op == "NotEqualTo":
        return left is None or not fx._equal(left, right)
    if op in ("GreaterThan", "GreaterThanOrEqualTo", "LessThan", "LessThanOrEqualTo"):
        symbol = {"GreaterThan": ">", "GreaterThanOrEqualTo": ">=", "LessThan": "<", "LessThanOrEqualTo": "<="}[op]
        try:
            return fx._compare(symbol, left, right)
        except fx.FormulaRuntimeError:
            return False
    if op == "Contains":
        return left is not None and str(right) in str(left)
    if op == "StartsWith":
        return left is not None and str(left).startswith(str(right))
    if op == "EndsWith":
        return left is not None and str(left).endswith(str(right))
    raise ValueError(f"operator {op} needs context the evaluator does not have")


def _combine(logic: Any, results: list[bool]) -> bool:
    if not results:
        return True
    if logic == "and":
        return all(results)
    if logic == "or":
        return any(results)
    if isinstance(logic, int):
        return results[logic - 1]
    op = logic[0]
    if op == "not":
        return not _combine(logic[1], results)
    a, b = _combine(logic[1], results), _combine(logic[2], results)
    return (a and b) if op == "and" else (a or b)


def condition_holds(condition: dict[str, Any], fields: dict[str, Any],
                    resolve: Callable[[str], Any] | None = None) -> bool:
    """Evaluate one normalized condition against trigger-record fields.

    Accepts the trigger-filter shape ``{"field", "operator", "value"}`` and the
    decision shape ``{"left", "operator", "right"}``.

    Raises:
        ValueError: an operator or reference this evaluator cannot decide.
    """
    if "field" in condition:
        left = fields.get(condition["field"])
        right_raw = condition["value"]
    else:
        ref = condition["left"]
        if isinstance(ref, str) and ref.startswith("$Record.") and ref.count(".") == 1:
            left = fields.get(ref.split(".", 1)[1])
        elif resolve is not None:
            left = resolve(ref)
        else:
            raise ValueError(f"reference {ref!r} needs a resolver")
        right_raw = condition["right"]
    if isinstance(right_raw, dict) and right_raw.get("kind") == "elementReference":
        if resolve is None:
            raise ValueError("element references need a resolver")
        right = resolve(right_raw["value"])
    else:
        right = _literal(right_raw) if isinstance(right_raw, dict) or right_raw is None else right_raw
    return _compare(condition["operator"], left, right)


def conditions_hold(conditions: list[dict[str, Any]], logic: Any, fields: dict[str, Any],
                    resolve: Callable[[str], Any] | None = None) -> bool:
    """Combine conditions with ``and``/``or`` or a custom logic AST; an empty list holds."""
    return _combine(logic, [condition_holds(c, fields, resolve) for c in conditions])


def trigger_matches(trigger: dict[str, Any], *, object_name: str, created: bool, fields: dict[str, Any]) -> bool:
    """Return True when a saved record matches a plan's record-trigger selection."""
    if trigger.get("object") != object_name:
        return False
    rtt = trigger.get("record_trigger_type")
    if created and rtt not in ("Create", "CreateAndUpdate"):
        return False
    if not created and rtt not in ("Update", "CreateAndUpdate"):
        return False
    return conditions_hold(trigger["filters"], trigger["filter_logic"], fields)
