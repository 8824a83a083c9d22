"""Remote links through an identity transfer (seed 000 "Transfer", on seed 002's identity model).

The records app runs the transfer (:mod:`nexusflow.records.transfer`: one
durable transaction, the lock order, the owner work check, the fact) and
asks this module for everything about RemoteLink rows through its port
(:mod:`nexusflow.records.remote_links`, registered in ``ConnectorsConfig.ready``):

- :func:`links_lock` locks every link of both records, ascending id (class 2
  of the transfer's lock order, after the record rows);
- :func:`links_plan` decides each move and every conflict, writing nothing;
- :func:`links_apply` retires each active source link (evidence
  ``transferred``) and creates the target's link with the same remote id
  under the target's own link key for the same destination slot (the key
  egress computes for the target's contract), so the provider keeps one
  record and no remote call is made; inbound links move the same way;
- :func:`links_validate_replay` checks a completed transfer's target
  authority owner by owner.

The port's ``describe`` (a record's links for support views) is
:func:`connectors.links.link_keys.record_links_describe`.

Different owners' links coexist on the target; one owner's links with the
same remote id (its exact V1/V2 links) coexist too.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q

from connectors.links.link_keys import PUSH_ACTION_TYPE, link_key_for
from connectors.links.push_rules import (
    action_config_snapshot,
    append_link_evidence,
    body_fingerprint,
    mapping_fingerprint,
)
from connectors.models import PackGeneration, RemoteLink
from connectors.store import RemoteLinkStore
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import ObjectDefinition, current_view
from nexusflow.records.models import IdentityTransfer, Record
from nexusflow.records.transfer import (
    TransferAuthorityInactive,
    TransferIdentityConflict,
    TransferMirrorMismatch,
    TransferTargetSlotMissing,
)

#: Evidence kind of a link retired or created by a transfer.
EVIDENCE_KIND = "transferred"


def links_lock(*, org_id: str, owners: Iterable[tuple[str, str]]) -> list[RemoteLink]:
    """Lock every RemoteLink row of the given ``(object, record key)`` pairs, ascending id.

    Runs in the transfer's transaction after both record rows are locked
    (ARCHITECTURE.md section 6, "Lock order").
    """
    match = Q(pk__in=[])
    for object_name, record_key in owners:
        match |= Q(source_object=object_name, source_record_key=record_key)
    ids = list(RemoteLink.objects.filter(match, org_id=org_id).values_list("pk", flat=True))
    if not ids:
        return []
    return RemoteLinkStore.lock_all(org_id, pk__in=[int(i) for i in ids])


def _mirror_field(definition: ObjectDefinition, contract: dict) -> str:
    """The target object's mirror field for ``contract`` (the contract's own, else the metadata's), or ``""``."""
    if contract.get("mirror_field") and contract["mirror_field"] in definition.mirror_fields:
        return contract["mirror_field"]
    return next((m.name for m in definition.mirror_fields.values() if m.push_contract == contract["contract_key"]),
                "")


