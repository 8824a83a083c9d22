"""Access policy writes: publish a generation, grant or revoke a record share (seed 004 section 17).

Both write immutable rows only (:func:`nexusflow.kernel.models.insert`); reads are in
:mod:`nexusflow.records.selectors`, decisions in :mod:`nexusflow.records.access`.
"""
from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.models import insert

from .access import SHARE_LEVELS, AccessPolicyInvalid, access_document_digest, validate_access_document
from .metadata import current_view
from .models import AccessPolicyGeneration, RecordShare
from .selectors import record_get

#: How often a publish reads the chain again after a concurrent publish took its number.
_PUBLISH_TRIES = 8


def _org(org_id: str) -> str:
    try:
        return validate_key(org_id, field="org", max_length=64)
    except InvalidIdentity as exc:
        raise AccessPolicyInvalid(str(exc)) from None


def _who(authored_by: str, reason: str) -> None:
    if not (authored_by or "").strip() or not (reason or "").strip():
        raise AccessPolicyInvalid("an access change names who authored it and why")


def access_policy_publish(*, org_id: str, document: Any, authored_by: str,
                          reason: str) -> tuple[AccessPolicyGeneration, bool]:
    """Publish ``document`` as the org's next access policy generation; ``(generation, created)``.

    The document is validated against the current metadata view and stored in canonical form; a document
    equal to the org's latest generation returns that generation (``created`` False), so a retried publish
    writes nothing. An earlier document published again is a new generation (the chain records the
    return). Two concurrent publishes get distinct generation numbers.

    Args:
        org_id: the org (canonical key).
        document: the parsed JSON document (:mod:`nexusflow.records.access`).
        authored_by / reason: who publishes and why (non-empty; kept on the generation).

    Raises:
        AccessPolicyInvalid: a malformed org, an empty ``authored_by``/``reason``, or an invalid document
            (:func:`nexusflow.records.access.validate_access_document`).

    Seed 004 section 17 (authorization context, versioned).
    """
    org_id = _org(org_id)
    _who(authored_by, reason)
    view = current_view()
    canonical = validate_access_document(document, objects={name: tuple(d.fields)
                                                             for name, d in view.objects.items()})
    digest = access_document_digest(org_id, canonical)
    for _ in range(_PUBLISH_TRIES):
        latest = AccessPolicyGeneration.objects.filter(org_id=org_id).order_by("-generation").first()
        if latest is not None and latest.digest == digest:
            return latest, False
        number = (latest.generation if latest else 0) + 1
        try:
            with transaction.atomic():
                row = insert(AccessPolicyGeneration, org_id=org_id, generation=number, document=canonical,
                             digest=digest, authored_by=authored_by[:120], reason=reason[:240],
                             created_at=db_now())
        except IntegrityError:
            continue  # a concurrent publish took this number: read again
        return row, True
    raise AccessPolicyInvalid(f"the access policy of {org_id} is being published concurrently; retry")


def record_share_set(*, org_id: str, object_name: str, record_key: str, user_id: str, access: str,
                     authored_by: str, reason: str) -> tuple[RecordShare | None, bool]:
    """Share a live record with a user (``access`` ``read`` / ``edit``) or revoke the share (``none``).

    Appends the next entry of the ``(record, user)`` share log and returns ``(entry, created)``; the same
    access as the entry in force returns that entry (``created`` False). Revoking a share that never
    existed writes nothing and returns ``(None, False)``.

    Raises:
        AccessPolicyInvalid: a malformed org/object/record/user key, an unknown access level, an empty
            ``authored_by``/``reason``.
        RecordNotFound: no live record with this identity in the org.

    Seed 004 section 17 (record access).
    """
    from .services import RecordNotFound

    org_id = _org(org_id)
    _who(authored_by, reason)
    try:
        object_name = validate_key(object_name, field="object", max_length=80)
        record_key = validate_key(record_key, field="record_key", max_length=64)
        user_id = validate_key(user_id, field="user", max_length=64)
    except InvalidIdentity as exc:
        raise AccessPolicyInvalid(str(exc)) from None
    if access not in SHARE_LEVELS:
        raise AccessPolicyInvalid(f"share access {access!r} is not one of {', '.join(SHARE_LEVELS)}")
    from nexusflow.kernel.scope import OrgScope

    if record_get(org=OrgScope(org_id), object_name=object_name, record_key=record_key) is None:
        raise RecordNotFound(f"no live record {object_name}/{record_key}")
    key = {"org_id": org_id, "object_name": object_name, "record_key": record_key, "user_id": user_id}
    for _ in range(_PUBLISH_TRIES):
        latest = RecordShare.objects.filter(**key).order_by("-sequence").first()
        if (latest is not None and latest.access == access) or (latest is None and access == "none"):
            return latest, False
        try:
            with transaction.atomic():
                row = insert(RecordShare, **key, sequence=(latest.sequence if latest else 0) + 1, access=access,
                             authored_by=authored_by[:120], reason=reason[:240], created_at=db_now())
        except IntegrityError:
            continue
        return row, True
    raise AccessPolicyInvalid(f"the share of {object_name}/{record_key} is being changed concurrently; retry")
