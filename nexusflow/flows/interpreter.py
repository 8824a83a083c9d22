"""Element-graph interpreter for the steps the executor runs (seed 004 sections 7.5, 9.1-9.3).

:func:`run_graph` walks a compiled step's element graph (the ``graph`` of an
``EmbeddedTransform`` / ``BoundedMutation`` step, or a single durable element)
over an in-memory environment and returns an :class:`Outcome`: the trigger
record as transformed, the record writes it would make, and the path taken.

It performs **no writes**. Reads go through a :class:`RecordReader` the caller
supplies (inside the caller's transaction), so the caller decides the
transaction and lock boundary: the executor applies ``Outcome.writes`` only
after its fences are validated, in one transaction with the checkpoint
(seed 004 section 12.2 steps 11-12).

Supported elements: ``assignments``, ``decisions``, ``loops``,
``recordLookups``, ``recordUpdates``, ``recordCreates``, ``collectionProcessors``
and, inside a Bounded Atomic or Embedded graph, ``subflows`` (the child plan's
graph runs inline, in the parent's transaction, as the Flow language runs a subflow
in its caller's transaction; a Durable Orchestration plan runs a subflow as a
child FlowRun instead, :mod:`.services.subflows`). Anything else raises
:class:`FlowExecutionError` (activation refuses such plans first, see
:func:`nexusflow.flows.handlers.engine_support_diagnostics`).

Values: record fields are text (``str``) or ``None``; numbers are
``Decimal`` while computing and are written as canonical text.
"""
from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from . import formula as fx
from .compiler.constants import TERMINAL_STEP_KEY
from .conditions import conditions_hold
from .errors import FlowExecutionError

#: Elements the interpreter runs.
SUPPORTED_ELEMENTS = frozenset({"assignments", "decisions", "loops", "recordLookups", "recordUpdates",
                                "recordCreates", "recordDeletes", "collectionProcessors", "subflows"})
#: Collection processors the interpreter runs (the Collection Filter and Collection Sort elements).
FILTER_PROCESSOR, SORT_PROCESSOR = "FilterCollectionProcessor", "SortCollectionProcessor"
#: Assignment operators that change a collection variable (the Flow metadata's assignment operators,
#: Collection): the value is one item or a collection of items.
COLLECTION_ASSIGNMENT_OPERATORS = frozenset({"AddAtStart", "RemoveAll", "RemoveFirst", "RemoveAfterFirst",
                                             "RemoveBeforeFirst", "RemoveUncommon", "RemovePosition"})
SUPPORTED_ASSIGNMENT_OPERATORS = frozenset({"Assign", "Add", "Subtract", "AddItem", "AssignCount", "Multiply",
                                            "Divide"}) | COLLECTION_ASSIGNMENT_OPERATORS
#: Element visits one run of a graph may make (loops included); exceeding it fails deterministically.
DEFAULT_VISIT_BUDGET = 2000
RECORD_ID = "Id"


class RecordReader(Protocol):
    def query(self, object_name: str, predicate, *, limit: int) -> list[dict[str, Any]]:
        """Live records of ``object_name`` for which ``predicate(record_dict)`` holds, in key order."""


@dataclass
class Write:
    """One record write the graph asks for: ``op`` is ``update``, ``create`` or ``delete``."""

    op: str
    object_name: str
    record_key: str | None
    values: dict[str, str | None]

    def as_json(self) -> dict[str, Any]:
        return {"op": self.op, "object": self.object_name, "record_key": self.record_key,
                "values": dict(sorted(self.values.items()))}


@dataclass
class Outcome:
    """What one graph run decided (JSON-safe through :meth:`as_json`)."""

    record: dict[str, Any]
    writes: list[Write] = field(default_factory=list)
    path: list[str] = field(default_factory=list)
    next_step: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    rule: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "writes": [w.as_json() for w in self.writes], "next": self.next_step}


def running_user(org_id: str | None = None) -> dict[str, Any]:
    """``$User``: the user Flows run as (the system context user), ``{"Id": user id, <field>: text}``.

    Args:
        org_id: the run's org. When given and the org's access policy declares the user, the ``fields`` of
            the policy's user record (seed 004 section 17.1) win over the metadata view's.

    The metadata view's declared users are the base (and the whole answer without an org or a policy); a
    field neither declares reads ``None``.
    """
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER
    from nexusflow.records.metadata import current_view

    user = current_view().users.get(AUTOMATED_PROCESS_USER)
    fields = dict(user.fields) if user is not None else {}
    if org_id is not None:
        from nexusflow.records.selectors import access_policy

        policy = access_policy(org_id=org_id)
        declared = policy.user(AUTOMATED_PROCESS_USER) if policy is not None else None
        if declared is not None:
            fields.update(declared.get("fields") or {})
    return {**fields, "Id": AUTOMATED_PROCESS_USER}


