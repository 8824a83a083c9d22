"""Record use cases: create, update, delete, mirror writeback, before-save, after-save and before-delete hooks.

Every function runs inside the caller's transaction (the application
transaction of seed 003 "Runtime-owned result"); before-save hooks transform
the values before the row is written and after-save hooks run after it, both
in that same transaction, so a record change and the Flow runs it triggers commit or
roll back together.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from django.db import transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from .metadata import InvalidFieldValue, UnknownField, current_view
from .models import Record
from .store import HistoryStore, RecordStore


@dataclass(frozen=True)
class RecordChange:
    """What one save changed.

    ``created`` is true for an insert; ``changed_fields`` names the fields
    whose value changed; ``prior_fields`` is the record's field values before
    this save (``{name: text|None}``), ``None`` on create. After-save hooks
    freeze ``prior_fields`` with the trigger snapshot so that ``ISCHANGED``,
    ``PRIORVALUE`` and ``$Record__Prior`` compare against the values this
    very save replaced (seed 004 section 9, record-triggered starts).
    """

    created: bool
    changed_fields: frozenset[str]
    prior_fields: dict | None = None


class AfterSaveHook(Protocol):
    def __call__(self, *, org: OrgScope, record: Record, change: RecordChange) -> None: ...


class BeforeSaveHook(Protocol):
    def __call__(self, *, org: OrgScope, object_name: str, record_key: str | None, fields: dict,
                 prior: dict | None, created: bool) -> dict: ...


class BeforeDeleteHook(Protocol):
    def __call__(self, *, org: OrgScope, record: Record) -> None: ...


_AFTER_SAVE: list[Callable[..., None]] = []
_BEFORE_SAVE: list[Callable[..., dict]] = []
#: ``(stage, registration number, hook)``; run in ascending ``(stage, registration number)``.
_BEFORE_DELETE: list[tuple[int, int, Callable[..., None]]] = []

#: Before-delete stages (seed 000): Runtime's owner work check runs first, before any remote link is
#: enumerated; the Connector's link handling runs after it. Lower stages run first.
#: Flow runs waiting on the record (scheduled paths) wake first: Flow rows come before the Runtime intents
#: and Connector links the later stages lock (one lock order); a later refusal rolls the wake back with it.
DELETE_STAGE_FLOW_WAITS = 50
DELETE_STAGE_OWNER_WORK = 100
DELETE_STAGE_REMOTE_LINKS = 200

FP_DELETE_BEFORE_COMMIT = failpoints.declare("records.delete_before_commit")
FP_HISTORY_RESERVED = failpoints.declare("records.history.reserved")


class RecordNotFound(NexusError):
    """No live record with this identity in the org (HTTP 404)."""

    code = "record_not_found"
    definite = True
    http_status = 404


def register_before_save(hook: BeforeSaveHook) -> None:
    """Register a hook that transforms a record's fields inside the saving transaction, before the write.

    Seed 004 section 9.1 (Embedded Before-Save): the hook returns the new
    field values; raising fails the whole record mutation.
    """
    if hook not in _BEFORE_SAVE:
        _BEFORE_SAVE.append(hook)


def _run_before_hooks(org: OrgScope, object_name: str, record_key: str | None, fields: dict,
                      prior: dict | None, created: bool) -> dict:
    for hook in list(_BEFORE_SAVE):
        fields = hook(org=org, object_name=object_name, record_key=record_key, fields=fields, prior=prior,
                      created=created)
    return fields


def register_after_save(hook: AfterSaveHook) -> None:
    """Register a hook run in the saving transaction after each field change."""
    if hook not in _AFTER_SAVE:
        _AFTER_SAVE.append(hook)


def _run_hooks(org: OrgScope, record: Record, change: RecordChange) -> None:
    for hook in list(_AFTER_SAVE):
        hook(org=org, record=record, change=change)


def register_before_delete(hook: BeforeDeleteHook, *, stage: int) -> None:
    """Register a record-deletion lifecycle hook, run by :func:`record_delete` under the record lock.

    Seed 000 ("the installed record-deletion lifecycle hook"): hooks run in
    the deleting transaction, in ascending ``stage`` (then registration
    order), before the row is marked deleted; raising refuses the deletion
    and rolls it back. Use :data:`DELETE_STAGE_OWNER_WORK` for the Runtime
    owner check and :data:`DELETE_STAGE_REMOTE_LINKS` for remote links, so the
    order does not depend on which app is loaded first. Registering the same
    hook again is a no-op.
    """
    if any(existing is hook for _stage, _n, existing in _BEFORE_DELETE):
        return
    _BEFORE_DELETE.append((int(stage), len(_BEFORE_DELETE), hook))
    _BEFORE_DELETE.sort(key=lambda entry: entry[:2])


def before_delete_hooks(*, below: int | None = None) -> tuple[Callable[..., None], ...]:
    """The registered before-delete hooks in the order :func:`record_delete` runs them (``below``: stages under it)."""
    return tuple(hook for stage, _n, hook in _BEFORE_DELETE if below is None or stage < below)


def _require_atomic() -> None:
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record services run inside the application transaction")


def new_record_key(prefix: str) -> str:
    """Mint an unguessable 18-character record key with the object's prefix."""
    return (prefix + uuid.uuid4().hex)[:18]


