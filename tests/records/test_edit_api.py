"""Local record edits over REST: ``POST /api/v2/records/<object>/`` and ``PATCH /api/v2/records/<object>/<key>/``.

Operator auth as the replay and transfer endpoints; the record is written and
its after-save automation runs in one transaction; a record row held by
another transaction is a retryable 409 (``FOR UPDATE NOWAIT``, seed 000), not a wait.
"""
from __future__ import annotations

import json
import threading

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction

from nexusflow.kernel.scope import OrgScope
from nexusflow.records import services
from nexusflow.records.models import Record
from nexusflow.records.services import record_delete, record_lock
from runtime_outbox.owner import OwnerWorkPending
from tests.concurrency import Worker
from tests.conftest import ORG

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def operator(client):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name=f"org:{ORG}"))
    client.force_login(user)
    return client


def _create(client, object_name: str, fields, **extra):
    return client.post(f"/api/v2/records/{object_name}/", data=json.dumps({"fields": fields, **extra}),
                       content_type="application/json")


def _patch(client, object_name: str, key: str, fields):
    return client.patch(f"/api/v2/records/{object_name}/{key}/", data=json.dumps({"fields": fields}),
                        content_type="application/json")


def test_create_then_update_a_record(operator):
    created = _create(operator, "Lead", {"email": "ada@x.io", "lastname": "Byron"})
    assert created.status_code == 201, created.content
    body = created.json()
    record = Record.objects.get(record_key=body["record_key"])
    assert (record.org_id, record.object_name, record.fields) == (ORG, "Lead", {"email": "ada@x.io",
                                                                                 "lastname": "Byron"})
    assert body["version"] == record.version and body["created"] is True

    updated = _patch(operator, "Lead", body["record_key"], {"lastname": "Lovelace", "email": "ada@x.io"})
    assert updated.status_code == 200, updated.content
    assert updated.json()["changed"] == ["lastname"]
    assert updated.json()["version"] == record.version + 1
    assert Record.objects.get(pk=record.pk).fields["lastname"] == "Lovelace"

    same = _patch(operator, "Lead", body["record_key"], {"lastname": "Lovelace"})
    assert same.status_code == 200 and same.json()["changed"] == []
    assert Record.objects.get(pk=record.pk).version == record.version + 1  # a no-op writes nothing


def test_bad_input_gets_a_stable_code(operator):
    key = _create(operator, "Lead", {"email": "ada@x.io"}).json()["record_key"]
    cases = [
        (_create(operator, "Lead", {"nope": "x"}), 400, "unknown_field"),
        (_create(operator, "Lead", {"email": "x" * 300}), 400, "invalid_field_value"),
        (_create(operator, "Lead", {}), 400, "invalid_request"),
        (_create(operator, "Lead", "not an object"), 400, "invalid_request"),
        (_create(operator, "NoSuchObject", {"email": "a@x.io"}), 404, "unknown_object"),
        (_create(operator, "Lead", {"email": "a@x.io"}, org_id="another-org"), 403, "org_not_authorized"),
        (_patch(operator, "Lead", key, {"nope": "x"}), 400, "unknown_field"),
        (_patch(operator, "Lead", key, {"email": 5}), 400, "invalid_request"),
        (_patch(operator, "Lead", "00Qnosuchrecord", {"email": "a@x.io"}), 404, "record_not_found"),
        (_patch(operator, "Lead", " 00Q", {"email": "a@x.io"}), 400, "invalid_identity"),
        (_patch(operator, "NoSuchObject", key, {"email": "a@x.io"}), 404, "unknown_object"),
    ]
    for response, status, code in cases:
        assert (response.status_code, response.json().get("error")) == (status, code), response.content
    assert Record.objects.count() == 1


