"""Adversarial attacks on the inbound chain: races, crashes and bad input.

Two-step admission and its reconciler, strict / order-independent claims and
dependency expiry, ProjectionWindows, V1 tombstones, replay, the stream
poller, and every new endpoint and command. Races are real concurrent
transactions on their own connections; crashes kill a real process at a
named failpoint. Each test asserts an invariant (exactly once, nothing lost,
no partial descendant, a clear error), never a timing.
"""
from __future__ import annotations

import json
import signal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import Client

from connectors import reasons
from connectors.inbound.admission import (
    _admit_locked,
    _route_and_secret,
    classify_items,
    identity_digest_for,
    receipt_try_reconcile_one,
    transport_key_for,
)
from connectors.inbound.executions import (
    _claim_in_lane,
    _claim_unlaned,
    dependency_try_expire_one,
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
    ReplayRequest,
    StreamCursor,
)
from connectors.serving.gates import gate_transition
from connectors.store import AccountServingGateStore
from cutover.reasons import CUTOVER_IN_PROGRESS
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.models import ApplicationResult
from runtime_outbox.replay_guard import SUPPRESS_EXTERNAL_EFFECTS
from tests.concurrency import run_at_once
from tests.conftest import ORG, drain, hubspot_event, make_serving_org, post_signed, run_manage, subprocess_env
from tests.connectors import variant_pack
from tests.stream_support import STREAM_ACCOUNT, stream_target

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

ACCOUNT = "crm-webhooks"


# --- helpers ----------------------------------------------------------------------------------
def _run_all() -> int:
    done = 0
    while execution_try_run_one(worker_id="t"):
        done += 1
    return done


def _reserve_only(events: list, org_id: str = ORG, account: str = ACCOUNT) -> int:
    """Step one of admission only (key + Receipt, no children): the state a crash before children leaves."""
    _gate, route, _secret = _route_and_secret(org_id, account, "webhooks")
    items = classify_items(route, events)
    result = _admit_locked(org_id, account, "webhooks", route, json.dumps(events).encode(), items,
                           transport_key_for(route, items), identity_digest_for(items))
    assert result.created
    return result.receipt_id


def _halt_gate(account: str = ACCOUNT) -> None:
    with transaction.atomic(durable=True):
        gate = AccountServingGateStore.lock_by_account(ORG, account)
        gate_transition(gate=gate, dst="halting_v2", evidence={"halt": "adversarial test"},
                        reason_code=CUTOVER_IN_PROGRESS)


def _one_component_per_ordinal(receipt_id) -> list[int]:
    ordinals = list(ReceiptComponent.objects.filter(receipt_id=receipt_id).values_list("ordinal", flat=True))
    assert len(ordinals) == len(set(ordinals)), f"duplicate ordinals {sorted(ordinals)}"
    return sorted(ordinals)


@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


ADMIT_IN_CHILD = """
import json, time
from connectors.inbound.admission import admit
from packs.hubspot.sender import Delivery, signed_headers, webhook_route
from tests.conftest import WEBHOOK_SECRET
batch = json.loads({batch!r})
d = Delivery(batch, "valid")
url = "http://testserver/api/v2/ingress/crm-webhooks/webhooks/"
h = signed_headers(d, auth=webhook_route()["auth"], url=url, secret=WEBHOOK_SECRET.encode(), now_epoch_seconds=time.time())
admit(account_key="crm-webhooks", channel="webhooks", method="POST", url=url, body=d.body_bytes(), headers=h)
"""


# === 1. two-step admission, materialization and the reconciler ==================================
def test_redeliveries_and_reconcilers_racing_on_one_crashed_partial_receipt_materialize_each_item_once(
        org, settings):
    batch = [hubspot_event(i, 900 + i % 4, 1000 + i, "email", f"e{i}@x.io") for i in range(1, 31)]
    env = subprocess_env(NEXUS_FAILPOINTS="admission.between_children_chunks", NEXUS_ADMISSION_CHUNK="1",
                         NEXUS_TEST_WEBHOOK_SECRET="test-webhook-secret")
    crashed = run_manage(["shell", "-c", ADMIT_IN_CHILD.format(batch=json.dumps(batch))], env, timeout=90)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    receipt = Receipt.objects.get()
    assert _one_component_per_ordinal(receipt.pk) == [0]
    settings.NEXUS_ADMISSION_CHUNK = 1  # many small chunks: the widest interleaving

    def redeliver():
        response = post_signed(Client(), [dict(e, attemptNumber=3) for e in batch])
        return response.status_code, response.json()

    results, errors = run_at_once(redeliver, redeliver, redeliver, receipt_try_reconcile_one, receipt_try_reconcile_one)
    assert not errors, errors
    for status_code, body in results[:3]:
        assert (status_code, body) == (200, {"receipt_id": receipt.pk, "status": "redelivered"})
    assert _one_component_per_ordinal(receipt.pk) == list(range(len(batch)))
    assert Receipt.objects.count() == 1 and ReceiptAdmissionKey.objects.count() == 1
    assert Event.objects.count() == len(batch) and Execution.objects.count() == len(batch)
    assert Event.objects.values("source_event_key").distinct().count() == len(batch)
    assert set(Event.objects.values_list("epoch_id", flat=True)) == {receipt.epoch_id}
    assert receipt_try_reconcile_one() is False


def test_a_full_batch_with_chunk_size_one_and_an_identical_concurrent_delivery_admits_every_item_once(
        org, settings):
    settings.NEXUS_ADMISSION_CHUNK = 1
    batch = [hubspot_event(i, 1000 + i % 9, 5000 + i, "firstname", f"n{i}") for i in range(1, 101)]  # max_items

    def post(attempt):
        return lambda: post_signed(Client(), [dict(e, attemptNumber=attempt) for e in batch]).status_code

    statuses, errors = run_at_once(post(0), post(1), post(2), receipt_try_reconcile_one)
    assert not errors, errors
    assert sorted(statuses[:3]) == [200, 200, 202]
    receipt = Receipt.objects.get()
    assert _one_component_per_ordinal(receipt.pk) == list(range(100))
    assert Event.objects.count() == 100 and Execution.objects.count() == 100
    over = post_signed(Client(), batch + [hubspot_event(101, 1000, 9999, "firstname", "x")])
    assert (over.status_code, over.json()["error"]) == (400, "malformed_body")
    assert Receipt.objects.count() == 1


def test_a_partial_receipt_of_a_halted_gate_is_not_materialized_and_redelivery_answers_503(client, org):
    receipt_id = _reserve_only(BATCH3)
    _halt_gate()
    assert receipt_try_reconcile_one() is False
    response = post_signed(client, BATCH3)
    assert response.status_code == 503 and response.json()["error"] == "not_serving"
    assert ReceiptComponent.objects.filter(receipt_id=receipt_id).count() == 0 and Event.objects.count() == 0


BATCH3 = [hubspot_event(1, 701, 1000), hubspot_event(2, 701, 2000, "email", "ada@x.io"),
          hubspot_event(3, 701, 3000, "firstname", "Ada")]


