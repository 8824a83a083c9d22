"""Remote identity comes only from the RemoteLink: conflicts fail closed, field ownership never selects a target.

Seed 003 "Required proof": RemoteLink conflicts fail closed and field
ownership cannot influence remote identity selection. Seed 002 "Source Of
Truth": the PATCH target is the RemoteLink's remote id, record remote-id
fields are compatibility mirrors only ("not occupancy authority"), route
templates are pack-owned and never sourced from record fields; "Link Key":
one link per link key, one live link per remote locator.

Real MariaDB, the real egress adapter and the billing sandbox (it counts the
create and update requests of every customer); record mirrors are changed the
way a legacy compatibility write would (``RecordStore.write``), since no
record endpoint may set them.
"""
from __future__ import annotations

import copy
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction

from connectors import reasons
from connectors.contracts.pack_document import PackError, validate_pack_document
from connectors.models import PackGeneration, RemoteEffectEvidence, RemoteLink
from connectors.outbound import egress
from connectors.serving.generations import pack_publish
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock
from nexusflow.records.store import RecordStore
from runtime_outbox.models import IntentResultReceipt
from tests.conftest import ORG, drain
from tests.connectors.push_helpers import (
    BILLING,
    _bundled,
    contact,
    contract_of,
    effect_of,
    push_env,
    push_link,
    save,
    serving_pack,
    zero_backoff,
)
from tests.kernel import rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

MIRROR = "billing_id"


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    return push_env(billing_sandbox, hubspot_crm_sandbox)


def _customers(env) -> dict[str, dict]:
    """``{customer id: row}`` of the billing sandbox (create/update request counters per customer)."""
    return {row["id"]: row for row in env.billing.state()["customers"]}


def _set_mirrors(record, mirrors: dict) -> None:
    """Overwrite the record's compatibility mirrors, as a legacy write outside the push protocol would."""
    with transaction.atomic():
        RecordStore.write(record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key),
                          mirrors=mirrors)


def _linked(env, email: str):
    record = contact(email)
    save(record, contract=BILLING)
    drain()
    link = push_link(record, BILLING)
    assert link.state == "active"
    assert Record.objects.get(pk=record.pk).mirrors == {MIRROR: link.remote_id}
    return record, link


# --- field ownership never selects the update target -----------------------------------------------------
def test_a_mirror_or_a_mapped_field_naming_another_remote_record_never_retargets_the_update(env):
    """Seed 002 "Before PATCH": the materialized remote-id field is not PATCH authority; mapped values are data."""
    ann, ann_link = _linked(env, "ann@x.io")
    bob, bob_link = _linked(env, "bob@x.io")
    _set_mirrors(ann, {MIRROR: bob_link.remote_id})
    # A mapped field (``firstname`` feeds ``name``) that holds the other record's remote id, too.
    command = save(ann, contract=BILLING, firstname=bob_link.remote_id)
    drain()

    effect = effect_of(command)
    assert effect.state == "finalized", (effect.state, effect.reason_code)
    [attempt] = effect.attempts.all()
    assert (attempt.operation, attempt.path) == ("update", f"/v1/customers/{ann_link.remote_id}")
    customers = _customers(env)
    assert len(customers) == 2 and all(row["create_requests"] == 1 for row in customers.values())
    assert customers[ann_link.remote_id]["update_requests"] == 1
    assert customers[ann_link.remote_id]["name"] == f"{bob_link.remote_id} Lee"  # sent as a value, nothing more
    assert (customers[bob_link.remote_id]["update_requests"], customers[bob_link.remote_id]["name"]) == (0, "Bob Lee")
    # Both links are as they were; the disagreeing mirror is reported, never rewritten into authority.
    for before in (ann_link, bob_link):
        after = RemoteLink.objects.get(pk=before.pk)
        assert (after.state, after.remote_id, after.link_key) == ("active", before.remote_id, before.link_key)
    assert RemoteLink.objects.get(pk=ann_link.pk).mirror_status == "conflict"
    assert IntentResultReceipt.objects.get(command=command).evidence == {"mirror": "conflict"}
    assert Record.objects.get(pk=ann.pk).mirrors == {MIRROR: bob_link.remote_id}


