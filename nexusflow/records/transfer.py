"""Identity transfer: merge two records of one object, or convert a record into another object.

Seed 000, "Transfer" (Runtime outbound owner protection) on seed 002's
identity model (``link_key`` over stable slot ids + source record).

One durable, immutable :class:`~nexusflow.records.models.IdentityTransfer`
fact per caller-supplied ``transfer_id``. One transaction, in the one lock
order (ARCHITECTURE.md section 6):

1. the source and the target record rows (owner fences), in canonical
   ``(object, record key)`` byte order;
2. every RemoteLink row of both records (ascending id), through the
   Connector's remote-link port (:mod:`nexusflow.records.remote_links`);
3. the Runtime intents of source and target, ``FOR UPDATE NOWAIT``, through
   the owner-work port (:func:`nexusflow.records.owner.owner_work_check`):
   unfinished work is a retryable :class:`OwnerWorkPending`, a committing
   result a retryable :class:`OwnerContended`. Nothing changes before both
   checks passed.

Then remote authority moves, per connector owner (``RemoteLink.owner_key``;
the Connector plans and writes the links, :mod:`connectors.links.identity_transfer`):
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

from django.db import IntegrityError, transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

from .metadata import current_view
from .models import IdentityTransfer, Record
from .owner import OwnerContended, OwnerWorkPending, owner_work_check
from .remote_links import remote_links
from .services import new_record_key, record_retiring_hooks, record_write_mirror
from .store import RecordStore

__all__ = [
    "OwnerContended", "OwnerWorkPending", "TransferError", "TransferResult", "record_convert", "record_merge",
    "transfer_get",
]

MERGE, CONVERT = "merge", "convert"

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


def _apply(org: OrgScope, kind: str, transfer_id: str, digest: str, source: Record, target: Record | None,
           target_object: str, actor: str) -> IdentityTransfer:
    """Lock links, check owner work on both records, plan every move, then write (records already locked).

    The source leaves as a deletion would for the Flow waits on it (:func:`record_retiring_hooks`, first: Flow
    rows before the Runtime intents and Connector links locked next); owner work and links are handled here.
    """
    record_retiring_hooks(org=org, record=source)
    port = remote_links()
    links = port.lock(org_id=org.org_id, owners=[(source.object_name, source.record_key)] + (
        [(target.object_name, target.record_key)] if target is not None else []))
    intents = {"source": owner_work_check(org_id=org.org_id, object_name=source.object_name,
                                          record_key=source.record_key)}
    if target is not None:
        intents["target"] = owner_work_check(org_id=org.org_id, object_name=target.object_name,
                                             record_key=target.record_key)
    target_key = target.record_key if target is not None else new_record_key(
        current_view().object(target_object).key_prefix)
    moves = port.plan(org=org, source=source, target=target, target_object=target_object, target_key=target_key,
                      links=links)
    created = target is None
    if created:
        target = _create_converted(org, source, target_object, target_key)
    port.apply(org=org, moves=moves, transfer_id=transfer_id, actor=actor, target_object=target_object,
               target_key=target_key)
    for field in sorted({m.mirror_field for m in moves if m.mirror_field}):
        remote_id = next(m.remote_id for m in moves if m.mirror_field == field)
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
    remote_links().validate_replay(org=org, stored=stored, target=target)
    return _result(stored, created=False)

