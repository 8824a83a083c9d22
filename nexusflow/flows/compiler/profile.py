"""Capabilities, profile selection and migration cohort (seed 004 sections 7.2 steps 5-6, 9 and 20.7).

:func:`propagate_capabilities` annotates the reachable elements from their
catalog entries and folds in subflow facts; :func:`select_profile` proves
Embedded Before-Save, Bounded Atomic or falls back to Durable Orchestration
(a requested profile that cannot be proven is a rejection naming each
blocker); :func:`cohort_of` places the flow in its section 20.7 cohort.
"""
from __future__ import annotations

from .constants import (
    COHORT_EMBEDDED,
    COHORT_EXTERNAL_EFFECTS,
    COHORT_LARGE_COMPLEX,
    COHORT_PRODUCER_WAITS,
    COHORT_PURE_AUTOLAUNCHED,
    COHORT_SMALL_ATOMIC,
    COHORT_TIME_WAITS,
    EMBEDDED_MAX_READS,
    PROFILE_ATOMIC,
    PROFILE_DURABLE,
    PROFILE_EMBEDDED,
    PROFILES,
)
from .context import CompileContext
from .graph import collection_bound, fanout, is_collection


def propagate_capabilities(ctx: CompileContext) -> None:
    """Annotate reachable nodes and fold in subflow facts (section 7.2 steps 5-6)."""
    facts = {"effects": [], "waits": [], "time_waits": 0, "producer_waits": 0, "reads": 0, "writes": 0,
             "fanout_unknown": [], "unknown": list(ctx.analysis.unknown_capabilities), "tx_forbidden": [],
             "not_replay_safe": [], "subflows": 0, "mutating_nodes": [], "non_record_mutations": []}
    for name in sorted(ctx.reachable):
        node = ctx.nodes[name]
        fan = fanout(ctx, node)
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
            # An Update Records of a record collection writes every record in it: the collection's bound.
            ref = node.data.get("input_reference")
            if node.kind == "recordUpdates" and ref not in (None, "$Record") and is_collection(ctx, ref):
                size = collection_bound(ctx, ref)[0]
                weight = None if weight is None or size == "unknown" else weight * int(size.split(":", 1)[1])
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
    for lp in ctx.analysis.loops:
        if lp["bound"] == "unknown":
            facts["fanout_unknown"].append(f"{lp['element']} (loop bound unknown: {lp['proof']})")
    for name in sorted(ctx.reachable):
        node = ctx.nodes[name]
        ref = node.data.get("input_reference") if node.kind in ("recordCreates", "recordUpdates",
                                                                 "recordDeletes") else None
        if isinstance(ref, str) and is_collection(ctx, ref):
            bound, why = collection_bound(ctx, ref)
            if bound == "unknown":
                facts["fanout_unknown"].append(f"{name} (bulk {node.kind} over {ref}: {why})")
    if ctx.trigger.get("trigger_type") == "Scheduled":
        facts["fanout_unknown"].append("start (scheduled trigger over every matching record)")
    for path in ctx.trigger.get("scheduled_paths", []):
        facts["waits"].append(f"start (scheduled path {path['name']})")
        facts["time_waits"] += 1
    facts["unknown"] = sorted(set(facts["unknown"]))
    ctx.analysis.unknown_capabilities = facts["unknown"]
    ctx.analysis.facts = facts
    ctx.analysis.fan_out = "unknown" if facts["fanout_unknown"] else "bounded"
    for key in facts["unknown"]:
        if key.startswith("subflow:") or any(d.code.endswith(key) for d in ctx.diags):
            continue
        ctx.diag(f"unknown_capability:{key}", None, "capability unknown to the sealed catalog")


