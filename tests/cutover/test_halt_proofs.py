"""Maintenance admission across ``halt-v1`` .. ``certify``: barrier-crossing roots, the configuration barrier,
the frozen gate set and the revalidated ordering plan.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", "Durable source ordering" and
"Operational liveness and maintenance admission"; proofs S003-RP-14, S003-RP-35 and S003-RP-40.
Real MariaDB; each race holds a real transaction open at a named failpoint on its own connection
while the other side queues behind its row lock.
"""
from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from connectors.models import (
    AccountServingGate,
    ConnectorServiceConfigurationGeneration,
    ReceiptAdmissionKey,
    V1MaintenanceBarrier,
    V1TransportKey,
)
from connectors.serving.gates import service_configuration_apply
from connectors.v1.barriers import V1MaintenanceClosed
from cutover import reasons
from cutover.certify import cutover_certify
from cutover.drain import cutover_drain
from cutover.halt import CertificateMismatch, cutover_halt_v1
from cutover.models import (
    CutoverEvidence,
    CutoverReadinessCertificate,
    OrderingBaseline,
    V1ShutdownCertificate,
)
from cutover.preflight import cutover_preflight
from cutover.stop import cutover_stop
from cutover.v1_shutdown import ShutdownBlocked
from nexusflow.kernel import canonical_json
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope
from tests.concurrency import connection_id, wait_until_blocked_on
from tests.conftest import (
    HUBSPOT_CREDENTIAL_DOCUMENT,
    ORG,
    hubspot_event,
    service_document,
)
from tests.connectors.v1.support import install_v1, post_v1
from tests.cutover.test_preflight import full_plan

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])
ATTEMPT = "attempt-1"
BARRIER_TABLE = "connectors_v1maintenancebarrier"


@pytest.fixture
def roomy(client, billing_sandbox):
    """A V1 install with two accepted events (two partitions), certified with room for more work."""
    org = install_v1(billing_sandbox.base_url)
    assert post_v1(client, [hubspot_event(1, 501, 1001, "email", "a@example.test"),
                            hubspot_event(2, 502, 1002, "email", "b@example.test")]).status_code == 202
    cutover_preflight(org=org, attempt_key=ATTEMPT, plan=full_plan())
    return org


