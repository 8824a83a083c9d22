"""Shared set-up for identity transfer tests: a serving org whose CRM objects account also pushes leads.

The CRM objects account serves ``hubspot.contact``, ``hubspot.company`` and
``hubspot.lead`` (the lead contract pushes to the same destination slot as
contacts); the billing account serves ``billing.customer``. Records are
pushed the way a record-triggered Flow does (one intent per save) and
drained through the real egress adapter against the in-process sandboxes.
"""
from __future__ import annotations

import itertools

from django.db import transaction

from connectors.models import RemoteLink
from connectors.serving.gates import service_configuration_apply
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_create, record_lock
from runtime_outbox.models import OutboundCommand
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.conftest import HUBSPOT_ACCOUNT, ORG, drain, publish_owner_generations, service_document

SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")
CONTACT_CONTRACT, LEAD_CONTRACT, BILLING_CONTRACT = "hubspot.contact", "hubspot.lead", "billing.customer"
DESTINATION = "dest.hubspot.contact"
CRM_OWNER, BILLING_OWNER = "pack.hubspot", "pack.billing"
MIRROR = "hubspot_contact_id"

_saves = itertools.count(1)


def serve(billing_url: str, hubspot_url: str) -> OrgScope:
    """Configure and cut over ``ORG`` with the lead contract added to the CRM objects account."""
    from cutover.services import cutover_greenfield

    org = OrgScope(ORG)
    publish_owner_generations(org, hubspot_push=True)
    document = service_document(billing_url, hubspot_url)
    for account in document["accounts"]:
        if account["account_key"] == HUBSPOT_ACCOUNT:
            account["push_contracts"] = [*account["push_contracts"], LEAD_CONTRACT]
    service_configuration_apply(org=org, document=document)
    cutover_greenfield(org=org)
    return org


def create(object_name: str, email: str, **fields) -> Record:
    values = {"email": email, "firstname": email.split("@")[0].title(), "lastname": "Lee", **fields}
    with transaction.atomic():
        return record_create(org=OrgScope(ORG), object_name=object_name, values=values)


def author(record: Record, contract: str) -> OutboundCommand:
    """One save of ``record`` authoring a push intent for ``contract`` (delivered to the Connector)."""
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name=record.object_name, record_key=record.record_key)
        command = outbound_command_author(
            scope=SCOPE, effect_root_id=f"root-{contract}-{record.record_key}",
            effect_slot_id=f"save-{next(_saves)}", effect_generation_id="1", contract_key=contract, record=locked,
            origin_flow_run_id=None)
    return command


def deliver() -> None:
    while outbox_try_deliver_one():
        pass


def pushed(object_name: str, email: str, *contracts: str, **fields) -> Record:
    """A record pushed (created remotely, linked, finalized) through each of ``contracts``."""
    record = create(object_name, email, **fields)
    for contract in contracts:
        author(record, contract)
    drain()
    return fresh(record)


def fresh(record: Record) -> Record:
    return Record.objects.get(pk=record.pk)


def links(record_or_key, *, state: str | None = None) -> list[RemoteLink]:
    key = record_or_key if isinstance(record_or_key, str) else record_or_key.record_key
    found = RemoteLink.objects.filter(org_id=ORG, source_record_key=key).order_by("id")
    return list(found if state is None else found.filter(state=state))


def active_holders(remote_id: str, owner_key: str = CRM_OWNER) -> list[RemoteLink]:
    """Every active link of ``owner_key`` holding ``remote_id`` (any scope)."""
    return list(RemoteLink.objects.filter(org_id=ORG, owner_key=owner_key, live_remote_id=remote_id, state="active"))


def table_counts() -> dict[str, int]:
    """Row counts of every table a transfer may write (to prove a refusal or a replay wrote nothing)."""
    from connectors.models import RemoteLinkEvidence
    from nexusflow.records.models import IdentityTransfer

    return {"links": RemoteLink.objects.count(), "evidence": RemoteLinkEvidence.objects.count(),
            "transfers": IdentityTransfer.objects.count(), "records": Record.objects.count(),
            "live_records": Record.objects.filter(is_deleted=False).count()}


def snapshot_rows() -> tuple:
    """Every link and record row's mutable columns (a stronger "nothing changed" than counts)."""
    link_rows = tuple(RemoteLink.objects.order_by("id").values_list("id", "state", "version", "live_remote_id"))
    record_rows = tuple(Record.objects.order_by("id").values_list("id", "version", "is_deleted", "mirrors"))
    return link_rows, record_rows, tuple(table_counts().items())
