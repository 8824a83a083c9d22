"""Identity transfer operations: ``manage.py records_transfer`` and the merge/convert REST endpoints (seed 000).

Also the rollback proof: a transfer process killed after every write and
before its commit leaves nothing behind, and the same transfer id then
succeeds once.
"""
from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from nexusflow.records.models import IdentityTransfer
from tests.conftest import ORG, run_manage, subprocess_env
from tests.records.transfer_helpers import (
    BILLING_CONTRACT,
    CONTACT_CONTRACT,
    LEAD_CONTRACT,
    MIRROR,
    active_holders,
    author,
    create,
    fresh,
    links,
    pushed,
    serve,
    snapshot_rows,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def crm(billing_sandbox, hubspot_crm_sandbox):
    serve(billing_sandbox.base_url, hubspot_crm_sandbox.base_url)
    return hubspot_crm_sandbox


def _command(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("records_transfer", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue()


# --- rollback ----------------------------------------------------------------------------------------------
def test_a_transfer_killed_before_commit_changes_nothing_and_the_retry_succeeds(crm):
    source = pushed("Contact", "ray@x.io", CONTACT_CONTRACT, BILLING_CONTRACT)
    target = create("Contact", "ray.lee@x.io")
    remote_ids = sorted(lk.remote_id for lk in links(source))
    before = snapshot_rows()
    args = ["records_transfer", "merge", "--org", ORG, "--object", "Contact", "--source", source.record_key,
            "--target", target.record_key, "--transfer-id", "crash-1", "--actor", "ops"]

    crashed = run_manage(args, subprocess_env(NEXUS_FAILPOINTS="records.transfer.before_commit"))

    assert crashed.returncode == -9, crashed.stderr  # SIGKILL at the failpoint, after every write
    assert snapshot_rows() == before
    assert not IdentityTransfer.objects.exists()
    assert not fresh(source).is_deleted and fresh(target).mirrors == {}

    done = run_manage(args, subprocess_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["created"] is True
    assert sorted(lk.remote_id for lk in links(target, state="active")) == remote_ids
    assert links(source, state="active") == []


# --- management command -----------------------------------------------------------------------------------
def test_command_exit_codes(crm):
    lead = pushed("Lead", "sam@x.io", LEAD_CONTRACT)
    author(fresh(lead), LEAD_CONTRACT)  # an unfinished save of the lead: retryable
    convert = ["convert", "--org", ORG, "--object", "Lead", "--source", lead.record_key,
               "--target-object", "Contact", "--transfer-id", "cmd-1", "--actor", "ops"]

    code, _out, err = _command(*convert)
    assert code == 75 and err.startswith("owner_outbound_pending")

    from tests.conftest import drain

    drain()
    code, out, _ = _command(*convert)
    assert code == 0
    result = json.loads(out)
    assert result["created"] and result["target_created"] and result["owners"] == ["pack.hubspot"]
    (holder,) = active_holders(result["moves"][0]["remote_id"])
    assert holder.source_record_key == result["target_record_key"]

    code, out, _ = _command(*convert)  # replay
    assert code == 0 and json.loads(out)["created"] is False
    code, out, _ = _command("show", "--org", ORG, "--transfer-id", "cmd-1")
    assert code == 0 and json.loads(out)["target_record_key"] == result["target_record_key"]

    code, _out, err = _command(*convert[:-4], "--transfer-id", "cmd-1", "--actor", "ops", "--target", "003x")
    assert code == 1 and err.startswith("transfer_mismatch")
    code, _out, err = _command("show", "--org", ORG, "--transfer-id", "nope")
    assert code == 2 and err.startswith("transfer_not_found")
    code, _out, err = _command("convert", "--org", ORG, "--object", "Contact", "--source", "003abc",
                               "--target-object", "Lead", "--transfer-id", "cmd-2", "--actor", "ops")
    assert code == 2 and err.startswith("transfer_conversion_undeclared")
    code, _out, err = _command("merge", "--org", ORG, "--object", "Contact", "--source", " 003abc",
                               "--target", "003def", "--transfer-id", "cmd-3", "--actor", "ops")
    assert code == 2 and err.startswith("invalid_identity")


# --- REST -------------------------------------------------------------------------------------------------------
@pytest.fixture
def operator(client):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name=f"org:{ORG}"))
    client.force_login(user)
    return client


def _post(client, object_name: str, key: str, action: str, body: dict):
    return client.post(f"/api/v2/records/{object_name}/{key}/{action}/", data=json.dumps(body),
                       content_type="application/json")


def test_merge_endpoint(crm, operator):
    source = pushed("Contact", "tia@x.io", CONTACT_CONTRACT)
    target = create("Contact", "tia.lee@x.io")
    command = author(fresh(target), BILLING_CONTRACT)  # unfinished work on the target
    body = {"transfer_id": "api-1", "target_key": target.record_key}

    busy = _post(operator, "Contact", source.record_key, "merge", body)
    assert busy.status_code == 409 and busy.json()["error"] == "owner_outbound_pending"
    assert int(busy["Retry-After"]) > 0

    from tests.conftest import drain

    drain()
    assert command.pk
    created = _post(operator, "Contact", source.record_key, "merge", body)
    assert created.status_code == 201, created.json()
    assert created.json()["target_record_key"] == target.record_key
    assert fresh(target).mirrors[MIRROR] == created.json()["moves"][0]["remote_id"]

    replay = _post(operator, "Contact", source.record_key, "merge", body)
    assert replay.status_code == 200 and replay.json()["created"] is False
    other = _post(operator, "Contact", source.record_key, "merge", {**body, "target_key": "003otherrecord"})
    assert other.status_code == 409 and other.json()["error"] == "transfer_mismatch"

    assert _post(operator, "Contact", "003nosuchrecord", "merge", body).status_code == 404
    bad = _post(operator, "Contact", source.record_key, "merge", {"transfer_id": "api-2"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_request"
    same = _post(operator, "Contact", target.record_key, "merge", {"transfer_id": "api-3",
                                                                   "target_key": target.record_key})
    assert same.status_code == 400 and same.json()["error"] == "transfer_invalid"


def test_convert_endpoint_and_identity_conflict(crm, operator, client):
    lead = pushed("Lead", "uma@x.io", LEAD_CONTRACT)
    contact = pushed("Contact", "uma.lee@x.io", CONTACT_CONTRACT)  # already holds another remote contact

    conflict = _post(operator, "Lead", lead.record_key, "convert",
                     {"transfer_id": "api-c1", "target_object": "Contact", "target_key": contact.record_key})
    assert conflict.status_code == 409 and conflict.json()["error"] == "transfer_identity_conflict"
    assert "Retry-After" not in conflict

    created = _post(operator, "Lead", lead.record_key, "convert", {"transfer_id": "api-c2",
                                                                   "target_object": "Contact"})
    assert created.status_code == 201 and created.json()["target_created"] is True
    undeclared = _post(operator, "Contact", contact.record_key, "convert",
                       {"transfer_id": "api-c3", "target_object": "Lead"})
    assert undeclared.status_code == 400 and undeclared.json()["error"] == "transfer_conversion_undeclared"

    client.logout()
    anonymous = _post(client, "Lead", lead.record_key, "convert", {"transfer_id": "api-c2",
                                                                   "target_object": "Contact"})
    assert anonymous.status_code in (401, 403)


def test_an_operator_of_another_org_does_not_find_the_record(crm, client):
    lead = create("Lead", "vic@x.io")
    user = User.objects.create_user("other", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name="org:another-org"))
    client.force_login(user)
    response = _post(client, "Lead", lead.record_key, "convert", {"transfer_id": "x-1", "target_object": "Contact"})
    assert response.status_code == 404 and response.json()["error"] == "transfer_record_not_found"