class _Side(threading.Thread):
    """Run ``fn`` on its own database connection; keep its result (or exception) and connection id."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error, self.connection_id = fn, None, None, None
        self.connected = threading.Event()

    def run(self):
        try:
            self.connection_id = connection_id()
            self.connected.set()
            self.result = self.fn()
        except BaseException as exc:  # reported to the test thread
            self.error = exc
        finally:
            self.connected.set()
            connections.close_all()


def _halt_behind_a_held_transaction(holds, marker) -> _Side:
    """Start ``halt-v1`` while a transaction is held at ``marker``; return once its close waits on that row."""
    halting = _Side(lambda: cutover_halt_v1(org=OrgScope(ORG), attempt_key=ATTEMPT))
    halting.start()
    assert halting.connected.wait(60) and halting.connection_id, halting.error
    wait_until_blocked_on(halting.connection_id, BARRIER_TABLE)
    return halting


def _barrier_states() -> dict[str, str]:
    return dict(V1MaintenanceBarrier.objects.filter(org_id=ORG).values_list("kind", "state"))


def _gate_states() -> set[str]:
    return set(AccountServingGate.objects.filter(org_id=ORG).values_list("state", flat=True))


def _drain_stop_certify(org: OrgScope):
    from tests.cutover.test_v1_shutdown import _run_v1_worker

    _run_v1_worker()
    cutover_drain(org=org, attempt_key=ATTEMPT)
    cutover_stop(org=org, attempt_key=ATTEMPT, wait_seconds=0)
    return cutover_certify(org=org, attempt_key=ATTEMPT)


# --- S003-RP-35 -------------------------------------------------------------------------------------------------
def test_a_v1_delivery_crossing_the_barrier_close_commits_and_is_in_the_post_stop_inventory(roomy, client, holds):
    """A real V1 admission held inside its transaction, past the ingress barrier, while halt-v1 closes it:
    the close waits, the delivery commits, is remeasured, drained by V1 and certified (tombstone, baseline)."""
    holds.arm("v1.ingress.before_commit")
    crossing = _Side(lambda: post_v1(client, [hubspot_event(3, 503, 1003, "email", "c@example.test")]))
    crossing.start()
    marker = holds.wait_held("v1.ingress.before_commit")
    halting = _halt_behind_a_held_transaction(holds, marker)
    assert _barrier_states()["ingress"] == "open" and _gate_states() == {"v1_serving"}
    holds.release(marker)
    crossing.join(60)
    halting.join(60)
    assert crossing.error is None and crossing.result.status_code == 202, crossing.error or crossing.result.content
    assert halting.error is None, halting.error
    assert _barrier_states() == {"configuration": "closed", "ingress": "closed", "root_outbound": "closed"}
    remeasure = CutoverEvidence.objects.get(org_id=ORG, attempt_key=ATTEMPT, kind="halt_remeasure")
    assert remeasure.payload["measurements"]["accepted_backlog"]["open_events"] == 3

    late = post_v1(client, [hubspot_event(4, 504, 1004, "email", "d@example.test")])  # a new root: refused
    assert late.status_code == 503 and late.json()["error"] == "v1_maintenance"

    report = _drain_stop_certify(roomy)
    crossed = V1TransportKey.objects.get(org_id=ORG, event_count=1)
    tombstone = ReceiptAdmissionKey.objects.get(org_id=ORG, transport_key=crossed.transport_key)
    assert tombstone.identity_digest == crossed.identity_digest and tombstone.v1_tombstone["predecessor"][
        "transport_id"] == int(crossed.pk)
    document = json.loads(bytes(V1ShutdownCertificate.objects.get(org_id=ORG).document))
    assert document["coverage"]["transport_keys"] == 2 and report.tombstones == 2
    positions = {json.dumps(b.partition): bytes(b.position) for b in OrderingBaseline.objects.filter(org_id=ORG)}
    # The crossing event's partition has its own baseline at the crossing event's typed position.
    assert len(positions) == 3
    assert positions[json.dumps(["503", "email"])] == canonical_json.dumps([1003, 3, "3:202/1:3"])
    assert V1TransportKey.objects.filter(org_id=ORG).count() == 2  # the refused root left nothing


# --- S003-RP-40 -------------------------------------------------------------------------------------------------
def _with_new_account(billing_url: str) -> dict:
    from connectors.serving.generations import credential_publish

    credential_publish(org=OrgScope(ORG), document=HUBSPOT_CREDENTIAL_DOCUMENT)
    return service_document(billing_url, hubspot_url=billing_url)


def test_account_creation_holding_the_configuration_barrier_makes_the_racing_halt_refuse(roomy, billing_sandbox,
                                                                                          holds):
    """Account creation first: the halt's close waits for it, then refuses the changed set and reopens."""
    document = _with_new_account(billing_sandbox.base_url)
    holds.arm("l2.configuration.before_commit")
    creating = _Side(lambda: service_configuration_apply(org=OrgScope(ORG), document=document))
    creating.start()
    marker = holds.wait_held("l2.configuration.before_commit")
    halting = _halt_behind_a_held_transaction(holds, marker)
    assert _barrier_states()["configuration"] == "open"
    holds.release(marker)
    creating.join(60)
    halting.join(60)
    assert creating.error is None, creating.error
    assert isinstance(halting.error, CertificateMismatch), halting.error
    assert sorted(AccountServingGate.objects.filter(org_id=ORG).values_list("account_key", flat=True)) == \
        ["billing-main", "crm-webhooks", "hubspot-crm"]
    assert _gate_states() == {"v1_serving"}  # nothing halted under a set that no longer holds
    assert set(_barrier_states().values()) == {"open"}
    assert not CutoverEvidence.objects.filter(org_id=ORG, kind__in=("maintenance_barrier", "halt_remeasure")).exists()


def test_account_creation_after_the_barrier_closed_is_refused_and_creates_nothing(roomy, billing_sandbox, holds):
    """Halt first: held after its barriers closed, a racing account creation is refused retryably."""
    document = _with_new_account(billing_sandbox.base_url)
    generations = ConnectorServiceConfigurationGeneration.objects.filter(org_id=ORG).count()
    holds.arm("cutover.halt_v1.after_barriers")
    halting = _Side(lambda: cutover_halt_v1(org=OrgScope(ORG), attempt_key=ATTEMPT))
    halting.start()
    marker = holds.wait_held("cutover.halt_v1.after_barriers")
    with pytest.raises(V1MaintenanceClosed):
        service_configuration_apply(org=OrgScope(ORG), document=document)
    holds.release(marker)
    halting.join(60)
    assert halting.error is None, halting.error
    assert halting.result.gates == ["billing-main", "crm-webhooks"]
    assert ConnectorServiceConfigurationGeneration.objects.filter(org_id=ORG).count() == generations
    assert not AccountServingGate.objects.filter(org_id=ORG, account_key="hubspot-crm").exists()
    assert _gate_states() == {"halting_v1"}


