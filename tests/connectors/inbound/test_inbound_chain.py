"""Seed 003 inbound chain on real MariaDB: admission, ordering contracts, dependencies, windows.

Each test is named after the "Required proof" bullet it proves (ids in
tests/PROOFS.tsv). Races use real concurrent transactions on their own
connections; crashes kill a real process at a named failpoint.
"""
from __future__ import annotations

import signal
import time

import pytest
from django.db import transaction

from connectors import reasons
from connectors.inbound.admission import receipt_materialize, receipt_try_reconcile_one
from connectors.inbound.executions import (
    _claim_in_lane,
    _claim_unlaned,
    dependency_try_expire_one,
    execution_complete,
    execution_run,
    execution_try_claim_one,
    execution_try_run_one,
)
from connectors.inbound.windows import window_try_close_one
from connectors.models import (
    AccountServingGate,
    Event,
    Execution,
    ExecutionAttempt,
    ExecutionDependency,
    OrderingLane,
    Projection,
    ProjectionWindow,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
    ServingEpoch,
)
from connectors.serving.gates import NotServing, gate_transition
from connectors.store import AccountServingGateStore, ExecutionDependencyStore, ServingEpochStore
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from runtime_outbox.models import ApplicationResult
from tests.concurrency import run_at_once
from tests.conftest import ORG, hubspot_event, make_serving_org, post_signed, run_manage, subprocess_env
from tests.connectors import variant_pack
from tests.kits.records import only_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _run_all() -> int:
    done = 0
    while execution_try_run_one(worker_id="t"):
        done += 1
    return done


# --- S003-RP-11: transport redelivery, partial batch recovery, V1 tombstones -----------------
BATCH = [hubspot_event(1, 701, 1000), hubspot_event(2, 701, 2000, "email", "ada@x.io"),
         hubspot_event(3, 701, 3000, "firstname", "Ada")]

ADMIT_IN_CHILD = """
import time
from connectors.inbound.admission import admit
from packs.hubspot.sender import Delivery, signed_headers, webhook_route
from tests.conftest import WEBHOOK_SECRET, hubspot_event
batch = [hubspot_event(1, 701, 1000), hubspot_event(2, 701, 2000, "email", "ada@x.io"),
         hubspot_event(3, 701, 3000, "firstname", "Ada")]
d = Delivery(batch, "valid")
url = "http://testserver/api/v2/ingress/crm-webhooks/webhooks/"
h = signed_headers(d, auth=webhook_route()["auth"], url=url, secret=WEBHOOK_SECRET.encode(), now_epoch_seconds=time.time())
admit(account_key="crm-webhooks", channel="webhooks", method="POST", url=url, body=d.body_bytes(), headers=h)
"""


@pytest.fixture
def org(billing_sandbox):
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


