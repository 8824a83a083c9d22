"""Source-value read authority for outbound pushes (seed 002 consumes #1781).

Outbound source values use the originating user's object, record and
field-level read authority; pack trust authorizes connector metadata and
callout credentials only. Field-level security comes from the org's access
policy when it has one (:mod:`nexusflow.records.access`, the same decision the
record endpoints use); otherwise from the metadata view: a field with
``"read_access": [user ids]`` is readable by those users only, a field without
it by every user.
"""
from __future__ import annotations

from dataclasses import dataclass

from nexusflow.kernel.errors import NexusError

from .metadata import current_view

#: The user record-triggered and autolaunched Flows run as (the system context user).
AUTOMATED_PROCESS_USER = "automated_process"


class AuthorityDenied(NexusError):
    """The originating user may not read a source field the outbound body needs."""

    code = "authority_denied"
    definite = True


@dataclass(frozen=True)
class AuthorityDecision:
    """One #1781 decision: ``user_id`` may read ``allowed_fields`` of ``object_name``; it may not read ``denied``."""

    user_id: str
    object_name: str
    allowed_fields: tuple[str, ...]
    denied: tuple[str, ...]
    #: The access policy generation's digest the decision was made under (``""``: the metadata view's lists).
    context_digest: str = ""


def field_read_authority(*, user_id: str, object_name: str, fields: list[str] | tuple[str, ...],
                         org_id: str | None = None) -> AuthorityDecision:
    """Decide which of ``fields`` ``user_id`` may read on ``object_name``.

    Args:
        org_id: the org whose access policy decides (:func:`nexusflow.records.access.field_access`, ``read``);
            without one, or when the org has no policy, the current metadata view's ``read_access`` lists.
            A field the metadata view does not define is always denied.

    Raises:
        UnknownObject: ``object_name`` is not defined.
    """
    definition = current_view().object(object_name)
    if org_id is not None:
        from .access import field_access
        from .selectors import access_policy

        policy = access_policy(org_id=org_id)
        if policy is not None:
            known = [name for name in sorted(set(fields)) if name in definition.fields]
            decision = field_access(policy.principal(user_id), object_name, known, "read")
            denied = sorted(set(decision.denied) | (set(fields) - set(known)))
            return AuthorityDecision(user_id, object_name, decision.allowed, tuple(denied), policy.digest)
    allowed, denied = [], []
    for name in sorted(set(fields)):
        field = definition.fields.get(name)
        if field is None or (field.read_access is not None and user_id not in field.read_access):
            denied.append(name)
        else:
            allowed.append(name)
    return AuthorityDecision(user_id, object_name, tuple(allowed), tuple(denied))


def require_read_authority(*, user_id: str, object_name: str, fields, org_id: str | None = None) -> AuthorityDecision:
    """:func:`field_read_authority`, failing closed.

    Raises:
        AuthorityDenied: any field is unreadable for the user (names the fields).
    """
    decision = field_read_authority(user_id=user_id, object_name=object_name, fields=fields, org_id=org_id)
    if decision.denied:
        raise AuthorityDenied(f"user {user_id} may not read {object_name}.{', '.join(decision.denied)}")
    return decision