def _bypassing_generation() -> None:
    """A configuration generation written around the barrier (a defect elsewhere): one more account."""
    latest = ConnectorServiceConfigurationGeneration.objects.filter(org_id=ORG).order_by("-generation").first()
    extra = {**latest.document["accounts"][1], "account_key": "outside-the-set"}
    document = {**latest.document, "generation": latest.generation + 1,
                "accounts": [*latest.document["accounts"], extra]}
    insert(ConnectorServiceConfigurationGeneration, org_id=ORG, generation=latest.generation + 1, document=document,
           digest="e" * 64, profile_id=latest.profile_id)


def _bypassing_gate(state: str) -> None:
    insert(AccountServingGate, allow_any_state=True, org_id=ORG, account_key="outside-the-set", pack_key="billing",
           state=state, reason_code=reasons.CUTOVER_IN_PROGRESS)


def test_stop_rejects_a_current_account_outside_the_frozen_set(roomy):
    cutover_halt_v1(org=roomy, attempt_key=ATTEMPT)
    from tests.cutover.test_v1_shutdown import _run_v1_worker

    _run_v1_worker()
    cutover_drain(org=roomy, attempt_key=ATTEMPT)
    _bypassing_generation()
    with pytest.raises(CertificateMismatch, match="configuration generation changed"):
        cutover_stop(org=roomy, attempt_key=ATTEMPT, wait_seconds=0)
    assert _gate_states() == {"halting_v1"}
    assert not CutoverEvidence.objects.filter(org_id=ORG, kind="egress_isolation").exists()


@pytest.mark.parametrize("outside", ["gate", "v1_account"])
def test_certify_rejects_a_gate_or_account_outside_the_frozen_set(roomy, outside):
    cutover_halt_v1(org=roomy, attempt_key=ATTEMPT)
    from tests.cutover.test_v1_shutdown import _run_v1_worker

    _run_v1_worker()
    cutover_drain(org=roomy, attempt_key=ATTEMPT)
    cutover_stop(org=roomy, attempt_key=ATTEMPT, wait_seconds=0)
    if outside == "gate":
        _bypassing_gate("v1_stopped")
        match = "gate set"
    else:
        from connectors.v1.models import V1Account

        insert(V1Account, org_id=ORG, account_key="outside-the-set", pack_key="billing")
        match = "outside the certified gate set"
    with pytest.raises(CertificateMismatch, match=match):
        cutover_certify(org=roomy, attempt_key=ATTEMPT)
    assert not V1ShutdownCertificate.objects.exists() and not OrderingBaseline.objects.exists()
    assert not ReceiptAdmissionKey.objects.filter(org_id=ORG).exists()


# --- S003-RP-14 (final baseline capture) ---------------------------------------------------------------------------
def _stopped(org: OrgScope) -> None:
    from tests.cutover.test_v1_shutdown import _run_v1_worker

    cutover_halt_v1(org=org, attempt_key=ATTEMPT)
    _run_v1_worker()
    cutover_drain(org=org, attempt_key=ATTEMPT)
    cutover_stop(org=org, attempt_key=ATTEMPT, wait_seconds=0)


def _rewrite_epoch_ordering(change) -> None:
    """Rewrite the candidate epoch's frozen ordering contract of the webhook route in place (raw SQL)."""
    from connectors.models import ServingEpoch

    certificate = json.loads(bytes(CutoverReadinessCertificate.objects.get(org_id=ORG).document))
    epoch = ServingEpoch.objects.get(pk=certificate["epoch"]["id"])
    document = epoch.document
    account = next(a for a in document["accounts"] if a["account_key"] == "crm-webhooks")
    change(account["routes"]["contacts.webhook"])
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {ServingEpoch._meta.db_table} SET document = %s WHERE id = %s",
                       [json.dumps(document), epoch.pk])


@pytest.mark.parametrize("change", [
    lambda route: route["ordering"].update({"position": []}),
    lambda route: route.update({"ordering": {"contract": "order_independent"}}),
], ids=["lost-typed-position", "relabelled-order-independent"])
def test_final_baseline_capture_revalidates_the_preflight_plan(roomy, change):
    """The certified disposition no longer holds at capture: certify refuses; no baseline, no certificate."""
    _stopped(roomy)
    _rewrite_epoch_ordering(change)
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_certify(org=roomy, attempt_key=ATTEMPT)
    assert (reasons.ROUTE_MIGRATION_UNSUPPORTED, "crm-webhooks/contacts.webhook") in \
        {(b["reason_code"], b["subject"]) for b in blocked.value.blockers}
    assert _gate_states() == {"v1_stopped"}
    assert not V1ShutdownCertificate.objects.exists() and not OrderingBaseline.objects.exists()


