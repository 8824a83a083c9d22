"""Runtime message families: registry, publish, envelopes, inbox acceptance, relay and same-transaction delivery.

ARCHITECTURE.md section 2 "Runtime message families"; seed 004 sections
10.7, 14.2 and 15.1-15.2. Everything runs against the real MariaDB through
the real producers (``outbound_command_author``, the Flow EffectSubmit step,
``intent_result_record``), the real relay and the registered consumers.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from connectors.models import RemoteEffect
from connectors.outbound.inbox import INBOX_CONSUMER, InboxEnvelopeMismatch, outbound_message_accept
from nexusflow.flows.errors import WakeSignalRejected
from nexusflow.flows.models import FlowRun, FlowWakeSignal
from nexusflow.flows.services import flow_try_run_step_one
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.services import record_create, record_lock
from runtime_outbox import messages
from runtime_outbox.messages import (
    COMMAND_FAMILIES,
    FLOW_EFFECT_SUBMIT,
    INTENT_COMPLETED,
    OUTBOUND_COMMAND,
    Envelope,
    EnvelopeCorrupt,
    InboxAcceptanceRaced,
    InboxConflict,
    InboxRejected,
    MessageFamilyError,
    MessageRegistry,
    OutboxConflict,
    envelope_of,
    inbox_accept,
    inbox_reject_if_unaccepted,
    publish,
)
from runtime_outbox.models import InboxAcceptance, IntentResultReceipt, OutboundCommand, OutboxMessage
from runtime_outbox.services import (
    intent_result_record,
    outbound_command_author,
    outbox_try_deliver_batch,
    outbox_try_deliver_one,
)
from tests.concurrency import Worker, race_behind_hold
from tests.conftest import ORG, make_serving_org
from tests.flows.conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")
CUSTOMER = {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee", "lifecyclestage": "customer"}


@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


@pytest.fixture
def flow_org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url)


def _push(email: str = "ann@x.io", slot: str = "push-1") -> OutboundCommand:
    """One plain (non-Flow) intent, authored as an application transaction does; not delivered."""
    with transaction.atomic():
        record = record_create(org=OrgScope(ORG), object_name="Contact",
                               values={"email": email, "firstname": "Ann", "lifecyclestage": "customer"})
    with transaction.atomic():
        record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        return outbound_command_author(scope=SCOPE, effect_root_id="root-" + record.record_key,
                                       effect_slot_id=slot, effect_generation_id="1",
                                       contract_key="billing.customer", record=record, origin_flow_run_id=None)


def _flow_push(org: OrgScope) -> OutboundCommand:
    """The demo Flow's EffectSubmit step authors the intent (its message is ``flow.effect.submit``)."""
    save_record(org, dict(CUSTOMER))
    assert flow_try_run_step_one(worker_id="w")
    run = FlowRun.objects.get(org_id=ORG)
    return OutboundCommand.objects.get(org_id=ORG, origin_flow_run_id=run.pk)


def _message(command: OutboundCommand) -> OutboxMessage:
    return OutboxMessage.objects.get(org_id=ORG, command=command, family__in=COMMAND_FAMILIES)


def _complete(command: OutboundCommand) -> IntentResultReceipt:
    with transaction.atomic():
        return intent_result_record(command=command, outcome="finalized", remote_id="cus_test",
                                    evidence={"test": "finalized"})


def _drain_relay() -> None:
    while outbox_try_deliver_one():
        pass


def _poison(poisoned_command: OutboundCommand, healthy_command: OutboundCommand) -> OutboxMessage:
    """Give ``poisoned_command``'s message a self-consistent payload naming ``healthy_command``: the consumer
    refuses it (another intent than its own)."""
    poisoned = _message(poisoned_command)
    family, key, payload = messages.command_message(healthy_command)
    digest = messages.message_digest(family, 1, poisoned.message_key, payload)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runtime_outbox_outboxmessage SET payload = %s, payload_digest = %s WHERE id = %s",
                       [json.dumps(payload), digest, poisoned.pk])
    return poisoned


