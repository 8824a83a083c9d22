"""Compiler, catalog and plan identity (seed 004 sections 7, 8 and 22.1)."""
from __future__ import annotations

import pytest

from nexusflow.flows.binding import flow_runtime_binding
from nexusflow.flows.catalog import CatalogError, catalog_build, catalog_current, catalog_source_load
from nexusflow.flows.compiler import (
    DIAGNOSTIC_FAMILIES,
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_PURE_COMPUTE,
    KIND_TERMINAL,
    CompileError,
    compile_flow,
)
from nexusflow.records.metadata import current_view

from . import resave_flows as rf
from .conftest import CORPUS, DEMO_FLOW, FLOW_ORG, decision_flow_xml


def _compile(source: bytes | str, name: str = "Contact_Push_Customer_To_Billing", org: str = FLOW_ORG):
    view = current_view()
    binding = flow_runtime_binding(org_id=org, metadata_view_digest=view.digest)
    return compile_flow(source=source, flow_api_name=name, catalog=catalog_current(binding=binding), view=view)


def _codes(exc: CompileError) -> set[str]:
    return {d.code for d in exc.diagnostics}


def test_demo_flow_compiles_to_submit_completion_terminal(demo_source):
    plan = _compile(demo_source)
    assert [(s["key"], s["kind"]) for s in plan.steps] == [
        ("submit:Push_Customer_To_Billing", KIND_EFFECT_SUBMIT),
        ("complete:Push_Customer_To_Billing", KIND_EFFECT_COMPLETION),
        ("end", KIND_TERMINAL),
    ]
    submit, complete, _ = plan.steps
    assert submit["completion_step"] == complete["key"] and complete["submit_step"] == submit["key"]
    assert submit["inputs"] == {"contract": "billing.customer", "recordId": "$Record.Id"}
    assert submit["effect_family"] == "connector_push"
    assert len(submit["entry_digest"]) == 64 and len(submit["binding_fingerprint"]) == 64
    assert plan.execution_profile == "durable_orchestration"
    assert plan.trigger["object"] == "Contact" and plan.trigger["trigger_type"] == "RecordAfterSave"
    assert plan.trigger["record_trigger_type"] == "CreateAndUpdate" and plan.trigger["filter_logic"] == "and"
    assert plan.trigger["filters"] == [{"field": "lifecyclestage", "operator": "EqualTo",
                                        "value": {"kind": "stringValue", "value": "customer"}}]
    assert {"from": submit["key"], "to": complete["key"], "kind": "effect"} in plan.payload["edges"]
    assert plan.payload["entry_step"] == submit["key"]


def test_plan_digest_is_stable_and_tracks_semantic_changes(demo_source):
    first, second = _compile(demo_source), _compile(demo_source)
    assert first.plan_digest == second.plan_digest and first.payload == second.payload
    changed = _compile(demo_source.replace(b"<stringValue>customer</stringValue>",
                                           b"<stringValue>lead</stringValue>"))
    assert changed.plan_digest != first.plan_digest
    assert changed.trigger_binding_digest != first.trigger_binding_digest
    # Layout and indentation are not semantics: same plan.
    moved = demo_source.replace(b"<locationX>176</locationX>", b"<locationX>900</locationX>").replace(b"    ", b"  ")
    assert _compile(moved).plan_digest == first.plan_digest
    # The plan is bound to the org's RuntimeWorkBinding.
    assert _compile(demo_source, org="another-org").plan_digest != first.plan_digest


CORPUS_FILES = sorted(CORPUS.glob("*.flow-meta.xml"))


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.name.split("__")[-1][:60] for p in CORPUS_FILES])
def test_corpus_compiles_or_fails_with_stable_codes(path):
    source = path.read_bytes()
    name = path.name.removesuffix(".flow-meta.xml").split("__")[-1]
    try:
        plan = _compile(source, name)
    except CompileError as exc:
        assert exc.diagnostics, "a CompileError carries at least one diagnostic"
        families = {d.family for d in exc.diagnostics}
        assert families <= DIAGNOSTIC_FAMILIES, families - DIAGNOSTIC_FAMILIES
        assert "compiler_internal_error" not in families
        # Deterministic: the same input gives the same diagnostics.
        with pytest.raises(CompileError) as again:
            _compile(source, name)
        assert [d.code for d in again.value.diagnostics] == [d.code for d in exc.diagnostics]
    else:
        assert plan.steps[-1]["kind"] == KIND_TERMINAL


