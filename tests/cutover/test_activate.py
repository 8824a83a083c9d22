"""``cutover validate`` and ``cutover activate`` (issue 21: the V2 candidate and its first activation).

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", steps 7 and 8, and "Generation and
replay" (ServingPublicationBarrierSet); proofs S003-RP-44 (the ``v2_validating`` half) and
S003-RP-46..49. Real MariaDB; crashes kill a real ``manage.py cutover activate`` process at a named
failpoint; races run real transactions on their own connections, held at named failpoints.

The V1 restore point these tests start from is captured with ``mariadb-dump`` and recorded without the
isolated-server rehearsal (test_restore_point.py proves the rehearsal; it starts a server per test).
"""
from __future__ import annotations

import signal
import threading

import pytest
from django.db import connections, transaction

from connectors.models import (
    AccountServingGate,
    CredentialGeneration,
    CredentialGenerationDispatchGate,
    DispatchPermit,
    Event,
    Execution,
    ExecutionAttempt,
    OrderingLane,
    Receipt,
    ReceiptAdmissionKey,
    RemoteEffect,
    ServingEpoch,
    ServingPublicationBarrierSet,
    V1Event,
    V1MaintenanceBarrier,
    V1ProviderCall,
)
from connectors.serving.credential_gates import credential_revoke
from connectors.serving.gates import NotServing, service_configuration_apply, serving_lock
from connectors.serving.publication import (
    PublicationBarrierHeld,
    barrier_acquire,
    barrier_hold,
    barrier_release,
    owner_receipts,
)
from cutover import activate as activation
from cutover.activate import BOUNDARIES, cutover_activate
from cutover.decision import DecisionLost, begin_activation, begin_restore, decision_of
from cutover.models import CutoverEvidence, OrderingBaseline
from cutover.services import CutoverRefused
from cutover.status import cutover_status
from cutover.validate import cutover_validate
from nexusflow.kernel.errors import FenceRejected
from runtime_outbox.models import ApplicationResult, OutboundCommand, OutboxMessage
from tests.concurrency import race_behind_hold
from tests.conftest import ORG, drain, hubspot_event, post_signed, run_manage, service_document, subprocess_env
from tests.connectors.v1.support import post_v1
from tests.cutover.conftest import ATTEMPT

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])
PRODUCTION = (Receipt, ReceiptAdmissionKey, Event, Execution, ExecutionAttempt, RemoteEffect, DispatchPermit,
              OutboundCommand, OutboxMessage, ApplicationResult, V1Event, V1ProviderCall)


def _gates() -> list[AccountServingGate]:
    return list(AccountServingGate.objects.filter(org_id=ORG).order_by("account_key"))


def _counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in PRODUCTION}


def _candidate() -> ServingEpoch:
    return ServingEpoch.objects.get(pk=decision_of(ORG, ATTEMPT).epoch_id)


# --- validate: S003-RP-44 (the v2_validating half) ---------------------------------------------------------
def test_validate_is_refused_before_the_restore_point_and_moves_nothing(drained):
    with pytest.raises(CutoverRefused, match="V1RestorePoint"):
        cutover_validate(org=drained, attempt_key=ATTEMPT)
    assert {g.state for g in _gates()} == {"v1_drained"}
    assert decision_of(ORG, ATTEMPT) is None and not OrderingLane.objects.exists()


