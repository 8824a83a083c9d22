"""Who a Flow run acts as, and the reauthorization of every durable step (seed 004 sections 17.1, 17.2).

A run stores, at admission (:func:`run_identity`):

- ``principal_mode``: ``system`` (record-triggered and scheduled Flows run in system context);
- ``execution_principal``: the declared system identity the run acts as (the access policy's user
  ``automated_process``; :data:`nexusflow.records.authority.AUTOMATED_PROCESS_USER`);
- ``initiating_principal``: who caused the run, when known: the policy user a save was made for
  (:data:`nexusflow.records.access.ACTING_PRINCIPAL`: an operator over REST, an account's integration user);
  the run whose own save admitted it passes its initiator on; otherwise empty;
- ``authorization_digest``: the digest of the access-policy generation in force at admission (``""``: the org
  has no access policy and is unrestricted).

Never a session cookie, token or password.

**Declared identity** (proof S004-22.6-09): activation of a Flow in an org with an access policy is refused
(``flow_system_identity_undeclared``) unless the policy declares the system identity as an active user: a
system-mode step never runs as an identity nobody declared.

**Reauthorization** (proofs S004-22.6-07, S004-22.6-08): every step that reads or writes records decides its
reads (the object's ``read`` for each object a Get Records or relationship path read) and writes again, under the access policy in force when the step runs (not the one the run was admitted under), as the
run's execution principal: object permission (create / edit / delete), field-level security (edit on every
field written) and record access (edit / delete of each locked record: ownership, shares, the org-wide
default, or ``modify_all``). A principal the policy no longer declares or marks inactive fails the step
``flow_principal_disabled``; any other refusal ``flow_access_denied``. Both are definite: nothing the step
would have written commits, and the run ends ``TerminalFailed`` with that reason code (the versioned policy of
this engine generation: terminal failure; a fault path or a handoff to another identity is not offered).
Without an access policy every decision allows, as before access policies existed.
"""
from __future__ import annotations

from typing import Any

from nexusflow.flows.errors import FlowExecutionError

SYSTEM_MODE = "system"


class FlowAccessDenied(FlowExecutionError):
    """The run's execution principal may not make a step's writes now (``flow_access_denied``) or is no longer
    an active declared user (``flow_principal_disabled``); definite, nothing commits."""

    code = "flow_access_denied"


def system_identity() -> str:
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER

    return AUTOMATED_PROCESS_USER


def run_identity(*, org_id: str, initiating_principal: str = "") -> dict[str, str]:
    """The identity columns of a run admitted now in ``org_id`` (see the module docstring)."""
    from nexusflow.records.selectors import access_policy

    policy = access_policy(org_id=org_id)
    return {"principal_mode": SYSTEM_MODE, "execution_principal": system_identity(),
            "initiating_principal": initiating_principal or "",
            "authorization_digest": "" if policy is None else policy.digest}


def system_identity_refusal(*, org_id: str) -> str | None:
    """Why a system-mode Flow may not be activated in ``org_id`` now, or ``None`` (S004-22.6-09)."""
    from nexusflow.records.selectors import access_principal

    principal = access_principal(org_id=org_id, user_id=system_identity())
    if not principal.restricted or (principal.known and principal.active):
        return None
    state = "declares no user" if not principal.known else "marks the user inactive"
    return (f"the access policy in force {state} {system_identity()!r}, the system identity Flows run as: declare "
            "it as an active user with the permission sets its Flows need")


def reauthorize_step(*, org_id: str, principal_id: str, writes: list, locked: dict[tuple[str, str], Any],
                     objects_read: set[str] = frozenset()) -> str:
    """Decide a step's record reads and ``writes`` again as ``principal_id`` under the policy in force now.

    Args:
        writes: the step outcome's writes (``op``, ``object_name``, ``record_key``, ``values``).
        locked: the step's locked business records by ``(object, record key)``.
        objects_read: the objects the step read records of (Get Records, relationship paths): each needs the
            object's ``read``.

    Returns:
        The authorization-context digest the decision was made under (``""`` unrestricted).

    Raises:
        FlowAccessDenied: ``flow_principal_disabled`` or ``flow_access_denied`` (see the module docstring).
    """
    from nexusflow.records.access import CREATE, DELETE, EDIT, READ, field_access, object_access, record_access
    from nexusflow.records.selectors import access_principal, record_share_in_force

    principal = access_principal(org_id=org_id, user_id=principal_id)
    if not principal.restricted:
        return ""
    if not (principal.known and principal.active):
        raise FlowAccessDenied(f"the run's principal {principal_id!r} is no longer an active user of the access "
                               "policy in force", code="flow_principal_disabled")
    for object_name in sorted(objects_read):
        decision = object_access(principal, object_name, READ)
        if not decision.allowed:
            raise FlowAccessDenied(f"{principal_id} may not read {object_name} records ({decision.basis})")
    for write in writes:
        op = {"update": EDIT, "delete": DELETE, "create": CREATE}[write.op]
        decision = object_access(principal, write.object_name, op)
        if not decision.allowed:
            raise FlowAccessDenied(f"{principal_id} may not {op} {write.object_name} records ({decision.basis})")
        if write.op in ("update", "create") and write.values:
            fields = field_access(principal, write.object_name, sorted(write.values), EDIT)
            if fields.denied:
                raise FlowAccessDenied(f"{principal_id} may not edit {write.object_name} field(s) "
                                       f"{', '.join(sorted(fields.denied))} (field-level security)")
        record = locked.get((write.object_name, write.record_key)) if write.op != "create" else None
        if record is not None:
            share = record_share_in_force(org_id=org_id, object_name=write.object_name,
                                          record_key=write.record_key, user_id=principal_id)
            access = record_access(principal, record, op, share=share)
            if not access.allowed:
                raise FlowAccessDenied(f"{principal_id} may not {op} {write.object_name} record {write.record_key} "
                                       f"({access.basis})")
    return principal.context_digest
