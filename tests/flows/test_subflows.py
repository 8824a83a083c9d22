"""Subflow calls (issue "The Flow language real flows use", item 3; docs/operations.md "Subflows").

``Grade_Score`` is an autolaunched flow with input variables ``points``
(Number) and ``divisor`` (Number) and output variables ``grade`` (String) and
``bonus`` (Number): ``grade`` is ``pass`` from 50 points, else ``fail``;
``bonus`` is ``points * 2 / divisor``. ``Grade_Caller`` calls it twice: once
copying ``grade`` into its own ``result`` (``outputAssignments``) and once
storing the outputs on the element (``storeOutputAutomatically``), then copies
``Call_Stored.bonus`` into ``doubled``. Asked for Durable Orchestration each
call is a child FlowRun its step waits on; compiled as it is (Bounded Atomic)
both calls run inline in the run's one transaction. The expected values are
written from the metadata.
"""
from __future__ import annotations

import signal
from decimal import Decimal

import pytest

from nexusflow.flows import reasons
from nexusflow.flows import transitions as t
from nexusflow.flows.binding import flow_runtime_binding
from nexusflow.flows.catalog import catalog_current
from nexusflow.flows.handlers import engine_support_diagnostics
from nexusflow.flows.models import (
    FlowCheckpoint,
    FlowDependency,
    FlowExecutionPlan,
    FlowRun,
    FlowStepExecution,
    FlowWakeSignal,
)
from nexusflow.flows.producers import PRODUCER_SUBFLOW
from nexusflow.flows.services import (
    flow_deploy,
    flow_run_delete,
    flow_run_drive,
    flow_run_start,
    flow_run_support_read,
)
from nexusflow.records.metadata import current_view
from tests.conftest import run_manage, subprocess_env

from .conftest import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

NS = "http://soap.sforce.com/2006/04/metadata"


def _variable(name: str, data_type: str, *, is_input: bool = False, is_output: bool = False) -> str:
    scale = "<scale>2</scale>" if data_type == "Number" else ""
    return (f"<variables><name>{name}</name><dataType>{data_type}</dataType><isCollection>false</isCollection>"
            f"<isInput>{str(is_input).lower()}</isInput><isOutput>{str(is_output).lower()}</isOutput>{scale}"
            "</variables>")


def _flow(body: str, *, first: str, profile: str | None = None) -> bytes:
    requested = ("" if profile is None else "<processMetadataValues><name>ExecutionProfile</name><value>"
                 f"<stringValue>{profile}</stringValue></value></processMetadataValues>")
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Flow xmlns="{NS}">
    <apiVersion>62.0</apiVersion>
    {body}
    <label>Test Flow</label>
    {requested}
    <processType>AutoLaunchedFlow</processType>
    <start><locationX>50</locationX><locationY>0</locationY><connector><targetReference>{first}</targetReference>
    </connector></start>
    <status>Active</status>
</Flow>
""".encode()


CHILD = _flow(f"""
    <assignments><name>Compute_Bonus</name><label>Compute Bonus</label><locationX>1</locationX><locationY>1</locationY>
        <assignmentItems><assignToReference>bonus</assignToReference><operator>Assign</operator>
            <value><elementReference>points</elementReference></value></assignmentItems>
        <assignmentItems><assignToReference>bonus</assignToReference><operator>Multiply</operator>
            <value><numberValue>2</numberValue></value></assignmentItems>
        <assignmentItems><assignToReference>bonus</assignToReference><operator>Divide</operator>
            <value><elementReference>divisor</elementReference></value></assignmentItems>
        <connector><targetReference>Passed</targetReference></connector></assignments>
    <decisions><name>Passed</name><label>Passed</label><locationX>1</locationX><locationY>2</locationY>
        <defaultConnector><targetReference>Set_Fail</targetReference></defaultConnector>
        <rules><name>Yes</name><conditionLogic>and</conditionLogic>
            <conditions><leftValueReference>points</leftValueReference><operator>GreaterThanOrEqualTo</operator>
                <rightValue><numberValue>50</numberValue></rightValue></conditions>
            <connector><targetReference>Set_Pass</targetReference></connector><label>Yes</label></rules>
    </decisions>
    <assignments><name>Set_Pass</name><label>Set Pass</label><locationX>1</locationX><locationY>3</locationY>
        <assignmentItems><assignToReference>grade</assignToReference><operator>Assign</operator>
            <value><stringValue>pass</stringValue></value></assignmentItems></assignments>
    <assignments><name>Set_Fail</name><label>Set Fail</label><locationX>2</locationX><locationY>3</locationY>
        <assignmentItems><assignToReference>grade</assignToReference><operator>Assign</operator>
            <value><stringValue>fail</stringValue></value></assignmentItems></assignments>
    {_variable("points", "Number", is_input=True)}
    {_variable("divisor", "Number", is_input=True)}
    {_variable("grade", "String", is_output=True)}
    {_variable("bonus", "Number", is_output=True)}