def test_corpus_diagnostics_name_the_real_blockers():
    by_name = {}
    for path in CORPUS_FILES:
        try:
            _compile(path.read_bytes(), path.name.removesuffix(".flow-meta.xml").split("__")[-1])
        except CompileError as exc:
            by_name[path.name.split("__")[-1]] = _codes(exc)
    assert "unresolved_reference:Set_WaitingPeriodElapsed_to_True" in by_name["Wait_3_Days.flow-meta.xml"]
    assert "unsupported_element:screens" in by_name["AIM_SendCoreEmail.flow-meta.xml"]
    assert "unsupported_process_type:Workflow" in by_name["Animal_Object_Handler_Process.flow-meta.xml"]
    assert "unknown_subflow:Animal_Length_of_Stay_Calculation" in by_name[
        "Animal_Animal_Create_Update_Trigger.flow-meta.xml"]
    # Strict schema: objects outside this deployment's metadata view are named.
    assert "unknown_object:Breed__c" in by_name["Breed_Name_Update_Flow.flow-meta.xml"]


@pytest.mark.parametrize("payload", [
    b'<?xml version="1.0"?>\n<!DOCTYPE Flow [<!ENTITY x "boom">]>\n<Flow><label>&x;</label></Flow>',
    b'<?xml version="1.0"?>\n<!DOCTYPE Flow SYSTEM "file:///etc/passwd">\n<Flow/>',
    b'<?xml version="1.0"?>\n<!doctype Flow>\n<Flow/>',
    '<?xml version="1.0" encoding="UTF-16"?>\n<!DOCTYPE Flow [<!ENTITY a "aaaa">]>\n<Flow>&a;</Flow>'.encode("utf-16"),
], ids=["internal-entity", "external-dtd", "lowercase-doctype", "utf16-entity"])
def test_doctype_and_entities_are_rejected(payload):
    with pytest.raises(CompileError) as exc:
        _compile(payload)
    assert _codes(exc.value) == {"xml_forbidden_declaration"}


def test_malformed_and_non_flow_documents_fail_with_codes():
    with pytest.raises(CompileError) as exc:
        _compile(b"<Flow><start></Flow>")
    assert _codes(exc.value) == {"xml_malformed"}
    with pytest.raises(CompileError) as exc:
        _compile(b"<Workflow/>")
    assert _codes(exc.value) == {"not_a_flow"}
    with pytest.raises(CompileError) as exc:
        _compile(b"")
    assert _codes(exc.value) == {"xml_malformed"}


def test_unknown_action_is_rejected(demo_source):
    source = demo_source.replace(b"<actionName>PushToConnector</actionName>",
                                 b"<actionName>SendSmokeSignal</actionName>")
    with pytest.raises(CompileError) as exc:
        _compile(source)
    assert "unknown_action:apex:SendSmokeSignal" in _codes(exc.value)


def test_action_inputs_are_checked_against_the_catalog(demo_source):
    missing = demo_source.replace(b"<name>contract</name>", b"<name>contractKey</name>")
    with pytest.raises(CompileError) as exc:
        _compile(missing)
    assert {"missing_action_input:contract", "unexpected_action_input:contractKey"} <= _codes(exc.value)
    wrong_ref = demo_source.replace(b"$Record.Id", b"$Record.email")
    with pytest.raises(CompileError) as exc:
        _compile(wrong_ref)
    assert _codes(exc.value) == {"invalid_action_input:recordId"}


def test_decision_flow_compiles_and_graph_errors_are_diagnosed():
    plan = _compile(decision_flow_xml(), "Decide_Only")
    assert [(s["key"], s["kind"]) for s in plan.steps] == [("decide:Has_Email", KIND_PURE_COMPUTE),
                                                           ("end", KIND_TERMINAL)]
    assert plan.steps[0]["rules"][0]["conditions"] == [
        {"left": "$Record.email", "operator": "IsNull", "right": {"kind": "booleanValue", "value": "false"}}]

    with pytest.raises(CompileError) as exc:
        _compile(decision_flow_xml(start_target="Nowhere"), "Decide_Only")
    assert "unresolved_reference:Nowhere" in _codes(exc.value)

    looping = decision_flow_xml().replace(
        b"<label>Yes</label>\n        </rules>",
        b"<label>Yes</label>\n            <connector><targetReference>Has_Email</targetReference></connector>\n"
        b"        </rules>")
    with pytest.raises(CompileError) as exc:
        _compile(looping, "Decide_Only")
    assert "cycle_detected:Has_Email" in _codes(exc.value)

    unknown_field = decision_flow_xml().replace(b"$Record.email", b"$Record.shoe_size")
    with pytest.raises(CompileError) as exc:
        _compile(unknown_field, "Decide_Only")
    assert "unknown_field:shoe_size" in _codes(exc.value)

    prior = decision_flow_xml(record_trigger_type="Create").replace(b"$Record.email", b"$Record__Prior.email")
    with pytest.raises(CompileError) as exc:
        _compile(prior, "Decide_Only")
    assert "unresolved_reference:$Record__Prior" in _codes(exc.value)  # a create has no prior record


