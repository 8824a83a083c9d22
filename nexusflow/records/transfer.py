"""Identity transfer: merge two records of one object, or convert a record into another object.

Seed 000, "Transfer" (Runtime outbound owner protection) on seed 002's
identity model (``link_key`` over stable slot ids + source record).

One durable, immutable :class:`~nexusflow.records.models.IdentityTransfer`
fact per caller-supplied ``transfer_id``. One transaction, in the one lock
order (ARCHITECTURE.md section 6):

1. the source and the target record rows (owner fences), in canonical
   ``(object, record key)`` byte order;
2. every RemoteLink row of both records (ascending id);
3. the Runtime intents of source and target, ``FOR UPDATE NOWAIT``
   (:func:`runtime_outbox.owner.owner_work_check`): unfinished work is a
   retryable :class:`OwnerWorkPending`, a committing result a retryable
   :class:`OwnerContended`. Nothing changes before both checks passed.

Then remote authority moves, per connector owner (``RemoteLink.owner_key``):
each active source link retires (evidence ``transferred``) and the target
gets a link with the same remote id under the target's own link key for the
same destination slot (the key egress computes for the target's contract), so
the provider keeps one record and no remote call is made. Inbound links move
the same way, so later webhooks about that remote id apply to the target. The
target's mirror field for the contract takes the remote id and the source is
soft-deleted. Different owners' links coexist on the target; one owner's
links with the same remote id (its exact V1/V2 links) coexist too.

Conflicts fail closed before any write: ``transfer_identity_conflict`` (the
target holds another remote id for that owner and destination slot),
``transfer_authority_inactive`` (a source link is suspended, or retired with
no active successor), ``transfer_mirror_mismatch`` (the target's mirror
disagrees with the link). A completed transfer replays: the same id and
inputs validate the recorded target authority owner by owner and return the
stored result without writing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from django.db import IntegrityError, transaction
from django.db.models import Q

from connectors.links import PUSH_ACTION_TYPE, link_key_for
from connectors.models import PackGeneration, RemoteLink
from connectors.pushlinks import action_config_snapshot, append_link_evidence, body_fingerprint, mapping_fingerprint
from connectors.store import RemoteLinkStore
from nexusflow.kernel import failpoints
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.owner import OwnerContended, OwnerWorkPending, owner_work_check

from .metadata import ObjectDefinition, current_view
from .models import IdentityTransfer, Record
from .services import new_record_key, record_write_mirror
from .store import RecordStore

__all__ = [
    "OwnerContended", "OwnerWorkPending", "TransferError", "TransferResult", "record_convert", "record_merge",
    "transfer_get",
]

MERGE, CONVERT = "merge", "convert"
#: Evidence kind of a link retired or created by a transfer.
EVIDENCE_KIND = "transferred"

#: Crash point after every write of a transfer, before its commit (rollback tests).
FP_BEFORE_COMMIT = failpoints.declare("records.transfer.before_commit")


class TransferError(NexusError):
    """A transfer refused for good with these inputs; ``http_status`` is its REST status."""

    code = "transfer_refused"
    http_status = 409


class TransferInvalid(TransferError):
    code = "transfer_invalid"
    http_status = 400


class TransferConversionUndeclared(TransferError):
    code = "transfer_conversion_undeclared"
    http_status = 400


class TransferRecordNotFound(TransferError):
    code = "transfer_record_not_found"
    http_status = 404


class TransferMismatch(TransferError):
    """The transfer id exists with other inputs."""

    code = "transfer_mismatch"


class TransferIdentityConflict(TransferError):
    code = "transfer_identity_conflict"


class TransferAuthorityInactive(TransferError):
    code = "transfer_authority_inactive"


class TransferMirrorMismatch(TransferError):
    code = "transfer_mirror_mismatch"


class TransferTargetSlotMissing(TransferError):
    """The owner's pack has no push contract of the target object on the link's destination slot."""

    code = "transfer_target_slot_missing"


@dataclass(frozen=True)
class TransferResult:
    """The stored result of one transfer; ``created`` is ``False`` for a replay."""

    transfer_id: str
    kind: str
    source_object: str
    source_record_key: str
    target_object: str
    target_record_key: str
    target_created: bool
    moves: tuple[dict, ...]
    created: bool

    def as_dict(self) -> dict:
        return {"transfer_id": self.transfer_id, "kind": self.kind, "source_object": self.source_object,
                "source_record_key": self.source_record_key, "target_object": self.target_object,
                "target_record_key": self.target_record_key, "target_created": self.target_created,
                "moves": list(self.moves), "owners": sorted({m["owner_key"] for m in self.moves}),
                "created": self.created}


def _result(row: IdentityTransfer, *, created: bool) -> TransferResult:
    return TransferResult(row.transfer_id, row.kind, row.source_object, row.source_record_key, row.target_object,
                          row.target_record_key, row.target_created, tuple(row.moves), created)


def record_merge(*, org: OrgScope, transfer_id: str, object_name: str, source_key: str, target_key: str,
                 actor: str) -> TransferResult:
    """Merge ``source_key`` into ``target_key`` (same object): move remote authority, soft-delete the source.

    Args:
        org: trusted org (from authentication).
        transfer_id: caller-supplied idempotency key (canonical, at most 120 characters).
        object_name / source_key / target_key: the two live records.
        actor: who asks (evidence).

    Returns:
        :class:`TransferResult` (``created`` ``False`` for a valid replay).

    Raises:
        InvalidIdentity: a malformed key (before any read).
        TransferInvalid: source and target are the same record.
        UnknownObject, TransferRecordNotFound: no such object or live record.
        OwnerWorkPending, OwnerContended: retryable (HTTP 409 + Retry-After).
        TransferMismatch, TransferIdentityConflict, TransferAuthorityInactive,
            TransferMirrorMismatch, TransferTargetSlotMissing: refused.

    Seed 000, "Transfer"; a replay validates per owner ("Completed transfer replay").
    """
    validate_key(target_key, field="target_key", max_length=64)
    if source_key == target_key:
        raise TransferInvalid("a record cannot be merged into itself")
    current_view().object(object_name)
    return _transfer(org=org, kind=MERGE, transfer_id=transfer_id, source_object=object_name, source_key=source_key,
                     target_object=object_name, target_key=target_key, actor=actor)


def record_convert(*, org: OrgScope, transfer_id: str, source_object: str, source_key: str, target_object: str,
                   target_key: str | None = None, actor: str) -> TransferResult:
    """Convert a record into a new (or an existing) record of the object its metadata declares.

    A new target takes the fields of the declared conversion ``field_map`` and
    is inserted without after-save automation (the transfer is an identity
    move, not a business save). The source ends soft-deleted; the fact records
    the conversion.

    Raises:
        as :func:`record_merge`, plus TransferConversionUndeclared: the source
        object declares no conversion to ``target_object``.

    Seed 000, "Transfer".
    """
    definition = current_view().object(source_object)
    current_view().object(target_object)
    if target_object not in definition.conversions:
        raise TransferConversionUndeclared(f"{source_object} declares no conversion to {target_object}")
    if target_key is not None:
        validate_key(target_key, field="target_key", max_length=64)
    return _transfer(org=org, kind=CONVERT, transfer_id=transfer_id, source_object=source_object,
                     source_key=source_key, target_object=target_object, target_key=target_key, actor=actor)


def transfer_get(*, org: OrgScope, transfer_id: str) -> TransferResult | None:
    """The stored transfer of ``transfer_id`` (read only, no validation), or ``None``."""
    row = IdentityTransfer.objects.filter(org_id=org.org_id, transfer_id=transfer_id).first()
    return None if row is None else _result(row, created=False)


def _request_digest(kind: str, transfer_id: str, source_object: str, source_key: str, target_object: str,
                    target_key: str | None) -> str:
    return digest_v2("records.identity-transfer", [
        ("kind", kind), ("transfer_id", transfer_id), ("source_object", source_object), ("source_key", source_key),
        ("target_object", target_object), ("target_key", target_key)]).hexdigest


def _transfer(*, org: OrgScope, kind: str, transfer_id: str, source_object: str, source_key: str,
              target_object: str, target_key: str | None, actor: str) -> TransferResult:
    validate_key(transfer_id, field="transfer_id", max_length=120)
    validate_key(source_key, field="record_key", max_length=64)
    if not actor or len(actor) > 120:
        raise TransferInvalid("an actor of 1-120 characters is required")
    digest = _request_digest(kind, transfer_id, source_object, source_key, target_object, target_key)
    stored = IdentityTransfer.objects.filter(org_id=org.org_id, transfer_id=transfer_id).first()
    if stored is not None:
        return _replay(org, stored, digest)
    try:
        with transaction.atomic(durable=True):
            return _transfer_once(org, kind, transfer_id, digest, source_object, source_key, target_object,
                                  target_key, actor)
    except _StoredMeanwhile:
        pass  # the same id committed while this call waited on a record lock: replay it
    except IntegrityError:
        # The same id committed concurrently for other records (the fact's unique key refused the insert).
        if not IdentityTransfer.objects.filter(org_id=org.org_id, transfer_id=transfer_id).exists():
            raise
    return _replay(org, IdentityTransfer.objects.get(org_id=org.org_id, transfer_id=transfer_id), digest)


class _StoredMeanwhile(Exception):
    pass


def _transfer_once(org, kind, transfer_id, digest, source_object, source_key, target_object, target_key,
                   actor) -> TransferResult:
    """One transfer attempt inside the caller's durable transaction (see the module docstring for the order)."""
    records = _lock_records(org, [(source_object, source_key)] + (
        [(target_object, target_key)] if target_key is not None else []))
    if IdentityTransfer.objects.filter(org_id=org.org_id, transfer_id=transfer_id).exists():
        raise _StoredMeanwhile()
    missing = [f"{obj}/{key}" for (obj, key), record in records.items() if record is None]
    if missing:
        raise TransferRecordNotFound(f"no live record {', '.join(missing)}")
    source = records[(source_object, source_key)]
    target = records.get((target_object, target_key)) if target_key is not None else None
    row = _apply(org, kind, transfer_id, digest, source, target, target_object, actor)
    failpoints.hit(FP_BEFORE_COMMIT)
    return _result(row, created=True)


