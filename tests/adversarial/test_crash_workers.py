"""Kill a worker at each failpoint, restart it once with --until-idle: no duplicate, no stuck work."""
import signal

import pytest
from django.db import connection, transaction

from connectors.models import Execution, ExecutionAttempt, RemoteEffect
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.services import record_create, record_lock
from runtime_outbox.models import ApplicationResult, InboxAcceptance, OutboxMessage
from runtime_outbox.services import outbound_command_author
from tests.adversarial.helpers import check_end_state, pending_work, run_parallel
from tests.conftest import ORG, hubspot_event, make_serving_org, post_signed, run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

BATCH = [hubspot_event(1, 901, 1000), hubspot_event(2, 901, 2000, "email", "ivy@x.io"),
         hubspot_event(3, 901, 2500, "firstname", "Ivy"),
         hubspot_event(4, 901, 3000, "lifecyclestage", "customer")]
EXPECTED = {"901": {"email": "ivy@x.io", "firstname": "Ivy", "lifecyclestage": "customer"}}


@pytest.mark.parametrize("failpoint", ["execution.after_claim", "execution.after_runtime_result"])
def test_connector_killed_then_restarted_until_idle_converges(client, serving_org, failpoint):
    assert post_signed(client, BATCH).status_code == 202
    crashed = run_manage(["run_workers", "--role", "connector"], subprocess_env(NEXUS_FAILPOINTS=failpoint), timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    # an operator restarts the worker (default lease); it must pick the orphaned claim up
    restarted = run_manage(["run_workers", "--role", "connector", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    stuck = list(Execution.objects.filter(state="ready").values_list("id", "lane_id"))
    assert not stuck, f"executions left ready after restart: {stuck}; attempts " + str(
        list(ExecutionAttempt.objects.values_list("execution_id", "state", "worker_id")))
    assert ApplicationResult.objects.count() == Execution.objects.filter(state="completed").count()


@pytest.mark.parametrize("role,failpoint", [
    ("connector", "execution.after_claim"),
    ("connector", "execution.after_runtime_result"),
    ("runtime", "outbox.after_effect_accept"),
    ("flow", "flow.step.after_claim"),
    ("flow", "flow.step.before_commit"),
    ("flow", "flow.step.after_commit"),
    ("egress", "permit.after_grant"),
    ("egress", "permit.after_sending"),
    ("egress", "permit.after_response"),
    ("egress", "effect.after_settle"),
])
def test_kill_at_failpoint_full_pipeline_converges(client, serving_org, role, failpoint, db_clock_advance):
    assert post_signed(client, BATCH).status_code == 202
    env = subprocess_env(NEXUS_EXECUTION_LEASE_SECONDS="2", NEXUS_FLOW_LEASE_SECONDS="2")
    order = ["connector", "flow", "runtime", "egress"]
    # drive the pipeline up to the role under test, then kill it there
    for _ in range(4):
        for r in order:
            if r == role:
                break
            run_manage(["run_workers", "--role", r, "--until-idle"], env, timeout=120)
        crashed = run_manage(["run_workers", "--role", role], subprocess_env(
            NEXUS_FAILPOINTS=failpoint, NEXUS_EXECUTION_LEASE_SECONDS="2", NEXUS_FLOW_LEASE_SECONDS="2"), timeout=60)
        if crashed.returncode == -signal.SIGKILL:
            break
    else:
        pytest.fail(f"{failpoint} was never reached")
    db_clock_advance(2.5)  # past the killed worker's 2 s leases; the recovering workers read the moved clock
    env = subprocess_env(NEXUS_EXECUTION_LEASE_SECONDS="2", NEXUS_FLOW_LEASE_SECONDS="2")
    run_parallel(env, {"connector": 1, "runtime": 1, "flow": 1, "egress": 1}, rounds=10)
    assert not any(pending_work().values()), pending_work()
    problems = check_end_state(EXPECTED, serving_org.sandbox)
    assert not problems, problems
    customers = serving_org.sandbox.state()["customers"]
    assert len(customers) == 1
    assert RemoteEffect.objects.filter(state="finalized").count() == RemoteEffect.objects.count()


def test_runtime_killed_between_inbox_commit_and_acknowledgement_redelivers_onto_one_acceptance(billing_sandbox):
    """Seed 004 section 15.1: the owner commits inbox acceptance + its one effect before Runtime acknowledges."""
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    with transaction.atomic():
        record = record_create(org=OrgScope(ORG), object_name="Contact",
                               values={"email": "kim@x.io", "firstname": "Kim", "lifecyclestage": "customer"})
    with transaction.atomic():
        record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        command = outbound_command_author(
            scope=TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding"),
            effect_root_id="root-" + record.record_key, effect_slot_id="push-1", effect_generation_id="1",
            contract_key="billing.customer", record=record, origin_flow_run_id=None)
    crashed = run_manage(["run_workers", "--role", "runtime"],
                         subprocess_env(NEXUS_FAILPOINTS="outbox.after_effect_accept"), timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    message = OutboxMessage.objects.get(org_id=ORG, command=command)
    # The consumer's transaction committed; only the acknowledgement was lost.
    assert (message.state, message.delivery_attempts) == ("pending", 1)
    effect = RemoteEffect.objects.get(org_id=ORG, command=command)
    assert InboxAcceptance.objects.get(org_id=ORG).accepted_ref == f"remote_effect:{effect.pk}"
    with connection.cursor() as cursor:  # the database clock passes the claim's backoff
        cursor.execute("UPDATE runtime_outbox_outboxmessage SET next_attempt_at = NULL WHERE id = %s", [message.pk])

    restarted = run_manage(["run_workers", "--role", "runtime", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    message = OutboxMessage.objects.get(org_id=ORG, pk=message.pk)
    assert (message.state, message.delivery_attempts) == ("delivered", 2)
    assert list(RemoteEffect.objects.filter(org_id=ORG).values_list("pk", flat=True)) == [effect.pk]
    acceptance = InboxAcceptance.objects.get(org_id=ORG)
    assert (acceptance.message_key, acceptance.outbox_message_id, acceptance.payload_digest, acceptance.state) == (
        command.idempotency_key, message.pk, message.payload_digest, "accepted")