def test_validate_verifies_the_candidate_starts_lanes_from_the_baselines_and_serves_nothing(restorable, client):
    """S003-RP-44: while every gate is ``v2_validating`` no admission, descendant, claim, Runtime submission,
    outbound command, Permit, source acknowledgement or provider call happens, V1 or V2."""
    report = cutover_validate(org=restorable, attempt_key=ATTEMPT)
    epoch = ServingEpoch.objects.get(pk=report.epoch_id)
    assert epoch.state == "verified" and report.decision == "rollback_open" and not report.already
    gates = _gates()
    assert {g.state for g in gates} == {"v2_validating"} and {g.reason_code for g in gates} == {"cutover_in_progress"}
    assert all(g.epoch_id != epoch.pk for g in gates)  # no gate points at a verified-only epoch
    baselines = list(OrderingBaseline.objects.filter(org_id=ORG, attempt_key=ATTEMPT))
    lanes = list(OrderingLane.objects.filter(org_id=ORG, epoch=epoch))
    assert baselines and len(lanes) == len(baselines) == report.lanes
    assert {(lane.route_key, lane.baseline_origin) for lane in lanes} == {(b.route_key, b.origin) for b in baselines}
    assert all(lane.high_water_position is not None for lane in lanes if lane.baseline_origin == "v1_high_water")
    decision = decision_of(ORG, ATTEMPT)
    assert decision.state == "rollback_open" and int(decision.epoch_id) == int(epoch.pk)
    assert cutover_validate(org=restorable, attempt_key=ATTEMPT).already

    before = _counts()
    v2 = post_signed(client, [hubspot_event(10, 777, 5000)])
    v1 = post_v1(client, [hubspot_event(11, 777, 5001)])
    assert v2.status_code >= 400 and v1.status_code >= 400, (v2.status_code, v1.status_code)
    assert drain(worker_id="validating-worker") == 0  # no claim, delivery, dispatch or finalize found work
    for gate in gates:
        with pytest.raises(NotServing), transaction.atomic():
            serving_lock(org_id=ORG, account_key=gate.account_key)
    worker = run_manage(["run_workers", "--role", "v1", "--until-idle", "--idle-sleep", "0"], subprocess_env())
    assert _counts() == before, worker.stderr
    assert cutover_status(org=restorable)["next_command"].startswith("manage.py cutover activate")


# --- activate ------------------------------------------------------------------------------------------------
def _assert_all_or_nothing() -> str:
    """S003-RP-46: one verified epoch with every gate offline, or one active epoch with every gate serving it."""
    epoch, gates = _candidate(), _gates()
    if epoch.state == "verified":
        assert {g.state for g in gates} == {"v2_validating"} and all(g.epoch_id != epoch.pk for g in gates)
        assert not CutoverEvidence.objects.filter(org_id=ORG, kind="activation").exists()
        return "offline"
    assert epoch.state == "active"
    assert {(g.state, g.epoch_id, g.epoch_digest) for g in gates} == {("v2_serving", epoch.pk, epoch.digest)}
    assert decision_of(ORG, ATTEMPT).state in ("activating_v2", "v2_committed")
    return "serving"


def _assert_activated() -> None:
    assert _assert_all_or_nothing() == "serving"
    assert decision_of(ORG, ATTEMPT).state == "v2_committed"
    barrier = ServingPublicationBarrierSet.objects.filter(org_id=ORG).order_by("-id").first()  # the last try's
    assert barrier.state == "released" and barrier.open_key is None and barrier.release_reason == "activation_readback"
    assert barrier.receipts["epoch"] == {"id": int(_candidate().pk), "digest": _candidate().digest}


def test_activate_commits_every_gate_and_the_epoch_at_once_then_releases_the_barriers(validated, client):
    report = cutover_activate(org=validated, attempt_key=ATTEMPT)
    assert report.decision == "v2_committed" and not report.already
    _assert_activated()
    assert V1MaintenanceBarrier.objects.get(org_id=ORG, kind="configuration").state == "open"
    assert cutover_activate(org=validated, attempt_key=ATTEMPT).already
    assert ServingPublicationBarrierSet.objects.filter(org_id=ORG).count() == 1
    status = cutover_status(org=validated)
    assert status["phase"] == "v2_serving"  # the gates serve V2; starting V2 is running its worker processes
    assert status["next_command"].startswith("manage.py run_workers --role all (start V2")
    from nexusflow.kernel.workers import worker_process_register

    worker_process_register("connector")  # this process, alive, as a V2 worker
    assert cutover_status(org=validated)["next_command"].startswith("none: V2 serves every account (1 live")
    assert post_signed(client, [hubspot_event(20, 888, 6000)]).status_code == 202  # V2 admits now


