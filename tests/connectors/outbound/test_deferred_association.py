"""Association contracts and the Deferred Association Dispatch Lane (seed 002), on real MariaDB.

Seed 002 "Attempt Key" (the position-aligned association source-id vector),
"Deferred Association Dispatch Lane", "Before POST", "Retry And Recovery
Semantics" 1; ARCHITECTURE.md section 4 (``DispatchLane`` is
``RemoteEffect.dispatch_lane``). The hubspot pack pushes Accounts as
companies and Contacts as contacts whose create carries the company
association inline; the loopback CRM sandbox records what the provider saw.
Crash tests kill a real ``run_workers --role egress-deferred`` process at a
named failpoint.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from django.db import connection, transaction

from connectors import reasons
from connectors.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteEffectEvidence, RemoteLink
from connectors.outbound import egress
from connectors.outbound.intents import PushContractError, proven_no_effect
from connectors.store import RemoteLinkStore
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope
from nexusflow.kernel.workers import units_for
from nexusflow.records.metadata import InvalidFieldValue, load_view
from nexusflow.records.models import Record
from nexusflow.records.services import record_delete, record_lock, record_update
from nexusflow.records.store import RecordStore
from packs.hubspot.crm_sandbox import COMPANIES_PATH, CONTACTS_PATH
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import outbox_try_deliver_one
from tests.conftest import ORG, make_serving_org, run_manage, subprocess_env
from tests.kits.outbound import author, zero_backoff
from tests.kits.records import contact_of, create_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CONTACT, COMPANY = "hubspot.contact", "hubspot.company"
DEFERRED, CONFIGURED = ("deferred_association",), ("configured",)
ASSOCIATION_TYPE = {"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 279}


@pytest.fixture
def org(billing_sandbox, hubspot_crm_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False, hubspot_url=hubspot_crm_sandbox.base_url)


# --- helpers ------------------------------------------------------------------------------------------------
def _account(name: str) -> Record:
    return create_record("Account", name=name, domain=f"{name.lower()}.io")


def _save(record: Record, **changes) -> None:
    """A record save that authors no intent."""
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name=record.object_name, record_key=record.record_key)
        record_update(org=OrgScope(ORG), record=locked, changes=changes)


def _deliver() -> None:
    while outbox_try_deliver_one():
        pass


def _work(lanes: tuple[str, ...]) -> int:
    """Run the egress units for ``lanes`` in-process until none has work; return units done."""
    units = [lambda: egress.permit_try_abandon_one(lanes=lanes), lambda: egress.effect_try_finalize_one(lanes=lanes),
             lambda: egress.effect_try_reconcile_one(lanes=lanes),
             lambda: egress.effect_try_dispatch_one(worker_id="t", lanes=lanes)]
    done = 0
    for _ in range(200):
        worked = sum(unit() for unit in units)
        done += worked
        if not worked:
            return done
    raise AssertionError("egress work did not drain")


def _push_company(account: Record, slot: str = "push-1") -> str:
    """Push ``account`` through the configured lane to ``finalized``; return the company id."""
    command = author(account, slot, contract=COMPANY)
    _deliver()
    _work(CONFIGURED)
    effect = RemoteEffect.objects.get(command=command)
    assert (effect.dispatch_lane, effect.state) == ("configured", "finalized")
    return effect.remote_id


def _effect(command: OutboundCommand) -> RemoteEffect:
    return RemoteEffect.objects.get(command=command)


def _contact_posts(sandbox) -> int:
    return sandbox.state()["requests_by_route"].get(f"POST {CONTACTS_PATH}", 0)


def _drop_frozen_vector(command: OutboundCommand) -> None:
    """Make ``command`` look authored before the association-source vector existed (an older release's row)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runtime_outbox_outboundcommand SET frozen_binding = "
                       "JSON_REMOVE(frozen_binding, '$.associations') WHERE id = %s", [command.pk])
    assert "associations" not in OutboundCommand.objects.get(pk=command.pk).frozen_binding


