"""Graph pass: the control-flow graph, cycles, reachability, loop bodies and loop bounds (section 7.2 steps 3-4 and 7).

:func:`build_graph` checks every connector target, walks the graph from the
start (a cycle is legal only through a loop element) and returns the visit
order; :func:`annotate_loops` finds each loop's body and proves its bound
(a collection filled a fixed number of times outside any loop, a first-record
lookup) or says why it is unknown; :func:`fanout` multiplies the bounds of the
loops around an element.
"""
from __future__ import annotations

from typing import Any

from .context import CompileContext, _Node
from .values import _bool_text


def build_graph(ctx: CompileContext) -> list[str]:
    """Check connector targets and walk the graph from the start; return the elements in visit order."""
    for node in ctx.nodes.values():
        for kind, target in node.edges:
            if target is not None and target not in ctx.nodes:
                ctx.diag(f"unresolved_reference:{target}", node.name, f"{kind} connector targets no element")
    for _kind, target in ctx.entry_edges:
        if target is not None and target not in ctx.nodes:
            ctx.diag(f"unresolved_reference:{target}", "start", "start connector targets no element")
    if ctx.failed():
        return []
    order: list[str] = []
    colour: dict[str, int] = {}
    for _kind, entry in ctx.entry_edges:
        if entry is None or entry in colour:
            continue
        stack: list[tuple[str, int]] = [(entry, 0)]
        colour[entry] = 1
        order.append(entry)
        while stack:
            name, idx = stack[-1]
            targets = [t for _k, t in ctx.nodes[name].edges if t is not None]
            if idx >= len(targets):
                colour[name] = 2
                stack.pop()
                continue
            stack[-1] = (name, idx + 1)
            nxt = targets[idx]
            state = colour.get(nxt, 0)
            if state == 1:
                if ctx.nodes[nxt].kind != "loops":
                    ctx.diag(f"cycle_detected:{nxt}", name,
                             "connectors form a cycle that does not pass through a loop element")
            elif state == 0:
                colour[nxt] = 1
                order.append(nxt)
                stack.append((nxt, 0))
    for name in ctx.nodes:
        if name not in colour:
            ctx.diag(f"unreachable_element:{name}", name, "not reachable from start; not compiled",
                     severity="warning")
    return order


def _reach(ctx: CompileContext, start: str | None, *, avoid: str) -> set[str]:
    seen: set[str] = set()
    todo = [start] if start else []
    while todo:
        n = todo.pop()
        if n in seen or n == avoid or n not in ctx.nodes:
            continue
        seen.add(n)
        todo.extend(t for _k, t in ctx.nodes[n].edges if t)
    return seen


def annotate_loops(ctx: CompileContext, order: list[str]) -> None:
    """Loop bodies, loop bounds (proven or unknown) and per-node fan-out (section 7.2 step 7)."""
    reachable = set(order)
    ctx.reachable = reachable
    loops = [n for n in order if ctx.nodes[n].kind == "loops"]
    for name in loops:
        nxt = dict(ctx.nodes[name].edges).get("loop_next")
        body = {n for n in _reach(ctx, nxt, avoid=name) if name in _reach_any(ctx, n)}
        ctx.nodes[name].data["body"] = sorted(body)
        for n in sorted(body):
            ctx.nodes[n].in_loops.append(name)
    for name in loops:
        node = ctx.nodes[name]
        bound, why = _loop_bound(ctx, node)
        node.data["bound"] = bound
        ctx.analysis.loops.append({"element": name, "collection": node.data.get("collection"),
                                   "bound": bound, "proof": why, "body": node.data["body"]})


def _reach_any(ctx: CompileContext, start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        for _k, t in ctx.nodes[n].edges:
            if t and t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def _loop_bound(ctx: CompileContext, loop: _Node) -> tuple[str, str]:
    return collection_bound(ctx, loop.data.get("collection"))


def collection_bound(ctx: CompileContext, coll: Any) -> tuple[str, str]:
    """Prove a static maximum size of a collection, or say why it is unknown."""
    if not isinstance(coll, str):
        return "unknown", "no collection"
    root = coll.split(".", 1)[0]
    src = ctx.nodes.get(root)
    if src is not None and src.kind == "recordLookups":
        if src.data.get("first_only"):
            return "static:1", f"{root} stores the first record only"
        return "unknown", f"{root} returns every matching record: no metadata bound"
    if src is not None:
        return "unknown", f"{root} is the output of a {src.kind} element"
    resource = ctx.resources.get(root)
    if resource is None:
        return "unknown", f"{root} is not a flow resource"
    kind, body = resource
    if kind != "variables" or _bool_text(body.get("isInput")):
        return "unknown", f"{root} is supplied by the caller"
    adds = 0
    for node in ctx.nodes.values():
        if node.kind != "assignments" or node.name not in ctx.reachable:
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
                    value.get("kind") == "elementReference" and is_collection(ctx, value.get("value"))):
                adds += 1
                continue
            return "unknown", f"{root} is filled from a collection by {node.name} ({op})"
    for node in ctx.nodes.values():
        if node.data.get("output_reference") == root:
            return "unknown", f"{root} is filled by {node.name}"
    return f"static:{max(adds, 1)}", f"{root} receives at most {adds} item(s) outside any loop"


def is_collection(ctx: CompileContext, ref: Any) -> bool:
    """Does ``ref`` name a collection (a multi-record lookup or a collection variable)?"""
    if not isinstance(ref, str):
        return False
    root = ref.split(".", 1)[0]
    if root in ctx.nodes:
        n = ctx.nodes[root]
        return n.kind == "recordLookups" and not n.data.get("first_only")
    res = ctx.resources.get(root)
    return bool(res and _bool_text(res[1].get("isCollection")))


def fanout(ctx: CompileContext, node: _Node) -> str:
    """``static:<n>``: how often ``node`` runs per run (the product of its loops' bounds), or ``unknown``."""
    total = 1
    for loop in node.in_loops:
        bound = ctx.nodes[loop].data.get("bound", "unknown")
        if bound == "unknown":
            return "unknown"
        total *= int(bound.split(":", 1)[1])
    return f"static:{total}"