@pytest.mark.parametrize("failpoint", ["admission.before_children", "admission.between_children_chunks"])
def test_partial_batch_recovery_materializes_every_component_once_under_the_original_epoch(client, org, failpoint):
    env = subprocess_env(NEXUS_FAILPOINTS=failpoint, NEXUS_ADMISSION_CHUNK="1",
                         NEXUS_TEST_WEBHOOK_SECRET="test-webhook-secret")
    crashed = run_manage(["shell", "-c", ADMIT_IN_CHILD], env, timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    receipt = Receipt.objects.get()
    partial = ReceiptComponent.objects.filter(receipt=receipt).count()
    assert partial == (0 if failpoint == "admission.before_children" else 1)
    # the provider redelivers the same request: the original Receipt, and only the missing children
    again = post_signed(client, BATCH)
    assert again.status_code == 200 and again.json() == {"receipt_id": receipt.pk, "status": "redelivered"}
    components = list(ReceiptComponent.objects.filter(receipt=receipt).order_by("ordinal")
                      .values_list("ordinal", "disposition"))
    assert components == [(0, "event"), (1, "event"), (2, "event")]
    assert Event.objects.count() == 3 and Execution.objects.count() == 3
    assert set(Event.objects.values_list("epoch_id", flat=True)) == {receipt.epoch_id}
    assert Receipt.objects.count() == 1 and ReceiptAdmissionKey.objects.count() == 1
    _run_all()
    assert only_record().fields == {"email": "ada@x.io", "firstname": "Ada"}


def test_partial_batch_recovery_by_the_reconciler_without_redelivery(org):
    env = subprocess_env(NEXUS_FAILPOINTS="admission.between_children_chunks", NEXUS_ADMISSION_CHUNK="2",
                         NEXUS_TEST_WEBHOOK_SECRET="test-webhook-secret")
    crashed = run_manage(["shell", "-c", ADMIT_IN_CHILD], env, timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    receipt = Receipt.objects.get()
    assert ReceiptComponent.objects.filter(receipt=receipt).count() == 2
    assert receipt_try_reconcile_one() is True
    assert receipt_try_reconcile_one() is False  # nothing is missing any more
    assert sorted(ReceiptComponent.objects.values_list("ordinal", flat=True)) == [0, 1, 2]
    assert Event.objects.count() == 3
    assert receipt_materialize(org_id=ORG, receipt_id=receipt.pk) == (0, 0)  # idempotent


def _walk_to_v1_drained(org: OrgScope, account_key: str) -> None:
    for dst in ("halting_v1", "v1_stopped", "v1_drained"):
        with transaction.atomic(durable=True):
            gate = AccountServingGateStore.lock_by_account(org.org_id, account_key)
            gate_transition(gate=gate, dst=dst, evidence={"test": "v1 drained"}, reason_code="cutover_in_progress")


def test_v1_tombstone_answers_already_accepted_and_materializes_nothing(client, billing_sandbox, tmp_path):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from cutover.services import cutover_greenfield
    from tests.conftest import apply_service_configuration

    org = OrgScope(ORG)
    apply_service_configuration(org, billing_sandbox.base_url)
    tombstones = tmp_path / "tombstones.json"
    import json

    tombstones.write_text(json.dumps({"tombstones": [
        {"account_key": "crm-webhooks", "channel": "webhooks", "body": BATCH,
         "predecessor": {"protocol": "v1", "receipt_id": "v1-r-77", "work_item_ids": ["w1", "w2", "w3"]}}]}))
    with pytest.raises(CommandError, match="tombstone_gate_state.*v1_serving"):
        call_command("connector_v1_tombstones_import", "--org", ORG, str(tombstones))
    _walk_to_v1_drained(org, "crm-webhooks")
    call_command("connector_v1_tombstones_import", "--org", ORG, str(tombstones))
    call_command("connector_v1_tombstones_import", "--org", ORG, str(tombstones))  # idempotent
    assert ReceiptAdmissionKey.objects.filter(receipt__isnull=True).count() == 1
    cutover_greenfield(org=org)

    # V1 accepted this exact delivery: V2 answers already accepted and creates nothing
    redelivered = [dict(e, attemptNumber=4) for e in BATCH]  # volatile fields do not change the identity
    response = post_signed(client, redelivered)
    assert response.status_code == 200 and response.json() == {"receipt_id": None, "status": "already_accepted"}
    assert Receipt.objects.count() == 0 and Event.objects.count() == 0 and Execution.objects.count() == 0
    # the same key with different content fails closed
    changed = [BATCH[0], BATCH[1], hubspot_event(3, 701, 3000, "firstname", "Eve")]
    conflict = post_signed(client, changed)
    assert conflict.status_code == 409 and conflict.json()["error"] == "admission_conflict"
    assert Receipt.objects.count() == 0 and Event.objects.count() == 0


# --- S003-RP-07: a corrupt gate naming a verified epoch produces no production fact ------------
def test_even_a_corrupt_gate_that_names_a_verified_epoch_produces_no_production_fact(client, org):
    assert post_signed(client, BATCH[:1]).status_code == 202
    receipt = Receipt.objects.get()
    counts = lambda: (Receipt.objects.count(), ReceiptComponent.objects.count(), Event.objects.count(),
                      Execution.objects.count(), ExecutionAttempt.objects.count(), ApplicationResult.objects.count())
    before = counts()
    gate = AccountServingGate.objects.get(account_key="crm-webhooks")
    active = ServingEpoch.objects.get(pk=gate.epoch_id)
    # a second candidate that is merely verified, and a gate that (corruptly) names it with its digest
    verified = ServingEpochStore.create(org_id=ORG, state="prepared", configuration=active.configuration,
                                        document=active.document, digest="f" * 64, profile_id=active.profile_id)
    with transaction.atomic(durable=True):
        ServingEpochStore.transition(org_id=ORG, pk=verified.pk, src="prepared", dst="verified", version=1)
        locked = AccountServingGateStore.lock_by_account(ORG, "crm-webhooks")
        AccountServingGateStore.touch(org_id=ORG, pk=locked.pk, state="v2_serving", version=locked.version,
                                      set_fields={"epoch_id": verified.pk, "epoch_digest": verified.digest})
    assert post_signed(client, BATCH[1:]).status_code == 503
    with pytest.raises(NotServing):
        receipt_materialize(org_id=ORG, receipt_id=receipt.pk)
    assert execution_try_claim_one(worker_id="t") is None
    assert window_try_close_one() is False and dependency_try_expire_one() is False
    assert counts() == before


# --- S003-RP-15 / S003-RP-23: strict_source_sequence and its dependencies -------------------
def test_strict_source_sequence_cannot_cross_a_gap(client, billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path, variant_pack.strict())
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 801, 1000), hubspot_event(3, 801, 3000, "email", "three@x.io")])
    assert _run_all() == 1
    waiting = Execution.objects.get(projection__event__source_event_key__endswith="/1:3")
    assert waiting.state == "waiting_dependency"
    dependency = ExecutionDependency.objects.get(execution=waiting)
    assert dependency.state == "waiting" and dependency.requirement == "source_predecessor"
    # waiting holds no lease: no started attempt, and the lane has no active execution
    assert not ExecutionAttempt.objects.filter(execution=waiting).exists()
    assert OrderingLane.objects.get().active_execution_id is None
    assert execution_try_claim_one(worker_id="t") is None  # the gap is not crossed
    post_signed(client, [hubspot_event(2, 801, 2000, "email", "two@x.io")])
    assert _run_all() == 2
    assert only_record().fields["email"] == "three@x.io"
    assert list(Execution.objects.order_by("position").values_list("state", flat=True)) == ["completed"] * 3
    dependency.refresh_from_db()
    assert dependency.state == "satisfied"
    # a late duplicate position at or below the high-water never reaches Runtime
    post_signed(client, [hubspot_event(2, 801, 2500, "email", "late@x.io", subscription_id=303)])
    _run_all()
    late = Execution.objects.get(projection__event__source_event_key__startswith="3:303")
    assert late.state == "superseded" and ApplicationResult.objects.count() == 3


