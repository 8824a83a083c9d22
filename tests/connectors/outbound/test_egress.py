"""Outbound intents -> one RemoteEffect -> DispatchPermit -> provider (seed 003 "Outbound facts", seed 002)."""
import threading

import pytest
from django.db import connection

from connectors.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteLink
from connectors.outbound.egress import (
    effect_try_dispatch_one,
    permit_send,
    permit_try_grant_one,
)
from connectors.outbound.intents import remote_effect_accept
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import outbox_try_deliver_one
from tests.conftest import drain, make_serving_org
from tests.kits.outbound import author, zero_backoff
from tests.kits.records import create_contact

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def org(billing_sandbox):
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def test_first_push_creates_then_later_pushes_update_through_the_link(org, billing_sandbox):
    contact = create_contact(email="ann@x.io", firstname="Ann", lastname="Lee", lifecyclestage="customer")
    author(contact.record_key, "push-1")
    drain()
    customers = billing_sandbox.state()["customers"]
    assert [(c["email"], c["name"], c["create_requests"]) for c in customers] == [("ann@x.io", "Ann Lee", 1)]
    link = RemoteLink.objects.get(action_type="PushToConnector")
    assert link.remote_id == customers[0]["id"] and link.state == "active"
    contact.refresh_from_db()
    assert contact.mirrors["billing_id"] == link.remote_id
    author(contact.record_key, "push-2", lastname="Lee-Park")
    drain()
    customers = billing_sandbox.state()["customers"]
    assert len(customers) == 1
    assert customers[0]["name"] == "Ann Lee-Park" and customers[0]["update_requests"] == 1
    assert [a.operation for a in RemoteEffectAttempt.objects.order_by("id")] == ["create", "update"]
    assert set(IntentResultReceipt.objects.values_list("outcome", flat=True)) == {"finalized"}


def test_change_saved_while_create_in_flight_follows_as_update(org, billing_sandbox):
    contact = create_contact(email="bo@x.io", firstname="Bo", lifecyclestage="customer")
    author(contact.record_key, "push-1")
    author(contact.record_key, "push-2", email="bo@new.io")
    outbox_try_deliver_one()
    outbox_try_deliver_one()
    grant = permit_try_grant_one(worker_id="t")
    assert grant is not None
    # While the create is in flight, the later intent is not dispatchable.
    assert permit_try_grant_one(worker_id="t2") is None
    drain()
    assert billing_sandbox.state()["requests"] == 0  # neither the granted create nor the update went out
    from connectors.outbound.egress import permit_settle

    permit_settle(grant, permit_send(grant))
    drain()
    customers = billing_sandbox.state()["customers"]
    assert len(customers) == 1
    assert customers[0]["email"] == "bo@new.io" and customers[0]["create_requests"] == 1
    assert RemoteEffect.objects.filter(state="finalized").count() == 2


def test_lost_response_is_repeated_byte_identically_under_the_same_key(org, billing_sandbox):
    contact = create_contact(email="cy@x.io", firstname="Cy", lifecyclestage="customer")
    author(contact.record_key, "push-1")
    billing_sandbox.set_faults(drop_response_after_commit=1)
    outbox_try_deliver_one()
    assert effect_try_dispatch_one(worker_id="t") is True
    effect = RemoteEffect.objects.get()
    assert effect.state == "uncertain"
    zero_backoff()
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
    contact = create_contact(email="di@x.io", firstname="Di", lifecyclestage="customer")
    command = author(contact.record_key, "push-1")
    billing_sandbox.set_faults(fail_before_commit={"status": 400, "count": 1})
    drain()
    effect = RemoteEffect.objects.get()
    assert effect.state == "no_effect" and effect.reason_code == "definite_refusal"
    assert IntentResultReceipt.objects.get(command=command).outcome == "no_effect"
    zero_backoff()
    drain()
    assert RemoteEffectAttempt.objects.count() == 1
    assert billing_sandbox.state()["customers"] == []


def test_connection_refused_proves_no_effect_and_retries(org, billing_sandbox):
    contact = create_contact(email="ed@x.io", firstname="Ed", lifecyclestage="customer")
    author(contact.record_key, "push-1")
    billing_sandbox.stop()
    outbox_try_deliver_one()
    assert effect_try_dispatch_one(worker_id="t") is True
    effect = RemoteEffect.objects.get()
    assert effect.state == "prepared"
    assert RemoteEffectAttempt.objects.get().state == "no_effect"
    assert DispatchPermit.objects.get().state == "returned"


def test_outbox_redelivery_converges_on_one_effect(org):
    contact = create_contact(email="fa@x.io", firstname="Fa", lifecyclestage="customer")
    command = author(contact.record_key, "push-1")
    again = author(contact.record_key, "push-1")
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
    contact = create_contact(email="gi@x.io", firstname="Gi", lifecyclestage="customer")
    author(contact.record_key, "push-1")
    outbox_try_deliver_one()
    grant = permit_try_grant_one(worker_id="t")
    assert permit_send(grant) is not None
    assert permit_send(grant) is None
    assert billing_sandbox.state()["requests"] == 1
    assert DispatchPermit.objects.get().state == "sending"


def test_empty_mapping_fails_closed_before_any_post(org, billing_sandbox):
    from connectors.outbound.intents import PushContractError

    contact = create_contact(lifecyclestage="customer")
    with pytest.raises(PushContractError):
        author(contact.record_key, "push-1")
    assert OutboundCommand.objects.count() == 0
    assert billing_sandbox.state()["requests"] == 0