def test_unsupported_elements_and_start_shapes_are_diagnosed():
    loop = "\n    <loops><name>L</name><label>L</label></loops>"
    with pytest.raises(CompileError) as exc:
        _compile(decision_flow_xml(extra_elements=loop), "Decide_Only")
    assert "invalid_loop:collection" in _codes(exc.value)
    screen = "\n    <screens><name>Ask</name><label>Ask</label></screens>"
    with pytest.raises(CompileError) as exc:
        _compile(decision_flow_xml(extra_elements=screen), "Decide_Only")
    assert "unsupported_element:screens" in _codes(exc.value)
    with pytest.raises(CompileError) as exc:
        _compile(decision_flow_xml(record_trigger_type="Delete"), "Decide_Only")
    assert "unsupported_record_trigger_type:Delete" in _codes(exc.value)
    before = decision_flow_xml().replace(b"RecordAfterSave", b"RecordBeforeSave")
    with pytest.raises(CompileError) as exc:  # it asks for Durable Orchestration: impossible before save
        _compile(before, "Decide_Only")
    assert "unsafe_profile_request" in _codes(exc.value)
    custom_logic = decision_flow_xml().replace(b"<filterLogic>and</filterLogic>", b"<filterLogic>1 AND 2</filterLogic>")
    with pytest.raises(CompileError) as exc:
        _compile(custom_logic, "Decide_Only")
    assert "unsupported_filter_logic" in _codes(exc.value)
    with pytest.raises(CompileError) as exc:
        _compile(decision_flow_xml(), "bad name")
    assert _codes(exc.value) == {"invalid_flow_api_name"}


def test_non_bytes_input_never_escapes_as_another_exception():
    with pytest.raises(CompileError):
        _compile(12345)  # type: ignore[arg-type]
    with pytest.raises(CompileError):
        _compile(b"<Flow>" + b"<description>x</description>" * 200_000 + b"</Flow>")


def _push_entry(source):
    return next(e for e in source["entries"] if e["action_name"] == "PushToConnector")


def test_catalog_conflict_rejects_the_whole_generation():
    view = current_view()
    binding = flow_runtime_binding(org_id=FLOW_ORG, metadata_view_digest=view.digest)
    source = catalog_source_load()
    push = _push_entry(source)
    changed = {**push, "handler_version": "2"}
    with pytest.raises(CatalogError):
        catalog_build(binding=binding, source={**source, "entries": [push, changed]})
    # Re-submitting a byte-identical entry is idempotent.
    same = catalog_build(binding=binding, source={**source, "entries": source["entries"] * 2})
    assert same.digest == catalog_current(binding=binding).digest
    # A handler implementation change changes the fingerprint, the generation and the plan identity.
    others = [e for e in source["entries"] if e is not push]
    bumped = catalog_build(binding=binding, source={**source, "entries": others + [changed]})
    entry = bumped.entry("apex", "PushToConnector")
    assert entry.binding_fingerprint != same.entry("apex", "PushToConnector").binding_fingerprint
    assert bumped.generation_id != same.generation_id
    plan_a = compile_flow(source=DEMO_FLOW.read_bytes(), flow_api_name="Contact_Push_Customer_To_Billing",
                          catalog=same, view=view)
    plan_b = compile_flow(source=DEMO_FLOW.read_bytes(), flow_api_name="Contact_Push_Customer_To_Billing",
                          catalog=bumped, view=view)
    assert plan_a.plan_digest != plan_b.plan_digest


def test_catalog_bound_to_another_view_is_refused(demo_source):
    view = current_view()
    other = flow_runtime_binding(org_id=FLOW_ORG, metadata_view_digest="0" * 64)
    with pytest.raises(CompileError) as exc:
        compile_flow(source=demo_source, flow_api_name="Contact_Push_Customer_To_Billing",
                     catalog=catalog_current(binding=other), view=view)
    assert _codes(exc.value) == {"binding_mismatch"}


@pytest.mark.parametrize("broken, code", [
    (lambda: rf.mark_if_changed("email").replace(b"ISCHANGED({!$Record.email})", b"ISCHANGED({!$Record.emial})"),
     "unknown_field:emial"),
    (lambda: rf.mark_if_changed("email").replace(b"$Record__Prior.email", b"$Record__Prior.emial"),
     "unknown_field:emial"),
    (lambda: rf.mark_if_changed("email").replace(b"<field>lastname</field>", b"<field>lastnam</field>"),
     "unknown_field:lastnam"),
    (lambda: rf.fx.flow(rf.create_record("Make", None, "Account", {"nam": "$Record.email"}),
                        start=rf.fx.start("Make", trigger="RecordAfterSave", rtt="Update")),
     "unknown_field:nam"),
], ids=["formula_reference", "record_prior_reference", "update_of_trigger_record", "create_of_other_object"])
def test_a_field_a_flow_reads_or_writes_must_exist_on_its_object(broken, code):
    """A misspelt field in a formula, a prior-value reference or a record write is a compile error, not a
    deployed Flow that never fires or fails on every save."""
    with pytest.raises(CompileError) as exc:
        _compile(broken(), "Field_Check")
    assert code in _codes(exc.value)
    # The same document with the correct field names compiles.
    assert _compile(rf.mark_if_changed("email"), "Field_Check").plan_digest
