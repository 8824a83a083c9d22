"""The record REST endpoints enforce the org's access policy for the calling operator (issue 23 item 1).

An org's access policy maps operator login names to its users (``operators``); over REST the operator acts
as that user: object permissions, field-level security and record access (ownership, shares, the org-wide
default) decide each create, update and delete, under the record lock, and a refusal answers 403
``access_denied`` and writes nothing. An operator the policy does not map may do nothing; an org without a
policy stays unrestricted. Real MariaDB, the Django test client as the operator.
"""
from __future__ import annotations

import copy

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction

from nexusflow.kernel.scope import OrgScope
from nexusflow.records.access_services import access_policy_publish, record_share_set
from nexusflow.records.models import Record
from nexusflow.records.services import record_create
from tests.conftest import ORG

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

OBJECT = "Contact"
FIELDS = ("email", "firstname", "lastname", "lifecyclestage", "account_id")


def _policy(*, ops=("create", "read", "edit", "delete"), edit_fields=FIELDS, map_operator: bool = True) -> dict:
    document = {
        "users": [{"id": "u-ada", "active": True, "email": "", "name": "Ada", "permission_sets": ["sales"],
                   "fields": {}},
                  {"id": "u-bob", "active": True, "email": "", "name": "Bob", "permission_sets": ["sales"],
                   "fields": {}},
                  {"id": "automated_process", "active": True, "email": "", "name": "Automated Process",
                   "permission_sets": ["sales"], "fields": {}}],
        "permission_sets": {"sales": {
            "objects": {OBJECT: list(ops)},
            "fields": {OBJECT: {f: (["read", "edit"] if f in edit_fields else ["read"]) for f in FIELDS}},
            "view_all": [], "modify_all": []}},
        "sharing": {OBJECT: "private"}}
    if map_operator:
        document["operators"] = {"ada-login": "u-ada"}
    return document


def _publish(document: dict) -> None:
    access_policy_publish(org_id=ORG, document=copy.deepcopy(document), authored_by="ops", reason="test")


@pytest.fixture
def operator(client):
    user = User.objects.create_user("ada-login", password="pw", is_staff=True)
    with transaction.atomic():
        user.groups.add(Group.objects.create(name=f"org:{ORG}"))
    client.force_login(user)
    return client


def _bobs_contact() -> Record:
    with transaction.atomic():
        return record_create(org=OrgScope(ORG), object_name=OBJECT, values={"email": "bob@example.com",
                                                                          "lastname": "Bob"}, owner_id="u-bob")


def _create(client, **fields):
    return client.post(f"/api/v2/records/{OBJECT}/", {"fields": fields}, content_type="application/json")


def _patch(client, record: Record, **fields):
    return client.patch(f"/api/v2/records/{OBJECT}/{record.record_key}/", {"fields": fields},
                        content_type="application/json")


def _contacts() -> int:
    return Record.objects.filter(org_id=ORG, object_name=OBJECT).count()


def test_a_create_needs_the_object_permission_and_field_edit_and_the_caller_owns_the_record(operator):
    _publish(_policy(ops=("read",)))
    refused = _create(operator, email="new@example.com")
    assert (refused.status_code, refused.json()["error"]) == (403, "access_denied") and _contacts() == 0
    _publish(_policy(edit_fields=("firstname",)))
    refused = _create(operator, firstname="Ann", email="ann@example.com")
    assert refused.status_code == 403 and "email" in refused.json()["detail"] and _contacts() == 0
    _publish(_policy())
    created = _create(operator, firstname="Ann", email="ann@example.com")
    assert created.status_code == 201, created.content
    assert Record.objects.get(org_id=ORG, record_key=created.json()["record_key"]).owner_id == "u-ada"


def test_an_operator_the_policy_does_not_map_may_do_nothing(operator):
    record = _bobs_contact()
    _publish(_policy(map_operator=False))
    assert _create(operator, email="x@example.com").status_code == 403
    assert _patch(operator, record, lastname="Changed").json()["error"] == "access_denied"
    assert operator.delete(f"/api/v2/records/{OBJECT}/{record.record_key}/").status_code == 403
    assert Record.objects.get(pk=record.pk).fields["lastname"] == "Bob" and not Record.objects.get(pk=record.pk).is_deleted


def test_an_update_needs_record_access_and_field_edit_under_the_record_lock(operator):
    record = _bobs_contact()
    _publish(_policy())
    refused = _patch(operator, record, lastname="Ada was here")
    assert (refused.status_code, refused.json()["error"]) == (403, "access_denied")  # Bob's, private, no share
    record_share_set(org_id=ORG, object_name=OBJECT, record_key=record.record_key, user_id="u-ada", access="edit",
                     authored_by="bob", reason="covering")
    assert _patch(operator, record, lastname="Shared").status_code == 200
    _publish(_policy(edit_fields=("firstname",)))
    refused = _patch(operator, record, lastname="FLS")
    assert refused.status_code == 403 and "lastname" in refused.json()["detail"]
    assert Record.objects.get(pk=record.pk).fields["lastname"] == "Shared"


def test_a_share_never_grants_deletion_and_the_owner_deletes(operator, client):
    record = _bobs_contact()
    _publish(_policy())
    record_share_set(org_id=ORG, object_name=OBJECT, record_key=record.record_key, user_id="u-ada", access="edit",
                     authored_by="bob", reason="covering")
    refused = operator.delete(f"/api/v2/records/{OBJECT}/{record.record_key}/")
    assert (refused.status_code, refused.json()["error"]) == (403, "access_denied")
    assert not Record.objects.get(pk=record.pk).is_deleted
    own = _create(operator, email="mine@example.com")
    assert operator.delete(f"/api/v2/records/{OBJECT}/{own.json()['record_key']}/").status_code == 204


def test_an_org_without_an_access_policy_stays_unrestricted(operator):
    record = _bobs_contact()
    assert _patch(operator, record, lastname="Anyone").status_code == 200
    assert _create(operator, email="free@example.com").status_code == 201


# --- inbound application runs as the account's integration user -----------------------------------------------
def test_inbound_application_runs_as_the_integration_user_and_a_refused_change_is_recorded_not_lost(
        client, billing_sandbox):
    from connectors.models import Receipt
    from runtime_outbox.models import ApplicationResult
    from tests.conftest import drain, hubspot_event, make_serving_org, post_signed

    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    document = _policy(edit_fields=("email", "firstname", "lastname", "account_id"))  # lifecyclestage read-only
    document["users"].append({"id": "u-sync", "active": True, "email": "", "name": "Sync",
                              "permission_sets": ["sales"], "fields": {}})
    document["integration_user"] = "u-sync"
    _publish(document)
    assert post_signed(client, [hubspot_event(1, 901, 1000), hubspot_event(2, 901, 1001, "email", "i@example.com")]
                       ).status_code == 202
    drain()
    [record] = Record.objects.filter(org_id=ORG, object_name=OBJECT)
    assert record.fields["email"] == "i@example.com" and record.owner_id == "u-sync"
    assert post_signed(client, [hubspot_event(3, 901, 1002, "lifecyclestage", "customer")]).status_code == 202
    drain()
    record.refresh_from_db()
    assert "lifecyclestage" not in record.fields  # the integration user may not edit it
    refused = [r for r in ApplicationResult.objects.filter(org_id=ORG) if r.outcome == "rejected"]
    assert len(refused) == 1 and refused[0].result["reason"] == "access_denied"
    assert Receipt.objects.filter(org_id=ORG).count() == 2  # both deliveries stay accepted