def _rows() -> tuple:
    """Everything a delivery may create, to prove that a refusal created nothing."""
    return (sorted(RemoteEffect.objects.values_list("id", "command_id", "state")),
            sorted(InboxAcceptance.objects.values_list("id", "message_key", "state", "payload_digest",
                                                       "accepted_ref")))


# --- the registry ----------------------------------------------------------------------------------------
def test_a_family_is_declared_once_and_has_exactly_one_consumer(monkeypatch):
    registry = MessageRegistry()
    registry.declare_family("test.family", payload_schema_version=1, inbox=False, seed="test")
    with pytest.raises(MessageFamilyError) as redeclared:
        registry.declare_family("test.family", payload_schema_version=2, inbox=False, seed="test")
    assert redeclared.value.code == "message_family_redeclared"
    assert registry.unconsumed() == ["test.family"]
    with pytest.raises(MessageFamilyError) as unconsumed:
        registry.consumer("test.family")
    assert unconsumed.value.code == "message_family_unconsumed"

    def first(envelope):
        return None

    def second(envelope):
        return None

    registry.register_consumer("test.family", first)
    registry.register_consumer("test.family", first)  # the same consumer again: a no-op
    with pytest.raises(MessageFamilyError) as taken:
        registry.register_consumer("test.family", second)
    assert taken.value.code == "message_family_consumer_taken"
    assert registry.consumer("test.family") is first and registry.unconsumed() == []
    with pytest.raises(MessageFamilyError) as unknown:
        registry.register_consumer("test.other", first)
    assert unknown.value.code == "message_family_unknown"

    # The installed registry: four families, each consumed once by the owning app's ready().
    assert {f.name for f in messages.REGISTRY.families()} == {OUTBOUND_COMMAND, FLOW_EFFECT_SUBMIT,
                                                                INTENT_COMPLETED, messages.RUNTIME_COMMAND_HANDOFF}
    assert messages.REGISTRY.unconsumed() == [] and messages.check_every_family_consumed() == []
    assert messages.REGISTRY.consumer(OUTBOUND_COMMAND) is outbound_message_accept
    assert messages.REGISTRY.consumer(FLOW_EFFECT_SUBMIT) is outbound_message_accept
    with pytest.raises(MessageFamilyError):
        messages.register_consumer(INTENT_COMPLETED, second)
    with pytest.raises(MessageFamilyError):
        messages.declare_family(OUTBOUND_COMMAND, payload_schema_version=1, inbox=True, seed="test")
    assert messages.REGISTRY.consumer(INTENT_COMPLETED).__module__ == "nexusflow.flows.inbox"
    monkeypatch.delitem(messages.REGISTRY._consumers, INTENT_COMPLETED)
    assert [e.id for e in messages.check_every_family_consumed()] == ["runtime_outbox.E001"]


# --- publish ------------------------------------------------------------------------------------------------
def test_publish_is_idempotent_and_a_digest_or_scope_conflict_fails_closed(org):
    payload = {"command_id": 7, "nested": [1, {"b": "x"}]}
    with transaction.atomic():
        first = publish(SCOPE, OUTBOUND_COMMAND, "key-1", payload)
        again = publish(SCOPE, OUTBOUND_COMMAND, "key-1", {"nested": [1, {"b": "x"}], "command_id": 7})
    assert again.pk == first.pk and OutboxMessage.objects.filter(message_key="key-1").count() == 1
    stored = OutboxMessage.objects.get(org_id=ORG, pk=first.pk)
    assert (stored.family, stored.message_key, stored.payload, stored.state) == (
        OUTBOUND_COMMAND, "key-1", payload, "pending")
    assert stored.payload_digest == messages.message_digest(OUTBOUND_COMMAND, 1, "key-1", payload)
    assert messages.scope_of(stored) == SCOPE
    other_scope = dataclasses.replace(SCOPE, binding_digest="other-binding")
    for key, scope, changed, code in [("key-1", SCOPE, {"command_id": 8}, "outbox_digest_conflict"),
                                      ("key-1", other_scope, payload, "outbox_scope_conflict")]:
        with pytest.raises(OutboxConflict) as conflict, transaction.atomic():
            publish(scope, OUTBOUND_COMMAND, key, changed)
        assert conflict.value.code == code
    assert list(OutboxMessage.objects.values_list("pk", "payload_digest")) == [(first.pk, stored.payload_digest)]
    with pytest.raises(RuntimeError):
        publish(SCOPE, OUTBOUND_COMMAND, "key-2", payload)  # outside the producer's transaction
    with pytest.raises(MessageFamilyError), transaction.atomic():
        publish(SCOPE, "no.such.family", "key-2", payload)
    assert OutboxMessage.objects.count() == 1


