"""Create-conflict recovery: a create answered "already exists, Existing ID: N" is proven, never guessed.

Real MariaDB, the real egress adapter and the hubspot pack's CRM sandbox over
HTTP. The contract (``create_conflict_recovery`` of the pack's contact push
contract) parks the refused create ``uncertain`` with the candidate id; the
reconciler reads the candidate back through the frozen base URL and
credential and compares the identity fields of the FROZEN create request:
match -> linked to N as after a 201, mismatch / 404 -> quarantined, a
transient read failure -> still parked. No test sees a second POST.
(Seed 002 "Lifecycle", "Retry And Recovery Semantics".)
"""
from __future__ import annotations

import copy
import json

import httpx
import pytest
from django.db import connection, transaction

from connectors import reasons
from connectors.contracts.pack_document import PackError, validate_pack_document
from connectors.models import RemoteEffectEvidence, RemoteLink
from connectors.outbound.egress import effect_try_finalize_one, effect_try_reconcile_one, permit_try_grant_one
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.services import record_lock, record_update
from packs.hubspot.crm_sandbox import CONTACTS_PATH
from runtime_outbox.models import IntentResultReceipt
from tests.conftest import HUBSPOT_TOKEN, ORG, drain
from tests.connectors.push_helpers import (
    POSTS,
    _bundled,
    contact,
    contract_of,
    dispatch_one,
    effect_of,
    push_env,
    push_link,
    save,
    zero_backoff,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

AUTH = {"Authorization": f"Bearer {HUBSPOT_TOKEN}"}


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    return push_env(billing_sandbox, hubspot_crm_sandbox)


def _remote_contact(env, **properties) -> str:
    """A contact that exists at the provider before the push (made out of band)."""
    response = httpx.post(f"{env.hubspot.base_url}{CONTACTS_PATH}", json={"properties": properties}, headers=AUTH)
    response.raise_for_status()
    return response.json()["id"]


def _parked(env, record, candidate: str):
    """Save and dispatch the record's create: answered 409, parked with ``candidate``; exactly one POST."""
    posts = env.posts()
    command = save(record)
    dispatch_one()
    effect = effect_of(command)
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.CREATE_CONFLICT_EXISTING)
    assert env.posts() == posts + 1
    [row] = RemoteEffectEvidence.objects.filter(effect=effect)
    assert (row.kind, row.to_state, row.detail["candidate_remote_id"], row.detail["status"]) == (
        "create_conflict_existing", "uncertain", candidate, 409)
    assert not IntentResultReceipt.objects.filter(command=command).exists()
    assert permit_try_grant_one(worker_id="t") is None  # parked: never granted again
    return command, effect


def _gets(env, remote_id: str) -> int:
    return env.routes().get(f"GET {CONTACTS_PATH}/{remote_id}", 0)


class _FailingReads(httpx.BaseTransport):
    """Answers the first ``failures`` reads itself (``status`` or a dropped connection), then the sandbox;
    every request asserts that no transaction is open during the I/O."""

    def __init__(self, failures: int, status: int | None, retry_after: str | None = None):
        self.failures, self.status, self.retry_after = failures, status, retry_after
        self.inner = httpx.HTTPTransport()
        self.seen: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert not connection.in_atomic_block, "a transaction is held across the verify read"
        self.seen.append(f"{request.method} {request.url.path}")
        if self.failures > 0:
            self.failures -= 1
            if self.status is None:
                raise httpx.ConnectError("connection refused", request=request)
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return httpx.Response(self.status, json={"status": "error", "message": "unavailable"}, headers=headers)
        return self.inner.handle_request(request)


# --- match: linked to the existing id as after a 201; later edits PATCH it ---------------------------
def test_verified_candidate_is_linked_finalized_and_later_edits_patch_it(env):
    existing = _remote_contact(env, email="ann@x.io", firstname="Old")
    record = contact("Ann@X.io")
    command, effect = _parked(env, record, existing)

    assert effect_try_reconcile_one() is True
    effect.refresh_from_db()
    assert (effect.state, effect.remote_id, effect.reason_code) == ("remote_confirmed", existing, "")
    verified = RemoteEffectEvidence.objects.filter(effect=effect).order_by("id").last()
    assert (verified.kind, verified.to_state, verified.detail["verdict"]) == (
        "create_conflict_verified", "remote_confirmed", "match")
    assert effect_try_finalize_one() is True
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.remote_id) == ("finalized", existing)
    link = push_link(record)
    assert (link.remote_id, link.live_remote_id, link.state) == (existing, existing, "active")

    later = save(record, lastname="Park")
    drain()
    assert IntentResultReceipt.objects.get(command=later).outcome == "finalized"
    assert env.routes() == {POSTS: 2, f"GET {CONTACTS_PATH}/{existing}": 1,
                            f"PATCH {CONTACTS_PATH}/{existing}": 1}
    [remote] = env.hubspot.state()["contacts"]
    assert remote["properties"]["lastname"] == "Park" and remote["create_requests"] == 1


