"""Plan pass: step grouping, effect-pair validation and plan identity (seed 004 sections 7.3 and 7.5).

:func:`group_steps` turns the graph into steps for the selected profile (one
atomic or embedded step, or one durable step per element with each external
effect expanded to an ``EffectSubmit`` -> ``EffectCompletion`` pair);
:func:`validate_effect_pairs` checks those pairs; :func:`build_plan` computes
the payload, its digest and the plan digest over every section 7.3 input.
"""
from __future__ import annotations

from typing import Any

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_json_v2, digest_v2

from .. import formula as fx
from ..errors import Diagnostic
from .constants import (
    COMPILER_VERSION,
    KIND_CURRENT_READ,
    KIND_DEPENDENCY_WAIT,
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_EMBEDDED,
    KIND_MUTATION,
    KIND_PURE_COMPUTE,
    KIND_TERMINAL,
    PAYLOAD_SCHEMA,
    PROFILE_ATOMIC,
    PROFILE_EMBEDDED,
    SCHEDULED_STEP_PREFIX,
    STEP_PREFIX,
    TERMINAL_STEP_KEY,
)
from .context import CompileContext, CompiledPlan, _Node
from .document import formula_ast
from .values import _bool_text


def _node_json(ctx: CompileContext, node: _Node) -> dict[str, Any]:
    out = {"element": node.name, "type": node.kind, **{k: v for k, v in node.data.items()}}
    if node.entry is not None:
        out.update(action_key=node.entry.action_key, entry_digest=node.entry.entry_digest,
                   binding_fingerprint=node.entry.binding_fingerprint)
    if node.child is not None and node.child.plan is not None:
        out["subflow_plan_digest"] = node.child.plan.plan_digest
        out["subflow_profile"] = node.child.profile
    out["edges"] = [{"kind": k, "to": t} for k, t in node.edges]
    return out


def _entry_key(ctx: CompileContext, target: str | None) -> str:
    if target is None:
        return TERMINAL_STEP_KEY
    node = ctx.nodes[target]
    if node.kind == "actionCalls" and node.entry and node.entry.kind == "effect":
        return f"submit:{target}"
    return f"{STEP_PREFIX[node.kind]}:{target}"