def _atomic_blockers(ctx: CompileContext) -> list[tuple[str, str]]:
    f = ctx.analysis.facts
    out: list[tuple[str, str]] = []
    out += [(x, "external effect: its network call cannot run inside a Flow transaction") for x in f["effects"]]
    out += [(x, "wait: a transaction cannot cross a wait") for x in f["waits"]]
    out += [(x, "fan-out is not bounded") for x in f["fanout_unknown"]]
    out += [(x, "transaction forbidden by its capability") for x in f["tx_forbidden"]]
    out += [(x, "not replay-safe under the root retry owner") for x in f["not_replay_safe"]]
    bounds = ctx.bounds
    if f["reads"] is not None and f["reads"] > bounds.atomic_max_reads:
        out.append(("reads", f"{f['reads']} reads exceed the policy bound {bounds.atomic_max_reads} "
                             f"({bounds.version})"))
    if f["writes"] is not None and f["writes"] > bounds.atomic_max_writes:
        out.append(("writes", f"{f['writes']} writes exceed the policy bound {bounds.atomic_max_writes} "
                              f"({bounds.version})"))
    if ctx.trigger.get("trigger_type") == "PlatformEvent":
        out.append(("start", "platform-event trigger: producer-backed delivery"))
    return out


def select_profile(ctx: CompileContext) -> str:
    """Section 9 profile selection; a request that cannot be proven is a rejection."""
    requested = ctx.option_profile or ctx.doc.data.get("requested_profile")
    if requested is not None and requested not in PROFILES:
        ctx.diag("invalid_profile_request", None, f"unknown profile {requested!r}")
        return PROFILE_DURABLE
    if ctx.analysis.unknown_capabilities:
        for key in ctx.analysis.unknown_capabilities:
            if requested == PROFILE_ATOMIC:
                ctx.diag("unsafe_atomic_request", key, "unknown capabilities fail closed for Bounded Atomic")
        return PROFILE_DURABLE  # rejected anyway: unknown capabilities cannot execute
    if ctx.trigger.get("trigger_type") == "RecordBeforeSave":
        f = ctx.analysis.facts
        blockers = [(x, "external effect") for x in f["effects"]] + [(x, "wait") for x in f["waits"]]
        blockers += [(x, "fan-out is not bounded") for x in f["fanout_unknown"]]
        blockers += [(x, "mutates records other than the trigger record")
                     for x in f["non_record_mutations"]]
        if f["reads"] is None or f["reads"] > EMBEDDED_MAX_READS:
            blockers.append(("reads", f"reads exceed the embedded bound {EMBEDDED_MAX_READS}"))
        for name in ctx.reachable:
            node = ctx.nodes[name]
            caps = node.entry.capabilities if node.entry else None
            if caps and caps["transaction_policy"] not in ("caller_transaction", "profile_dependent"):
                blockers.append((name, "does not permit the caller transaction"))
        for where, why in blockers:
            ctx.diag("before_save_unsafe", where, f"before-save output is the trigger record only: {why}")
        if requested not in (None, PROFILE_EMBEDDED):
            ctx.diag("unsafe_profile_request", None, "a before-save flow runs in the caller transaction")
        return PROFILE_EMBEDDED
    if requested == PROFILE_EMBEDDED:
        ctx.diag("unsafe_profile_request", None, "Embedded Before-Save needs a before-save record trigger")
    blockers = _atomic_blockers(ctx)
    if requested == PROFILE_ATOMIC:
        for where, why in blockers:
            ctx.diag("unsafe_atomic_request", where, f"RunAtomically cannot be proven: {why}")
        return PROFILE_ATOMIC
    if requested == PROFILE_DURABLE or blockers:
        return PROFILE_DURABLE
    return PROFILE_ATOMIC


def cohort_of(ctx: CompileContext, profile: str) -> int:
    """The section 20.7 migration cohort of a flow compiled to ``profile``."""
    f = ctx.analysis.facts
    if profile == PROFILE_EMBEDDED:
        return COHORT_EMBEDDED
    if profile == PROFILE_ATOMIC:
        pure = not f["mutating_nodes"] and not f["reads"] and ctx.trigger.get("trigger_type") == "none"
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
