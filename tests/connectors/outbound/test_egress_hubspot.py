"""The sole egress adapter against a CRM objects provider without idempotency keys (issue #5).

Real MariaDB, the real adapter (grant -> send -> settle -> finalize) and the
hubspot pack's loopback CRM sandbox over HTTP; every test asserts what the
provider saw through the sandbox's own counters. The same org also serves the
billing contract (replay-safe idempotency keys), so the two providers' answers
to the same fault can be contrasted through one L0 model (seed 003 "Outbound
facts", "State machines"; seed 002 "After POST", "Before PATCH").
"""
from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from django.core.management import CommandError, call_command

from connectors import reasons
from connectors.contracts.pack_document import load_pack
from connectors.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteEffectEvidence, RemoteLink
from connectors.outbound.egress import (
    effect_try_dispatch_one,
    effect_try_finalize_one,
    effect_try_reconcile_one,
    permit_try_grant_one,
)
from packs.hubspot.crm_sandbox import CONTACTS_PATH
from runtime_outbox.models import IntentResultReceipt
from runtime_outbox.services import outbox_try_deliver_one
from tests.conftest import HUBSPOT_ACCOUNT, HUBSPOT_TOKEN, ORG, drain, make_serving_org
from tests.kits.outbound import author, zero_backoff
from tests.kits.records import create_contact

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CONTRACT = "hubspot.contact"
POSTS = f"POST {CONTACTS_PATH}"


@pytest.fixture
def org(billing_sandbox, hubspot_crm_sandbox):
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False, hubspot_url=hubspot_crm_sandbox.base_url)


def _dispatch_one() -> RemoteEffect:
    """Deliver the outbox and make exactly one provider call; return the effect after settlement."""
    while outbox_try_deliver_one():
        pass
    assert effect_try_dispatch_one(worker_id="t") is True
    return RemoteEffect.objects.get(org_id=ORG, contract_key=CONTRACT)


def _lookup_by_email(sandbox, email: str) -> httpx.Response:
    """What an operator does before reconciling: ask the provider by the unique email."""
    return httpx.get(f"{sandbox.base_url}{CONTACTS_PATH}/{email}", params={"idProperty": "email"},
                     headers={"Authorization": f"Bearer {HUBSPOT_TOKEN}"})


def _attempt_facts(attempt: RemoteEffectAttempt) -> tuple:
    attempt.refresh_from_db()
    return (attempt.attempt_number, attempt.operation, attempt.method, attempt.path, bytes(attempt.request_body),
            attempt.request_digest, attempt.idempotency_key, attempt.state, attempt.version, attempt.response_status,
            bytes(attempt.response_body or b""), attempt.error, attempt.remote_id)


def _max_attempts() -> int:
    pack = load_pack("hubspot")
    return pack.callout_profile(pack.push_contract(CONTRACT)["callout_profile"])["retry"]["max_attempts"]


# --- 1. create, link, receipt; a later edit PATCHes the linked id -------------------------------
def test_create_links_the_provider_id_and_a_later_edit_patches_it(org, hubspot_crm_sandbox, billing_sandbox):
    contact = create_contact(email="ann@x.io", firstname="Ann", lastname="Lee", lifecyclestage="customer")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    assert command.frozen_binding["provider_idempotency_key"] is None  # the frozen policy is not replay-safe
    drain()
    [remote] = hubspot_crm_sandbox.state()["contacts"]
    assert remote["properties"] == {"email": "ann@x.io", "firstname": "Ann", "lastname": "Lee",
                                    "lifecyclestage": "customer"}
    link = RemoteLink.objects.get(org_id=ORG, action_type="PushToConnector")
    assert (link.remote_id, link.state, link.owner_key, link.remote_scope) == (
        remote["id"], "active", "pack.hubspot", HUBSPOT_ACCOUNT)
    contact.refresh_from_db()
    assert contact.mirrors == {}  # the contract declares no mirror field: the link alone holds the identity
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.remote_id, receipt.evidence) == ("finalized", remote["id"], {"mirror": "skipped"})
    [create] = RemoteEffectAttempt.objects.filter(org_id=ORG)
    assert (create.operation, create.method, create.path, create.idempotency_key) == (
        "create", "POST", CONTACTS_PATH, "")
    assert json.loads(bytes(create.request_body)) == {"properties": remote["properties"]}

    second = author(contact.record_key, "push-2", contract=CONTRACT, lastname="Lee-Park")
    drain()
    state = hubspot_crm_sandbox.state()
    [remote] = state["contacts"]
    assert remote["properties"]["lastname"] == "Lee-Park"
    assert (remote["create_requests"], remote["update_requests"], remote["conflict_requests"]) == (1, 1, 0)
    assert state["requests_by_route"] == {POSTS: 1, f"PATCH {CONTACTS_PATH}/{remote['id']}": 1}
    update = RemoteEffectAttempt.objects.get(org_id=ORG, operation="update")
    assert (update.method, update.path, update.state) == ("PATCH", f"{CONTACTS_PATH}/{remote['id']}", "confirmed")
    assert IntentResultReceipt.objects.get(command=second).outcome == "finalized"
    assert billing_sandbox.state()["requests"] == 0  # the contract routes to its one account only


