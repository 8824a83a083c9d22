"""V1 never reads a V2 gate (seed 003 "State machines": "V1 is not retrofitted to read AccountServingGate").

Statically: no module of ``connectors/v1`` imports the V2 serving gate modules or names the gate and
epoch models. At run time: ``test_v1_runtime.py`` captures every query of V1 ingress, execution
and push and finds no gate or epoch table.
"""
from __future__ import annotations

import ast

from tests.guardrails import ROOT

V2_GATE_MODULES = ("connectors.serving.gates", "connectors.serving.epoch", "connectors.serving.handoff")
V2_GATE_NAMES = ("AccountServingGate", "ServingEpoch", "serving_lock", "AccountServingGateStore", "ServingEpochStore")


def _imports(tree: ast.AST) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [(node.module or "", alias.name) for alias in node.names]
    return out


def test_no_v1_module_imports_a_v2_gate_module_or_model():
    found = []
    for path in sorted((ROOT / "connectors" / "v1").rglob("*.py")):
        for module, name in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if module.startswith(V2_GATE_MODULES) or name in V2_GATE_NAMES \
                    or (module == "connectors.serving" and name in ("gates", "epoch", "handoff")):
                found.append(f"{path.relative_to(ROOT)}: {module} {name}".strip())
    assert found == []


def test_the_check_catches_a_gate_import():
    tree = ast.parse("from connectors.serving.gates import serving_lock\nfrom connectors.models import ServingEpoch\n")
    names = [(m, n) for m, n in _imports(tree) if m.startswith(V2_GATE_MODULES) or n in V2_GATE_NAMES]
    assert names == [("connectors.serving.gates", "serving_lock"), ("connectors.models", "ServingEpoch")]
