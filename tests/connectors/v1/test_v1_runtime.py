"""The V1 runtime being retired (issue 21 item 1; seed 003 "V1 concepts to retire", seed 002 "Scope").

Real MariaDB, real provider sandboxes, real worker processes; time moves with the database clock.
"""
from __future__ import annotations

import json
import signal

import httpx
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from connectors.models import (
    AccountServingGate,
    V1Account,
    V1Event,
    V1ProcessGeneration,
    V1ProviderCall,
    V1SchedulerLease,
    V1TransportKey,
)
from connectors.v1.events import (
    v1_event_claim,
    v1_event_try_complete_one,
    v1_event_try_recover_one,
    v1_event_try_run_one,
)
from connectors.v1.generations import v1_release
from connectors.v1.push import V1PushRefused, v1_push_record
from cutover.models import CutoverEvidence
from cutover.services import CutoverRefused, cutover_greenfield
from cutover.v1_install import cutover_v1_install
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock, record_write_mirror
from runtime_outbox.models import ApplicationResult, InboxAcceptance, OutboxMessage
from tests.conftest import BILLING_KEY, ORG, hubspot_event, run_manage, subprocess_env
from tests.connectors.v1.support import install_v1, post_v1

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

GATE_TABLES = ("connectors_accountservinggate", "connectors_servingepoch")


def _events(*specs):
    return [hubspot_event(*spec) for spec in specs]


def _run_all(worker_id: str = "v1-test-worker") -> int:
    done = 0
    while v1_event_try_run_one(worker_id=worker_id) or v1_event_try_complete_one():
        done += 1
    return done


# --- install -------------------------------------------------------------------------------------------
def test_v1_install_registers_accounts_keeps_gates_v1_serving_and_is_idempotent(billing_sandbox):
    org = install_v1(billing_sandbox.base_url)
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}
    assert set(V1Account.objects.filter(org_id=ORG).values_list("account_key", flat=True)) == {"crm-webhooks",
                                                                                             "billing-main"}
    evidence = CutoverEvidence.objects.filter(org_id=ORG, kind="v1_install")
    assert {e.payload["v1_release"] for e in evidence} == {v1_release()} and evidence.count() == 2
    again = cutover_v1_install(org=org)
    assert again.created == 0 and V1Account.objects.count() == 2 and evidence.count() == 2


def test_v1_install_is_refused_once_the_org_left_v1_serving(billing_sandbox):
    from tests.conftest import apply_service_configuration

    org = OrgScope(ORG)
    apply_service_configuration(org, billing_sandbox.base_url)
    cutover_greenfield(org=org)
    with pytest.raises(CutoverRefused):
        cutover_v1_install(org=org)
    result = run_manage(["cutover", "v1-install", "--org", ORG], subprocess_env())
    assert result.returncode == 1 and "cutover_refused" in result.stderr
    assert not V1Account.objects.exists()