def test_v2_continues_each_partition_from_the_v1_high_water_in_source_order(validated, client):
    """After activation V2 admits into the lanes the V1 baselines started: an event older than what V1 applied
    for the partition is superseded, a newer one applies (the V1 high-water is V2's, not a lane of its own)."""
    from nexusflow.records.models import Record

    cutover_activate(org=validated, attempt_key=ATTEMPT)
    lanes = OrderingLane.objects.filter(org_id=ORG).count()
    # V1 applied contact 501's email "a@example.test" at occurredAt 1001 (tests/cutover/test_halt_v1.py).
    assert post_signed(client, [hubspot_event(30, 501, 999, "email", "older@example.test")]).status_code == 202
    drain()
    [record] = Record.objects.filter(org_id=ORG, object_name="Contact")
    assert record.fields["email"] == "a@example.test"  # superseded by the V1 high-water
    assert OrderingLane.objects.filter(org_id=ORG).count() == lanes  # the baseline's lane, no lane of its own
    assert post_signed(client, [hubspot_event(31, 501, 1002, "email", "newer@example.test")]).status_code == 202
    drain()
    record.refresh_from_db()
    assert record.fields["email"] == "newer@example.test"


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_coordinator_killed_at_any_activation_boundary_leaves_all_or_nothing_and_a_rerun_completes(validated,
                                                                                                    boundary):
    """S003-RP-46 and S003-RP-48: after the kill, all or nothing, restore still authorized while rollback is open;
    the rerun is one holder-fenced takeover of the same barrier set and decision, and completes."""
    killed = run_manage(["cutover", "activate", "--org", ORG, "--attempt", ATTEMPT],
                        subprocess_env(NEXUS_FAILPOINTS=boundary))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    shape = _assert_all_or_nothing()
    decision = decision_of(ORG, ATTEMPT)
    if shape == "offline":
        assert decision.state in ("rollback_open", "activating_v2")
    [barrier] = ServingPublicationBarrierSet.objects.filter(org_id=ORG)
    assert barrier.state != "released" and barrier.holder_fence == 1  # nothing expired it
    rerun = run_manage(["cutover", "activate", "--org", ORG, "--attempt", ATTEMPT], subprocess_env())
    assert rerun.returncode == 0, rerun.stderr
    _assert_activated()
    assert ServingPublicationBarrierSet.objects.get(org_id=ORG).holder_fence == 2  # exactly one takeover


def test_a_stale_coordinator_can_neither_hold_commit_nor_release_and_time_never_unlocks(validated, db_clock_advance):
    """S003-RP-48: the takeover fences the older holder out; moving the clock by a day releases nothing."""
    epoch = _candidate()
    stale = barrier_acquire(org=validated, attempt_key=ATTEMPT, epoch=epoch)
    fresh = barrier_acquire(org=validated, attempt_key=ATTEMPT, epoch=epoch)
    assert (stale.set_id, stale.fence + 1) == (fresh.set_id, fresh.fence)
    receipts = owner_receipts(org=validated, epoch=epoch)
    with pytest.raises(FenceRejected):
        barrier_hold(org=validated, holding=stale, receipts=receipts)
    barrier_hold(org=validated, holding=fresh, receipts=receipts)
    with pytest.raises(FenceRejected):
        barrier_release(org=validated, holding=stale, reason="aborted")
    with pytest.raises(FenceRejected):
        activation._commit(validated, ATTEMPT, epoch, stale)
    assert _assert_all_or_nothing() == "offline"
    db_clock_advance(86400 * 3)
    credential = CredentialGeneration.objects.filter(org_id=ORG).first()
    with pytest.raises(PublicationBarrierHeld):
        credential_revoke(org_id=ORG, credential_generation_id=credential.pk, actor="ops")
    assert ServingPublicationBarrierSet.objects.get(org_id=ORG).state == "held"
    shown = run_manage(["cutover", "status", "--org", ORG], subprocess_env())
    assert shown.returncode == 0, shown.stderr
    assert f"held, holder {ServingPublicationBarrierSet.objects.get(org_id=ORG).holder} fence 2" in shown.stdout
    assert f"next: manage.py cutover activate --org {ORG} --attempt {ATTEMPT}" in shown.stdout
    cutover_activate(org=validated, attempt_key=ATTEMPT)
    _assert_activated()


# --- publication serializes with activation: S003-RP-47 ------------------------------------------------------
def test_publication_is_refused_while_the_barriers_are_held_and_admitted_after_release(validated, billing_sandbox):
    epoch = _candidate()
    holding = barrier_acquire(org=validated, attempt_key=ATTEMPT, epoch=epoch)
    barrier_hold(org=validated, holding=holding, receipts=owner_receipts(org=validated, epoch=epoch))
    credential = CredentialGeneration.objects.filter(org_id=ORG).first()
    with pytest.raises(PublicationBarrierHeld):
        credential_revoke(org_id=ORG, credential_generation_id=credential.pk, actor="ops")
    document = service_document(billing_sandbox.base_url)
    document["accounts"][0]["base_url"] = billing_sandbox.base_url + "/moved"
    generations = ConfigurationCount()
    with pytest.raises(PublicationBarrierHeld):
        service_configuration_apply(org=validated, document=document)
    assert CredentialGenerationDispatchGate.objects.get(credential_generation_id=credential.pk).state == "enabled"
    assert generations.unchanged()
    cutover_activate(org=validated, attempt_key=ATTEMPT)  # the takeover activates under the same set
    _assert_activated()
    assert credential_revoke(org_id=ORG, credential_generation_id=credential.pk, actor="ops").changed


