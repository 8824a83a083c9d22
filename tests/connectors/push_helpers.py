"""Shared helpers for the seed 002 push protocol tests (drift matrix, implementation contract, recovery).

A :class:`PushEnv` is a serving org with the billing sandbox (replay-safe
idempotency keys, a compatibility mirror field) and the CRM objects sandbox
(no idempotency keys: an ambiguous create stays parked for an operator).
:func:`save` is one source-record save that authors an OutboundCommand the
way a record-triggered Flow does; :func:`reconfigure` publishes a modified
copy of a bundled pack under a new version, applies a service configuration
naming it and verifies the successor epoch, and :func:`switch_epoch` moves the
org onto it (halt, OrderingHandoff, successor activation).

Every helper goes through the operator/runtime entry points; nothing here
writes a row directly.
"""
from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction

from connectors import reasons
from connectors.models import (
    AccountServingGate,
    PackGeneration,
    RemoteEffect,
    RemoteLink,
    RemoteLinkEvidence,
    ServingEpoch,
)
from connectors.outbound.effect_decisions import effect_reconcile
from connectors.outbound.egress import effect_try_dispatch_one, effect_try_finalize_one
from connectors.serving.gates import epoch_prepare, epoch_verify, service_configuration_apply
from connectors.serving.generations import credential_publish, pack_publish
from connectors.serving.handoff import (
    HaltRefused,
    HandoffRefused,
    halt_begin,
    halt_try_complete,
    handoff_stage,
    successor_activate,
)
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock, record_update
from nexusflow.records.store import RecordStore
from packs.hubspot.crm_sandbox import CONTACTS_PATH
from runtime_outbox.models import OutboundCommand
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.conftest import HUBSPOT_ACCOUNT, ORG, drain, make_serving_org, service_document
from tests.kits.outbound import SCOPE, zero_backoff
from tests.kits.records import customer_contact

HUBSPOT = "hubspot.contact"
BILLING = "billing.customer"
BILLING_ACCOUNT = "billing-main"
POSTS = f"POST {CONTACTS_PATH}"
#: The originating Flow of the bundled demo, as a record-triggered Flow freezes it (snapshots only).
ORIGIN = {"flow_developer_name": "Contact_Push_Customer", "flow_action_name": "Push_Contact",
          "flow_version_id": "301000000000001"}

_saves = itertools.count(1)
_versions = itertools.count(1)


@dataclass
class PushEnv:
    """A serving org with both push accounts and the L2 document the next :func:`reconfigure` starts from."""

    org: OrgScope
    billing: object
    hubspot: object
    document: dict = field(default_factory=dict)

    # -- what the providers saw ------------------------------------------------------------------
    def routes(self) -> dict[str, int]:
        """``{"METHOD path": requests}`` the CRM sandbox received."""
        return self.hubspot.state()["requests_by_route"]

    def posts(self) -> int:
        """Create requests the CRM sandbox received."""
        return self.routes().get(POSTS, 0)

    def patches(self, remote_id: str | None = None) -> int:
        """Update requests the CRM sandbox received (for ``remote_id`` only, if given)."""
        routes = self.routes()
        if remote_id is not None:
            return routes.get(f"PATCH {CONTACTS_PATH}/{remote_id}", 0)
        return sum(n for route, n in routes.items() if route.startswith("PATCH "))

    def remote(self, remote_id: str) -> dict:
        """The CRM sandbox's row of ``remote_id`` (properties and request counters)."""
        return next(c for c in self.hubspot.state()["contacts"] if c["id"] == remote_id)


def push_env(billing_sandbox, hubspot_crm_sandbox) -> PushEnv:
    """Configure, cut over and serve ``ORG`` with the billing and CRM objects push accounts.

    The L2 document pins every account's pack version, so a later
    :func:`reconfigure` of one pack leaves the other accounts on theirs.
    """
    org = make_serving_org(billing_sandbox.base_url, deploy_flow=False, hubspot_url=hubspot_crm_sandbox.base_url)
    document = service_document(billing_sandbox.base_url, hubspot_crm_sandbox.base_url)
    for account in document["accounts"]:
        account["pack_version"] = _bundled(account["pack"])["version"]
    return PushEnv(org, billing_sandbox, hubspot_crm_sandbox, document)


