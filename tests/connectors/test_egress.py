"""Outbound intents -> one RemoteEffect -> DispatchPermit -> provider (seed 003 "Outbound facts", seed 002)."""
import threading

import pytest
from django.db import connection, transaction

from connectors.egress import (
    effect_try_dispatch_one,
    permit_send,
    permit_try_grant_one,
)
from connectors.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteLink
from connectors.outbound import remote_effect_accept
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.services import record_create, record_lock, record_update
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.conftest import ORG, drain, make_serving_org

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")


@pytest.fixture
def org(billing_sandbox):
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def _contact(**fields):
    with transaction.atomic():
        return record_create(org=OrgScope(ORG), object_name="Contact", values=fields)


def _author(record_key, slot, **changes):
    with transaction.atomic():
        record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record_key)
        if changes:
            record_update(org=OrgScope(ORG), record=record, changes=changes)
        return outbound_command_author(scope=SCOPE, effect_root_id="root-" + record_key, effect_slot_id=slot,
                                       effect_generation_id="1", contract_key="billing.customer", record=record,
                                       origin_flow_run_id=None)


def _zero_backoff():
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_remoteeffect SET next_attempt_at = NULL")


def test_first_push_creates_then_later_pushes_update_through_the_link(org, billing_sandbox):
    contact = _contact(email="ann@x.io", firstname="Ann", lastname="Lee", lifecyclestage="customer")
    _author(contact.record_key, "push-1")
    drain()
    customers = billing_sandbox.state()["customers"]
    assert [(c["email"], c["name"], c["create_requests"]) for c in customers] == [("ann@x.io", "Ann Lee", 1)]
    link = RemoteLink.objects.get(action_type="PushToConnector")
    assert link.remote_id == customers[0]["id"] and link.state == "active"
    contact.refresh_from_db()
    assert contact.mirrors["billing_id"] == link.remote_id
    _author(contact.record_key, "push-2", lastname="Lee-Park")
    drain()
    customers = billing_sandbox.state()["customers"]
    assert len(customers) == 1
    assert customers[0]["name"] == "Ann Lee-Park" and customers[0]["update_requests"] == 1
    assert [a.operation for a in RemoteEffectAttempt.objects.order_by("id")] == ["create", "update"]
    assert set(IntentResultReceipt.objects.values_list("outcome", flat=True)) == {"finalized"}


def test_change_saved_while_create_in_flight_follows_as_update(org, billing_sandbox):
    contact = _contact(email="bo@x.io", firstname="Bo", lifecyclestage="customer")
    _author(contact.record_key, "push-1")
    _author(contact.record_key, "push-2", email="bo@new.io")
    outbox_try_deliver_one()
    outbox_try_deliver_one()
    grant = permit_try_grant_one(worker_id="t")
    assert grant is not None
    # While the create is in flight, the later intent is not dispatchable.
    assert permit_try_grant_one(worker_id="t2") is None
    drain()
    assert billing_sandbox.state()["requests"] == 0  # neither the granted create nor the update went out
    from connectors.egress import permit_settle

    permit_settle(grant, permit_send(grant))
    drain()
    customers = billing_sandbox.state()["customers"]
    assert len(customers) == 1
    assert customers[0]["email"] == "bo@new.io" and customers[0]["create_requests"] == 1
    assert RemoteEffect.objects.filter(state="finalized").count() == 2


def test_lost_response_is_repeated_byte_identically_under_the_same_key(org, billing_sandbox):
    contact = _contact(email="cy@x.io", firstname="Cy", lifecyclestage="customer")
    _author(contact.record_key, "push-1")
    billing_sandbox.set_faults(drop_response_after_commit=1)
    outbox_try_deliver_one()
    assert effect_try_dispatch_one(worker_id="t") is True
    effect = RemoteEffect.objects.get()
    assert effect.state == "uncertain"
    _zero_backoff()
    drain()
    effect.refresh_from_db()
    assert effect.state == "finalized"
    customers = billing_sandbox.state()["customers"]
    assert len(customers) == 1 and customers[0]["create_requests"] == 2
    first, second = RemoteEffectAttempt.objects.order_by("attempt_number")
    assert first.state == "uncertain" and second.state == "confirmed"
    assert bytes(first.request_body) == bytes(second.request_body)
    assert first.idempotency_key == second.idempotency_key != ""


def test_definite_refusal_is_terminal_no_effect(org, billing_sandbox):
    contact = _contact(email="di@x.io", firstname="Di", lifecyclestage="customer")
    command = _author(contact.record_key, "push-1")
    billing_sandbox.set_faults(fail_before_commit={"status": 400, "count": 1})
    drain()
    effect = RemoteEffect.objects.get()
    assert effect.state == "no_effect" and effect.reason_code == "definite_refusal"
    assert IntentResultReceipt.objects.get(command=command).outcome == "no_effect"
    _zero_backoff()
    drain()
    assert RemoteEffectAttempt.objects.count() == 1
    assert billing_sandbox.state()["customers"] == []


def test_connection_refused_proves_no_effect_and_retries(org, billing_sandbox):
    contact = _contact(email="ed@x.io", firstname="Ed", lifecyclestage="customer")
    _author(contact.record_key, "push-1")
    billing_sandbox.stop()
    outbox_try_deliver_one()
    assert effect_try_dispatch_one(worker_id="t") is True
    effect = RemoteEffect.objects.get()
    assert effect.state == "prepared"
    assert RemoteEffectAttempt.objects.get().state == "no_effect"
    assert DispatchPermit.objects.get().state == "returned"


def test_outbox_redelivery_converges_on_one_effect(org):
    contact = _contact(email="fa@x.io", firstname="Fa", lifecyclestage="customer")
    command = _author(contact.record_key, "push-1")
    again = _author(contact.record_key, "push-1")
    assert again.pk == command.pk
    effects, barrier = [], threading.Barrier(3)

    def deliver():
        try:
            barrier.wait()
            effects.append(remote_effect_accept(command=OutboundCommand.objects.get(pk=command.pk)).pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(effects)) == 1 and len(effects) == 3
    assert RemoteEffect.objects.count() == 1


def test_a_permit_sends_once(org, billing_sandbox):
    contact = _contact(email="gi@x.io", firstname="Gi", lifecyclestage="customer")
    _author(contact.record_key, "push-1")
    outbox_try_deliver_one()
    grant = permit_try_grant_one(worker_id="t")
    assert permit_send(grant) is not None
    assert permit_send(grant) is None
    assert billing_sandbox.state()["requests"] == 1
    assert DispatchPermit.objects.get().state == "sending"


def test_empty_mapping_fails_closed_before_any_post(org, billing_sandbox):
    from connectors.outbound import PushContractError

    contact = _contact(lifecyclestage="customer")
    with pytest.raises(PushContractError):
        _author(contact.record_key, "push-1")
    assert OutboundCommand.objects.count() == 0
    assert billing_sandbox.state()["requests"] == 0