def _refused_before_post(effect: RemoteEffect, reason: str) -> None:
    effect.refresh_from_db()
    assert (effect.state, effect.reason_code) == ("quarantined", reason)
    assert not RemoteEffectAttempt.objects.filter(effect=effect).exists() and proven_no_effect(effect)
    assert IntentResultReceipt.objects.get(command=effect.command).outcome == "quarantined"


# --- S002-RR-01: the frozen vector decides the association, not the lookup field at dispatch --------------------
def test_a_contact_saved_before_its_company_waits_in_the_deferred_lane_and_associates_the_frozen_target(
        org, hubspot_crm_sandbox):
    acme, other = _account("Acme"), _account("Other")
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    command = author(contact, "push-1", contract=CONTACT)
    binding = command.frozen_binding
    assert (binding["dispatch_lane"], binding["associations"]) == ("deferred_association", [acme.record_key])
    assert "account_id" in binding["authority"]["allowed_fields"]
    _deliver()
    effect = _effect(command)
    assert (effect.dispatch_lane, effect.state) == ("deferred_association", "prepared")
    assert hubspot_crm_sandbox.state()["requests"] == 0  # the request thread made no call

    # The configured-lane claimant never takes it; the deferred one waits for the company without spinning.
    assert egress.permit_try_grant_one(worker_id="t", lanes=CONFIGURED) is None
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=DEFERRED) is False
    effect.refresh_from_db()
    waited = (effect.state, effect.version, effect.next_attempt_at)
    assert effect.state == "prepared" and effect.next_attempt_at is not None
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=DEFERRED) is False
    effect.refresh_from_db()
    assert (effect.state, effect.version, effect.next_attempt_at) == waited  # not due: not even read under lock
    assert not RemoteEffectAttempt.objects.filter(effect=effect).exists()
    assert hubspot_crm_sandbox.state()["requests"] == 0

    # The lookup field changes meanwhile (no new intent): the frozen save-time target still decides.
    _save(contact, account_id=other.record_key)
    company = _push_company(acme)
    other_company = _push_company(other)
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=CONFIGURED) is False
    zero_backoff()
    _work(DEFERRED)

    effect.refresh_from_db()
    assert (effect.state, effect.dispatch_lane) == ("finalized", "deferred_association")
    [remote] = hubspot_crm_sandbox.state()["contacts"]
    assert remote["associations"] == [{"to": company, "types": [ASSOCIATION_TYPE]}] and company != other_company
    assert remote["create_requests"] == 1 and _contact_posts(hubspot_crm_sandbox) == 1
    [attempt] = RemoteEffectAttempt.objects.filter(effect=effect)
    assert json.loads(bytes(attempt.request_body)) == {
        "properties": {"email": "ann@x.io", "firstname": "Ann"},
        "associations": [{"to": {"id": company}, "types": [ASSOCIATION_TYPE]}]}
    link = RemoteLink.objects.get(org_id=ORG, link_key=command.link_key)
    assert (link.state, link.remote_id) == ("active", remote["id"])
    assert IntentResultReceipt.objects.get(command=command).outcome == "finalized"


def test_a_contact_whose_company_is_linked_or_blank_stays_configured(org, hubspot_crm_sandbox):
    acme = _account("Acme")
    company = _push_company(acme)
    linked = author(contact_of("ann@x.io", account_id=acme.record_key), "push-1", contract=CONTACT)
    blank = author(contact_of("bo@x.io", account_id=None), "push-1", contract=CONTACT)
    assert (linked.frozen_binding["dispatch_lane"], linked.frozen_binding["associations"]) == (
        "configured", [acme.record_key])
    assert (blank.frozen_binding["dispatch_lane"], blank.frozen_binding["associations"]) == ("configured", [""])
    _deliver()
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=DEFERRED) is False
    _work(CONFIGURED)
    contacts = {row["properties"]["email"]: row for row in hubspot_crm_sandbox.state()["contacts"]}
    assert contacts["ann@x.io"]["associations"] == [{"to": company, "types": [ASSOCIATION_TYPE]}]
    assert contacts["bo@x.io"]["associations"] == []
    assert json.loads(bytes(RemoteEffectAttempt.objects.get(effect__command=blank).request_body)) == {
        "properties": {"email": "bo@x.io", "firstname": "Bo"}}