def test_a_deleted_record_is_not_found(operator):
    key = _create(operator, "Lead", {"email": "ada@x.io"}).json()["record_key"]
    with transaction.atomic():
        record_delete(org=OrgScope(ORG), record=record_lock(org=OrgScope(ORG), object_name="Lead", record_key=key))
    response = _patch(operator, "Lead", key, {"lastname": "Gone"})
    assert (response.status_code, response.json()["error"]) == (404, "record_not_found")


def test_operators_only_and_only_their_org(operator, client):
    key = _create(operator, "Lead", {"email": "ada@x.io"}).json()["record_key"]
    other = User.objects.create_user("other", password="pw", is_staff=True)
    other.groups.add(Group.objects.create(name="org:another-org"))
    client.force_login(other)
    assert _patch(client, "Lead", key, {"lastname": "X"}).json()["error"] == "record_not_found"
    root = User.objects.create_superuser("root", password="pw")
    client.force_login(root)
    assert _create(client, "Lead", {"email": "a@x.io"}).json()["error"] == "org_required"
    assert _create(client, "Lead", {"email": "a@x.io"}, org_id=ORG).status_code == 201
    client.logout()
    assert _patch(client, "Lead", key, {"lastname": "X"}).status_code in (401, 403)
    assert _create(client, "Lead", {"email": "a@x.io"}).status_code in (401, 403)
    assert Record.objects.get(record_key=key).fields == {"email": "ada@x.io"}


def test_after_save_automation_runs_in_the_same_transaction(operator, monkeypatch):
    """A retryable owner conflict raised by after-save automation rolls the whole save back: 409 + Retry-After."""
    seen = []

    def automation(*, org, record, change):
        seen.append((record.record_key, sorted(change.changed_fields)))
        if record.fields.get("lastname") == "Blocked":
            raise OwnerWorkPending("an outbound intent is unfinished")

    monkeypatch.setattr(services, "_AFTER_SAVE", [*services._AFTER_SAVE, automation])
    refused = _create(operator, "Lead", {"email": "ada@x.io", "lastname": "Blocked"})
    assert (refused.status_code, refused.json()["error"]) == (409, "owner_outbound_pending")
    assert refused["Retry-After"] == "2"
    assert not Record.objects.exists()

    key = _create(operator, "Lead", {"email": "ada@x.io"}).json()["record_key"]
    blocked = _patch(operator, "Lead", key, {"lastname": "Blocked"})
    assert (blocked.status_code, blocked.json()["error"], blocked["Retry-After"]) == (409, "owner_outbound_pending",
                                                                                       "2")
    assert Record.objects.get(record_key=key).fields == {"email": "ada@x.io"}
    assert _patch(operator, "Lead", key, {"lastname": "Fine"}).status_code == 200
    assert [s for s in seen if s[0] == key] == [(key, ["email"]), (key, ["lastname"]), (key, ["lastname"])]


def test_a_record_held_by_another_transaction_is_a_retryable_conflict_not_a_wait(operator):
    key = _create(operator, "Lead", {"email": "ada@x.io"}).json()["record_key"]
    locked, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            record_lock(org=OrgScope(ORG), object_name="Lead", record_key=key)
            locked.set()
            assert release.wait(60)

    holder = Worker(hold, "holder")
    holder.start()
    assert locked.wait(30)
    try:
        busy = _patch(operator, "Lead", key, {"lastname": "Busy"})
    finally:
        release.set()
        holder.join(30)
    assert holder.error is None
    assert (busy.status_code, busy.json()["error"], busy["Retry-After"]) == (409, "owner_contended", "2")
    assert Record.objects.get(record_key=key).fields == {"email": "ada@x.io"}
    retried = _patch(operator, "Lead", key, {"lastname": "Busy"})
    assert retried.status_code == 200 and retried.json()["changed"] == ["lastname"]


def test_the_openapi_schema_names_both_operations(operator):
    schema = operator.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert "post" in paths["/api/v2/records/{object_name}/"]
    assert "patch" in paths["/api/v2/records/{object_name}/{record_key}/"]
