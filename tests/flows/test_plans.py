"""Compiler proofs of seed 004 section 22.1: profiles, loops, subflows, effect pairs, diagnostics."""
from __future__ import annotations

import pytest

from nexusflow.flows.binding import flow_runtime_binding
from nexusflow.flows.catalog import catalog_current
from nexusflow.flows.compiler import (
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    CompileError,
    analyze_flow,
    compile_flow,
    validate_effect_pairs,
)
from nexusflow.records.metadata import current_view

from . import flowxml as fx
from .conftest import FLOW_ORG


def _catalog():
    view = current_view()
    return view, catalog_current(binding=flow_runtime_binding(org_id=FLOW_ORG, metadata_view_digest=view.digest))


def _analyze(source: bytes, name: str = "Main", subflows: dict | None = None, **kw):
    view, catalog = _catalog()
    return analyze_flow(source=source, flow_api_name=name, catalog=catalog, view=view, subflows=subflows, **kw)


def _compile(source: bytes, name: str = "Main", subflows: dict | None = None, **kw):
    view, catalog = _catalog()
    return compile_flow(source=source, flow_api_name=name, catalog=catalog, view=view, subflows=subflows, **kw)


def _codes(result) -> set[str]:
    return {d.code for d in result.errors}


AFTER_SAVE = dict(trigger="RecordAfterSave")


# --- recursion ------------------------------------------------------------------------
def test_recursive_subflow_rejection():
    a = fx.flow(fx.subflow("Call_B", "Flow_B", None), start=fx.start("Call_B"))
    b = fx.flow(fx.subflow("Call_C", "Flow_C", None), start=fx.start("Call_C"))
    c = fx.flow(fx.subflow("Back_To_A", "Flow_A", None), start=fx.start("Back_To_A"))
    flows = {"Flow_A": a, "Flow_B": b, "Flow_C": c}
    result = _analyze(a, "Flow_A", flows)
    assert result.rejected and result.profile is None
    cycle = [d for d in result.errors if d.code == "recursive_subflow:Flow_A"]
    assert cycle and "Flow_A > Flow_B > Flow_C > Flow_A" in cycle[0].message
    assert cycle[0].element.startswith("Call_B > Flow_B")
    # Direct self-recursion is the same finding.
    selfish = fx.flow(fx.subflow("Again", "Flow_S", None), start=fx.start("Again"))
    assert "recursive_subflow:Flow_S" in _codes(_analyze(selfish, "Flow_S", {"Flow_S": selfish}))
    # A non-recursive chain compiles and pins the child's plan digest.
    leaf = fx.flow(fx.assignment("Set", None, [("v", "Assign", "<stringValue>x</stringValue>")]),
                   fx.variable("v"), start=fx.start("Set"))
    parent = fx.flow(fx.subflow("Call_Leaf", "Leaf", None), start=fx.start("Call_Leaf"))
    plan = _compile(parent, "Parent", {"Leaf": leaf})
    assert plan.subflow_plan_digests == {"Leaf": _compile(leaf, "Leaf").plan_digest}


# --- loops -------------------------------------------------------------------------------
def _loop_flow(collection_source: str) -> bytes:
    items = fx.assignment("Fill", "Each", [("names", "Add", "<stringValue>a</stringValue>"),
                                           ("names", "Add", "<stringValue>b</stringValue>"),
                                           ("names", "Add", "<stringValue>c</stringValue>")])
    body = fx.assignment("Count", "Each", [("total", "Add", "<numberValue>1</numberValue>")])
    if collection_source == "static":
        return fx.flow(items, fx.loop("Each", "names", "Count", None), body, fx.variable("names", collection=True),
                       fx.variable("total", data_type="Number"), start=fx.start("Fill"))
    return fx.flow(fx.lookup("Find_All", "Each"), fx.loop("Each", "Find_All", "Count", None), body,
                   fx.variable("total", data_type="Number"), start=fx.start("Find_All"))


def test_bounded_and_unbounded_loop_classification():
    bounded = _analyze(_loop_flow("static"))
    assert not bounded.rejected
    assert [(lp["element"], lp["bound"]) for lp in bounded.loops] == [("Each", "static:3")]
    assert bounded.fan_out == "bounded" and bounded.profile == "bounded_atomic"
    assert bounded.loops[0]["body"] == ["Count"]

    unbounded = _analyze(_loop_flow("lookup"))
    assert not unbounded.rejected
    assert [(lp["element"], lp["bound"]) for lp in unbounded.loops] == [("Each", "unknown")]
    assert "Find_All returns every matching record" in unbounded.loops[0]["proof"]
    assert unbounded.fan_out == "unknown" and unbounded.profile == "durable_orchestration"
    assert unbounded.cohort == 8
    # A collection that grows inside a loop is not bounded either.
    grows = _loop_flow("static").replace(b"<assignToReference>total</assignToReference>",
                                         b"<assignToReference>names</assignToReference>")
    assert _analyze(grows).loops[0]["bound"] == "unknown"


