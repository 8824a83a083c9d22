"""Operator-authorized replay (seed 003 "Replay identity and predecessor", "Replay and external effects").

Proofs: S003-RP-12 (convergence, mismatch, distinct generations, predecessor
unchanged), S003-RP-13 (replay admission and materialization serialize with
halt on the gate), S003-RP-34 (replay half: Runtime refuses outbound
authoring from a replay execution), S003-RP-07 (replay parts: a corrupt gate
naming a verified epoch, a stale target epoch), and replayed positions at or
below the lane high-water being superseded without Runtime.

Races use real concurrent transactions on their own connections; a thread is
released only after the other one is seen waiting for the gate row lock.
"""
from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.forms.models import model_to_dict

from connectors.inbound import replay as replay_module
from connectors.inbound.executions import build_runtime_command, execution_try_claim_one
from connectors.inbound.replay import (
    ReplayMismatch,
    ReplayPredecessorNotTerminal,
    ReplayTargetNotServing,
    replay_lookup,
    replay_materialize,
    replay_submit,
)
from connectors.models import (
    AccountServingGate,
    Event,
    Execution,
    OrderingDecision,
    Projection,
    Receipt,
    ReceiptComponent,
    ReplayRequest,
    ServingEpoch,
)
from connectors.reasons import ITEM_SCHEMA_INVALID, SUPERSEDED_BY_NEWER_POSITION
from connectors.serving.gates import NotServing, gate_transition
from connectors.store import AccountServingGateStore, ExecutionStore
from cutover.reasons import CUTOVER_IN_PROGRESS
from nexusflow.flows.models import FlowRun, FlowStepAttempt
from nexusflow.kernel.digests import PROFILE_V2
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.services import record_create
from runtime_outbox.models import ApplicationResult, OutboundCommand, ReplayRecordWrite
from runtime_outbox.replay_guard import (
    SUPPRESS_EXTERNAL_EFFECTS,
    ReplayModeUnsupported,
    ReplayOutboundRefused,
    suppressed_external_effects,
)
from runtime_outbox.services import application_command_submit, outbound_command_author
from tests.conftest import ORG, drain, hubspot_event, make_serving_org, post_signed, run_manage, subprocess_env
from tests.kernel import rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

ACCOUNT = "crm-webhooks"
SCOPE = OrgScope(ORG)


# --- helpers -----------------------------------------------------------------------
def _admit_and_drain(client, events) -> list[Event]:
    assert post_signed(client, events).status_code == 202
    drain()
    return list(Event.objects.filter(org_id=ORG, event_generation="live").order_by("id"))


def _submit(replay_id: str, event: Event, **overrides):
    values = {"org": SCOPE, "account_key": ACCOUNT, "replay_id": replay_id, "predecessor_event_id": event.pk,
              "reason": "support ticket 42", "principal": "operator-1",
              "external_effects": SUPPRESS_EXTERNAL_EFFECTS, **overrides}
    return replay_submit(**values)


def _snapshot(event: Event) -> dict:
    """Every predecessor row as stored, to prove it stays byte-identical."""
    projection = Projection.objects.get(org_id=ORG, event=event)
    executions = Execution.objects.filter(org_id=ORG, projection=projection).order_by("id")
    receipt = Receipt.objects.get(org_id=ORG, pk=event.receipt_id)
    return {
        "event": model_to_dict(Event.objects.get(org_id=ORG, pk=event.pk)),
        "receipt": model_to_dict(receipt),
        "components": [model_to_dict(c) for c in ReceiptComponent.objects.filter(receipt=receipt).order_by("id")],
        "projection": model_to_dict(projection),
        "executions": [(model_to_dict(e), e.version) for e in executions],
    }


def _replay_rows(replay_id: str) -> dict:
    return {
        "requests": ReplayRequest.objects.filter(org_id=ORG, replay_id=replay_id).count(),
        "receipts": Receipt.objects.filter(org_id=ORG, kind="replay", replay_request__replay_id=replay_id).count(),
        "events": Event.objects.filter(org_id=ORG, event_generation=replay_id).count(),
        "projections": Projection.objects.filter(org_id=ORG, event__event_generation=replay_id).count(),
        "executions": Execution.objects.filter(org_id=ORG, projection__event__event_generation=replay_id).count(),
    }


def _halt_gate() -> None:
    with transaction.atomic(durable=True):
        gate = AccountServingGateStore.lock_by_account(ORG, ACCOUNT)
        gate_transition(gate=gate, dst="halting_v2", evidence={"halt": "replay race test"},
                        reason_code=CUTOVER_IN_PROGRESS)