# --- 2. 409 duplicate on create: parked, the candidate is read back and linked; never a second POST --------
def test_duplicate_email_on_create_is_recovered_to_the_existing_contact_without_a_second_post(org,
                                                                                               hubspot_crm_sandbox):
    existing = httpx.post(f"{hubspot_crm_sandbox.base_url}{CONTACTS_PATH}",
                          json={"properties": {"email": "dup@x.io", "firstname": "Old"}},
                          headers={"Authorization": f"Bearer {HUBSPOT_TOKEN}"}).json()["id"]
    contact = create_contact(email="DUP@x.io", firstname="New")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    effect = _dispatch_one()
    # The contract's create_conflict_recovery: not a no_effect, parked with the candidate id as evidence.
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.CREATE_CONFLICT_EXISTING)
    [attempt] = RemoteEffectAttempt.objects.filter(org_id=ORG)
    assert (attempt.state, attempt.response_status) == ("no_effect", 409)
    [parked] = RemoteEffectEvidence.objects.filter(effect=effect)
    assert (parked.kind, parked.detail["candidate_remote_id"]) == ("create_conflict_existing", existing)
    assert not IntentResultReceipt.objects.filter(command=command).exists()
    assert not RemoteLink.objects.filter(org_id=ORG).exists()

    assert permit_try_grant_one(worker_id="t") is None  # the create is never repeated
    assert effect_try_reconcile_one() is True  # the verify read proves the identity (emails compare casefolded)
    effect.refresh_from_db()
    assert (effect.state, effect.remote_id) == ("remote_confirmed", existing)
    assert effect_try_finalize_one() is True
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.remote_id) == ("finalized", existing)
    link = RemoteLink.objects.get(org_id=ORG)
    assert (link.remote_id, link.state, link.created_by_effect_id) == (existing, "active", effect.pk)
    state = hubspot_crm_sandbox.state()
    [remote] = state["contacts"]
    assert remote["id"] == existing and remote["properties"] == {"email": "dup@x.io", "firstname": "Old"}
    assert state["requests_by_route"] == {POSTS: 2, f"GET {CONTACTS_PATH}/{existing}": 1}
    drain()
    assert hubspot_crm_sandbox.state()["requests"] == 3


