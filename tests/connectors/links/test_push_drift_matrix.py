"""Seed 002 "Drift Matrix": one test per row, each asserting both the "Existing finalized link" and the
"Active create attempt" column (proofs S002-DM-01..27).

Real MariaDB, the real adapter and the loopback provider sandboxes; every
drift is a pack the owner publishes under a new version and a service
configuration that serves it through a successor epoch (``reconfigure``).
An active create attempt pins its epoch, pack generation and request in its
FrozenDispatchBinding, so a drift never applies beneath it: the successor
cannot be switched in while the attempt needs the serving gate, a later save
never makes a second POST for the link key, and writeback-only recovery
completes (``drift_waits_for`` / ``writeback_finishes_under_halt`` in
``push_helpers``). Provider calls are counted by the sandboxes.
"""
from __future__ import annotations

import dataclasses
import json
import signal

import httpx
import pytest
from django.db import IntegrityError, transaction

from connectors import reasons
from connectors.contracts.pack_document import PackError
from connectors.models import RemoteEffect, RemoteEffectAttempt, RemoteLink
from connectors.outbound.effect_decisions import EffectOperationRefused, effect_reconcile
from connectors.outbound.egress import effect_try_reconcile_one, permit_send, permit_settle, permit_try_grant_one
from connectors.outbound.intents import PushContractError
from connectors.serving.gates import NotServing
from connectors.serving.generations import pack_publish
from connectors.serving.handoff import HaltRefused, halt_begin
from nexusflow.records import authority
from nexusflow.records.models import Record
from packs.hubspot.crm_sandbox import CONTACTS_PATH
from runtime_outbox.models import IntentResultReceipt
from tests.conftest import HUBSPOT_ACCOUNT, HUBSPOT_TOKEN, ORG, drain, run_manage, subprocess_env
from tests.connectors.push_helpers import (
    BILLING,
    BILLING_ACCOUNT,
    HUBSPOT,
    ORIGIN,
    contact,
    contract_of,
    delete,
    dispatch_one,
    drift_waits_for,
    effect_of,
    evidence,
    parked_create,
    profile_of,
    publish_credential,
    push_env,
    push_link,
    reconfigure,
    save,
    serving_pack,
    switch_epoch,
    writeback_finishes_under_halt,
    writeback_pending,
    zero_backoff,
)
from tests.kernel import rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    return push_env(billing_sandbox, hubspot_crm_sandbox)


# --- finalized-link outcomes ------------------------------------------------------------------------
def _requests(env) -> tuple[int, int]:
    return env.hubspot.state()["requests"], env.billing.state()["requests"]


def expect_validated(env, record, surfaces: set[str], *, contract: str = HUBSPOT, origin=None) -> RemoteLink:
    """A save after a benign drift PATCHes the same link once and advances its validated snapshot."""
    link = push_link(record, contract)
    before_evidence = len(evidence(link))
    hub, bill = _requests(env)
    posts = env.posts()
    command = save(record, contract=contract, origin=origin, lastname=f"Patched-{link.version}")
    drain()
    effect = effect_of(command)
    assert effect.state == "finalized", (effect.state, effect.reason_code)
    [attempt] = effect.attempts.all()
    assert attempt.operation == "update" and attempt.state == "confirmed"
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.link_key, after.remote_id) == ("active", link.link_key, link.remote_id)
    assert after.created_install_id == link.created_install_id
    current = command.frozen_binding["action_config"]
    assert after.last_validated_install_id == current["install_id"]
    assert {k: v for k, v in after.snapshot.items() if k != "mirror_tuple"} == {
        k: v for k, v in current.items() if k != "mirror_tuple"}
    rows_ = evidence(after)
    assert len(rows_) == before_evidence + 1
    kind, src, dst, detail = rows_[-1]
    assert (kind, src, dst) == ("drift_validated", "active", "active")
    assert set(detail["surfaces"]) == surfaces and detail["install_id"] == current["install_id"]
    if contract == HUBSPOT:
        assert env.posts() == posts and env.patches(link.remote_id) >= 1
        assert _requests(env) == (hub + 1, bill)
        assert env.remote(link.remote_id)["properties"]["lastname"] == f"Patched-{link.version}"
    else:
        assert _requests(env) == (hub, bill + 1)
    return after


def expect_suspended(env, record, surfaces: set[str], *, reason: str = reasons.LINK_DRIFT) -> RemoteLink:
    """A save after a fail-closed drift sends nothing: the link becomes ``suspended_drift`` with evidence."""
    link = push_link(record)
    requests = _requests(env)
    command = save(record, lastname=f"Refused-{link.version}")
    drain()
    effect = effect_of(command)
    assert (effect.state, effect.reason_code, effect.attempt_count) == ("quarantined", reasons.LINK_NOT_PATCHABLE, 0)
    assert not effect.attempts.exists()
    assert IntentResultReceipt.objects.get(command=command).outcome == "quarantined"
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.reason_code, after.remote_id) == ("suspended_drift", reason, link.remote_id)
    kind, src, dst, detail = evidence(after)[-1]
    assert (kind, src, dst, detail["reason"]) == ("drift_suspended", "active", "suspended_drift", reason)
    assert set(detail["surfaces"]) == surfaces
    assert after.snapshot == link.snapshot  # nothing of the drifted config was adopted
    assert _requests(env) == requests
    _stays_refused(env, record, after)
    return after


def _stays_refused(env, record, link: RemoteLink) -> None:
    """A suspended link refuses every later save before any I/O, and nothing re-creates the remote row."""
    requests = _requests(env)
    rows_before = len(evidence(link))
    command = save(record, lastname=f"Again-{link.version}")
    drain()
    effect = effect_of(command)
    assert (effect.state, effect.reason_code) == ("quarantined", reasons.LINK_NOT_PATCHABLE)
    assert not effect.attempts.exists() and effect.create_slot is None
    assert len(evidence(RemoteLink.objects.get(pk=link.pk))) == rows_before
    assert _requests(env) == requests