# --- admission -------------------------------------------------------------------------------------------------
def _serve_variant_pack(settings, monkeypatch, tmp_path: Path, mode: str) -> None:
    """Serve a copy of the packs whose contact association has ``mode`` (published as another version)."""
    target = tmp_path / "packs"
    shutil.copytree(settings.NEXUS_PACKS_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    path = target / "hubspot" / "pack.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    contract = next(c for c in document["push_contracts"] if c["contract_key"] == CONTACT)
    contract["associations"][0]["mode"] = mode
    document["version"] = f"{document['version']}-{mode.replace('_', '-')}"
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    settings.NEXUS_PACKS_DIR = target
    monkeypatch.setenv("NEXUS_PACKS_DIR", str(target))


def test_an_update_only_target_without_a_finalized_link_fails_admission(settings, monkeypatch, tmp_path,
                                                                        billing_sandbox, hubspot_crm_sandbox):
    _serve_variant_pack(settings, monkeypatch, tmp_path, "update_only")
    make_serving_org(billing_sandbox.base_url, deploy_flow=False, hubspot_url=hubspot_crm_sandbox.base_url)
    acme = _account("Acme")
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    with pytest.raises(PushContractError) as refused:
        author(contact, "push-1", contract=CONTACT)
    assert refused.value.code == "association_target_not_linked"
    assert not OutboundCommand.objects.filter(contract_key=CONTACT).exists()  # the whole save rolled back

    company = _push_company(acme)
    command = author(contact, "push-1", contract=CONTACT)
    assert (command.frozen_binding["dispatch_lane"], command.frozen_binding["associations"]) == (
        "configured", [acme.record_key])
    _deliver()
    _work(CONFIGURED)
    [remote] = hubspot_crm_sandbox.state()["contacts"]
    assert remote["associations"] == [{"to": company, "types": [ASSOCIATION_TYPE]}]


def test_an_association_to_a_missing_record_fails_admission(org, hubspot_crm_sandbox):
    acme = _account("Acme")
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    with transaction.atomic():
        record_delete(org=OrgScope(ORG), record=record_lock(org=OrgScope(ORG), object_name="Account",
                                                             record_key=acme.record_key))
    with pytest.raises(PushContractError) as refused:
        author(contact, "push-1", contract=CONTACT)
    assert refused.value.code == "association_target_missing"
    with pytest.raises(InvalidFieldValue):
        create_record("Contact", email="x@x.io", account_id=" " + acme.record_key)  # a lookup holds a canonical key
    assert not OutboundCommand.objects.exists() and hubspot_crm_sandbox.state()["requests"] == 0


def _association_pack(change) -> dict:
    from django.conf import settings

    document = json.loads((Path(settings.NEXUS_PACKS_DIR) / "hubspot" / "pack.json").read_text(encoding="utf-8"))
    document["version"] = "9.9.9-bad"
    contracts = {c["contract_key"]: c for c in document["push_contracts"]}
    change(contracts[CONTACT], contracts[COMPANY])
    return document


@pytest.mark.parametrize("change", [
    lambda contact, company: contact["associations"][0].update(target_contract="hubspot.nothing"),
    lambda contact, company: contact["associations"][0].update(target_contract=CONTACT),
    lambda contact, company: contact["associations"][0].update(mode="eventually"),
    lambda contact, company: contact["associations"][0].update(template={"to": {"id": "fixed"}}),
    lambda contact, company: contact["associations"][0].update(template="{remote_id}"),
    lambda contact, company: contact["associations"][0].update(source_field=" account_id"),
    lambda contact, company: contact["associations"][0].update(extra=1),
    lambda contact, company: contact["associations"].append(dict(contact["associations"][0])),
    lambda contact, company: contact.pop("associations_key"),
    lambda contact, company: contact.update(associations_key=contact["body_wrap"]),
    lambda contact, company: contact.update(body_encoding="form"),
    lambda contact, company: contact.update(associations={"source_field": "account_id"}),
    lambda contact, company: company.update(associations_key="associations"),
    lambda contact, company: company.update(associations_key="associations", associations=[
        {"source_field": "contact_id", "target_contract": CONTACT, "mode": "create_inline",
         "template": {"to": {"id": "{remote_id}"}}}]),
], ids=["unknown_target", "self_target", "unknown_mode", "no_placeholder", "template_not_object",
        "non_canonical_source", "extra_key", "duplicate", "no_associations_key", "key_is_body_wrap",
        "form_body", "not_a_list", "key_without_associations", "cycle"])
def test_pack_publication_refuses_an_invalid_association_block(change):
    from connectors.contracts.pack_document import PackError
    from connectors.models import PackGeneration
    from connectors.serving.generations import pack_publish

    with pytest.raises(PackError):
        pack_publish(document=_association_pack(change))
    assert not PackGeneration.objects.filter(version="9.9.9-bad").exists()
    assert pack_publish(document=_association_pack(lambda contact, company: None))[0].version == "9.9.9-bad"


# --- fail closed at grant --------------------------------------------------------------------------------------
def test_a_deferred_effect_without_its_frozen_vector_fails_closed(org, hubspot_crm_sandbox):
    acme = _account("Acme")
    command = author(contact_of("ann@x.io", account_id=acme.record_key), "push-1", contract=CONTACT)
    _drop_frozen_vector(command)
    _deliver()
    _push_company(acme)
    zero_backoff()
    _work(DEFERRED)
    _refused_before_post(_effect(command), reasons.ASSOCIATION_SNAPSHOT_MISSING)
    assert _contact_posts(hubspot_crm_sandbox) == 0


def test_a_historical_configured_create_with_an_empty_vector_reads_the_lookup_once_at_grant(
        org, hubspot_crm_sandbox):
    """The documented compatibility exception: only a ``configured`` create authored before the vector existed."""
    acme, other, later = _account("Acme"), _account("Other"), _account("Later")
    _push_company(acme)
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    command = author(contact, "push-1", contract=CONTACT)
    assert command.frozen_binding["dispatch_lane"] == "configured"
    _drop_frozen_vector(command)
    _deliver()
    # The live lookup now names a company that is not linked yet: the create waits for it.
    _save(contact, account_id=later.record_key)
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=CONFIGURED) is False
    assert _effect(command).state == "prepared" and _contact_posts(hubspot_crm_sandbox) == 0
    # It names a linked one by the time the create is granted: that one is associated.
    _save(contact, account_id=other.record_key)
    other_company = _push_company(other)
    zero_backoff()
    _work(CONFIGURED)
    assert _effect(command).state == "finalized"
    [remote] = hubspot_crm_sandbox.state()["contacts"]
    assert remote["associations"] == [{"to": other_company, "types": [ASSOCIATION_TYPE]}]