def test_an_urgent_revocation_aborts_an_open_activation_and_the_aborted_coordinator_wins_nothing(validated):
    """S003-RP-47: while the decision is rollback_open an urgent revocation takes the barrier set over, releases
    it and revokes; the coordinator it aborted can no longer win the decision; activation runs again later."""
    epoch = _candidate()
    holding = barrier_acquire(org=validated, attempt_key=ATTEMPT, epoch=epoch)
    barrier_hold(org=validated, holding=holding, receipts=owner_receipts(org=validated, epoch=epoch))
    credential = CredentialGeneration.objects.filter(org_id=ORG).first()
    urgent = run_manage(["connector_credential_revoke", "--org", ORG, "--generation", str(credential.pk),
                         "--actor", "security", "--urgent"], subprocess_env())
    assert urgent.returncode == 0, urgent.stderr
    gate = CredentialGenerationDispatchGate.objects.get(credential_generation_id=credential.pk)
    [aborted] = ServingPublicationBarrierSet.objects.filter(org_id=ORG)
    assert gate.state == "revoked" and (aborted.state, aborted.release_reason) == ("released", "urgent_revocation")
    with pytest.raises(activation.ActivationAborted):
        begin_activation(ORG, ATTEMPT, guard=lambda: activation._still_held(validated, ATTEMPT, holding))
    assert decision_of(ORG, ATTEMPT).state == "rollback_open" and _assert_all_or_nothing() == "offline"
    cutover_activate(org=validated, attempt_key=ATTEMPT)  # a new set, the revocation already in its receipts
    _assert_activated()


def test_an_urgent_revocation_waits_once_activation_won_the_decision(validated):
    """S003-RP-47: after activating_v2 won, the urgent revocation aborts nothing and is refused until release."""
    epoch = _candidate()
    holding = barrier_acquire(org=validated, attempt_key=ATTEMPT, epoch=epoch)
    barrier_hold(org=validated, holding=holding, receipts=owner_receipts(org=validated, epoch=epoch))
    begin_activation(ORG, ATTEMPT, guard=lambda: activation._still_held(validated, ATTEMPT, holding))
    credential = CredentialGeneration.objects.filter(org_id=ORG).first()
    refused = run_manage(["connector_credential_revoke", "--org", ORG, "--generation", str(credential.pk),
                          "--actor", "security", "--urgent"], subprocess_env())
    assert refused.returncode == 1 and "publication_barrier_held" in refused.stderr
    assert CredentialGenerationDispatchGate.objects.get(credential_generation_id=credential.pk).state == "enabled"
    assert ServingPublicationBarrierSet.objects.get(org_id=ORG).state == "held"
    cutover_activate(org=validated, attempt_key=ATTEMPT)  # activation finishes, then the revocation applies
    _assert_activated()
    again = run_manage(["connector_credential_revoke", "--org", ORG, "--generation", str(credential.pk),
                        "--actor", "security", "--urgent"], subprocess_env())
    assert again.returncode == 0, again.stderr


class ConfigurationCount:
    def __init__(self):
        from connectors.models import ConnectorServiceConfigurationGeneration

        self.model = ConnectorServiceConfigurationGeneration
        self.before = self.model.objects.filter(org_id=ORG).count()

    def unchanged(self) -> bool:
        return self.model.objects.filter(org_id=ORG).count() == self.before


def test_a_revocation_in_flight_commits_before_the_barrier_and_the_frozen_receipt_shows_it(validated, holds):
    """S003-RP-47: the acquisition waits for the revocation already past its barrier check; the receipts frozen
    after it show the revoked gate, so nothing changes between the final reread and the activation commit."""
    credential = CredentialGeneration.objects.filter(org_id=ORG).first()
    revoke, activate = race_behind_hold(
        holds, "credential.revoke_before_commit",
        lambda: credential_revoke(org_id=ORG, credential_generation_id=credential.pk, actor="ops"),
        lambda: cutover_activate(org=validated, attempt_key=ATTEMPT),
        table="connectors_credentialgenerationdispatchgate", names=("revoke", "activate"))
    assert revoke.error is None and revoke.result.changed
    assert activate.error is None, activate.error
    _assert_activated()
    receipt = {c["id"]: c for c in ServingPublicationBarrierSet.objects.get(org_id=ORG).receipts["credentials"]}
    assert receipt[int(credential.pk)]["gate_state"] == "revoked"