# --- 2b. without a create-conflict recovery contract: a 409 create is terminal no_effect, never reopened -----
def test_duplicate_email_on_create_is_terminal_no_effect_and_never_reopens(billing_sandbox, hubspot_crm_sandbox):
    from tests.connectors.push_helpers import contract_of, push_env, reconfigure

    reconfigure(push_env(billing_sandbox, hubspot_crm_sandbox),
                lambda doc: contract_of(doc).pop("create_conflict_recovery"))
    existing = httpx.post(f"{hubspot_crm_sandbox.base_url}{CONTACTS_PATH}",
                          json={"properties": {"email": "dup@x.io", "firstname": "Old"}},
                          headers={"Authorization": f"Bearer {HUBSPOT_TOKEN}"}).json()["id"]
    contact = create_contact(email="dup@x.io", firstname="New")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    effect = _dispatch_one()
    assert (effect.state, effect.reason_code) == ("no_effect", reasons.DEFINITE_REFUSAL)
    [attempt] = RemoteEffectAttempt.objects.filter(org_id=ORG)
    assert (attempt.state, attempt.response_status) == ("no_effect", 409)
    assert json.loads(bytes(attempt.response_body))["message"] == f"Contact already exists. Existing ID: {existing}"
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.remote_id, receipt.evidence["status"]) == ("no_effect", "", 409)
    assert not RemoteLink.objects.filter(org_id=ORG).exists()
    state = hubspot_crm_sandbox.state()
    [remote] = state["contacts"]
    assert remote["id"] == existing and remote["properties"] == {"email": "dup@x.io", "firstname": "Old"}
    assert (remote["create_requests"], remote["conflict_requests"]) == (1, 1)
    assert state["requests_by_route"] == {POSTS: 2}  # the set-up create and the one refused push

    # Terminal: no backoff, worker or operator reopens it.
    zero_backoff()
    assert permit_try_grant_one(worker_id="t") is None
    assert effect_try_reconcile_one() is False
    drain()
    with pytest.raises(CommandError, match="effect_not_uncertain"):
        call_command("effects", "reconcile", str(effect.pk), "--org", ORG, "--no-effect", "--retry",
                     "--actor", "ops", "--note", "try again", stdout=io.StringIO())
    effect.refresh_from_db()
    assert (effect.state, effect.attempt_count) == ("no_effect", 1)
    assert RemoteEffectAttempt.objects.filter(org_id=ORG).count() == 1
    assert hubspot_crm_sandbox.state()["requests"] == 2
    contact.refresh_from_db()
    assert contact.mirrors == {}


# --- 3. response lost after commit: uncertain, never repeated; operator confirms -------------------------
def test_lost_response_stays_uncertain_until_an_operator_confirms_the_contact(org, hubspot_crm_sandbox):
    contact = create_contact(email="cy@x.io", firstname="Cy")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    hubspot_crm_sandbox.set_faults(drop_response_after_commit=1)
    effect = _dispatch_one()
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.RESPONSE_AMBIGUOUS)
    [attempt] = RemoteEffectAttempt.objects.filter(org_id=ORG)
    assert (attempt.state, attempt.response_status) == ("uncertain", None)
    before = _attempt_facts(attempt)

    # Not replay-safe: the reconcile worker leaves it parked, even with the backoff served.
    zero_backoff()
    assert effect_try_reconcile_one() is False
    drain()
    effect.refresh_from_db()
    assert effect.state == "uncertain" and effect.attempt_count == 1
    state = hubspot_crm_sandbox.state()
    [remote] = state["contacts"]
    assert remote["create_requests"] == 1 and state["requests_by_route"] == {POSTS: 1}
    assert not IntentResultReceipt.objects.filter(command=command).exists()

    # The operator proves the remote identity with the provider's unique-property lookup.
    found = _lookup_by_email(hubspot_crm_sandbox, "cy@x.io")
    assert found.status_code == 200 and found.json()["id"] == remote["id"]
    out = io.StringIO()
    call_command("effects", "reconcile", str(effect.pk), "--org", ORG, "--confirmed", remote["id"],
                 "--actor", "ops@example", "--note", "found by email lookup", stdout=out)
    effect.refresh_from_db()
    assert (effect.state, effect.remote_id) == ("remote_confirmed", remote["id"])
    [evidence] = RemoteEffectEvidence.objects.filter(org_id=ORG, effect=effect)
    assert (evidence.kind, evidence.actor, evidence.from_state, evidence.to_state) == (
        "operator_confirmed", "ops@example", "uncertain", "remote_confirmed")
    assert evidence.detail["remote_id"] == remote["id"] and evidence.detail["note"] == "found by email lookup"

    assert effect_try_finalize_one() is True
    effect.refresh_from_db()
    assert effect.state == "finalized"
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.remote_id) == ("finalized", remote["id"])
    assert RemoteLink.objects.get(org_id=ORG).remote_id == remote["id"]
    assert _attempt_facts(attempt) == before  # the uncertain Attempt is history, never rewritten
    assert RemoteEffectAttempt.objects.filter(org_id=ORG).count() == 1
    state = hubspot_crm_sandbox.state()
    assert state["requests_by_route"] == {POSTS: 1, f"GET {CONTACTS_PATH}/cy@x.io": 1}  # no second provider write

    # The reconciled link is PATCH authority for the next edit.
    author(contact.record_key, "push-2", contract=CONTRACT, firstname="Cyril")
    drain()
    state = hubspot_crm_sandbox.state()
    assert state["requests_by_route"][f"PATCH {CONTACTS_PATH}/{remote['id']}"] == 1
    assert state["contacts"][0]["properties"]["firstname"] == "Cyril" and len(state["contacts"]) == 1