def test_a_retried_create_reuses_the_association_body_frozen_on_its_first_attempt(org, hubspot_crm_sandbox):
    """Even the historical live lookup is read once: a later Attempt never re-reads the lookup field."""
    acme, other = _account("Acme"), _account("Other")
    company, _other_company = _push_company(acme), _push_company(other)
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    command = author(contact, "push-1", contract=CONTACT)
    _drop_frozen_vector(command)
    _deliver()
    hubspot_crm_sandbox.set_faults(fail_before_commit={"status": 429, "count": 1})
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=CONFIGURED) is True
    assert _effect(command).state == "prepared"  # 429: proven not performed, another Attempt may follow
    _save(contact, account_id=other.record_key)
    zero_backoff()
    _work(CONFIGURED)
    first, second = RemoteEffectAttempt.objects.filter(effect__command=command).order_by("attempt_number")
    assert (first.state, second.state) == ("no_effect", "confirmed")
    assert bytes(first.request_body) == bytes(second.request_body)
    [remote] = hubspot_crm_sandbox.state()["contacts"]
    assert remote["associations"] == [{"to": company, "types": [ASSOCIATION_TYPE]}]


@pytest.mark.parametrize("how", ["target_record_deleted", "target_link_suspended_drift", "target_create_failed"])
def test_a_target_that_can_never_resolve_quarantines_the_deferred_create(org, hubspot_crm_sandbox, how):
    acme = _account("Acme")
    command = author(contact_of("ann@x.io", account_id=acme.record_key), "push-1", contract=CONTACT)
    _deliver()
    if how == "target_create_failed":
        # The company's own create is refused for good (it keeps its slot until an operator supersedes it).
        company = author(acme, "push-1", contract=COMPANY)
        _deliver()
        refusal = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(
            400, json={"status": "error", "category": "VALIDATION_ERROR"})))
        with refusal:
            assert egress.effect_try_dispatch_one(worker_id="t", client=refusal, lanes=CONFIGURED)
        assert RemoteEffect.objects.get(command=company).state == "no_effect"
    elif how == "target_record_deleted":
        with transaction.atomic():
            record_delete(org=OrgScope(ORG), record=record_lock(org=OrgScope(ORG), object_name="Account",
                                                                 record_key=acme.record_key))
    else:
        _push_company(acme)
        link = RemoteLink.objects.get(org_id=ORG, source_object="Account", source_record_key=acme.record_key)
        with transaction.atomic():
            locked = RemoteLinkStore.lock(ORG, link.pk)
            RemoteLinkStore.transition(org_id=ORG, pk=link.pk, src="active", dst="suspended_drift",
                                       version=locked.version, set_fields={"reason_code": reasons.LINK_DRIFT})
    zero_backoff()
    _work(DEFERRED)
    effect = _effect(command)
    _refused_before_post(effect, reasons.ASSOCIATION_TARGET_UNRESOLVED)
    evidence = RemoteEffectEvidence.objects.get(effect=effect)
    assert (evidence.kind, evidence.detail["reason"]) == ("refused_before_post", reasons.ASSOCIATION_TARGET_UNRESOLVED)
    assert evidence.detail["association"]["why"] == how
    assert _contact_posts(hubspot_crm_sandbox) == 0


