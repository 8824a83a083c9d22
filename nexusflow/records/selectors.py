"""Record reads (no locks)."""
from __future__ import annotations

from nexusflow.kernel.permissions import operator_org_ids
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from .models import Record


def record_get(*, org: OrgScope, object_name: str, record_key: str) -> Record | None:
    return Record.objects.filter(org_id=org.org_id, object_name=object_name, record_key=record_key, is_deleted=False).first()


def records_of(*, org: OrgScope, object_name: str):
    return Record.objects.filter(org_id=org.org_id, object_name=object_name, is_deleted=False).order_by("id")


def operator_org_for_record(user, object_name: str, record_key: str, *, live: bool = True,
                            not_found: type[Exception] | None = None) -> OrgScope:
    """The org, among the operator's orgs, that holds the record ``object_name``/``record_key``.

    Args:
        live: only a live record counts (``False``: a soft-deleted one too, e.g. a transfer's source).
        not_found: the error class raised when there is no such record (default
            :class:`~nexusflow.records.services.RecordNotFound`).

    Raises:
        InvalidIdentity: malformed ``object_name`` or ``record_key``.
        RecordNotFound (or ``not_found``): no such record in the operator's orgs, or it is ambiguous.
    """
    from .services import RecordNotFound

    validate_key(object_name, field="object", max_length=80)
    validate_key(record_key, field="record_key", max_length=64)
    rows = Record.objects.filter(object_name=object_name, record_key=record_key)
    if live:
        rows = rows.filter(is_deleted=False)
    orgs = operator_org_ids(user)
    if orgs is not None:
        rows = rows.filter(org_id__in=sorted(orgs))
    found = sorted(set(rows.values_list("org_id", flat=True)[:2]))
    if len(found) != 1:
        raise (not_found or RecordNotFound)(f"no {'live ' if live else ''}record {object_name}/{record_key}")
    return OrgScope(found[0])