def expect_lineage_refused(env, record, old_link: RemoteLink) -> RemoteEffect:
    """Key-changing drift: the save's new link key is refused before POST and the old link is suspended."""
    requests = _requests(env)
    command = save(record, lastname=f"Rekeyed-{old_link.version}")
    drain()
    effect = effect_of(command)
    assert effect.link_key != old_link.link_key
    assert (effect.state, effect.reason_code) == ("quarantined", reasons.SLOT_LINEAGE_UNRESOLVED)
    assert not effect.attempts.exists() and effect.create_slot == effect.link_key
    assert not RemoteLink.objects.filter(link_key=effect.link_key).exists()
    after = RemoteLink.objects.get(pk=old_link.pk)
    assert (after.state, after.reason_code) == ("suspended_drift", reasons.SLOT_LINEAGE_UNRESOLVED)
    kind, _src, dst, detail = evidence(after)[-1]
    assert (kind, dst, detail["surfaces"], detail["new_link_key"]) == (
        "drift_suspended", "suspended_drift", ["slot_lineage"], effect.link_key)
    assert _requests(env) == requests
    # Later saves stay refused: the refused create holds the new key's slot, the old lineage stays suspended.
    again = save(record, lastname=f"Rekeyed-again-{old_link.version}")
    drain()
    assert effect_of(again).state == "quarantined" and not effect_of(again).attempts.exists()
    assert _requests(env) == requests
    return effect


def linked(env, record, contract: str = HUBSPOT) -> RemoteLink:
    """Create the record's remote row and finalized link through the ordinary path."""
    save(record, contract=contract)
    drain()
    link = push_link(record, contract)
    assert link.state == "active"
    return link