@pytest.mark.parametrize("disposition", ["quarantine", "skip"])
def test_a_strict_gap_past_its_frozen_deadline_follows_its_disposition(client, billing_sandbox, settings, monkeypatch,
                                                                      tmp_path, disposition, db_clock_advance):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.strict(deadline_seconds=1, disposition=disposition))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 802, 1000), hubspot_event(3, 802, 3000, "email", "three@x.io")])
    _run_all()
    dependency = ExecutionDependency.objects.get()
    assert dependency_try_expire_one() is False  # the deadline has not passed
    db_clock_advance(1.2)
    assert dependency_try_expire_one() is True
    dependency.refresh_from_db()
    assert dependency.state == "expired"
    third = dependency.execution
    third.refresh_from_db()
    if disposition == "quarantine":
        assert third.state == "quarantined" and third.reason_code == reasons.SOURCE_SEQUENCE_GAP
        assert _run_all() == 0
        assert "email" not in only_record().fields
    else:
        assert _run_all() == 1
        assert only_record().fields["email"] == "three@x.io"
        post_signed(client, [hubspot_event(2, 802, 2000, "email", "two@x.io")])
        _run_all()
        assert only_record().fields["email"] == "three@x.io"  # the skipped position arrives late: superseded
        assert Execution.objects.get(projection__event__source_event_key__endswith="/1:2").state == "superseded"


def test_dependencies_hold_no_lease_their_deadline_never_moves_and_satisfy_or_expire_has_one_result(
        client, billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path, variant_pack.strict(deadline_seconds=1))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 803, 1000), hubspot_event(3, 803, 3000, "email", "three@x.io")])
    _run_all()
    dependency = ExecutionDependency.objects.get()
    deadline = dependency.deadline_at
    with pytest.raises(ValueError, match="fixed at insert"):
        ExecutionDependencyStore.transition(org_id=ORG, pk=dependency.pk, src="waiting", dst="expired",
                                            version=dependency.version, set_fields={"deadline_at": deadline})
    assert not ExecutionAttempt.objects.filter(execution=dependency.execution, state="started").exists()
    time.sleep(1.2)  # the suite's one real wait: the deadline fixed at insert passes on the unmoved database clock
    # the missing position arrives and runs while the expiry sweep races it
    post_signed(client, [hubspot_event(2, 803, 2000, "email", "two@x.io")])
    _, errors = run_at_once(lambda: _run_all(), lambda: dependency_try_expire_one())
    assert not errors, errors
    _run_all()
    dependency.refresh_from_db()
    third = Execution.objects.get(pk=dependency.execution_id)
    assert dependency.deadline_at == deadline and dependency.version == 2  # exactly one transition
    assert (dependency.state, third.state) in {("satisfied", "completed"), ("expired", "quarantined")}
    assert ApplicationResult.objects.filter(command_id=third.command_id).count() == (
        1 if dependency.state == "satisfied" else 0)