def test_halt_does_not_complete_while_a_receipt_of_the_epoch_still_lacks_children(org):
    """A halted predecessor epoch can never materialize its partial Receipts: halting must wait for them."""
    from connectors.serving.handoff import HaltRefused, halt_begin, halt_try_complete

    receipt_id = _reserve_only(BATCH3)
    with pytest.raises(HaltRefused):
        halt_begin(org=org)
    assert AccountServingGate.objects.get(account_key=ACCOUNT).state == "v2_serving"
    assert receipt_try_reconcile_one() is True
    assert _one_component_per_ordinal(receipt_id) == [0, 1, 2]
    _run_all()
    halt_begin(org=org)
    assert halt_try_complete(org=org).gates[ACCOUNT][0] == "v2_halted"


def test_non_serving_partial_receipts_do_not_starve_the_reconciler_of_serving_ones(org):
    """A page of partial Receipts on a halted account must not hide another org's serving Receipt."""
    from connectors.serving.gates import service_configuration_apply
    from connectors.serving.generations import credential_publish
    from cutover.services import cutover_greenfield

    other = OrgScope("test-org-2")
    credential_publish(org=other, document={"account_key": "crm-webhooks-2", "credential_ref": "webhook_secret",
                                            "version": "test-1", "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}})
    service_configuration_apply(org=other, document={"accounts": [
        {"account_key": "crm-webhooks-2", "pack": "hubspot", "routes": ["contacts.webhook"],
         "credentials": {"webhook_secret": "test-1"}}]})
    cutover_greenfield(org=other)
    for i in range(25):  # crashed admissions of an account that then halts (--force)
        _reserve_only([hubspot_event(100 + i, 3000 + i, 1000 + i, "email", f"s{i}@x.io")])
    _halt_gate()
    serving = _reserve_only(BATCH3, org_id="test-org-2", account="crm-webhooks-2")
    assert receipt_try_reconcile_one() is True
    assert _one_component_per_ordinal(serving) == [0, 1, 2]
    assert Event.objects.filter(org_id="test-org-2").count() == 3


def test_an_unmaterialized_replay_receipt_does_not_poison_the_receipt_reconciler(client, org, monkeypatch):
    """A replay admitted while the gate left v2_serving keeps a Receipt without children; the transport
    reconciler must neither crash on it nor turn it into a live Event, and must still reach other Receipts."""
    from connectors.inbound import replay as replay_module
    from connectors.serving.gates import NotServing

    event = _terminal_event(client)
    with monkeypatch.context() as patch:
        patch.setattr(replay_module, "replay_materialize",
                      lambda **kw: (_ for _ in ()).throw(NotServing("materialization deferred by the test")))
        result = replay_module.replay_submit(org=org, account_key=ACCOUNT, replay_id="replay-r",
                                             predecessor_event_id=event.pk, reason="r", principal="op",
                                             external_effects=SUPPRESS_EXTERNAL_EFFECTS)
    assert result.created and not result.materialized
    partial = _reserve_only([hubspot_event(77, 7700, 1000, "email", "p@x.io")])
    assert receipt_try_reconcile_one() is True  # must not raise
    assert _one_component_per_ordinal(partial) == [0]
    assert receipt_try_reconcile_one() is False
    assert ReceiptComponent.objects.filter(receipt_id=result.request.receipt_id).count() == 0
    assert Event.objects.filter(event_generation="live").count() == 2
    resumed = replay_module.replay_submit(org=org, account_key=ACCOUNT, replay_id="replay-r",
                                          predecessor_event_id=event.pk, reason="r", principal="op",
                                          external_effects=SUPPRESS_EXTERNAL_EFFECTS)
    assert resumed.materialized and Event.objects.filter(event_generation="replay-r").count() == 1


# === 2. strict_source_sequence, order_independent, settle ======================================
@pytest.fixture
def strict_org(billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path, variant_pack.strict(deadline_seconds=1))
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


@pytest.mark.parametrize("sequence", [-(1 << 63), -(1 << 63) + 1, -5, 0, (1 << 63) - 1])
def test_strict_extreme_sequence_numbers_never_crash_a_claim(client, strict_org, sequence, db_clock_advance):
    """eventId is the strict position: any accepted 64-bit value must not poison the lane or the worker."""
    assert post_signed(client, [hubspot_event(sequence, 811, 1000, "email", "edge@x.io")]).status_code == 202
    assert post_signed(client, [hubspot_event(1, 813, 1000, "email", "one@x.io")]).status_code == 202
    edge = Execution.objects.get(projection__event__source_locator="811")
    assert _run_all() == 1  # must not raise: the other lane runs, the edge one waits for its predecessor
    assert Execution.objects.get(projection__event__source_locator="813").state == "completed"
    edge.refresh_from_db()
    assert edge.state == "waiting_dependency"
    assert ExecutionDependency.objects.filter(execution=edge, state="waiting").count() == 1
    db_clock_advance(1.2)
    while dependency_try_expire_one():
        pass
    edge.refresh_from_db()
    assert edge.state == "quarantined" and edge.reason_code == reasons.SOURCE_SEQUENCE_GAP


def test_strict_out_of_range_position_is_quarantined_at_admission(client, strict_org):
    response = post_signed(client, [hubspot_event(1 << 63, 815, 1000, "email", "x@x.io"),
                                    hubspot_event(-(1 << 63) - 1, 816, 1000, "email", "y@x.io")])
    assert response.status_code == 202
    assert set(ReceiptComponent.objects.values_list("disposition", "reason_code")) == {
        ("quarantined", reasons.ITEM_IDENTITY_INVALID)}
    assert Event.objects.count() == 0


def test_duplicate_strict_positions_in_one_batch_apply_each_item_once_in_tie_breaker_order(client, strict_org):
    batch = [hubspot_event(1, 820, 1000, "email", "a@x.io"),
             hubspot_event(2, 820, 2000, "email", "b@x.io", subscription_id=301),
             hubspot_event(2, 820, 2000, "firstname", "B", subscription_id=302),
             hubspot_event(3, 820, 3000, "email", "c@x.io")]
    assert post_signed(client, batch).status_code == 202
    _run_all()
    assert list(Execution.objects.order_by("position").values_list("state", flat=True)) == ["completed"] * 4
    assert ApplicationResult.objects.count() == 4


def test_concurrent_claimers_on_one_strict_lane_take_one_claim(client, strict_org):
    post_signed(client, [hubspot_event(i, 821, 1000 * i, "email", f"{i}@x.io") for i in range(1, 6)])
    lane = OrderingLane.objects.get()
    claims, errors = run_at_once(*[lambda n=n: _claim_in_lane(ORG, ACCOUNT, lane.pk, f"w{n}") for n in range(6)])
    assert not errors, errors
    taken = [c for c in claims if c is not None]
    assert len(taken) == 1
    assert ExecutionAttempt.objects.filter(state="started").count() == 1
    execution_run(taken[0])
    _run_all()
    assert list(Execution.objects.order_by("position").values_list("state", flat=True)) == ["completed"] * 5
    assert ApplicationResult.objects.count() == 5


def test_many_expirers_racing_claimers_on_a_skip_gap_resolve_the_dependency_once(
        client, billing_sandbox, settings, monkeypatch, tmp_path, db_clock_advance):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.strict(deadline_seconds=1, disposition="skip"))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 822, 1000), hubspot_event(3, 822, 3000, "email", "three@x.io")])
    _run_all()
    dependency = ExecutionDependency.objects.get()
    db_clock_advance(1.2)
    post_signed(client, [hubspot_event(2, 822, 2000, "email", "two@x.io")])
    _results, errors = run_at_once(dependency_try_expire_one, dependency_try_expire_one, dependency_try_expire_one,
                                   _run_all, _run_all)
    assert not errors, errors
    _run_all()
    dependency.refresh_from_db()
    assert dependency.version == 2 and dependency.state in ("satisfied", "expired")
    third = Execution.objects.get(pk=dependency.execution_id)
    assert third.state in ("completed", "superseded")
    assert ApplicationResult.objects.filter(command_id=third.command_id).count() == (third.state == "completed")
    assert ExecutionAttempt.objects.filter(state="started").count() == 0
    assert ApplicationResult.objects.count() == Execution.objects.filter(state="completed").count()


