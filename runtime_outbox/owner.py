"""Runtime outbound owner protection (seed 000; ARCHITECTURE.md section 6, "Lock order").

A record is the *owner* of the outbound intents authored for it
(``OutboundCommand.source_object`` / ``source_record_key``). Deletion and
identity transfer (merge, lead conversion) must not change a record's
authority while Runtime work for it is unfinished: they read the owner's
intents and result receipts here, never Connector attempt history.

The caller holds the record's owner fence (its business-record row lock).
Result commit locks its intent *before* projecting onto the record (the one
sanctioned lock-order reversal), so owner checks read intents with
``FOR UPDATE NOWAIT``: an intent held by a committing result is a retryable
conflict (:class:`OwnerContended`), never a wait in reverse order.

This module answers the records app's owner-work port
(:func:`nexusflow.records.owner.register_owner_work`, registered in
``RuntimeOutboxConfig.ready``).

Intent states, derived from Runtime facts only:

- ``pending``: the outbox message is not delivered yet;
- ``accepted``: delivered to Connector, no result receipt yet;
- ``terminal``: a completed :class:`~runtime_outbox.models.IntentResultReceipt` exists;
- ``unknown``: anything else (no outbox message, a state this code does not
  know); it blocks like unfinished work.
"""
from __future__ import annotations

from django.db import OperationalError

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.locks import NOWAIT_LOCK_ERRORS
from nexusflow.records.owner import (
    RETRY_AFTER_SECONDS,
    OwnerConflict,
    OwnerContended,
    OwnerIntent,
    OwnerWorkPending,
)

from .messages import COMMAND_FAMILIES
from .models import IntentResultReceipt, OutboxMessage
from .store import OutboundCommandStore

#: The owner-conflict errors, :class:`OwnerIntent` and the ``NOWAIT`` error codes are defined below
#: this app (records, kernel) and importable here as before.
__all__ = [
    "NOWAIT_LOCK_ERRORS", "RETRY_AFTER_SECONDS", "OwnerConflict", "OwnerContended", "OwnerDeleted",
    "OwnerFenceMissing", "OwnerIntent", "OwnerWorkPending", "owner_before_delete", "owner_intents",
    "owner_intents_read", "owner_work_check",
]


class OwnerDeleted(NexusError):
    """The owner record's deletion is committed: new resource work for it is refused (definite, not retryable)."""

    code = "owner_deleted"
    retryable = False


class OwnerFenceMissing(NexusError):
    """Resource work was authored without holding the owner record's row lock (a programming error)."""

    code = "owner_fence_missing"
    retryable = False


_MESSAGE_STATES = {"pending": "pending", "delivered": "accepted"}


def owner_intents(*, org_id: str, object_name: str, record_key: str, nowait: bool = True) -> tuple[OwnerIntent, ...]:
    """Every outbound intent of the owner record with its state, intents locked ``FOR UPDATE NOWAIT``.

    Must run inside the transaction that holds the owner fence (the record
    row lock). The intent rows stay locked until that transaction ends, so a
    result commit cannot complete (nor a new one start) behind the caller's
    decision.

    Args:
        org_id / object_name / record_key: the owner record (trusted org).
        nowait: ``False`` only for callers that already hold no record lock.

    Returns:
        The intents in id order (terminal ones included).

    Raises:
        OwnerContended: an intent row is locked by another transaction.
        RuntimeError: called outside a transaction.
    """
    try:
        commands = OutboundCommandStore.lock_owner_intents(org_id, object_name, record_key, nowait=nowait)
    except OperationalError as exc:
        if exc.args and exc.args[0] in NOWAIT_LOCK_ERRORS:
            raise OwnerContended(f"{object_name}/{record_key}: an outbound result for this record is committing "
                                 f"now; retry") from exc
        raise
    return _with_states(org_id, commands)


def owner_intents_read(*, org_id: str, object_name: str, record_key: str) -> tuple[OwnerIntent, ...]:
    """Every outbound intent of the owner record with its state, read without locks (support views only).

    Never decide an authority change on this read: use :func:`owner_work_check` under the owner fence.
    """
    from .models import OutboundCommand

    commands = list(OutboundCommand.objects.filter(org_id=org_id, source_object=object_name,
                                                   source_record_key=record_key)
                    .order_by("id").values_list("id", "contract_key", "link_key"))
    return _with_states(org_id, commands)


def _with_states(org_id: str, commands) -> tuple[OwnerIntent, ...]:
    ids = [row[0] for row in commands]
    terminal = set(IntentResultReceipt.objects.filter(org_id=org_id, command_id__in=ids)
                   .values_list("command_id", flat=True))
    messages = dict(OutboxMessage.objects.filter(org_id=org_id, command_id__in=ids, family__in=COMMAND_FAMILIES)
                    .values_list("command_id", "state"))
    intents = []
    for command_id, contract_key, link_key in commands:
        if command_id in terminal:
            state = "terminal"
        else:
            state = _MESSAGE_STATES.get(messages.get(command_id), "unknown")
        intents.append(OwnerIntent(int(command_id), contract_key, link_key, state))
    return tuple(intents)


def owner_work_check(*, org_id: str, object_name: str, record_key: str) -> tuple[OwnerIntent, ...]:
    """Refuse an authority change while the owner record has unfinished Runtime outbound work.

    Seed 000: deletion checks every pending or accepted resource intent before
    enumerating remote links (so the first create, before any link exists,
    is covered); unknown intent states block too. Run it under the owner
    fence, before any link is read.

    Returns:
        The owner's intents (all terminal) for the caller's evidence.

    Raises:
        OwnerWorkPending: an intent is ``pending``, ``accepted`` or ``unknown``.
        OwnerContended: an intent row is locked by a committing result.
    """
    intents = owner_intents(org_id=org_id, object_name=object_name, record_key=record_key)
    open_ = tuple(intent for intent in intents if intent.state != "terminal")
    if open_:
        listed = ", ".join(f"command {i.command_id} ({i.state})" for i in open_[:5])
        raise OwnerWorkPending(f"{object_name}/{record_key} has unfinished outbound work: {listed}; retry once it "
                               f"completes", intents=open_)
    return intents


def owner_before_delete(*, org, record) -> None:
    """The installed record-deletion hook of Runtime: refuse while the record has unfinished outbound work.

    Registered in ``RuntimeOutboxConfig.ready`` at stage
    ``DELETE_STAGE_OWNER_WORK``, so it runs under the record lock before any
    remote link is enumerated (seed 000: the first create before any link
    exists is covered; unknown intent states block).

    Raises:
        OwnerWorkPending: a pending, accepted or unknown-state intent exists.
        OwnerContended: an intent of the record is locked by a committing result.
    """
    owner_work_check(org_id=org.org_id, object_name=record.object_name, record_key=record.record_key)