def _lock_records(org: OrgScope, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Record | None]:
    """Lock the live records in canonical ``(object, key)`` byte order; a missing one maps to ``None``."""
    found: dict[tuple[str, str], Record | None] = {}
    for object_name, record_key in sorted(keys, key=lambda k: (k[0].encode(), k[1].encode())):
        try:
            found[(object_name, record_key)] = RecordStore.lock(org.org_id, object_name, record_key)
        except Record.DoesNotExist:
            found[(object_name, record_key)] = None
    return found


def _lock_links(org_id: str, owners: Iterable[tuple[str, str]]) -> list[RemoteLink]:
    """Lock every RemoteLink row of the given ``(object, record key)`` pairs, ascending id."""
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
class _Move:
    link: RemoteLink
    new_key: str
    action_slot_id: str
    snapshot: dict
    mapping_fingerprint: str
    body_fingerprint: str
    mirror_field: str

    def as_fact(self, target_object: str) -> dict:
        link = self.link
        return {"owner_key": link.owner_key, "destination_slot_id": link.destination_slot_id,
                "remote_scope": link.remote_scope, "remote_id": link.remote_id, "action_type": link.action_type,
                "from_link_key": link.link_key, "from_action_slot_id": link.action_slot_id,
                "to_link_key": self.new_key, "to_action_slot_id": self.action_slot_id,
                "target_object": target_object, "mirror_field": self.mirror_field}