def test_order_independent_concurrent_claimers_run_each_execution_exactly_once(
        client, billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path, variant_pack.independent)
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(i, 830 + i % 3, 1000 + i, "email", f"{i}@x.io") for i in range(1, 21)])

    def worker(n):
        def run():
            done = 0
            while execution_try_run_one(worker_id=f"w{n}"):
                done += 1
            return done
        return run

    done, errors = run_at_once(*[worker(n) for n in range(4)])
    assert not errors, errors
    assert sum(done) == 20
    assert set(Execution.objects.values_list("state", flat=True)) == {"completed"}
    assert ApplicationResult.objects.count() == 20
    assert ExecutionAttempt.objects.filter(state="completed").count() == 20


def test_claiming_a_lane_execution_through_the_unlaned_path_is_refused(client, org):
    post_signed(client, [hubspot_event(1, 840, 1000, "email", "a@x.io")])
    execution = Execution.objects.get()
    assert execution.lane_id is not None
    assert _claim_unlaned(ORG, execution.pk, "w") is None
    assert not ExecutionAttempt.objects.exists()


# === 3. ProjectionWindow ==========================================================================
@pytest.fixture
def batch_window_org(billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.window(policy="batch", close_after_seconds=3600, max_items=1000))
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def test_concurrent_admissions_opening_the_same_window_share_one_open_window(batch_window_org):
    def post(n):
        return lambda: post_signed(Client(), [hubspot_event(100 * n + k, 850 + k, 1000 + k, "email", f"{n}{k}@x.io")
                                              for k in range(5)]).status_code

    statuses, errors = run_at_once(*[post(n) for n in range(1, 7)])
    assert not errors, errors
    assert statuses == [202] * 6
    window = ProjectionWindow.objects.get()
    assert window.state == "open" and window.member_count == 30
    assert Projection.objects.filter(window=window).count() == 30 and not Execution.objects.exists()


def test_seal_racing_admission_of_a_full_window_mints_one_execution_per_window(
        billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.window(policy="batch", close_after_seconds=0, max_items=3))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)

    def post(n):
        return lambda: post_signed(Client(), [hubspot_event(10 * n + k, 860, 1000 * n + k, "email", f"{n}{k}@x.io")
                                              for k in range(2)]).status_code

    statuses, errors = run_at_once(post(1), post(2), post(3), window_try_close_one, window_try_close_one,
                                   window_try_close_one)
    assert not errors, errors
    assert statuses[:3] == [202] * 3
    while window_try_close_one():
        pass
    windows = list(ProjectionWindow.objects.all())
    assert all(w.state == "sealed" and w.open_key is None for w in windows)
    for w in windows:
        assert Execution.objects.filter(window=w).count() == 1
        assert Projection.objects.filter(window=w).count() == w.member_count <= 3
    assert Projection.objects.count() == 6 == sum(w.member_count for w in windows)
    _run_all()
    assert set(Execution.objects.values_list("state", flat=True)) == {"completed"}


def test_a_window_of_a_halted_gate_is_neither_sealed_nor_lets_the_halt_through(client, billing_sandbox, settings,
                                                                                monkeypatch, tmp_path):
    from connectors.serving.handoff import HaltRefused, halt_begin

    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.window(policy="batch", close_after_seconds=0, max_items=50))
    org = make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 870, 1000, "email", "a@x.io")])
    with pytest.raises(HaltRefused):
        halt_begin(org=org)
    halt_begin(org=org, force=True)
    assert window_try_close_one() is False
    window = ProjectionWindow.objects.get()
    assert window.state == "open" and not Execution.objects.exists()
    late = post_signed(client, [hubspot_event(2, 870, 2000, "email", "b@x.io")])
    assert late.status_code == 503 and window.member_count == 1


# === 4. V1 tombstones ============================================================================
@pytest.fixture
def drained_org(billing_sandbox) -> OrgScope:
    from tests.conftest import apply_service_configuration

    org = OrgScope(ORG)
    apply_service_configuration(org, billing_sandbox.base_url)
    for dst in ("halting_v1", "v1_stopped", "v1_drained"):
        with transaction.atomic(durable=True):
            gate = AccountServingGateStore.lock_by_account(ORG, ACCOUNT)
            gate_transition(gate=gate, dst=dst, evidence={"test": "v1 drained"}, reason_code="cutover_in_progress")
    return org


def _tombstone(body=None, **extra) -> dict:
    return {"account_key": ACCOUNT, "channel": "webhooks", "body": BATCH3 if body is None else body,
            "predecessor": {"protocol": "v1", "receipt_id": "v1-r-1", "work_item_ids": ["w1"]}, **extra}


@pytest.mark.parametrize("name,text", [
    ("not_json", "{not json"),
    ("not_utf8", b"\xff\xfe{}"),
    ("list", "[]"),
    ("empty", '{"tombstones": []}'),
    ("entry_not_object", '{"tombstones": [1]}'),
    ("no_predecessor", json.dumps({"tombstones": [{"account_key": ACCOUNT, "channel": "webhooks", "body": []}]})),
    ("account_not_text", json.dumps({"tombstones": [_tombstone(account_key=7)]})),
    ("account_spaced", json.dumps({"tombstones": [_tombstone(account_key=" crm-webhooks")]})),
    ("unknown_account", json.dumps({"tombstones": [_tombstone(account_key="nope")]})),
    ("unknown_channel", json.dumps({"tombstones": [_tombstone(channel="other")]})),
    ("body_object", json.dumps({"tombstones": [_tombstone(body={"a": 1})]})),
    ("body_empty", json.dumps({"tombstones": [_tombstone(body=[])]})),
    ("body_too_big", json.dumps({"tombstones": [_tombstone(body=[hubspot_event(i, 1, 1) for i in range(101)])]})),
    ("body_nan", '{"tombstones": [{"account_key": "crm-webhooks", "channel": "webhooks", "body": [NaN], '
                 '"predecessor": {}}]}'),
    ("body_huge_float", '{"tombstones": [{"account_key": "crm-webhooks", "channel": "webhooks", '
                        '"body": [{"eventId": 1e999}], "predecessor": {}}]}'),
    ("predecessor_nan", '{"tombstones": [{"account_key": "crm-webhooks", "channel": "webhooks", '
                        '"body": [{"eventId": 1}], "predecessor": {"x": NaN}}]}'),
    ("lone_surrogate", '{"tombstones": [{"account_key": "crm-webhooks", "channel": "webhooks", '
                       '"body": [{"eventId": "\\ud800"}], "predecessor": {}}]}'),
])
def test_malformed_tombstone_files_exit_with_a_code_and_import_nothing(drained_org, tmp_path, name, text):
    path = tmp_path / "tombstones.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    result = run_manage(["connector_v1_tombstones_import", "--org", ORG, str(path)], subprocess_env())
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip(), "no message"
    assert ReceiptAdmissionKey.objects.count() == 0


