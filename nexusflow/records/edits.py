"""Local record edits: create one record or update its fields, as an operator UI or API client does.

Each call is one durable application transaction: the record row is locked
(``FOR UPDATE NOWAIT``: an edit never queues behind a committing outbound
result, seed 000 "Result commit locks its intent before local record
projection"), written through the record services, and the usual before-save
and after-save Flows run in that same transaction, so an edit and the pushes
it triggers commit or roll back together.

A row held by another transaction (a webhook application, a result commit,
an identity transfer) is a retryable :class:`~nexusflow.records.owner.OwnerContended`;
owner conflicts raised by the after-save automation propagate as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import OperationalError, transaction

from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.locks import NOWAIT_LOCK_ERRORS
from nexusflow.kernel.scope import OrgScope

from .access import CREATE, EDIT, AccessDenied, acting_as, field_access, object_access, record_access
from .metadata import InvalidFieldValue, current_view
from .models import Record
from .owner import OwnerContended
from .selectors import record_share_in_force
from .services import RecordNotFound, record_create, record_lock, record_update

#: MariaDB/MySQL deadlock: the transaction was rolled back, nothing was written; retrying can succeed.
DEADLOCK = 1213


@dataclass(frozen=True)
class EditResult:
    """One committed edit: the record after it and the fields it changed (empty for a no-op update)."""

    object_name: str
    record_key: str
    version: int
    fields: dict
    changed: tuple[str, ...]
    created: bool

    def as_dict(self) -> dict:
        return {"object": self.object_name, "record_key": self.record_key, "version": self.version,
                "fields": dict(self.fields), "changed": list(self.changed), "created": self.created}


def _contended(exc: OperationalError, what: str) -> OwnerContended | None:
    if exc.args and exc.args[0] in NOWAIT_LOCK_ERRORS | {DEADLOCK}:
        return OwnerContended(f"{what} is being changed by another transaction now; retry")
    return None


def _check_fields(fields: object) -> dict:
    if not isinstance(fields, dict) or not fields:
        raise InvalidFieldValue("fields must be a non-empty object of field name to text (or null)")
    return fields


def _require(decision, what: str) -> None:
    if not decision.allowed:
        raise AccessDenied(f"{decision.user_id} may not {what} ({decision.basis})")


def _require_fields(principal, object_name: str, fields, op: str) -> None:
    decision = field_access(principal, object_name, sorted(fields), op)
    if decision.denied:
        raise AccessDenied(f"{principal.user_id} may not {op} {object_name} field(s) "
                           f"{', '.join(sorted(decision.denied))} (field-level security)")


def require_record_access(principal, record: Record, op: str) -> None:
    """Refuse ``op`` (edit / delete) of the locked ``record`` by ``principal`` (object permission, then record
    access: ownership, shares, the org-wide default, ``modify_all``); ``principal`` ``None`` allows everything.

    Raises:
        AccessDenied: ``access_denied``.
    """
    if principal is None:
        return
    share = record_share_in_force(org_id=record.org_id, object_name=record.object_name,
                                  record_key=record.record_key, user_id=principal.user_id)
    _require(record_access(principal, record, op, share=share), f"{op} {record.object_name} {record.record_key}")


def require_create(principal, object_name: str, fields) -> None:
    """Refuse creating an ``object_name`` record with ``fields`` as ``principal`` (object ``create``, field ``edit``).

    Raises:
        AccessDenied: ``access_denied``.
    """
    _require(object_access(principal, object_name, CREATE), f"create {object_name} records")
    if fields:
        _require_fields(principal, object_name, fields, EDIT)


def require_update(principal, record: Record, fields) -> None:
    """Refuse changing ``fields`` of the locked ``record`` as ``principal`` (record access ``edit``, field ``edit``).

    Raises:
        AccessDenied: ``access_denied``.
    """
    require_record_access(principal, record, EDIT)
    if fields:
        _require_fields(principal, record.object_name, fields, EDIT)


def record_edit_create(*, org: OrgScope, object_name: str, fields: dict[str, str | None],
                       owner_id: str | None = None, principal=None) -> EditResult:
    """Create one record of ``object_name`` with ``fields``; its after-save Flows run in the same transaction.

    Args:
        org: trusted org (from authentication).
        object_name: an object of the metadata view.
        fields: ``{field name: text or None}`` (at least one).
        owner_id: the calling user, who owns the new record (``None``: no owner).
        principal: the calling user's access-policy principal (``None``: an org without a policy); it needs the
            object's ``create`` and field-level ``edit`` on every field given, and owns the new record.

    Returns:
        :class:`EditResult` (``created`` ``True``).

    Raises:
        UnknownObject: no such object.
        UnknownField, InvalidFieldValue: a value does not fit the metadata.
        OwnerConflict: retryable, raised by the after-save automation.

    Seed 004 section 9 (record-triggered Flows run in the saving transaction).
    """
    current_view().object(object_name)
    fields = _check_fields(fields)
    if principal is not None:
        require_create(principal, object_name, fields)
        owner_id = principal.user_id
    try:
        with transaction.atomic(durable=True), acting_as(principal.user_id if principal is not None else None):
            record = record_create(org=org, object_name=object_name, values=fields, owner_id=owner_id)
    except OperationalError as exc:
        contended = _contended(exc, f"a new {object_name}")
        if contended is None:
            raise
        raise contended from exc
    return EditResult(object_name, record.record_key, record.version, dict(record.fields), tuple(sorted(record.fields)),
                      True)


def record_edit_update(*, org: OrgScope, object_name: str, record_key: str,
                       fields: dict[str, str | None], principal=None) -> EditResult:
    """Update fields of one live record; when something changed, its after-save Flows run in the same transaction.

    Args:
        org: trusted org (from authentication).
        object_name / record_key: the live record.
        fields: ``{field name: text or None}`` (at least one); unchanged values are a no-op.
        principal: the calling user's access-policy principal (``None``: an org without a policy); decided under
            the record lock: the object's ``edit``, record access ``edit`` and field-level ``edit`` on every
            field given.

    Returns:
        :class:`EditResult` (``changed`` empty for a no-op).

    Raises:
        InvalidIdentity: a malformed record key.
        UnknownObject, RecordNotFound: no such object or live record.
        UnknownField, InvalidFieldValue: a value does not fit the metadata.
        OwnerContended: the record row is held by another transaction (retryable).
        OwnerConflict: retryable, raised by the after-save automation.

    Seed 000, "Transfer" (owner checks use current ``FOR UPDATE NOWAIT`` reads; contention is retryable).
    """
    validate_key(record_key, field="record_key", max_length=64)
    current_view().object(object_name)
    fields = _check_fields(fields)
    try:
        with transaction.atomic(durable=True):
            try:
                record = record_lock(org=org, object_name=object_name, record_key=record_key, nowait=True)
            except Record.DoesNotExist:
                raise RecordNotFound(f"no live record {object_name}/{record_key}") from None
            if principal is not None:
                require_update(principal, record, fields)
            with acting_as(principal.user_id if principal is not None else None):
                change = record_update(org=org, record=record, changes=fields)
    except OperationalError as exc:
        contended = _contended(exc, f"{object_name}/{record_key}")
        if contended is None:
            raise
        raise contended from exc
    return EditResult(object_name, record.record_key, record.version, dict(record.fields),
                      tuple(sorted(change.changed_fields)), False)
