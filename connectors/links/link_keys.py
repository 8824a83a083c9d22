"""RemoteLink reads and writes (seed 002 "Link Key", "Source Of Truth").

The link is the only external-identity authority: inbound upserts find the
local record through it, and PATCH goes through it, never through a record
mirror field.
"""
from __future__ import annotations

from connectors.models import RemoteLink
from connectors.store import RemoteLinkStore
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.rows import first_row

INBOUND_ACTION_TYPE = "InboundUpsert"
PUSH_ACTION_TYPE = "PushToConnector"


def link_key_for(*, owner_key: str, action_slot_id: str, action_type: str, source_object: str,
                 source_record_key: str, destination_slot_id: str) -> str:
    """Seed 002 ``link_key``: a profiled hash over the stable slot ids (64 hex chars)."""
    return digest_v2("connectors.link-key", [
        ("ConnectorOwnerKey", owner_key), ("ActionSlotId", action_slot_id), ("ActionType", action_type),
        ("SourceObject", source_object), ("SourceRecordId", source_record_key),
        ("DestinationSlotId", destination_slot_id)]).hexdigest


def account_remote_scope(account: dict) -> str:
    """The remote-locator scope of a frozen L2 account: its ``remote_scope`` or, when none is declared, its key.

    Accounts that reach one provider tenant (a webhook account and a push
    account of the same portal) declare the same ``remote_scope``, so a
    webhook about a record created by a push finds the push's link (seed 002
    finalized remote-locator uniqueness is within owner key, destination
    slot, remote scope and remote id).
    """
    return account.get("remote_scope") or account["account_key"]


def effect_remote_scope(effect, binding: dict | None = None) -> str:
    """The remote-locator scope a RemoteEffect's link lives in: its frozen account's ``remote_scope``, else its key."""
    binding = effect.command.frozen_binding if binding is None else binding
    return binding.get("remote_scope") or effect.account_key


def serving_remote_scope(*, org_id: str, account_key: str) -> str:
    """The remote scope of ``account_key`` in its gate's current epoch (the key itself when unknown)."""
    from connectors.models import AccountServingGate

    gate = AccountServingGate.objects.filter(org_id=org_id, account_key=account_key).select_related("epoch").first()
    if gate is None or gate.epoch is None:
        return account_key
    account = next((a for a in gate.epoch.document["accounts"] if a["account_key"] == account_key), None)
    return account_remote_scope(account) if account else account_key


def inbound_link_find(*, org_id: str, owner_key: str, destination_slot_id: str, remote_scope: str,
                      remote_id: str) -> RemoteLink | None:
    """The non-retired link holding ``remote_id`` in that slot, if any (byte-exact)."""
    return first_row(RemoteLink, org_id=org_id, owner_key=owner_key, destination_slot_id=destination_slot_id,
                     remote_scope=remote_scope, live_remote_id=remote_id)


def inbound_link_create(*, org_id: str, owner_key: str, route_key: str, destination_slot_id: str, source_object: str,
                        source_record_key: str, remote_scope: str, remote_id: str) -> RemoteLink:
    """Create the link of a record created from an inbound event.

    Raises:
        django.db.IntegrityError: a concurrent transaction linked the same
            remote id first; the caller's transaction must roll back and retry.
    """
    key = link_key_for(owner_key=owner_key, action_slot_id=route_key, action_type=INBOUND_ACTION_TYPE,
                       source_object=source_object, source_record_key=source_record_key,
                       destination_slot_id=destination_slot_id)
    return RemoteLinkStore.create(
        org_id=org_id, link_key=key, owner_key=owner_key, action_slot_id=route_key, action_type=INBOUND_ACTION_TYPE,
        destination_slot_id=destination_slot_id, source_object=source_object, source_record_key=source_record_key,
        remote_scope=remote_scope, remote_id=remote_id, live_remote_id=remote_id, state="active",
        snapshot={"direction": "inbound"})


def link_for_key(*, org_id: str, link_key: str) -> RemoteLink | None:
    return first_row(RemoteLink, org_id=org_id, link_key=link_key)


def record_links_describe(*, org_id: str, object_name: str, record_key: str) -> list[dict]:
    """The record's remote links for support views, ascending id, read without locks.

    Returns:
        ``[{"link": id, "link_key", "action_type", "state", "reason_code", "remote_id"}]``.
    """
    links = RemoteLink.objects.filter(org_id=org_id, source_object=object_name,
                                      source_record_key=record_key).order_by("id")
    return [{"link": int(link.pk), "link_key": link.link_key, "action_type": link.action_type,
             "state": link.state, "reason_code": link.reason_code, "remote_id": link.remote_id}
            for link in links]