def test_tombstone_import_refused_in_every_gate_state_but_the_importable_ones(client, drained_org, tmp_path):
    from cutover.services import cutover_greenfield

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"tombstones": [_tombstone()]}))
    missing = tmp_path / "missing.json"
    with pytest.raises(CommandError, match="cannot read"):
        call_command("connector_v1_tombstones_import", "--org", ORG, str(missing))
    with pytest.raises(CommandError, match="tombstone_import_invalid"):
        call_command("connector_v1_tombstones_import", "--org", "other-org", str(path))
    cutover_greenfield(org=drained_org)
    assert post_signed(client, BATCH3).status_code == 202  # V2 admitted it first
    with pytest.raises(CommandError, match="tombstone_gate_state.*v2_serving"):
        call_command("connector_v1_tombstones_import", "--org", ORG, str(path))
    _halt_gate()
    with pytest.raises(CommandError, match="tombstone_gate_state.*halting_v2"):
        call_command("connector_v1_tombstones_import", "--org", ORG, str(path))
    key = ReceiptAdmissionKey.objects.get()
    assert key.receipt_id is not None and key.v1_tombstone in (None, {})


def test_conflicting_tombstone_reimport_fails_closed_and_changes_nothing(drained_org, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"tombstones": [_tombstone()]}))
    call_command("connector_v1_tombstones_import", "--org", ORG, str(path))
    before = list(ReceiptAdmissionKey.objects.values())
    other_predecessor = _tombstone()
    other_predecessor["predecessor"] = {"protocol": "v1", "receipt_id": "v1-r-2", "work_item_ids": ["w9"]}
    reordered = _tombstone(body=list(reversed(BATCH3)))  # same item set: the same transport key and digest
    volatile = _tombstone(body=[dict(e, attemptNumber=9) for e in BATCH3])
    for tombstone in (other_predecessor,):
        path.write_text(json.dumps({"tombstones": [tombstone]}))
        with pytest.raises(CommandError, match="tombstone_conflict"):
            call_command("connector_v1_tombstones_import", "--org", ORG, str(path))
    for tombstone in (reordered, volatile):
        path.write_text(json.dumps({"tombstones": [tombstone]}))
        call_command("connector_v1_tombstones_import", "--org", ORG, str(path))  # the same identity: a no-op
    assert list(ReceiptAdmissionKey.objects.values()) == before
    # a file whose second entry conflicts: the first entry is a no-op, the conflict names its index
    path.write_text(json.dumps({"tombstones": [_tombstone(), other_predecessor]}))
    with pytest.raises(CommandError, match=r"tombstones\[1\]"):
        call_command("connector_v1_tombstones_import", "--org", ORG, str(path))
    assert list(ReceiptAdmissionKey.objects.values()) == before


def test_tombstone_import_racing_greenfield_activation_and_admission_never_doubles_the_key(client, drained_org,
                                                                                           tmp_path):
    from cutover.services import cutover_greenfield

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"tombstones": [_tombstone()]}))

    def do_import():
        try:
            call_command("connector_v1_tombstones_import", "--org", ORG, str(path))
            return "imported"
        except CommandError as exc:
            return str(exc)

    def activate_then_post():
        cutover_greenfield(org=drained_org)
        return post_signed(Client(), BATCH3).status_code

    results, errors = run_at_once(do_import, activate_then_post)
    assert not errors, errors
    key = ReceiptAdmissionKey.objects.get()  # one key either way
    if results[0] == "imported" and key.receipt_id is None:
        assert results[1] == 200 and Receipt.objects.count() == 0 and Event.objects.count() == 0
    else:
        assert "v2_serving" in results[0] and results[1] == 202 and Event.objects.count() == 3


# === 5. replay ===================================================================================
def _operator(client, org_id: str = ORG):
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(f"op-{org_id}", password="pw", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=f"org:{org_id}")[0])
    client.force_login(user)
    return user


def _terminal_event(client) -> Event:
    assert post_signed(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")]).status_code == 202
    drain()
    return Event.objects.get(event_generation="live")


def _replay_body(event, **overrides) -> dict:
    return {"account_key": ACCOUNT, "replay_id": "replay-1", "predecessor_event_id": int(event.pk),
            "reason": "ticket 42", "external_effects": SUPPRESS_EXTERNAL_EFFECTS, **overrides}


@pytest.mark.parametrize("override", [
    {"external_effects": ["suppress_external_effects"]},
    {"external_effects": {"mode": "suppress_external_effects"}},
    {"external_effects": 1},
    {"external_effects": None},
    {"predecessor_event_id": 10 ** 30},
    {"predecessor_event_id": -1},
    {"predecessor_event_id": "1; DROP TABLE x"},
    {"predecessor_event_id": True},
    {"predecessor_event_id": 1.5},
    {"replay_id": "live"},
    {"replay_id": "x" * 81},
    {"replay_id": "a\x00b"},
    {"replay_id": ["replay-1"]},
    {"account_key": "nope"},
    {"account_key": ""},
    {"account_key": {"k": 1}},
    {"reason": ""},
    {"reason": " padded "},
    {"reason": "r" * 501},
    {"reason": None},
])
def test_bad_replay_requests_answer_a_stable_4xx_code_and_write_nothing(client, org, override):
    event = _terminal_event(client)
    _operator(client)
    response = client.post("/api/v2/replays/", _replay_body(event, **override), content_type="application/json")
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])
    assert isinstance(response.json().get("error"), str)
    assert ReplayRequest.objects.count() == 0 and Receipt.objects.filter(kind="replay").count() == 0


@pytest.mark.parametrize("raw,content_type", [
    (b"[1, 2]", "application/json"), (b"{", "application/json"), (b"\xff", "application/json"),
    (b'"text"', "application/json"), (b"null", "application/json"),
    (b"external_effects=suppress_external_effects&external_effects=x", "application/x-www-form-urlencoded"),
    (b"a=b", "text/plain"),
])
def test_unparseable_replay_bodies_never_5xx(client, org, raw, content_type):
    _operator(client)
    response = client.post("/api/v2/replays/", raw, content_type=content_type)
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])
    assert ReplayRequest.objects.count() == 0


@pytest.mark.parametrize("path", ["/api/v2/replays/crm-webhooks/%20x/", "/api/v2/replays/crm-webhooks/live/",
                                  "/api/v2/replays/%00/x/", "/api/v2/replays/crm-webhooks/" + "y" * 300 + "/",
                                  "/api/v2/replays/nope/replay-1/", "/api/v2/replays/crm-webhooks/%C3%A9%CC%81/"])
def test_replay_lookups_with_odd_ids_answer_4xx(client, org, path):
    _operator(client)
    response = client.get(path)
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])


def test_concurrent_submissions_of_one_replay_id_converge_on_one_generation(client, org):
    event = _terminal_event(client)
    users = [_operator(Client())]
    body = _replay_body(event)

    def submit():
        c = Client()
        c.force_login(users[0])
        response = c.post("/api/v2/replays/", body, content_type="application/json")
        return response.status_code, response.json().get("event_ids")

    results, errors = run_at_once(*[submit] * 5)
    assert not errors, errors
    assert sorted(s for s, _ in results) == [200, 200, 200, 200, 201]
    assert len({tuple(ids) for _, ids in results}) == 1
    assert ReplayRequest.objects.count() == 1 and Receipt.objects.filter(kind="replay").count() == 1
    assert Event.objects.filter(event_generation="replay-1").count() == 1
    assert Execution.objects.filter(projection__event__event_generation="replay-1").count() == 1


