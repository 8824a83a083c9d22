"""Admission budgets of the durable mutation queue class (seed 004 sections 16.1-16.3; issue "Admission lanes,
fairness and backpressure", item 1).

The runtime policy bounds the Flow runs executing at once (``Running``) of one org (``queues``), of one Flow
(``plans.<flow>.max_active``) and of the org's Flows triggered by one object (``resource_classes``). A claim
round never takes more than the remaining budget, and an org or plan at its budget passes the round to the
next, so the budget of one tenant never idles the workers. Two workers claiming one org's work at once count
and claim one after the other (the org's claim lock), so the budget holds under real concurrency.
"""
from __future__ import annotations

import threading

import pytest
from django.db import connection

from nexusflow.flows import policy
from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import KIND_PURE_COMPUTE
from nexusflow.flows.models import FlowRun, FlowStepAttempt, FlowStepExecution
from nexusflow.flows.services import claim as claim_module
from nexusflow.flows.services import execute, flow_deploy, flow_run_start, flow_try_recover_expired_one
from nexusflow.flows.services.claim import (
    PRESSURE_EXPIRED_LEASES,
    RETRY_WINDOW_SECONDS,
    flow_lease_admission,
    flow_step_claim_batch,
)
from nexusflow.flows.services.execute import flow_step_execute
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.policy import RuntimePolicyInvalid, runtime_policy, runtime_policy_publish
from tests.bench import capacity_flows as cf
from tests.flows import flowxml as fx
from tests.flows.conftest import run_until_idle, save_record
from tests.kernel.test_metrics import scrape_metrics

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture(autouse=True)
def _fresh_round_robin(monkeypatch):
    """Each test's claim rounds start from the first org and plan (no round served before)."""
    monkeypatch.setattr(claim_module, "_last_served", {})


def _publish(scope: str, document: dict) -> None:
    runtime_policy_publish(scope=scope, document=document, authored_by="ops", reason="budget test")


def _running(org: OrgScope) -> int:
    return FlowRun.objects.filter(org_id=org.org_id, state=t.RUN_RUNNING).count()


def _start(org: OrgScope, flow: str, n: int) -> list[int]:
    return [int(flow_run_start(org=org, flow_api_name=flow, inputs={"counter": 0}).run.pk) for _ in range(n)]


@pytest.mark.parametrize("document,detail", [
    ({"queues": {"effect_completion": {"max_active": 1}}}, "not a budgeted queue class"),
    ({"queues": {"durable_mutation": {"max_active": 0}}}, "queues.durable_mutation.max_active must be between"),
    ({"queues": {"durable_mutation": {"share": 1}}}, "queues.durable_mutation takes max_active"),
    ({"resource_classes": {"no such!": {"max_active": 1}}}, "not an object API name"),
    ({"resource_classes": {"Contact": {}}}, "resource_classes.Contact takes max_active"),
    ({"plans": {"Flow_A": {"max_active": 1.5}}}, "plans.Flow_A.max_active must be an integer"),
])
def test_a_malformed_budget_is_refused_naming_its_key(document, detail):
    with pytest.raises(RuntimePolicyInvalid, match=detail):
        _publish("budget-org", document)


def test_budgets_merge_from_the_environment_and_the_org_name_by_name():
    _publish("*", {"plans": {"Flow_A": {"max_attempts": 3}}, "queues": {"durable_mutation": {"max_active": 9}}})
    _publish("budget-org", {"plans": {"Flow_A": {"max_active": 2}}, "resource_classes": {"Contact": {"max_active": 4}}})
    policy = runtime_policy("budget-org")
    assert policy.max_attempts("Flow_A") == 3  # the environment's key survives the org's bound of the same plan
    assert policy.admission_budget() == (9, {"Flow_A": 2}, {"Contact": 4})
    assert runtime_policy("other-org").admission_budget() == (9, {}, {})
    assert policy.as_json()["plans"] == {"Flow_A": {"max_active": 2, "max_attempts": 3}}


def test_no_budget_claims_as_before():
    org = OrgScope("budget-free")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Free_Chain")
    runs = _start(org, "Free_Chain", 5)
    assert runtime_policy(org.org_id).admission_budget() is None
    assert [c.run_id for c in flow_step_claim_batch(worker_id="w", limit=4)] == runs[:4]


def test_an_org_at_its_budget_passes_the_round_to_the_next_org_and_resumes_when_a_run_ends():
    hot, cold = OrgScope("budget-a-hot"), OrgScope("budget-b-cold")  # the round robin starts with the hot org
    for org in (hot, cold):
        flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain")
    _publish(hot.org_id, {"queues": {"durable_mutation": {"max_active": 2}}})
    hot_runs, cold_runs = _start(hot, "Chain", 6), _start(cold, "Chain", 1)
    first = flow_step_claim_batch(worker_id="w", limit=4)
    assert [c.run_id for c in first] == hot_runs[:2]  # the budget, not the batch, bounds the round
    second = flow_step_claim_batch(worker_id="w", limit=4)
    assert [c.run_id for c in second] == cold_runs
    # The round robin comes back to the hot org: at its budget, it passes on; nothing else is due.
    assert flow_step_claim_batch(worker_id="w", limit=4) == []
    assert _running(hot) == 2
    flow_step_execute(claim=first[0])  # one run leaves Running: one more may start
    assert FlowRun.objects.get(pk=first[0].run_id).state != t.RUN_RUNNING
    third = flow_step_claim_batch(worker_id="w", limit=4)
    assert [c.run_id for c in third] == hot_runs[2:3]
    assert _running(hot) == 2