def record_create(*, org: OrgScope, object_name: str, values: dict[str, str | None],
                  owner_id: str | None = None) -> Record:
    """Insert a record of ``object_name`` and run after-save hooks.

    Args:
        owner_id: the user who owns the new record (the creating principal, when known; record access,
            seed 004 section 17); ``None``: no owner.

    Raises:
        UnknownObject, UnknownField, InvalidFieldValue: values do not fit the metadata.
    """
    _require_atomic()
    definition = current_view().object(object_name)
    fields = {name: definition.clean_value(name, value) for name, value in values.items()}
    record_key = new_record_key(definition.key_prefix)
    if _BEFORE_SAVE:
        transformed = _run_before_hooks(org, object_name, record_key, dict(fields), None, True)
        fields = {name: definition.clean_value(name, value) for name, value in transformed.items()}
    record = RecordStore.create(
        org_id=org.org_id, object_name=object_name, record_key=record_key, fields=fields, mirrors={},
        owner_id=owner_id,
    )
    _history(definition, record, "create", {name: (None, value) for name, value in fields.items()
                                            if value not in (None, "")}, new=True)
    _run_hooks(org, record, RecordChange(created=True, changed_fields=frozenset(fields)))
    return record


def _history(definition, record: Record, change: str, values: dict[str, tuple], *, new: bool = False) -> None:
    """Append the record's field history of one write (tracked fields only; seed 004 section 13.1 step 3).

    The sequence was reserved right after the business row (:func:`record_history_reserve`), or is taken
    now, the record's row being held by this transaction already.
    """
    tracked = {name: pair for name, pair in values.items() if name in definition.tracked_fields or name == "*"}
    if not definition.tracked_fields or not tracked:
        return
    sequence = HistoryStore.take(record.org_id, record.object_name, record.record_key, new=new)
    failpoints.hit(FP_HISTORY_RESERVED)  # business row and history sequence held (lock-order tests pause here)
    now = db_now()
    HistoryStore.append([
        {"org_id": record.org_id, "object_name": record.object_name, "record_key": record.record_key,
         "sequence": sequence, "field": name, "change": change, "old_value": old, "new_value": new_value,
         "record_version": record.version, "created_at": now}
        for name, (old, new_value) in sorted(tracked.items())])