def test_replay_racing_a_forced_halt_leaves_either_nothing_or_a_resumable_request(client, org):
    from connectors.inbound.replay import replay_lookup, replay_submit
    from connectors.serving.gates import NotServing
    from connectors.serving.handoff import halt_begin

    event = _terminal_event(client)

    def submit():
        try:
            return replay_submit(org=org, account_key=ACCOUNT, replay_id="replay-h", predecessor_event_id=event.pk,
                                 reason="r", principal="op", external_effects=SUPPRESS_EXTERNAL_EFFECTS)
        except NotServing as exc:
            return exc

    results, errors = run_at_once(submit, lambda: halt_begin(org=org, force=True))
    assert not errors, errors
    outcome = results[0]
    rows = (ReplayRequest.objects.count(), Event.objects.filter(event_generation="replay-h").count(),
            Execution.objects.filter(projection__event__event_generation="replay-h").count())
    if isinstance(outcome, NotServing):
        assert rows == (0, 0, 0)
    elif outcome.materialized:
        assert rows == (1, 1, 1)
    else:
        assert rows == (1, 0, 0)
        looked = replay_lookup(org=org, account_key=ACCOUNT, replay_id="replay-h")
        assert looked.materialized is False and looked.event_ids == []


@pytest.mark.parametrize("args,code", [
    (["--event", "0"], 2), (["--event", "-5"], 2), (["--event", str(10 ** 25)], 5),
    (["--event", "1", "--reason", " x", "--principal", "op"], 2),
    (["--event", "1", "--reason", "x", "--principal", " op"], 2),
    (["--event", "1", "--reason", "x", "--principal", "op", "--mode", ""], 2),
    (["--lookup", "--replay-id", "never"], 5),
])
def test_replay_command_bad_input_exits_with_its_documented_code(client, org, args, code):
    _terminal_event(client)
    base = ["connector_replay", "--org", ORG, "--account", ACCOUNT, "--replay-id", "replay-c"]
    if "--event" in args and "--reason" not in args:
        args = args + ["--reason", "x", "--principal", "op"]
    result = run_manage(base + args, subprocess_env())
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert ReplayRequest.objects.count() == 0


# === 6. stream poller ============================================================================
def _publish(sandbox, prefix: str, n: int) -> list[int]:
    from packs.salesforce_cdc import change_event

    return sandbox.publish([change_event(change_type="CREATE", record_ids=[f"003{prefix}{i:03d}"],
                                         transaction_key=f"tx-{prefix}-{i}", sequence=1,
                                         fields={"LastName": f"{prefix}{i}"}) for i in range(n)])


def test_stop_and_resume_racing_pollers_never_skip_or_double_an_envelope(stream_org):
    from connectors.inbound.stream_poll import stream_cursor_set_state, stream_poll_once

    _publish(stream_org.stream, "R", 12)
    target = stream_target()

    def poll():
        results = []
        for _ in range(6):
            results.append(stream_poll_once(target))
        return results

    def flap():
        for _ in range(5):
            stream_cursor_set_state(target, state="stopped")
            stream_cursor_set_state(target, state="active")
        return True

    _results, errors = run_at_once(poll, poll, flap)
    assert not errors, errors
    stream_cursor_set_state(target, state="active")
    while stream_poll_once(target).fetched:
        pass
    assert Receipt.objects.filter(account_key=STREAM_ACCOUNT).count() == 12
    assert ReceiptAdmissionKey.objects.filter(account_key=STREAM_ACCOUNT).count() == 12
    assert Event.objects.filter(account_key=STREAM_ACCOUNT).count() == 12
    assert Event.objects.filter(account_key=STREAM_ACCOUNT).values("source_event_key").distinct().count() == 12


@pytest.mark.parametrize("args,fragment", [
    (["--account", "nope"], "unknown_stream"),
    (["--account", "crm-webhooks"], "unknown_stream"),
    (["--account", STREAM_ACCOUNT, "--route", "nope"], "unknown_stream"),
    (["--account", STREAM_ACCOUNT, "--max-batches", "-1"], "--max-batches"),
    (["--account", STREAM_ACCOUNT, "--stop", "--resume"], "not allowed"),
    (["--account", STREAM_ACCOUNT, "--max-batches", "x"], "invalid int"),
    (["--account", ""], "invalid_identity"),
])
def test_stream_poll_command_bad_input_exits_with_a_message_and_moves_nothing(stream_org, args, fragment):
    result = run_manage(["connector_stream_poll", *args, "--once"], subprocess_env(), timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and fragment in result.stderr, result.stderr[-2000:]
    assert not StreamCursor.objects.exclude(cursor=None).exists() and Receipt.objects.count() == 0


def test_stream_status_and_stop_still_answer_while_the_account_is_halted(stream_org):
    """Stopping a poller must not need a serving gate (operators stop pollers to halt)."""
    target = stream_target()
    from connectors.inbound.stream_poll import stream_cursor_for

    stream_cursor_for(target)
    _halt_gate(STREAM_ACCOUNT)
    status = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--status"], subprocess_env())
    assert "Traceback" not in status.stderr
    assert status.returncode in (0, 1)
    assert "not_serving" in status.stderr or '"state": "active"' in status.stdout


def test_a_poller_killed_after_its_fetch_loses_and_doubles_nothing(stream_org):
    _publish(stream_org.stream, "K", 4)
    env = subprocess_env(NEXUS_FAILPOINTS="stream.after_fetch")
    crashed = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--once"], env, timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert Receipt.objects.count() == 0 and StreamCursor.objects.get().cursor is None
    ok = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--until-idle"], subprocess_env())
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert Receipt.objects.count() == 4 and Event.objects.count() == 4


# === 7. ingress bad input on gates in odd states =================================================
@pytest.mark.parametrize("state_path", [("halting_v1",), ("halting_v1", "v1_stopped"),
                                        ("halting_v1", "v1_stopped", "v1_drained")])
def test_ingress_to_a_gate_outside_v2_serving_is_a_clean_503_and_writes_nothing(client, billing_sandbox,
                                                                                state_path):
    from tests.conftest import apply_service_configuration

    apply_service_configuration(OrgScope(ORG), billing_sandbox.base_url)
    for dst in state_path:
        with transaction.atomic(durable=True):
            gate = AccountServingGateStore.lock_by_account(ORG, ACCOUNT)
            gate_transition(gate=gate, dst=dst, evidence={"t": 1}, reason_code="cutover_in_progress")
    response = post_signed(client, BATCH3)
    assert response.status_code == 503 and response.json()["error"] == "not_serving"
    assert Receipt.objects.count() == 0 and ReceiptAdmissionKey.objects.count() == 0


# === 5b. replay of a window member =================================================================
def test_a_member_of_a_still_open_window_cannot_be_replayed(client, batch_window_org):
    """Its application is still pending (the window has not sealed): the predecessor is not terminal."""
    from connectors.inbound.replay import ReplayPredecessorNotTerminal, replay_submit

    assert post_signed(client, [hubspot_event(1, 880, 1000, "email", "w@x.io")]).status_code == 202
    member = Event.objects.get()
    assert ProjectionWindow.objects.get().state == "open" and not Execution.objects.exists()
    with pytest.raises(ReplayPredecessorNotTerminal):
        replay_submit(org=batch_window_org, account_key=ACCOUNT, replay_id="replay-w", predecessor_event_id=member.pk,
                      reason="r", principal="op", external_effects=SUPPRESS_EXTERNAL_EFFECTS)
    assert ReplayRequest.objects.count() == 0 and Event.objects.count() == 1


def test_a_member_of_a_sealed_window_replays_only_once_its_window_execution_is_terminal(client, batch_window_org):
    from connectors.inbound.replay import ReplayPredecessorNotTerminal, replay_submit
    from connectors.inbound.windows import seal
    from connectors.serving.gates import serving_lock

    post_signed(client, [hubspot_event(1, 881, 1000), hubspot_event(2, 881, 2000, "email", "s@x.io")])
    first = Event.objects.order_by("id").first()  # not the window's chosen (greatest) member
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=ORG, account_key=ACCOUNT)
        window = ProjectionWindow.objects.select_for_update().get()
        seal(window, ctx.epoch, ctx.account)
    submit = lambda rid: replay_submit(org=batch_window_org, account_key=ACCOUNT, replay_id=rid,
                                       predecessor_event_id=first.pk, reason="r", principal="op",
                                       external_effects=SUPPRESS_EXTERNAL_EFFECTS)
    with pytest.raises(ReplayPredecessorNotTerminal):
        submit("replay-early")
    _run_all()
    assert Execution.objects.get(window=window).state == "completed"
    result = submit("replay-late")
    assert result.materialized and result.request.predecessor_result_digest == \
        Execution.objects.get(window=window).result_digest