def test_final_baseline_capture_never_substitutes_enqueue_order_for_a_source_position(roomy):
    """A drained V1 event without a typed position: its V1 row order is no high-water; certify refuses."""
    from connectors.models import V1Event

    _stopped(roomy)
    sibling = V1Event.objects.filter(org_id=ORG).order_by("id").last()
    insert(V1Event, allow_any_state=True, org_id=ORG, account_key=sibling.account_key, channel=sibling.channel, route_key=sibling.route_key,
           transport=sibling.transport, ordinal=5, source_event_key="enqueued-last", state="completed",
           payload={"objectId": 502, "propertyName": "email", "propertyValue": "z@example.test"})
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_certify(org=roomy, attempt_key=ATTEMPT)
    codes = {(b["reason_code"], b["subject"]) for b in blocked.value.blockers}
    assert (reasons.ROUTE_MIGRATION_UNSUPPORTED, "crm-webhooks/contacts.webhook") in codes
    assert (reasons.V1_BASELINE_MISSING, "crm-webhooks/contacts.webhook") in codes
    assert not OrderingBaseline.objects.exists()


# --- the certified, current and per-generation V1 releases ------------------------------------------------------
@pytest.mark.parametrize("where", ["current_tree", "generation"])
def test_certify_refuses_when_the_certified_current_and_generation_v1_releases_differ(roomy, monkeypatch, where):
    from connectors.models import V1ProcessGeneration

    _stopped(roomy)
    if where == "current_tree":
        monkeypatch.setattr("cutover.certify.v1_release", lambda: "d" * 64)
        subject = "v1_release.current_tree"
    else:
        generation = V1ProcessGeneration.objects.order_by("id").last()
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {V1ProcessGeneration._meta.db_table} SET `release` = %s WHERE id = %s",
                           ["d" * 64, generation.pk])
        subject = f"v1_process_generation.{generation.pk}"
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_certify(org=roomy, attempt_key=ATTEMPT)
    assert (reasons.V1_RELEASE_MISMATCH, subject) in {(b["reason_code"], b["subject"]) for b in blocked.value.blockers}
    assert _gate_states() == {"v1_stopped"} and not V1ShutdownCertificate.objects.exists()


# --- S003-RP-36 -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["drain", "baseline_capture", "recovery_point", "restore_rehearsal", "validation",
                                   "activation_readback", "full_restore"])
def test_preflight_rejects_each_measured_phase_over_its_declared_budget(roomy, phase):
    """Each phase alone, one second under its conservative projection, refuses the attempt before maintenance."""
    from cutover.preflight import ReadinessRefused

    plan = full_plan()
    plan["throughput"]["baseline_partitions_per_second"] = 1  # 2 partitions: 4 s with the margin
    probe = cutover_preflight(org=roomy, attempt_key="probe", plan=plan)
    projected = probe.projections[phase]["projected_seconds"]
    assert projected > 1, probe.projections
    plan["budgets_seconds"][phase] = projected - 1
    with pytest.raises(ReadinessRefused) as refused:
        cutover_preflight(org=roomy, attempt_key="attempt-over", plan=plan)
    assert {(b["reason_code"], b["subject"]) for b in refused.value.blockers} == \
        {(reasons.CUTOVER_BUDGET_EXCEEDED, phase)}
    assert not CutoverReadinessCertificate.objects.filter(attempt_key="attempt-over").exists()
    assert _gate_states() == {"v1_serving"} and set(_barrier_states().values()) == {"open"}


def _io_may_have_started():
    """A V1 continuation call whose pre-I/O marker committed (I/O may have started), with no answer."""
    from tests.cutover.test_v1_shutdown import _interrupted_call

    return _interrupted_call(sent=True)


