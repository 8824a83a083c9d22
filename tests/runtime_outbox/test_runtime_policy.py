"""The versioned runtime policy (issue "Admission lanes, fairness and backpressure", item 1; seed 004 16.3).

Generations are immutable and authored by ``manage.py runtime_policy publish``; the policy in force for an
org is the built-in defaults overlaid by the environment's latest generation and the org's. Consumers
read it: the Flow step claims (pressure), the webhook ingress (shedding, proven with real pressure on the
database) and a step's retry bound (per plan).
"""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from connectors.models import Receipt
from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import KIND_PURE_COMPUTE
from nexusflow.flows.models import FlowRun, FlowStepAttempt
from nexusflow.flows.services import execute, flow_deploy
from nexusflow.kernel.errors import ImmutableRow
from runtime_outbox.models import RuntimePolicyGeneration
from runtime_outbox.policy import BUILTIN_VERSION, RuntimePolicyInvalid, runtime_policy, runtime_policy_publish
from tests.conftest import hubspot_event, make_serving_org, post_signed
from tests.flows.conftest import decision_flow_xml, run_until_idle, save_record
from tests.pressure_support import blocked_statements, until

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _publish(scope, document, reason="test"):
    """``(generation, created)`` of one publish."""
    return runtime_policy_publish(scope=scope, document=document, authored_by="ops", reason=reason)[:2]


@pytest.mark.parametrize("scope,document,detail", [
    ("*", [], "non-empty JSON object"),
    ("*", {}, "non-empty JSON object"),
    ("*", {"lanes": {"x": 1}}, "unknown section 'lanes'"),
    ("*", {"retries": {"max_attempts": 0}}, "retries.max_attempts must be between 1 and 100"),
    ("*", {"retries": {"max_attempts": 2.5}}, "retries.max_attempts must be an integer"),
    ("*", {"retries": {"max_attempts": True}}, "retries.max_attempts must be an integer"),
    ("*", {"retries": {"attempts": 3}}, "unknown key retries.attempts"),
    ("*", {"pressure": {"connection_share": 1.5}}, "pressure.connection_share must be between"),
    ("*", {"ingress": {"retry_after_seconds": 0}}, "ingress.retry_after_seconds must be between"),
    ("acme", {"pressure": {"active_statements": 8}}, "only the environment policy"),
    ("acme", {"ingress": {"retry_after_seconds": 8}}, "only the environment policy"),
    ("acme", {"plans": {"bad name!": {"max_attempts": 1}}}, "not a Flow API name"),
    ("acme", {"plans": {"Flow_A": {"lease": 1}}}, "plans.Flow_A takes max_attempts"),
    (" acme", {"retries": {"max_attempts": 3}}, "org"),
], ids=lambda v: v if isinstance(v, str) and " " in v else None)
def test_an_invalid_document_is_refused_naming_the_key_and_publishes_nothing(scope, document, detail):
    with pytest.raises(RuntimePolicyInvalid) as caught:
        _publish(scope, document)
    assert caught.value.code == "runtime_policy_invalid" and detail in str(caught.value)
    assert not RuntimePolicyGeneration.objects.exists()


def test_generations_are_immutable_chains_and_the_policy_in_force_overlays_them(settings):
    settings.NEXUS_FLOW_MAX_ATTEMPTS = 5
    assert runtime_policy("acme").version == BUILTIN_VERSION and runtime_policy("acme").max_attempts() == 5
    env, created = _publish("*", {"retries": {"max_attempts": 4}, "ingress": {"retry_after_seconds": 9}})
    assert created and (env.generation, env.policy_version) == (1, "env.1")
    assert _publish("*", {"ingress": {"retry_after_seconds": 9}, "retries": {"max_attempts": 4}})[1] is False
    org, _ = _publish("acme", {"retries": {"max_attempts": 3}, "plans": {"Flow_A": {"max_attempts": 1}}})
    policy = runtime_policy("acme")
    assert policy.version == "env.1+org.1"
    assert (policy.max_attempts(), policy.max_attempts("Flow_A"), policy.max_attempts("Flow_B")) == (3, 1, 3)
    assert policy.ingress.retry_after_seconds == 9 and runtime_policy("other").max_attempts() == 4
    second, created = _publish("acme", {"retries": {"max_attempts": 2}}, reason="tighter")
    assert created and second.generation == 2 and runtime_policy("acme").version == "env.1+org.2"
    assert runtime_policy("acme").max_attempts("Flow_A") == 2  # the latest generation is the whole org policy
    with pytest.raises(ImmutableRow):
        org.save()
    with pytest.raises(ImmutableRow):
        RuntimePolicyGeneration.objects.filter(pk=org.pk).update(reason="rewritten")
    assert RuntimePolicyGeneration.objects.get(pk=org.pk).reason == "test"


