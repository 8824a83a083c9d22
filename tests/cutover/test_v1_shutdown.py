"""``cutover drain``, ``stop``, ``reconcile``, ``certify`` (issue 21: the V1 shutdown after ``halt-v1``).

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", steps 2-5; proofs S003-RP-41 and
S003-RP-42. Real MariaDB; V1 work runs in real ``run_workers --role v1`` processes; the race between
reconciliation and certification uses two real transactions on their own connections.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from django.db import connection, transaction

from connectors.models import (
    AccountServingGate,
    GateTransitionEvidence,
    ReceiptAdmissionKey,
    V1EgressDenial,
    V1Event,
    V1ProcessGeneration,
    V1ProviderCall,
    V1TransportKey,
    WorkerProcess,
)
from connectors.v1 import egress, generations
from connectors.v1.egress import V1EgressDenied, v1_call_prepare, v1_call_send
from cutover import reasons
from cutover.certify import cutover_certify
from cutover.drain import cutover_drain
from cutover.halt import cutover_halt_v1
from cutover.models import CutoverEvidence, OrderingBaseline, V1ShutdownCertificate
from cutover.reconcile import ReconciliationInvalid, cutover_reconcile
from cutover.services import CutoverRefused
from cutover.status import cutover_status
from cutover.stop import cutover_stop
from cutover.v1_shutdown import ShutdownBlocked
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope
from tests.concurrency import wait_until_blocked_on
from tests.conftest import ORG, ROOT, hubspot_event, run_manage, subprocess_env
from tests.cutover.conftest import ATTEMPT
from tests.cutover.conftest import gate_states as _gate_states
from tests.cutover.conftest import run_v1_worker as _run_v1_worker

PROFILE = {"outcomes": {}}

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])
def _codes(exc: ShutdownBlocked) -> set[str]:
    return {b["reason_code"] for b in exc.blockers}


def _interrupted_call(*, sent: bool) -> V1ProviderCall:
    """A continuation V1 call left by a process that died before (``sent=False``) or after its pre-I/O marker."""
    call = v1_call_prepare(org_id=ORG, account_key="billing-main", call_site="v1.push.update", kind="push",
                           subject="rec-1", method="PATCH", url="http://127.0.0.1:9/v1/customers/cus_1", body=b"{}")
    if sent:
        egress._mark_sending(call)  # the marker committed; the process died before the answer
    return V1ProviderCall.objects.get(pk=call.pk)


@pytest.fixture
def interrupted(halted):
    """``(org, before, after)``: every gate ``v1_stopped`` with two V1 calls interrupted by the stop.

    ``before`` died at its pre-I/O row (``prepared``), ``after`` past its pre-I/O marker (``sending``); a V1
    call still in flight does not hold the stop back, it is frozen by the isolation and reconciled after.
    """
    _run_v1_worker()
    before, after = _interrupted_call(sent=False), _interrupted_call(sent=True)
    with pytest.raises(ShutdownBlocked):
        cutover_drain(org=halted, attempt_key=ATTEMPT)
    cutover_stop(org=halted, attempt_key=ATTEMPT, wait_seconds=0)
    assert _gate_states() == {"v1_stopped"}
    return halted, before, after


# --- drain -------------------------------------------------------------------------------------------------
def test_drain_blocks_while_accepted_v1_work_or_a_lease_remains_and_records_the_first_zero_inventory(
        halted, db_clock_advance):
    with pytest.raises(ShutdownBlocked) as open_work:
        cutover_drain(org=halted, attempt_key=ATTEMPT)
    assert _codes(open_work.value) == {reasons.V1_WORK_OPEN}
    assert CutoverEvidence.objects.filter(org_id=ORG, kind="shutdown_blocked").count() == 1

    # This process finishes the work under a SchedulerLease it still holds: the lease is live.
    from connectors.v1.events import v1_event_try_complete_one, v1_event_try_run_one
    while v1_event_try_run_one(worker_id="v1-drain-test") or v1_event_try_complete_one():
        pass
    assert set(V1Event.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"completed"}
    with pytest.raises(ShutdownBlocked) as leased:
        cutover_drain(org=halted, attempt_key=ATTEMPT)
    assert _codes(leased.value) == {reasons.V1_LEASE_LIVE}
    assert cutover_status(org=halted)["blockers"][-1]["reason_code"] == reasons.V1_LEASE_LIVE

    db_clock_advance(120)  # the lease expired with no work under it
    report = cutover_drain(org=halted, attempt_key=ATTEMPT)
    assert not report.already and report.inventory_digest
    assert cutover_drain(org=halted, attempt_key=ATTEMPT).already
    assert _gate_states() == {"halting_v1"}
    assert "cutover stop" in cutover_status(org=halted)["next_command"]


def test_drain_keeps_an_ambiguous_v1_call_blocking_until_it_is_reconciled(halted):
    _run_v1_worker()
    call = _interrupted_call(sent=True)
    with transaction.atomic():  # the call's answer was unclassifiable: parked ambiguous
        from connectors.v1.store import V1ProviderCallStore
        V1ProviderCallStore.transition(org_id=ORG, pk=call.pk, src="sending", dst="ambiguous", version=call.version,
                                       set_fields={"reason_code": "response_ambiguous"})
    for phase in (cutover_drain, cutover_stop):
        with pytest.raises(ShutdownBlocked) as blocked:
            phase(org=halted, attempt_key=ATTEMPT)
        assert _codes(blocked.value) == {reasons.V1_EFFECT_UNRESOLVED}
    report = cutover_reconcile(org=halted, attempt_key=ATTEMPT, answers=[
        {"call_id": int(call.pk), "outcome": "remote_finalized", "remote_id": "cus_1",
         "evidence": "provider lookup: customer cus_1 carries the request"}])
    assert report.reconciled[0]["to_state"] == "confirmed"
    assert not cutover_drain(org=halted, attempt_key=ATTEMPT).already


# --- stop ----------------------------------------------------------------------------------------------------
def test_stop_denies_old_generation_egress_terminates_a_live_v1_process_and_stops_every_gate(halted, monkeypatch):
    _run_v1_worker()
    prepared = _interrupted_call(sent=False)  # a continuation call prepared before the stop
    live = subprocess.Popen([sys.executable, "manage.py", "run_workers", "--role", "v1", "--idle-sleep", "0.2"],
                            cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    reaper = threading.Thread(target=live.wait)
    reaper.start()
    try:
        while V1ProcessGeneration.objects.count() < 2:
            assert live.poll() is None, live.stderr.read()
            threading.Event().wait(0.05)
        report = cutover_stop(org=halted, attempt_key=ATTEMPT, wait_seconds=60)
    finally:
        if live.poll() is None:
            os.kill(live.pid, signal.SIGKILL)
        reaper.join(60)
    assert live.returncode is not None
    assert _gate_states() == {"v1_stopped"} and len(report.generations) == 2
    assert WorkerProcess.objects.filter(terminated_at__isnull=True,
                                        worker_id__in=V1ProcessGeneration.objects.values("worker_id")).count() == 0
    denial = V1EgressDenial.objects.get(org_id=ORG)
    assert denial.through_generation == max(V1ProcessGeneration.objects.values_list("id", flat=True))
    for gate in AccountServingGate.objects.filter(org_id=ORG):
        evidence = GateTransitionEvidence.objects.get(gate=gate, to_state="v1_stopped").evidence
        assert evidence["egress_isolation"]["digest"] == report.isolation_digest
        assert evidence["process_termination"]["digest"] == report.termination_digest
    termination = CutoverEvidence.objects.get(org_id=ORG, attempt_key=ATTEMPT, kind="process_termination")
    assert [c["id"] for c in termination.payload["interrupted_calls"]] == [int(prepared.pk)]

    # An old-generation process (or one that started none) can no longer reach the provider.
    sent = []
    client = httpx.Client(transport=httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200)))
    monkeypatch.setitem(generations._CURRENT, "id", int(V1ProcessGeneration.objects.order_by("id").first().pk))
    with pytest.raises(V1EgressDenied):
        v1_call_send(prepared, headers={}, profile=PROFILE, client=client)
    prepared.refresh_from_db()
    assert prepared.state == "abandoned" and prepared.io_may_have_started_at is None and sent == []
    monkeypatch.delitem(generations._CURRENT, "id")  # a process that started no generation (v1_push)
    with pytest.raises(V1EgressDenied):
        _interrupted_call(sent=False)
    assert V1ProviderCall.objects.count() == 1
    assert cutover_stop(org=halted, attempt_key=ATTEMPT).already


def test_stop_reports_a_v1_generation_it_cannot_prove_gone(halted):
    _run_v1_worker()
    cutover_drain(org=halted, attempt_key=ATTEMPT)
    insert(V1ProcessGeneration, worker_id="v1:elsewhere:1:abc", host="another-host", pid=1, release="0" * 64)
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_stop(org=halted, attempt_key=ATTEMPT, wait_seconds=0)
    assert _codes(blocked.value) == {reasons.V1_GENERATION_LIVE}
    assert _gate_states() == {"halting_v1"} and V1EgressDenial.objects.filter(org_id=ORG).exists()


def test_a_stop_killed_after_isolation_resumes_under_the_same_attempt(halted):
    """The denial survives the crash (the service stays stopped for V1 egress); the rerun finishes the stop."""
    _run_v1_worker()
    crashed = run_manage(["cutover", "stop", "--org", ORG, "--attempt", ATTEMPT, "--wait-seconds", "0"],
                         subprocess_env(NEXUS_FAILPOINTS="cutover.stop.after_isolation"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert _gate_states() == {"halting_v1"}
    denial = V1EgressDenial.objects.get(org_id=ORG, attempt_key=ATTEMPT)
    assert CutoverEvidence.objects.filter(org_id=ORG, kind="egress_isolation").count() == 1
    report = cutover_stop(org=halted, attempt_key=ATTEMPT, wait_seconds=0)
    assert report.denial_id == int(denial.pk) and _gate_states() == {"v1_stopped"}
    assert V1EgressDenial.objects.filter(org_id=ORG).count() == 1


# --- certify: S003-RP-41 ------------------------------------------------------------------------------------
def _pending_event():
    sibling = V1Event.objects.filter(org_id=ORG).first()
    insert(V1Event, org_id=ORG, account_key=sibling.account_key, channel=sibling.channel,
           route_key=sibling.route_key, transport=sibling.transport, ordinal=9, source_event_key="late",
           payload={**sibling.payload, "eventId": 99, "occurredAt": 1099}, state="pending")


def _live_lease():
    """A V1 SchedulerLease held by a holder that is not proven gone, not expired."""
    import datetime as dt

    from connectors.v1.store import V1SchedulerLeaseStore
    from nexusflow.kernel.clock import db_now

    with transaction.atomic():
        lease = V1SchedulerLeaseStore.lock_by_name(ORG, "v1.events")
        V1SchedulerLeaseStore.touch(org_id=ORG, pk=lease.pk, state="held", version=lease.version,
                                    set_fields={"holder": "v1:unproven", "expires_at": db_now() + dt.timedelta(hours=1)})


def _live_generation():
    insert(V1ProcessGeneration, worker_id="v1:late:1:abc", host="another-host", pid=1, release="0" * 64)


def _manifest_gap(monkeypatch):
    from connectors.v1 import egress_manifest
    real = egress_manifest.generate
    monkeypatch.setattr(egress_manifest, "generate",
                        lambda: (lambda m, p: ({**m, "effect_rows": []}, p))(*real()))
    from connectors.v1.store import V1ProviderCallStore

    with transaction.atomic():  # a settled call of a call site the current-tree manifest no longer covers
        call = V1ProviderCallStore.create(org_id=ORG, account_key="billing-main", call_site="v1.push.update",
                                          kind="push", subject="rec", method="PATCH", url="http://x.test/",
                                          request_body=b"", request_digest="0" * 64, state="prepared")
        V1ProviderCallStore.transition(org_id=ORG, pk=call.pk, src="prepared", dst="abandoned", version=call.version)


def _egress_capable_generation():
    """A V1 generation started after the egress denial (terminated, but never denied egress)."""
    from connectors.store import WorkerProcessStore
    from nexusflow.kernel.clock import db_now

    insert(V1ProcessGeneration, worker_id="v1:after-stop:1:abc", host="another-host", pid=1, release="0" * 64)
    insert(WorkerProcess, worker_id="v1:after-stop:1:abc", role="v1", host="another-host", pid=1,
           process_start_ticks=1)
    WorkerProcessStore.record_termination(worker_id="v1:after-stop:1:abc", proof={"proof": "pid_absent"},
                                          at=db_now())


def _identity_conflict():
    """A ReceiptAdmissionKey that holds a V1 transport key with another payload digest."""
    from nexusflow.kernel.digests import PROFILE_V2

    key = V1TransportKey.objects.get(org_id=ORG)
    insert(ReceiptAdmissionKey, org_id=ORG, account_key=key.account_key, channel=key.channel,
           transport_key=key.transport_key, identity_digest="f" * 64, profile_id=PROFILE_V2,
           v1_tombstone={"predecessor": {"protocol": "v1"}, "route_key": key.route_key})


def _unpositioned_event():
    """A V1 event of the order-dependent route without a typed source position: no high-water exists."""
    sibling = V1Event.objects.filter(org_id=ORG).first()
    insert(V1Event, org_id=ORG, account_key=sibling.account_key, channel=sibling.channel,
           route_key=sibling.route_key, transport=sibling.transport, ordinal=8, source_event_key="no-position",
           payload=None, state="pending")


@pytest.mark.parametrize("violation,code", [
    ("nonterminal_event", reasons.V1_WORK_OPEN),
    ("live_lease", reasons.V1_LEASE_LIVE),
    ("live_generation", reasons.V1_GENERATION_LIVE),
    ("egress_capable_generation", reasons.V1_EGRESS_NOT_ISOLATED),
    ("incomplete_manifest", reasons.V1_EGRESS_MANIFEST_INCOMPLETE),
    ("identity_conflict", reasons.V1_IDENTITY_CONFLICT),
    ("missing_baseline", reasons.V1_BASELINE_MISSING),
])
def test_shutdown_cannot_certify_with_open_work_a_live_lease_a_live_generation_or_an_incomplete_manifest(
        stopped, monkeypatch, violation, code):
    """S003-RP-41: each blocker alone rejects ``v1_stopped -> v1_drained``; nothing is exported."""
    {"nonterminal_event": _pending_event, "live_lease": _live_lease, "live_generation": _live_generation,
     "egress_capable_generation": _egress_capable_generation, "identity_conflict": _identity_conflict,
     "missing_baseline": _unpositioned_event,
     "incomplete_manifest": lambda: _manifest_gap(monkeypatch)}[violation]()
    tombstones = ReceiptAdmissionKey.objects.filter(org_id=ORG).count()
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_certify(org=stopped, attempt_key=ATTEMPT)
    assert code in _codes(blocked.value)
    if violation == "incomplete_manifest":
        assert "call_site.v1.push.update" in {b["subject"] for b in blocked.value.blockers}
    assert _gate_states() == {"v1_stopped"}
    assert not V1ShutdownCertificate.objects.exists() and not OrderingBaseline.objects.exists()
    assert ReceiptAdmissionKey.objects.filter(org_id=ORG).count() == tombstones


def test_a_v1_call_interrupted_before_or_after_io_blocks_certification_until_exactly_reconciled(interrupted):
    """S003-RP-41: interrupted at the pre-I/O row and after the marker; reconciliation never dispatches."""
    stopped, before, after = interrupted
    status = cutover_status(org=stopped)
    assert status["phase"] == "v1_stopped" and "cutover reconcile" in status["next_command"]
    assert {b["subject"] for b in status["blockers"] if b["reason_code"] == reasons.V1_EFFECT_UNRESOLVED} \
        == {f"v1_provider_call.{before.pk}", f"v1_provider_call.{after.pk}"}
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_certify(org=stopped, attempt_key=ATTEMPT)
    assert {b["subject"] for b in blocked.value.blockers if b["reason_code"] == reasons.V1_EFFECT_UNRESOLVED} \
        == {f"v1_provider_call.{before.pk}", f"v1_provider_call.{after.pk}"}
    with pytest.raises(ReconciliationInvalid, match="cannot be remote_finalized"):
        cutover_reconcile(org=stopped, attempt_key=ATTEMPT, answers=[
            {"call_id": int(before.pk), "outcome": "remote_finalized", "evidence": "lookup"}])
    cutover_reconcile(org=stopped, attempt_key=ATTEMPT, answers=[
        {"call_id": int(before.pk), "outcome": "no_effect", "evidence": "no marker: nothing left V1"}])
    with pytest.raises(ShutdownBlocked) as still:
        cutover_certify(org=stopped, attempt_key=ATTEMPT)
    assert {b["subject"] for b in still.value.blockers} == {f"v1_provider_call.{after.pk}"}
    cutover_reconcile(org=stopped, attempt_key=ATTEMPT, answers=[
        {"call_id": int(after.pk), "outcome": "no_effect", "evidence": "provider lookup: no change at 21:00"}])
    assert cutover_reconcile(org=stopped, attempt_key=ATTEMPT, answers=[
        {"call_id": int(after.pk), "outcome": "no_effect", "evidence": "provider lookup: no change at 21:00"}]) \
        .already == [int(after.pk)]
    assert dict(V1ProviderCall.objects.values_list("id", "state")) == {before.pk: "abandoned", after.pk: "refused"}

    report = cutover_certify(org=stopped, attempt_key=ATTEMPT)
    assert _gate_states() == {"v1_drained"}
    document = json.loads(bytes(V1ShutdownCertificate.objects.get(pk=report.certificate_id).document))
    assert len(document["reconciliations"]) == 2 and document["inventory"]["unresolved_calls"] == []
    assert report.tombstones == V1TransportKey.objects.filter(org_id=ORG).count() == document["coverage"][
        "transport_keys"]
    key = V1TransportKey.objects.get(org_id=ORG)
    tombstone = ReceiptAdmissionKey.objects.get(org_id=ORG, transport_key=key.transport_key)
    assert tombstone.identity_digest == key.identity_digest and tombstone.receipt_id is None
    # The drained V1 high-water of each (objectId, propertyName) partition: [occurredAt, eventId, tie-breaker].
    baselines = {tuple(b.partition): (b.origin, json.loads(bytes(b.position)))
                 for b in OrderingBaseline.objects.filter(org_id=ORG)}
    assert baselines == {("501",): ("v1_high_water", [1000, 1, "3:101/1:1"]),
                         ("501", "email"): ("v1_high_water", [1001, 2, "3:202/1:2"])}
    assert report.baselines == 2
    for gate in AccountServingGate.objects.filter(org_id=ORG):
        evidence = GateTransitionEvidence.objects.get(gate=gate, to_state="v1_drained").evidence
        assert evidence["digest"] == report.digest
    assert cutover_certify(org=stopped, attempt_key=ATTEMPT).already
    status = cutover_status(org=stopped)
    assert status["shutdown_certificate"]["digest"] == report.digest and "restore point" in status["next_command"]
    with pytest.raises(CutoverRefused, match="v1_drained"):
        cutover_reconcile(org=stopped, attempt_key=ATTEMPT, answers=[
            {"call_id": int(before.pk), "outcome": "no_effect", "evidence": "again, other words"}])


def test_a_real_v1_push_killed_past_its_pre_io_marker_blocks_certification_until_reconciled(billing_sandbox, client):
    """S003-RP-41: a V1 process killed after committing ``sending``; the answer comes from the provider's records."""
    from cutover.preflight import cutover_preflight
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock, record_write_mirror
    from tests.conftest import BILLING_KEY, hubspot_event
    from tests.connectors.v1.support import install_v1, post_v1
    from tests.cutover.test_preflight import full_plan

    org = install_v1(billing_sandbox.base_url)
    assert post_v1(client, [hubspot_event(1, 501, 1000, "email", "a@example.test")]).status_code == 202
    _run_v1_worker()
    record = Record.objects.get(org_id=ORG, object_name="Contact")
    customer = httpx.post(billing_sandbox.base_url + "/v1/customers", data={"email": "old@example.test"},
                          headers={"Authorization": f"Bearer {BILLING_KEY}"}).json()
    with transaction.atomic():
        locked = record_lock(org=org, object_name="Contact", record_key=record.record_key)
        record_write_mirror(org=org, record=locked, field="billing_id", value=customer["id"])
    killed = run_manage(["v1_push", "--org", ORG, "--contract", "billing.customer", "--record", record.record_key],
                        subprocess_env(NEXUS_FAILPOINTS="v1.call.after_sending"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    call = V1ProviderCall.objects.get(org_id=ORG)
    assert call.state == "sending" and call.io_may_have_started_at is not None
    requests = billing_sandbox.state()["requests"]

    cutover_preflight(org=org, attempt_key=ATTEMPT, plan=full_plan())
    cutover_halt_v1(org=org, attempt_key=ATTEMPT)
    with pytest.raises(ShutdownBlocked) as draining:
        cutover_drain(org=org, attempt_key=ATTEMPT)
    assert _codes(draining.value) == {reasons.V1_EFFECT_UNRESOLVED}
    assert "cutover stop" in cutover_status(org=org)["next_command"]  # the call's process is gone: stop, reconcile
    cutover_stop(org=org, attempt_key=ATTEMPT, wait_seconds=0)
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_certify(org=org, attempt_key=ATTEMPT)
    assert {b["subject"] for b in blocked.value.blockers} == {f"v1_provider_call.{call.pk}"}
    # The operator reads the provider: the customer never received the update.
    [remote] = [c for c in billing_sandbox.state()["customers"] if c["id"] == customer["id"]]
    assert remote["update_requests"] == 0
    cutover_reconcile(org=org, attempt_key=ATTEMPT, answers=[
        {"call_id": int(call.pk), "outcome": "no_effect", "evidence": f"{customer['id']}: 0 update requests"}])
    cutover_certify(org=org, attempt_key=ATTEMPT)
    assert _gate_states() == {"v1_drained"}
    assert billing_sandbox.state()["requests"] == requests  # nothing was dispatched by the cutover


# --- S003-RP-42: reconciliation and certification serialize on the v1_stopped gate rows ---------------------
def _connection_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        return cursor.fetchone()[0]


def test_certification_waits_for_an_open_reconciliation_and_observes_its_terminalization(interrupted, monkeypatch):
    """S003-RP-42: certify blocks on the gate rows the reconciliation holds, then certifies what it committed."""
    import cutover.reconcile as reconcile

    stopped, before, call = interrupted
    cutover_reconcile(org=stopped, attempt_key=ATTEMPT, answers=[
        {"call_id": int(before.pk), "outcome": "no_effect", "evidence": "no marker: nothing left V1"}])
    written, release = threading.Event(), threading.Event()
    real_evidence = reconcile._evidence

    def evidence_then_hold(*args, **kwargs):
        proof = real_evidence(*args, **kwargs)
        written.set()
        assert release.wait(60)
        return proof

    monkeypatch.setattr(reconcile, "_evidence", evidence_then_hold)
    outcome: dict[str, object] = {}

    def run(name, fn):
        try:
            if name == "certify":
                outcome["certify_connection"] = _connection_id()
            outcome[name] = fn()
        except BaseException as exc:  # reported to the test thread
            outcome[name] = exc
            written.set()
        finally:
            connection.close()

    reconciler = threading.Thread(target=run, args=("reconcile", lambda: cutover_reconcile(
        org=OrgScope(ORG), attempt_key=ATTEMPT,
        answers=[{"call_id": int(call.pk), "outcome": "remote_finalized", "evidence": "lookup ok"}])))
    reconciler.start()
    assert written.wait(60) and "reconcile" not in outcome, outcome
    certifier = threading.Thread(target=run, args=("certify",
                                                   lambda: cutover_certify(org=OrgScope(ORG), attempt_key=ATTEMPT)))
    certifier.start()
    while "certify_connection" not in outcome:
        assert certifier.is_alive() or "certify" in outcome, outcome
        threading.Event().wait(0.01)
    wait_until_blocked_on(outcome["certify_connection"], "connectors_accountservinggate")
    assert "certify" not in outcome
    release.set()
    reconciler.join(60)
    certifier.join(60)
    assert not isinstance(outcome["reconcile"], BaseException), outcome
    assert not isinstance(outcome["certify"], BaseException), outcome
    certificate = V1ShutdownCertificate.objects.get(org_id=ORG)
    document = json.loads(bytes(certificate.document))
    proof = CutoverEvidence.objects.get(org_id=ORG, kind="v1_reconciliation", account_key=f"call:{call.pk}")
    assert [proof.account_key, proof.digest] in document["reconciliations"]
    assert _gate_states() == {"v1_drained"}
    assert V1ProviderCall.objects.get(pk=call.pk).state == "confirmed"


def test_no_reconciliation_write_commits_after_v1_drained(interrupted, monkeypatch):
    """S003-RP-42: a reconciliation queued behind the certifying transaction finds v1_drained and writes nothing."""
    import cutover.certify as certify

    stopped, before, call = interrupted
    cutover_reconcile(org=stopped, attempt_key=ATTEMPT, answers=[
        {"call_id": int(before.pk), "outcome": "no_effect", "evidence": "no marker: nothing left V1"},
        {"call_id": int(call.pk), "outcome": "no_effect", "evidence": "provider lookup: absent"}])
    inventoried, release = threading.Event(), threading.Event()
    real_inventory = certify.v1_inventory

    def inventory_then_hold(org):
        found = real_inventory(org)
        inventoried.set()
        assert release.wait(60)
        return found

    monkeypatch.setattr(certify, "v1_inventory", inventory_then_hold)
    outcome: dict[str, object] = {}

    def run(name, fn):
        try:
            if name == "reconcile":
                outcome["reconcile_connection"] = _connection_id()
            outcome[name] = fn()
        except BaseException as exc:
            outcome[name] = exc
            inventoried.set()
        finally:
            connection.close()

    certifier = threading.Thread(target=run, args=("certify",
                                                   lambda: cutover_certify(org=OrgScope(ORG), attempt_key=ATTEMPT)))
    certifier.start()
    assert inventoried.wait(60) and "certify" not in outcome, outcome
    reconciler = threading.Thread(target=run, args=("reconcile", lambda: cutover_reconcile(
        org=OrgScope(ORG), attempt_key=ATTEMPT,
        answers=[{"call_id": int(call.pk), "outcome": "remote_finalized", "evidence": "a later lookup"}])))
    reconciler.start()
    while "reconcile_connection" not in outcome:
        assert reconciler.is_alive() or "reconcile" in outcome, outcome
        threading.Event().wait(0.01)
    wait_until_blocked_on(outcome["reconcile_connection"], "connectors_accountservinggate")
    release.set()
    certifier.join(60)
    reconciler.join(60)
    assert not isinstance(outcome["certify"], BaseException), outcome
    assert isinstance(outcome["reconcile"], CutoverRefused) and "v1_drained" in str(outcome["reconcile"])
    assert CutoverEvidence.objects.filter(org_id=ORG, kind="v1_reconciliation").count() == 2
    assert V1ProviderCall.objects.get(pk=call.pk).state == "refused"
    assert _gate_states() == {"v1_drained"}


# --- the operator's commands ---------------------------------------------------------------------------------
def test_the_shutdown_commands_walk_to_v1_drained_with_exit_codes(halted, tmp_path):
    env = subprocess_env()
    blocked = run_manage(["cutover", "drain", "--org", ORG, "--attempt", ATTEMPT], env)
    assert blocked.returncode == 3 and "v1_work_open" in blocked.stderr
    missing = run_manage(["cutover", "certify", "--org", ORG], env)
    assert missing.returncode == 2 and "missing_argument" in missing.stderr
    _run_v1_worker()
    assert run_manage(["cutover", "drain", "--org", ORG, "--attempt", ATTEMPT], env).returncode == 0
    early = run_manage(["cutover", "certify", "--org", ORG, "--attempt", ATTEMPT], env)
    assert early.returncode == 3 and "v1_stopped" in early.stderr
    stopped = run_manage(["cutover", "stop", "--org", ORG, "--attempt", ATTEMPT, "--json"], env)
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["gates"] == ["billing-main", "crm-webhooks"]
    status = run_manage(["cutover", "status", "--org", ORG, "--json"], env)
    assert "cutover certify" in json.loads(status.stdout)["next_command"]
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps([{"call_id": 999999, "outcome": "no_effect", "evidence": "x"}]))
    unknown = run_manage(["cutover", "reconcile", "--org", ORG, "--attempt", ATTEMPT, "--answers", str(answers)], env)
    assert unknown.returncode == 2 and "reconciliation_invalid" in unknown.stderr
    done = run_manage(["cutover", "certify", "--org", ORG, "--attempt", ATTEMPT], env)
    assert done.returncode == 0, done.stderr
    assert "v1_drained" in done.stdout
    status = run_manage(["cutover", "status", "--org", ORG], env)
    assert "phase v1_drained" in status.stdout


@pytest.mark.django_db(databases=[])
def test_the_high_water_compares_typed_positions_and_tie_breakers_by_value_not_by_text():
    from cutover.certify import _order_key

    assert _order_key([5, 10]) > _order_key([5, 9]) and _order_key([10, 1]) > _order_key([9, 99])
    assert _order_key([5, "b"]) > _order_key([5, "a"]) > _order_key([5, 10 ** 6])


@pytest.mark.django_db(databases=[])
def test_a_baseline_partition_and_position_are_the_ones_v2_admission_computes_for_the_same_event():
    """The V1 high-water must land on the lane V2 admits the same partition into (canonical locators, not the
    payload's JSON types) and compare like V2's SourcePosition (closed by the SourceEventKey)."""
    from connectors.contracts.ordering import encode_position
    from connectors.inbound.admission import classify_items
    from cutover.certify import _position
    from packs.hubspot import webhook_route

    route = webhook_route()
    change = hubspot_event(3, 90345, 7000, "lifecyclestage", "customer")
    partition, position = _position(change, route)
    [item] = classify_items(route, [change])
    assert partition == item.partition == ["90345", "lifecyclestage"]
    assert encode_position(position[:-1], position[-1]) == item.position
    creation = hubspot_event(4, 90345, 6000)
    assert _position(creation, route)[0] == ["90345"]  # the kind's own partition, as V2 admits it
    assert _position({**change, "occurredAt": "7000"}, route) == (None, None)
    assert _position({**change, "eventId": True}, route) == (None, None)