def test_an_authored_intent_publishes_its_family_once_with_the_full_scope(org):
    command = _push()
    message = _message(command)
    family, key, payload = messages.command_message(command)
    assert (message.family, message.message_key, message.payload) == (OUTBOUND_COMMAND, command.idempotency_key,
                                                                      payload)
    assert payload["frozen_binding_digest"] == command.frozen_binding_digest and family == OUTBOUND_COMMAND
    assert messages.scope_of(message) == SCOPE and message.command_id == command.pk
    # An exact retry of the application transaction returns the same intent and the same one message.
    with transaction.atomic():
        record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=command.source_record_key)
        retried = outbound_command_author(scope=SCOPE, effect_root_id=command.effect_root_id,
                                          effect_slot_id=command.effect_slot_id, effect_generation_id="1",
                                          contract_key="billing.customer", record=record, origin_flow_run_id=None)
    assert retried.pk == command.pk and OutboxMessage.objects.filter(org_id=ORG).count() == 1


# --- envelopes ------------------------------------------------------------------------------------------------
def test_the_envelope_is_immutable_and_a_tampered_payload_is_never_delivered(org):
    with transaction.atomic():
        message = publish(SCOPE, OUTBOUND_COMMAND, "key-env", {"a": [1, {"b": [2]}], "c": "d"})
    envelope = envelope_of(OutboxMessage.objects.get(org_id=ORG, pk=message.pk))
    assert (envelope.scope, envelope.family, envelope.message_key, envelope.outbox_message_id) == (
        SCOPE, OUTBOUND_COMMAND, "key-env", message.pk)
    assert envelope.payload_digest == message.payload_digest
    with pytest.raises(dataclasses.FrozenInstanceError):
        envelope.payload_digest = "0" * 64
    with pytest.raises(TypeError):
        envelope.payload["c"] = "e"
    with pytest.raises(TypeError):
        envelope.payload["a"][1]["b"] = [3]
    assert envelope.payload["a"] == (1, {"b": (2,)}) and isinstance(envelope.payload["a"], tuple)
    with pytest.raises(AttributeError):
        envelope.payload["a"][1]["b"].append(3)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runtime_outbox_outboxmessage SET payload = %s WHERE id = %s",
                       [json.dumps({"a": [1], "c": "d"}), message.pk])
    with pytest.raises(EnvelopeCorrupt) as corrupt:
        envelope_of(OutboxMessage.objects.get(org_id=ORG, pk=message.pk))
    assert corrupt.value.code == "outbox_payload_digest_mismatch"