def record_history_reserve(*, org: OrgScope, object_name: str, record_key: str,
                           changes: dict[str, str | None] | None = None, fields: dict | None = None) -> bool:
    """Reserve the history sequence of a locked record's coming write, if its object tracks history and the
    write changes a tracked field (``changes`` against its current ``fields``; ``None``: a deletion).

    For a writer that enters Flow lifecycle state before it applies its writes: seed 004 section 13.1 puts
    history-sequence reservation after the business rows and before the Flow root. A write that changes no
    tracked field still holds the sequence row (no number taken) while before-save hooks are registered: they
    may change a tracked field after the Flow root is locked. Reserving twice for one coming write (a Flow
    step's deletion, then :func:`record_delete`) keeps the first number. Returns whether it reserved.
    """
    definition = current_view().object(object_name)
    if not definition.tracked_fields:
        return False
    if changes is not None and not any(name in definition.tracked_fields and (fields or {}).get(name) != value
                                       for name, value in changes.items()):
        if _BEFORE_SAVE:  # a before-save hook may still change a tracked field: hold the row, take no number
            HistoryStore.hold(org.org_id, object_name, record_key)
        return False
    HistoryStore.reserve(org.org_id, object_name, record_key)
    return True


def record_lock(*, org: OrgScope, object_name: str, record_key: str, nowait: bool = False) -> Record:
    """Lock and return a live record (business-record lock class first)."""
    _require_atomic()
    return RecordStore.lock(org.org_id, object_name, record_key, nowait=nowait)


def record_lock_owner(*, org: OrgScope, object_name: str, record_key: str) -> Record:
    """Lock a record row live or deleted (the owner fence of seed 000) and return it.

    Resource enqueue takes this lock so that a deletion committed while it
    waited is seen as ``record.is_deleted`` (and refused as ``owner_deleted``)
    rather than as a missing row.

    Raises:
        Record.DoesNotExist: no record with this identity ever existed.
    """
    _require_atomic()
    return RecordStore.lock_owner(org.org_id, object_name, record_key)


def record_update(*, org: OrgScope, record: Record, changes: dict[str, str | None]) -> RecordChange:
    """Apply ``changes`` to a locked record; run hooks when something changed.

    Returns:
        The :class:`RecordChange`; ``changed_fields`` is empty for a no-op.

    Raises:
        UnknownField, InvalidFieldValue: a change does not fit the metadata.
        StaleVersion: the record moved since it was locked (cannot happen
            while the lock is held; kept as a guard).
    """
    _require_atomic()
    definition = current_view().object(record.object_name)
    cleaned = {name: definition.clean_value(name, value) for name, value in changes.items()}
    if _BEFORE_SAVE:
        proposed = _run_before_hooks(org, record.object_name, record.record_key, {**record.fields, **cleaned},
                                     dict(record.fields), False)
        cleaned = {name: definition.clean_value(name, value) for name, value in proposed.items()
                   if name in cleaned or record.fields.get(name) != value}
    changed = frozenset(name for name, value in cleaned.items() if record.fields.get(name) != value)
    change = RecordChange(created=False, changed_fields=changed, prior_fields=dict(record.fields))
    if not changed:
        return change
    before = dict(record.fields)
    RecordStore.write(record, fields={**record.fields, **cleaned})
    _history(definition, record, "update", {name: (before.get(name), cleaned[name]) for name in changed})
    _run_hooks(org, record, change)
    return change


def record_retiring_hooks(*, org: OrgScope, record: Record) -> None:
    """Run the before-delete hooks that react to ``record`` leaving (stages below :data:`DELETE_STAGE_OWNER_WORK`).

    For a caller that retires a record other than by :func:`record_delete`
    (a merge or conversion soft-deletes its source, :mod:`.transfer`) and
    handles owner work and remote links itself: the Flow waits on the record
    (scheduled paths, Wait elements watching it) learn it is gone exactly as
    from a deletion, in the caller's transaction and rolled back with it.
    """
    _require_atomic()
    for hook in before_delete_hooks(below=DELETE_STAGE_OWNER_WORK):
        hook(org=org, record=record)