# === 8. a force-halted org must not starve the workers of every other org ==========================
ORG2, ACCOUNT2 = "test-org-2", "crm-webhooks-2"


def _second_serving_org() -> OrgScope:
    from connectors.serving.gates import service_configuration_apply
    from connectors.serving.generations import credential_publish
    from cutover.services import cutover_greenfield

    other = OrgScope(ORG2)
    credential_publish(org=other, document={"account_key": ACCOUNT2, "credential_ref": "webhook_secret",
                                            "version": "test-1", "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}})
    service_configuration_apply(org=other, document={"accounts": [
        {"account_key": ACCOUNT2, "pack": "hubspot", "routes": ["contacts.webhook"],
         "credentials": {"webhook_secret": "test-1"}}]})
    cutover_greenfield(org=other)
    return other


@pytest.mark.parametrize("variant", ["latest", "independent", "window", "strict"])
def test_work_of_a_force_halted_org_does_not_starve_another_orgs_workers(client, billing_sandbox, settings,
                                                                        monkeypatch, tmp_path, variant, db_clock_advance):
    from connectors.serving.handoff import halt_begin

    mutate = {"latest": None, "independent": variant_pack.independent,
              "window": variant_pack.window(policy="grouped", grouping=["objectId"], close_after_seconds=0,
                                            max_items=50),
              "strict": variant_pack.strict(deadline_seconds=1)}[variant]
    if mutate is not None:
        variant_pack.use_variant(settings, monkeypatch, tmp_path, mutate)
    org = make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _second_serving_org()
    # 25 pieces of pending work (lanes, executions, windows or gap dependencies) in the first org
    first = [hubspot_event(5 + k if variant == "strict" else 1000 + k, 4000 + k, 1000 + k, "email", f"{k}@x.io")
             for k in range(25)]
    assert post_signed(client, first).status_code == 202
    if variant == "strict":
        assert _run_all() == 0 and _run_all() == 0  # one pass visits a page of lanes; the next the rest
        assert ExecutionDependency.objects.filter(org_id=ORG).count() == 25
    halt_begin(org=org, force=True)  # their org stops serving: none of it can move now
    second = [hubspot_event(5 if variant == "strict" else 1, 4900, 1000, "email", "other@x.io")]
    assert post_signed(client, second, account=ACCOUNT2).status_code == 202
    if variant == "window":
        assert window_try_close_one() is True
        assert ProjectionWindow.objects.get(org_id=ORG2).state == "sealed"
    elif variant == "strict":
        assert _run_all() == 0
        db_clock_advance(1.2)
        assert dependency_try_expire_one() is True
        assert ExecutionDependency.objects.get(org_id=ORG2).state == "expired"
    else:
        claim = execution_try_claim_one(worker_id="w")
        assert claim is not None and claim.org_id == ORG2
    assert not Execution.objects.filter(org_id=ORG).exclude(state__in=("ready", "waiting_dependency")).exists()


# === 3b. windows on ordered lanes ===================================================================
def _window_on(ordering_mutate, **spec):
    def mutate(route: dict) -> None:
        if ordering_mutate is not None:
            ordering_mutate(route)
        route["window"] = spec
    return mutate


def test_a_batch_window_on_a_latest_position_route_never_loses_an_earlier_windows_members(
        client, billing_sandbox, settings, monkeypatch, tmp_path):
    """Each batch window applies every member; a later window on the same lane must not supersede it."""
    from connectors.contracts.pack_document import PackError

    try:
        variant_pack.use_variant(settings, monkeypatch, tmp_path,
                                 _window_on(None, policy="batch", close_after_seconds=3600, max_items=2))
        make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    except PackError:
        return  # refusing the combination at publication is a defense too
    assert post_signed(client, [hubspot_event(1, 890, 1000, "email", "a@x.io"),
                                hubspot_event(2, 891, 500, "email", "b@x.io")]).status_code == 202
    assert post_signed(client, [hubspot_event(3, 890, 2000, "email", "c@x.io"),
                                hubspot_event(4, 892, 600, "email", "d@x.io")]).status_code == 202
    assert ProjectionWindow.objects.filter(state="sealed").count() == 2
    _run_all()
    from nexusflow.records.models import Record

    emails = sorted(r.fields.get("email") for r in Record.objects.all())
    assert emails == ["b@x.io", "c@x.io", "d@x.io"], emails


def test_a_latest_window_on_a_strict_route_does_not_strand_its_members(client, billing_sandbox, settings,
                                                                       monkeypatch, tmp_path, db_clock_advance):
    from connectors.contracts.pack_document import PackError

    try:
        variant_pack.use_variant(settings, monkeypatch, tmp_path,
                                 _window_on(variant_pack.strict(deadline_seconds=1), policy="latest",
                                            close_after_seconds=3600, max_items=3))
        make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    except PackError:
        return
    assert post_signed(client, [hubspot_event(1, 893, 1000), hubspot_event(2, 893, 2000, "email", "2@x.io"),
                                hubspot_event(3, 893, 3000, "email", "3@x.io")]).status_code == 202
    assert ProjectionWindow.objects.get().state == "sealed"
    _run_all()
    db_clock_advance(1.2)
    while dependency_try_expire_one():
        pass
    _run_all()
    assert Execution.objects.get().state == "completed"


def test_settle_windows_on_a_latest_position_lane_apply_the_newest_value(client, billing_sandbox, settings,
                                                                        monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             _window_on(None, policy="settle", close_after_seconds=3600, max_items=2))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 894, 1000, "email", "1@x.io"), hubspot_event(2, 894, 2000, "email", "2@x.io")])
    post_signed(client, [hubspot_event(4, 894, 4000, "email", "4@x.io"), hubspot_event(3, 894, 3000, "email", "3@x.io")])
    assert ProjectionWindow.objects.filter(state="sealed").count() == 2
    assert OrderingLane.objects.count() == 1
    _run_all()
    from nexusflow.records.models import Record

    assert Record.objects.get().fields["email"] == "4@x.io"
    assert set(Execution.objects.values_list("state", flat=True)) <= {"completed", "superseded"}
    assert Execution.objects.filter(state="completed").count() >= 1