# --- DM-01 -----------------------------------------------------------------------------------------------
def test_flow_version_activation_with_same_stable_action_slot_id(env):
    """Retry uses the frozen request; a new Flow version is benign once the PATCH revalidates it."""
    record = contact("vera@x.io")
    first = save(record, contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    dispatch_one()
    effect = effect_of(first)
    assert effect.state == "uncertain"
    # Active create attempt: a save under the newly activated Flow version arrives meanwhile.
    v2 = {**ORIGIN, "flow_version_id": "301000000000002"}
    later = save(record, contract=BILLING, origin=v2, lastname="Vega")
    zero_backoff()
    drain()
    first_try, repeat = effect.attempts.order_by("attempt_number")
    assert (repeat.operation, bytes(repeat.request_body), repeat.path, repeat.idempotency_key) == (
        "create", bytes(first_try.request_body), first_try.path, first_try.idempotency_key)
    assert b"Lee" in bytes(repeat.request_body) and b"Vega" not in bytes(repeat.request_body)  # no rebuild
    assert effect_of(first).command.frozen_binding["action_config"]["flow"] == ORIGIN
    [customer] = env.billing.state()["customers"]
    assert customer["name"] == "Vera Vega" and customer["update_requests"] == 1
    assert [a.operation for a in RemoteEffectAttempt.objects.filter(effect__link_key=effect.link_key)
            .order_by("id")] == ["create", "create", "update"]
    # Existing finalized link: the later save's PATCH revalidated the current action config (benign).
    link = push_link(record, BILLING)
    assert effect_of(later).state == "finalized"
    [(kind, _src, _dst, detail)] = evidence(link)
    assert (kind, detail["surfaces"]) == ("drift_validated", ["flow"])
    assert link.snapshot["flow"] == v2 and link.created_install_id == link.last_validated_install_id
    v3 = {**ORIGIN, "flow_version_id": "301000000000003"}
    expect_validated(env, record, {"flow"}, contract=BILLING, origin=v3)


# --- DM-02 -----------------------------------------------------------------------------------------------
def test_flow_action_renamed_with_same_action_slot_id(env):
    record = contact("ren@x.io")
    effect = parked_create(env, record)
    renamed = {"flow_developer_name": "Contact_Sync_Renamed", "flow_action_name": "Sync_Contact",
               "flow_version_id": ORIGIN["flow_version_id"]}
    # Active create attempt: the renamed Flow's save never rebuilds or re-POSTs; it PATCHes after the link exists.
    later = drift_waits_for(env, effect, record, later_origin=renamed)
    assert later.link_key == effect.link_key  # the stable key, not the names
    assert effect.command.frozen_binding["action_config"]["flow"] == ORIGIN
    link = push_link(record)
    assert link.created_by_effect_id == effect.pk
    [(kind, _src, _dst, detail)] = evidence(link)
    assert (kind, detail["surfaces"]) == ("drift_validated", ["flow"])
    # Existing finalized link: discoverable by the stable key; validated once, then plain PATCHes.
    assert link.snapshot["flow"] == renamed
    posts = env.posts()
    save(record, origin=renamed, lastname="Plain")
    drain()
    assert len(evidence(push_link(record))) == 1 and env.posts() == posts
    assert env.patches(link.remote_id) == 2


# --- DM-03 -----------------------------------------------------------------------------------------------
def _new_action_slot(doc: dict) -> None:
    contract_of(doc)["action_slot_id"] = "slot.push.contact.recreated"


def test_flow_action_removed_and_recreated_with_new_action_slot_id(env):
    record = contact("slot@x.io")
    terminal = contact("dup@x.io")
    # The provider refuses the create outright (a validation error): a definite refusal.
    env.hubspot.set_faults(fail_before_commit={"status": 400, "count": 1})
    refused = save(terminal)
    drain()
    assert effect_of(refused).state == "no_effect"  # a definite refusal: the old slot's terminal create
    effect = parked_create(env, record)
    successor = reconfigure(env, _new_action_slot, switch=False).epoch
    drift_waits_for(env, effect, record, successor)
    # Existing finalized link: fail closed, the link is suspended until an explicit rebind or retire.
    expect_lineage_refused(env, record, push_link(record))
    # Active create attempt of the old lineage (here the unsuperseded terminal one): no new attempt.
    posts = env.posts()
    command = save(terminal, lastname="Again")
    drain()
    assert (effect_of(command).state, effect_of(command).reason_code) == ("quarantined",
                                                                          reasons.SLOT_LINEAGE_UNRESOLVED)
    assert env.posts() == posts
    # A missing ActionSlotId cannot even be published.
    document = _serving_document(env)
    del contract_of(document)["action_slot_id"]
    document["version"] += "-missing"
    with pytest.raises(PackError, match="action_slot_id"):
        pack_publish(document=document)


def _serving_document(env) -> dict:
    """A copy of the CRM account's serving pack document."""
    return json.loads(json.dumps(serving_pack(env).document))


# --- DM-04 -----------------------------------------------------------------------------------------------
def test_connector_namespace_renamed_with_same_owner_key(env):
    record = contact("ns@x.io")
    effect = parked_create(env, record)

    def rename(doc):
        doc["pack_key"] = "crm-connector-renamed"

    successor = reconfigure(env, rename, switch=False).epoch
    drift_waits_for(env, effect, record, successor)
    # Existing finalized link: found by the stable owner key and revalidated; no name-derived new key.
    link = expect_validated(env, record, {"connector_namespace", "install_id"})
    assert link.snapshot["connector_namespace"] == "crm-connector-renamed" and link.owner_key == "pack.hubspot"
    assert RemoteLink.objects.filter(source_record_key=record.record_key, remote_scope=HUBSPOT_ACCOUNT).count() == 1
    assert effect.command.frozen_binding["action_config"]["connector_namespace"] == "hubspot"


# --- DM-05 -----------------------------------------------------------------------------------------------
def test_connector_owner_identity_changed(env):
    record = contact("owner@x.io")
    effect = parked_create(env, record)

    def new_owner(doc):
        doc["owner_key"] = "pack.crm.other-owner"  # same namespace (pack_key), another owner lineage

    successor = reconfigure(env, new_owner, switch=False).epoch
    drift_waits_for(env, effect, record, successor)
    # Existing finalized link: fail closed; the namespace string adopts nothing.
    refused = expect_lineage_refused(env, record, push_link(record))
    assert refused.owner_key == "pack.crm.other-owner" and push_link(record).owner_key == "pack.hubspot"
    # A missing owner key cannot be published.
    document = _serving_document(env)
    del document["owner_key"]
    with pytest.raises(PackError, match="owner_key"):
        pack_publish(document=document)


# --- DM-06 -----------------------------------------------------------------------------------------------
def test_active_pack_install_id_changes(env):
    record = contact("inst@x.io")
    effect = parked_create(env, record)
    new = reconfigure(env, switch=False)  # the same definition republished: a new installation
    drift_waits_for(env, effect, record, new.epoch)
    link = push_link(record)
    assert link.created_install_id == effect.command.frozen_binding["action_config"]["install_id"]
    assert link.created_install_id != new.pack.installation_id
    # Existing finalized link: discovered by the stable key, validated explicitly against the new installation.
    after = expect_validated(env, record, {"install_id"})
    assert (after.created_install_id, after.last_validated_install_id) == (link.created_install_id,
                                                                           new.pack.installation_id)


# --- DM-07 -----------------------------------------------------------------------------------------------
def _rename_profile(doc: dict) -> None:
    profile = profile_of(doc)
    old = profile["profile_key"]
    profile["profile_key"] = "crm.contacts.renamed"
    for contract in doc["push_contracts"]:  # every contract of the pack that names the profile
        if contract["callout_profile"] == old:
            contract["callout_profile"] = "crm.contacts.renamed"


def test_connector_profile_renamed_with_same_destination_slot_id(env):
    record = contact("prof@x.io")
    effect = parked_create(env, record)
    successor = reconfigure(env, _rename_profile, switch=False).epoch
    drift_waits_for(env, effect, record, successor)
    assert effect.command.frozen_binding["callout_profile"] == "hubspot.crm"  # retry keeps the frozen profile
    link = expect_validated(env, record, {"profile_name", "install_id"})
    assert link.snapshot["profile_name"] == "crm.contacts.renamed"


# --- DM-08 -----------------------------------------------------------------------------------------------
def test_connector_profile_deleted_or_recreated_with_new_destination_slot_id(env):
    record = contact("dest@x.io")
    effect = writeback_pending(env, record)

    def recreate(doc):
        _rename_profile(doc)
        contract_of(doc)["destination_slot_id"] = "dest.contact.recreated"

    successor = reconfigure(env, recreate, switch=False).epoch
    # Active create attempt already in writeback-only recovery: it continues.
    writeback_finishes_under_halt(env, effect, successor)
    # Existing finalized link: fail closed before PATCH; no new create under a name-derived key.
    expect_lineage_refused(env, record, push_link(record))

    # The profile deleted: the account no longer offers the contract, so a save cannot even author a push.
    def drop(account):
        account["push_contracts"], account["credentials"] = [], {}

    reconfigure(env, configure=drop)
    requests = _requests(env)
    with pytest.raises(NotServing):
        save(record, lastname="Gone")
    assert _requests(env) == requests


# --- DM-09 -----------------------------------------------------------------------------------------------
def _rotate_ref(env, monkeypatch, ref: str, version: str, *, benign: list[str] | None):
    publish_credential(env, credential_ref=ref, version=version, env_name=f"NEXUS_TEST_TOKEN_{version.upper()}",
                       monkeypatch=monkeypatch)

    def mutate(doc):
        profile = profile_of(doc)
        profile["auth"]["credential_ref"] = ref
        profile.pop("drift", None)
        if benign is not None:
            profile["drift"] = {"benign": benign}

    def configure(account):
        account["credentials"] = {ref: version}

    return mutate, configure


def test_credential_reference_changes(env, monkeypatch):
    record = contact("cred@x.io")
    effect = writeback_pending(env, record)
    mutate, configure = _rotate_ref(env, monkeypatch, "crm_token_b", "test-b",
                                    benign=["credential_ref", "credential_generation"])
    successor = reconfigure(env, mutate, configure=configure, switch=False).epoch
    # Active create attempt: the POST is pinned to its frozen credential; writeback-only recovery continues.
    writeback_finishes_under_halt(env, effect, successor)
    assert effect.command.frozen_binding["action_config"]["credential_ref"] == "private_app_token"
    # The profile declares the rotation the same remote destination: benign once validated.
    expect_validated(env, record, {"credential_ref", "credential_generation", "install_id"})
    # Without that declaration the next reference change fails closed before PATCH.
    mutate, configure = _rotate_ref(env, monkeypatch, "crm_token_c", "test-c", benign=None)
    reconfigure(env, mutate, configure=configure)
    expect_suspended(env, record, {"credential_ref", "credential_generation"})


# --- DM-10 -----------------------------------------------------------------------------------------------
def _endpoint(cls: str, *, benign: bool):
    def mutate(doc):
        profile = profile_of(doc)
        profile["endpoint_class"] = cls
        profile.pop("drift", None)
        if benign:
            profile["drift"] = {"benign": ["endpoint"]}
    return mutate


def test_endpoint_class_or_endpoint_binding_changes(env):
    record, other = contact("ep@x.io"), contact("ep2@x.io")
    linked(env, other)
    effect = writeback_pending(env, record)
    successor = reconfigure(env, _endpoint("crm.private", benign=True), switch=False).epoch
    writeback_finishes_under_halt(env, effect, successor)
    # Declared benign by the profile contract: validated.
    expect_validated(env, record, {"endpoint", "install_id"})
    # Not declared: fail closed before PATCH.
    reconfigure(env, _endpoint("crm.public", benign=False))
    expect_suspended(env, record, {"endpoint"})
    # The endpoint binding (base URL) changes the rendered route: no declaration makes that benign.
    port = env.hubspot.base_url.rsplit(":", 1)[1]

    def rebind(account):
        account["base_url"] = f"http://localhost:{port}"

    reconfigure(env, _endpoint("crm.public", benign=True), configure=rebind)
    expect_suspended(env, other, {"update_route"})


# --- DM-11 -----------------------------------------------------------------------------------------------
def test_credential_secret_or_auth_generation_changes(env, monkeypatch):
    record, other = contact("sec@x.io"), contact("sec2@x.io")
    linked(env, other)
    effect = writeback_pending(env, record)
    frozen = effect.command.frozen_binding["credential_generation"]
    publish_credential(env, credential_ref="private_app_token", version="test-rot1", env_name="NEXUS_TEST_TOKEN_R1",
                       monkeypatch=monkeypatch)

    def rotation(benign):
        def mutate(doc):
            profile_of(doc).pop("drift", None)
            if benign:
                profile_of(doc)["drift"] = {"benign": ["credential_generation"]}
        return mutate

    def to(version):
        def configure(account):
            account["credentials"] = {"private_app_token": version}
        return configure

    successor = reconfigure(env, rotation(True), configure=to("test-rot1"), switch=False).epoch
    # Active create attempt: its frozen credential generation stays the one it dispatches with.
    writeback_finishes_under_halt(env, effect, successor)
    assert effect_of(effect.command).command.frozen_binding["credential_generation"] == frozen
    # The credential contract declares the rotation the same destination: benign once validated.
    expect_validated(env, record, {"credential_generation", "install_id"})
    # Undeclared rotation: fail closed before PATCH.
    publish_credential(env, credential_ref="private_app_token", version="test-rot2", env_name="NEXUS_TEST_TOKEN_R2",
                       monkeypatch=monkeypatch)
    reconfigure(env, rotation(False), configure=to("test-rot2"))
    expect_suspended(env, record, {"credential_generation"})

    # An auth kind change (same credential generation as ``other`` was linked with) fails closed too.
    def auth_kind(doc):
        profile_of(doc).pop("drift", None)
        profile_of(doc)["auth"]["kind"] = "bearer_v2"

    reconfigure(env, auth_kind, configure=to("test-1"))
    expect_suspended(env, other, {"auth_kind"})


# --- DM-12 -----------------------------------------------------------------------------------------------
def test_retry_policy_changes(env):
    record = contact("retry@x.io")
    command = save(record)
    env.hubspot.set_faults(fail_before_commit={"status": 429, "count": 2})
    dispatch_one()
    effect = effect_of(command)
    assert (effect.state, effect.attempt_count) == ("prepared", 1)

    def one_attempt(doc):
        profile_of(doc)["retry"]["max_attempts"] = 1

    successor = reconfigure(env, one_attempt, switch=False).epoch
    with pytest.raises(HaltRefused):
        halt_begin(org=env.org)
    # Active create attempt: another not-performed answer is judged by the frozen policy (8 Attempts), not by
    # the published one (1 Attempt), and the next Attempt creates the contact once.
    zero_backoff()
    dispatch_one()
    effect.refresh_from_db()
    assert (effect.state, effect.attempt_count, effect.reason_code) == ("prepared", 2, "")
    zero_backoff()
    drain()
    effect.refresh_from_db()
    assert effect.state == "finalized" and env.posts() == 3 and len(env.hubspot.state()["contacts"]) == 1
    switch_epoch(env, successor)
    # Existing finalized link: benign for future PATCH attempts; the link identity does not change.
    link = expect_validated(env, record, {"retry_policy_hash", "install_id"})
    assert link.link_key == effect.link_key


# --- DM-13 -----------------------------------------------------------------------------------------------
def _swap_name_parts(doc: dict) -> None:
    mapping = contract_of(doc, BILLING)["mapping"]
    next(entry for entry in mapping if entry["target"] == "name")["source"] = ["lastname", "firstname"]


def test_outbound_mapping_rows_change(env):
    record = contact("map@x.io")
    first = save(record, contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    dispatch_one()
    effect = effect_of(first)
    successor = reconfigure(env, _swap_name_parts, account_key=BILLING_ACCOUNT, switch=False).epoch
    with pytest.raises(HaltRefused):
        halt_begin(org=env.org)
    # Active create attempt: the retry sends the frozen body; the source change meanwhile makes no other POST.
    later = save(record, contract=BILLING, lastname="Moss")
    zero_backoff()
    drain()
    first_try, repeat = effect.attempts.order_by("attempt_number")
    assert bytes(repeat.request_body) == bytes(first_try.request_body)
    assert "name=Map+Lee" in bytes(repeat.request_body).decode()
    [customer] = env.billing.state()["customers"]
    assert customer["update_requests"] == 1 and effect_of(later).state == "finalized"
    switch_epoch(env, successor)
    # Existing finalized link: the PATCH is refused until the payload SSoT revalidates; the link stays as it is.
    link = push_link(record, BILLING)
    requests = env.billing.state()["requests"]
    command = save(record, contract=BILLING, lastname="Moss-Two")
    drain()
    refused = effect_of(command)
    assert (refused.state, refused.reason_code) == ("quarantined", reasons.MAPPING_DRIFT)
    assert not refused.attempts.exists() and refused.link_key == link.link_key
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.version, after.mapping_fingerprint, after.body_fingerprint, after.snapshot) == (
        "active", link.version, link.mapping_fingerprint, link.body_fingerprint, link.snapshot)
    assert evidence(after) == evidence(link)
    assert env.billing.state()["requests"] == requests


# --- DM-14 -----------------------------------------------------------------------------------------------
def _deny_lastname(monkeypatch) -> None:
    """Field-level security changes: ``lastname`` becomes readable by one named user only."""
    view = authority.current_view()
    contact_def = view.object("Contact")
    fields = dict(contact_def.fields)
    fields["lastname"] = dataclasses.replace(fields["lastname"], read_access=("integration_admin",))
    objects = {**view.objects, "Contact": dataclasses.replace(contact_def, fields=fields)}
    monkeypatch.setattr(authority, "current_view", lambda: dataclasses.replace(view, objects=objects))


def test_source_field_fls_or_rls_changes(env, monkeypatch):
    record, other = contact("fls@x.io"), contact("fls2@x.io")
    link = linked(env, other, BILLING)
    first = save(record, contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    dispatch_one()
    effect = effect_of(first)
    pending_update = save(other, contract=BILLING, lastname="Hidden")  # authored while still readable
    _deny_lastname(monkeypatch)
    # Active create attempt: the retry uses the frozen request only; a new body needs fresh authority, which
    # the originating user no longer has, so no new intent (and no POST) exists while the attempt is active.
    with pytest.raises(PushContractError) as refused:
        save(record, contract=BILLING, lastname="Rebuilt")
    assert refused.value.code == "authority_denied"
    zero_backoff()
    drain()
    first_try, repeat = effect.attempts.order_by("attempt_number")
    assert bytes(repeat.request_body) == bytes(first_try.request_body) and repeat.state == "confirmed"
    assert effect_of(first).state == "finalized"
    # Existing finalized link: the PATCH must pass current authority; the link stays authoritative.
    update = effect_of(pending_update)
    assert (update.state, update.reason_code) == ("quarantined", reasons.AUTHORITY_DENIED)
    assert not update.attempts.exists()
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.version, after.remote_id) == ("active", link.version, link.remote_id)
    customers = {c["id"]: c for c in env.billing.state()["customers"]}
    assert customers[link.remote_id]["update_requests"] == 0 and len(customers) == 2
    # Once the user may read the field again, the link is patchable as it was.
    monkeypatch.undo()
    save(other, contract=BILLING, lastname="Visible")
    drain()
    customers = {c["id"]: c for c in env.billing.state()["customers"]}
    assert customers[link.remote_id]["update_requests"] == 1 and customers[link.remote_id]["name"] == "Fls2 Visible"


# --- DM-15 -----------------------------------------------------------------------------------------------
def test_create_path_changes(env):
    record = contact("cpath@x.io")
    first = save(record, contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    dispatch_one()
    effect = effect_of(first)

    def new_create_path(doc):
        contract_of(doc, BILLING)["create"]["path"] = "/v1/customers/create"

    successor = reconfigure(env, new_create_path, account_key=BILLING_ACCOUNT, switch=False).epoch
    with pytest.raises(HaltRefused):
        halt_begin(org=env.org)
    later = save(record, contract=BILLING, lastname="Path")
    zero_backoff()
    drain()
    # Active create attempt: the retry uses the frozen path only; the changed path starts no second attempt.
    assert [(a.operation, a.path) for a in effect.attempts.order_by("attempt_number")] == [
        ("create", "/v1/customers"), ("create", "/v1/customers")]
    assert effect_of(later).attempts.get().operation == "update"
    assert len(env.billing.state()["customers"]) == 1
    switch_epoch(env, successor)
    # Existing finalized link: no effect on the PATCH (a benign, validated surface).
    expect_validated(env, record, {"create_path_hash", "install_id"}, contract=BILLING)
    assert len(env.billing.state()["customers"]) == 1


# --- DM-16 -----------------------------------------------------------------------------------------------
def test_update_path_changes(env):
    record, other = contact("upath@x.io"), contact("upath2@x.io")
    linked(env, other)
    effect = parked_create(env, record)

    def v4(doc):
        contract_of(doc)["update"]["path"] = "/crm/v4/objects/contacts/{remote_id}"

    successor = reconfigure(env, v4, switch=False).epoch
    # Active create attempt: the update path plays no part until the link is finalized.
    drift_waits_for(env, effect, record, successor)
    assert effect.attempts.get().path == CONTACTS_PATH
    # Existing finalized link: the route it renders changed, so the PATCH fails closed.
    expect_suspended(env, record, {"update_route"})

    # Old and new templates that render the same remote route for the link's id are not a drift of the route.
    def same_route(doc):
        contract_of(doc)["update"]["path"] = "/v3/objects/contacts/{remote_id}"
        contract_of(doc)["create"]["path"] = "/v3/objects/contacts"

    def under_crm(account):
        account["base_url"] = env.hubspot.base_url + "/crm"

    reconfigure(env, same_route, configure=under_crm)
    expect_validated(env, other, {"create_path_hash", "install_id"})


# --- DM-17 -----------------------------------------------------------------------------------------------
def test_response_id_path_changes(env):
    record = contact("rid@x.io")
    command = save(record)
    grant = permit_try_grant_one(worker_id="w1")
    assert grant is not None

    def other_path(doc):
        contract_of(doc)["response_id_path"] = "result.objectId"

    successor = reconfigure(env, other_path, switch=False).epoch
    halt_begin(org=env.org)  # the granted create may finish while halting
    # Active create attempt: the response is interpreted with the frozen responseIdPath.
    assert permit_settle(grant, permit_send(grant)) == "remote_confirmed"
    effect = effect_of(command)
    [remote] = env.hubspot.state()["contacts"]
    assert effect.remote_id == remote["id"] and push_link(record).remote_id == remote["id"]
    writeback_finishes_under_halt(env, effect, successor)
    # Existing finalized link: no effect on the PATCH.
    expect_validated(env, record, {"response_id_path_hash", "install_id"})
    assert env.posts() == 1


# --- DM-18 -----------------------------------------------------------------------------------------------
def test_remote_id_and_provenance_field_pair_changes(env):
    record = contact("mirror@x.io")
    effect = writeback_pending(env, record, contract=BILLING)

    def new_mirror(doc):
        contract_of(doc, BILLING)["mirror_field"] = "billing_ref"

    successor = reconfigure(env, new_mirror, account_key=BILLING_ACCOUNT, switch=False).epoch
    # Active create attempt: writeback uses the frozen tuple; the changed tuple cannot hide the attempt.
    writeback_finishes_under_halt(env, effect, successor, BILLING_ACCOUNT)
    [customer] = env.billing.state()["customers"]
    assert Record.objects.get(pk=record.pk).mirrors == {"billing_id": customer["id"]}
    link = push_link(record, BILLING)
    assert (link.mirror_status, link.snapshot["mirror_tuple"]["field"]) == ("written", "billing_id")
    # Existing finalized link: the link stays authoritative (an update, not a create); the new field is not written.
    # The link keeps the tuple it was created with; the mirror tuple is no drift surface (no repeated evidence).
    after = expect_validated(env, record, {"install_id"}, contract=BILLING)
    assert after.snapshot["mirror_tuple"]["field"] == "billing_id"
    assert after.mirror_status == "tuple_changed"
    assert Record.objects.get(pk=record.pk).mirrors == {"billing_id": customer["id"]}
    [customer] = env.billing.state()["customers"]
    assert customer["create_requests"] == 1 and customer["update_requests"] == 1


# --- DM-19 -----------------------------------------------------------------------------------------------
def test_target_object_renamed_or_rebound_with_same_destination_slot_id(env):
    record = contact("tgt@x.io")
    effect = parked_create(env, record)

    def rename(doc):
        contract_of(doc)["target_object"] = "people"

    successor = reconfigure(env, rename, switch=False).epoch
    drift_waits_for(env, effect, record, successor)
    assert effect.command.frozen_binding["action_config"]["target_object"] == "contacts"
    # Existing finalized link: the destination contract proves the same remote target (same rendered route).
    expect_validated(env, record, {"target_object", "install_id"})

    # Rebound to another remote target under the same slot id: the route changes, fail closed.
    def rebind(doc):
        contract_of(doc)["target_object"] = "leads"
        contract_of(doc)["update"]["path"] = "/crm/v3/objects/leads/{remote_id}"

    reconfigure(env, rebind)
    expect_suspended(env, record, {"update_route"})


# --- DM-20 -----------------------------------------------------------------------------------------------
def test_target_object_changes_with_new_or_missing_destination_slot_id(env):
    record = contact("tgt2@x.io")
    effect = parked_create(env, record)

    def retarget(doc):
        contract = contract_of(doc)
        contract.update({"target_object": "leads", "destination_slot_id": "dest.crm.lead"})
        contract["create"]["path"] = "/crm/v3/objects/leads"
        contract["update"]["path"] = "/crm/v3/objects/leads/{remote_id}"

    successor = reconfigure(env, retarget, switch=False).epoch
    drift_waits_for(env, effect, record, successor)
    # Existing finalized link: a different remote destination; no name-derived replacement attempt.
    expect_lineage_refused(env, record, push_link(record))
    assert env.posts() == 1
    document = _serving_document(env)
    del contract_of(document)["destination_slot_id"]
    document["version"] += "-missing"
    with pytest.raises(PackError, match="destination_slot_id"):
        pack_publish(document=document)


# --- DM-21 -----------------------------------------------------------------------------------------------
def test_vendor_idempotency_support_changes(env):
    record = contact("idem@x.io")
    effect = parked_create(env, record)

    def replay_safe(doc):
        profile_of(doc)["idempotency"] = {"header": "Idempotency-Key", "replay_safe": True}

    successor = reconfigure(env, replay_safe, switch=False).epoch
    # Active create attempt: ambiguous POST recovery cannot widen; the frozen declaration still parks it.
    zero_backoff()
    assert effect_try_reconcile_one() is False
    effect.refresh_from_db()
    assert effect.state == "uncertain" and effect.command.frozen_binding["provider_idempotency_key"] is None
    assert env.posts() == 1
    drift_waits_for(env, effect, record, successor)
    # Existing finalized link: no effect (benign once validated).
    expect_validated(env, record, {"idempotency", "install_id"})


# --- DM-22 -----------------------------------------------------------------------------------------------
def test_local_source_deleted_before_first_post(env):
    record, delayed = contact("gone@x.io"), contact("late@x.io")
    command = save(record)
    delete(record)
    # A delayed create: its first try was not performed (rate limited), the source is deleted before the next.
    late = save(delayed)
    env.hubspot.set_faults(fail_before_commit={"status": 429, "count": 1})
    dispatch_one()
    assert effect_of(late).state == "prepared"
    delete(delayed)
    zero_backoff()
    drain()
    for cmd in (command, late):
        effect = effect_of(cmd)
        # Active create attempt: fail closed before POST, parked holding the slot for explicit policy.
        assert (effect.state, effect.reason_code) == ("quarantined", reasons.SOURCE_DELETED_BEFORE_POST)
        assert effect.create_slot == effect.link_key
        assert IntentResultReceipt.objects.get(command=cmd).outcome == "quarantined"
        # Existing finalized link: there is none yet, and none appears.
        assert not RemoteLink.objects.filter(link_key=effect.link_key).exists()
    assert not effect_of(command).attempts.exists()
    assert [a.state for a in effect_of(late).attempts.all()] == ["no_effect"]
    assert env.hubspot.state()["contacts"] == [] and env.posts() == 1  # only the refused 429; no orphan row


# --- DM-23 -----------------------------------------------------------------------------------------------
def test_local_source_deleted_after_remote_id_known_before_mirror_writeback(env):
    record = contact("wb@x.io")
    effect = writeback_pending(env, record, contract=BILLING)
    link = push_link(record, BILLING)
    delete(record)
    requests = _requests(env)
    drain()
    # Active create attempt: writeback does not continue for a deleted source; no other POST.
    effect.refresh_from_db()
    assert effect.state == "finalized" and _requests(env) == requests
    receipt = IntentResultReceipt.objects.get(command=effect.command)
    assert (receipt.outcome, receipt.remote_id, receipt.evidence) == ("finalized", link.remote_id,
                                                                      {"mirror": "source_deleted"})
    # Existing finalized link: its evidence is preserved for reconciliation or retire; the local row stays deleted.
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.reason_code, after.mirror_status, after.remote_id) == (
        "suspended_drift", reasons.SOURCE_DELETED, "source_deleted", link.remote_id)
    [(kind, src, dst, detail)] = evidence(after)
    assert (kind, src, dst, detail) == ("source_deleted", "active", "suspended_drift",
                                        {"effect": int(effect.pk), "remote_id": link.remote_id})
    stored = Record.objects.get(pk=record.pk)
    assert stored.is_deleted and stored.mirrors == {}
    assert len(env.billing.state()["customers"]) == 1


# --- DM-24 -----------------------------------------------------------------------------------------------
def test_remote_404_or_remote_deleted_patch_response(env):
    record, fresh = contact("del@x.io"), contact("nf@x.io")
    link = linked(env, record)
    httpx.delete(f"{env.hubspot.base_url}{CONTACTS_PATH}/{link.remote_id}",
                 headers={"Authorization": f"Bearer {HUBSPOT_TOKEN}"}).raise_for_status()
    command = save(record, lastname="After-Delete")
    drain()
    # Existing finalized link: suspended, no automatic create replacement.
    effect = effect_of(command)
    assert (effect.state, effect.reason_code) == ("no_effect", reasons.DEFINITE_REFUSAL)
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.reason_code) == ("suspended_drift", reasons.REMOTE_NOT_FOUND)
    [(kind, src, dst, detail)] = evidence(after)
    assert (kind, src, dst, detail["status"], detail["effect"]) == (
        "remote_not_found", "active", "suspended_drift", 404, int(effect.pk))
    _stays_refused(env, record, after)
    assert env.posts() == 1
    # Active create attempt: no effect before finalization except the recovery evidence on the attempt.
    command = save(fresh)
    env.hubspot.set_faults(fail_before_commit={"status": 404, "count": 1})
    drain()
    create = effect_of(command)
    assert (create.state, create.reason_code, create.create_slot) == ("no_effect", reasons.DEFINITE_REFUSAL,
                                                                      create.link_key)
    assert create.attempts.get().response_status == 404
    assert not RemoteLink.objects.filter(link_key=create.link_key).exists()
    posts = env.posts()
    again = save(fresh, lastname="Again")
    drain()
    assert (effect_of(again).state, effect_of(again).reason_code) == ("quarantined", reasons.PRIOR_CREATE_UNRESOLVED)
    assert env.posts() == posts