def _wait_until_someone_waits_for_the_gate(timeout: float = 20) -> None:
    """Block until another connection of this database waits on a gate row lock."""
    database = connection.settings_dict["NAME"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID() "
                           "AND INFO LIKE %s", [database, "%connectors_accountservinggate%FOR UPDATE%"])
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)
    raise AssertionError("no transaction ever waited for the gate lock")


def _in_thread(fn, results: list) -> threading.Thread:
    def run():
        try:
            results.append(fn())
        except Exception as exc:  # the test inspects what happened
            results.append(exc)
        finally:
            connections.close_all()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _halt_holding_the_gate_until_a_waiter(results: list) -> threading.Thread:
    """Lock the gate, wait until another transaction queues on it, then halt and commit.

    Returns once the gate row is locked, so work started afterwards queues behind the halt.
    """
    locked = threading.Event()

    def halt():
        with transaction.atomic(durable=True):
            gate = AccountServingGateStore.lock_by_account(ORG, ACCOUNT)
            locked.set()
            _wait_until_someone_waits_for_the_gate()
            gate_transition(gate=gate, dst="halting_v2", evidence={"halt": "replay race test"},
                            reason_code=CUTOVER_IN_PROGRESS)
        return "halted"
    thread = _in_thread(halt, results)
    assert locked.wait(30)
    return thread


def _admit_without_materializing(monkeypatch, replay_id: str, event: Event):
    """Admit the request and its Receipt while the gate serves, deriving nothing yet."""
    with monkeypatch.context() as patch:
        patch.setattr(replay_module, "replay_materialize",
                      lambda **kwargs: (_ for _ in ()).throw(NotServing("materialization deferred by the test")))
        result = _submit(replay_id, event)
    assert not result.materialized
    return result


def _pause_inside(monkeypatch, model) -> tuple[threading.Event, threading.Event]:
    """Pause the replay transaction right after it inserts a ``model`` row (it still holds the gate)."""
    inside, proceed = threading.Event(), threading.Event()
    real_insert = replay_module.insert

    def pausing_insert(model_cls, **values):
        row = real_insert(model_cls, **values)
        if model_cls is model:
            inside.set()
            assert proceed.wait(30)
        return row

    monkeypatch.setattr(replay_module, "insert", pausing_insert)
    return inside, proceed


# --- S003-RP-12 ----------------------------------------------------------------------
def test_repeated_replay_request_converges_and_a_distinct_id_is_a_distinct_generation(client, billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    before = _snapshot(predecessor)

    first = _submit("replay-1", predecessor)
    assert first.created and first.materialized
    again = _submit("replay-1", predecessor)
    assert not again.created and again.materialized
    assert again.request.pk == first.request.pk and again.request.receipt_id == first.request.receipt_id
    assert again.event_ids == first.event_ids and again.execution_ids == first.execution_ids
    assert _replay_rows("replay-1") == {"requests": 1, "receipts": 1, "events": 1, "projections": 1, "executions": 1}

    replayed = Event.objects.get(org_id=ORG, pk=first.event_ids[0])
    assert replayed.event_generation == "replay-1" and replayed.receipt_id == first.request.receipt_id
    assert (replayed.source_event_key, bytes(replayed.position), replayed.partition_key, replayed.payload_digest) == (
        predecessor.source_event_key, bytes(predecessor.position), predecessor.partition_key,
        predecessor.payload_digest)
    receipt = Receipt.objects.get(org_id=ORG, pk=first.request.receipt_id)
    assert receipt.kind == "replay" and receipt.pk != predecessor.receipt_id
    assert first.request.predecessor_event_id == predecessor.pk
    assert first.request.predecessor_epoch_digest == predecessor.epoch.digest

    other = _submit("replay-2", predecessor)
    assert other.created and other.event_ids != first.event_ids
    assert Event.objects.get(org_id=ORG, pk=other.event_ids[0]).event_generation == "replay-2"
    assert Event.objects.filter(org_id=ORG, source_event_key=predecessor.source_event_key).count() == 3
    assert _snapshot(predecessor) == before


@pytest.mark.parametrize("change", [{"reason": "another reason"}, {"principal": "operator-2"}, "other_event"])
def test_replay_request_byte_mismatch_fails_closed(client, billing_sandbox, change):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    first_event, second_event = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io"),
                                                          hubspot_event(2, 502, 1000, "email", "b@x.io")])
    before = _snapshot(first_event)
    stored = _submit("replay-1", first_event)
    rows_before = _replay_rows("replay-1")
    overrides = {"predecessor_event_id": second_event.pk} if change == "other_event" else change
    with pytest.raises(ReplayMismatch):
        _submit("replay-1", first_event, **overrides)
    assert _replay_rows("replay-1") == rows_before
    request = ReplayRequest.objects.get(org_id=ORG, replay_id="replay-1")
    assert (request.request_digest, request.reason, request.principal) == (
        stored.request.request_digest, "support ticket 42", "operator-1")
    assert _snapshot(first_event) == before