# --- the owner's inbox ------------------------------------------------------------------------------------------
def test_a_duplicate_handoff_delivery_accepts_once_and_creates_one_remote_effect(flow_org, monkeypatch):
    command = _flow_push(flow_org)
    message = _message(command)
    assert message.family == FLOW_EFFECT_SUBMIT and message.message_key == command.idempotency_key
    envelope = envelope_of(message)
    import connectors.outbound.intents as outbound

    created = []
    real = outbound.remote_effect_find_or_create

    def counted(*, command):
        created.append(command.pk)
        return real(command=command)

    monkeypatch.setattr(outbound, "remote_effect_find_or_create", counted)
    outbound_message_accept(envelope)
    rows = _rows()
    outbound_message_accept(envelope)  # the acknowledgement was lost: Runtime retries the same key
    assert _rows() == rows and created == [command.pk]
    effect = RemoteEffect.objects.get(org_id=ORG)
    acceptance = InboxAcceptance.objects.get(org_id=ORG)
    assert (acceptance.family, acceptance.message_key, acceptance.state, acceptance.consumer) == (
        FLOW_EFFECT_SUBMIT, command.idempotency_key, "accepted", INBOX_CONSUMER)
    assert (acceptance.outbox_message_id, acceptance.payload_digest, acceptance.accepted_ref) == (
        message.pk, message.payload_digest, f"remote_effect:{effect.pk}")
    assert messages.scope_of(acceptance) == messages.scope_of(command)
    _drain_relay()  # the relay's own delivery finds the acceptance, creates nothing, acknowledges
    assert _rows() == rows and created == [command.pk]
    delivered = OutboxMessage.objects.get(org_id=ORG, pk=message.pk)
    assert (delivered.state, delivered.delivery_attempts) == ("delivered", 1)


@pytest.mark.parametrize("changed", ["org_id", "app_installation_id", "runtime_capability_id", "binding_digest",
                                     "payload_digest", "outbox_message_id"])
def test_the_same_handoff_key_with_other_validation_attributes_fails_closed(org, changed):
    command = _push()
    _drain_relay()
    envelope = envelope_of(_message(command))
    rows = _rows()
    assert len(rows[0]) == len(rows[1]) == 1
    if changed == "payload_digest":
        probe, code = dataclasses.replace(envelope, payload_digest="0" * 64), "inbox_digest_conflict"
    elif changed == "outbox_message_id":
        probe, code = dataclasses.replace(envelope, outbox_message_id=envelope.outbox_message_id + 1), \
            "inbox_outbox_conflict"
    else:
        other = dataclasses.replace(SCOPE, **{changed: "other-" + changed.replace("_", "-")})
        probe, code = dataclasses.replace(envelope, scope=other), "inbox_scope_conflict"
    called = []
    with pytest.raises(InboxConflict) as conflict, transaction.atomic():
        inbox_accept(probe, consumer=INBOX_CONSUMER, accepted_ref_fn=lambda: called.append(1) or "x:1")
    assert conflict.value.code == code and called == []
    assert "test-binding" not in str(conflict.value) and "core" not in str(conflict.value)  # nothing disclosed
    with pytest.raises(InboxConflict) as fenced:
        inbox_reject_if_unaccepted(scope=probe.scope, family=probe.family, message_key=probe.message_key,
                                   payload_digest=probe.payload_digest, outbox_message_id=probe.outbox_message_id,
                                   consumer=INBOX_CONSUMER)
    assert fenced.value.code == code
    # Through the registered consumer the envelope is first compared with its intent: refused the same way.
    with pytest.raises((InboxEnvelopeMismatch, InboxConflict)):
        outbound_message_accept(probe)
    assert _rows() == rows


def test_a_rejected_tombstone_refuses_every_later_acceptance(org):
    rejected_command, accepted_command = _push("a@x.io", "push-a"), _push("b@x.io", "push-b")
    message = _message(rejected_command)
    fence = dict(scope=messages.scope_of(message), family=message.family, message_key=message.message_key,
                 payload_digest=message.payload_digest, outbox_message_id=message.pk, consumer=INBOX_CONSUMER)
    tombstone = inbox_reject_if_unaccepted(**fence)
    assert (tombstone.state, tombstone.accepted_ref) == ("rejected", "")
    assert inbox_reject_if_unaccepted(**fence).pk == tombstone.pk  # idempotent
    with pytest.raises(InboxConflict) as changed:
        inbox_reject_if_unaccepted(**{**fence, "payload_digest": "0" * 64})
    assert changed.value.code == "inbox_digest_conflict"
    with pytest.raises(InboxRejected) as refused:
        outbound_message_accept(envelope_of(message))
    assert refused.value.code == "inbox_handoff_rejected"
    assert not RemoteEffect.objects.filter(org_id=ORG, command=rejected_command).exists()

    _drain_relay()  # the relay: the rejected message backs off; the other one is delivered
    pending = OutboxMessage.objects.get(org_id=ORG, pk=message.pk)
    assert (pending.state, pending.delivery_attempts) == ("pending", 1)
    assert not RemoteEffect.objects.filter(org_id=ORG, command=rejected_command).exists()
    assert InboxAcceptance.objects.get(org_id=ORG, message_key=message.message_key).state == "rejected"
    # RejectIfUnaccepted after an acceptance returns that acceptance and writes no tombstone.
    accepted = _message(accepted_command)
    assert accepted.state == "delivered"
    found = inbox_reject_if_unaccepted(scope=messages.scope_of(accepted), family=accepted.family,
                                       message_key=accepted.message_key, payload_digest=accepted.payload_digest,
                                       outbox_message_id=accepted.pk, consumer=INBOX_CONSUMER)
    assert found.state == "accepted" and InboxAcceptance.objects.count() == 2
    assert RemoteEffect.objects.filter(org_id=ORG, command=accepted_command).count() == 1