def test_the_command_publishes_and_shows_and_refuses_bad_input_with_exit_2(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"retries": {"max_attempts": 3}}))
    out = io.StringIO()
    call_command("runtime_policy", "publish", str(path), "--scope", "acme", "--actor", "ops", "--reason", "r",
                 stdout=out)
    assert json.loads(out.getvalue())["policy_version"] == "org.1"
    shown = io.StringIO()
    call_command("runtime_policy", "show", "--org", "acme", "--json", stdout=shown)
    body = json.loads(shown.getvalue())
    assert body["version"] == "org.1" and body["retries"]["max_attempts"] == 3
    assert [g["policy_version"] for g in body["generations"]] == ["org.1"]
    path.write_text("{not json")
    with pytest.raises(CommandError) as caught:
        call_command("runtime_policy", "publish", str(path), "--scope", "acme", "--actor", "ops", "--reason", "r")
    assert caught.value.returncode == 2 and "runtime_policy_invalid" in str(caught.value)
    with pytest.raises(CommandError) as caught:
        call_command("runtime_policy", "publish", str(tmp_path / "missing.json"), "--scope", "acme", "--actor",
                     "ops", "--reason", "r")
    assert caught.value.returncode == 2
    assert RuntimePolicyGeneration.objects.count() == 1


def test_a_plans_retry_bound_ends_its_runs_after_that_many_attempts(monkeypatch, settings):
    """Every step of the plan fails retryably: the plan's bound (1) ends its run after one attempt, another
    plan of the same org keeps the org's bound (3)."""
    from nexusflow.kernel.scope import OrgScope

    settings.NEXUS_FLOW_RETRY_BASE_SECONDS = 0
    org = OrgScope("policy-org")
    flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only")
    flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Again")
    _publish("policy-org", {"retries": {"max_attempts": 3}, "plans": {"Decide_Only": {"max_attempts": 1}}})

    def broken(claim, plan, step_def):
        raise RuntimeError("always")

    monkeypatch.setitem(execute.EXECUTORS, KIND_PURE_COMPUTE, broken)
    save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    run_until_idle()
    attempts = {run.plan.flow_api_name: FlowStepAttempt.objects.filter(step__run=run).count()
                for run in FlowRun.objects.filter(org_id=org.org_id)}
    assert attempts == {"Decide_Only": 1, "Decide_Again": 3}
    assert {(r.state, r.reason_code) for r in FlowRun.objects.filter(org_id=org.org_id)} == {
        (t.RUN_TERMINAL_FAILED, "flow_step_retry_exhausted")}