def group_steps(ctx: CompileContext, order: list[str],
                profile: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The steps and step edges of the plan for ``profile`` (section 7.5 step grouping)."""
    if profile in (PROFILE_EMBEDDED, PROFILE_ATOMIC):
        graph = [_node_json(ctx, ctx.nodes[n]) for n in order]
        entry = next((t for k, t in ctx.entry_edges if t), None)
        kinds = {ctx.nodes[n].entry.capabilities["execution_class"] for n in order if ctx.nodes[n].entry}
        if profile == PROFILE_EMBEDDED:
            key, kind = "transform", KIND_EMBEDDED
        elif kinds & {"record_mutation"} or any(ctx.nodes[n].kind == "subflows" for n in order):
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
        node = ctx.nodes[name]
        out_edges = [(k, _entry_key(ctx, t)) for k, t in node.edges]
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
        key = _entry_key(ctx, name)
        step = _node_json(ctx, node)
        step.pop("edges")
        step.pop("element")
        step = {"key": key, "kind": _durable_kind(ctx, node), "element": name, **step}
        if node.kind == "decisions":
            rules = []
            for rule, (_k, nxt) in zip(node.data["rules"], out_edges, strict=False):
                rules.append({**rule, "next": nxt})
            step["rules"] = rules
            step["default_next"] = out_edges[-1][1]
        else:
            step["next"] = {k: t for k, t in out_edges}
        steps.append(step)
        edges += [{"from": key, "to": t, "kind": k} for k, t in out_edges]
    for path in (ctx.trigger or {}).get("scheduled_paths") or []:
        # A scheduled path runs as its own run: its first step waits for the path's time on the database clock.
        target = next((t for k, t in ctx.entry_edges if k == f"scheduled:{path['name']}"), None)
        key = f"{SCHEDULED_STEP_PREFIX}{path['name']}"
        steps.append({"key": key, "kind": KIND_DEPENDENCY_WAIT, "type": "scheduled_path", "element": "start",
                      "path": path, "next": {"resume": _entry_key(ctx, target)}})
        edges.append({"from": key, "to": _entry_key(ctx, target), "kind": "resume"})
    steps.append({"key": TERMINAL_STEP_KEY, "kind": KIND_TERMINAL})
    return steps, edges


def _durable_kind(ctx: CompileContext, node: _Node) -> str:
    if node.kind in ("waits", "subflows"):
        return KIND_DEPENDENCY_WAIT
    cls = node.entry.capabilities["execution_class"] if node.entry else "pure_compute"
    return {"record_read": KIND_CURRENT_READ, "record_mutation": KIND_MUTATION,
            "wait": KIND_DEPENDENCY_WAIT}.get(cls, KIND_PURE_COMPUTE)


def validate_effect_pairs(steps: list[dict[str, Any]], edges: list[dict[str, str]]) -> list[Diagnostic]:
    """Section 7.5 plan validation on its own: the ``invalid_effect_pair`` findings of a step graph.

    One submit -> one completion; no self-wait; nothing returns from completion to submit.
    """
    findings: list[Diagnostic] = []

    def diag(code: str, element: str | None, message: str) -> None:
        finding = Diagnostic(code, element, message)
        if finding not in findings:
            findings.append(finding)

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
                diag(f"invalid_effect_pair:{s['key']}", s.get("element"),
                     "a submit step has exactly one completion step and waits on nothing else")
        elif s["kind"] == KIND_EFFECT_COMPLETION:
            submit = by_key.get(s.get("submit_step"))
            if submit is None or submit.get("completion_step") != s["key"]:
                diag(f"invalid_effect_pair:{s['key']}", s.get("element"),
                     "a completion step has no matching submit")
            if submit is not None and _returns_to(s["key"], submit["key"], outgoing):
                diag(f"invalid_effect_pair:{s['key']}", s.get("element"),
                     "an edge path returns from the completion to its submit (an external effect "
                     "inside a loop needs one effect per item, which this compiler does not plan)")
    return findings


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


def build_plan(ctx: CompileContext, profile: str, steps: list[dict[str, Any]],
               edges: list[dict[str, str]]) -> CompiledPlan:
    """The :class:`CompiledPlan`: payload, payload digest and plan digest over every section 7.3 input."""
    binding = ctx.catalog.binding
    trigger = ctx.trigger
    trigger_binding_digest = trigger_binding_digest_of(trigger, ctx.view.digest)
    subflow_digests = {n.data["flow"]: n.child.plan.plan_digest for n in ctx.nodes.values()
                       if n.child is not None and n.child.plan is not None and n.name in ctx.reachable}
    variables = {name: {"kind": kind, "data_type": body.get("dataType"),
                        "collection": _bool_text(body.get("isCollection")),
                        "input": _bool_text(body.get("isInput")), "output": _bool_text(body.get("isOutput")),
                        "object": body.get("objectType")}
                 for name, (kind, body) in sorted(ctx.resources.items()) if kind in ("variables", "constants")}
    formulas = {name: formula_ast(ctx, name, body.get("expression"))
                for name, (kind, body) in sorted(ctx.resources.items()) if kind == "formulas"}
    templates = {name: fx.parse_template(body.get("text") or "")
                 for name, (kind, body) in sorted(ctx.resources.items()) if kind == "textTemplates"}
    paths = trigger.get("scheduled_paths") or []
    dependencies = [{"step": s["key"], "producer": "runtime.intent_result"} for s in steps
                    if s["kind"] == KIND_EFFECT_COMPLETION]
    dependencies += [{"step": s["key"], "producer": "subflow" if s.get("type") == "subflows" else "runtime.clock"}
                     for s in steps if s["kind"] == KIND_DEPENDENCY_WAIT]
    referenced = sorted({(s["action_key"], s["entry_digest"], s["binding_fingerprint"])
                         for s in _all_step_nodes(steps) if s.get("action_key") and s.get("entry_digest")})
    payload = {
        "schema": PAYLOAD_SCHEMA,
        "flow_api_name": ctx.flow_api_name,
        "profile": profile,
        "trigger": trigger,
        "entry_step": steps[0]["key"] if not paths else _entry_key(
            ctx, next((t for k, t in ctx.entry_edges if k == "success"), None)),
        "steps": steps,
        "edges": edges,
        "checkpoint_schema": {"record": trigger.get("object"), "variables": variables},
        "formulas": formulas,
        "templates": templates,
        "dependencies": dependencies,
        "referenced_entries": [list(r) for r in referenced],
        "loops": ctx.analysis.loops,
    }
    if paths:
        payload["scheduled_paths"] = [{"name": p["name"], "step": f"{SCHEDULED_STEP_PREFIX}{p['name']}"} for p in paths]
    payload_digest = digest_json_v2("flows.plan-payload", canonical_json.dumps(payload)).hexdigest
    fields: list[tuple[str, Any]] = [
        ("org_id", binding.org_id),
        ("app_installation_id", binding.app_installation_id),
        ("runtime_capability_id", binding.runtime_capability_id),
        ("engine_generation", binding.engine_generation),
        ("runtime_work_binding_digest", binding.digest),
        ("flow_api_name", ctx.flow_api_name),
        ("metadata_digest", ctx.doc.digest),
        ("compiler_version", COMPILER_VERSION),
        ("catalog_generation_id", ctx.catalog.generation_id),
        ("catalog_digest", ctx.catalog.digest),
        ("trigger_binding_digest", trigger_binding_digest),
        ("metadata_view_digest", ctx.view.digest),
        ("policy_version", ctx.bounds.version),
        ("execution_profile", profile),
    ]
    for key, entry_digest, fingerprint in referenced:
        fields += [("entry", key), ("entry_digest", entry_digest), ("binding_fingerprint", fingerprint)]
    for name in sorted(subflow_digests):
        fields += [("subflow", name), ("subflow_plan_digest", subflow_digests[name])]
    fields.append(("payload_digest", payload_digest))
    plan_digest = digest_v2("flows.execution-plan", fields).hexdigest
    f = ctx.analysis.facts
    effects = sum(1 for s in steps if s["kind"] == KIND_EFFECT_SUBMIT) or len(f["effects"])
    lock_classes = ["FLOW_LIFECYCLE"]
    if f["reads"] or f["writes"] or f["effects"] or trigger.get("object"):
        lock_classes = ["BUSINESS_RECORD", "FLOW_LIFECYCLE"]
    if f["effects"]:
        lock_classes.append("RUNTIME")
    bound_summary = {
        "max_steps": len(steps),
        "effects": effects,
        "decisions": sum(1 for n in ctx.reachable if ctx.nodes[n].kind == "decisions"),
        "reads": "unknown" if f["reads"] is None else f["reads"],
        "writes": "unknown" if f["writes"] is None else f["writes"],
        "fan_out": ctx.analysis.fan_out,
        "loops": [{"element": lp["element"], "bound": lp["bound"]} for lp in ctx.analysis.loops],
        "lock_classes": lock_classes,
    }
    where = (f"{trigger.get('trigger_type')} {trigger.get('record_trigger_type') or ''} on {trigger.get('object')}"
             if trigger.get("object") else "autolaunched")
    summary = (f"{ctx.flow_api_name}: {profile}, {len(steps)} steps, {effects} external effect(s), "
               f"fan-out {ctx.analysis.fan_out}; {where.strip()}")
    return CompiledPlan(
        binding=binding, flow_api_name=ctx.flow_api_name, metadata_digest=ctx.doc.digest,
        compiler_version=COMPILER_VERSION, catalog_generation_id=ctx.catalog.generation_id,
        catalog_digest=ctx.catalog.digest, trigger_binding_digest=trigger_binding_digest,
        metadata_view_digest=ctx.view.digest, policy_version=ctx.bounds.version, execution_profile=profile,
        payload=payload, payload_digest=payload_digest, plan_digest=plan_digest,
        bound_summary=bound_summary, diagnostic_summary=summary, subflow_plan_digests=subflow_digests,
        subflow_plans={n.child.plan.plan_digest: n.child.plan for n in ctx.nodes.values()
                       if n.child is not None and n.child.plan is not None and n.name in ctx.reachable},
    )


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