# --- profiles ------------------------------------------------------------------------------
def test_unsafe_atomic_request_rejection():
    unsafe = fx.flow(fx.push("Push_It", None), start=fx.start("Push_It", **AFTER_SAVE), profile="RunAtomically")
    result = _analyze(unsafe)
    assert result.rejected and result.profile is None and result.plan is None
    blockers = [d for d in result.errors if d.code == "unsafe_atomic_request"]
    assert blockers and blockers[0].element == "Push_It (apex:PushToConnector: external_effect)"
    with pytest.raises(CompileError):
        _compile(unsafe)
    # The same request as a compile option, on an unbounded loop.
    assert "unsafe_atomic_request" in _codes(_analyze(_loop_flow("lookup"), requested_profile="bounded_atomic"))
    # Without the request the same flows are durable; a provable request is granted.
    assert _analyze(unsafe.replace(b"RunAtomically", b"Unrelated")).profile == "durable_orchestration"
    safe = _loop_flow("static").replace(b"<processType>", b"<processMetadataValues><name>RunAtomically</name>"
                                        b"<value><booleanValue>true</booleanValue></value></processMetadataValues>"
                                        b"<processType>")
    assert _analyze(safe).profile == "bounded_atomic"


def test_embedded_before_save_profile_and_its_limits():
    ok = fx.flow(fx.assignment("Set_Name", None, [("$Record.email", "Assign", "<stringValue>x</stringValue>")]),
                 start=fx.start("Set_Name", trigger="RecordBeforeSave"))
    result = _analyze(ok)
    assert result.profile == "embedded_before_save" and result.cohort == 3
    assert [s["kind"] for s in result.plan.steps] == ["EmbeddedTransform", "Terminal"]
    effect = fx.flow(fx.push("Push_It", None), start=fx.start("Push_It", trigger="RecordBeforeSave"))
    blocked = _analyze(effect)
    assert blocked.rejected and any(d.code == "before_save_unsafe" and d.element.startswith("Push_It")
                                    for d in blocked.errors)


# --- effects ---------------------------------------------------------------------------------
def test_external_effect_boundary_insertion():
    source = fx.flow(fx.assignment("Prepare", "Push_It", [("v", "Assign", "<stringValue>x</stringValue>")]),
                     fx.push("Push_It", "Notify"), fx.email("Notify", None), fx.variable("v"),
                     start=fx.start("Prepare", **AFTER_SAVE))
    plan = _compile(source)
    assert plan.execution_profile == "durable_orchestration"
    assert [(s["key"], s["kind"]) for s in plan.steps] == [
        ("assign:Prepare", "PureCompute"),
        ("submit:Push_It", KIND_EFFECT_SUBMIT), ("complete:Push_It", KIND_EFFECT_COMPLETION),
        ("submit:Notify", KIND_EFFECT_SUBMIT), ("complete:Notify", KIND_EFFECT_COMPLETION),
        ("end", "Terminal"),
    ]
    assert plan.steps[0]["next"] == {"success": "submit:Push_It"}
    assert plan.steps[2]["next"] == "submit:Notify"
    assert plan.steps[3]["effect_owner"] == "runtime_delivery" and plan.steps[1]["effect_owner"] == "integration_work"
    assert {"step": "complete:Push_It", "producer": "runtime.intent_result"} in plan.payload["dependencies"]
    assert plan.bound_summary["effects"] == 2 and "RUNTIME" in plan.bound_summary["lock_classes"]
    # Without the action there is no effect step at all.
    pure = _compile(fx.flow(fx.assignment("Prepare", None, [("v", "Assign", "<stringValue>x</stringValue>")]),
                            fx.variable("v"), start=fx.start("Prepare", **AFTER_SAVE)))
    assert not [s for s in pure.steps if s["kind"] in (KIND_EFFECT_SUBMIT, KIND_EFFECT_COMPLETION)]