def record_delete(*, org: OrgScope, record: Record) -> Record:
    """Soft-delete a record locked by this transaction after its before-delete hooks allow it.

    Seed 000: the installed hooks run here, under the record lock (the owner
    fence), in the deleting transaction: Runtime's owner work check first,
    then the Connector's remote-link handling (see
    :func:`register_before_delete`). No after-save hooks run; the row stays
    for evidence.

    Raises:
        OwnerWorkPending / OwnerContended: Runtime outbound work of the record
            is unfinished or committing (retryable; raised by the hook).
        RuntimeError: ``record`` is not locked by this transaction.
        StaleVersion: the record moved since it was locked.
    """
    _require_atomic()
    if record.org_id != org.org_id or not RecordStore.is_fenced(record):
        raise RuntimeError(f"{record.object_name}/{record.record_key}: lock the record (record_lock) in the "
                           f"deleting transaction first")
    # History right after the business row: the hooks below take Runtime and connector rows (seed 004 13.1).
    record_history_reserve(org=org, object_name=record.object_name, record_key=record.record_key)
    for hook in before_delete_hooks():
        hook(org=org, record=record)
    deleted = RecordStore.soft_delete(record)
    _history(current_view().object(record.object_name), deleted, "delete", {"*": (None, None)})
    return deleted


def record_delete_by_key(*, org: OrgScope, object_name: str, record_key: str, authorize=None) -> Record:
    """Delete one live record in its own transaction: lock, before-delete hooks, soft delete.

    The operations entry point (REST ``DELETE /api/v2/records/<object>/<key>/``
    and ``manage.py records delete``). Seed 000 "installed record-deletion
    lifecycle hook".

    Args:
        org: the trusted org (from authentication, never from a payload).
        object_name / record_key: the record's canonical identity (byte-exact).
        authorize: called with the locked record before anything is written; raises to refuse (the REST
            endpoint's access decision, :class:`nexusflow.records.access.AccessDenied`, 403 ``access_denied``).

    Returns:
        The deleted record (``is_deleted`` true).

    Raises:
        InvalidIdentity: malformed ``object_name`` or ``record_key`` (before SQL).
        RecordNotFound: no live record with this identity (``record_not_found``).
        OwnerWorkPending: unfinished outbound work (``owner_outbound_pending``, retryable).
        OwnerContended: a result for the record is committing (``owner_contended``, retryable).
    """
    validate_key(object_name, field="object", max_length=80)
    validate_key(record_key, field="record_key", max_length=64)
    with transaction.atomic(durable=True):
        try:
            record = record_lock(org=org, object_name=object_name, record_key=record_key)
        except Record.DoesNotExist:
            raise RecordNotFound(f"no live {object_name} record {record_key!r}") from None
        if authorize is not None:
            authorize(record)
        deleted = record_delete(org=org, record=record)
        failpoints.hit(FP_DELETE_BEFORE_COMMIT)
        return deleted


def record_write_mirror(*, org: OrgScope, record: Record, field: str, value: str) -> bool:
    """Write a compatibility mirror field on a locked record (seed 002 "After POST" step 3).

    Mirror writes do not run after-save hooks: they record a remote identity,
    they are not a business change.

    Returns:
        ``True`` if the mirror changed.

    Raises:
        UnknownField: ``field`` is not a mirror field of the object.
        InvalidFieldValue: a different mirror value is already present.
    """
    _require_atomic()
    definition = current_view().object(record.object_name)
    if field not in definition.mirror_fields:
        raise UnknownField(f"{record.object_name}.{field} is not a mirror field")
    current = record.mirrors.get(field)
    if current == value:
        return False
    if current is not None:
        raise InvalidFieldValue(f"{record.object_name}.{field} already mirrors {current!r}")
    RecordStore.write(record, mirrors={**record.mirrors, field: value})
    return True