# --- ingress ---------------------------------------------------------------------------------------------
def test_v1_ingress_accepts_once_and_answers_every_bad_input_with_a_stable_code(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    body = _events((1, 501, 1000), (2, 501, 1001, "email", "a@example.com"))
    first = post_v1(client, body)
    assert first.status_code == 202, first.content
    assert first.json()["status"] == "accepted" and first.json()["events"] == 2
    again = post_v1(client, body)
    assert again.status_code == 200 and again.json() == {**first.json(), "status": "redelivered", "events": 0}
    assert V1TransportKey.objects.count() == 1
    assert sorted(V1Event.objects.values_list("state", flat=True)) == ["pending", "pending"]

    assert post_v1(client, _events((3, 502, 1002)), sign="invalid").json()["error"] == "signature_invalid"
    assert post_v1(client, "not json").json()["error"] == "malformed_body"
    unknown = post_v1(client, _events((4, 503, 1003)), account="nobody")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_ingress")
    # The same items with another value under the same transport key: a conflict, nothing changes.
    changed = post_v1(client, _events((1, 501, 1000), (2, 501, 1001, "email", "b@example.com")))
    assert (changed.status_code, changed.json()["error"]) == (409, "admission_conflict")
    assert V1TransportKey.objects.count() == 1 and V1Event.objects.count() == 2


def test_an_item_v1_cannot_run_is_kept_quarantined_with_its_reason(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    response = post_v1(client, [{"eventId": 9, "subscriptionType": "contact.unknownKind", "objectId": 1}])
    assert response.status_code == 202
    (event,) = V1Event.objects.all()
    assert event.state == "quarantined" and event.reason_code == "item_kind_unsupported"
    assert bytes(V1TransportKey.objects.get().body)  # the accepted body is kept byte-exact


# --- Runtime handoff acceptance is completion -----------------------------------------------------------
def test_a_v1_event_completes_when_the_runtime_inbox_accepts_its_command(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    post_v1(client, _events((1, 601, 1000), (2, 601, 1001, "email", "c@example.com")))
    assert _run_all() >= 2
    events = list(V1Event.objects.order_by("id"))
    assert [e.state for e in events] == ["completed", "completed"]
    for event in events:
        message = OutboxMessage.objects.get(org_id=ORG, message_key=event.handoff_key)
        assert message.family == "runtime.command.handoff" and message.state == "delivered"
        acceptance = InboxAcceptance.objects.get(org_id=ORG, message_key=event.handoff_key)
        assert acceptance.state == "accepted" and acceptance.accepted_ref.startswith("application_result:")
        assert ApplicationResult.objects.filter(org_id=ORG, command_id=event.handoff_key).count() == 1
    (record,) = Record.objects.filter(org_id=ORG, object_name="Contact")
    assert record.fields["email"] == "c@example.com"
    lease = V1SchedulerLease.objects.get(org_id=ORG, name="v1.events")
    assert lease.holder == "v1-test-worker" and lease.fence_token == 1


def test_v1_never_reads_a_v2_gate_or_epoch(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    with CaptureQueriesContext(connection) as queries:
        post_v1(client, _events((1, 701, 1000, "email", "g@example.com")))
        _run_all()
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert "connectors_v1event" in sql.lower()
    assert not [t for t in GATE_TABLES if t in sql], "V1 read a V2 gate or epoch"


# --- lease, retry, owner ----------------------------------------------------------------------------------
def test_an_expired_v1_lease_returns_the_event_for_a_retry_by_another_worker(billing_sandbox, client,
                                                                            db_clock_advance):
    install_v1(billing_sandbox.base_url)
    post_v1(client, _events((1, 801, 1000)))
    claim = v1_event_claim(org_id=ORG, worker_id="worker-a")
    event = V1Event.objects.get()
    assert (event.state, event.lease_owner, event.attempt_count) == ("running", "worker-a", 1)
    assert not v1_event_try_recover_one()  # the lease is live
    # worker-a holds the SchedulerLease: worker-b cannot claim this org's events meanwhile.
    assert v1_event_claim(org_id=ORG, worker_id="worker-b") is None
    db_clock_advance(31)
    assert v1_event_try_recover_one()
    event.refresh_from_db()
    assert (event.state, event.lease_owner, event.next_attempt_at is not None) == ("pending", "", True)
    db_clock_advance(5)
    assert _run_all("worker-b") >= 1
    event.refresh_from_db()
    assert (event.state, event.attempt_count) == ("completed", 2)
    lease = V1SchedulerLease.objects.get(org_id=ORG, name="v1.events")
    assert (lease.holder, lease.fence_token) == ("worker-b", claim.scheduler_fence + 1)


# --- real processes: generations and a crash at the failpoint ---------------------------------------------
def test_run_workers_role_v1_records_its_process_generation_and_drains(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    post_v1(client, _events((1, 901, 1000, "email", "p@example.com")))
    result = run_manage(["run_workers", "--role", "v1", "--until-idle", "--idle-sleep", "0"], subprocess_env())
    assert result.returncode == 0, result.stderr
    (generation,) = V1ProcessGeneration.objects.all()
    assert generation.release == v1_release() and generation.worker_id.startswith("v1:")
    assert V1Event.objects.get().state == "completed"
    assert V1Event.objects.get().lease_owner == generation.worker_id
    second = run_manage(["run_workers", "--role", "v1", "--once"], subprocess_env())
    assert second.returncode == 0 and V1ProcessGeneration.objects.count() == 2


def test_a_v1_worker_killed_after_its_claim_leaves_a_leased_event_a_new_generation_finishes(
        billing_sandbox, client, db_clock_advance):
    install_v1(billing_sandbox.base_url)
    post_v1(client, _events((1, 951, 1000, "email", "k@example.com")))
    crashed = run_manage(["run_workers", "--role", "v1", "--once"],
                         subprocess_env(NEXUS_FAILPOINTS="v1.event.after_claim"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    event = V1Event.objects.get()
    assert event.state == "running" and not OutboxMessage.objects.exists()
    # The killed holder is proven gone (its pid is absent): recovery does not wait for the lease to expire.
    assert v1_event_try_recover_one()
    event.refresh_from_db()
    assert event.state == "pending" and event.next_attempt_at is not None
    db_clock_advance(5)  # past the retry backoff; the child process reads the moved clock
    resumed = run_manage(["run_workers", "--role", "v1", "--until-idle", "--idle-sleep", "0"], subprocess_env())
    assert resumed.returncode == 0, resumed.stderr
    event.refresh_from_db()
    assert event.state == "completed" and event.attempt_count == 2
    assert V1ProcessGeneration.objects.count() == 2
    assert ApplicationResult.objects.filter(org_id=ORG).count() == 1


# --- synchronous PATCH-only push behind a durable pre-I/O row -----------------------------------------------
def _contact_with_remote(billing_sandbox, client) -> tuple[str, str]:
    """A V1-applied Contact whose billing mirror holds an existing billing customer id."""
    post_v1(client, _events((1, 1001, 1000), (2, 1001, 1001, "email", "push@example.com")))
    _run_all()
    record = Record.objects.get(org_id=ORG, object_name="Contact")
    customer = httpx.post(billing_sandbox.base_url + "/v1/customers", data={"email": "old@example.com"},
                          headers={"Authorization": f"Bearer {BILLING_KEY}"}).json()
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        record_write_mirror(org=OrgScope(ORG), record=locked, field="billing_id", value=customer["id"])
    return record.record_key, customer["id"]


def test_v1_push_patches_the_existing_remote_behind_a_committed_pre_io_row(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    record_key, customer_id = _contact_with_remote(billing_sandbox, client)
    with CaptureQueriesContext(connection) as queries:
        report = v1_push_record(org=OrgScope(ORG), contract_key="billing.customer", record_key=record_key)
    assert report.state == "confirmed" and report.remote_id == customer_id
    call = V1ProviderCall.objects.get()
    assert (call.call_site, call.kind, call.state, call.response_status) == ("v1.push.update", "push", "confirmed", 200)
    assert call.io_may_have_started_at is not None and call.url.endswith(f"/v1/customers/{customer_id}")
    (customer,) = billing_sandbox.state()["customers"]
    assert (customer["email"], customer["create_requests"], customer["update_requests"]) == \
        ("push@example.com", 1, 1)
    assert not [t for t in GATE_TABLES if t in " ".join(q["sql"] for q in queries.captured_queries)]


def test_v1_push_never_creates_a_record_without_a_remote_id(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    post_v1(client, _events((1, 1101, 1000), (2, 1101, 1001, "email", "new@example.com")))
    _run_all()
    record = Record.objects.get(org_id=ORG, object_name="Contact")
    before = billing_sandbox.state()["requests"]
    with pytest.raises(V1PushRefused) as refused:
        v1_push_record(org=OrgScope(ORG), contract_key="billing.customer", record_key=record.record_key)
    assert refused.value.code == "v1_no_linked_remote"
    assert not V1ProviderCall.objects.exists() and billing_sandbox.state()["requests"] == before
    result = run_manage(["v1_push", "--org", ORG, "--contract", "billing.customer", "--record", record.record_key],
                        subprocess_env())
    assert result.returncode == 1 and "v1_no_linked_remote" in result.stderr


def test_a_push_killed_after_its_pre_io_marker_leaves_an_interrupted_call_and_sends_nothing(billing_sandbox, client):
    install_v1(billing_sandbox.base_url)
    record_key, _customer_id = _contact_with_remote(billing_sandbox, client)
    before = billing_sandbox.state()["requests"]
    crashed = run_manage(["v1_push", "--org", ORG, "--contract", "billing.customer", "--record", record_key],
                         subprocess_env(NEXUS_FAILPOINTS="v1.call.after_sending"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    call = V1ProviderCall.objects.get()
    assert call.state == "sending" and call.io_may_have_started_at is not None and call.response_status is None
    assert billing_sandbox.state()["requests"] == before
    done = run_manage(["v1_push", "--org", ORG, "--contract", "billing.customer", "--record", record_key],
                      subprocess_env())
    assert done.returncode == 0, done.stderr
    assert sorted(V1ProviderCall.objects.values_list("state", flat=True)) == ["confirmed", "sending"]
    assert json.loads(json.dumps(billing_sandbox.state()))["customers"][0]["update_requests"] == 1