def test_a_flow_at_its_budget_leaves_the_round_to_the_orgs_other_flows():
    org = OrgScope("budget-plans")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Hot_Chain")
    flow_deploy(org=org, source=cf.durable_chain(2), flow_api_name="Cold_Chain")
    _publish(org.org_id, {"plans": {"Hot_Chain": {"max_active": 1}}})
    hot, cold = _start(org, "Hot_Chain", 5), _start(org, "Cold_Chain", 5)
    rounds = [[c.run_id for c in flow_step_claim_batch(worker_id="w", limit=2)] for _ in range(4)]
    assert rounds[0] == hot[:1]
    assert rounds[1:] == [cold[0:2], cold[2:4], cold[4:5]]  # the hot Flow at its budget never takes a round
    assert FlowRun.objects.filter(pk__in=hot, state=t.RUN_RUNNING).count() == 1


def test_a_resource_class_bounds_the_runs_of_every_flow_its_object_triggers():
    org = OrgScope("budget-objects")
    durable_on_save = fx.flow(
        fx.assignment("Mark", None, [("$Record.lastname", "Assign", "<stringValue>Seen</stringValue>")]),
        start=fx.start("Mark", trigger="RecordAfterSave", obj=cf.OBJECT, rtt="Create"), profile="DurableOrchestration")
    flow_deploy(org=org, source=durable_on_save, flow_api_name="On_Save_One")
    flow_deploy(org=org, source=durable_on_save, flow_api_name="On_Save_Two")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Autolaunched")
    _publish(org.org_id, {"resource_classes": {cf.OBJECT: {"max_active": 1}}})
    for i in range(3):
        save_record(org, {cf.STAGE: "lead", "email": f"budget-{i}@example.com"})
    started = _start(org, "Autolaunched", 2)
    claimed = [c for _ in range(6) for c in flow_step_claim_batch(worker_id="w", limit=4)]
    by_object = {}
    for c in claimed:
        obj = FlowRun.objects.get(pk=c.run_id).trigger_object_name
        by_object[obj] = by_object.get(obj, 0) + 1
    assert by_object[cf.OBJECT] == 1  # six saves' runs of two Flows, one object: one at a time
    assert {c.run_id for c in claimed} >= set(started)  # the object's budget never held back other work


def test_two_workers_claiming_one_org_at_once_never_exceed_its_budget(monkeypatch):
    """A real race: worker A has counted the org's running runs and is inside its claim; worker B's round at
    the same moment must not count the same headroom (without the org's claim lock both would claim)."""
    org = OrgScope("budget-race")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain")
    _publish(org.org_id, {"queues": {"durable_mutation": {"max_active": 1}}})
    _start(org, "Chain", 4)
    counted, go = threading.Event(), threading.Event()
    real_headroom = claim_module._headroom

    def held_headroom(*args, **kwargs):
        headroom = real_headroom(*args, **kwargs)
        if threading.current_thread().name == "worker-a":
            counted.set()
            assert go.wait(30), "worker A was never released"
        return headroom

    monkeypatch.setattr(claim_module, "_headroom", held_headroom)
    results: dict[str, list] = {}

    def worker(name: str) -> None:
        try:
            results[name] = flow_step_claim_batch(worker_id=name, limit=4)
        finally:
            connection.close()

    a = threading.Thread(target=worker, args=("worker-a",), name="worker-a")
    a.start()
    assert counted.wait(30), "worker A never counted"
    b = threading.Thread(target=worker, args=("worker-b",), name="worker-b")
    b.start()
    b.join(30)
    go.set()
    a.join(30)
    assert not a.is_alive() and not b.is_alive()
    assert len(results["worker-a"]) == 1 and results["worker-b"] == []
    assert _running(org) == 1


class _Retryable(NexusError):
    """A retryable step failure raised before any write (a proven rollback)."""

    code = "budget_test_failure"