def test_a_deferred_create_whose_source_is_deleted_while_it_waits_never_posts(org, hubspot_crm_sandbox):
    acme = _account("Acme")
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    command = author(contact, "push-1", contract=CONTACT)
    _deliver()
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=DEFERRED) is False
    with transaction.atomic():  # a deletion without the lifecycle hooks (the intent is still pending)
        RecordStore.soft_delete(record_lock(org=OrgScope(ORG), object_name="Contact", record_key=contact.record_key))
    _push_company(acme)
    zero_backoff()
    _work(DEFERRED)
    _refused_before_post(_effect(command), reasons.SOURCE_DELETED_BEFORE_POST)
    assert _contact_posts(hubspot_crm_sandbox) == 0


# --- a re-trigger while the deferred create is pending ----------------------------------------------------------
def test_a_later_save_authors_an_intent_that_waits_behind_the_deferred_create_and_follows_as_a_patch(
        org, hubspot_crm_sandbox):
    acme = _account("Acme")
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    create = author(contact, "push-1", contract=CONTACT)
    _deliver()
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=DEFERRED) is False  # waiting for the company
    pending = _effect(create)
    follow_up = author(contact, "push-2", contract=CONTACT, lastname="Lee")
    _deliver()
    pending_after = _effect(create)
    # The request thread neither recovered, moved nor called out for the pending create.
    assert (pending_after.state, pending_after.version, pending_after.next_attempt_at) == (
        pending.state, pending.version, pending.next_attempt_at)
    second = _effect(follow_up)
    assert (second.state, second.link_key) == ("prepared", pending.link_key)
    assert hubspot_crm_sandbox.state()["requests"] == 0

    company = _push_company(acme)
    zero_backoff()
    # Head of lane: the follow-up is never granted before the create, whatever lane it is in.
    grant = egress.permit_try_grant_one(worker_id="t", lanes=("configured", "deferred_association"))
    assert grant.effect_id == pending.pk
    assert egress.permit_try_grant_one(worker_id="t", lanes=("configured", "deferred_association")) is None
    response = egress.permit_send(grant)
    assert egress.permit_settle(grant, response) == "remote_confirmed"
    zero_backoff()
    _work(("configured", "deferred_association"))
    assert set(RemoteEffect.objects.filter(contract_key=CONTACT).values_list("state", flat=True)) == {"finalized"}
    [remote] = hubspot_crm_sandbox.state()["contacts"]
    assert (remote["create_requests"], remote["update_requests"]) == (1, 1)
    assert remote["properties"]["lastname"] == "Lee"
    assert remote["associations"] == [{"to": company, "types": [ASSOCIATION_TYPE]}]
    patch = RemoteEffectAttempt.objects.get(effect__command=follow_up)
    assert (patch.operation, json.loads(bytes(patch.request_body))) == (
        "update", {"properties": {"email": "ann@x.io", "firstname": "Ann", "lastname": "Lee"}})