# --- order_independent and settle -----------------------------------------------------------
def test_order_independent_bypasses_the_lane_and_a_claim_is_taken_once(client, billing_sandbox, settings,
                                                                       monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path, variant_pack.independent)
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 804, 1000), hubspot_event(2, 804, 2000, "email", "a@x.io")])
    assert OrderingLane.objects.count() == 0
    assert set(Execution.objects.values_list("lane_id", flat=True)) == {None}
    target = Execution.objects.order_by("id").first()
    claims: list = []
    _, errors = run_at_once(lambda: claims.append(_claim_unlaned(ORG, target.pk, "w1")),
                            lambda: claims.append(_claim_unlaned(ORG, target.pk, "w2")))
    assert not errors, errors
    assert len([c for c in claims if c is not None]) == 1
    assert ExecutionAttempt.objects.filter(execution=target, state="started").count() == 1
    execution_run(next(c for c in claims if c is not None))
    _run_all()
    assert set(Execution.objects.values_list("state", flat=True)) == {"completed"}
    assert ApplicationResult.objects.count() == 2


def test_latest_source_position_waits_for_its_settle_window_before_choosing(client, billing_sandbox, settings,
                                                                          monkeypatch, tmp_path, db_clock_advance):
    variant_pack.use_variant(settings, monkeypatch, tmp_path, variant_pack.settle(1))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(2, 805, 2000, "email", "new@x.io")])
    assert execution_try_claim_one(worker_id="t") is None
    assert not ExecutionAttempt.objects.exists() and not Execution.objects.exclude(state="ready").exists()
    post_signed(client, [hubspot_event(1, 805, 1000, "email", "old@x.io")])  # late but inside the window
    db_clock_advance(1.2)
    _run_all()
    assert only_record().fields["email"] == "new@x.io"
    assert Execution.objects.filter(state="superseded").count() == 1


# --- S003-RP-19: concurrent window close and Execution minting ------------------------------
def test_concurrent_window_close_and_execution_minting_produce_one_active_generation(
        client, billing_sandbox, settings, monkeypatch, tmp_path, db_clock_advance):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.window(policy="batch", close_after_seconds=1, max_items=50))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 806, 1000), hubspot_event(2, 806, 2000, "email", "b@x.io")])
    window = ProjectionWindow.objects.get()
    assert window.state == "open" and window.member_count == 2 and not Execution.objects.exists()
    db_clock_advance(1.2)
    from django.test import Client

    late = {}
    late_post = [hubspot_event(3, 806, 3000, "firstname", "Bo")]
    _, errors = run_at_once(window_try_close_one, window_try_close_one,
                            lambda: late.update(r=post_signed(Client(), late_post)))
    assert not errors, errors
    assert late["r"].status_code == 202
    window.refresh_from_db()
    assert window.state == "sealed" and window.open_key is None
    assert Execution.objects.filter(window=window).count() == 1
    third = Projection.objects.get(event__source_event_key__endswith="/1:3")
    if third.window_id != window.pk:  # the late input lost the race: it is in a successor window
        successor = ProjectionWindow.objects.get(pk=third.window_id)
        assert successor.state == "open" and successor.grouping_key == window.grouping_key
    assert Projection.objects.filter(window=window).count() == window.member_count
    _run_all()
    db_clock_advance(1.2)
    while window_try_close_one():
        pass
    _run_all()
    assert only_record().fields == {"email": "b@x.io", "firstname": "Bo"}
    assert Execution.objects.count() == ProjectionWindow.objects.count()
    assert set(Execution.objects.values_list("state", flat=True)) == {"completed"}


def test_a_latest_window_applies_only_its_greatest_position(client, billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.window(policy="latest", grouping=["objectId"], close_after_seconds=3600,
                                                 max_items=3))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 807, 1000), hubspot_event(3, 807, 3000, "email", "c3@x.io"),
                         hubspot_event(2, 807, 2000, "email", "c2@x.io")])
    window = ProjectionWindow.objects.get()
    assert window.state == "sealed"  # full at max_items: sealed in the admission transaction
    execution = Execution.objects.get(window=window)
    assert execution.projection.event.source_event_key.endswith("/1:3")
    _run_all()
    assert ApplicationResult.objects.count() == 1