# --- DM-25 -----------------------------------------------------------------------------------------------
def _conflict_contract(mode: str | None):
    def mutate(doc):
        profile_of(doc)["drift"] = {"conflict_statuses": [409], **({"remote_conflict": mode} if mode else {})}
        # Without a create-conflict recovery contract a 409 create stays a definite refusal
        # (tests/connectors/contracts/test_create_conflict_recovery.py covers the contract).
        contract_of(doc).pop("create_conflict_recovery", None)
    return mutate


def _out_of_band_contact(env, email: str) -> str:
    response = httpx.post(f"{env.hubspot.base_url}{CONTACTS_PATH}", json={"properties": {"email": email}},
                          headers={"Authorization": f"Bearer {HUBSPOT_TOKEN}"})
    response.raise_for_status()
    return response.json()["id"]


def test_remote_changed_out_of_band(env):
    record, fresh = contact("oob@x.io"), contact("oob2@x.io")
    link = linked(env, record)
    holder = _out_of_band_contact(env, "taken@x.io")
    # A profile with a safe reconciliation contract: the refused PATCH stays refused, the link stays active.
    reconfigure(env, _conflict_contract("reconcile"))
    command = save(record, email="taken@x.io")
    drain()
    assert (effect_of(command).state, effect_of(command).attempts.get().response_status) == ("no_effect", 409)
    assert RemoteLink.objects.get(pk=link.pk).state == "active"
    assert [row[0] for row in evidence(link)] == ["drift_validated"]
    # Without it the conflict suspends the link.
    reconfigure(env, _conflict_contract(None))
    command = save(record, lastname="Conflicted")
    drain()
    assert effect_of(command).state == "no_effect"
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.reason_code) == ("suspended_drift", reasons.REMOTE_CONFLICT)
    kind, _src, dst, detail = evidence(after)[-1]
    assert (kind, dst, detail["status"]) == ("remote_conflict", "suspended_drift", 409)
    _stays_refused(env, record, after)
    assert env.remote(holder)["update_requests"] == 0 and env.remote(link.remote_id)["properties"]["email"] == "oob@x.io"
    # Active create attempt: a conflicting create is refused and never widened into a repair of the remote row.
    _out_of_band_contact(env, "oob2@x.io")
    command = save(fresh)
    drain()
    create = effect_of(command)
    assert (create.state, create.attempts.get().response_status) == ("no_effect", 409)
    posts, patches = env.posts(), env.patches()
    again = save(fresh, lastname="Repair")
    drain()
    assert effect_of(again).reason_code == reasons.PRIOR_CREATE_UNRESOLVED
    assert (env.posts(), env.patches()) == (posts, patches)


