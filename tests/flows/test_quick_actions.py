"""Record-creating quick actions and loops without a body (issue "The Flow language real flows use", items 4
and 6; docs/operations.md "Quick actions").

The corpus metadata (``fixtures/corpus_metadata/quick_actions``) declares ``NewCase`` (a Case with Status
New and Origin Flow) and ``FeedItem.NewTaskFromFeedItem`` (a Task "Follow up", its ``contextId`` in WhatId).
"""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import CompileError
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_compile_check, flow_deploy, flow_run_start
from nexusflow.records.models import Record

from . import flowxml as fx
from .conftest import run_until_idle, save_record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("corpus_view")]


def _task_flow(action: str = "FeedItem.NewTaskFromFeedItem", inputs: str | None = None,
               profile: str | None = None) -> bytes:
    inputs = inputs if inputs is not None else (
        "<inputParameters><name>contextId</name><value><elementReference>accountId</elementReference></value>"
        "</inputParameters>")
    call = (f"<actionCalls><name>Follow_Up</name><label>Follow Up</label><locationX>1</locationX><locationY>1</locationY>"
            f"<actionName>{action}</actionName><actionType>quickAction</actionType>{inputs}</actionCalls>")
    variable = fx.variable("accountId", is_input=True)
    return fx.flow(call, variable, start=fx.start("Follow_Up"), profile=profile)


def _records(object_name: str) -> list[dict]:
    return list(Record.objects.filter(object_name=object_name, is_deleted=False).values_list("fields", flat=True))


@pytest.mark.parametrize("profile", [None, "DurableOrchestration"], ids=["bounded_atomic", "durable"])
def test_a_quick_action_creates_its_record_with_its_defaults_and_context(org, profile):
    deployed = flow_deploy(org=org, source=_task_flow(profile=profile), flow_api_name="Follow_Up_Task")
    node = (deployed.plan.plan_payload["steps"][0].get("graph") or [deployed.plan.plan_payload["steps"][0]])[0]
    assert (node["type"], node["quick_action"], node["object"]) == ("recordCreates", "FeedItem.NewTaskFromFeedItem",
                                                                    "Task")
    account = save_record(org, {"Name": "acme"}, object_name="Account")
    run = flow_run_start(org=org, flow_api_name="Follow_Up_Task", inputs={"accountId": account.record_key},
                         request_id="r1").run
    run_until_idle()
    assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED
    assert _records("Task") == [{"Subject": "Follow up", "Status": "Not Started", "WhatId": account.record_key}]


def test_a_quick_action_input_named_after_a_field_sets_it_and_a_new_case_takes_no_context(org):
    source = _task_flow(action="NewCase", inputs=(
        "<inputParameters><name>Subject</name><value><stringValue>Printer on fire</stringValue></value>"
        "</inputParameters>"))
    flow_deploy(org=org, source=source, flow_api_name="New_Case")
    flow_run_start(org=org, flow_api_name="New_Case", inputs={"accountId": "x"}, request_id="r1")
    run_until_idle()
    assert _records("Case") == [{"Status": "New", "Origin": "Flow", "Subject": "Printer on fire"}]
    with pytest.raises(CompileError) as caught:
        flow_compile_check(source=_task_flow(action="NewCase"), flow_api_name="Bad", org=org)
    assert [d.code for d in caught.value.diagnostics] == ["unexpected_action_input:contextId"]


def test_an_undeclared_quick_action_or_field_is_a_compile_refusal(org):
    with pytest.raises(CompileError) as caught:
        flow_compile_check(source=_task_flow(action="LogACall"), flow_api_name="Bad", org=org)
    assert "unknown_action:quickAction:LogACall" in [d.code for d in caught.value.diagnostics]
    bad_field = ("<inputParameters><name>Priority__c</name><value><stringValue>High</stringValue></value>"
                 "</inputParameters>")
    with pytest.raises(CompileError) as caught:
        flow_compile_check(source=_task_flow(inputs=bad_field), flow_api_name="Bad", org=org)
    assert any(d.code.startswith("unknown_field") for d in caught.value.diagnostics)


@pytest.mark.parametrize("profile", [None, "DurableOrchestration"], ids=["bounded_atomic", "durable"])
def test_a_loop_without_a_for_each_path_visits_every_item_and_goes_on(org, profile):
    """A loop whose metadata has no nextValueConnector takes its "after last item" path (it does not end the
    run), with the loop variable on the last item."""
    loop = fx.loop("Each", "names", None, "Done")
    done = fx.assignment("Done", None, [("last", "Assign", "<elementReference>Each</elementReference>")])
    source = fx.flow(loop, done, fx.variable("names", collection=True, is_input=True), fx.variable("last"),
                     start=fx.start("Each"), profile=profile)
    flow_deploy(org=org, source=source, flow_api_name="Empty_Loop")
    run = flow_run_start(org=org, flow_api_name="Empty_Loop", inputs={"names": ["a", "b", "c"]}, request_id="r").run
    run_until_idle()
    from nexusflow.flows.models import FlowCheckpoint

    assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED
    last = [p["context"]["vars"]["last"] for p in FlowCheckpoint.objects.filter(run_id=run.pk).order_by("sequence")
            .values_list("context_payload", flat=True) if "context" in p and "last" in p["context"]["vars"]]
    assert last[-1] == "c"