# --- the decision race: S003-RP-49 ---------------------------------------------------------------------------
class ControlWorker(threading.Thread):
    """Run ``fn`` on its own connections; ``control_id`` is its control-database connection id."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error, self.control_id = fn, None, None, None
        self.ready = threading.Event()

    def run(self):
        try:
            with connections["control"].cursor() as cursor:
                cursor.execute("SELECT CONNECTION_ID()")
                self.control_id = int(cursor.fetchone()[0])
            self.ready.set()
            self.result = self.fn()
        except Exception as exc:  # the test inspects it
            self.error = exc
        finally:
            self.ready.set()
            connections.close_all()


def _blocked_on_decision(connection_id: int) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with connections["control"].cursor() as cursor:
            cursor.execute("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = %s", [connection_id])
            row = cursor.fetchone()
        if row and row[0] and "cutover_cutoverdecision" in row[0] and "FOR UPDATE" in row[0]:
            return
        time.sleep(0.02)
    raise AssertionError("activation never waited on the cutover decision")


def test_activation_losing_the_decision_to_restore_commits_nothing_and_releases_its_barriers(validated, holds):
    """S003-RP-49: restore holds the decision row; activation queues behind it with its barriers held, loses,
    records no local activation commit and fenced-releases; a rerun cannot reacquire or commit."""
    holds.arm("cutover.decision.before_cas")
    restore = ControlWorker(lambda: begin_restore(ORG, ATTEMPT))
    restore.start()
    marker = holds.wait_held("cutover.decision.before_cas")
    activate = ControlWorker(lambda: cutover_activate(org=validated, attempt_key=ATTEMPT))
    activate.start()
    assert activate.ready.wait(60)
    _blocked_on_decision(activate.control_id)
    assert ServingPublicationBarrierSet.objects.get(org_id=ORG).state == "held"  # activation holds its barriers
    holds.release(marker)
    restore.join(60)
    activate.join(60)
    assert restore.error is None and restore.result.state == "restoring_v1"
    assert isinstance(activate.error, DecisionLost) and activate.error.state == "restoring_v1"
    assert _assert_all_or_nothing() == "offline" and _candidate().state == "verified"
    [barrier] = ServingPublicationBarrierSet.objects.filter(org_id=ORG)
    assert (barrier.state, barrier.release_reason, barrier.open_key) == ("released", "restore_won", None)
    with pytest.raises(DecisionLost):
        cutover_activate(org=validated, attempt_key=ATTEMPT)
    assert ServingPublicationBarrierSet.objects.filter(org_id=ORG).count() == 1  # nothing reacquired
    assert _assert_all_or_nothing() == "offline" and decision_of(ORG, ATTEMPT).state == "restoring_v1"
    refused = run_manage(["cutover", "activate", "--org", ORG, "--attempt", ATTEMPT], subprocess_env())
    assert refused.returncode == 3 and "cutover_decision_lost" in refused.stderr


def test_a_restore_after_a_crashed_activation_releases_its_barriers_and_activation_stays_refused(validated):
    """S003-RP-49: the coordinator died holding the barriers; restore wins the open decision, releases the set
    by one fenced takeover, publication reopens, and no later activation can commit."""
    killed = run_manage(["cutover", "activate", "--org", ORG, "--attempt", ATTEMPT],
                        subprocess_env(NEXUS_FAILPOINTS=activation.FP_AFTER_HELD))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert ServingPublicationBarrierSet.objects.get(org_id=ORG).state == "held"
    with pytest.raises(CutoverRefused):
        activation.activation_release_after_restore(org=validated, attempt_key=ATTEMPT)  # rollback still open
    assert begin_restore(ORG, ATTEMPT).state == "restoring_v1"
    assert activation.activation_release_after_restore(org=validated, attempt_key=ATTEMPT)
    barrier = ServingPublicationBarrierSet.objects.get(org_id=ORG)
    assert (barrier.state, barrier.holder_fence, barrier.release_reason) == ("released", 2, "restore_won")
    credential = CredentialGeneration.objects.filter(org_id=ORG).first()
    assert credential_revoke(org_id=ORG, credential_generation_id=credential.pk, actor="ops").changed
    with pytest.raises(DecisionLost):
        cutover_activate(org=validated, attempt_key=ATTEMPT)
    assert _assert_all_or_nothing() == "offline"