""", first="Compute_Bonus")


def _caller(profile: str | None = None) -> bytes:
    return _flow(f"""
    <subflows><name>Call_Assigned</name><label>Call Assigned</label><locationX>1</locationX><locationY>1</locationY>
        <connector><targetReference>Call_Stored</targetReference></connector><flowName>Grade_Score</flowName>
        <inputAssignments><name>points</name><value><elementReference>score</elementReference></value>
        </inputAssignments>
        <inputAssignments><name>divisor</name><value><elementReference>divisor</elementReference></value>
        </inputAssignments>
        <outputAssignments><assignToReference>result</assignToReference><name>grade</name></outputAssignments>
    </subflows>
    <subflows><name>Call_Stored</name><label>Call Stored</label><locationX>1</locationX><locationY>2</locationY>
        <connector><targetReference>Copy_Bonus</targetReference></connector><flowName>Grade_Score</flowName>
        <inputAssignments><name>points</name><value><numberValue>10</numberValue></value></inputAssignments>
        <inputAssignments><name>divisor</name><value><numberValue>4</numberValue></value></inputAssignments>
        <storeOutputAutomatically>true</storeOutputAutomatically>
    </subflows>
    <assignments><name>Copy_Bonus</name><label>Copy Bonus</label><locationX>1</locationX><locationY>3</locationY>
        <assignmentItems><assignToReference>doubled</assignToReference><operator>Assign</operator>
            <value><elementReference>Call_Stored.bonus</elementReference></value></assignmentItems>
        <assignmentItems><assignToReference>second</assignToReference><operator>Assign</operator>
            <value><elementReference>Call_Stored.grade</elementReference></value></assignmentItems>
    </assignments>
    {_variable("score", "Number", is_input=True)}
    {_variable("divisor", "Number", is_input=True)}
    {_variable("result", "String")}
    {_variable("doubled", "Number")}
    {_variable("second", "String")}
