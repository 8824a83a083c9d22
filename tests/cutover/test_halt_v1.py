"""``cutover halt-v1`` (issue 21 item 3, first phase): owner-level barriers, frozen gate set, remeasure.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (step 1); proofs S003-RP-35 and S003-RP-38.
Real MariaDB; the barrier-crossing transaction is a real concurrent transaction on its own connection.
"""
from __future__ import annotations

import threading

import httpx
import pytest
from django.db import connection, transaction

from connectors.models import (
    AccountServingGate,
    GateTransitionEvidence,
    V1Event,
    V1MaintenanceBarrier,
    V1ProviderCall,
    V1TransportKey,
)
from connectors.serving.gates import service_configuration_apply
from connectors.v1.barriers import V1MaintenanceClosed, v1_barrier_admit
from connectors.v1.events import v1_event_try_complete_one, v1_event_try_run_one
from connectors.v1.push import v1_push_record
from cutover import reasons
from cutover.halt import CertificateMismatch, CertificateMissing, HaltAborted, cutover_halt_v1
from cutover.models import CutoverEvidence
from cutover.preflight import cutover_preflight
from cutover.services import CutoverRefused
from cutover.status import cutover_status
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock, record_write_mirror
from tests.concurrency import wait_until_blocked_on
from tests.conftest import BILLING_KEY, ORG, hubspot_event, run_manage, service_document, subprocess_env
from tests.connectors.v1.support import post_v1
from tests.cutover.test_preflight import full_plan

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _barriers() -> dict[str, tuple[str, int]]:
    return {b.kind: (b.state, b.fence_token) for b in V1MaintenanceBarrier.objects.filter(org_id=ORG)}


def _run_v1_work() -> int:
    done = 0
    while v1_event_try_run_one(worker_id="v1-halt-test") or v1_event_try_complete_one():
        done += 1
    return done


def test_halt_closes_new_roots_freezes_every_gate_and_accepted_v1_work_still_finishes(certified, client,
                                                                                       billing_sandbox):
    """S003-RP-35: new root ingress, root outbound and configuration are refused retryably; accepted work runs."""
    report = cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert sorted(report.gates) == ["billing-main", "crm-webhooks"]
    assert _barriers() == {"configuration": ("closed", 1), "ingress": ("closed", 1), "root_outbound": ("closed", 1)}
    for gate in AccountServingGate.objects.filter(org_id=ORG):
        assert (gate.state, gate.reason_code) == ("halting_v1", reasons.CUTOVER_IN_PROGRESS)
        evidence = GateTransitionEvidence.objects.get(gate=gate, to_state="halting_v1").evidence
        row = CutoverEvidence.objects.get(pk=evidence["evidence_id"])
        assert row.kind == "maintenance_barrier" and row.payload["certificate_digest"] == report.certificate_digest

    transports = V1TransportKey.objects.count()
    refused = post_v1(client, [hubspot_event(3, 502, 1002)])
    assert refused.status_code == 503 and refused.json()["error"] == "v1_maintenance"
    assert refused.headers["Retry-After"] and V1TransportKey.objects.count() == transports
    with pytest.raises(V1MaintenanceClosed):
        service_configuration_apply(org=certified, document=service_document("http://127.0.0.1:8"))

    # Accepted work finishes under its own authority (continuation is not fenced).
    assert _run_v1_work() > 0
    assert set(V1Event.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"completed"}
    record = Record.objects.get(org_id=ORG, object_name="Contact")
    customer = httpx.post(billing_sandbox.base_url + "/v1/customers", data={"email": "old@example.test"},
                          headers={"Authorization": f"Bearer {BILLING_KEY}"}).json()
    with transaction.atomic():
        locked = record_lock(org=certified, object_name="Contact", record_key=record.record_key)
        record_write_mirror(org=certified, record=locked, field="billing_id", value=customer["id"])
    with pytest.raises(V1MaintenanceClosed):  # a new root outbound request: no pre-I/O row, nothing sent
        v1_push_record(org=certified, contract_key="billing.customer", record_key=record.record_key)
    assert not V1ProviderCall.objects.exists()

    again = cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert again.already and _barriers()["ingress"] == ("closed", 1)
    status = cutover_status(org=certified)
    assert status["phase"] == "halting_v1" and status["barriers"]["ingress"] == "closed"
    assert status["gates"] == {"halting_v1": 2} and "drain" in status["next_command"]
    assert isinstance(status["budgets"]["owner_barrier_closure"]["used_seconds"], int)
    assert status["budgets"]["drain"]["used_seconds"] is None