def test_a_cleared_mirror_does_not_free_the_create_slot(env):
    """Seed 002 "Source Of Truth": mirrors are not occupancy authority; the link keeps the slot occupied."""
    record, link = _linked(env, "cleared@x.io")
    _set_mirrors(record, {})
    command = save(record, contract=BILLING, lastname="Kept")
    drain()

    effect = effect_of(command)
    assert effect.state == "finalized" and effect.create_slot is None
    assert [(a.operation, a.path) for a in effect.attempts.all()] == [("update", f"/v1/customers/{link.remote_id}")]
    [customer] = env.billing.state()["customers"]
    assert (customer["id"], customer["create_requests"], customer["update_requests"]) == (link.remote_id, 1, 1)
    assert customer["name"] == "Cleared Kept"
    assert RemoteLink.objects.filter(org_id=ORG, action_type="PushToConnector").count() == 1
    # The mirror follows the link again (idempotent compatibility write), it did not lead.
    assert Record.objects.get(pk=record.pk).mirrors == {MIRROR: link.remote_id}


def test_a_mirror_set_without_a_link_does_not_occupy_the_create_slot_nor_name_its_target(env):
    """A mirror naming an existing remote record neither blocks the slot's one create nor becomes its target."""
    _bob, bob_link = _linked(env, "bob@x.io")
    record = contact("new@x.io")
    _set_mirrors(record, {MIRROR: bob_link.remote_id})
    command = save(record, contract=BILLING)
    drain()

    effect = effect_of(command)
    assert (effect.state, effect.create_slot) == ("finalized", effect.link_key)
    [attempt] = effect.attempts.all()
    assert (attempt.operation, attempt.path) == ("create", "/v1/customers")
    link = push_link(record, BILLING)
    assert link.remote_id not in ("", bob_link.remote_id) and link.created_by_effect_id == effect.pk
    customers = _customers(env)
    assert (customers[link.remote_id]["create_requests"], customers[link.remote_id]["email"]) == (1, "new@x.io")
    assert customers[bob_link.remote_id]["update_requests"] == 0
    assert RemoteLink.objects.get(pk=bob_link.pk).remote_id == bob_link.remote_id
    assert link.mirror_status == "conflict" and Record.objects.get(pk=record.pk).mirrors == {MIRROR: bob_link.remote_id}


# --- a RemoteLink conflict fails closed ------------------------------------------------------------------------
def test_a_create_answer_for_a_slot_linked_meanwhile_is_parked_and_never_relinked(env):
    """Seed 002 "Link Key": one link per link key. A create whose slot gained a link (to another remote
    record) while the create was in flight is parked for an operator; the link is not moved to the new id."""
    record = contact("raced@x.io")
    command = save(record, contract=BILLING)
    grant = egress.permit_try_grant_one(worker_id="w")
    response = egress.permit_send(grant)
    assert response is not None and response.status == 200
    [created] = env.billing.state()["customers"]
    binding = command.frozen_binding
    other = rows.make(RemoteLink, org_id=ORG, link_key=command.link_key, owner_key=binding["slot"]["owner_key"],
                      action_slot_id=binding["slot"]["action_slot_id"], action_type="PushToConnector",
                      destination_slot_id=binding["slot"]["destination_slot_id"], source_object="Contact",
                      source_record_key=record.record_key, remote_scope="billing-main", remote_id="cus_other",
                      live_remote_id="cus_other", state="active", version=1, snapshot={})

    assert egress.permit_settle(grant, response) == "uncertain"
    effect = effect_of(command)
    assert (effect.state, effect.reason_code, effect.remote_id) == ("uncertain", reasons.REMOTE_LOCATOR_CONFLICT, "")
    assert "conflicts with an existing link" in effect.attempts.get().error
    [link] = RemoteLink.objects.filter(org_id=ORG, link_key=command.link_key)
    assert (link.pk, link.remote_id, link.live_remote_id, link.state, link.version) == (
        other.pk, "cus_other", "cus_other", "active", other.version)
    assert not RemoteLink.objects.filter(org_id=ORG, live_remote_id=created["id"]).exists()
    # Parked for an operator: the reconciler does not move it, and a later save sends nothing behind it.
    zero_backoff()
    assert egress.effect_try_reconcile_one() is False
    requests = env.billing.state()["requests"]
    later = save(record, contract=BILLING, lastname="Later")
    drain()
    assert (effect_of(later).state, effect_of(later).attempt_count) == ("prepared", 0)
    assert env.billing.state()["requests"] == requests and len(env.billing.state()["customers"]) == 1
    # The database refuses a second link for the key outright, retired or not.
    with pytest.raises(IntegrityError, match="remote_link_key_uniq"), transaction.atomic():
        rows.make(RemoteLink, org_id=ORG, link_key=command.link_key, owner_key=link.owner_key,
                  destination_slot_id=link.destination_slot_id, remote_scope=link.remote_scope,
                  remote_id=created["id"], live_remote_id=None, state="retired", version=1, snapshot={})


