"""Operator decisions on push RemoteLinks: ``manage.py push_links`` (seed 002 "Remote Link State").

Every test runs on the real MariaDB against a serving org and the billing
sandbox; a link is suspended by real protocol evidence (a PATCH answered 404),
never by writing its row directly.
"""
from __future__ import annotations

import io
import json

import httpx
import pytest
from django.core.management import call_command
from django.db import transaction

from connectors import reasons
from connectors.links.link_decisions import LinkOperationRefused, link_retire, link_revalidate
from connectors.models import RemoteEffect, RemoteLink, RemoteLinkEvidence
from connectors.outbound import egress
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.services import record_create, record_lock, record_update
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.conftest import ORG, drain, make_serving_org, run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")


@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def _save(record_key: str | None, root: str, **changes):
    with transaction.atomic():
        if record_key is None:
            record = record_create(org=OrgScope(ORG), object_name="Contact",
                                   values={"email": changes.pop("email", "ann@x.io"), "firstname": "Ann"})
        else:
            record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record_key)
        if changes:
            record_update(org=OrgScope(ORG), record=record, changes=changes)
        command = outbound_command_author(scope=SCOPE, effect_root_id=root, effect_slot_id="push",
                                          effect_generation_id="1", contract_key="billing.customer", record=record,
                                          origin_flow_run_id=None)
    assert outbox_try_deliver_one()
    return record.record_key, command


def _linked(sandbox) -> tuple[str, RemoteLink]:
    key, command = _save(None, "root-1")
    drain()
    return key, RemoteLink.objects.get(org_id=ORG, link_key=command.link_key)


def _answer(status: int, body: dict) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(status, content=json.dumps(body).encode())))


def _suspended_by_404(sandbox) -> tuple[str, RemoteLink]:
    key, link = _linked(sandbox)
    _save(key, "root-2", lastname="Lee")
    with _answer(404, {"error": {"type": "invalid_request_error", "message": "No such customer"}}) as client:
        assert egress.effect_try_dispatch_one(worker_id="w1", client=client)
    link.refresh_from_db()
    assert (link.state, link.reason_code) == ("suspended_drift", reasons.REMOTE_NOT_FOUND)
    return key, link


def _run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_a_suspended_link_patches_nothing_until_revalidated_then_patches_again(org, billing_sandbox):
    key, link = _suspended_by_404(billing_sandbox)
    before = billing_sandbox.state()["requests"]
    _save(key, "root-3", lastname="Lee-Park")
    drain()
    blocked = RemoteEffect.objects.filter(org_id=ORG, link_key=link.link_key).order_by("-id").first()
    assert (blocked.state, blocked.reason_code) == ("quarantined", reasons.LINK_NOT_PATCHABLE)
    assert billing_sandbox.state()["requests"] == before, "a suspended link is never PATCH authority"

    shown = _run("push_links", "show", link.link_key, "--org", ORG)
    assert "suspended_drift (remote_not_found)" in shown and "remote_not_found by egress" in shown

    change = link_revalidate(org_id=ORG, link_key=link.link_key, actor="ops", reason="customer restored")
    assert (change.from_state, change.to_state) == ("suspended_drift", "active")
    link.refresh_from_db()
    assert (link.state, link.reason_code) == ("active", "")
    assert list(RemoteLinkEvidence.objects.filter(link=link).values_list("kind", flat=True)) == [
        "remote_not_found", "revalidated"]
    _save(key, "root-4", lastname="Park")
    drain()
    [customer] = billing_sandbox.state()["customers"]
    assert customer["create_requests"] == 1 and customer["name"] == "Ann Park"


def test_retire_ends_the_link_and_releases_its_locator_but_never_allows_a_new_create(org, billing_sandbox):
    key, link = _linked(billing_sandbox)
    out = _run("push_links", "retire", link.link_key, "--org", ORG, "--actor", "ops", "--reason", "merged remotely")
    assert f"link {link.pk}: active -> retired" in out
    link.refresh_from_db()
    assert (link.state, link.live_remote_id) == ("retired", None)
    requests = billing_sandbox.state()["requests"]
    _save(key, "root-2", lastname="Lee")
    drain()
    latest = RemoteEffect.objects.filter(org_id=ORG, link_key=link.link_key).order_by("-id").first()
    assert (latest.state, latest.reason_code) == ("quarantined", reasons.LINK_NOT_PATCHABLE)
    assert billing_sandbox.state()["requests"] == requests
    with pytest.raises(LinkOperationRefused) as refused:
        link_retire(org_id=ORG, link_key=link.link_key, actor="ops", reason="again")
    assert refused.value.code == "link_retired"
    from connectors.links.link_decisions import link_rebind

    with pytest.raises(LinkOperationRefused) as rebind:  # a retired link is final: no rebind advice either
        link_rebind(org_id=ORG, link_key=link.link_key, contract_key="billing.customer", actor="ops", reason="r")
    assert rebind.value.code == "link_retired"


def test_retire_is_refused_while_an_effect_of_the_slot_is_in_flight(org, billing_sandbox):
    key, link = _linked(billing_sandbox)
    _save(key, "root-2", lastname="Lee")
    grant = egress.permit_try_grant_one(worker_id="w1")
    assert grant is not None
    with pytest.raises(LinkOperationRefused) as refused:
        link_retire(org_id=ORG, link_key=link.link_key, actor="ops", reason="r")
    assert refused.value.code == "slot_occupied"
    assert RemoteLink.objects.get(pk=link.pk).state == "active"