def test_acceptance_first_then_reject_if_unaccepted_returns_the_acceptance(org, holds):
    command = _push()
    message = _message(command)
    envelope = envelope_of(message)
    accept, reject = race_behind_hold(
        holds, "inbox.accept_before_commit", lambda: outbound_message_accept(envelope),
        lambda: inbox_reject_if_unaccepted(scope=envelope.scope, family=envelope.family,
                                           message_key=envelope.message_key, payload_digest=envelope.payload_digest,
                                           outbox_message_id=envelope.outbox_message_id, consumer=INBOX_CONSUMER),
        "runtime_outbox_inboxacceptance", names=("accept", "reject"))
    assert accept.error is None and reject.error is None
    assert reject.result.state == "accepted"
    assert list(InboxAcceptance.objects.values_list("state", flat=True)) == ["accepted"]
    assert RemoteEffect.objects.filter(org_id=ORG, command=command).count() == 1


def test_reject_if_unaccepted_first_then_the_acceptance_rolls_back_whole(org, holds):
    command = _push()
    message = _message(command)
    envelope = envelope_of(message)
    reject, accept = race_behind_hold(
        holds, "inbox.reject_before_commit",
        lambda: inbox_reject_if_unaccepted(scope=envelope.scope, family=envelope.family,
                                           message_key=envelope.message_key, payload_digest=envelope.payload_digest,
                                           outbox_message_id=envelope.outbox_message_id, consumer=INBOX_CONSUMER),
        lambda: outbound_message_accept(envelope), "runtime_outbox_inboxacceptance", names=("reject", "accept"),
        statement="INSERT INTO")
    assert reject.error is None and reject.result.state == "rejected"
    assert isinstance(accept.error, InboxAcceptanceRaced), accept.error
    # The losing acceptance rolled back with the RemoteEffect it had created in its transaction.
    assert not RemoteEffect.objects.filter(org_id=ORG).exists()
    assert list(InboxAcceptance.objects.values_list("state", flat=True)) == ["rejected"]


# --- the relay ------------------------------------------------------------------------------------------------
def test_a_poisoned_message_backs_off_alone_while_the_rest_of_its_org_delivers(org):
    poisoned_command, healthy_command = _push("a@x.io", "push-a"), _push("b@x.io", "push-b")
    poisoned = _poison(poisoned_command, healthy_command)
    assert outbox_try_deliver_one()  # claims the poisoned message first (lowest id): refused, backs off
    assert outbox_try_deliver_one()  # the next message of the same org is delivered
    assert outbox_try_deliver_one() is False  # the poisoned one is not due again yet
    backed_off = OutboxMessage.objects.get(org_id=ORG, pk=poisoned.pk)
    assert (backed_off.state, backed_off.delivery_attempts) == ("pending", 1)
    assert backed_off.next_attempt_at > db_now()
    assert not RemoteEffect.objects.filter(org_id=ORG, command=poisoned_command).exists()
    assert not InboxAcceptance.objects.filter(message_key=poisoned.message_key).exists()
    assert _message(healthy_command).state == "delivered"
    assert RemoteEffect.objects.filter(org_id=ORG, command=healthy_command).count() == 1
    assert InboxAcceptance.objects.get(message_key=healthy_command.idempotency_key).state == "accepted"


