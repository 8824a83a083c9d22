"""Reference pass: every reference names an element, a resource or a known global (section 7.2 step 2).

Checks element references in values, conditions, collections, formulas and
text templates; ``$Record`` / ``$Record__Prior`` need a triggering record
(and a prior one for an update trigger), and their fields must exist on the
trigger object in a strict view.
"""
from __future__ import annotations

from typing import Any

from .. import formula as fx
from .constants import GLOBAL_ROOTS, PACKAGING_TOKEN, REF_RE, REJECTED_ELEMENTS
from .context import CompileContext
from .document import check_object_field
from .elements import resolve_value


def check_references(ctx: CompileContext) -> None:
    """Report every reference that names no element, resource or supported global."""
    names = set(ctx.nodes) | set(ctx.resources)

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
        nested_names(list(ctx.doc.elements(kind).values()))
    record_trigger = ctx.trigger.get("trigger_type", "none").startswith("Record")

    def check(ref: Any, element: str) -> None:
        if not isinstance(ref, str) or not ref:
            return
        if PACKAGING_TOKEN in ref:
            return
        if not REF_RE.match(ref):
            ctx.diag(f"unresolved_reference:{ref[:60]}", element, "not a reference path")
            return
        root = ref.split(".", 1)[0]
        if root.startswith("$"):
            if root not in GLOBAL_ROOTS:
                ctx.diag(f"unsupported_reference:{root}", element, "unknown global")
            elif root in ("$Record", "$Record__Prior") and not record_trigger and not ctx.trigger.get("object"):
                ctx.diag(f"unresolved_reference:{root}", element, "the flow has no triggering record")
            elif root == "$Record__Prior" and ctx.trigger.get("record_trigger_type") in ("Create", "Delete"):
                ctx.diag(f"unresolved_reference:{root}", element, "a create or delete trigger has no prior record")
            elif root in ("$Record", "$Record__Prior") and ref.count(".") == 1:
                check_object_field(ctx, ctx.trigger.get("object"), ref.split(".", 1)[1], element)
            return
        if root not in names:
            ctx.diag(f"unresolved_reference:{root}", element, "names no element or resource")

    def value_refs(value: Any, element: str) -> None:
        if not isinstance(value, dict):
            return
        if value.get("kind") == "elementReference":
            check(value.get("value"), element)
        if value.get("ast"):
            for r in fx.references(value["ast"]):
                check(r, element)

    for name, (kind, body) in ctx.resources.items():
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
            value_refs(resolve_value(ctx, body.get("value"), name) if isinstance(body, dict) else None, name)
    if ctx.trigger.get("filter_formula"):
        for r in fx.references(ctx.trigger["filter_formula"]):
            check(r, "start")
    for node in ctx.nodes.values():
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
        for target in d.get("outputs", {}):
            check(target, node.name)
        for ev in d.get("events", []):
            for v in ev["inputs"].values():
                value_refs(v, node.name)