def test_an_ambiguous_5xx_blocks_the_repeat_until_an_operator_proves_no_effect(org, hubspot_crm_sandbox):
    contact = create_contact(email="di@x.io", firstname="Di")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    hubspot_crm_sandbox.set_faults(fail_before_commit={"status": 503, "count": 1})
    effect = _dispatch_one()
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.RESPONSE_AMBIGUOUS)
    zero_backoff()
    assert effect_try_reconcile_one() is False
    drain()
    assert hubspot_crm_sandbox.state()["requests_by_route"] == {POSTS: 1}
    assert RemoteEffect.objects.get(pk=effect.pk).state == "uncertain"

    assert _lookup_by_email(hubspot_crm_sandbox, "di@x.io").status_code == 404
    call_command("effects", "reconcile", str(effect.pk), "--org", ORG, "--no-effect", "--retry",
                 "--actor", "ops", "--note", "no contact holds the email", stdout=io.StringIO())
    [evidence] = RemoteEffectEvidence.objects.filter(org_id=ORG, effect=effect)
    assert (evidence.kind, evidence.to_state) == ("operator_no_effect", "prepared")
    drain()
    effect.refresh_from_db()
    assert effect.state == "finalized" and effect.attempt_count == 2
    assert [a.state for a in RemoteEffectAttempt.objects.filter(org_id=ORG).order_by("attempt_number")] == [
        "uncertain", "confirmed"]
    state = hubspot_crm_sandbox.state()
    assert len(state["contacts"]) == 1 and state["contacts"][0]["create_requests"] == 1
    assert state["requests_by_route"][POSTS] == 2
    assert IntentResultReceipt.objects.get(command=command).remote_id == state["contacts"][0]["id"]


def test_a_timeout_is_ambiguous_and_the_late_create_is_not_repeated(org, hubspot_crm_sandbox):
    pack = load_pack("hubspot")
    timeout = pack.callout_profile(pack.push_contract(CONTRACT)["callout_profile"])["timeout_seconds"]
    contact = create_contact(email="ty@x.io", firstname="Ty")
    author(contact.record_key, "push-1", contract=CONTRACT)
    hubspot_crm_sandbox.set_faults(delay_seconds=timeout + 1)
    effect = _dispatch_one()
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.RESPONSE_AMBIGUOUS)
    [attempt] = RemoteEffectAttempt.objects.filter(org_id=ORG)
    assert attempt.response_status is None and "Timeout" in attempt.error
    hubspot_crm_sandbox.set_faults(delay_seconds=0)
    deadline = time.monotonic() + 10
    while hubspot_crm_sandbox.contact_by_email("ty@x.io") is None:  # the provider finishes after the client gave up
        assert time.monotonic() < deadline
        time.sleep(0.1)
    zero_backoff()
    assert effect_try_reconcile_one() is False
    drain()
    assert RemoteEffect.objects.get(pk=effect.pk).state == "uncertain"
    state = hubspot_crm_sandbox.state()
    assert state["requests_by_route"] == {POSTS: 1} and state["contacts"][0]["create_requests"] == 1