def test_a_transaction_crossing_the_barrier_close_commits_and_is_remeasured(certified):
    """S003-RP-35: the close waits for an admission already past the barrier; its row is in the remeasure."""
    sibling = V1Event.objects.filter(org_id=ORG).first()
    admitted, release, failures = threading.Event(), threading.Event(), []
    halt_connection: dict[str, int] = {}
    outcome: dict[str, object] = {}

    def in_flight_admission():
        try:
            with transaction.atomic(durable=True):
                v1_barrier_admit(org_id=ORG, kind="ingress")
                insert(V1Event, org_id=ORG, account_key=sibling.account_key, channel=sibling.channel,
                       route_key=sibling.route_key, transport=sibling.transport, ordinal=7,
                       source_event_key="crossing", payload={**sibling.payload, "eventId": 77, "occurredAt": 1077},
                       state="pending")
                admitted.set()
                assert release.wait(60)
        except BaseException as exc:  # reported to the test thread
            failures.append(exc)
            admitted.set()
        finally:
            connection.close()

    def halt():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT CONNECTION_ID()")
                halt_connection["id"] = cursor.fetchone()[0]
            outcome["result"] = cutover_halt_v1(org=OrgScope(ORG), attempt_key="attempt-1")
        except BaseException as exc:
            outcome["result"] = exc
        finally:
            connection.close()

    admission = threading.Thread(target=in_flight_admission)
    admission.start()
    assert admitted.wait(60) and not failures, failures
    halting = threading.Thread(target=halt)
    halting.start()
    while "id" not in halt_connection:
        assert halting.is_alive() or "result" in outcome, outcome
        threading.Event().wait(0.01)
    wait_until_blocked_on(halt_connection["id"], "connectors_v1maintenancebarrier")
    assert _barriers()["ingress"] == ("open", 0)  # the close is still waiting for the admission
    release.set()
    admission.join(60)
    halting.join(60)
    assert not failures, failures
    # The crossing event committed and counts: 3 open events project 6 s against the certified 4 s.
    assert isinstance(outcome["result"], HaltAborted), outcome
    remeasure = CutoverEvidence.objects.get(org_id=ORG, attempt_key="attempt-1", kind="halt_remeasure")
    assert remeasure.payload["measurements"]["accepted_backlog"]["open_events"] == 3
    assert V1Event.objects.filter(source_event_key="crossing").exists()


def test_a_remeasure_breach_restores_the_barriers_and_aborts_to_v1_serving_with_a_new_fence(certified, client):
    """S003-RP-38: work accepted after preflight breaches the drain budget; never continues on stale projections."""
    assert post_v1(client, [hubspot_event(3, 502, 1002, "email", "b@example.test")]).status_code == 202
    fences = dict(AccountServingGate.objects.filter(org_id=ORG).values_list("account_key", "fence_token"))
    with pytest.raises(HaltAborted) as aborted:
        cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert {(b["reason_code"], b["subject"]) for b in aborted.value.blockers} == \
        {(reasons.CUTOVER_BUDGET_EXCEEDED, "drain")}
    assert _barriers() == {"configuration": ("open", 2), "ingress": ("open", 2), "root_outbound": ("open", 2)}
    for gate in AccountServingGate.objects.filter(org_id=ORG):
        assert (gate.state, gate.reason_code) == ("v1_serving", "")
        assert gate.fence_token == fences[gate.account_key] + 2  # halted, then aborted: a new fence
    walk = list(GateTransitionEvidence.objects.filter(org_id=ORG, gate__account_key="crm-webhooks")
                .order_by("id").values_list("from_state", "to_state"))
    assert walk == [("v1_serving", "halting_v1"), ("halting_v1", "v1_serving")]
    assert CutoverEvidence.objects.filter(org_id=ORG, attempt_key="attempt-1", kind="halt_abort").count() == 1
    # The spent attempt cannot halt again; V1 admits roots again.
    with pytest.raises(CutoverRefused, match="aborted"):
        cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert post_v1(client, [hubspot_event(4, 503, 1003)]).status_code == 202