# --- the frozen request decides, never the live record -------------------------------------------------
def test_recovery_compares_the_frozen_request_and_the_later_change_follows_as_a_patch(env):
    existing = _remote_contact(env, email="bo@x.io", firstname="Bo")
    record = contact("bo@x.io")
    command, effect = _parked(env, record, existing)
    # The local record changes its identity after the create was frozen (no push authored yet).
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        record_update(org=OrgScope(ORG), record=locked, changes={"email": "bo.new@x.io"})
    assert effect_try_reconcile_one() is True
    effect.refresh_from_db()
    assert (effect.state, effect.remote_id) == ("remote_confirmed", existing)
    drain()
    assert IntentResultReceipt.objects.get(command=command).outcome == "finalized"
    # The change follows as a PATCH of the linked id.
    later = save(record)
    drain()
    assert IntentResultReceipt.objects.get(command=later).remote_id == existing
    assert env.remote(existing)["properties"]["email"] == "bo.new@x.io"
    assert env.posts() == 2 and env.patches(existing) == 1


# --- mismatch and 404: quarantined with a closed reason; the slot stays occupied -----------------------
def test_identity_mismatch_quarantines_and_nothing_is_written_remotely(env):
    existing = _remote_contact(env, email="cy@x.io", firstname="Cy")
    record = contact("cy@x.io")
    command, effect = _parked(env, record, existing)
    # Out of band, the candidate's email changes before the read: it no longer proves this create's identity.
    httpx.patch(f"{env.hubspot.base_url}{CONTACTS_PATH}/{existing}", json={"properties": {"email": "other@x.io"}},
                headers=AUTH).raise_for_status()
    assert effect_try_reconcile_one() is True
    effect.refresh_from_db()
    assert (effect.state, effect.reason_code) == ("quarantined", reasons.CREATE_CONFLICT_IDENTITY_MISMATCH)
    refuted = RemoteEffectEvidence.objects.filter(effect=effect).order_by("id").last()
    assert (refuted.kind, refuted.detail["mismatched_fields"], refuted.detail["verify_status"]) == (
        "create_conflict_refuted", ["email"], 200)
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.evidence["reason"]) == ("quarantined", reasons.CREATE_CONFLICT_IDENTITY_MISMATCH)
    assert not RemoteLink.objects.filter(org_id=ORG, action_type="PushToConnector").exists()
    posts = env.posts()
    again = save(record, lastname="Again")
    drain()
    assert effect_of(again).reason_code == reasons.PRIOR_CREATE_UNRESOLVED  # the create slot stays occupied
    assert env.posts() == posts and env.patches() == 1  # only the out-of-band PATCH


def test_candidate_gone_on_read_quarantines(env):
    existing = _remote_contact(env, email="di@x.io")
    record = contact("di@x.io")
    command, effect = _parked(env, record, existing)
    httpx.delete(f"{env.hubspot.base_url}{CONTACTS_PATH}/{existing}", headers=AUTH).raise_for_status()
    assert effect_try_reconcile_one() is True
    effect.refresh_from_db()
    assert (effect.state, effect.reason_code) == ("quarantined", reasons.CREATE_CONFLICT_CANDIDATE_GONE)
    assert IntentResultReceipt.objects.get(command=command).outcome == "quarantined"
    assert _gets(env, existing) == 1 and env.posts() == 2
    drain()
    assert env.posts() == 2


