"""Operator decisions on RemoteLinks: revalidate, retire, rebind (seed 002 "Remote Link State", "Drift Matrix").

A suspended link waits for an explicit decision; nothing here calls a
provider, writes a record or rebuilds an attempt:

- :func:`link_revalidate`: the operator validated that the link's remote
  record is the destination the slot's *current* action config names; the
  link's snapshot and LastValidatedPackInstallId move to the current config and
  a ``suspended_drift`` link returns to ``active`` (``finalized``). The mapping
  and body fingerprints do not move here: only a revalidation receipt moves
  them (:mod:`connectors.links.mapping_revalidation`, seed 002 CARVE_DOWN);
- :func:`link_retire`: ``active | suspended_drift -> retired``; the remote
  locator is released and the slot is resolved lineage, never sent again;
- :func:`link_rebind`: the slot was removed and recreated with new stable ids
  (key-changing drift): the old link retires and a new link under the new
  slot's link key takes the same remote id, in one transaction.

Each appends a RemoteLinkEvidence row naming the actor and reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import transaction

from connectors.links.link_keys import PUSH_ACTION_TYPE, link_key_for, serving_remote_scope
from connectors.links.push_rules import (
    action_config_snapshot,
    append_link_evidence,
    body_fingerprint,
    mapping_fingerprint,
)
from connectors.models import AccountServingGate, PackGeneration, RemoteEffect, RemoteLink, RemoteLinkEvidence
from connectors.serving.gates import NotServing, serving_lock
from connectors.store import RemoteEffectStore, RemoteLinkStore
from nexusflow.kernel import failpoints
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key

#: Effect states that occupy a link key's slot: a rebind onto it is refused while one exists.
_OCCUPYING = ("dispatching", "uncertain", "remote_confirmed")

FP_AFTER_EFFECT_LOCKS = failpoints.declare("push_links.after_effect_locks")
FP_REBIND_BEFORE_COMMIT = failpoints.declare("push_links.rebind_before_commit")


class LinkOperationRefused(NexusError):
    code = "link_operation_refused"


@dataclass(frozen=True)
class LinkChange:
    link_id: int
    link_key: str
    from_state: str
    to_state: str
    evidence_id: int
    new_link_id: int | None = None
    new_link_key: str | None = None


#: Longest evidence reason (characters); the actor is bounded by the evidence column (120).
MAX_REASON_LENGTH = 1000


def _require_words(actor: str, reason: str) -> None:
    """Check the decision's evidence text before any lock or write.

    Raises:
        LinkOperationRefused: an empty actor or reason (``link_evidence_missing``);
            an actor or (stripped) reason that is not canonical text (control or
            invisible characters, invalid UTF-8, not NFC, surrounding whitespace
            in the actor) or too long for its column (``link_evidence_invalid``).
    """
    if not actor.strip() or not reason.strip():
        raise LinkOperationRefused("a link decision needs --actor and --reason", code="link_evidence_missing")
    try:
        validate_key(actor, field="actor", max_length=RemoteLinkEvidence._meta.get_field("actor").max_length)
        validate_key(reason.strip(), field="reason", max_length=MAX_REASON_LENGTH)
    except InvalidIdentity as exc:
        raise LinkOperationRefused(str(exc), code="link_evidence_invalid") from None


def _refuse_if_occupied(org_id: str, link_keys: list[str]) -> None:
    """Refuse while an effect of ``link_keys`` is in flight, read once the link row is locked.

    The effect locks taken first cover only the effects that existed then; an
    effect delivered afterwards is granted with the link row locked (see
    :func:`connectors.outbound.permit_grant._plan_request`), so once this transaction holds
    the link, any such grant has committed and this read (READ COMMITTED)
    sees it.

    Raises:
        LinkOperationRefused: ``slot_occupied``.
    """
    effect = (RemoteEffect.objects.filter(org_id=org_id, link_key__in=link_keys, state__in=_OCCUPYING)
              .order_by("id").first())
    if effect is not None:
        raise LinkOperationRefused(f"effect {effect.pk} of this slot is {effect.state}", code="slot_occupied")


def _link(org_id: str, link_key: str) -> RemoteLink:
    link = RemoteLink.objects.filter(org_id=org_id, link_key=link_key).first()
    if link is None:
        raise LinkOperationRefused(f"no remote link {link_key} in org {org_id}", code="link_unknown")
    if link.action_type != PUSH_ACTION_TYPE:
        raise LinkOperationRefused(f"link {link_key} is an inbound link; only push links are decided here",
                                   code="link_not_push")
    return link


def serving_slot_config(*, org_id: str, owner_key: str, action_slot_id: str, destination_slot_id: str,
                        source_object: str) -> tuple[dict, dict, str]:
    """The serving push contract of one stable slot: ``(contract, action_config_snapshot, account_key)``.

    Raises:
        LinkOperationRefused: no serving account offers that slot
            (``slot_not_served``) or several do (``slot_ambiguous``).
    """
    found = []
    for gate in AccountServingGate.objects.filter(org_id=org_id, state="v2_serving").select_related("epoch"):
        account = next((a for a in gate.epoch.document["accounts"] if a["account_key"] == gate.account_key), None)
        if not account or not account.get("push_contracts"):
            continue
        pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
        if pack.owner_key != owner_key:
            continue
        for contract in pack.document.get("push_contracts", []):
            if (contract["contract_key"] in account["push_contracts"]
                    and contract.get("action_slot_id") == action_slot_id
                    and contract.get("destination_slot_id") == destination_slot_id
                    and contract["source_object"] == source_object):
                profile = next(p for p in pack.document["callout_profiles"]
                               if p["profile_key"] == contract["callout_profile"])
                found.append((contract, action_config_snapshot(pack=pack, contract=contract, profile=profile,
                                                               account=account), gate.account_key))
    if not found:
        raise LinkOperationRefused(f"no serving account offers slot {owner_key}/{action_slot_id}/"
                                   f"{destination_slot_id}", code="slot_not_served")
    if len(found) > 1:
        raise LinkOperationRefused("several serving accounts offer that slot", code="slot_ambiguous")
    return found[0]


def link_revalidate(*, org_id: str, link_key: str, actor: str, reason: str) -> LinkChange:
    """Validate a link against its slot's current action config and return it to service.

    Raises:
        LinkOperationRefused: unknown or inbound link, retired link
            (``link_retired``), slot no longer served (``slot_not_served``:
            rebind or retire instead), the slot served by another account than
            the link's remote scope (``revalidate_scope_mismatch``: the remote id
            belongs to the old account's provider tenant), or missing or
            malformed actor/reason (``link_evidence_missing``, ``link_evidence_invalid``).
    """
    _require_words(actor, reason)
    link = _link(org_id, link_key)
    _contract_doc, current, account_key = serving_slot_config(
        org_id=org_id, owner_key=link.owner_key, action_slot_id=link.action_slot_id,
        destination_slot_id=link.destination_slot_id, source_object=link.source_object)
    if serving_remote_scope(org_id=org_id, account_key=account_key) != link.remote_scope:
        raise LinkOperationRefused(f"the slot is served by account {account_key}; the link's remote id belongs to "
                                   f"{link.remote_scope}", code="revalidate_scope_mismatch")
    with transaction.atomic(durable=True):
        link = RemoteLinkStore.lock(org_id, link.pk)
        if link.state == "retired":
            raise LinkOperationRefused(f"link {link_key} is retired", code="link_retired")
        snapshot = {**current, "mirror_tuple": link.snapshot.get("mirror_tuple", current["mirror_tuple"])}
        evidence = append_link_evidence(link, kind="revalidated", actor=actor, to_state="active",
                                        detail={"reason": reason.strip(), "install_id": current["install_id"],
                                                "previous_reason_code": link.reason_code})
        fields = {"snapshot": json.dumps(snapshot), "last_validated_install_id": current["install_id"]}
        if link.state == "suspended_drift":
            RemoteLinkStore.transition(org_id=org_id, pk=link.pk, src="suspended_drift", dst="active",
                                       version=link.version, set_fields=fields)
        else:
            RemoteLinkStore.touch(org_id=org_id, pk=link.pk, state="active", version=link.version, set_fields=fields)
        return LinkChange(int(link.pk), link_key, link.state, "active", int(evidence.pk))


def link_retire(*, org_id: str, link_key: str, actor: str, reason: str) -> LinkChange:
    """End a link for good: it is never sent again and its remote locator is released.

    Raises:
        LinkOperationRefused: unknown or inbound link, already retired
            (``link_retired``), an effect of the slot in flight
            (``slot_occupied``), or missing or malformed actor/reason
            (``link_evidence_missing``, ``link_evidence_invalid``).
    """
    _require_words(actor, reason)
    link = _link(org_id, link_key)
    with transaction.atomic(durable=True):
        occupied = [e for e in RemoteEffectStore.lock_all(org_id, link_key=link_key) if e.state in _OCCUPYING]
        if occupied:
            raise LinkOperationRefused(f"effect {occupied[0].pk} of this slot is {occupied[0].state}",
                                       code="slot_occupied")
        failpoints.hit(FP_AFTER_EFFECT_LOCKS)
        link = RemoteLinkStore.lock(org_id, link.pk)
        _refuse_if_occupied(org_id, [link_key])
        if link.state == "retired":
            raise LinkOperationRefused(f"link {link_key} is already retired", code="link_retired")
        evidence = append_link_evidence(link, kind="retired", actor=actor, to_state="retired",
                                        detail={"reason": reason.strip(), "remote_id": link.remote_id})
        RemoteLinkStore.transition(org_id=org_id, pk=link.pk, src=link.state, dst="retired", version=link.version,
                                   set_fields={"live_remote_id": None})
        return LinkChange(int(link.pk), link_key, link.state, "retired", int(evidence.pk))


def link_rebind(*, org_id: str, link_key: str, contract_key: str, actor: str, reason: str) -> LinkChange:
    """Move a link's remote id to the slot that replaced its removed one (explicit rebind, seed 002 DM-03/05/20).

    The old link retires (locator released) and a new active link under the
    new slot's link key (same source record) takes the same remote id, with
    the current action config as its snapshot and fingerprints, in one
    transaction. Effects of the new link key that already hold the slot
    (dispatching, uncertain, remote_confirmed) refuse the rebind; effects
    refused before POST stay terminal (a later save PATCHes through the new link).

    The transaction first locks the serving gate (and epoch) of the account
    serving ``contract_key``: every grant of the new key's effects locks that
    gate first, and finds no link to lock, so without it a create could be
    granted for the key between the checks here and the new link's commit.

    Raises:
        LinkOperationRefused: unknown/inbound/retired link, ``contract_key`` not
            served (``slot_not_served``), served by another account than the
            link's remote scope (``rebind_scope_mismatch``: the remote id means
            nothing there), the same slot (``rebind_same_slot``:
            revalidate instead), the new key already linked
            (``rebind_target_linked``), ``slot_occupied``, or missing or malformed
            actor/reason (``link_evidence_missing``, ``link_evidence_invalid``).
    """
    _require_words(actor, reason)
    link = _link(org_id, link_key)
    if link.state == "retired":
        raise LinkOperationRefused(f"link {link_key} is retired", code="link_retired")
    contract, current, account_key = _served_contract(org_id, contract_key)
    if contract["source_object"] != link.source_object:
        raise LinkOperationRefused(f"contract {contract_key} pushes {contract['source_object']}, the link's source "
                                   f"is {link.source_object}", code="rebind_object_mismatch")
    scope = serving_remote_scope(org_id=org_id, account_key=account_key)
    if scope != link.remote_scope:
        # The remote id names a record of the link's remote system only (the remote-locator scope).
        raise LinkOperationRefused(f"contract {contract_key} is served by account {account_key}; the link's remote "
                                   f"id belongs to {link.remote_scope}", code="rebind_scope_mismatch")
    new_key = link_key_for(owner_key=current["owner_key"], action_slot_id=contract["action_slot_id"],
                           action_type=PUSH_ACTION_TYPE, source_object=link.source_object,
                           source_record_key=link.source_record_key,
                           destination_slot_id=contract["destination_slot_id"])
    if new_key == link_key:
        raise LinkOperationRefused("the contract serves the link's own slot; revalidate it instead",
                                   code="rebind_same_slot")
    with transaction.atomic(durable=True):
        try:
            serving_lock(org_id=org_id, account_key=account_key)
        except NotServing as exc:
            raise LinkOperationRefused(str(exc), code="slot_not_served") from None
        if _served_contract(org_id, contract_key)[1] != current:  # re-read under the gate lock
            raise LinkOperationRefused(f"push contract {contract_key} changed while the rebind started",
                                       code="slot_not_served")
        effects = RemoteEffectStore.lock_all(org_id, link_key__in=[link_key, new_key])
        occupied = [e for e in effects if e.state in _OCCUPYING]
        if occupied:
            raise LinkOperationRefused(f"effect {occupied[0].pk} of this slot is {occupied[0].state}",
                                       code="slot_occupied")
        failpoints.hit(FP_AFTER_EFFECT_LOCKS)
        link = RemoteLinkStore.lock(org_id, link.pk)
        _refuse_if_occupied(org_id, [link_key, new_key])
        if link.state == "retired":
            raise LinkOperationRefused(f"link {link_key} is retired", code="link_retired")
        if RemoteLink.objects.filter(org_id=org_id, link_key=new_key).exists():
            raise LinkOperationRefused(f"slot {new_key} already has a link", code="rebind_target_linked")
        detail = {"reason": reason.strip(), "remote_id": link.remote_id, "to_link_key": new_key,
                  "to_contract": contract_key, "to_install_id": current["install_id"]}
        evidence = append_link_evidence(link, kind="rebound", actor=actor, to_state="retired", detail=detail)
        RemoteLinkStore.transition(org_id=org_id, pk=link.pk, src=link.state, dst="retired", version=link.version,
                                   set_fields={"live_remote_id": None})
        snapshot = {**current, "mirror_tuple": link.snapshot.get("mirror_tuple", current["mirror_tuple"])}
        new = RemoteLinkStore.create(
            org_id=org_id, link_key=new_key, owner_key=current["owner_key"], action_slot_id=contract["action_slot_id"],
            action_type=PUSH_ACTION_TYPE, destination_slot_id=contract["destination_slot_id"],
            source_object=link.source_object, source_record_key=link.source_record_key,
            remote_scope=scope,
            remote_id=link.remote_id, live_remote_id=link.remote_id, state="active", snapshot=snapshot,
            created_by_effect_id=link.created_by_effect_id, created_install_id=current["install_id"],
            last_validated_install_id=current["install_id"], mapping_fingerprint=mapping_fingerprint(contract),
            body_fingerprint=body_fingerprint(contract), last_pushed_version=link.last_pushed_version,
            mirror_status=link.mirror_status)
        append_link_evidence(new, kind="rebound", actor=actor, to_state="active",
                             detail={**detail, "from_link_key": link_key})
        failpoints.hit(FP_REBIND_BEFORE_COMMIT)
        return LinkChange(int(link.pk), link_key, link.state, "retired", int(evidence.pk), int(new.pk), new_key)


def link_adopt(*, org_id: str, contract_key: str, record_key: str, remote_id: str, actor: str,
               reason: str) -> LinkChange:
    """Bind a record's slot to a remote id an operator proved (the V1 link adoption's operator path).

    For a record the V1 link adoption refused at ``cutover certify`` (seed 002 "Migration Contract For
    #1783": the legacy mirror and provenance proved no one link), an operator who established the remote
    record creates the link explicitly: an ``active`` RemoteLink of the contract's link key with the current
    action config as its snapshot, evidence ``adopted`` with actor, reason and remote id. The create refused
    before POST (``legacy_remote_id_unlinked``) stays terminal; a later save PATCHes through the link. Same
    serialization as :func:`link_rebind` (the serving gate, then the key's effects).

    Raises:
        LinkOperationRefused: ``contract_key`` not served (``slot_not_served``), no live record of its source
            object (``adopt_record_unknown``), the key already linked (``adopt_target_linked``), another link
            of the destination holds ``remote_id`` (``remote_locator_claimed``), ``slot_occupied``, or
            missing or malformed actor/reason (``link_evidence_missing``, ``link_evidence_invalid``).
        InvalidIdentity: ``record_key`` or ``remote_id`` is not a canonical key (before any lock).
    """
    from django.db import IntegrityError

    from nexusflow.records.models import Record

    _require_words(actor, reason)
    record_key = validate_key(record_key, field="record", max_length=64)
    remote_id = validate_key(remote_id, field="remote_id", max_length=160)
    contract, current, account_key = _served_contract(org_id, contract_key)
    if not Record.objects.filter(org_id=org_id, object_name=contract["source_object"], record_key=record_key,
                                 is_deleted=False).exists():
        raise LinkOperationRefused(f"no live {contract['source_object']} record {record_key}",
                                   code="adopt_record_unknown")
    scope = serving_remote_scope(org_id=org_id, account_key=account_key)
    key = link_key_for(owner_key=current["owner_key"], action_slot_id=contract["action_slot_id"],
                       action_type=PUSH_ACTION_TYPE, source_object=contract["source_object"],
                       source_record_key=record_key, destination_slot_id=contract["destination_slot_id"])
    with transaction.atomic(durable=True):
        try:
            serving_lock(org_id=org_id, account_key=account_key)
        except NotServing as exc:
            raise LinkOperationRefused(str(exc), code="slot_not_served") from None
        occupied = [e for e in RemoteEffectStore.lock_all(org_id, link_key=key) if e.state in _OCCUPYING]
        if occupied:
            raise LinkOperationRefused(f"effect {occupied[0].pk} of this slot is {occupied[0].state}",
                                       code="slot_occupied")
        if RemoteLink.objects.filter(org_id=org_id, link_key=key).exists():
            raise LinkOperationRefused(f"slot {key} already has a link", code="adopt_target_linked")
        try:
            with transaction.atomic():
                link = RemoteLinkStore.create(
                    org_id=org_id, link_key=key, owner_key=current["owner_key"],
                    action_slot_id=contract["action_slot_id"], action_type=PUSH_ACTION_TYPE,
                    destination_slot_id=contract["destination_slot_id"], source_object=contract["source_object"],
                    source_record_key=record_key, remote_scope=scope, remote_id=remote_id, live_remote_id=remote_id,
                    state="active", snapshot=current, created_install_id=current["install_id"],
                    last_validated_install_id=current["install_id"], mapping_fingerprint=mapping_fingerprint(contract),
                    body_fingerprint=body_fingerprint(contract))
        except IntegrityError:
            raise LinkOperationRefused(f"another link of this destination holds remote id {remote_id}",
                                       code="remote_locator_claimed") from None
        evidence = append_link_evidence(link, kind="adopted", actor=actor, to_state="active",
                                        detail={"reason": reason.strip(), "remote_id": remote_id,
                                                "contract": contract_key, "record": record_key})
        return LinkChange(int(link.pk), key, "none", "active", int(evidence.pk))


def _served_contract(org_id: str, contract_key: str) -> tuple[dict, dict, str]:
    for gate in AccountServingGate.objects.filter(org_id=org_id, state="v2_serving").select_related("epoch"):
        account = next((a for a in gate.epoch.document["accounts"] if a["account_key"] == gate.account_key), None)
        if not account or contract_key not in account.get("push_contracts", []):
            continue
        pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
        contract = next(c for c in pack.document["push_contracts"] if c["contract_key"] == contract_key)
        profile = next(p for p in pack.document["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
        return contract, action_config_snapshot(pack=pack, contract=contract, profile=profile,
                                                account=account), gate.account_key
    raise LinkOperationRefused(f"no serving account offers push contract {contract_key}", code="slot_not_served")


def effects_of_link(org_id: str, link_key: str) -> list[RemoteEffect]:
    """The link key's effects, oldest first (for ``push_links show``)."""
    return list(RemoteEffect.objects.filter(org_id=org_id, link_key=link_key).order_by("id"))