def test_halt_needs_the_exact_certificate_of_the_current_configuration(certified, billing_sandbox):
    with pytest.raises(CertificateMissing):
        cutover_halt_v1(org=certified, attempt_key="attempt-unknown")
    document = service_document(billing_sandbox.base_url)
    document["accounts"][1]["base_url"] = billing_sandbox.base_url + "/"
    service_configuration_apply(org=certified, document=document)
    with pytest.raises(CertificateMismatch, match="configuration generation changed"):
        cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert _barriers() == {"configuration": ("open", 0), "ingress": ("open", 0), "root_outbound": ("open", 0)}
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}


def test_halt_v1_command_exit_codes_as_a_new_operator_would(certified, client):
    env = subprocess_env()
    missing = run_manage(["cutover", "halt-v1", "--org", ORG], env)
    assert missing.returncode == 2 and "missing_argument" in missing.stderr
    unknown = run_manage(["cutover", "halt-v1", "--org", ORG, "--attempt", "nope"], env)
    assert unknown.returncode == 3 and "certificate_missing" in unknown.stderr
    done = run_manage(["cutover", "halt-v1", "--org", ORG, "--attempt", "attempt-1"], env)
    assert done.returncode == 0, done.stderr
    assert "halting_v1" in done.stdout and "ingress@1" in done.stdout


def test_a_crash_after_the_barriers_closed_resumes_under_the_same_attempt(certified):
    """A killed halt-v1 leaves the barriers closed and the gates serving; the rerun halts and remeasures."""
    import signal

    crashed = run_manage(["cutover", "halt-v1", "--org", ORG, "--attempt", "attempt-1"],
                         subprocess_env(NEXUS_FAILPOINTS="cutover.halt_v1.after_barriers"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert {state for state, _ in _barriers().values()} == {"closed"}
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}
    plan = full_plan()
    plan["budgets_seconds"]["drain"] = 4
    cutover_preflight(org=certified, attempt_key="attempt-2", plan=plan)
    with pytest.raises(CutoverRefused, match="closed by attempt attempt-1"):
        cutover_halt_v1(org=certified, attempt_key="attempt-2")
    report = cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert not report.already and report.barriers == {"configuration": 1, "ingress": 1, "root_outbound": 1}
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"halting_v1"}


def test_a_recorded_breach_is_final_even_if_the_backlog_drains_before_the_rerun(certified, client, monkeypatch):
    """A crash between the breach record and the abort resumes the abort; it never remeasures the breach away."""
    import cutover.halt as halt

    assert post_v1(client, [hubspot_event(3, 502, 1002, "email", "b@example.test")]).status_code == 202
    monkeypatch.setattr(halt, "_abort", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crashed")))
    with pytest.raises(RuntimeError, match="crashed"):
        cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"halting_v1"}
    monkeypatch.undo()
    assert _run_v1_work() > 0  # the backlog is gone now; the recorded breach still decides
    with pytest.raises(HaltAborted):
        cutover_halt_v1(org=certified, attempt_key="attempt-1")
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}
    assert {state for state, _ in _barriers().values()} == {"open"}