def to_field_text(value: Any) -> str | None:
    """A computed value as record field text (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return fx._text(value)


class _Run:
    def __init__(self, *, plan_payload: dict[str, Any], record: dict[str, Any], object_name: str,
                 prior: dict[str, Any] | None, is_new: bool, now: dt.datetime, reader: RecordReader | None,
                 budget: int, fan_out_limit: int, interview_start: dt.datetime | None = None,
                 subflows: Mapping[str, dict[str, Any]] | None = None):
        self.payload = plan_payload
        self.subflows = subflows or {}
        self.interview_start = interview_start or now
        self.record = dict(record)
        self.object_name = object_name
        self.prior = prior
        self.is_new = is_new
        self.now = now
        self.reader = reader
        self.budget = budget
        #: Element visits made so far, an inline subflow's included (they share the caller's budget).
        self.visits = 0
        self.fan_out_limit = fan_out_limit
        self.vars: dict[str, Any] = {}
        for name, decl in (plan_payload.get("checkpoint_schema", {}).get("variables") or {}).items():
            self.vars[name] = [] if decl.get("collection") else None
        self.elements: dict[str, Any] = {}
        self.loops: dict[str, int] = {}
        self.writes: list[Write] = []
        self.path: list[str] = []
        self.dirty: set[str] = set()
        self.last_rule: str | None = None

    def load_state(self, state: dict[str, Any]) -> None:
        self.vars.update(state.get("vars") or {})
        self.elements.update(state.get("elements") or {})
        self.loops.update(state.get("loops") or {})
        if "record" in state:
            self.record = dict(state["record"])
        self.dirty.update(state.get("dirty") or [])

    def export_state(self) -> dict[str, Any]:
        return {"vars": _jsonable(self.vars), "elements": _jsonable(self.elements), "loops": dict(self.loops),
                "record": _jsonable(self.record), "dirty": sorted(self.dirty)}

    # -- references -------------------------------------------------------------
    def resolve(self, ref: str) -> Any:
        if not isinstance(ref, str) or not ref:
            raise FlowExecutionError(f"bad reference {ref!r}")
        head, _, rest = ref.partition(".")
        if head == "$Record":
            base: Any = self.record
        elif head == "$Record__Prior":
            base = self.prior
        elif head == "$Flow":
            if rest == "CurrentDate":
                return self.now.date()
            if rest == "CurrentDateTime":
                return self.now
            if rest == "InterviewStartTime":
                return self.interview_start
            if rest == "FaultMessage":  # empty outside a fault path; the engine takes no fault connector inline
                return None
            raise FlowExecutionError(f"unsupported global {ref!r}")
        elif head == "$User":
            base = running_user()
        elif head in self.vars:
            base = self.vars[head]
        elif head in self.elements:
            base = self.elements[head]
        elif head in (self.payload.get("formulas") or {}):
            ast = self.payload["formulas"][head]
            if ast is None:
                raise FlowExecutionError(f"formula {head} did not compile")
            base = self._formula(ast)
        elif head in (self.payload.get("templates") or {}):
            base = "".join(part[1] if part[0] == "text" else fx._text(to_field_text(self.resolve(part[1])))
                           for part in self.payload["templates"][head])
        else:
            raise FlowExecutionError(f"unresolved reference {ref!r}")
        parts = [part for part in rest.split(".") if part] if rest else []
        object_name = self.object_name if head in ("$Record", "$Record__Prior") else self._record_object(head)
        for index, part in enumerate(parts):
            if base is None:
                return None
            if not isinstance(base, dict):
                raise FlowExecutionError(f"{ref!r}: {part} of a non-record value")
            if index < len(parts) - 1 and part not in base and is_relationship(part):
                base = self._related(ref, base.get("__object") or object_name, part, base)
                object_name = None if base is None else base.get("__object")
                continue
            base = base.get(part)
            object_name = base.get("__object") if isinstance(base, dict) else None
        return base

    def _related(self, ref: str, object_name: str | None, relationship: str,
                 record: dict[str, Any]) -> dict[str, Any] | None:
        """The record ``relationship`` (``Property__r``) of ``record`` points to, read through the reader."""
        related = getattr(self.reader, "related", None)
        if related is None or not object_name:
            raise FlowExecutionError(f"{ref!r}: {relationship} is read through a relationship, which this step "
                                     "cannot read", code="flow_relationship_unreadable")
        return related(object_name, relationship, record)

    def prior_value(self, ref: str) -> Any:
        """The value ``$Record.<field>`` had before the triggering save (``None`` when it had none).

        Raises:
            FormulaRuntimeError: ``ref`` is not a field of ``$Record``.
        """
        head, _, name = ref.partition(".")
        if head != "$Record" or not name or "." in name:
            raise fx.FormulaRuntimeError(f"{ref!r}: ISCHANGED and PRIORVALUE take a field of $Record")
        return None if self.prior is None else self.prior.get(name)

    def _formula(self, ast: list) -> Any:
        env = fx.Env(resolve=self.resolve, now=self.now, is_new=self.is_new, prior=self.prior_value)
        try:
            return fx.evaluate(ast, env)
        except fx.FormulaRuntimeError as exc:
            raise FlowExecutionError(f"formula: {exc}") from None

    def value(self, raw: dict[str, Any] | None) -> Any:
        if raw is None:
            return None
        kind, text = raw.get("kind"), raw.get("value")
        if kind == "elementReference":
            return self.resolve(text)
        if kind == "formulaExpression":
            if raw.get("ast") is None:
                raise FlowExecutionError("formula did not compile")
            return self._formula(raw["ast"])
        if kind == "booleanValue":
            return text == "true"
        if kind == "numberValue":
            return Decimal(text)
        if kind in ("stringValue", "dateValue", "dateTimeValue"):
            return text
        raise FlowExecutionError(f"unsupported value kind {kind!r}")

    def assign(self, target: str, value: Any) -> None:
        head, _, rest = target.partition(".")
        if head == "$Record":
            if not rest or "." in rest:
                raise FlowExecutionError(f"cannot assign {target!r}")
            self.record[rest] = value
            self.dirty.add(rest)
            return
        if head not in self.vars and head not in self.elements:
            raise FlowExecutionError(f"unknown assignment target {target!r}")
        container = self.vars if head in self.vars else self.elements
        if not rest:
            container[head] = value
            return
        base = container.get(head)
        if base is None:
            base = container[head] = {}
            record_object = self._record_object(head)
            if record_object:  # a record variable: its object names what a recordCreates inserts
                base["__object"] = record_object
        parts = rest.split(".")
        for part in parts[:-1]:
            if not isinstance(base, dict):
                raise FlowExecutionError(f"cannot assign {target!r}")
            base = base.setdefault(part, {})
        if not isinstance(base, dict):
            raise FlowExecutionError(f"cannot assign {target!r}")
        base[parts[-1]] = value
        base.setdefault("__dirty", [])
        if parts[-1] not in base["__dirty"]:
            base["__dirty"].append(parts[-1])

    def _number_variable(self, target: str) -> bool:
        """A declared Number/Currency variable: ``Add`` is arithmetic even when a checkpoint holds it as text."""
        decl = (self.payload.get("checkpoint_schema", {}).get("variables") or {}).get(target) or {}
        return decl.get("data_type") in ("Number", "Currency") and not decl.get("collection")

    def _record_object(self, name: str) -> str | None:
        decl = (self.payload.get("checkpoint_schema", {}).get("variables") or {}).get(name) or {}
        return decl.get("object") if decl.get("data_type") == "SObject" and not decl.get("collection") else None

    # -- elements ---------------------------------------------------------------
    def run(self, graph: list[dict[str, Any]], entry: str | None) -> str | None:
        nodes = {n["element"]: n for n in graph}
        current = entry
        while current is not None:
            node = nodes.get(current)
            if node is None:  # left the graph: the caller's next step
                return current
            self.visits += 1
            if self.visits > self.budget:
                raise FlowExecutionError(f"element visit budget {self.budget} exhausted",
                                         code="flow_budget_exhausted")
            self.path.append(current)
            current = self.step(node)
        return None

    def _edge(self, node: dict[str, Any], kind: str) -> str | None:
        for edge in node.get("edges", []):
            if edge["kind"] == kind:
                return edge["to"]
        return None

    def step(self, node: dict[str, Any]) -> str | None:
        kind = node.get("type")
        if kind not in SUPPORTED_ELEMENTS:
            raise FlowExecutionError(f"element {node.get('element')} of type {kind} is not executable")
        return getattr(self, f"_el_{kind}")(node)

    def _el_assignments(self, node):
        for item in node["items"]:
            op, target = item["operator"], item["target"]
            if op not in SUPPORTED_ASSIGNMENT_OPERATORS:
                raise FlowExecutionError(f"assignment operator {op} is not executable")
            # A record is added or assigned by value: later changes to the variable do not alias it.
            value = copy.deepcopy(self.value(item["value"]))
            current = self.resolve(target) if op != "Assign" else None
            if op == "Assign":
                new = value
            elif op == "AssignCount":
                new = Decimal(len(value or []))
            elif op in ("Add", "AddItem") and isinstance(current, list):
                new = current + (value if isinstance(value, list) and op == "Add" else [value])
            elif op in COLLECTION_ASSIGNMENT_OPERATORS:
                new = collection_assign(op, current, value, target=target)
            elif op == "AddItem":
                new = [value] if current is None else [current, value]
            elif op == "Add" and not self._number_variable(target) and (
                    isinstance(current, str) or (isinstance(value, str) and not _numeric(value))):
                new = fx._text(current) + fx._text(value)
            else:
                a = Decimal(0) if current in (None, "") else _decimal(current)
                b = Decimal(0) if value in (None, "") else _decimal(value)
                if op == "Add":
                    new = a + b
                elif op == "Subtract":
                    new = a - b
                elif op == "Multiply":
                    new = a * b
                else:
                    if b == 0:
                        raise FlowExecutionError("division by zero")
                    new = a / b
            self.assign(target, new)
        return self._edge(node, "success")

    def _el_decisions(self, node):
        fields = {k: v for k, v in self.record.items()}
        for rule, edge in zip(node["rules"], [e for e in node["edges"] if e["kind"].startswith("rule:")], strict=False):
            try:
                holds = conditions_hold(rule["conditions"], rule["logic"], fields, self.resolve)
            except ValueError as exc:
                raise FlowExecutionError(f"decision {node['element']}: {exc}") from None
            if holds:
                self.last_rule = rule["name"]
                return edge["to"]
        self.last_rule = None
        return self._edge(node, "default")

    def _el_loops(self, node):
        name = node["element"]
        items = self.resolve(node["collection"]) or []
        if not isinstance(items, list):
            raise FlowExecutionError(f"loop {name}: {node['collection']} is not a collection")
        if len(items) > self.fan_out_limit:
            raise FlowExecutionError(f"loop {name}: {len(items)} items exceed the bound {self.fan_out_limit}",
                                     code="flow_budget_exhausted")
        ordered = items if node.get("order", "Asc") == "Asc" else list(reversed(items))
        body = self._edge(node, "loop_next")
        if body in (None, TERMINAL_STEP_KEY) and ordered:
            # No "for each" path (metadata without a nextValueConnector): every item is visited with nothing
            # to do, the loop variable ends on the last one, and the loop takes its "after last" path.
            self.elements[name] = copy.deepcopy(ordered[-1])
            if node.get("item"):
                self.assign(node["item"], copy.deepcopy(ordered[-1]))
            self.loops.pop(name, None)
            return self._edge(node, "loop_done")
        index = self.loops.get(name, 0)
        if index < len(ordered):
            self.loops[name] = index + 1
            # The current item is readable as ``<loop name>`` (automatic output) and the declared variable.
            self.elements[name] = copy.deepcopy(ordered[index])
            if node.get("item"):
                self.assign(node["item"], copy.deepcopy(ordered[index]))
            return self._edge(node, "loop_next")
        self.loops.pop(name, None)
        return self._edge(node, "loop_done")

    def _el_collectionProcessors(self, node):
        """Collection Filter (the items for which the conditions hold, each read as the current item) or
        Collection Sort (by each sort option in turn, then at most ``limit`` items); the result is the
        element's output collection. The input collection is never changed."""
        name = node["element"]
        items = self.resolve(node["collection"]) or []
        if not isinstance(items, list):
            raise FlowExecutionError(f"{name}: {node['collection']} is not a collection")
        if node.get("processor") == FILTER_PROCESSOR:
            kept = []
            for item in items:
                if node.get("current_item"):
                    self.assign(node["current_item"], copy.deepcopy(item))
                try:
                    holds = conditions_hold(node["conditions"], node["logic"], dict(self.record), self.resolve)
                except ValueError as exc:
                    raise FlowExecutionError(f"collection filter {name}: {exc}") from None
                if holds:
                    kept.append(copy.deepcopy(item))
            result = kept
        elif node.get("processor") == SORT_PROCESSOR:
            result = copy.deepcopy(items)
            for option in reversed(node.get("sort") or []):  # stable sorts: the first option decides last
                result = _sorted_items(result, option)
            if node.get("limit") is not None:
                result = result[: node["limit"]]
        else:
            raise FlowExecutionError(f"{name}: collection processor {node.get('processor')} is not executable")
        self.elements[name] = result
        return self._edge(node, "success")

    def _filters(self, node) -> Any:
        resolved = []
        for f in node.get("filters", []):
            right = self.value(f.get("value"))
            if f["operator"] in ("In", "NotIn"):  # a collection's items, compared with the field as text
                items = right if isinstance(right, list) else ([] if right is None else [right])
                resolved.append({"field": f["field"], "operator": f["operator"],
                                 "value": [to_field_text(item) for item in items]})
                continue
            resolved.append({"field": f["field"], "operator": f["operator"],
                             "value": {"kind": "stringValue", "value": to_field_text(right)}
                             if not isinstance(right, bool) else {"kind": "booleanValue",
                                                                  "value": "true" if right else "false"}})
        logic = node.get("filter_logic", "and")

        def predicate(rec: dict[str, Any]) -> bool:
            return conditions_hold(resolved, logic, rec)

        return predicate

    def _query(self, node) -> list[dict[str, Any]]:
        if self.reader is None:
            raise FlowExecutionError(f"{node['element']}: record reads are not allowed in this profile")
        return self.reader.query(node["object"], self._filters(node), limit=self.fan_out_limit + 1)

    def _el_recordLookups(self, node):
        found = self._query(node)
        if len(found) > self.fan_out_limit:
            raise FlowExecutionError(f"{node['element']}: more than {self.fan_out_limit} records",
                                     code="flow_budget_exhausted")
        result: Any = (found[0] if found else None) if node.get("first_only") else found
        self.elements[node["element"]] = result
        if node.get("output_reference"):
            self.assign(node["output_reference"], result)
        return self._edge(node, "success")

    def _record_values(self, node, base: dict[str, Any] | None = None) -> dict[str, Any]:
        values = dict(base or {})
        for a in node.get("assignments", []):
            values[a["field"]] = self.value(a["value"])
        return values

    def _apply(self, node, rec: dict[str, Any]) -> None:
        values = self._record_values(node)
        rec.update(values)
        dirty = rec.setdefault("__dirty", [])
        dirty.extend(k for k in values if k not in dirty)

    def _el_recordUpdates(self, node):
        ref = node.get("input_reference")
        if ref == "$Record":
            values = self._record_values(node)
            self.record.update(values)
            self.dirty.update(values)
            if self.object_name and self.dirty:
                self._update(self.object_name, {**self.record, "__dirty": sorted(self.dirty)})
            return self._edge(node, "success")
        if ref:
            target = self.resolve(ref)
            targets = target if isinstance(target, list) else [target]
            for rec in targets:
                if not isinstance(rec, dict) or not rec.get(RECORD_ID) or not rec.get("__object"):
                    raise FlowExecutionError(f"{node['element']}: {ref} holds no stored record")
                self._apply(node, rec)
                self._update(rec["__object"], rec)
            return self._edge(node, "success")
        for rec in self._query(node):
            self._apply(node, rec)
            self._update(node["object"], rec)
        return self._edge(node, "success")

    def _update(self, object_name: str, rec: dict[str, Any]) -> None:
        # Only the fields this run assigned: a concurrent writer's other fields are never overwritten.
        dirty = set(rec.get("__dirty") or [])
        values = {k: to_field_text(v) for k, v in rec.items()
                  if k in dirty and k != RECORD_ID and not k.startswith("__")}
        if not values:
            return
        key = rec.get(RECORD_ID)
        for w in self.writes:  # one write per record: the last values win; a deleted record is not updated
            if w.object_name == object_name and w.record_key == key and w.op in ("update", "delete"):
                if w.op == "update":
                    w.values.update(values)
                return
        self.writes.append(Write("update", object_name, key, values))

    def _el_recordDeletes(self, node):
        """Delete Records: the record(s) a reference holds (a record, a collection, or a lookup's result;
        null or empty deletes nothing), or every record of ``object`` its filters select."""
        ref = node.get("input_reference")
        if ref == "$Record":
            self._delete(self.object_name, self.record.get(RECORD_ID))
        elif ref:
            target = self.resolve(ref)
            declared = self._collection_object(ref.split(".", 1)[0])
            for rec in target if isinstance(target, list) else ([] if target is None else [target]):
                if not isinstance(rec, dict) or not rec.get(RECORD_ID) or not (rec.get("__object") or declared):
                    raise FlowExecutionError(f"{node['element']}: {ref} holds no stored record")
                self._delete(rec.get("__object") or declared, rec[RECORD_ID])
        else:
            for rec in self._query(node):
                self._delete(node["object"], rec[RECORD_ID])
        return self._edge(node, "success")

    def _collection_object(self, name: str) -> str | None:
        decl = (self.payload.get("checkpoint_schema", {}).get("variables") or {}).get(name) or {}
        return decl.get("object") if decl.get("data_type") == "SObject" else None

    def _delete(self, object_name: str, key: str | None) -> None:
        if not object_name or not key:
            raise FlowExecutionError("a record to delete has no object or id")
        # A deleted record's pending update is moot; a record is deleted once.
        self.writes = [w for w in self.writes if not (w.op == "update" and w.object_name == object_name
                                                      and w.record_key == key)]
        if not any(w.op == "delete" and w.object_name == object_name and w.record_key == key for w in self.writes):
            self.writes.append(Write("delete", object_name, key, {}))

    def _el_recordCreates(self, node):
        ref = node.get("input_reference")
        if ref:
            source = self.resolve(ref)
            items = source if isinstance(source, list) else [source]
            for rec in items:
                if not isinstance(rec, dict) or not rec.get("__object"):
                    raise FlowExecutionError(f"{node['element']}: {ref} names no object to create")
                self.writes.append(Write("create", rec["__object"], None, {
                    k: to_field_text(v) for k, v in rec.items() if k != RECORD_ID and not k.startswith("__")}))
        else:
            values = {k: to_field_text(v) for k, v in self._record_values(node).items()}
            self.writes.append(Write("create", node["object"], None, values))
        return self._edge(node, "success")

    def _el_subflows(self, node):
        """Run the called flow's plan inline: inputs in, its graph over a scope of its own, writes and outputs
        back (the parent's transaction and lock plan; seed 004 section 9.2)."""
        payload = self.subflows.get(node.get("subflow_plan_digest"))
        if payload is None:
            raise FlowExecutionError(f"{node['element']}: the plan of subflow {node.get('flow')} is not deployed",
                                     code="flow_subflow_missing")
        step = payload["steps"][0]
        if "graph" not in step:
            raise FlowExecutionError(f"{node['element']}: subflow {node.get('flow')} is a durable plan; it runs as "
                                     "a child run, not inside this transaction", code="flow_subflow_not_inline")
        child = _Run(plan_payload=payload, record={}, object_name="", prior=None, is_new=False, now=self.now,
                     reader=self.reader, budget=self.budget - self.visits, fan_out_limit=self.fan_out_limit,
                     interview_start=self.interview_start, subflows=self.subflows)
        child.vars.update(subflow_inputs(node, payload, self.value))
        child.run(step["graph"], step.get("entry_element"))
        self.visits += child.visits
        self.path.extend(f"{node['element']}>{element}" for element in child.path)
        for write in child.writes:
            if write.op == "update":
                self._update(write.object_name, {RECORD_ID: write.record_key, **write.values,
                                                 "__dirty": list(write.values)})
            else:
                self.writes.append(write)
        self.subflow_outputs(node, payload, child.vars)
        return self._edge(node, "success")

    def subflow_outputs(self, node: dict[str, Any], payload: dict[str, Any], values: dict[str, Any]) -> None:
        """Copy a finished subflow's output variables (``values``: its variables) into this run.

        Raises:
            FlowExecutionError: an output assignment names a variable the child does not declare as output.
        """
        declared = _variables(payload)
        outputs = sorted(n for n, d in declared.items() if d.get("output"))
        for target, name in sorted((node.get("outputs") or {}).items()):
            if name not in outputs:
                raise FlowExecutionError(f"{node['element']}: {name} is not an output variable of "
                                         f"{node.get('flow')}", code="flow_subflow_output")
            self.assign(target, values.get(name))
        if node.get("store_output"):
            self.elements[node["element"]] = {name: values.get(name) for name in outputs}