def test_a_predecessor_with_open_work_cannot_be_replayed(client, billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    assert post_signed(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")]).status_code == 202
    predecessor = Event.objects.get(org_id=ORG)
    with pytest.raises(ReplayPredecessorNotTerminal):
        _submit("replay-1", predecessor)
    assert _replay_rows("replay-1") == {"requests": 0, "receipts": 0, "events": 0, "projections": 0, "executions": 0}


@pytest.mark.parametrize("mode", ["allow_external_effects", "", None, "SUPPRESS_EXTERNAL_EFFECTS"])
def test_replay_mode_other_than_suppress_is_rejected_before_anything_materializes(client, billing_sandbox, mode):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    with pytest.raises(ReplayModeUnsupported):
        _submit("replay-1", predecessor, external_effects=mode)
    assert ReplayRequest.objects.count() == 0 and Receipt.objects.filter(kind="replay").count() == 0
    assert Event.objects.count() == 1


# --- replay enters the same lane guard ------------------------------------------------
def test_replayed_position_at_or_below_the_high_water_is_superseded_without_runtime(client, billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    before = _snapshot(predecessor)
    original = Execution.objects.get(org_id=ORG, projection__event=predecessor)
    assert original.state == "completed"
    results_before = ApplicationResult.objects.count()

    result = _submit("replay-1", predecessor)
    replayed = Execution.objects.get(org_id=ORG, pk=result.execution_ids[0])
    assert replayed.lane_id == original.lane_id and replayed.state == "ready"
    assert bytes(replayed.position) == bytes(replayed.lane.high_water_position)

    assert execution_try_claim_one(worker_id="w") is None
    replayed = Execution.objects.get(org_id=ORG, pk=replayed.pk)
    assert (replayed.state, replayed.reason_code) == ("superseded", SUPERSEDED_BY_NEWER_POSITION)
    decision = OrderingDecision.objects.get(org_id=ORG, execution=replayed)
    assert bytes(decision.high_water_position) == bytes(original.position)
    assert ApplicationResult.objects.count() == results_before
    assert not ApplicationResult.objects.filter(org_id=ORG, command_id=replayed.command_id).exists()
    assert _snapshot(predecessor) == before
    # The lookup reports the decided descendant and changes nothing.
    looked = replay_lookup(org=SCOPE, account_key=ACCOUNT, replay_id="replay-1")
    assert looked.executions[0]["state"] == "superseded"


# --- S003-RP-34, replay half --------------------------------------------------------------
def test_replay_execution_cannot_author_an_outbound_command(client, billing_sandbox):
    """A replay that executes applies its record change, but its Flow is refused the outbound command."""
    make_serving_org(billing_sandbox.base_url)
    _admit_and_drain(client, [hubspot_event(1, 501, 1000)])  # the contact exists, not a customer
    assert post_signed(client, [hubspot_event(2, 501, 1001, "lifecyclestage", "customer")]).status_code == 202
    predecessor = Event.objects.get(org_id=ORG, source_event_key__endswith=":2")
    parked = Execution.objects.get(org_id=ORG, projection__event=predecessor)
    # The predecessor never reached Runtime: it was quarantined, so its lane has no high-water.
    with transaction.atomic(durable=True):
        ExecutionStore.transition(org_id=ORG, pk=parked.pk, src="ready", dst="quarantined", version=parked.version,
                                  set_fields={"reason_code": ITEM_SCHEMA_INVALID})
    drain()
    before = _snapshot(predecessor)

    result = _submit("replay-1", predecessor)
    drain()

    replayed = Execution.objects.get(org_id=ORG, pk=result.execution_ids[0])
    assert replayed.state == "completed"  # the application change itself is applied
    assert replayed.execution_ref_digest == replay_module.replay_execution_ref(
        command_id=replayed.command_id, projection_id=replayed.projection_id,
        pack_generation_id=next(a for a in replayed.projection.event.epoch.document["accounts"]
                                if a["account_key"] == ACCOUNT)["pack_generation"]["id"],
        epoch_digest=replayed.projection.event.epoch.digest, definition_digest=replayed.projection.definition_digest,
        input_digest=replayed.projection.input_digest, replay_id="replay-1", external_effects=SUPPRESS_EXTERNAL_EFFECTS)
    assert build_runtime_command(replayed)["external_effects"] == SUPPRESS_EXTERNAL_EFFECTS
    applied = ApplicationResult.objects.get(org_id=ORG, command_id=replayed.command_id)
    assert applied.outcome == "applied"
    write = ReplayRecordWrite.objects.get(org_id=ORG, command_id=replayed.command_id)
    run = FlowRun.objects.get(org_id=ORG, record_key=write.record_key, record_version=write.record_version)
    assert run.state == "TerminalFailed"
    assert FlowStepAttempt.objects.filter(org_id=ORG, step__run=run, safe_error_code="replay_outbound_refused").exists()
    assert OutboundCommand.objects.count() == 0
    assert billing_sandbox.state()["requests"] == 0
    assert _snapshot(predecessor) == before


def test_runtime_refuses_outbound_authoring_inside_a_replay_command(billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    scope = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")
    with pytest.raises(ReplayOutboundRefused):
        with transaction.atomic(), suppressed_external_effects(org_id=ORG, command_id="c" * 64,
                                                              mode=SUPPRESS_EXTERNAL_EFFECTS):
            record = record_create(org=SCOPE, object_name="Contact", values={"email": "f@x.io"})
            outbound_command_author(scope=scope, effect_root_id="r", effect_slot_id="s", effect_generation_id="1",
                                    contract_key="billing.customer", record=record, origin_flow_run_id=None)
    assert OutboundCommand.objects.count() == 0


def test_runtime_refuses_a_command_with_another_external_effect_mode(billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    command = {"application": {"command": "record_upsert_via_link"}, "external_effects": "allow_external_effects"}
    with pytest.raises(ReplayModeUnsupported):
        application_command_submit(org_id=ORG, command_id="d" * 64, execution_ref_digest="e" * 64, command=command)
    assert ApplicationResult.objects.count() == 0


# --- S003-RP-13: replay versus halt -------------------------------------------------------------
@pytest.mark.parametrize("first", ["halt", "replay"])
def test_replay_admission_racing_a_gate_halt_serializes_on_the_gate(client, billing_sandbox, monkeypatch, first):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    before = _snapshot(predecessor)
    replay_results, halt_results = [], []
    if first == "halt":
        halter = _halt_holding_the_gate_until_a_waiter(halt_results)
        replayer = _in_thread(lambda: _submit("replay-1", predecessor), replay_results)
        replayer.join(60)
        halter.join(60)
        assert halt_results == ["halted"]
        assert isinstance(replay_results[0], NotServing), replay_results
        assert _replay_rows("replay-1") == {"requests": 0, "receipts": 0, "events": 0, "projections": 0,
                                            "executions": 0}
    else:
        inside, proceed = _pause_inside(monkeypatch, ReplayRequest)
        replayer = _in_thread(lambda: _submit("replay-1", predecessor), replay_results)
        assert inside.wait(30)
        halter = _in_thread(_halt_gate, halt_results)
        _wait_until_someone_waits_for_the_gate()
        proceed.set()
        replayer.join(60)
        halter.join(60)
        assert halt_results == [None]
        result = replay_results[0]
        assert not isinstance(result, Exception), result
        # Admission committed first and exists wholly; materialization ran before or after the halt, never half.
        counts = _replay_rows("replay-1")
        assert counts["requests"] == 1 and counts["receipts"] == 1
        assert counts["events"] == counts["projections"] == counts["executions"] == int(result.materialized)
    assert AccountServingGate.objects.get(org_id=ORG, account_key=ACCOUNT).state == "halting_v2"
    assert _snapshot(predecessor) == before


@pytest.mark.parametrize("first", ["halt", "materialization"])
def test_replay_materialization_racing_a_gate_halt_leaves_no_partial_descendant(client, billing_sandbox, monkeypatch,
                                                                                first):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    _admit_without_materializing(monkeypatch, "replay-1", predecessor)
    assert _replay_rows("replay-1") == {"requests": 1, "receipts": 1, "events": 0, "projections": 0, "executions": 0}
    materialized, halted = [], []
    if first == "halt":
        halter = _halt_holding_the_gate_until_a_waiter(halted)
        materializer = _in_thread(lambda: replay_materialize(org=SCOPE, account_key=ACCOUNT, replay_id="replay-1"),
                                  materialized)
        halter.join(60)
        materializer.join(60)
        assert isinstance(materialized[0], NotServing), materialized
        assert _replay_rows("replay-1") == {"requests": 1, "receipts": 1, "events": 0, "projections": 0,
                                            "executions": 0}
        assert ReceiptComponent.objects.filter(receipt__kind="replay").count() == 0
    else:
        inside, proceed = _pause_inside(monkeypatch, Projection)
        materializer = _in_thread(lambda: replay_materialize(org=SCOPE, account_key=ACCOUNT, replay_id="replay-1"),
                                  materialized)
        assert inside.wait(30)
        halter = _in_thread(_halt_gate, halted)
        _wait_until_someone_waits_for_the_gate()
        proceed.set()
        materializer.join(60)
        halter.join(60)
        assert not isinstance(materialized[0], Exception), materialized
        assert _replay_rows("replay-1") == {"requests": 1, "receipts": 1, "events": 1, "projections": 1,
                                            "executions": 1}
    assert halted and not isinstance(halted[0], Exception), halted
    # Halted: the lookup still answers, and it neither creates nor repairs a descendant.
    counts = _replay_rows("replay-1")
    looked = replay_lookup(org=SCOPE, account_key=ACCOUNT, replay_id="replay-1")
    assert looked.materialized == (first == "materialization")
    assert _replay_rows("replay-1") == counts
    with pytest.raises(NotServing):
        replay_materialize(org=SCOPE, account_key=ACCOUNT, replay_id="replay-1")
    assert _replay_rows("replay-1") == counts


# --- S003-RP-07, replay parts -------------------------------------------------------------------
def _verified_epoch() -> ServingEpoch:
    active = ServingEpoch.objects.get(org_id=ORG, state="active")
    return rows.make(ServingEpoch, org_id=ORG, state="verified", configuration=active.configuration,
                     document=active.document, digest="f" * 64, profile_id=PROFILE_V2)


def _point_gate_at(epoch: ServingEpoch) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_accountservinggate SET epoch_id = %s, epoch_digest = %s "
                       "WHERE org_id = %s AND account_key = %s", [int(epoch.pk), epoch.digest, ORG, ACCOUNT])


def test_corrupt_gate_naming_a_verified_epoch_produces_no_replay_fact(client, billing_sandbox, monkeypatch):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    _admit_without_materializing(monkeypatch, "replay-0", predecessor)  # while the gate is still sound

    _point_gate_at(_verified_epoch())  # the gate is v2_serving and its id and digest match a verified epoch
    with pytest.raises(NotServing):
        _submit("replay-1", predecessor)
    with pytest.raises(NotServing):
        replay_materialize(org=SCOPE, account_key=ACCOUNT, replay_id="replay-0")
    assert _replay_rows("replay-1") == {"requests": 0, "receipts": 0, "events": 0, "projections": 0, "executions": 0}
    assert _replay_rows("replay-0") == {"requests": 1, "receipts": 1, "events": 0, "projections": 0, "executions": 0}


def test_replay_materializes_only_under_its_exact_target_epoch(client, billing_sandbox, monkeypatch):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    request = _admit_without_materializing(monkeypatch, "replay-1", predecessor).request
    # Another active epoch (a corrupt second activation) now serves the account: the stored target is not it.
    other = _verified_epoch()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_servingepoch SET state = 'active' WHERE id = %s", [int(other.pk)])
    _point_gate_at(ServingEpoch.objects.get(org_id=ORG, pk=other.pk))
    with pytest.raises(ReplayTargetNotServing):
        replay_materialize(org=SCOPE, account_key=ACCOUNT, replay_id="replay-1")
    assert _replay_rows("replay-1")["events"] == 0
    assert ReplayRequest.objects.get(org_id=ORG, pk=request.pk).target_epoch_id != other.pk


# --- crash between admission and materialization -------------------------------------------------
def test_killed_after_admission_the_same_request_resumes_materialization(client, billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    args = ["connector_replay", "--org", ORG, "--account", ACCOUNT, "--replay-id", "replay-1",
            "--event", str(int(predecessor.pk)), "--reason", "support ticket 42", "--principal", "operator-1"]
    crashed = run_manage(args, subprocess_env(NEXUS_FAILPOINTS="replay.after_admission_commit"))
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert _replay_rows("replay-1") == {"requests": 1, "receipts": 1, "events": 0, "projections": 0, "executions": 0}
    resumed = run_manage(args, subprocess_env())
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert '"materialized": true' in resumed.stdout and '"created": false' in resumed.stdout
    assert _replay_rows("replay-1") == {"requests": 1, "receipts": 1, "events": 1, "projections": 1, "executions": 1}


# --- operator surfaces ----------------------------------------------------------------------------
def _operator(client, org_id: str = ORG) -> User:
    user = User.objects.create_user(f"op-{org_id}", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name=f"org:{org_id}"))
    client.force_login(user)
    return user


def test_replay_api_admits_converges_and_answers_stable_error_codes(client, billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    body = {"account_key": ACCOUNT, "replay_id": "replay-1", "predecessor_event_id": int(predecessor.pk),
            "reason": "support ticket 42", "external_effects": SUPPRESS_EXTERNAL_EFFECTS}
    assert client.post("/api/v2/replays/", body, content_type="application/json").status_code in (401, 403)

    _operator(client)
    created = client.post("/api/v2/replays/", body, content_type="application/json")
    assert created.status_code == 201, created.content
    assert created.json()["principal"] == "op-test-org" and created.json()["materialized"] is True
    again = client.post("/api/v2/replays/", body, content_type="application/json")
    assert again.status_code == 200 and again.json()["event_ids"] == created.json()["event_ids"]

    mismatch = client.post("/api/v2/replays/", {**body, "reason": "other"}, content_type="application/json")
    assert (mismatch.status_code, mismatch.json()["error"]) == (409, "replay_mismatch")
    mode = client.post("/api/v2/replays/", {**body, "replay_id": "replay-2", "external_effects": "allow"},
                       content_type="application/json")
    assert (mode.status_code, mode.json()["error"]) == (400, "replay_mode_unsupported")
    unknown = client.post("/api/v2/replays/", {**body, "replay_id": "replay-3", "predecessor_event_id": 999999},
                          content_type="application/json")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_predecessor")
    spaced = client.post("/api/v2/replays/", {**body, "replay_id": " replay-4"}, content_type="application/json")
    assert (spaced.status_code, spaced.json()["error"]) == (400, "invalid_identity")
    assert ReplayRequest.objects.count() == 1

    looked = client.get(f"/api/v2/replays/{ACCOUNT}/replay-1/")
    assert looked.status_code == 200 and looked.json()["request_digest"] == created.json()["request_digest"]
    _halt_gate()
    halted = client.post("/api/v2/replays/", {**body, "replay_id": "replay-5"}, content_type="application/json")
    assert (halted.status_code, halted.json()["error"]) == (503, "not_serving") and halted["Retry-After"]
    assert client.get(f"/api/v2/replays/{ACCOUNT}/replay-1/").status_code == 200
    assert client.get(f"/api/v2/replays/{ACCOUNT}/replay-5/").json()["error"] == "replay_not_found"

    _operator(client, "other-org")  # an operator of another org cannot see or act on the account
    foreign = client.post("/api/v2/replays/", {**body, "replay_id": "replay-6"}, content_type="application/json")
    assert (foreign.status_code, foreign.json()["error"]) == (404, "unknown_account")
    assert client.get(f"/api/v2/replays/{ACCOUNT}/replay-1/").status_code == 404


def test_replay_command_prints_the_request_and_exits_with_a_code_on_bad_input(client, billing_sandbox, capsys):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = _admit_and_drain(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])[0]
    base = ["--org", ORG, "--account", ACCOUNT, "--replay-id", "replay-1"]
    with pytest.raises(CommandError) as refused:
        call_command("connector_replay", *base, "--event", str(int(predecessor.pk)), "--reason", "r",
                     "--principal", "op", "--mode", "allow_external_effects")
    assert refused.value.returncode == 2 and "replay_mode_unsupported" in str(refused.value)
    assert ReplayRequest.objects.count() == 0
    call_command("connector_replay", *base, "--event", str(int(predecessor.pk)), "--reason", "ticket 7",
                 "--principal", "op")
    assert '"materialized": true' in capsys.readouterr().out
    _halt_gate()
    call_command("connector_replay", *base, "--lookup")
    assert '"replay_id": "replay-1"' in capsys.readouterr().out
    with pytest.raises(CommandError) as not_serving:
        call_command("connector_replay", *base[:4], "--replay-id", "replay-2", "--event", str(int(predecessor.pk)),
                     "--reason", "ticket 7", "--principal", "op")
    assert not_serving.value.returncode == 3
