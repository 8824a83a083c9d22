"""Record deletion operations (seed 000): REST ``DELETE /api/v2/records/<object>/<key>/``, ``manage.py records``,
and the installed before-delete hooks (Runtime's owner check first, then the Connector's push links)."""
from __future__ import annotations

import json
import threading

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from connectors.links.source_deletion import links_before_source_delete
from connectors.models import RemoteLink, RemoteLinkEvidence
from connectors.outbound.egress import effect_try_finalize_one
from connectors.store import RemoteLinkStore
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import before_delete_hooks, record_delete_by_key
from runtime_outbox.owner import owner_before_delete
from tests.concurrency import Worker
from tests.conftest import ORG
from tests.connectors.push_helpers import BILLING, contact, dispatch_one, push_env, push_link, save

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    return push_env(billing_sandbox, hubspot_crm_sandbox)


@pytest.fixture
def operator(client):
    user = User.objects.create_user("op", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name=f"org:{ORG}"))
    client.force_login(user)
    return client


def _url(record_key: str, object_name: str = "Contact") -> str:
    return f"/api/v2/records/{object_name}/{record_key}/"


def _live(record: Record) -> bool:
    return Record.objects.filter(pk=record.pk, is_deleted=False).exists()


def _finished(record: Record) -> RemoteLink:
    """One finalized push for ``record``: an active link and a Runtime receipt."""
    save(record, contract=BILLING)
    dispatch_one()
    assert effect_try_finalize_one()
    link = push_link(record, BILLING)
    assert link.state == "active"
    return link


# --- the installed hooks ----------------------------------------------------------------------------
def test_runtime_owner_check_is_installed_before_the_connector_link_hook():
    hooks = before_delete_hooks()
    assert owner_before_delete in hooks and links_before_source_delete in hooks
    assert hooks.index(owner_before_delete) < hooks.index(links_before_source_delete)


def test_deletion_suspends_active_push_links_source_deleted_and_no_patch_follows(env):
    record = contact()
    link = _finished(record)
    requests = env.billing.state()["requests"]

    record_delete_by_key(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
    link.refresh_from_db()
    assert (link.state, link.reason_code) == ("suspended_drift", "source_deleted")
    evidence = RemoteLinkEvidence.objects.get(link=link, kind="source_deleted")
    assert (evidence.from_state, evidence.to_state, evidence.actor) == ("active", "suspended_drift", "record_delete")
    assert evidence.detail["source_record_key"] == record.record_key
    assert env.billing.state()["requests"] == requests  # the remote record is not deleted
    assert len(env.billing.state()["customers"]) == 1


# --- REST ---------------------------------------------------------------------------------------------
def test_rest_delete_returns_204_and_the_record_is_deleted(env, operator):
    record = contact()
    response = operator.delete(_url(record.record_key))
    assert response.status_code == 204, response.content
    assert not _live(record)
    again = operator.delete(_url(record.record_key))
    assert (again.status_code, again.json()["error"]) == (404, "record_not_found")


def test_rest_delete_with_pending_outbound_work_is_409_retryable(env, operator):
    record = contact()
    save(record, contract=BILLING)
    response = operator.delete(_url(record.record_key))
    assert (response.status_code, response.json()["error"]) == (409, "owner_outbound_pending")
    assert int(response["Retry-After"]) > 0
    assert _live(record)
    dispatch_one()
    assert effect_try_finalize_one()
    assert operator.delete(_url(record.record_key)).status_code == 204


def test_rest_delete_while_a_link_is_held_is_owner_contended(env, operator):
    record = contact()
    link = _finished(record)
    held, release = threading.Event(), threading.Event()

    def hold_link():
        with transaction.atomic():
            RemoteLinkStore.lock(ORG, link.pk)
            held.set()
            release.wait(60)

    holder = Worker(hold_link, "holder")
    holder.start()
    assert held.wait(60)
    try:
        response = operator.delete(_url(record.record_key))
    finally:
        release.set()
        holder.join(60)
    assert (response.status_code, response.json()["error"]) == (409, "owner_contended")
    assert response["Retry-After"]
    assert _live(record) and RemoteLink.objects.get(pk=link.pk).state == "active"


@pytest.mark.parametrize("object_name,key", [("Contact", "%20x"), ("Contact", "x%00"), ("%20Contact", "003x")])
def test_rest_delete_refuses_malformed_identity_with_400(env, operator, object_name, key):
    response = operator.delete(f"/api/v2/records/{object_name}/{key}/")
    assert (response.status_code, response.json()["error"]) == (400, "invalid_identity")


def test_rest_delete_never_reaches_another_orgs_record_and_needs_an_operator(env, client):
    record = contact()
    other = User.objects.create_user("other", password="pw", is_staff=True)
    other.groups.add(Group.objects.create(name="org:someone-else"))
    client.force_login(other)
    response = client.delete(_url(record.record_key))
    assert (response.status_code, response.json()["error"]) == (404, "record_not_found")
    plain = User.objects.create_user("plain", password="pw")
    plain.groups.add(Group.objects.get(name="org:someone-else"))
    client.force_login(plain)
    assert client.delete(_url(record.record_key)).status_code == 403
    assert _live(record)


# --- manage.py records ------------------------------------------------------------------------------------
def test_records_command_show_and_delete_exit_codes(env, capsys):
    record = contact()
    command = save(record, contract=BILLING)
    call_command("records", "show", "--org", ORG, "Contact", record.record_key)
    out = capsys.readouterr().out
    assert f"Contact/{record.record_key} org {ORG}" in out and f"intent {command.pk} {BILLING} accepted" in out

    with pytest.raises(CommandError, match="^owner_outbound_pending") as refused:
        call_command("records", "delete", "--org", ORG, "Contact", record.record_key)
    assert refused.value.returncode == 75
    dispatch_one()
    assert effect_try_finalize_one()

    call_command("records", "delete", "--org", ORG, "Contact", record.record_key)
    assert "deleted Contact/" in capsys.readouterr().out
    call_command("records", "show", "--org", ORG, "Contact", record.record_key, "--json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["deleted"] and [i["state"] for i in shown["intents"]] == ["terminal"]
    assert [(link["state"], link["reason_code"]) for link in shown["remote_links"]] == [
        ("suspended_drift", "source_deleted")]
    assert shown["mirrors"]  # the billing id mirror written at finalization

    with pytest.raises(CommandError, match="^record_not_found") as missing:
        call_command("records", "delete", "--org", ORG, "Contact", record.record_key)
    assert missing.value.returncode == 1
    with pytest.raises(CommandError, match="^invalid_identity") as bad:
        call_command("records", "delete", "--org", ORG, "Contact", " x")
    assert bad.value.returncode == 2