# --- intent.completed -------------------------------------------------------------------------------------------
def test_intent_completed_is_delivered_in_the_finalize_transaction(flow_org):
    command = _flow_push(flow_org)
    receipt = _complete(command)
    message = OutboxMessage.objects.get(org_id=ORG, family=INTENT_COMPLETED)
    assert (message.state, message.delivery_attempts, message.message_key) == ("delivered", 0,
                                                                                command.idempotency_key)
    assert message.payload == {"command_id": command.pk, "receipt_id": receipt.pk, "receipt_digest": receipt.digest,
                               "flow_run_id": command.origin_flow_run_id, "dependency_key": str(command.pk)}
    assert FlowWakeSignal.objects.get(org_id=ORG).receipt_id == receipt.pk


def test_a_failing_flow_consumer_leaves_intent_completed_to_the_relay(flow_org, monkeypatch):
    command = _flow_push(flow_org)
    import nexusflow.flows.inbox as flow_inbox

    def refuse(**kwargs):
        raise WakeSignalRejected("the Flow side is unavailable")

    monkeypatch.setattr(flow_inbox, "flow_wake_signal_accept", refuse)
    receipt = _complete(command)  # the Connector finalize commits all the same
    assert IntentResultReceipt.objects.get(org_id=ORG, command=command).pk == receipt.pk
    assert not FlowWakeSignal.objects.exists()
    message = OutboxMessage.objects.get(org_id=ORG, family=INTENT_COMPLETED)
    assert (message.state, message.delivery_attempts) == ("pending", 0)

    monkeypatch.undo()
    _drain_relay()  # delivers the handoff, then the completion
    message = OutboxMessage.objects.get(org_id=ORG, pk=message.pk)
    assert (message.state, message.delivery_attempts) == ("delivered", 1)
    signal = FlowWakeSignal.objects.get(org_id=ORG)
    assert (signal.receipt_id, signal.dependency_key) == (receipt.pk, str(command.pk))
    messages.deliver(envelope_of(message))  # a duplicate delivery is a no-op
    assert FlowWakeSignal.objects.filter(org_id=ORG).count() == 1
    run_until_idle()
    assert FlowRun.objects.get(org_id=ORG).state == "Succeeded"


# --- the backfill migration --------------------------------------------------------------------------------------
def _migrate(target) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


def test_the_family_migration_backfills_existing_messages_exactly_as_publish_writes_them(flow_org):
    flow_command = _flow_push(flow_org)
    plain_command = _push("p@x.io", "push-p")
    columns = ("id", "command_id", "family", "message_key", "payload_schema_version", "payload", "payload_digest",
               "org_id", "app_installation_id", "runtime_capability_id", "binding_digest", "state")
    published = sorted(OutboxMessage.objects.values_list(*columns))
    assert {row[2] for row in published} == {OUTBOUND_COMMAND, FLOW_EFFECT_SUBMIT}
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("runtime_outbox")
    try:
        _migrate(("runtime_outbox", "0006_owner_leading_intent_index"))
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, command_id, state FROM runtime_outbox_outboxmessage ORDER BY id")
            assert [(i, c) for i, c, _s in cursor.fetchall()] == [(row[0], row[1]) for row in published]
        _migrate(("runtime_outbox", "0007_outbox_message_families"))
        assert sorted(OutboxMessage.objects.values_list(*columns)) == published
    finally:
        _migrate(latest[0])
    assert {_message(flow_command).family, _message(plain_command).family} == {FLOW_EFFECT_SUBMIT, OUTBOUND_COMMAND}
    _drain_relay()
    assert RemoteEffect.objects.count() == InboxAcceptance.objects.count() == 2