def _target_push_slot(link: RemoteLink, target_object: str) -> tuple[dict, dict]:
    """``(contract, snapshot)`` of the target object's push slot for ``link``'s owner and destination slot.

    The contract comes from the pack generation the link was validated
    under; the snapshot is the seed 002 action-config snapshot of that
    contract under the same installation, endpoint and credential generation.

    Raises:
        TransferTargetSlotMissing: no such contract.
    """
    snapshot = link.snapshot or {}
    generation = (snapshot.get("pack_generation") or {}).get("id")
    pack = PackGeneration.objects.filter(pk=generation).first() if generation else None
    if pack is None or pack.owner_key != link.owner_key:
        raise TransferTargetSlotMissing(f"link {link.link_key}: its pack generation is unknown")
    contracts = [c for c in pack.document.get("push_contracts", [])
                 if c.get("destination_slot_id") == link.destination_slot_id and c["source_object"] == target_object]
    if len(contracts) != 1:
        raise TransferTargetSlotMissing(f"owner {link.owner_key} has {len(contracts)} push contracts of "
                                        f"{target_object} on destination slot {link.destination_slot_id}")
    contract = contracts[0]
    if contract["source_object"] == link.source_object and contract.get("action_slot_id") == link.action_slot_id:
        return contract, dict(snapshot)  # same slot (merge): the validated snapshot moves as it is
    profile = next(p for p in pack.document["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
    credential_ref = snapshot.get("credential_ref", "")
    account = {"base_url": (snapshot.get("endpoint") or {}).get("base_url", ""),
               "credentials": {credential_ref: snapshot.get("credential_generation")} if credential_ref else {}}
    new = action_config_snapshot(pack=pack, contract=contract, profile=profile, account=account,
                                 origin=snapshot.get("flow"))
    new["install_id"] = snapshot.get("install_id", new["install_id"])
    return contract, new


@dataclass
class LinkMove:
    """One planned move of an active source link onto the target (a records ``TransferMove``)."""

    link: RemoteLink
    new_key: str
    action_slot_id: str
    snapshot: dict
    mapping_fingerprint: str
    body_fingerprint: str
    mirror_field: str

    @property
    def remote_id(self) -> str:
        return self.link.remote_id

    def as_fact(self, target_object: str) -> dict:
        link = self.link
        return {"owner_key": link.owner_key, "destination_slot_id": link.destination_slot_id,
                "remote_scope": link.remote_scope, "remote_id": link.remote_id, "action_type": link.action_type,
                "from_link_key": link.link_key, "from_action_slot_id": link.action_slot_id,
                "to_link_key": self.new_key, "to_action_slot_id": self.action_slot_id,
                "target_object": target_object, "mirror_field": self.mirror_field}


def links_plan(*, org: OrgScope, source: Record, target: Record | None, target_object: str, target_key: str,
               links: list[RemoteLink]) -> list[LinkMove]:
    """Decide every link move of a transfer and check every conflict; writes nothing.

    Args:
        source / target: the locked records (``target`` ``None``: a conversion's new record).
        target_object / target_key: the target's identity (a new key for a new record).
        links: :func:`links_lock`'s rows of both records.

    Raises:
        TransferAuthorityInactive, TransferIdentityConflict, TransferMirrorMismatch,
        TransferTargetSlotMissing.
    """
    definition = current_view().object(target_object)
    source_links = [lk for lk in links if (lk.source_object, lk.source_record_key) == (source.object_name,
                                                                                      source.record_key)]
    target_links = [lk for lk in links if (lk.source_object, lk.source_record_key) == (target_object, target_key)]
    active = [lk for lk in source_links if lk.state == "active"]
    for link in source_links:
        if link.state == "suspended_drift":
            raise TransferAuthorityInactive(f"source link {link.link_key} ({link.owner_key}) is suspended "
                                            f"({link.reason_code}); revalidate or retire it first")
        if link.state == "retired" and not any(
                (a.owner_key, a.destination_slot_id, a.remote_scope) ==
                (link.owner_key, link.destination_slot_id, link.remote_scope) for a in active):
            raise TransferAuthorityInactive(f"source link {link.link_key} ({link.owner_key}) is retired and no "
                                            f"active link of its slot replaced it")
    # One remote identity per owner and destination slot across both records (non-retired links).
    held: dict[tuple[str, str], set[str]] = {}
    for link in active + [lk for lk in target_links if lk.state != "retired"]:
        held.setdefault((link.owner_key, link.destination_slot_id), set()).add(link.remote_id)
    for (owner, destination), remote_ids in sorted(held.items()):
        if len(remote_ids) > 1:
            raise TransferIdentityConflict(f"owner {owner} destination {destination}: the records hold different "
                                           f"remote ids {sorted(remote_ids)}")
    taken = {lk.link_key for lk in target_links}
    moves: list[LinkMove] = []
    for link in active:
        if link.action_type == PUSH_ACTION_TYPE:
            contract, snapshot = _target_push_slot(link, target_object)
            action_slot_id = contract["action_slot_id"]
            fingerprints = (mapping_fingerprint(contract), body_fingerprint(contract))
            if action_slot_id == link.action_slot_id and contract["source_object"] == link.source_object:
                fingerprints = (link.mapping_fingerprint, link.body_fingerprint)
            mirror = _mirror_field(definition, contract)
        else:
            action_slot_id, snapshot, fingerprints, mirror = link.action_slot_id, dict(link.snapshot), ("", ""), ""
        new_key = link_key_for(owner_key=link.owner_key, action_slot_id=action_slot_id,
                               action_type=link.action_type, source_object=target_object,
                               source_record_key=target_key, destination_slot_id=link.destination_slot_id)
        if new_key in taken:
            raise TransferIdentityConflict(f"the target's slot {new_key} ({link.owner_key}) already has a link")
        taken.add(new_key)
        if mirror and target is not None and target.mirrors.get(mirror) not in (None, "", link.remote_id):
            raise TransferMirrorMismatch(f"{target_object}/{target_key}.{mirror} mirrors "
                                         f"{target.mirrors.get(mirror)!r}, the link holds {link.remote_id!r}")
        moves.append(LinkMove(link, new_key, action_slot_id, snapshot, *fingerprints, mirror))
    return moves


def links_apply(*, org: OrgScope, moves: Iterable[LinkMove], transfer_id: str, actor: str, target_object: str,
                target_key: str) -> None:
    """Write every planned move in the caller's transaction: retire the source link, create the target's.

    Both links get a ``transferred`` evidence row naming the transfer.
    """
    for move in moves:
        _move_link(org, move, transfer_id=transfer_id, actor=actor, target_object=target_object,
                   target_key=target_key)


def _move_link(org: OrgScope, move: LinkMove, *, transfer_id: str, actor: str, target_object: str,
               target_key: str) -> None:
    link = move.link
    detail = {"transfer_id": transfer_id, "remote_id": link.remote_id, "from_link_key": link.link_key,
              "to_link_key": move.new_key, "to_record": f"{target_object}/{target_key}"}
    append_link_evidence(link, kind=EVIDENCE_KIND, actor=actor, to_state="retired", detail=detail)
    RemoteLinkStore.transition(org_id=org.org_id, pk=link.pk, src="active", dst="retired", version=link.version,
                               set_fields={"live_remote_id": None})
    snapshot = dict(move.snapshot)
    if link.action_type == PUSH_ACTION_TYPE:
        snapshot["source_object"] = target_object
    new = RemoteLinkStore.create(
        org_id=org.org_id, link_key=move.new_key, owner_key=link.owner_key, action_slot_id=move.action_slot_id,
        action_type=link.action_type, destination_slot_id=link.destination_slot_id, source_object=target_object,
        source_record_key=target_key, remote_scope=link.remote_scope, remote_id=link.remote_id,
        live_remote_id=link.remote_id, state="active", snapshot=snapshot,
        created_by_effect_id=link.created_by_effect_id, created_install_id=snapshot.get("install_id", ""),
        last_validated_install_id=snapshot.get("install_id", "") if link.action_type == PUSH_ACTION_TYPE else "",
        mapping_fingerprint=move.mapping_fingerprint, body_fingerprint=move.body_fingerprint,
        mirror_status="written" if move.mirror_field else "")
    append_link_evidence(new, kind=EVIDENCE_KIND, actor=actor, to_state="active", detail=detail)


def links_validate_replay(*, org: OrgScope, stored: IdentityTransfer, target: Record) -> None:
    """Validate a completed transfer's target authority, owner by owner; write nothing.

    Args:
        stored: the transfer fact.
        target: its live target record.

    Raises:
        TransferIdentityConflict / TransferAuthorityInactive / TransferMirrorMismatch.
    """
    links = list(RemoteLink.objects.filter(org_id=org.org_id, source_object=stored.target_object,
                                           source_record_key=stored.target_record_key).order_by("id"))
    by_owner: dict[str, list[dict]] = {}
    for move in stored.moves:
        by_owner.setdefault(move["owner_key"], []).append(move)
    for owner in sorted(by_owner):
        owner_links = [lk for lk in links if lk.owner_key == owner]
        for move in by_owner[owner]:
            others = {lk.remote_id for lk in owner_links if lk.state != "retired"
                      and lk.destination_slot_id == move["destination_slot_id"]} - {move["remote_id"]}
            if others:
                raise TransferIdentityConflict(f"owner {owner}: the target now holds remote ids {sorted(others)} "
                                               f"beside the transferred {move['remote_id']!r}")
            link = next((lk for lk in owner_links if lk.link_key == move["to_link_key"]), None)
            if link is None or link.state != "active":
                raise TransferAuthorityInactive(f"owner {owner}: the transferred link {move['to_link_key']} is "
                                                f"{'missing' if link is None else link.state}")
            if link.remote_id != move["remote_id"]:
                raise TransferIdentityConflict(f"owner {owner}: link {link.link_key} holds {link.remote_id!r}, "
                                               f"the transfer moved {move['remote_id']!r}")
            field = move.get("mirror_field")
            if field and target.mirrors.get(field) != move["remote_id"]:
                raise TransferMirrorMismatch(f"{stored.target_object}/{stored.target_record_key}.{field} mirrors "
                                             f"{target.mirrors.get(field)!r}, the link holds {move['remote_id']!r}")