def test_every_external_effect_boundary_is_one_validated_pair_without_self_wait_or_return_edge():
    plan = _compile(fx.flow(fx.push("Push_It", None, fault="Recover"),
                            fx.assignment("Recover", None, [("v", "Assign", "<stringValue>x</stringValue>")]),
                            fx.variable("v"), start=fx.start("Push_It", **AFTER_SAVE)))
    steps, edges = plan.payload["steps"], plan.payload["edges"]
    submits = [s for s in steps if s["kind"] == KIND_EFFECT_SUBMIT]
    assert len(submits) == 1 and validate_effect_pairs(steps, edges) == []
    submit = submits[0]
    assert [e for e in edges if e["from"] == submit["key"]] == [
        {"from": "submit:Push_It", "to": "complete:Push_It", "kind": "effect"}]
    assert {"from": "complete:Push_It", "to": "assign:Recover", "kind": "fault"} in edges

    def codes(s, e):
        return {d.code for d in validate_effect_pairs(s, e)}

    self_wait = [dict(x, completion_step=x["key"], next=x["key"]) if x is submit else x for x in steps]
    assert "invalid_effect_pair:submit:Push_It" in codes(
        self_wait, [dict(e, to="submit:Push_It") if e["kind"] == "effect" else e for e in edges])
    back = edges + [{"from": "assign:Recover", "to": "submit:Push_It", "kind": "success"}]
    assert "invalid_effect_pair:complete:Push_It" in codes(steps, back)
    orphan = [s for s in steps if s["kind"] != KIND_EFFECT_SUBMIT]
    assert "invalid_effect_pair:complete:Push_It" in codes(orphan, edges)
    # A metadata graph that returns from the completion to the submit is rejected by the compiler.
    looping = fx.flow(fx.lookup("Find_All", "Each"), fx.loop("Each", "Find_All", "Push_It", None),
                      fx.push("Push_It", "Each"), start=fx.start("Find_All", **AFTER_SAVE))
    assert "invalid_effect_pair:complete:Push_It" in _codes(_analyze(looping))


# --- diagnostics -------------------------------------------------------------------------------
def test_diagnostic_includes_the_exact_transitive_blocker():
    child = fx.flow(fx.assignment("Prep", "Mail_Owner", [("v", "Assign", "<stringValue>x</stringValue>")]),
                    fx.email("Mail_Owner", None), fx.variable("v"), start=fx.start("Prep"))
    parent = fx.flow(fx.subflow("Call_Child", "Child", None), start=fx.start("Call_Child", **AFTER_SAVE),
                     profile="RunAtomically")
    result = _analyze(parent, "Parent", {"Child": child})
    assert [d.element for d in result.errors if d.code == "unsafe_atomic_request"] == [
        "Call_Child > Child > Mail_Owner (emailSimple:emailSimple: external_effect)"]
    # A child rejected for an unknown action names its element through the call path.
    broken = child.replace(b"<actionType>emailSimple</actionType>", b"<actionType>apex</actionType>").replace(
        b"<actionName>emailSimple</actionName>", b"<actionName>Mystery</actionName>")
    rejected = _analyze(parent.replace(b"RunAtomically", b"Unrelated"), "Parent", {"Child": broken})
    blocker = next(d for d in rejected.errors if d.code == "subflow_rejected:Child")
    assert blocker.element == "Call_Child > Child > Mail_Owner"
    assert "unknown_action:apex:Mystery" in blocker.message
    assert rejected.unknown_capabilities == ["apex:Mystery"]


def test_unknown_formula_function_is_a_compile_error_naming_the_element():
    formula = ("<formulas><name>Greeting</name><dataType>String</dataType>"
               "<expression>SHOUT({!$Record.email})</expression></formulas>")
    result = _analyze(fx.flow(formula, start=fx.start(None, **AFTER_SAVE)))
    assert [(d.code, d.element) for d in result.errors] == [("unknown_function:SHOUT", "Greeting")]
    good = formula.replace("SHOUT(", "UPPER(")
    assert not _analyze(fx.flow(good, start=fx.start(None, **AFTER_SAVE))).rejected


def test_waits_compile_to_durable_dependency_steps():
    wait = ("<waits><name>Pause</name><label>Pause</label><locationX>1</locationX><locationY>1</locationY>"
            "<defaultConnectorLabel>x</defaultConnectorLabel><waitEvents><name>Three_Days</name>"
            "<conditionLogic>and</conditionLogic>" + fx.conn("Done") + "<eventType>AlarmEvent</eventType>"
            "<inputParameters><name>TimeOffset</name><value><numberValue>3.0</numberValue></value></inputParameters>"
            "<label>x</label></waitEvents></waits>")
    done = fx.assignment("Done", None, [("elapsed", "Assign", "<booleanValue>true</booleanValue>")])
    result = _analyze(fx.flow(wait, done, fx.variable("elapsed", data_type="Boolean"), start=fx.start("Pause")))
    assert result.profile == "durable_orchestration" and result.cohort == 5
    assert [(s["key"], s["kind"]) for s in result.plan.steps][:2] == [("wait:Pause", "DependencyWait"),
                                                                       ("assign:Done", "PureCompute")]