# --- DM-26 -----------------------------------------------------------------------------------------------
def test_stale_remote_locator_conflict(env):
    holder_record, claimant = contact("lock@x.io"), contact("lock2@x.io")
    holder = linked(env, holder_record)
    command = save(claimant)
    stale = httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(201, json={"id": holder.remote_id, "properties": {}})))
    dispatch_one(client=stale)
    # Active create attempt: finalization fails the hard remote-locator uniqueness index.
    effect = effect_of(command)
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.REMOTE_LOCATOR_CONFLICT)
    assert not RemoteLink.objects.filter(link_key=effect.link_key).exists()
    zero_backoff()
    assert effect_try_reconcile_one() is False  # parked for an operator
    with pytest.raises(EffectOperationRefused) as refused:
        effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id=holder.remote_id,
                         actor="ops", note="claims the same remote row")
    assert refused.value.code == "remote_id_conflict"
    with pytest.raises(IntegrityError, match="remote_link_locator_uniq"), transaction.atomic():
        rows.make(RemoteLink, org_id=ORG, owner_key=holder.owner_key, destination_slot_id=holder.destination_slot_id,
                  remote_scope=holder.remote_scope, remote_id=holder.remote_id, live_remote_id=holder.remote_id,
                  state="active", version=1, snapshot={})
    # Existing finalized link: suspended; never two links PATCHed to one remote target.
    after = RemoteLink.objects.get(pk=holder.pk)
    assert (after.state, after.reason_code) == ("suspended_drift", reasons.REMOTE_LOCATOR_CONFLICT)
    [(kind, _src, dst, detail)] = evidence(after)
    assert (kind, dst, detail["claimed_by_link_key"]) == ("remote_conflict", "suspended_drift", effect.link_key)
    _stays_refused(env, holder_record, after)
    assert env.patches() == 0 and env.posts() == 1


# --- DM-27 -----------------------------------------------------------------------------------------------
def test_attempt_orphaned_by_crash_or_lost_worker_lease(env):
    record, orphan = contact("fin@x.io"), contact("orphan@x.io")
    link = linked(env, record)
    command = save(orphan)
    crashed = run_manage(["run_workers", "--role", "egress"],
                         subprocess_env(NEXUS_FAILPOINTS="permit.after_response"), timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert env.posts() == 2  # the create crossed the boundary before the worker died
    restarted = run_manage(["run_workers", "--role", "egress", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    # Active create attempt: resumed only through the durable state machine; the ambiguous effect stays parked.
    effect = effect_of(command)
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.HOLDER_ABANDONED)
    assert [(a.state, a.operation) for a in effect.attempts.all()] == [("uncertain", "create")]
    assert effect.attempts.get().dispatchpermit.state == "abandoned"
    assert env.posts() == 2 and not RemoteLink.objects.filter(link_key=effect.link_key).exists()
    later = save(orphan, lastname="Still-Parked")
    drain()
    assert effect_of(later).state == "prepared" and env.posts() == 2
    # Existing finalized link: no direct effect.
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.version, after.snapshot) == ("active", link.version, link.snapshot)
