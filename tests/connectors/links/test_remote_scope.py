"""One provider tenant, two accounts: the L2 ``remote_scope`` ties a webhook account to a push account.

Seed 002 keeps finalized remote-locator uniqueness within (owner key,
destination slot, remote scope, remote id). A webhook account and a push
account of the same provider tenant declare the same ``remote_scope``, so a
webhook about a record a push created applies to that record (its link), and
never creates a second local record for the same remote id.
"""
from __future__ import annotations

import time

import pytest
from django.db import transaction

from connectors.models import RemoteLink
from connectors.serving.gates import service_configuration_apply
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_create, record_lock
from runtime_outbox.services import outbound_command_author
from tests.conftest import (
    HUBSPOT_ACCOUNT,
    ORG,
    drain,
    hubspot_event,
    post_signed,
    publish_owner_generations,
    service_document,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")
PORTAL = "portal-62515"


def _serve(billing_url: str, hubspot_url: str, *, shared_scope: bool) -> OrgScope:
    from cutover.services import cutover_greenfield

    org = OrgScope(ORG)
    publish_owner_generations(org, hubspot_push=True)
    document = service_document(billing_url, hubspot_url)
    if shared_scope:
        for account in document["accounts"]:
            if account["account_key"] in ("crm-webhooks", HUBSPOT_ACCOUNT):
                account["remote_scope"] = PORTAL
    service_configuration_apply(org=org, document=document)
    cutover_greenfield(org=org)
    return org


def _push_contact(email: str) -> Record:
    with transaction.atomic():
        record = record_create(org=OrgScope(ORG), object_name="Contact",
                               values={"email": email, "firstname": "Ann", "lastname": "Lee"})
    with transaction.atomic():
        record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        outbound_command_author(scope=SCOPE, effect_root_id=f"root-{record.record_key}", effect_slot_id="push",
                                effect_generation_id="1", contract_key="hubspot.contact", record=record,
                                origin_flow_run_id=None)
    drain()
    return record


def test_a_webhook_about_a_pushed_record_updates_that_record_through_the_push_link(client, billing_sandbox,
                                                                                    hubspot_crm_sandbox):
    _serve(billing_sandbox.base_url, hubspot_crm_sandbox.base_url, shared_scope=True)
    record = _push_contact("ann@x.io")
    link = RemoteLink.objects.get(org_id=ORG, source_record_key=record.record_key)
    assert (link.state, link.remote_scope) == ("active", PORTAL)

    now = int(time.time() * 1000)
    response = post_signed(client, [hubspot_event(9001, int(link.remote_id), now, "firstname", "Annie")])
    assert response.status_code in (200, 202), response.content
    drain()

    contacts = Record.objects.filter(org_id=ORG, object_name="Contact", is_deleted=False)
    assert contacts.count() == 1, "the webhook made a second local record for a remote id a push already links"
    assert contacts.get().fields["firstname"] == "Annie"
    assert RemoteLink.objects.filter(org_id=ORG, live_remote_id=link.remote_id).count() == 1


def test_without_a_shared_scope_each_account_keeps_its_own_locator_space(client, billing_sandbox,
                                                                         hubspot_crm_sandbox):
    _serve(billing_sandbox.base_url, hubspot_crm_sandbox.base_url, shared_scope=False)
    record = _push_contact("bo@x.io")
    link = RemoteLink.objects.get(org_id=ORG, source_record_key=record.record_key)
    assert link.remote_scope == HUBSPOT_ACCOUNT

    response = post_signed(client, [hubspot_event(9002, int(link.remote_id), int(time.time() * 1000),
                                                  "firstname", "Bob")])
    assert response.status_code in (200, 202), response.content
    drain()
    # Nothing declares the two accounts one tenant: the webhook's remote id is another locator space.
    assert Record.objects.get(org_id=ORG, record_key=record.record_key).fields["firstname"] == "Ann"
    inbound = RemoteLink.objects.get(org_id=ORG, remote_scope="crm-webhooks", live_remote_id=link.remote_id)
    assert inbound.source_record_key != record.record_key


@pytest.mark.parametrize("bad", [" portal", "", "a" * 81, 7])
def test_a_malformed_remote_scope_is_refused_at_configuration(billing_sandbox, hubspot_crm_sandbox, bad):
    org = OrgScope(ORG)
    publish_owner_generations(org, hubspot_push=True)
    document = service_document(billing_sandbox.base_url, hubspot_crm_sandbox.base_url)
    document["accounts"][0]["remote_scope"] = bad
    with pytest.raises(NexusError) as caught:
        service_configuration_apply(org=org, document=document)
    assert getattr(caught.value, "code", "") in ("invalid_identity", "configuration_invalid"), caught.value