def test_envelope_is_the_only_thing_a_consumer_receives(org, monkeypatch):
    received = []
    monkeypatch.setitem(messages.REGISTRY._consumers, OUTBOUND_COMMAND,
                        lambda envelope: received.append(envelope) or outbound_message_accept(envelope))
    _push()
    _drain_relay()
    [envelope] = received
    assert type(envelope) is Envelope and isinstance(envelope.scope, TrustedRuntimeWorkScope)
    assert not any(isinstance(getattr(envelope, f.name), OutboxMessage) for f in dataclasses.fields(envelope))


def test_the_support_views_list_messages_by_family_and_their_acceptances(org, client):
    from django.contrib.auth.models import User

    command = _push()
    _drain_relay()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    listed = client.get("/admin/runtime_outbox/outboxmessage/?family=" + OUTBOUND_COMMAND)
    assert listed.status_code == 200
    assert [m.pk for m in listed.context["cl"].result_list] == [_message(command).pk]
    assert client.get("/admin/runtime_outbox/outboxmessage/?family=" + INTENT_COMPLETED).context[
        "cl"].result_count == 0
    acceptances = client.get("/admin/runtime_outbox/inboxacceptance/?state=accepted")
    assert acceptances.status_code == 200 and command.idempotency_key.encode() in acceptances.content



def test_identical_producer_keys_and_payloads_in_two_orgs_never_dedupe_accept_or_disclose_across_orgs(org):
    """Seed 004 section 22.6: the same producer key and payload in two orgs make two handoff keys, two
    messages and two acceptances; one org's acceptance or tombstone never answers, fences or discloses the
    other's, and reusing the other org's handoff key fails closed without naming its scope."""
    from runtime_outbox.services import intent_idempotency_key

    other = dataclasses.replace(SCOPE, org_id="other-org")
    producer = ("root-501", "slot-1", "1")
    key, other_key = intent_idempotency_key(SCOPE, *producer), intent_idempotency_key(other, *producer)
    assert key != other_key
    payload = {"command_id": 7, "record_id": 501}
    with transaction.atomic():
        mine = publish(SCOPE, FLOW_EFFECT_SUBMIT, key, payload)
        theirs = publish(other, FLOW_EFFECT_SUBMIT, other_key, payload)
    assert mine.pk != theirs.pk
    assert [messages.scope_of(m) for m in OutboxMessage.objects.order_by("pk")] == [SCOPE, other]
    with pytest.raises(OutboxConflict) as reused, transaction.atomic():
        publish(other, FLOW_EFFECT_SUBMIT, key, payload)
    assert reused.value.code == "outbox_scope_conflict"
    assert "test-binding" not in str(reused.value) and ORG not in str(reused.value)
    refs = []
    with transaction.atomic():
        accepted = inbox_accept(envelope_of(OutboxMessage.objects.get(org_id=ORG, pk=mine.pk)),
                                consumer=INBOX_CONSUMER, accepted_ref_fn=lambda: refs.append(ORG) or "x:1")
    tombstone = inbox_reject_if_unaccepted(scope=other, family=FLOW_EFFECT_SUBMIT, message_key=other_key,
                                           payload_digest=theirs.payload_digest, outbox_message_id=theirs.pk,
                                           consumer=INBOX_CONSUMER)
    assert refs == [ORG] and (accepted.org_id, accepted.state) == (ORG, "accepted")
    assert (tombstone.org_id, tombstone.state) == ("other-org", "rejected") and tombstone.pk != accepted.pk
    with pytest.raises(InboxRejected), transaction.atomic():
        inbox_accept(envelope_of(OutboxMessage.objects.get(org_id="other-org", pk=theirs.pk)),
                     consumer=INBOX_CONSUMER, accepted_ref_fn=lambda: refs.append("other-org") or "x:2")
    assert refs == [ORG] and InboxAcceptance.objects.get(org_id=ORG).state == "accepted"