def _plan(org: OrgScope, source: Record, target: Record | None, target_object: str, target_key: str,
          links: list[RemoteLink]) -> list[_Move]:
    """Decide every link move and check every conflict; writes nothing.

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
    moves: list[_Move] = []
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
        moves.append(_Move(link, new_key, action_slot_id, snapshot, *fingerprints, mirror))
    return moves


def _apply(org: OrgScope, kind: str, transfer_id: str, digest: str, source: Record, target: Record | None,
           target_object: str, actor: str) -> IdentityTransfer:
    """Lock links, check owner work on both records, plan every move, then write (records already locked)."""
    links = _lock_links(org.org_id, [(source.object_name, source.record_key)] + (
        [(target.object_name, target.record_key)] if target is not None else []))
    intents = {"source": owner_work_check(org_id=org.org_id, object_name=source.object_name,
                                          record_key=source.record_key)}
    if target is not None:
        intents["target"] = owner_work_check(org_id=org.org_id, object_name=target.object_name,
                                             record_key=target.record_key)
    target_key = target.record_key if target is not None else new_record_key(
        current_view().object(target_object).key_prefix)
    moves = _plan(org, source, target, target_object, target_key, links)
    created = target is None
    if created:
        target = _create_converted(org, source, target_object, target_key)
    for move in moves:
        _move_link(org, move, transfer_id=transfer_id, actor=actor, target_object=target_object,
                   target_key=target_key)
    for field in sorted({m.mirror_field for m in moves if m.mirror_field}):
        remote_id = next(m.link.remote_id for m in moves if m.mirror_field == field)
        record_write_mirror(org=org, record=target, field=field, value=remote_id)
    if kind == CONVERT:
        conversion = current_view().object(source.object_name).conversions[target_object]
        if conversion.source_values:
            RecordStore.write(source, fields={**source.fields, **conversion.source_values})
    RecordStore.soft_delete(source)
    return insert(IdentityTransfer, org_id=org.org_id, transfer_id=transfer_id, kind=kind, request_digest=digest,
                  source_object=source.object_name, source_record_key=source.record_key,
                  target_object=target_object, target_record_key=target_key, target_created=created,
                  moves=[m.as_fact(target_object) for m in moves],
                  owner_intents={side: [{"command_id": i.command_id, "contract_key": i.contract_key,
                                         "state": i.state} for i in found] for side, found in intents.items()},
                  actor=actor)


def _create_converted(org: OrgScope, source: Record, target_object: str, target_key: str) -> Record:
    """Insert the conversion's new target record with the declared field map (no after-save automation)."""
    conversion = current_view().object(source.object_name).conversions[target_object]
    definition = current_view().object(target_object)
    fields = {target_field: definition.clean_value(target_field, source.fields.get(source_field))
              for source_field, target_field in conversion.field_map.items()
              if source.fields.get(source_field) is not None}
    return RecordStore.create(org_id=org.org_id, object_name=target_object, record_key=target_key, fields=fields,
                              mirrors={})


def _move_link(org: OrgScope, move: _Move, *, transfer_id: str, actor: str, target_object: str,
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


def _replay(org: OrgScope, stored: IdentityTransfer, digest: str) -> TransferResult:
    """Validate a completed transfer's target authority, owner by owner; write nothing.

    Raises:
        TransferMismatch: other inputs under the same id.
        TransferIdentityConflict / TransferAuthorityInactive / TransferMirrorMismatch.
    """
    if stored.request_digest != digest:
        raise TransferMismatch(f"transfer {stored.transfer_id} exists with other inputs")
    target = Record.objects.filter(org_id=org.org_id, object_name=stored.target_object,
                                   record_key=stored.target_record_key).first()
    if target is None or target.is_deleted:
        raise TransferAuthorityInactive(f"transfer target {stored.target_object}/{stored.target_record_key} "
                                        f"is gone")
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
    return _result(stored, created=False)

