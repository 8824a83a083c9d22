"""Record reads (no locks)."""
from __future__ import annotations

from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.permissions import operator_org_ids
from nexusflow.kernel.rows import fetch_where, first_row
from nexusflow.kernel.scope import OrgScope

from .models import Record


def record_get(*, org: OrgScope, object_name: str, record_key: str) -> Record | None:
    return first_row(Record, org_id=org.org_id, object_name=object_name, record_key=record_key, is_deleted=False)


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


def access_policy_latest(*, org_id: str):
    """The org's latest ``AccessPolicyGeneration`` row, or ``None`` (the org is unrestricted)."""
    from .models import AccessPolicyGeneration

    # Read on every save and push authorization: SQL built once per model (nexusflow/kernel/rows.py).
    rows = fetch_where(AccessPolicyGeneration, {"org_id": org_id}, order="`generation` DESC", limit=1)
    if rows is None:
        return AccessPolicyGeneration.objects.filter(org_id=org_id).order_by("-generation").first()
    return rows[0] if rows else None


def access_policy(*, org_id: str):
    """The org's access policy in force (:class:`nexusflow.records.access.AccessPolicy`), or ``None``."""
    from .access import AccessPolicy

    row = access_policy_latest(org_id=org_id)
    if row is None:
        return None
    return AccessPolicy(org_id=row.org_id, generation=row.generation, digest=row.digest, document=row.document)


def access_principal(*, org_id: str, user_id: str):
    """``user_id`` under the org's access policy in force (:class:`nexusflow.records.access.Principal`).

    Without a policy: :meth:`Principal.unrestricted`.
    """
    from .access import Principal

    policy = access_policy(org_id=org_id)
    return Principal.unrestricted(user_id) if policy is None else policy.principal(user_id)


def operator_principal(*, org_id: str, login: str):
    """The access-policy principal an authenticated operator (login name) acts as in ``org_id``.

    Returns:
        ``None`` when the org has no access policy (unrestricted, as before access policies existed); else the
        :class:`nexusflow.records.access.Principal` of the user the policy's ``operators`` maps ``login`` to,
        or an undeclared principal (which may do nothing) when it maps none.
    """
    policy = access_policy(org_id=org_id)
    if policy is None:
        return None
    return policy.principal(policy.operator_user(login) or f"operator:{login}")


def record_share_in_force(*, org_id: str, object_name: str, record_key: str, user_id: str) -> str | None:
    """The access level (``read`` / ``edit``) of the share in force from a record to a user, or ``None``."""
    from .models import RecordShare

    latest = (RecordShare.objects.filter(org_id=org_id, object_name=object_name, record_key=record_key,
                                         user_id=user_id).order_by("-sequence").values_list("access", flat=True)
              .first())
    return None if latest in (None, "none") else latest


def record_access_check(*, org_id: str, user_id: str, object_name: str, record_key: str, op: str):
    """Decide whether ``user_id`` may ``op`` the live record ``object_name``/``record_key`` of ``org_id``.

    Returns:
        :class:`nexusflow.records.access.AccessDecision`.

    Raises:
        RecordNotFound: no live record with this identity in the org.
        ValueError: ``op`` is not an object operation.

    Seed 004 section 17.2 (reauthorization reads the current policy, ownership and shares).
    """
    from .access import record_access
    from .services import RecordNotFound

    record = record_get(org=OrgScope(org_id), object_name=object_name, record_key=record_key)
    if record is None:
        raise RecordNotFound(f"no live record {object_name}/{record_key}")
    principal = access_principal(org_id=org_id, user_id=user_id)
    share = record_share_in_force(org_id=org_id, object_name=object_name, record_key=record_key,
                                  user_id=user_id) if principal.restricted else None
    return record_access(principal, record, op, share=share)


def access_integration_user(*, org_id: str, account_key: str | None = None) -> str | None:
    """The user inbound application of connector account ``account_key`` runs as in ``org_id``.

    The access policy's ``integration_users[account_key]``, else its ``integration_user``; ``None`` without a
    policy or a declared integration user.
    """
    policy = access_policy(org_id=org_id)
    return None if policy is None else policy.integration_user(account_key)
