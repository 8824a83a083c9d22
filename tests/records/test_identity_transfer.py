"""Identity transfer (merge, conversion) against Runtime owner work (seed 000, "Transfer").

Real MariaDB, the real egress adapter and the CRM objects sandbox over HTTP:
each test counts what the provider saw, so "no provider request" and "the
provider ends with one record" are the sandbox's own counters.
"""
from __future__ import annotations

import threading

import pytest
from django.db import transaction

from connectors.links.link_decisions import link_retire
from connectors.links.link_keys import INBOUND_ACTION_TYPE, PUSH_ACTION_TYPE, inbound_link_create, link_key_for
from connectors.models import RemoteEffect, RemoteLinkEvidence
from connectors.store import RemoteLinkStore
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import IdentityTransfer, Record
from nexusflow.records.services import record_lock, record_write_mirror
from nexusflow.records.store import RecordStore
from nexusflow.records.transfer import (
    OwnerContended,
    OwnerWorkPending,
    TransferAuthorityInactive,
    TransferIdentityConflict,
    TransferInvalid,
    TransferMirrorMismatch,
    TransferMismatch,
    record_convert,
    record_merge,
)
from packs.hubspot.crm_sandbox import CONTACTS_PATH
from runtime_outbox.models import OutboundCommand
from tests.concurrency import Worker
from tests.conftest import HUBSPOT_ACCOUNT, ORG, drain
from tests.records.transfer_helpers import (
    BILLING_CONTRACT,
    BILLING_OWNER,
    CONTACT_CONTRACT,
    CRM_OWNER,
    DESTINATION,
    LEAD_CONTRACT,
    MIRROR,
    active_holders,
    author,
    create,
    deliver,
    fresh,
    links,
    pushed,
    serve,
    snapshot_rows,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

ORG_SCOPE = OrgScope(ORG)
WEBHOOK_ACCOUNT, WEBHOOK_ROUTE = "crm-webhooks", "contacts.webhook"


@pytest.fixture
def crm(billing_sandbox, hubspot_crm_sandbox):
    serve(billing_sandbox.base_url, hubspot_crm_sandbox.base_url)
    return hubspot_crm_sandbox


def merge(source: Record, target: Record, transfer_id: str = "t-1"):
    return record_merge(org=ORG_SCOPE, transfer_id=transfer_id, object_name=source.object_name,
                        source_key=source.record_key, target_key=target.record_key, actor="ops")


def convert(source: Record, transfer_id: str = "c-1", target: Record | None = None):
    return record_convert(org=ORG_SCOPE, transfer_id=transfer_id, source_object=source.object_name,
                          source_key=source.record_key, target_object="Contact",
                          target_key=None if target is None else target.record_key, actor="ops")


def requests(crm) -> int:
    return crm.state()["requests"]


def push_key(object_name: str, record_key: str, action_slot_id: str) -> str:
    """The link key egress computes for a push of that record through that slot."""
    return link_key_for(owner_key=CRM_OWNER, action_slot_id=action_slot_id, action_type=PUSH_ACTION_TYPE,
                        source_object=object_name, source_record_key=record_key, destination_slot_id=DESTINATION)


def webhook_link(record: Record, remote_id: str):
    """The owner's webhook mapping link of ``record`` for ``remote_id`` (its other, exact link of that id)."""
    with transaction.atomic():
        return inbound_link_create(org_id=ORG, owner_key=CRM_OWNER, route_key=WEBHOOK_ROUTE,
                                   destination_slot_id=DESTINATION, source_object=record.object_name,
                                   source_record_key=record.record_key, remote_scope=WEBHOOK_ACCOUNT,
                                   remote_id=remote_id)


# --- authority moves once ---------------------------------------------------------------------------------
def test_merge_moves_remote_authority_once_without_a_provider_request(crm):
    source = pushed("Contact", "ann@x.io", CONTACT_CONTRACT)
    target = create("Contact", "ann.lee@x.io")
    (old,) = links(source)
    remote_id = old.remote_id
    seen = requests(crm)

    result = merge(source, target)

    assert result.created and result.kind == "merge" and result.target_record_key == target.record_key
    assert requests(crm) == seen  # no provider call
    (holder,) = active_holders(remote_id)
    assert (holder.source_object, holder.source_record_key) == ("Contact", target.record_key)
    assert holder.link_key == push_key("Contact", target.record_key, "slot.push.hubspot.contact")
    old = fresh_link(old)
    assert (old.state, old.live_remote_id) == ("retired", None)
    kinds = list(RemoteLinkEvidence.objects.filter(link=old).values_list("kind", "to_state"))
    assert kinds[-1] == ("transferred", "retired")
    assert fresh(target).mirrors == {MIRROR: remote_id}
    assert fresh(source).is_deleted and not fresh(target).is_deleted
    fact = IdentityTransfer.objects.get(org_id=ORG, transfer_id="t-1")
    assert [m["remote_id"] for m in fact.moves] == [remote_id]

    # The target's next save PATCHes the one remote record; nothing creates a second one.
    posts = crm.state()["requests_by_route"].get(f"POST {CONTACTS_PATH}", 0)
    command = author(fresh(target), CONTACT_CONTRACT)
    assert command.link_key == holder.link_key
    drain()
    routes = crm.state()["requests_by_route"]
    assert routes.get(f"POST {CONTACTS_PATH}", 0) == posts
    assert routes[f"PATCH {CONTACTS_PATH}/{remote_id}"] == 1
    assert len(crm.state()["contacts"]) == 1


def fresh_link(link):
    return type(link).objects.get(pk=link.pk)


def test_convert_lead_creates_the_contact_holding_the_link(crm):
    lead = pushed("Lead", "bo@x.io", LEAD_CONTRACT, company="Acme", status="open")
    (lead_link,) = links(lead)
    remote_id = lead_link.remote_id
    assert fresh(lead).mirrors == {MIRROR: remote_id}  # the lead contract mirrors the id
    seen = requests(crm)

    result = convert(lead)

    assert result.created and result.target_created and result.kind == "convert"
    contact = Record.objects.get(org_id=ORG, object_name="Contact", record_key=result.target_record_key)
    assert contact.fields == {"email": "bo@x.io", "firstname": "Bo", "lastname": "Lee"}
    assert contact.mirrors == {MIRROR: remote_id}
    assert fresh(lead).is_deleted and fresh(lead).fields["status"] == "converted"
    assert fresh_link(lead_link).state == "retired"
    (holder,) = active_holders(remote_id)
    assert (holder.source_object, holder.source_record_key, holder.action_slot_id) == (
        "Contact", contact.record_key, "slot.push.hubspot.contact")
    assert holder.snapshot["contract_key"] == CONTACT_CONTRACT and holder.snapshot["source_object"] == "Contact"
    assert requests(crm) == seen
    # Egress computes the same key for the Contact's own contract and PATCHes the lead's remote record.
    command = author(contact, CONTACT_CONTRACT)
    assert command.link_key == holder.link_key == push_key("Contact", contact.record_key, "slot.push.hubspot.contact")
    drain()
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    assert crm.state()["requests_by_route"][f"PATCH {CONTACTS_PATH}/{remote_id}"] == 1
    assert len(crm.state()["contacts"]) == 1


def test_convert_into_an_existing_contact(crm):
    lead = pushed("Lead", "cy@x.io", LEAD_CONTRACT)
    contact = create("Contact", "cy@other.io")
    remote_id = links(lead)[0].remote_id

    result = convert(lead, target=contact)

    assert not result.target_created and result.target_record_key == contact.record_key
    (holder,) = active_holders(remote_id)
    assert holder.source_record_key == contact.record_key
    assert fresh(contact).fields["email"] == "cy@other.io"  # an existing target keeps its fields
    assert fresh(contact).mirrors == {MIRROR: remote_id}


def test_webhooks_about_the_remote_id_apply_to_the_target(crm, client):
    from tests.conftest import hubspot_event, post_signed

    assert post_signed(client, [hubspot_event(1, 7001, 1_700_000_000_000)]).status_code in (200, 202)
    drain()
    (source,) = Record.objects.filter(org_id=ORG, object_name="Contact", is_deleted=False)
    target = create("Contact", "dee@x.io")
    (inbound,) = links(source)
    assert inbound.action_type == INBOUND_ACTION_TYPE

    merge(source, target)

    event = hubspot_event(2, 7001, 1_700_000_001_000, prop="lastname", value="Merged")
    assert post_signed(client, [event]).status_code in (200, 202)
    drain()
    assert fresh(target).fields["lastname"] == "Merged"
    assert Record.objects.filter(org_id=ORG, object_name="Contact", is_deleted=False).count() == 1
    (holder,) = active_holders("7001")
    assert (holder.source_record_key, holder.action_type) == (target.record_key, INBOUND_ACTION_TYPE)


# --- S000 owner checks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["source", "target"])
def test_unfinished_create_intent_refuses_the_transfer_until_it_completes(crm, side):
    source = pushed("Contact", "eve@x.io", CONTACT_CONTRACT)
    target = create("Contact", "eve.lee@x.io")
    busy = source if side == "source" else target
    command = author(fresh(busy), BILLING_CONTRACT)  # pending: the outbox message is not delivered
    before = snapshot_rows()

    with pytest.raises(OwnerWorkPending) as pending:
        merge(source, target)
    assert pending.value.code == "owner_outbound_pending" and pending.value.retryable
    assert [i.command_id for i in pending.value.intents] == [int(command.pk)]
    assert snapshot_rows() == before

    deliver()  # accepted: delivered to the Connector, no result yet
    with pytest.raises(OwnerWorkPending) as accepted:
        merge(source, target)
    assert accepted.value.intents[0].state == "accepted"
    assert snapshot_rows() == before

    drain()  # the create completes (a result receipt exists)
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    result = merge(source, target)
    assert result.created
    owners = {m["owner_key"] for m in result.moves}
    assert CRM_OWNER in owners and (BILLING_OWNER in owners) == (side == "source")
    assert fresh(source).is_deleted


def test_an_intent_locked_by_a_committing_result_is_contended_at_once(crm):
    source = pushed("Contact", "fay@x.io", CONTACT_CONTRACT)
    target = pushed("Contact", "fay.lee@x.io", BILLING_CONTRACT)
    (intent,) = OutboundCommand.objects.filter(source_record_key=target.record_key)
    locked, release = threading.Event(), threading.Event()

    def hold_intent():
        with transaction.atomic():
            OutboundCommand.objects.select_for_update().get(pk=intent.pk)
            locked.set()
            release.wait(60)

    holder = Worker(hold_intent, "result-commit")
    holder.start()
    assert locked.wait(60)
    before = snapshot_rows()
    try:
        with pytest.raises(OwnerContended) as contended:
            merge(source, target)
    finally:
        release.set()
        holder.join(60)
    assert holder.error is None
    assert contended.value.code == "owner_contended" and contended.value.retry_after > 0
    assert snapshot_rows() == before
    assert merge(source, target).created  # the retry succeeds once the result committed


def test_the_same_transfer_racing_itself_transfers_once(crm, holds):
    from tests.concurrency import race_behind_hold

    source = pushed("Contact", "gil@x.io", CONTACT_CONTRACT)
    target = create("Contact", "gil.lee@x.io")
    remote_id = links(source)[0].remote_id

    held, queued = race_behind_hold(holds, "records.transfer.before_commit", lambda: merge(source, target),
                                    lambda: merge(source, target), "records_record")

    assert held.error is None and queued.error is None, (held.error, queued.error)
    assert (held.result.created, queued.result.created) == (True, False)
    assert queued.result.moves == held.result.moves
    assert IdentityTransfer.objects.filter(org_id=ORG).count() == 1
    assert [lk.source_record_key for lk in active_holders(remote_id)] == [target.record_key]


# --- S000-T-06 multiple owners -------------------------------------------------------------------------------
def test_multiple_owners_move_together_and_exact_links_coexist(crm):
    source = pushed("Contact", "gus@x.io", CONTACT_CONTRACT, BILLING_CONTRACT)
    crm_link = next(lk for lk in links(source) if lk.owner_key == CRM_OWNER)
    billing_link = next(lk for lk in links(source) if lk.owner_key == BILLING_OWNER)
    remote_id, customer_id = crm_link.remote_id, billing_link.remote_id
    webhook_link(source, remote_id)  # the owner's exact second link (its webhook mapping) of the same id
    target = create("Contact", "gus.lee@x.io")
    seen = requests(crm)

    result = merge(source, target)

    assert sorted(result.as_dict()["owners"]) == [BILLING_OWNER, CRM_OWNER]
    assert len(result.moves) == 3
    assert links(source, state="active") == []
    moved = links(target, state="active")
    assert sorted((lk.owner_key, lk.action_type, lk.remote_scope, lk.remote_id) for lk in moved) == sorted([
        (CRM_OWNER, PUSH_ACTION_TYPE, HUBSPOT_ACCOUNT, remote_id),
        (CRM_OWNER, INBOUND_ACTION_TYPE, WEBHOOK_ACCOUNT, remote_id),
        (BILLING_OWNER, PUSH_ACTION_TYPE, "billing-main", customer_id)])
    assert fresh(target).mirrors == {MIRROR: remote_id, "billing_id": customer_id}
    assert requests(crm) == seen
    # Replay validates each owner separately and accepts the owner's two exact links.
    before = snapshot_rows()
    replay = merge(source, target)
    assert not replay.created and replay.moves == result.moves
    assert snapshot_rows() == before


def test_an_exact_link_already_on_the_target_coexists_and_another_owner_conflicts_alone(crm):
    source = pushed("Contact", "hal@x.io", CONTACT_CONTRACT, BILLING_CONTRACT)
    remote_id = next(lk for lk in links(source) if lk.owner_key == CRM_OWNER).remote_id
    target = pushed("Contact", "hal.lee@x.io", BILLING_CONTRACT)  # another billing customer
    webhook_link(target, remote_id)  # the same owner's exact link of the same remote id
    before = snapshot_rows()

    with pytest.raises(TransferIdentityConflict) as conflict:
        merge(source, target)
    assert conflict.value.code == "transfer_identity_conflict" and BILLING_OWNER in str(conflict.value)
    assert snapshot_rows() == before

    third = pushed("Contact", "ian@x.io", CONTACT_CONTRACT)
    third_id = links(third)[0].remote_id
    fourth = create("Contact", "ian.lee@x.io")
    webhook_link(fourth, third_id)
    result = merge(third, fourth, "t-exact")
    assert result.created
    assert sorted(lk.action_type for lk in links(fourth, state="active")) == [INBOUND_ACTION_TYPE, PUSH_ACTION_TYPE]
    assert {lk.remote_id for lk in links(fourth, state="active")} == {third_id}


# --- conflicts fail closed -------------------------------------------------------------------------------------
def test_target_with_another_remote_id_is_an_identity_conflict(crm):
    source = pushed("Contact", "jo@x.io", CONTACT_CONTRACT)
    target = pushed("Contact", "jo.lee@x.io", CONTACT_CONTRACT)
    before = snapshot_rows()
    with pytest.raises(TransferIdentityConflict):
        merge(source, target)
    assert snapshot_rows() == before
    assert not IdentityTransfer.objects.exists()


def test_target_mapped_to_another_remote_id_by_another_slot_is_an_identity_conflict(crm):
    source = pushed("Contact", "jan@x.io", CONTACT_CONTRACT)
    target = create("Contact", "jan.lee@x.io")
    webhook_link(target, "818181")  # same owner and destination, another slot and scope, another remote record
    before = snapshot_rows()
    with pytest.raises(TransferIdentityConflict) as conflict:
        merge(source, target)
    assert "818181" in str(conflict.value)
    assert snapshot_rows() == before


def test_suspended_source_link_is_inactive_authority(crm):
    source = pushed("Contact", "kim@x.io", CONTACT_CONTRACT)
    target = create("Contact", "kim.lee@x.io")
    (link,) = links(source)
    with transaction.atomic():
        locked = RemoteLinkStore.lock(ORG, link.pk)
        RemoteLinkStore.transition(org_id=ORG, pk=link.pk, src="active", dst="suspended_drift",
                                   version=locked.version, set_fields={"reason_code": "remote_not_found"})
    before = snapshot_rows()
    with pytest.raises(TransferAuthorityInactive) as inactive:
        merge(source, target)
    assert inactive.value.code == "transfer_authority_inactive"
    assert snapshot_rows() == before


def test_retired_source_link_is_inactive_authority(crm):
    source = pushed("Contact", "lou@x.io", CONTACT_CONTRACT)
    target = create("Contact", "lou.lee@x.io")
    link_retire(org_id=ORG, link_key=links(source)[0].link_key, actor="ops", reason="remote record removed")
    before = snapshot_rows()
    with pytest.raises(TransferAuthorityInactive):
        merge(source, target)
    assert snapshot_rows() == before


def test_target_mirror_disagreeing_with_the_link_is_a_mismatch(crm):
    source = pushed("Contact", "max@x.io", CONTACT_CONTRACT)
    target = create("Contact", "max.lee@x.io")
    with transaction.atomic():
        record_write_mirror(org=ORG_SCOPE, record=record_lock(org=ORG_SCOPE, object_name="Contact",
                                                              record_key=target.record_key),
                            field=MIRROR, value="999999")
    before = snapshot_rows()
    with pytest.raises(TransferMirrorMismatch) as mismatch:
        merge(source, target)
    assert mismatch.value.code == "transfer_mirror_mismatch"
    assert snapshot_rows() == before


def test_merge_into_itself_is_invalid(crm):
    record = create("Contact", "ned@x.io")
    with pytest.raises(TransferInvalid):
        merge(record, record)


# --- replay -------------------------------------------------------------------------------------------------------
def test_valid_replay_returns_the_stored_result_and_writes_nothing(crm):
    lead = pushed("Lead", "oli@x.io", LEAD_CONTRACT)
    first = convert(lead)
    before, seen = snapshot_rows(), requests(crm)

    again = convert(lead)

    assert not again.created
    assert again.as_dict() | {"created": True} == first.as_dict()
    assert snapshot_rows() == before and requests(crm) == seen
    with pytest.raises(TransferMismatch) as mismatch:
        record_merge(org=ORG_SCOPE, transfer_id="c-1", object_name="Lead", source_key=lead.record_key,
                     target_key=first.target_record_key, actor="ops")
    assert mismatch.value.code == "transfer_mismatch"


def _completed_merge(crm):
    source = pushed("Contact", "pia@x.io", CONTACT_CONTRACT)
    target = create("Contact", "pia.lee@x.io")
    merge(source, target)
    (moved,) = links(target, state="active")
    return source, fresh(target), moved


def test_replay_after_the_target_link_retired_is_inactive_authority(crm):
    source, target, moved = _completed_merge(crm)
    link_retire(org_id=ORG, link_key=moved.link_key, actor="ops", reason="gone")
    before = snapshot_rows()
    with pytest.raises(TransferAuthorityInactive):
        merge(source, target)
    assert snapshot_rows() == before


def test_replay_with_another_identity_on_the_target_is_a_conflict(crm):
    source, target, moved = _completed_merge(crm)
    webhook_link(target, "424242")  # the same owner and destination now name another remote record
    with pytest.raises(TransferIdentityConflict):
        merge(source, target)


def test_replay_with_a_changed_mirror_is_a_mismatch(crm):
    source, target, moved = _completed_merge(crm)
    with transaction.atomic():
        locked = RecordStore.lock(ORG, "Contact", target.record_key)
        RecordStore.write(locked, mirrors={MIRROR: "555"})
    with pytest.raises(TransferMirrorMismatch):
        merge(source, target)