# --- lane-scoped recovery and writeback ---------------------------------------------------------------------------
def _dead_holder() -> str:
    """A registered worker id whose process has exited (its termination is provable)."""
    import socket

    from connectors.models import WorkerProcess

    child = subprocess.Popen(["true"])
    child.wait(30)
    worker_id = f"egress:{socket.gethostname()}:{child.pid}:dead"
    insert(WorkerProcess, worker_id=worker_id, role="egress", host=socket.gethostname(), pid=child.pid,
           process_start_ticks=1)
    return worker_id


def _units(role: str) -> dict:
    return dict(units_for(role, "t"))


def test_the_deferred_role_recovers_and_finalizes_only_its_lane_and_an_unknown_lane_is_never_touched(
        org, hubspot_crm_sandbox):
    deferred_units, general_units = _units("egress-deferred"), _units("egress")
    acme, other = _account("Acme"), _account("Other")
    contact = author(contact_of("ann@x.io", account_id=acme.record_key), "push-1", contract=CONTACT)
    company = author(acme, "push-1", contract=COMPANY)
    _deliver()
    # A configured Permit whose holder died before I/O: only a claimant of its lane recovers it.
    grant = egress.permit_try_grant_one(worker_id=_dead_holder(), lanes=CONFIGURED)
    assert grant.effect_id == _effect(company).pk
    assert deferred_units["permit.abandon"]() is False
    assert DispatchPermit.objects.get(pk=grant.permit_id).state == "granted"
    assert general_units["permit.abandon"]() is True
    assert (DispatchPermit.objects.get(pk=grant.permit_id).state, _effect(company).state) == ("abandoned", "prepared")
    # A configured writeback: the deferred role never finalizes it.
    zero_backoff()
    assert egress.effect_try_dispatch_one(worker_id="t", lanes=CONFIGURED) is True
    assert _effect(company).state == "remote_confirmed"
    assert deferred_units["effect.finalize"]() is False
    assert general_units["effect.finalize"]() is True and _effect(company).state == "finalized"
    # A deferred Permit whose holder died before I/O: the deferred role recovers it.
    zero_backoff()
    deferred = egress.permit_try_grant_one(worker_id=_dead_holder(), lanes=DEFERRED)
    assert deferred.effect_id == _effect(contact).pk
    assert deferred_units["permit.abandon"]() is True
    assert _effect(contact).state == "prepared"
    # A row of a lane this release does not know is never claimed, recovered or finalized.
    unknown = author(other, "push-1", contract=COMPANY)
    _deliver()
    stranger = egress.permit_try_grant_one(worker_id=_dead_holder(), lanes=CONFIGURED)
    assert stranger.effect_id == _effect(unknown).pk
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_remoteeffect SET dispatch_lane = 'bulk_backfill' WHERE id = %s",
                       [stranger.effect_id])
    for units in (deferred_units, general_units):
        assert units["permit.abandon"]() is False
    assert DispatchPermit.objects.get(pk=stranger.permit_id).state == "granted"
    assert _effect(unknown).state == "dispatching"
    zero_backoff()
    _work(DEFERRED)
    assert _effect(contact).state == "finalized"
    assert [row["create_requests"] for row in hubspot_crm_sandbox.state()["contacts"]] == [1]