def _bundled(pack_key: str) -> dict:
    return json.loads((Path(settings.NEXUS_PACKS_DIR) / pack_key / "pack.json").read_text(encoding="utf-8"))


# --- records and saves ---------------------------------------------------------------------------------
def contact(email: str = "ann@x.io", **fields) -> Record:
    """Create a customer Contact Ann-style (last name ``Lee``; no after-save Flow is deployed: pushes are
    authored by :func:`save`)."""
    return customer_contact(email, **{"lastname": "Lee", **fields})


def save(record: Record | str, *, contract: str = HUBSPOT, origin: dict | None = None, deliver: bool = True,
         **changes) -> OutboundCommand:
    """One source-record save: apply ``changes`` and author the push intent in the same transaction.

    Each save is a new logical effect (its own effect slot), frozen under the
    serving epoch, with ``origin`` (default :data:`ORIGIN`) as the originating
    Flow snapshot. ``deliver`` turns the outbox message into its RemoteEffect.
    """
    key = record if isinstance(record, str) else record.record_key
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=key)
        if changes:
            record_update(org=OrgScope(ORG), record=locked, changes=changes)
        command = outbound_command_author(
            scope=SCOPE, effect_root_id=f"root-{contract}-{key}", effect_slot_id=f"save-{next(_saves)}",
            effect_generation_id="1", contract_key=contract, record=locked, origin_flow_run_id=None,
            origin=dict(ORIGIN if origin is None else origin))
    if deliver:
        while outbox_try_deliver_one():
            pass
    return command


def delete(record: Record) -> None:
    """Soft-delete the source record without the deletion lifecycle hooks (``RecordStore.soft_delete``).

    Seed 002's defensive paths (a source gone before POST, before writeback)
    are tested against a deletion that did not pass Runtime's owner check: a
    row deleted before owner protection existed. The installed deletion
    lifecycle (``record_delete``) refuses while such work is unfinished; see
    tests/runtime_outbox/test_owner_protection.py.
    """
    with transaction.atomic():
        RecordStore.soft_delete(record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key))


def effect_of(command: OutboundCommand) -> RemoteEffect:
    return RemoteEffect.objects.get(command=command)


def dispatch_one(worker_id: str = "t", client=None) -> None:
    """Grant, send and settle exactly one effect (no finalization)."""
    assert effect_try_dispatch_one(worker_id=worker_id, client=client) is True


def push_link(record: Record, contract: str = HUBSPOT) -> RemoteLink:
    """The one push link of ``record`` for ``contract``'s account (found by slot owner, not by name)."""
    account = HUBSPOT_ACCOUNT if contract == HUBSPOT else BILLING_ACCOUNT
    return RemoteLink.objects.get(org_id=ORG, source_record_key=record.record_key, action_type="PushToConnector",
                                  remote_scope=account)


def evidence(link: RemoteLink) -> list[tuple[str, str, str, dict]]:
    """``(kind, from_state, to_state, detail)`` of every evidence row of ``link``, oldest first."""
    return [(e.kind, e.from_state, e.to_state, e.detail)
            for e in RemoteLinkEvidence.objects.filter(org_id=link.org_id, link=link).order_by("id")]


def frozen_facts(effect: RemoteEffect) -> tuple:
    """Everything an active attempt pinned: the binding, its digest and each Attempt's request bytes."""
    command = OutboundCommand.objects.get(pk=effect.command_id)
    attempts = [(a.attempt_number, a.operation, a.method, a.path, bytes(a.request_body), a.request_digest,
                 a.idempotency_key) for a in effect.attempts.order_by("attempt_number")]
    return command.frozen_binding, command.frozen_binding_digest, attempts


# --- active create attempts ----------------------------------------------------------------------------
def parked_create(env: PushEnv, record: Record) -> RemoteEffect:
    """A create the CRM performed whose response was lost: ``uncertain``, parked (the profile has no
    idempotency keys, so only an operator may move it on). One POST reached the provider."""
    posts = env.posts()
    command = save(record)
    env.hubspot.set_faults(drop_response_after_commit=1)
    dispatch_one()
    effect = effect_of(command)
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.RESPONSE_AMBIGUOUS)
    assert env.posts() == posts + 1
    return effect