def test_pack_validation_refuses_windows_that_do_not_fit_the_ordering_contract():
    from connectors.contracts.ordering import validate_contract
    from connectors.contracts.windows import validate_window, validate_window_ordering

    latest = {"contract": "latest_source_position", "partition": ["objectId"], "position": ["eventId"],
              "tie_breaker": "eventId", "comparator_version": "1"}
    strict = dict(variant_pack.STRICT)
    independent = dict(variant_pack.INDEPENDENT)
    for ordering in (latest, strict, independent):
        validate_contract(ordering)
    ok = [({"policy": "latest", "close_after_seconds": 1}, latest), ({"policy": "settle", "close_after_seconds": 1},
                                                                      latest)]
    ok += [({"policy": p, "close_after_seconds": 1, **({"grouping": ["objectId"]} if p == "grouped" else {})},
            independent) for p in ("latest", "settle", "batch", "grouped")]
    for window, ordering in ok:
        validate_window_ordering(validate_window(window), ordering)
    refused = [({"policy": "batch", "close_after_seconds": 1}, latest),
               ({"policy": "grouped", "grouping": ["objectId"], "close_after_seconds": 1}, latest),
               ({"policy": "latest", "grouping": ["portalId"], "close_after_seconds": 1}, latest),
               ({"policy": "latest", "close_after_seconds": 1}, strict)]
    for window, ordering in refused:
        with pytest.raises(ValueError):
            validate_window_ordering(validate_window(window), ordering)


# === 5c. redelivery after a successor epoch ========================================================
def _switch_to_successor(org, billing_url, monkeypatch):
    from connectors.serving.handoff import halt_begin, halt_try_complete, handoff_stage, successor_activate
    from tests.connectors.serving.test_successor_handoff import successor_epoch

    successor = successor_epoch(org, billing_url, monkeypatch)
    halt_begin(org=org)
    assert halt_try_complete(org=org).all_halted
    handoff_stage(org=org, successor_id=successor.pk)
    successor_activate(org=org, successor_id=successor.pk)
    return successor


def test_a_redelivery_of_a_predecessor_epoch_delivery_resolves_its_receipt_after_the_switch(
        client, org, billing_sandbox, monkeypatch):
    """Providers keep retrying for hours: a complete Receipt of the predecessor epoch answers 200, never 503."""
    first = post_signed(client, BATCH3)
    assert first.status_code == 202
    _run_all()
    successor = _switch_to_successor(org, billing_sandbox.base_url, monkeypatch)
    again = post_signed(client, [dict(e, attemptNumber=5) for e in BATCH3])
    assert (again.status_code, again.json()) == (200, {"receipt_id": first.json()["receipt_id"],
                                                       "status": "redelivered"})
    assert Receipt.objects.count() == 1 and Event.objects.count() == 3
    assert not Event.objects.filter(epoch_id=successor.pk).exists()


def test_a_stream_batch_admitted_before_the_switch_does_not_block_the_cursor_after_it(stream_org, monkeypatch):
    """A poll that admitted its envelopes but did not advance its cursor refetches them under the successor."""
    from connectors.inbound.stream_poll import stream_poll_once
    from connectors.serving.gates import epoch_prepare, epoch_verify, service_configuration_apply
    from connectors.serving.handoff import halt_begin, halt_try_complete, handoff_stage, successor_activate
    from tests.stream_support import stream_service_document

    _publish(stream_org.stream, "S", 3)
    with monkeypatch.context() as patch:  # the poll admits its batch, then loses the cursor advance
        patch.setattr("connectors.inbound.stream_poll.stream_cursor_advance", lambda *a, **k: False)
        assert stream_poll_once(stream_target()).receipts_created == 3
    drain()
    from connectors.serving.generations import credential_publish

    credential_publish(org=stream_org.org, document={
        "account_key": STREAM_ACCOUNT, "credential_ref": "stream_token", "version": "test-next",
        "secret": {"from_env": "NEXUS_TEST_STREAM_TOKEN"}, "transport": {"scheme": "bearer"}})
    document = stream_service_document(stream_org.billing.base_url, stream_org.stream.base_url)
    document["accounts"][2]["credentials"]["stream_token"] = "test-next"
    service_configuration_apply(org=stream_org.org, document=document)
    successor = epoch_verify(org=stream_org.org, epoch_id=epoch_prepare(org=stream_org.org).pk)
    halt_begin(org=stream_org.org)
    assert halt_try_complete(org=stream_org.org).all_halted
    handoff_stage(org=stream_org.org, successor_id=successor.pk)
    successor_activate(org=stream_org.org, successor_id=successor.pk)
    result = stream_poll_once(stream_target())  # must not raise not_serving forever
    assert result.fetched == 3 and result.receipts_resolved == 3 and result.advanced
    assert Receipt.objects.filter(account_key=STREAM_ACCOUNT).count() == 3


# === 7b. values that pass the schema but not the columns ==============================================
@pytest.mark.parametrize("bad", [{"occurredAt": 10 ** 20}, {"occurredAt": -(10 ** 20)}, {"tie": "t" * 81}])
def test_an_item_whose_facts_do_not_fit_their_columns_is_quarantined_and_its_batch_admitted(
        client, billing_sandbox, settings, monkeypatch, tmp_path, bad):
    def mutate(route: dict) -> None:
        variant_pack.strict()(route)
        route["ordering"]["tie_breaker"] = "tie"
    variant_pack.use_variant(settings, monkeypatch, tmp_path, mutate)
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    good = [dict(hubspot_event(k, 960, 1000 + k, "email", f"{k}@x.io"), tie=str(k)) for k in (1, 2)]
    poison = {**hubspot_event(3, 961, 1000, "email", "p@x.io"), "tie": "3", **bad}
    response = post_signed(client, [good[0], poison, good[1]])
    assert response.status_code == 202, response.content
    receipt = Receipt.objects.get()
    assert _one_component_per_ordinal(receipt.pk) == [0, 1, 2]
    dispositions = dict(ReceiptComponent.objects.values_list("ordinal", "disposition"))
    assert dispositions == {0: "event", 1: "quarantined", 2: "event"}
    assert ReceiptComponent.objects.get(ordinal=1).reason_code == reasons.ITEM_IDENTITY_INVALID
    assert receipt_try_reconcile_one() is False
    assert _run_all() == 2


def test_a_receipt_that_cannot_materialize_does_not_stop_the_reconciler_reaching_the_next(org, monkeypatch):
    """Defense in depth: one Receipt failing with a column error is logged and skipped, not retried first forever."""
    from django.db import DataError

    from connectors.inbound import admission as inbound

    poisoned = _reserve_only([hubspot_event(1, 970, 1000, "email", "a@x.io")])
    healthy = _reserve_only([hubspot_event(2, 971, 1000, "email", "b@x.io")])
    real = inbound.receipt_materialize

    def materialize(*, org_id, receipt_id, items=None):
        if receipt_id == poisoned:
            raise DataError("(1406, \"Data too long for column 'tie_breaker'\")")
        return real(org_id=org_id, receipt_id=receipt_id, items=items)

    monkeypatch.setattr(inbound, "receipt_materialize", materialize)
    assert receipt_try_reconcile_one() is True
    assert _one_component_per_ordinal(healthy) == [0] and _one_component_per_ordinal(poisoned) == []