# --- S002-IC-10 / S002-DM-27: a deferred worker process killed at a failpoint ---------------------------------------
@pytest.mark.parametrize("failpoint,permit_state,effect_after,attempts_after,posts_after", [
    # Killed after the grant committed, before any I/O: recovery returns it to prepared; it is created once.
    ("permit.after_grant", "granted", "finalized", ["no_effect", "confirmed"], 1),
    # Killed after the sending checkpoint: the provider is not replay-safe, so it stays uncertain, never replayed.
    ("permit.after_sending", "sending", "uncertain", ["uncertain"], 0),
])
def test_a_killed_deferred_worker_recovers_its_orphaned_create_only_through_the_effect_machine(
        org, hubspot_crm_sandbox, failpoint, permit_state, effect_after, attempts_after, posts_after):
    acme = _account("Acme")
    contact = contact_of("ann@x.io", account_id=acme.record_key)
    command = author(contact, "push-1", contract=CONTACT)
    _deliver()
    company = _push_company(acme)
    _save(contact, account_id="")  # the lookup is cleared after the save; the frozen vector still names Acme

    crashed = run_manage(["run_workers", "--role", "egress-deferred"], subprocess_env(NEXUS_FAILPOINTS=failpoint),
                         timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    effect = _effect(command)
    [permit] = DispatchPermit.objects.filter(attempt__effect=effect)
    assert permit.state == permit_state and effect.state == "dispatching"
    assert (permit.io_may_have_started_at is not None) == (permit_state == "sending")
    assert _contact_posts(hubspot_crm_sandbox) == 0

    restarted = run_manage(["run_workers", "--role", "egress-deferred", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr

    effect.refresh_from_db()
    assert effect.state == effect_after
    if effect_after == "uncertain":
        assert effect.reason_code == reasons.HOLDER_ABANDONED
    permits = list(DispatchPermit.objects.filter(attempt__effect=effect).order_by("id"))
    assert permits[0].state == "abandoned" and "pid_absent" in str(permits[0].closed_evidence)
    attempts = list(RemoteEffectAttempt.objects.filter(effect=effect).order_by("attempt_number"))
    assert [a.state for a in attempts] == attempts_after
    # Every Attempt carries the one association-complete body frozen at the first grant.
    expected = {"properties": {"email": "ann@x.io", "firstname": "Ann"},
                "associations": [{"to": {"id": company}, "types": [ASSOCIATION_TYPE]}]}
    assert all(json.loads(bytes(a.request_body)) == expected for a in attempts)
    assert _contact_posts(hubspot_crm_sandbox) == posts_after
    contacts = hubspot_crm_sandbox.state()["contacts"]
    assert [(c["create_requests"], c["associations"]) for c in contacts] == (
        [(1, [{"to": company, "types": [ASSOCIATION_TYPE]}])] if posts_after else [])
    # The company (configured lane) was untouched by the deferred worker.
    assert hubspot_crm_sandbox.state()["requests_by_route"][f"POST {COMPANIES_PATH}"] == 1


# --- metadata: lookup fields ---------------------------------------------------------------------------------------
def test_a_lookup_field_must_reference_an_object_of_the_view(tmp_path):
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "A.object.json").write_text(json.dumps(
        {"object": "A", "fields": [{"name": "b_id", "type": "lookup", "references": "B"}]}))
    with pytest.raises(ValueError, match="references unknown object"):
        load_view(tmp_path)
    (tmp_path / "objects" / "B.object.json").write_text(json.dumps({"object": "B", "fields": []}))
    assert load_view(tmp_path).object("A").fields["b_id"].references == "B"
    (tmp_path / "objects" / "B.object.json").write_text(json.dumps(
        {"object": "B", "fields": [{"name": "x", "type": "text", "references": "A"}]}))
    with pytest.raises(ValueError, match="only a lookup field"):
        load_view(tmp_path)