# --- S003-RP-15 / S003-RP-20: concurrent claim and result recording -----------------------------
def test_concurrent_claim_and_result_recording_advance_the_high_water_in_one_fenced_transaction(client, org):
    post_signed(client, [hubspot_event(1, 808, 1000, "email", "one@x.io")])
    claim = execution_try_claim_one(worker_id="w1")
    from connectors.inbound.executions import build_runtime_command
    from runtime_outbox.services import application_command_submit

    execution = Execution.objects.get(pk=claim.execution_id)
    result = application_command_submit(org_id=ORG, command_id=execution.command_id,
                                        execution_ref_digest=execution.execution_ref_digest,
                                        command=build_runtime_command(execution))
    post_signed(client, [hubspot_event(2, 808, 2000, "email", "two@x.io")])
    outcomes: list = []
    _, errors = run_at_once(
        lambda: outcomes.append(("complete", execution_complete(claim, result_id=result.pk))),
        lambda: outcomes.append(("claim", _claim_in_lane(ORG, "crm-webhooks", claim.lane_id, "w2"))))
    assert not errors, errors
    lane = OrderingLane.objects.get(pk=claim.lane_id)
    execution.refresh_from_db()
    assert execution.state == "completed" and bytes(lane.high_water_position) == bytes(execution.position)
    assert execution.result_digest == result.result_digest
    racing = dict(outcomes)["claim"]
    if racing is not None:  # the claim committed after the result: it took the newer position
        assert racing.execution_id != execution.pk
        assert execution_run(racing) is True
    _run_all()
    lane.refresh_from_db()
    newest = Execution.objects.get(projection__event__source_event_key__endswith="/1:2")
    assert newest.state == "completed" and bytes(lane.high_water_position) == bytes(newest.position)
    assert ExecutionAttempt.objects.filter(state="started").count() == 0


# --- S003-RP-21 / S003-RP-22: lease loss and Runtime result loss after commit ---------------------
def test_runtime_commit_followed_by_response_loss_returns_the_original_result_and_applies_once(client, org, monkeypatch, db_clock_advance):
    post_signed(client, [hubspot_event(1, 809, 1000, "email", "once@x.io")])
    monkeypatch.setenv("NEXUS_EXECUTION_LEASE_SECONDS", "1")
    claim = execution_try_claim_one(worker_id="w1")
    from connectors.inbound.executions import build_runtime_command
    from runtime_outbox.services import application_command_submit

    execution = Execution.objects.get(pk=claim.execution_id)
    first = application_command_submit(org_id=ORG, command_id=execution.command_id,
                                       execution_ref_digest=execution.execution_ref_digest,
                                       command=build_runtime_command(execution))
    version_after_first = Record.objects.get().version
    # the response is lost: the worker never records completion and its lease expires
    db_clock_advance(1.2)
    second_claim = execution_try_claim_one(worker_id="w2")
    assert second_claim is not None and second_claim.execution_id == claim.execution_id
    assert second_claim.attempt_id != claim.attempt_id
    assert execution_run(second_claim) is True
    execution.refresh_from_db()
    assert execution.state == "completed" and execution.runtime_receipt_id == first.pk
    assert ApplicationResult.objects.count() == 1
    assert Record.objects.get().version == version_after_first  # applied once
    assert list(ExecutionAttempt.objects.filter(execution=execution).order_by("attempt_number")
                .values_list("state", flat=True)) == ["expired", "completed"]
    # the first worker wakes up with its old claim: fenced, nothing changes
    from nexusflow.kernel.errors import StaleVersion

    with pytest.raises(StaleVersion):
        execution_complete(claim, result_id=first.pk)
    assert Execution.objects.filter(projection=execution.projection).count() == 1


def test_every_item_of_one_waiting_source_operation_shares_one_gap_deadline(client, billing_sandbox, settings,
                                                                            monkeypatch, tmp_path, db_clock_advance):
    variant_pack.use_variant(settings, monkeypatch, tmp_path, variant_pack.strict(deadline_seconds=1))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 810, 1000)])
    _run_all()
    # sequence 3 names two items (one source operation); sequence 2 never comes
    post_signed(client, [hubspot_event(3, 810, 3000, "email", "a@x.io", subscription_id=202),
                         hubspot_event(3, 810, 3000, "firstname", "A", subscription_id=303)])
    _run_all()
    dependencies = list(ExecutionDependency.objects.order_by("id"))
    assert len(dependencies) == 2 and len({d.deadline_at for d in dependencies}) == 1
    assert not ExecutionAttempt.objects.filter(state="started").exists()
    db_clock_advance(1.2)
    while dependency_try_expire_one():
        pass
    assert sorted(Execution.objects.values_list("state", flat=True)) == ["completed", "quarantined", "quarantined"]