def test_the_retry_budget_caps_retries_per_minute_while_first_attempts_go_on(monkeypatch, settings, db_clock_advance):
    """A retry storm is contained by the policy's budget: once the org's steps started ``max_per_minute``
    retries within a minute of the database clock, its rounds take first attempts only, until the window
    moves on."""
    settings.NEXUS_FLOW_RETRY_BASE_SECONDS = 1.0
    org = OrgScope("budget-retries")
    storm = flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Storm").plan
    flow_deploy(org=org, source=cf.durable_chain(2), flow_api_name="Calm")
    real = execute.EXECUTORS[KIND_PURE_COMPUTE]

    def failing(claim, plan, step_def):
        if claim.plan_id == storm.pk:
            raise _Retryable()
        return real(claim, plan, step_def)

    monkeypatch.setitem(execute.EXECUTORS, KIND_PURE_COMPUTE, failing)
    _publish(org.org_id, {"retries": {"max_per_minute": 3, "max_attempts": 10}})
    storm_runs = _start(org, "Storm", 5)
    for claim in flow_step_claim_batch(worker_id="w", limit=5):  # the first attempts are not retries
        flow_step_execute(claim=claim)
    assert FlowStepExecution.objects.filter(run_id__in=storm_runs, state=t.STEP_RETRY_SCHEDULED).count() == 5
    db_clock_advance(30)  # every retry is due
    calm_runs = _start(org, "Calm", 2)

    def retries_started() -> int:
        return FlowStepAttempt.objects.filter(org_id=org.org_id, attempt_number__gt=1).count()

    taken = []
    for _ in range(4):
        for claim in flow_step_claim_batch(worker_id="w", limit=4):
            taken.append(claim.run_id)
            flow_step_execute(claim=claim)
    assert retries_started() == 3  # the budget, though five retries were due the whole time
    assert set(calm_runs) <= set(taken)  # first attempts kept moving beside the spent budget
    db_clock_advance(RETRY_WINDOW_SECONDS + 1)  # the window moves on: the next retries are admitted
    for claim in flow_step_claim_batch(worker_id="w", limit=4):
        flow_step_execute(claim=claim)
    assert retries_started() == 3 + 3  # the next minute's budget, no more (five were due)


def test_expired_unrecovered_leases_at_the_bound_pause_new_step_claims_until_recovery(settings, db_clock_advance):
    """Workers dying or overrun leave leases expired: at the policy's ``expired_leases`` bound no new step is
    claimed, while recovery (which never asks) fences them and admission resumes."""
    settings.NEXUS_PRESSURE_EXPIRED_LEASES = 2
    settings.NEXUS_PRESSURE_READ_SECONDS = 0
    org = OrgScope("budget-leases")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain")
    abandoned = _start(org, "Chain", 2)
    assert len(flow_step_claim_batch(worker_id="dead-worker", limit=2)) == 2  # claimed, never executed
    waiting = _start(org, "Chain", 1)
    assert flow_lease_admission(runtime_policy().pressure) == ""  # the leases are live
    db_clock_advance(policy.lease_seconds() + 1)
    assert flow_lease_admission(runtime_policy().pressure) == PRESSURE_EXPIRED_LEASES
    assert scrape_metrics()[("nexusflow_leases_expired_unrecovered", (("role", "flow"),))] == 2
    assert execute.flow_try_run_step_one(worker_id="live-worker") is False
    assert FlowRun.objects.get(pk=waiting[0]).state == t.RUN_RUNNABLE  # paused, not claimed
    recovered = 0
    while flow_try_recover_expired_one():
        recovered += 1
    assert recovered >= 1 and flow_lease_admission(runtime_policy().pressure) == ""
    assert FlowStepExecution.objects.filter(run_id__in=abandoned, state__in=(t.STEP_CLAIMED, t.STEP_RUNNING)).count() < 2
    assert execute.flow_try_run_step_one(worker_id="live-worker") is True


def test_the_policys_fan_out_bound_applies_to_the_orgs_runs_at_run_time():
    """``execution.max_fan_out`` bounds the records a step's Get Records may return for the org that publishes
    it (a run-time bound: the plan is not recompiled); another org keeps the default."""
    bounded, default = OrgScope("fanout-bounded"), OrgScope("fanout-default")
    source = fx.flow(fx.lookup("Get_All", None), start=fx.start("Get_All"), profile="DurableOrchestration")
    for org in (bounded, default):
        flow_deploy(org=org, source=source, flow_api_name="Read_All")
        for i in range(3):
            save_record(org, {cf.STAGE: "lead", "email": f"fan-{i}@example.com"})
    _publish(bounded.org_id, {"execution": {"max_fan_out": 2}})
    assert runtime_policy(bounded.org_id).max_fan_out == 2 and runtime_policy(default.org_id).max_fan_out == 200
    runs = {org.org_id: flow_run_start(org=org, flow_api_name="Read_All", inputs={}).run.pk for org in (bounded, default)}
    run_until_idle()
    ended = {org_id: FlowRun.objects.get(pk=pk) for org_id, pk in runs.items()}
    assert ended[bounded.org_id].state == t.RUN_TERMINAL_FAILED
    assert list(FlowStepAttempt.objects.filter(org_id=bounded.org_id).values_list("safe_error_code", flat=True)) == [
        "flow_budget_exhausted"]
    assert ended[default.org_id].state == t.RUN_SUCCEEDED