def test_an_update_route_that_cannot_name_the_linked_record_is_refused_before_any_request(env):
    """Seed 002 "Before PATCH": update path rendering from the durable remote id fails -> fail closed.

    The billing generation is given an update route without ``{remote_id}`` as a
    generation published before publication refused such routes would have it
    (the column is written directly): on this provider that route is the create
    route, so an update sent there would make a second customer.
    """
    generation = serving_pack(env, "billing-main")
    position = next(i for i, c in enumerate(generation.document["push_contracts"]) if c["contract_key"] == BILLING)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_packgeneration SET document = JSON_SET(document, %s, %s) WHERE id = %s",
                       [f"$.push_contracts[{position}].update.path", "/v1/customers", generation.pk])
    record, link = _linked(env, "route@x.io")
    requests = env.billing.state()["requests"]
    command = save(record, contract=BILLING, lastname="Nowhere")
    drain()

    effect = effect_of(command)
    assert (effect.state, effect.reason_code, effect.attempt_count) == ("quarantined", reasons.LINK_NOT_PATCHABLE, 0)
    assert not effect.attempts.exists()
    [refusal] = RemoteEffectEvidence.objects.filter(org_id=ORG, effect=effect, kind="refused_before_patch")
    assert refusal.detail["update_path"] == "/v1/customers"
    assert IntentResultReceipt.objects.get(command=command).outcome == "quarantined"
    assert env.billing.state()["requests"] == requests and len(env.billing.state()["customers"]) == 1
    assert (RemoteLink.objects.get(pk=link.pk).state, RemoteLink.objects.get(pk=link.pk).remote_id) == (
        "active", link.remote_id)


# --- publication: no contract may let record fields choose the remote record ---------------------------------
def _mapping_on(target: str):
    return lambda contract: contract["mapping"].append({"target": target, "source": ["email"]})


def _route(operation: str, path: str):
    return lambda contract: contract[operation].update(path=path)


@pytest.mark.parametrize("pack_key, contract_key, mutate, message", [
    ("billing", BILLING, _mapping_on("id"), "names the provider's id property"),
    ("hubspot", "hubspot.contact", _mapping_on("id"), "names the provider's id property"),
    ("billing", BILLING, _route("update", "/v1/customers"), "must hold '{remote_id}' exactly once"),
    ("billing", BILLING, _route("update", "/v1/customers/{remote_id}/{email}"), "no other placeholder"),
    ("billing", BILLING, _route("update", "/v1/{remote_id}/customers/{remote_id}"), "exactly once"),
    ("billing", BILLING, _route("create", "/v1/customers/{remote_id}"), "create.path"),
    ("hubspot", "hubspot.company", _route("update", "/crm/v3/objects/companies/{domain}"), "exactly once"),
], ids=["form-id-target", "wrapped-id-target", "update-without-id", "update-extra-placeholder",
        "update-id-twice", "create-with-placeholder", "update-field-placeholder"])
def test_a_contract_letting_record_fields_choose_the_remote_record_is_refused_at_publication(
        pack_key, contract_key, mutate, message):
    document = copy.deepcopy(_bundled(pack_key))
    document["version"] += "-identity"
    validate_pack_document(copy.deepcopy(document), "pack.json")  # the bundled contract is valid
    mutate(contract_of(document, contract_key))
    with pytest.raises(PackError, match=f"push contract {contract_key}") as refused:
        pack_publish(document=document)
    assert message in str(refused.value) and refused.value.code == "pack_invalid"
    assert not PackGeneration.objects.filter(pack_key=pack_key, version=document["version"]).exists()


def test_the_publish_command_refuses_such_a_pack_with_a_stable_code_and_publishes_nothing(tmp_path):
    document = copy.deepcopy(_bundled("billing"))
    document["version"] += "-identity-cli"
    contract_of(document, BILLING)["update"]["path"] = "/v1/customers"
    path = tmp_path / "pack.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(CommandError, match=r"^pack_invalid: .*update\.path '/v1/customers' must hold"):
        call_command("connector_pack_publish", str(path))
    assert not PackGeneration.objects.filter(pack_key="billing", version=document["version"]).exists()