# --- 4. proven not performed (429 / 477): another Attempt while the frozen policy permits ---------------
@pytest.mark.parametrize("status", [429, 477])
def test_a_rate_limited_create_is_retried_and_creates_once(org, hubspot_crm_sandbox, status):
    contact = create_contact(email="ed@x.io", firstname="Ed")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    hubspot_crm_sandbox.set_faults(fail_before_commit={"status": status, "count": 1})
    effect = _dispatch_one()
    assert (effect.state, effect.reason_code, effect.attempt_count) == ("prepared", "", 1)
    [first] = RemoteEffectAttempt.objects.filter(org_id=ORG)
    assert (first.state, first.response_status) == ("no_effect", status)
    assert DispatchPermit.objects.get(attempt=first).state == "returned"
    assert not IntentResultReceipt.objects.filter(command=command).exists()
    assert hubspot_crm_sandbox.state()["contacts"] == []

    zero_backoff()
    drain()
    effect.refresh_from_db()
    assert effect.state == "finalized" and effect.attempt_count == 2
    first_again, second = RemoteEffectAttempt.objects.filter(org_id=ORG).order_by("attempt_number")
    assert (first_again.state, second.state, second.operation) == ("no_effect", "confirmed", "create")
    assert bytes(first_again.request_body) == bytes(second.request_body)
    state = hubspot_crm_sandbox.state()
    [remote] = state["contacts"]
    assert state["requests_by_route"] == {POSTS: 2} and remote["create_requests"] == 1
    assert IntentResultReceipt.objects.get(command=command).remote_id == remote["id"]


def test_not_performed_until_the_frozen_retry_cap_is_terminal_no_effect(org, hubspot_crm_sandbox):
    """477 (portal migrating): not performed and not a rate limit, so each Attempt counts. 429s never do
    (tests/connectors/outbound/test_rate_limit_lanes.py)."""
    cap = _max_attempts()
    contact = create_contact(email="fa@x.io", firstname="Fa")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    hubspot_crm_sandbox.set_faults(fail_before_commit={"status": 477, "count": cap + 1})
    while outbox_try_deliver_one():
        pass
    for _ in range(cap):
        zero_backoff()
        assert effect_try_dispatch_one(worker_id="t") is True
    effect = RemoteEffect.objects.get(org_id=ORG)
    assert (effect.state, effect.reason_code, effect.attempt_count) == ("no_effect", reasons.RETRY_EXHAUSTED, cap)
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.evidence["reason"]) == ("no_effect", reasons.RETRY_EXHAUSTED)
    assert {a.state for a in RemoteEffectAttempt.objects.filter(org_id=ORG)} == {"no_effect"}
    assert hubspot_crm_sandbox.state()["requests_by_route"] == {POSTS: cap}

    zero_backoff()
    assert permit_try_grant_one(worker_id="t") is None
    drain()
    assert hubspot_crm_sandbox.state()["requests_by_route"] == {POSTS: cap}  # the last injected 477 was never used
    assert hubspot_crm_sandbox.state()["contacts"] == []
    assert RemoteEffect.objects.get(pk=effect.pk).state == "no_effect"


def test_rate_limited_attempts_never_reach_the_frozen_retry_cap(org, hubspot_crm_sandbox):
    cap = _max_attempts()
    contact = create_contact(email="ra@x.io", firstname="Ra")
    command = author(contact.record_key, "push-1", contract=CONTRACT)
    hubspot_crm_sandbox.set_faults(fail_before_commit={"status": 429, "count": cap + 1})
    while outbox_try_deliver_one():
        pass
    for _ in range(cap + 1):
        zero_backoff()
        assert effect_try_dispatch_one(worker_id="t") is True
    effect = RemoteEffect.objects.get(org_id=ORG)
    assert (effect.state, effect.reason_code, effect.attempt_count) == ("prepared", "", cap + 1)
    zero_backoff()
    drain()
    assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
    assert IntentResultReceipt.objects.get(command=command).outcome == "finalized"
    assert len(hubspot_crm_sandbox.state()["contacts"]) == 1