def test_a_candidate_already_linked_to_another_record_is_never_linked_twice(env):
    first = contact("gus@x.io")
    save(first)
    drain()
    link = push_link(first)
    second = contact("GUS@x.io")  # another local record with the same identity
    command, effect = _parked(env, second, link.remote_id)
    assert effect_try_reconcile_one() is True
    effect.refresh_from_db()
    assert (effect.state, effect.reason_code) == ("quarantined", reasons.CREATE_CONFLICT_CANDIDATE_LINKED)
    assert IntentResultReceipt.objects.get(command=command).outcome == "quarantined"
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.version) == ("active", link.version)  # the holder's link is left as it is
    assert RemoteLink.objects.filter(org_id=ORG, action_type="PushToConnector").count() == 1
    assert env.posts() == 2


# --- a transient read failure: still parked, read again later; no transaction across the read ----------
@pytest.mark.parametrize("status", [503, None], ids=["503", "connect-error"])
def test_transient_read_failure_stays_parked_and_a_later_read_links(env, status):
    existing = _remote_contact(env, email="ed@x.io")
    record = contact("ed@x.io")
    _command, effect = _parked(env, record, existing)
    transport = _FailingReads(1, status, retry_after="120" if status else None)
    with httpx.Client(transport=transport) as client:
        before = db_now()
        assert effect_try_reconcile_one(client=client) is True
        effect.refresh_from_db()
        assert (effect.state, effect.reason_code) == ("uncertain", reasons.CREATE_CONFLICT_EXISTING)
        if status == 503:
            # The provider's Retry-After sets the next read.
            assert (effect.next_attempt_at - before).total_seconds() >= 110
        assert effect_try_reconcile_one(client=client) is False  # not due yet
        zero_backoff()
        assert effect_try_reconcile_one(client=client) is True
    effect.refresh_from_db()
    assert (effect.state, effect.remote_id) == ("remote_confirmed", existing)
    assert transport.seen == [f"GET {CONTACTS_PATH}/{existing}"] * 2
    assert env.posts() == 2


# --- Retry-After of a rate-limited create sets the effect's next attempt ---------------------------------
def test_retry_after_of_a_rate_limited_create_sets_the_next_attempt(env, db_clock_advance):
    record = contact("fy@x.io")
    command = save(record)
    transport = httpx.MockTransport(lambda request: httpx.Response(
        429, json={"status": "error", "message": "rate limited"}, headers={"Retry-After": "90"}))
    before = db_now()
    with httpx.Client(transport=transport) as client:
        dispatch_one(client=client)
    effect = effect_of(command)
    assert effect.state == "prepared"
    assert (effect.next_attempt_at - before).total_seconds() >= 85
    assert permit_try_grant_one(worker_id="t") is None  # not due until the provider's time
    zero_backoff()
    assert permit_try_grant_one(worker_id="t") is None  # and the account's lane is paused until then
    db_clock_advance(91)
    drain()
    assert effect_of(command).state == "finalized" and env.posts() == 1


# --- publication validates the block ----------------------------------------------------------------------
@pytest.mark.parametrize("mutate, message", [
    (lambda block: block.update(statuses=[200]), "4xx"),
    (lambda block: block.update(extra=1), "exactly statuses"),
    (lambda block: block["existing_id"].update(pattern="Existing ID: \\d+"), "exactly one group"),
    (lambda block: block["existing_id"].update(pattern="("), "does not compile"),
    (lambda block: block["existing_id"].pop("json_path"), "json_path"),
    (lambda block: block["verify"].update(method="POST"), "GET"),
    (lambda block: block["verify"].update(path="/objects/none"), "{remote_id}"),
    (lambda block: block["verify"].update(identity=[]), "at least one"),
    (lambda block: block["verify"]["identity"][0].update(compare="fuzzy"), "compare"),
], ids=["status", "key", "groups", "regex", "path", "method", "placeholder", "identity", "comparator"])
def test_publication_refuses_a_malformed_recovery_block(mutate, message):
    document = copy.deepcopy(_bundled("hubspot"))
    validate_pack_document(document, "pack.json")  # the bundled block is valid
    mutate(contract_of(document)["create_conflict_recovery"])
    with pytest.raises(PackError, match="create_conflict_recovery") as caught:
        validate_pack_document(document, "pack.json")
    assert message in str(caught.value)


def test_bundled_block_is_the_declared_contract():
    block = contract_of(json.loads(json.dumps(_bundled("hubspot"))))["create_conflict_recovery"]
    assert block["statuses"] == [409] and block["verify"]["method"] == "GET"
    assert block["verify"]["identity"] == [{"request": "email", "remote": "properties.email", "compare": "casefold"}]