def test_a_halt_over_its_budget_takes_the_fenced_abort_and_leaves_possible_io_unresolved(roomy, db_clock_advance):
    """Past the certified barrier-closure + drain budget (database clock moved, not slept) the drain reports the
    breach and ``abort-halt`` reopens the barriers with new fences; the call that may have reached the provider
    is neither finished nor relabeled by the time that passed."""
    from connectors.models import V1ProviderCall
    from cutover.halt import cutover_halt_abort, halt_budget

    cutover_halt_v1(org=roomy, attempt_key=ATTEMPT)
    call = _io_may_have_started()  # continuation outbound stays open behind the closed root barrier
    fences = dict(AccountServingGate.objects.filter(org_id=ORG).values_list("account_key", "fence_token"))
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_drain(org=roomy, attempt_key=ATTEMPT)
    assert reasons.CUTOVER_BUDGET_EXCEEDED not in {b["reason_code"] for b in blocked.value.blockers}
    assert halt_budget(org=roomy, attempt_key=ATTEMPT)["breached"] is False

    db_clock_advance(2 * 3600 + 60)  # owner_barrier_closure + drain budgets of the plan, and a minute
    assert halt_budget(org=roomy, attempt_key=ATTEMPT)["breached"] is True
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_drain(org=roomy, attempt_key=ATTEMPT)
    codes = {(b["reason_code"], b["subject"]) for b in blocked.value.blockers}
    assert (reasons.CUTOVER_BUDGET_EXCEEDED, "drain") in codes
    assert (reasons.V1_EFFECT_UNRESOLVED, f"v1_provider_call.{call.pk}") in codes
    assert not CutoverEvidence.objects.filter(org_id=ORG, kind="v1_drain_inventory").exists()

    report = cutover_halt_abort(org=roomy, attempt_key=ATTEMPT)
    assert report.budget["breached"] and sorted(report.gates) == ["billing-main", "crm-webhooks"]
    assert set(_barrier_states().values()) == {"open"}
    for gate in AccountServingGate.objects.filter(org_id=ORG):
        assert gate.state == "v1_serving" and gate.fence_token == fences[gate.account_key] + 1
    abort = CutoverEvidence.objects.get(org_id=ORG, attempt_key=ATTEMPT, kind="halt_abort")
    assert [b["reason_code"] for b in abort.payload["blockers"]] == [reasons.CUTOVER_BUDGET_EXCEEDED]
    after = V1ProviderCall.objects.get(pk=call.pk)
    assert (after.state, after.version, after.reason_code) == (call.state, call.version, call.reason_code) \
        and after.state == "sending"
    assert cutover_halt_abort(org=roomy, attempt_key=ATTEMPT).already


def test_after_isolation_a_breach_has_no_fenced_abort_and_elapsed_time_resolves_nothing(roomy, db_clock_advance):
    """Once V1 is isolated and terminated the fenced abort is closed; thirty days of database clock leave the
    interrupted call blocking certification: the service stays halted until it is reconciled."""
    from connectors.models import V1ProviderCall
    from cutover.halt import cutover_halt_abort
    from cutover.services import CutoverRefused
    from tests.cutover.test_v1_shutdown import _run_v1_worker

    cutover_halt_v1(org=roomy, attempt_key=ATTEMPT)
    _run_v1_worker()
    call = _io_may_have_started()
    cutover_stop(org=roomy, attempt_key=ATTEMPT, wait_seconds=0)
    db_clock_advance(30 * 86400)
    with pytest.raises(CutoverRefused, match="cold-abort"):
        cutover_halt_abort(org=roomy, attempt_key=ATTEMPT)
    with pytest.raises(ShutdownBlocked) as blocked:
        cutover_certify(org=roomy, attempt_key=ATTEMPT)
    assert (reasons.V1_EFFECT_UNRESOLVED, f"v1_provider_call.{call.pk}") in \
        {(b["reason_code"], b["subject"]) for b in blocked.value.blockers}
    assert _gate_states() == {"v1_stopped"} and set(_barrier_states().values()) == {"closed"}
    assert V1ProviderCall.objects.get(pk=call.pk).state == "sending"


def test_abort_halt_command_as_a_new_operator_would(roomy):
    from tests.conftest import run_manage, subprocess_env

    env = subprocess_env()
    missing = run_manage(["cutover", "abort-halt", "--org", ORG], env)
    assert missing.returncode == 2 and "missing_argument" in missing.stderr
    early = run_manage(["cutover", "abort-halt", "--org", ORG, "--attempt", ATTEMPT], env)
    assert early.returncode == 3 and "cutover_refused" in early.stderr  # nothing halted yet
    cutover_halt_v1(org=roomy, attempt_key=ATTEMPT)
    done = run_manage(["cutover", "abort-halt", "--org", ORG, "--attempt", ATTEMPT], env)
    assert done.returncode == 0, done.stderr
    assert "v1_serving" in done.stdout and _gate_states() == {"v1_serving"}