# --- update against a contact the provider no longer has ---------------------------------------------
def test_an_update_of_an_archived_contact_is_refused_and_suspends_the_link(org, hubspot_crm_sandbox):
    contact = create_contact(email="gi@x.io", firstname="Gi")
    author(contact.record_key, "push-1", contract=CONTRACT)
    drain()
    remote_id = RemoteLink.objects.get(org_id=ORG).remote_id
    assert httpx.delete(f"{hubspot_crm_sandbox.base_url}{CONTACTS_PATH}/{remote_id}",
                        headers={"Authorization": f"Bearer {HUBSPOT_TOKEN}"}).status_code == 204
    command = author(contact.record_key, "push-2", contract=CONTRACT, firstname="Gil")
    drain()
    effect = RemoteEffect.objects.get(command=command)
    assert (effect.state, effect.reason_code) == ("no_effect", reasons.DEFINITE_REFUSAL)
    link = RemoteLink.objects.get(org_id=ORG)
    assert (link.state, link.reason_code, link.remote_id) == ("suspended_drift", reasons.REMOTE_NOT_FOUND, remote_id)
    # A later edit never falls back to a create: the link is not PATCH authority while suspended.
    third = author(contact.record_key, "push-3", contract=CONTRACT, firstname="Gilbert")
    drain()
    assert RemoteEffect.objects.get(command=third).reason_code == reasons.LINK_NOT_PATCHABLE
    routes = hubspot_crm_sandbox.state()["requests_by_route"]
    assert routes[POSTS] == 1 and routes[f"PATCH {CONTACTS_PATH}/{remote_id}"] == 1 and len(routes) == 3


# --- 5. the same fault against a replay-safe provider and one without idempotency keys ------------------
def test_a_lost_response_is_repeated_only_under_a_replay_safe_frozen_policy(org, hubspot_crm_sandbox, billing_sandbox):
    contact = create_contact(email="hu@x.io", firstname="Hu", lifecyclestage="customer")
    billing_command = author(contact.record_key, "push-1", contract="billing.customer")
    crm_command = author(contact.record_key, "push-1", contract=CONTRACT)
    billing_sandbox.set_faults(drop_response_after_commit=1)
    hubspot_crm_sandbox.set_faults(drop_response_after_commit=1)
    while outbox_try_deliver_one():
        pass
    assert effect_try_dispatch_one(worker_id="t") and effect_try_dispatch_one(worker_id="t")
    billing_effect = RemoteEffect.objects.get(command=billing_command)
    crm_effect = RemoteEffect.objects.get(command=crm_command)
    assert billing_effect.state == crm_effect.state == "uncertain"

    zero_backoff()
    drain()
    billing_effect.refresh_from_db()
    crm_effect.refresh_from_db()
    # Replay-safe: the exact bytes again under the same frozen key; the provider replays its first result.
    assert billing_effect.state == "finalized"
    first, second = billing_effect.attempts.order_by("attempt_number")
    assert (first.state, second.state) == ("uncertain", "confirmed")
    assert bytes(first.request_body) == bytes(second.request_body)
    assert first.idempotency_key == second.idempotency_key != ""
    [customer] = billing_sandbox.state()["customers"]
    assert customer["create_requests"] == 2
    assert RemoteEffectEvidence.objects.get(effect=billing_effect).kind == "exact_repeat"
    # No idempotency keys: the same fault leaves the effect parked; the provider saw one create.
    assert (crm_effect.state, crm_effect.attempt_count) == ("uncertain", 1)
    [only] = crm_effect.attempts.all()
    assert (only.state, only.idempotency_key) == ("uncertain", "")
    assert not RemoteEffectEvidence.objects.filter(effect=crm_effect).exists()
    state = hubspot_crm_sandbox.state()
    assert state["requests_by_route"] == {POSTS: 1} and state["contacts"][0]["create_requests"] == 1
    contact.refresh_from_db()
    assert contact.mirrors == {"billing_id": customer["id"]}


# --- two structurally different provider contracts through one egress model -----------------------------
@dataclass(frozen=True)
class _Provider:
    contract: str
    writes: Callable[[object], tuple[int, int, int]]  # sandbox -> (remote objects, create requests, update requests)
    fixture: str