def _variables(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return (payload.get("checkpoint_schema") or {}).get("variables") or {}


def subflow_inputs(node: dict[str, Any], payload: dict[str, Any], value) -> dict[str, Any]:
    """The called flow's input variables from a subflow element's input assignments (JSON-safe).

    ``value`` evaluates one compiled value in the caller's run. A collection input takes a list.

    Raises:
        FlowExecutionError: an assignment names no input variable of the child (code ``flow_subflow_input``).
    """
    declared = _variables(payload)
    out: dict[str, Any] = {}
    for name, raw in sorted((node.get("inputs") or {}).items()):
        decl = declared.get(name) or {}
        if not decl.get("input"):
            raise FlowExecutionError(f"{node['element']}: {name} is not an input variable of {node.get('flow')}",
                                     code="flow_subflow_input")
        given = value(raw)
        if decl.get("collection") and given is not None and not isinstance(given, list):
            raise FlowExecutionError(f"{node['element']}: input {name} of {node.get('flow')} takes a collection",
                                     code="flow_subflow_input")
        out[name] = [] if given is None and decl.get("collection") else _jsonable(given)
    return out


def is_relationship(part: str) -> bool:
    """Does path segment ``part`` name a relationship (``Broker__r``, or a standard one named like its object)
    rather than a field? A custom relationship ends ``__r``; a standard one is a capitalised name without
    ``__`` that is not ``Id`` (resolved against the object's lookup fields, :func:`relationship_field`)."""
    return part.endswith("__r") or (part[:1].isupper() and "__" not in part and part != RECORD_ID)


def relationship_field(view, object_name: str, relationship: str) -> tuple[str, str]:
    """The lookup field of ``object_name`` behind ``relationship`` and the object it references.

    ``X__r`` is the custom lookup ``X__c``; a standard relationship ``R`` is the lookup ``RId`` (or
    ``r_id``). ``view`` is the metadata view (:class:`nexusflow.records.metadata.MetadataView`).

    Raises:
        FlowExecutionError: the object has no such lookup field (code ``flow_relationship_unknown``).
    """
    if relationship.endswith("__r"):
        candidates = [relationship[:-3] + "__c"]
    else:
        candidates = [relationship + "Id", relationship.lower() + "_id"]
    definition = view.objects.get(object_name)
    for name in candidates:
        found = definition.fields.get(name) if definition is not None else None
        if found is not None and found.references:
            return name, found.references
    raise FlowExecutionError(f"{object_name}.{relationship}: no lookup field {' or '.join(candidates)} in the "
                             "metadata view", code="flow_relationship_unknown")


def _jsonable(value: Any) -> Any:
    """``value`` with Decimals and dates as text (checkpoint context is JSON)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, (Decimal, dt.date, dt.datetime)):
        return to_field_text(value)
    return value


def _sorted_items(items: list, option: dict[str, Any]) -> list:
    """``items`` sorted by ``option`` (``{"field", "order", "nulls_first"}``; no field: the items themselves).
    Numbers compare as numbers, everything else as text; empty and null values go first or last as the
    option says, whatever the order."""
    field = option.get("field")

    def value(item: Any) -> Any:
        return item.get(field) if field and isinstance(item, dict) else item

    def key(item: Any) -> tuple:
        v = value(item)
        if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool) or (isinstance(v, str) and _numeric(v)):
            return (0, _decimal(v), "")
        return (1, Decimal(0), fx._text(v))

    empty = [i for i in items if value(i) in (None, "")]
    present = sorted((i for i in items if value(i) not in (None, "")), key=key,
                     reverse=option.get("order") == "Desc")
    return empty + present if option.get("nulls_first") else present + empty


def collection_assign(op: str, current: Any, value: Any, *, target: str = "") -> list:
    """The new value of collection variable ``target`` (``current``: a list or ``None``) after assignment
    operator ``op`` of :data:`COLLECTION_ASSIGNMENT_OPERATORS` with ``value`` (one item or a list of items).

    As the Flow language defines them: ``AddAtStart`` puts the value's items first; ``RemoveAll`` removes every
    item equal to one of them; ``RemoveFirst`` the first item equal to each; ``RemoveAfterFirst`` every
    item after the first one equal to the value (keeping it) and ``RemoveBeforeFirst`` every item before
    it (the collection is unchanged when no item equals it); ``RemoveUncommon`` every item equal to none
    of them; ``RemovePosition`` the item at the 1-based position ``value``. Items compare by value.

    Raises:
        FlowExecutionError: ``current`` is not a collection, or ``RemovePosition`` names no position of it.
    """
    if current is not None and not isinstance(current, list):
        raise FlowExecutionError(f"{target}: {op} needs a collection variable")
    items = list(current or [])
    values = value if isinstance(value, list) else [value]
    if op == "AddAtStart":
        return values + items
    if op == "RemoveAll":
        return [item for item in items if item not in values]
    if op == "RemoveUncommon":
        return [item for item in items if item in values]
    if op == "RemoveFirst":
        for wanted in values:
            if wanted in items:
                items.remove(wanted)
        return items
    if op in ("RemoveAfterFirst", "RemoveBeforeFirst"):
        if value not in items:
            return items
        at = items.index(value)
        return items[:at + 1] if op == "RemoveAfterFirst" else items[at:]
    if op == "RemovePosition":
        position = _decimal(value) if _numeric(value) and not isinstance(value, bool) else None
        if position is None or position != position.to_integral_value() or not 1 <= position <= len(items):
            raise FlowExecutionError(f"{target}: RemovePosition {value!r} is not a position of its "
                                     f"{len(items)} item(s)", code="flow_collection_position")
        del items[int(position) - 1]
        return items
    raise FlowExecutionError(f"assignment operator {op} is not a collection operator")


def _numeric(value: Any) -> bool:
    try:
        Decimal(str(value))
        return True
    except Exception:  # any parse failure means "not a number"
        return False


def _decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool) or not _numeric(value):
        raise FlowExecutionError(f"expected a number, got {value!r}")
    return Decimal(str(value))


def run_graph(*, plan_payload: dict[str, Any], graph: list[dict[str, Any]], entry: str | None,
              record: dict[str, Any], object_name: str, now: dt.datetime, reader: RecordReader | None,
              prior: dict[str, Any] | None = None, is_new: bool = False, budget: int = DEFAULT_VISIT_BUDGET,
              fan_out_limit: int = 200, state: dict[str, Any] | None = None,
              interview_start: dt.datetime | None = None,
              subflows: Mapping[str, dict[str, Any]] | None = None) -> Outcome:
    """Run ``graph`` from ``entry`` over ``record``; return what it decided, writing nothing.

    Args:
        plan_payload: the compiled plan payload (variables, formulas).
        graph: element nodes (``{"element", "type", ..., "edges"}``).
        entry: the first element name, ``None`` for an empty graph.
        record: the trigger record as ``{"Id": record_key, <field>: text|None}``.
        object_name: the trigger object (writes to ``$Record`` target it).
        now: the database clock of the run (``$Flow.CurrentDate``, ``NOW()``).
        reader: read access for lookups and filtered updates, ``None`` to refuse reads.
        prior: the trigger record's field values before the triggering save
            (``{field: text|None}``), read by ``$Record__Prior``, ``ISCHANGED``
            and ``PRIORVALUE``; ``None`` on create or without a trigger record.
        is_new: the triggering save created the record (``ISNEW()``; then
            ``ISCHANGED`` is false and ``PRIORVALUE`` the current value).
        budget: element visits allowed; loops count each visit.
        fan_out_limit: the largest collection a loop or lookup may return.
        state: a previous step's exported state (variables, element results,
            loop cursors, the in-memory ``$Record``), from its checkpoint.
        interview_start: when the run started (``$Flow.InterviewStartTime``);
            ``now`` when not given.
        subflows: the plan payloads of the subflows the graph calls inline, by
            plan digest (``subflow_plan_digest`` of each ``subflows`` node).

    Returns:
        The :class:`Outcome`; ``next_step`` is the first element outside
        ``graph`` the walk reached (``None`` at the end).

    Raises:
        FlowExecutionError: an unsupported element/operator, an unresolved
            reference, a formula error, or an exhausted budget (code
            ``flow_budget_exhausted``). Always definite: replay cannot fix it.
    """
    run = _Run(plan_payload=plan_payload, record=record, object_name=object_name, prior=prior, is_new=is_new,
               now=now, reader=reader, budget=budget, fan_out_limit=fan_out_limit, interview_start=interview_start,
               subflows=subflows)
    if state:
        run.load_state(state)
    nxt = run.run(graph, entry)
    return Outcome(record=run.record, writes=run.writes, path=run.path, next_step=nxt,
                   state=run.export_state(), rule=run.last_rule)