def writeback_pending(env: PushEnv, record: Record, *, contract: str = HUBSPOT) -> RemoteEffect:
    """A create settled with its remote id and link, mirror writeback not yet done (``remote_confirmed``)."""
    command = save(record, contract=contract)
    dispatch_one()
    effect = effect_of(command)
    assert effect.state == "remote_confirmed" and RemoteLink.objects.filter(link_key=effect.link_key).exists()
    return effect


def drift_waits_for(env: PushEnv, effect: RemoteEffect, record: Record, successor: ServingEpoch | None = None, *,
                    later_origin: dict | None = None) -> RemoteEffect:
    """Seed 002 "Drift Matrix", "Active create attempt" column: what every row shares.

    With the parked create ``effect`` active: the successor serving the drift
    cannot be switched in beneath it (halt refused, successor stays
    ``verified``); a later save of the record makes no second POST and waits
    behind it; the attempt's binding and request never change; an operator
    confirmation (writeback-only recovery) links the slot under the frozen
    snapshot and the later save follows as the one PATCH; then the switch
    succeeds. Returns the later save's effect (finalized).
    """
    before = frozen_facts(effect)
    posts, patches = env.posts(), env.patches()
    if successor is not None:
        with pytest.raises(HaltRefused):
            halt_begin(org=env.org)
        assert set(AccountServingGate.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"v2_serving"}
        assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    later = save(record, origin=later_origin, lastname=f"Later-{next(_saves)}")
    zero_backoff()
    drain()
    later_effect = effect_of(later)
    assert (later_effect.state, later_effect.create_slot, later_effect.attempt_count) == ("prepared", None, 0)
    effect.refresh_from_db()
    assert (effect.state, effect.create_slot) == ("uncertain", effect.link_key)
    assert (env.posts(), env.patches()) == (posts, patches)
    assert frozen_facts(effect) == before
    remote = env.hubspot.contact_by_email(record.fields["email"])
    effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id=remote["id"], actor="ops",
                     note="found by its unique email")
    drain()
    effect.refresh_from_db()
    later_effect.refresh_from_db()
    assert (effect.state, later_effect.state) == ("finalized", "finalized")
    assert frozen_facts(effect) == before
    assert (env.posts(), env.patches(remote["id"])) == (posts, patches + 1)
    link = push_link(record)
    assert (link.link_key, link.remote_id, link.created_by_effect_id) == (effect.link_key, remote["id"], effect.pk)
    assert link.created_install_id == before[0]["action_config"]["install_id"]
    if successor is not None:
        switch_epoch(env, successor)
    return later_effect


def writeback_finishes_under_halt(env: PushEnv, effect: RemoteEffect, successor: ServingEpoch,
                                  account_key: str = HUBSPOT_ACCOUNT) -> None:
    """Writeback-only recovery continues while the drift waits: halting is allowed with the effect in
    flight, the successor cannot be staged until it finalizes (no provider call), then the switch succeeds."""
    requests = (env.hubspot.state()["requests"], env.billing.state()["requests"])
    before = frozen_facts(effect)
    halt_begin(org=env.org)
    assert halt_try_complete(org=env.org).gates[account_key] == ("halting_v2", reasons.HALT_WAITING_PREDECESSOR_WORK)
    with pytest.raises(HandoffRefused):
        handoff_stage(org=env.org, successor_id=successor.pk)
    assert effect_try_finalize_one()
    effect.refresh_from_db()
    assert effect.state == "finalized" and frozen_facts(effect) == before
    assert (env.hubspot.state()["requests"], env.billing.state()["requests"]) == requests
    assert halt_try_complete(org=env.org).all_halted
    handoff_stage(org=env.org, successor_id=successor.pk)
    successor_activate(org=env.org, successor_id=successor.pk)


# --- reconfiguration -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reconfigured:
    pack: PackGeneration
    epoch: ServingEpoch