def _billing_writes(sandbox) -> tuple[int, int, int]:
    rows = sandbox.state()["customers"]
    return len(rows), sum(r["create_requests"] for r in rows), sum(r["update_requests"] for r in rows)


def _crm_writes(sandbox) -> tuple[int, int, int]:
    rows = sandbox.state()["contacts"]
    return len(rows), sum(r["create_requests"] for r in rows), sum(r["update_requests"] for r in rows)


PROVIDERS = {
    "replay_safe_form_post": _Provider("billing.customer", _billing_writes, "billing_sandbox"),
    "keyless_json_patch": _Provider(CONTRACT, _crm_writes, "hubspot_crm_sandbox"),
}


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_two_structurally_different_push_contracts_share_one_egress_model(org, request, name):
    """Create then update, asserted only on L0 rows and the pack's own contract data."""
    provider = PROVIDERS[name]
    sandbox = request.getfixturevalue(provider.fixture)
    pack_key = provider.contract.split(".")[0]
    contract = load_pack(pack_key).push_contract(provider.contract)
    contact = create_contact(email="ivy@x.io", firstname="Ivy", lastname="Ng", lifecyclestage="customer")
    commands = [author(contact.record_key, "push-1", contract=provider.contract)]
    drain()
    commands.append(author(contact.record_key, "push-2", contract=provider.contract, lastname="Ng-Ho"))
    drain()
    assert provider.writes(sandbox) == (1, 1, 1)
    effects = list(RemoteEffect.objects.filter(org_id=ORG).order_by("id"))
    assert [(e.contract_key, e.state, e.attempt_count) for e in effects] == [(provider.contract, "finalized", 1)] * 2
    attempts = list(RemoteEffectAttempt.objects.filter(org_id=ORG).order_by("id"))
    link = RemoteLink.objects.get(org_id=ORG)
    assert [(a.operation, a.method, a.path, a.state) for a in attempts] == [
        ("create", contract["create"]["method"], contract["create"]["path"], "confirmed"),
        ("update", contract["update"]["method"], contract["update"]["path"].replace("{remote_id}", link.remote_id),
         "confirmed")]
    assert {p.state for p in DispatchPermit.objects.filter(org_id=ORG)} == {"returned"}
    assert (link.state, link.owner_key, link.destination_slot_id) == (
        "active", load_pack(pack_key).owner_key, contract["destination_slot_id"])
    contact.refresh_from_db()
    assert contact.mirrors == ({contract["mirror_field"]: link.remote_id} if contract.get("mirror_field") else {})
    assert [IntentResultReceipt.objects.get(command=c).outcome for c in commands] == ["finalized", "finalized"]


# --- parked uncertain effects never starve the replay-safe reconcile window ------------------------------
def test_parked_uncertain_effects_do_not_starve_an_exact_repeat_of_a_replay_safe_effect(
        org, hubspot_crm_sandbox, billing_sandbox, monkeypatch):
    from connectors.outbound import recovery

    monkeypatch.setattr(recovery, "RECONCILE_PAGE", 10)  # 21 parked effects fill more than two pages
    parked = 21
    hubspot_crm_sandbox.set_faults(drop_response_after_commit=parked)
    for n in range(parked):
        author(create_contact(email=f"p{n}@x.io", firstname="P"), "push-1", contract=CONTRACT)
    while outbox_try_deliver_one():
        pass
    for _ in range(parked):
        assert effect_try_dispatch_one(worker_id="t") is True
    assert RemoteEffect.objects.filter(org_id=ORG, state="uncertain").count() == parked
    billing_sandbox.set_faults(drop_response_after_commit=1)
    command = author(create_contact(email="b@x.io", firstname="B"), "push-1", contract="billing.customer")
    while outbox_try_deliver_one():
        pass
    assert effect_try_dispatch_one(worker_id="t") is True
    assert RemoteEffect.objects.get(command=command).state == "uncertain"
    zero_backoff()
    drain()
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    assert hubspot_crm_sandbox.state()["requests_by_route"] == {POSTS: parked}
