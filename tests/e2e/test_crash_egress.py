"""Crash tests: kill a real egress worker at a named failpoint and restart it (seed 003 "Transaction and crash rules")."""
import signal

import pytest
from django.db import connection, transaction

from connectors.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteLink, WorkerProcess
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_create
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.conftest import ORG, make_serving_org, run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _push_one_contact():
    scope = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")
    with transaction.atomic():
        record = record_create(org=OrgScope(ORG), object_name="Contact",
                               values={"email": "kim@x.io", "firstname": "Kim", "lifecyclestage": "customer"})
        outbound_command_author(scope=scope, effect_root_id="root-1", effect_slot_id="push", effect_generation_id="1",
                                contract_key="billing.customer", record=record, origin_flow_run_id=None)
    assert outbox_try_deliver_one()
    return record


@pytest.mark.parametrize("failpoint,permit_state,requests_before_restart,first_attempt", [
    ("permit.after_grant", "granted", 0, "no_effect"),
    ("permit.after_sending", "sending", 0, "uncertain"),
    ("permit.after_response", "sending", 1, "uncertain"),
])
def test_killed_egress_worker_never_creates_a_second_customer(billing_sandbox, failpoint, permit_state,
                                                              requests_before_restart, first_attempt):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    record = _push_one_contact()

    crashed = run_manage(["run_workers", "--role", "egress"], subprocess_env(NEXUS_FAILPOINTS=failpoint), timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    permit = DispatchPermit.objects.get()
    assert permit.state == permit_state
    assert (permit.io_may_have_started_at is not None) == (permit_state == "sending")
    assert RemoteEffect.objects.get().state == "dispatching"
    assert billing_sandbox.state()["requests"] == requests_before_restart

    restarted = run_manage(["run_workers", "--role", "egress", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr

    effect = RemoteEffect.objects.get()
    assert effect.state == "finalized"
    customers = billing_sandbox.state()["customers"]
    assert len(customers) == 1
    assert customers[0]["create_requests"] == requests_before_restart + 1
    abandoned, returned = DispatchPermit.objects.order_by("id")
    assert abandoned.state == "abandoned" and "pid_absent" in str(abandoned.closed_evidence)
    # The holder registry keeps the proof that the killed process generation (and its egress) ended.
    holder = WorkerProcess.objects.get(worker_id=abandoned.holder_id)
    assert holder.terminated_at is not None and holder.termination_proof["egress"] == "closed_with_process"
    assert abandoned.closed_evidence == holder.termination_proof
    assert returned.state == "returned"
    first, second = RemoteEffectAttempt.objects.order_by("attempt_number")
    assert first.state == first_attempt and second.state == "confirmed"
    assert first.idempotency_key == second.idempotency_key
    assert bytes(first.request_body) == bytes(second.request_body)
    assert RemoteLink.objects.get(action_type="PushToConnector").remote_id == customers[0]["id"]
    assert Record.objects.get(pk=record.pk).mirrors["billing_id"] == customers[0]["id"]


@pytest.mark.parametrize("failpoint,effect_state", [
    # Killed inside the acquisition transaction: nothing committed, the effect is still prepared.
    ("permit.grant_before_commit", "prepared"),
    # Killed inside the granted -> sending transaction: the Permit is still provably granted (pre-I/O).
    ("permit.sending_before_commit", "dispatching"),
])
def test_a_worker_killed_before_its_transaction_commits_leaves_a_provably_pre_io_state(
        billing_sandbox, failpoint, effect_state):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _push_one_contact()

    crashed = run_manage(["run_workers", "--role", "egress"], subprocess_env(NEXUS_FAILPOINTS=failpoint), timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert RemoteEffect.objects.get().state == effect_state
    permits = list(DispatchPermit.objects.all())
    if effect_state == "prepared":
        assert permits == [] and not RemoteEffectAttempt.objects.exists()  # directly reclaimable
    else:
        assert [(p.state, p.io_may_have_started_at) for p in permits] == [("granted", None)]
    assert billing_sandbox.state()["requests"] == 0

    restarted = run_manage(["run_workers", "--role", "egress", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    assert RemoteEffect.objects.get().state == "finalized"
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] == [1]
    if effect_state == "dispatching":
        abandoned = DispatchPermit.objects.order_by("id").first()
        assert abandoned.state == "abandoned" and RemoteEffectAttempt.objects.order_by("id").first().state == "no_effect"


def test_permit_age_alone_proves_nothing_while_the_holder_lives(billing_sandbox, tmp_path):
    """A Permit is not a lease: a live (paused) holder keeps its ``sending`` Permit open however old it is;
    only the proven end of that process generation lets recovery abandon it, as ``uncertain``."""
    import subprocess
    import sys
    import time

    from connectors.outbound.egress import permit_try_abandon_one
    from connectors.serving.handoff import halt_begin, halt_try_complete
    from nexusflow.kernel.scope import OrgScope
    from tests.conftest import ROOT

    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _push_one_contact()
    env = subprocess_env(NEXUS_FAILPOINTS="permit.after_sending=pause", NEXUS_FAILPOINT_DIR=str(tmp_path))
    holder = subprocess.Popen([sys.executable, "manage.py", "run_workers", "--role", "egress"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("permit.after_sending.*")):
            assert time.monotonic() < deadline and holder.poll() is None, "the holder never reached sending"
            time.sleep(0.05)
        with connection.cursor() as cursor:  # age the Permit far past any plausible lease
            cursor.execute("UPDATE connectors_dispatchpermit SET created_at = created_at - INTERVAL 30 DAY, "
                           "io_may_have_started_at = io_may_have_started_at - INTERVAL 30 DAY")
        assert permit_try_abandon_one() is False
        assert DispatchPermit.objects.get().state == "sending"
        halt_begin(org=OrgScope(ORG))
        assert halt_try_complete(org=OrgScope(ORG)).gates["billing-main"][0] == "halting_v2"
    finally:
        holder.kill()
        holder.wait(30)
    assert permit_try_abandon_one() is True
    assert DispatchPermit.objects.get().state == "abandoned"
    assert RemoteEffect.objects.get().state == "uncertain"
    assert billing_sandbox.state()["requests"] == 0
    assert halt_try_complete(org=OrgScope(ORG)).gates["billing-main"][0] == "halting_v2"  # uncertain needs serving