def test_scope_named_in_a_payload_never_overrides_the_persisted_work_scope(org):
    """Seed 004 section 22.6: an org, installation, capability or binding digest named inside a message
    payload is data; delivery, acceptance and the fence use the persisted trusted work scope only."""
    forged = {"org_id": "other-org", "app_installation_id": "other-installation",
              "runtime_capability_id": "other-capability", "binding_digest": "f" * 64}
    with transaction.atomic():
        message = publish(SCOPE, FLOW_EFFECT_SUBMIT, "key-forged", {"command_id": 7, **forged})
    stored = OutboxMessage.objects.get(org_id=ORG, pk=message.pk)
    envelope = envelope_of(stored)
    assert messages.scope_of(stored) == envelope.scope == SCOPE
    with transaction.atomic():
        accepted = inbox_accept(envelope, consumer=INBOX_CONSUMER, accepted_ref_fn=lambda: "x:1")
    assert messages.scope_of(InboxAcceptance.objects.get(pk=accepted.pk)) == SCOPE
    forged_scope = TrustedRuntimeWorkScope(**forged)
    with pytest.raises(InboxConflict) as fenced:
        inbox_reject_if_unaccepted(scope=forged_scope, family=FLOW_EFFECT_SUBMIT, message_key="key-forged",
                                   payload_digest=message.payload_digest, outbox_message_id=message.pk,
                                   consumer=INBOX_CONSUMER)
    assert fenced.value.code == "inbox_scope_conflict"
    assert not InboxAcceptance.objects.exclude(org_id=ORG).exists()
    assert not OutboxMessage.objects.exclude(app_installation_id=SCOPE.app_installation_id).exists()


# --- the relay's batches ---------------------------------------------------------------------------------
def _session_commits() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Com_commit'")
        return int(cursor.fetchone()[1])


def test_a_relay_batch_claims_together_delivers_each_and_acknowledges_together(org):
    commands = [_push(f"batch{i}@x.io", f"push-{i}") for i in range(3)]
    before = _session_commits()
    assert outbox_try_deliver_batch()
    # One claim, one consumer transaction per message, one acknowledgement.
    assert _session_commits() - before == 1 + len(commands) + 1
    for command in commands:
        message = _message(command)
        assert (message.state, message.delivery_attempts) == ("delivered", 1)
        assert RemoteEffect.objects.filter(org_id=ORG, command=command).count() == 1
    assert outbox_try_deliver_batch() is False  # nothing due: no claim


def test_a_poisoned_message_in_a_batch_backs_off_alone(org):
    poisoned_command, healthy_command = _push("a@x.io", "push-a"), _push("b@x.io", "push-b")
    poisoned = _poison(poisoned_command, healthy_command)
    assert outbox_try_deliver_batch()
    assert outbox_try_deliver_batch() is False  # the poisoned one is not due again yet
    backed_off = OutboxMessage.objects.get(org_id=ORG, pk=poisoned.pk)
    assert (backed_off.state, backed_off.delivery_attempts) == ("pending", 1)
    assert backed_off.next_attempt_at > db_now()
    assert not InboxAcceptance.objects.filter(message_key=poisoned.message_key).exists()
    assert _message(healthy_command).state == "delivered"
    assert RemoteEffect.objects.filter(org_id=ORG, command=healthy_command).count() == 1


def test_two_relays_claim_disjoint_batches_without_waiting_for_each_other(org, holds):
    first, second = _push("r1@x.io", "push-r1"), _push("r2@x.io", "push-r2")
    holds.arm("outbox.claim_before_commit")
    a = Worker(lambda: outbox_try_deliver_batch(limit=1), "a")
    a.start()
    marker = holds.wait_held("outbox.claim_before_commit")  # a holds its claim of the first message
    b = Worker(lambda: outbox_try_deliver_batch(), "b")
    b.start()
    b.join(60)
    assert not b.is_alive() and a.is_alive(), "b waited for a's claim"
    assert b.error is None and b.result is True
    assert _message(second).state == "delivered" and _message(first).state == "pending"
    holds.release(marker)
    a.join(60)
    assert a.error is None and a.result is True
    for command in (first, second):
        message = _message(command)
        assert (message.state, message.delivery_attempts) == ("delivered", 1)
        assert InboxAcceptance.objects.filter(message_key=command.idempotency_key).count() == 1
        assert RemoteEffect.objects.filter(org_id=ORG, command=command).count() == 1