""", first="Call_Assigned", profile=profile)


CALLER = "Grade_Caller"
SUBFLOWS = {"Grade_Score": CHILD}


def _deploy(org, profile: str | None):
    deployed = flow_deploy(org=org, source=_caller(profile), flow_api_name=CALLER, subflows=SUBFLOWS)
    assert deployed.activated
    return deployed.plan


def _vars(org, run_id) -> dict:
    for payload in (FlowCheckpoint.objects.filter(org_id=org.org_id, run_id=run_id).order_by("-sequence")
                    .values_list("context_payload", flat=True)):
        if "context" in payload:
            return payload["context"]["vars"]
    raise AssertionError("no checkpoint context")


def _start(org, score, divisor=1, request_id: str = "r1") -> FlowRun:
    return flow_run_start(org=org, flow_api_name=CALLER, inputs={"score": score, "divisor": divisor},
                          request_id=request_id).run


def _run(org, run) -> FlowRun:
    return FlowRun.objects.get(org_id=org.org_id, pk=run.pk)


def _children(org, run) -> list[FlowRun]:
    return list(FlowRun.objects.filter(org_id=org.org_id, parent_run_id=run.pk).order_by("id"))


@pytest.mark.parametrize("score,grade", [(60, "pass"), (50, "pass"), (49, "fail")])
def test_a_durable_subflow_is_a_child_run_whose_outputs_come_back(org, score, grade):
    plan = _deploy(org, "DurableOrchestration")
    assert plan.execution_profile == "durable_orchestration"
    # The called flow's plan is deployed with its caller (not activated): the element runs that exact plan.
    child_plan = FlowExecutionPlan.objects.get(org_id=org.org_id, flow_api_name="Grade_Score")
    steps = {s["element"]: s for s in plan.plan_payload["steps"] if s.get("type") == "subflows"}
    assert {s["subflow_plan_digest"] for s in steps.values()} == {child_plan.plan_digest}
    run = _start(org, score, divisor=3)
    assert run_until_idle() > 0
    assert _run(org, run).state == t.RUN_SUCCEEDED
    assert _vars(org, run.pk) == {"score": str(score), "divisor": "3", "result": grade, "doubled": "5",
                                  "second": "fail"}
    # One child run per call, in call order, each started by its own step and ended Succeeded.
    children = _children(org, run)
    assert [(c.plan_id, c.state, c.record_key) for c in children] == [
        (child_plan.pk, t.RUN_SUCCEEDED, f"subflow:{step}") for step in FlowStepExecution.objects.filter(
            org_id=org.org_id, run_id=run.pk, plan_step_key__in=[f"subflow:{n}" for n in steps]
        ).order_by("id").values_list("id", flat=True)]
    assert Decimal(_vars(org, children[0].pk)["bonus"]) == Decimal(score * 2) / Decimal(3)
    # Each call waited on a `subflow` dependency keyed by its child; one wake each, consumed.
    deps = FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("id")
    assert [(d.producer_kind, d.dependency_key, d.state) for d in deps] == [
        (PRODUCER_SUBFLOW, f"subflow:{c.pk}", t.DEP_SATISFIED) for c in children]
    assert sorted(FlowWakeSignal.objects.filter(org_id=org.org_id, flow_run_id=run.pk)
                  .values_list("dependency_key", "state")) == sorted((f"subflow:{c.pk}", t.SIGNAL_CONSUMED)
                                                                     for c in children)
    # The support read links caller and children both ways.
    read = flow_run_support_read(org=org, run_id=run.pk)
    assert (read["parent_run_id"], read["subflow_run_ids"]) == (None, [int(c.pk) for c in children])
    assert flow_run_support_read(org=org, run_id=children[1].pk)["parent_run_id"] == run.pk
    assert run_until_idle() == 0


def test_a_bounded_atomic_caller_runs_its_subflows_inline_in_one_transaction(org):
    plan = _deploy(org, None)
    assert plan.execution_profile == "bounded_atomic"
    run = _start(org, 70, divisor=7)
    assert run_until_idle() > 0
    assert _run(org, run).state == t.RUN_SUCCEEDED
    assert _vars(org, run.pk) == {"score": "70", "divisor": "7", "result": "pass", "doubled": "5", "second": "fail"}
    assert not _children(org, run) and not FlowDependency.objects.exists()
    outputs = [p.get("output") or {} for p in FlowCheckpoint.objects.filter(org_id=org.org_id, run_id=run.pk)
               .values_list("context_payload", flat=True)]
    path = next(o["path"] for o in outputs if o.get("path"))
    assert path == ["Call_Assigned", "Call_Assigned>Compute_Bonus", "Call_Assigned>Passed", "Call_Assigned>Set_Pass",
                    "Call_Stored", "Call_Stored>Compute_Bonus", "Call_Stored>Passed", "Call_Stored>Set_Fail",
                    "Copy_Bonus"]


def test_a_child_that_fails_fails_its_caller_with_the_subflow_reason(org):
    _deploy(org, "DurableOrchestration")
    run = _start(org, 60, divisor=0)  # the child divides by zero: a definite failure
    run_until_idle()
    child = _children(org, run)[0]
    assert (child.state, child.reason_code) == (t.RUN_TERMINAL_FAILED, reasons.STEP_EXECUTION_ERROR)
    parent = _run(org, run)
    assert (parent.state, parent.reason_code) == (t.RUN_TERMINAL_FAILED, reasons.SUBFLOW_FAILED)
    failed = FlowStepExecution.objects.get(org_id=org.org_id, run_id=run.pk, state=t.STEP_FAILED)
    assert (failed.plan_step_key, failed.reason_code) == ("subflow:Call_Assigned", reasons.SUBFLOW_FAILED)
    assert len(_children(org, run)) == 1  # the second call never started


def test_cancelling_a_waiting_caller_cancels_its_child_and_nothing_runs_after(org):
    _deploy(org, "DurableOrchestration")
    run = _start(org, 60)
    assert flow_run_drive(org=org, run_id=run.pk, worker_id="w1") == t.RUN_WAITING
    child = _children(org, run)[0]
    assert _run(org, child).state == t.RUN_RUNNABLE  # started with the wait, not yet run
    flow_run_delete(org=org, run_id=run.pk)
    assert (_run(org, run).state, _run(org, child).state) == (t.RUN_CANCELLED, t.RUN_CANCELLED)
    assert _run(org, child).is_deleted
    assert run_until_idle() == 0
    assert FlowDependency.objects.get(org_id=org.org_id, run_id=run.pk).state == t.DEP_CANCELLED


def test_a_child_cancelled_on_its_own_fails_the_waiting_caller(org):
    _deploy(org, "DurableOrchestration")
    run = _start(org, 60)
    flow_run_drive(org=org, run_id=run.pk, worker_id="w1")
    flow_run_delete(org=org, run_id=_children(org, run)[0].pk)
    run_until_idle()
    assert (_run(org, run).state, _run(org, run).reason_code) == (t.RUN_TERMINAL_FAILED, reasons.SUBFLOW_FAILED)


@pytest.mark.parametrize("failpoint", ["flow.subflow.child_started", "flow.subflow.parent_signalled"])
def test_a_worker_killed_around_a_subflow_call_converges_on_one_child_per_call(org, failpoint, db_clock_advance,
                                                                                 short_lease):
    """A real ``run_workers --role flow`` process is killed at the failpoint; a restarted one converges.

    ``flow.subflow.child_started``: the caller's step transaction dies before its commit (no child, no wait);
    ``flow.subflow.parent_signalled``: the child's end and the caller's wake signal committed, the match did not.
    """
    _deploy(org, "DurableOrchestration")
    run = _start(org, 55)
    crashed = run_manage(["run_workers", "--role", "flow", "--until-idle"],
                         subprocess_env(NEXUS_FAILPOINTS=failpoint), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    if failpoint == "flow.subflow.child_started":
        assert not _children(org, run) and not FlowDependency.objects.exists()
        db_clock_advance(120)  # the dead worker's lease runs out
    else:
        child = _children(org, run)[0]
        assert _run(org, child).state == t.RUN_SUCCEEDED
        assert FlowDependency.objects.get(org_id=org.org_id, run_id=run.pk).state == t.DEP_WAITING
        assert FlowWakeSignal.objects.get(org_id=org.org_id, flow_run_id=run.pk).state == t.SIGNAL_UNMATCHED
    restarted = run_manage(["run_workers", "--role", "flow", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert _run(org, run).state == t.RUN_SUCCEEDED
    assert _vars(org, run.pk)["result"] == "pass"
    assert [c.state for c in _children(org, run)] == [t.RUN_SUCCEEDED, t.RUN_SUCCEEDED]
    assert FlowWakeSignal.objects.filter(org_id=org.org_id, flow_run_id=run.pk, state=t.SIGNAL_CONSUMED).count() == 2


def test_activation_names_a_subflow_whose_plan_is_not_deployed(org):
    """The gate resolves each subflow element against the deployed plans by its exact plan digest."""
    plan = _deploy(org, "DurableOrchestration")
    view = current_view()
    snapshot = catalog_current(binding=flow_runtime_binding(org_id=org.org_id, metadata_view_digest=view.digest))
    missing = engine_support_diagnostics(plan.plan_payload, snapshot, {})
    assert [(d.code, d.element) for d in missing] == [("engine_unsupported:subflow_missing", "Call_Assigned"),
                                                      ("engine_unsupported:subflow_missing", "Call_Stored")]
    child = FlowExecutionPlan.objects.get(org_id=org.org_id, flow_api_name="Grade_Score")
    assert engine_support_diagnostics(plan.plan_payload, snapshot, {child.plan_digest: child.plan_payload}) == []


def test_an_input_the_child_does_not_declare_fails_the_call_definitely(org):
    source = _caller("DurableOrchestration").replace(b"<name>divisor</name><value><elementReference>divisor",
                                                     b"<name>grade</name><value><elementReference>divisor")
    flow_deploy(org=org, source=source, flow_api_name=CALLER, subflows=SUBFLOWS)
    run = _start(org, 60)
    run_until_idle()
    assert _run(org, run).state == t.RUN_TERMINAL_FAILED and not _children(org, run)
    attempt = FlowStepExecution.objects.get(org_id=org.org_id, run_id=run.pk, state=t.STEP_FAILED).attempts.get()
    assert attempt.safe_error_code == "flow_subflow_input"