# === 4b. a tombstone for a pulled route ================================================================
def test_a_v1_tombstone_of_a_pulled_envelope_is_refused_or_matches_what_the_stream_serves(
        billing_sandbox, cdc_sandbox, tmp_path):
    """A tombstone imported with another transport key than the stream derives would let V2 apply it again."""
    import os

    from connectors.inbound.stream_poll import stream_poll_once
    from packs.salesforce_cdc import change_event
    from tests.conftest import CREDENTIAL_DOCUMENTS, ROOT, SECRET_VERSION
    from tests.stream_support import STREAM_TOKEN, stream_service_document

    assert os.environ["NEXUS_TEST_STREAM_TOKEN"] == STREAM_TOKEN  # set by the cdc_sandbox fixture
    service = tmp_path / "service.json"
    service.write_text(json.dumps(stream_service_document(billing_sandbox.base_url, cdc_sandbox.base_url)))
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps(CREDENTIAL_DOCUMENTS + [
        {"account_key": STREAM_ACCOUNT, "credential_ref": "stream_token", "version": SECRET_VERSION,
         "secret": {"from_env": "NEXUS_TEST_STREAM_TOKEN"}, "transport": {"scheme": "bearer"}}]))
    with open(os.devnull, "w") as sink:
        call_command("connector_pack_publish", *(str(ROOT / "packs" / k / "pack.json")
                                                 for k in ("hubspot", "billing", "salesforce_cdc")), stdout=sink)
        call_command("connector_credential_publish", "--org", ORG, str(credentials), stdout=sink)
        call_command("connector_config_apply", "--org", ORG, str(service), stdout=sink)
    for dst in ("halting_v1", "v1_stopped", "v1_drained"):
        with transaction.atomic(durable=True):
            gate = AccountServingGateStore.lock_by_account(ORG, STREAM_ACCOUNT)
            gate_transition(gate=gate, dst=dst, evidence={"test": "v1 drained"}, reason_code="cutover_in_progress")
    cdc_sandbox.publish([change_event(change_type="CREATE", record_ids=["003V1"], transaction_key="tx-v1",
                                      sequence=1, fields={"LastName": "V1"})])
    envelope = cdc_sandbox._state.events[0]  # exactly what V1 pulled and accepted
    path = tmp_path / "tombstones.json"
    imported = False
    for body in (envelope, [envelope]):
        path.write_text(json.dumps({"tombstones": [{"account_key": STREAM_ACCOUNT, "channel": "contact-changes",
                                                    "body": body, "predecessor": {"protocol": "v1",
                                                                                  "receipt_id": "v1-s-1"}}]}))
        try:
            call_command("connector_v1_tombstones_import", "--org", ORG, str(path))
            imported = True
        except CommandError as exc:
            assert "tombstone_import_invalid" in str(exc)
    from cutover.services import cutover_greenfield

    cutover_greenfield(org=OrgScope(ORG))
    result = stream_poll_once(stream_target())
    assert result.fetched == 1 and result.advanced
    if imported:  # V1 accepted this envelope: V2 must not admit it again
        assert result.receipts_created == 0
        assert Event.objects.filter(account_key=STREAM_ACCOUNT).count() == 0


# === more races =======================================================================================
def test_a_full_window_seals_inside_its_batch_and_the_rest_of_the_batch_opens_successors(
        client, billing_sandbox, settings, monkeypatch, tmp_path):
    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.window(policy="batch", close_after_seconds=3600, max_items=3))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    assert post_signed(client, [hubspot_event(k, 990 + k, 1000 + k, "email", f"{k}@x.io")
                                for k in range(1, 8)]).status_code == 202
    windows = list(ProjectionWindow.objects.order_by("id"))
    assert [(w.state, w.member_count) for w in windows] == [("sealed", 3), ("sealed", 3), ("open", 1)]
    assert Execution.objects.count() == 2 and ProjectionWindow.objects.filter(state="open").count() == 1


def test_overlapping_batch_and_reconciler_on_a_partial_receipt_create_each_event_once(client, org):
    partial = _reserve_only(BATCH3)  # crashed before its children
    overlapping = BATCH3[1:] + [hubspot_event(4, 701, 4000, "lastname", "L")]
    results, errors = run_at_once(lambda: post_signed(Client(), overlapping).status_code, receipt_try_reconcile_one,
                                  lambda: post_signed(Client(), BATCH3).status_code)
    assert not errors, errors
    assert results[0] == 202 and results[2] == 200
    assert Event.objects.count() == 4 and Event.objects.values("source_event_key").distinct().count() == 4
    assert _one_component_per_ordinal(partial) == [0, 1, 2]
    dispositions = ReceiptComponent.objects.values_list("disposition", flat=True)
    assert sorted(dispositions) == ["duplicate", "duplicate", "event", "event", "event", "event"]


def test_halt_racing_admissions_never_halts_over_a_partial_receipt(org):
    from connectors.serving.handoff import HaltRefused, halt_begin

    def post(n):
        return lambda: post_signed(Client(), [hubspot_event(100 * n + k, 600 + n, 1000 + k, "email", f"{k}@x.io")
                                              for k in range(20)]).status_code

    def halt():
        try:
            return halt_begin(org=org, force=True)
        except HaltRefused as exc:
            return exc

    results, errors = run_at_once(post(1), post(2), post(3), halt)
    assert not errors, errors
    assert all(s in (202, 503) for s in results[:3]), results
    for receipt in Receipt.objects.all():  # every Receipt is complete, or the gate still waits for it
        complete = ReceiptComponent.objects.filter(receipt=receipt).count() == receipt.component_count
        assert complete or AccountServingGate.objects.get(account_key=ACCOUNT).state != "v2_halted"
    from connectors.serving.handoff import halt_try_complete

    report = halt_try_complete(org=org)
    partial = [r.pk for r in Receipt.objects.all()
               if ReceiptComponent.objects.filter(receipt=r).count() != r.component_count]
    if partial:
        assert report.gates[ACCOUNT][0] == "halting_v2"


@pytest.mark.parametrize("argv", [
    ["connector_replay", "--org", "", "--account", ACCOUNT, "--replay-id", "r", "--lookup"],
    ["connector_replay", "--org", ORG, "--account", " x", "--replay-id", "r", "--lookup"],
    ["connector_replay", "--org", ORG, "--account", ACCOUNT, "--replay-id", "\u200b", "--lookup"],
    ["connector_replay", "--org", ORG, "--account", "nope", "--replay-id", "r", "--event", "1", "--reason", "x",
     "--principal", "op"],
    ["connector_stream_poll", "--account", ACCOUNT, "--route", "", "--status"],
    ["connector_stream_poll", "--account", "x" * 300, "--status"],
    ["connector_v1_tombstones_import", "--org", "", "/nonexistent.json"],
])
def test_odd_command_arguments_raise_a_command_error_with_a_code(org, argv):
    from io import StringIO

    with pytest.raises(CommandError) as raised:
        call_command(*argv, stdout=StringIO(), stderr=StringIO())
    assert str(raised.value).split(":")[0].strip() and raised.value.returncode != 0


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_idle_sleep_is_refused_up_front(stream_org, value):
    result = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--idle-sleep", value,
                         "--max-batches", "1"], subprocess_env(), timeout=20)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "--idle-sleep" in result.stderr
