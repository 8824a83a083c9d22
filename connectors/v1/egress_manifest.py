"""The V1 egress manifest, generated from the code by an AST scan of ``connectors/v1``.

Seed 003 "Ownership boundaries" (V1 execution and external-effect state: "Cutover
inventory readers selected by the frozen current-tree egress and state manifest").
The manifest lists:

- ``provider_io_sites``: every HTTP client call in ``connectors/v1`` with the
  effect row and pre-I/O marker its function declares (``@provider_io``), and
  the marker writer that runs before the call;
- ``effect_rows``: every ``v1_call_prepare(call_site=...)`` (the durable pre-I/O
  row) with the function that creates it and the call site that sends it.

:func:`manifest_problems` reports an untracked call site (no declaration), a
call not preceded by the marker writer, a non-literal ``call_site``, or a row
never sent through a declared site; ``tests/connectors/v1/test_egress_manifest.py``
fails the build on any problem or on a manifest that differs from the committed
``connectors/v1/egress_manifest.json`` (``manage.py v1_egress_manifest --write``
regenerates it).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

V1_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = V1_DIR / "egress_manifest.json"

#: Modules that are HTTP clients (as the build guardrails name them).
HTTP_CLIENT_MODULES = frozenset({"requests", "httpx", "urllib.request", "http.client", "urllib3", "aiohttp"})
#: Methods of an HTTP client that perform I/O.
CLIENT_METHODS = frozenset({"request", "send", "get", "post", "put", "patch", "delete", "head", "options", "stream",
                            "urlopen"})
#: The function that commits the pre-I/O marker (``prepared -> sending``).
MARKER_WRITER = "_mark_sending"
#: The function that commits the durable pre-I/O row.
ROW_WRITER = "v1_call_prepare"


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _http_aliases(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in HTTP_CLIENT_MODULES or alias.name.split(".")[0] in {"requests", "httpx", "urllib3",
                                                                                     "aiohttp"}:
                    names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if node.module in HTTP_CLIENT_MODULES or f"{node.module}.{alias.name}" in HTTP_CLIENT_MODULES:
                    names.add(alias.asname or alias.name)
    return names


def _is_http_call(node: ast.Call, aliases: set[str]) -> bool:
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in CLIENT_METHODS:
        return False
    root = _root_name(func.value)
    if root is None:
        return False
    return root in aliases or "client" in root.lower() or "session" in root.lower()


def _decorator_facts(fn: ast.FunctionDef) -> dict | None:
    for deco in fn.decorator_list:
        if isinstance(deco, ast.Call) and getattr(deco.func, "id", getattr(deco.func, "attr", None)) == "provider_io":
            facts = {kw.arg: kw.value.value for kw in deco.keywords if isinstance(kw.value, ast.Constant)}
            if {"effect", "marker"} <= set(facts):
                return facts
    return None


def _called_names(fn: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else (
                node.func.attr if isinstance(node.func, ast.Attribute) else None)
            if name:
                out.append((node.lineno, name))
    return out


def scan(sources: dict[str, str]) -> tuple[dict, list[str]]:
    """Build the manifest of ``sources`` (``relative path -> text``) and list its problems.

    Returns:
        ``(manifest, problems)``: the manifest dict (sorted, no line numbers) and one text per problem.

    Raises:
        SyntaxError: a source does not parse.
    """
    sites, rows, problems = [], [], []
    declared_senders: set[str] = set()
    parsed = {path: ast.parse(text) for path, text in sorted(sources.items())}
    for path, tree in parsed.items():
        aliases = _http_aliases(tree)
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        in_function = set()
        for fn in functions:
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and _is_http_call(node, aliases):
                    in_function.add(id(node))
                    call_text = ast.unparse(node.func)
                    facts = _decorator_facts(fn)
                    if facts is None:
                        problems.append(f"{path}:{node.lineno}: untracked provider call {call_text}() in "
                                        f"{fn.name}(): declare it with @provider_io(effect=..., marker=...)")
                        continue
                    markers = [line for line, name in _called_names(fn) if name == MARKER_WRITER]
                    if not markers or min(markers) > node.lineno:
                        problems.append(f"{path}:{node.lineno}: {call_text}() in {fn.name}() is not preceded by "
                                        f"the pre-I/O marker {MARKER_WRITER}()")
                        continue
                    declared_senders.add(fn.name)
                    sites.append({"module": path, "function": fn.name, "call": call_text, "effect": facts["effect"],
                                  "pre_io_marker": facts["marker"], "marker_writer": MARKER_WRITER})
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_http_call(node, aliases) and id(node) not in in_function:
                problems.append(f"{path}:{node.lineno}: untracked provider call {ast.unparse(node.func)}() at "
                                f"module level")
    for path, tree in parsed.items():
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == ROW_WRITER):
                    continue
                site = next((kw.value for kw in node.keywords if kw.arg == "call_site"), None)
                if not (isinstance(site, ast.Constant) and isinstance(site.value, str)):
                    problems.append(f"{path}:{node.lineno}: {ROW_WRITER}() in {fn.name}() needs a literal call_site")
                    continue
                senders = sorted({name for line, name in _called_names(fn)
                                  if name in declared_senders and line > node.lineno})
                if not senders:
                    problems.append(f"{path}:{node.lineno}: the {site.value!r} row in {fn.name}() is never sent "
                                    f"through a declared provider-I/O site")
                    continue
                rows.append({"call_site": site.value, "module": path, "function": fn.name, "sent_by": senders})
    sites.sort(key=lambda s: (s["module"], s["function"], s["call"]))
    rows.sort(key=lambda r: (r["call_site"], r["module"], r["function"]))
    seen = [r["call_site"] for r in rows]
    problems += [f"call_site {name!r} is prepared in more than one place" for name in sorted(set(seen))
                 if seen.count(name) > 1]
    return {"scope": "connectors/v1", "provider_io_sites": sites, "effect_rows": rows}, problems


def v1_sources() -> dict[str, str]:
    """``relative path -> text`` of every Python module under ``connectors/v1``."""
    root = V1_DIR.parent.parent
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(V1_DIR.rglob("*.py")) if "__pycache__" not in p.parts}


def generate() -> tuple[dict, list[str]]:
    """The manifest of the current ``connectors/v1`` tree and its problems (see :func:`scan`)."""
    return scan(v1_sources())


def manifest_problems() -> list[str]:
    """Problems of the current tree, plus a difference from the committed manifest file."""
    manifest, problems = generate()
    committed = json.loads(MANIFEST_PATH.read_text(encoding="utf-8")) if MANIFEST_PATH.exists() else None
    if committed != manifest:
        problems.append(f"{MANIFEST_PATH.name} differs from the code: run manage.py v1_egress_manifest --write")
    return problems


def render(manifest: dict) -> str:
    """The committed text of ``manifest``: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"