def test_bad_operator_input_exits_with_a_code_and_writes_nothing(org, billing_sandbox):
    _key, link = _linked(billing_sandbox)
    env = subprocess_env()
    bad_key = run_manage(["push_links", "show", "not-a-key", "--org", ORG], env)
    assert bad_key.returncode == 2 and "invalid_identity" in bad_key.stderr
    unknown = run_manage(["push_links", "retire", "0" * 64, "--org", ORG, "--actor", "ops", "--reason", "r"], env)
    assert unknown.returncode == 1 and "link_unknown" in unknown.stderr
    blank = run_manage(["push_links", "retire", link.link_key, "--org", ORG, "--actor", " ", "--reason", "r"], env)
    assert blank.returncode == 1 and "link_evidence_missing" in blank.stderr
    for actor in (" ops", "op\x01s", "\u200b", "x" * 121):
        odd = run_manage(["push_links", "retire", link.link_key, "--org", ORG, "--actor", actor, "--reason", "r"], env)
        assert odd.returncode == 1 and "link_evidence_invalid" in odd.stderr, (actor, odd.stderr)
    unserved = run_manage(["push_links", "rebind", link.link_key, "--org", ORG, "--contract", "no.such",
                           "--actor", "ops", "--reason", "r"], env)
    assert unserved.returncode == 1 and "slot_not_served" in unserved.stderr
    link.refresh_from_db()
    assert link.state == "active" and not RemoteLinkEvidence.objects.exists()
    listed = json.loads(run_manage(["push_links", "list", "--org", ORG, "--json"], env).stdout)
    assert [row["link_key"] for row in listed] == [link.link_key]


# === key-changing drift resolved by an operator: rebind or retire, then supersede ==============================
@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    from tests.connectors.push_helpers import push_env

    return push_env(billing_sandbox, hubspot_crm_sandbox)


def _recreated_slot(env):
    """Push a contact, recreate its slot with new stable ids, save again: refused before POST."""
    from tests.connectors.push_helpers import contact, contract_of, effect_of, push_link, reconfigure, save

    record = contact("bob@x.io")
    save(record)
    drain()
    old = push_link(record)

    def recreate(doc):
        contract = contract_of(doc)
        contract["action_slot_id"], contract["destination_slot_id"] = "slot.push.contact.v2", "dest.contact.v2"

    reconfigure(env, recreate)
    refused = effect_of(save(record, lastname="Again"))
    drain()
    refused.refresh_from_db()
    assert (refused.state, refused.reason_code) == ("quarantined", reasons.SLOT_LINEAGE_UNRESOLVED)
    return record, old, refused


def test_a_rebind_moves_the_remote_id_to_the_recreated_slot_and_the_superseded_save_patches_it(env):
    record, old, refused = _recreated_slot(env)
    posts = env.posts()
    out = _run("push_links", "rebind", old.link_key, "--org", ORG, "--contract", "hubspot.contact",
               "--actor", "ops", "--reason", "slot recreated by pack 2")
    assert f"link {old.pk}: suspended_drift -> retired" in out and refused.link_key in out
    old.refresh_from_db()
    new = RemoteLink.objects.get(org_id=ORG, link_key=refused.link_key)
    assert (old.state, old.live_remote_id) == ("retired", None)
    assert (new.state, new.remote_id, new.action_slot_id) == ("active", old.remote_id, "slot.push.contact.v2")
    # The refused save is superseded by an explicit operator intent; it PATCHes the rebound remote record.
    _run("effects", "successor", str(refused.command_id), "--org", ORG, "--actor", "ops", "--reason", "rebound")
    drain()
    assert env.posts() == posts, "no second create"
    successor = RemoteEffect.objects.filter(org_id=ORG, link_key=refused.link_key).order_by("-id").first()
    assert (successor.state, successor.attempt_ordinal) == ("finalized", 2)
    assert [a.operation for a in successor.attempts.all()] == ["update"]
    assert env.remote(old.remote_id)["properties"]["lastname"] == "Again"
    with pytest.raises(LinkOperationRefused) as again:
        link_retire(org_id=ORG, link_key=old.link_key, actor="ops", reason="twice")
    assert again.value.code == "link_retired"


def test_retiring_the_old_lineage_lets_an_explicit_successor_create_under_the_new_slot(env):
    record, old, refused = _recreated_slot(env)
    posts = env.posts()
    link_retire(org_id=ORG, link_key=old.link_key, actor="ops", reason="the old contact is abandoned")
    drain()
    assert env.posts() == posts, "retiring alone never creates"
    with transaction.atomic():  # the provider dedupes contacts by email: the new remote record gets its own
        record_update(org=OrgScope(ORG), record=record_lock(org=OrgScope(ORG), object_name="Contact",
                                                            record_key=record.record_key),
                      changes={"email": "bob.new@x.io"})
    _run("effects", "successor", str(refused.command_id), "--org", ORG, "--actor", "ops", "--reason", "new slot")
    drain()
    assert env.posts() == posts + 1
    new = RemoteLink.objects.get(org_id=ORG, link_key=refused.link_key)
    assert new.state == "active" and new.remote_id != old.remote_id
    refused.refresh_from_db()
    assert refused.create_slot is None, "the superseded refusal released the slot's create seat"