def test_the_ingress_sheds_at_the_policys_bound_and_admits_again_below_it(client, billing_sandbox, settings):
    """Real pressure: statements blocked on a held row lock. At the environment policy's ingress bound the
    webhook answers 503 ``ingress_shed`` with the policy's Retry-After and admits nothing; the provider's
    redelivery once the pressure is gone is admitted (202) and nothing accepted before was lost."""
    from nexusflow.kernel import pressure

    settings.NEXUS_POLICY_READ_SECONDS = 0
    make_serving_org(billing_sandbox.base_url)
    assert post_signed(client, [hubspot_event(1, 501, 1000)]).status_code == 202
    _publish("*", {"pressure": {"active_statements": 100, "read_seconds": 0},
                   "ingress": {"shed_active_statements": 3, "retry_after_seconds": 7}})
    plan_pk = FlowRun._meta.get_field("plan").related_model.objects.values_list("pk", flat=True).first()
    with blocked_statements(plan_pk, 3):
        shed = post_signed(client, [hubspot_event(2, 502, 1000)])
        assert (shed.status_code, shed.json()["error"], shed["Retry-After"]) == (503, "ingress_shed", "7")
        assert Receipt.objects.count() == 1
    until("the blocked statements finished", lambda: pressure.read_pressure().reason == "")
    assert post_signed(client, [hubspot_event(2, 502, 1000)]).status_code == 202
    assert Receipt.objects.count() == 2


def test_an_orgs_ingress_sheds_while_its_oldest_due_work_is_older_than_the_bound(client, billing_sandbox, settings,
                                                                                   db_clock_advance):
    """Queue age as an admission signal: while the org's oldest due durable work (here a Flow run no worker has
    claimed) has waited ``shed_queue_age_seconds`` on the database clock, its webhook answers 503
    ``ingress_shed`` and admits nothing; another org is not shed; once the backlog drains, the redelivery is
    admitted."""
    from nexusflow.flows.services import flow_run_start
    from nexusflow.kernel.pressure import ingress_queue_admission, queue_age_seconds
    from tests.bench import capacity_flows as cf
    from tests.conftest import ORG, drain

    settings.NEXUS_POLICY_READ_SECONDS = 0
    org = make_serving_org(billing_sandbox.base_url)
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Backlog")
    _publish("*", {"pressure": {"read_seconds": 0}, "ingress": {"shed_queue_age_seconds": 60, "retry_after_seconds": 9}})
    flow_run_start(org=org, flow_api_name="Backlog", inputs={"counter": 0})
    assert post_signed(client, [hubspot_event(1, 501, 1000)]).status_code == 202  # young backlog: admitted
    db_clock_advance(61)
    assert queue_age_seconds(ORG) >= 60 and queue_age_seconds("another-org") == 0
    shed = post_signed(client, [hubspot_event(2, 502, 1000)])
    assert (shed.status_code, shed.json()["error"], shed["Retry-After"]) == (503, "ingress_shed", "9")
    assert Receipt.objects.count() == 1
    assert ingress_queue_admission("another-org", bound_seconds=60, read_seconds=0) == ""
    drain()  # the workers drain the org's backlog (its run and the admitted delivery's executions)
    assert queue_age_seconds(ORG) == 0
    assert post_signed(client, [hubspot_event(2, 502, 1000)]).status_code == 202
    assert Receipt.objects.count() == 2


def test_metrics_show_the_servers_lock_waits_and_what_the_policy_pauses(settings):
    """``/metrics`` reads the server's own counters and judges them under the policy in force."""
    from nexusflow.flows.services import flow_deploy as deploy
    from nexusflow.kernel.scope import OrgScope
    from tests.kernel.test_metrics import scrape_metrics

    settings.NEXUS_POLICY_READ_SECONDS = 0
    plan = deploy(org=OrgScope("metrics-org"), source=decision_flow_xml(), flow_api_name="Decide_Only").plan
    _publish("*", {"pressure": {"active_statements": 10_000, "lock_waits": 2, "read_seconds": 0}})
    with blocked_statements(plan.pk, 2):
        samples = scrape_metrics()
    assert samples[("nexusflow_database_row_lock_waits", ())] >= 2
    assert samples[("nexusflow_admission_paused", (("purpose", "mutation"),))] == 1
    assert samples[("nexusflow_admission_paused", (("purpose", "ingress"),))] == 0
    assert samples[("nexusflow_runtime_policy_info", (("version", "env.1"),))] == 1
    assert samples[("nexusflow_database_deadlocks_total", ())] >= 0
    assert samples[("nexusflow_database_sessions", (("scope", "account"), ("state", "running")))] >= 2