def serving_pack(env: PushEnv, account_key: str = HUBSPOT_ACCOUNT) -> PackGeneration:
    """The pack generation the account's active epoch serves (the org's one active epoch)."""
    epoch = ServingEpoch.objects.get(org_id=env.org.org_id, state="active")
    account = next(a for a in epoch.document["accounts"] if a["account_key"] == account_key)
    return PackGeneration.objects.get(pk=account["pack_generation"]["id"])


def reconfigure(env: PushEnv, mutate: Callable[[dict], object] | None = None, *, account_key: str = HUBSPOT_ACCOUNT,
                configure: Callable[[dict], object] | None = None, switch: bool = True) -> Reconfigured:
    """Publish a modified copy of the account's serving pack and serve it through a successor epoch.

    Args:
        mutate: edits the copied pack document in place (it may rename
            ``pack_key``; ``owner_key`` and slot ids change only if it says so).
            The version is always bumped, so the pack installation changes.
        configure: edits the account's L2 entry in place (credentials, base_url).
        switch: also halt, hand off and activate the successor (:func:`switch_epoch`);
            otherwise the successor is left ``verified``.

    Returns:
        The new pack generation and the successor epoch.
    """
    document = copy.deepcopy(serving_pack(env, account_key).document)
    document["version"] = f"{document['version']}-r{next(_versions)}"
    if mutate is not None:
        mutate(document)
    generation, _created = pack_publish(document=document)
    account = next(a for a in env.document["accounts"] if a["account_key"] == account_key)
    account["pack"], account["pack_version"] = generation.pack_key, generation.version
    if configure is not None:
        configure(account)
    service_configuration_apply(org=env.org, document=env.document)
    successor = epoch_verify(org=env.org, epoch_id=epoch_prepare(org=env.org).pk)
    assert successor.state == "verified"
    if switch:
        switch_epoch(env, successor)
    return Reconfigured(generation, successor)


def switch_epoch(env: PushEnv, successor: ServingEpoch) -> None:
    """Halt every gate (drained), hand off and activate ``successor`` (seed 003 "Generation and replay")."""
    halt_begin(org=env.org)
    report = halt_try_complete(org=env.org)
    assert report.all_halted, report.gates
    handoff_stage(org=env.org, successor_id=successor.pk)
    successor_activate(org=env.org, successor_id=successor.pk)
    assert ServingEpoch.objects.get(pk=successor.pk).state == "active"


def publish_credential(env: PushEnv, *, credential_ref: str, version: str, env_name: str, monkeypatch,
                       account_key: str = HUBSPOT_ACCOUNT, secret: str | None = None) -> None:
    """Publish one more credential generation (same secret bytes unless ``secret``) for the account.

    The secret source is the environment variable ``env_name`` (set through ``monkeypatch``).
    """
    from tests.conftest import HUBSPOT_TOKEN

    monkeypatch.setenv(env_name, secret or HUBSPOT_TOKEN)
    credential_publish(org=env.org, document={"account_key": account_key, "credential_ref": credential_ref,
                                              "version": version, "secret": {"from_env": env_name},
                                              "transport": {"scheme": "bearer"}})


def contract_of(document: dict, contract_key: str = HUBSPOT) -> dict:
    return next(c for c in document["push_contracts"] if c["contract_key"] == contract_key)


def profile_of(document: dict, contract_key: str = HUBSPOT) -> dict:
    name = contract_of(document, contract_key)["callout_profile"]
    return next(p for p in document["callout_profiles"] if p["profile_key"] == name)


__all__ = [
    "BILLING", "BILLING_ACCOUNT", "HUBSPOT", "HUBSPOT_ACCOUNT", "ORIGIN", "POSTS", "PushEnv", "Reconfigured",
    "contact", "contract_of", "delete", "dispatch_one", "drift_waits_for", "effect_of", "evidence",
    "frozen_facts", "parked_create", "profile_of", "publish_credential", "push_env", "push_link", "reconfigure",
    "save", "serving_pack", "switch_epoch", "writeback_finishes_under_halt", "writeback_pending", "zero_backoff",
]
