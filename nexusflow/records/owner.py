"""Record owner protection: the owner-conflict errors and the port to the owner's Runtime work (seed 000).

A record is the *owner* of the outbound intents authored for it. Deletion
and identity transfer (merge, conversion) must not change a record's
authority while Runtime work for it is unfinished. The records app does not
read intents itself: the Runtime answers through the port it registers in
``RuntimeOutboxConfig.ready`` (:mod:`runtime_outbox.owner` implements it):

- :func:`owner_work_check`: under the owner fence (the record row lock),
  the owner's intents locked ``FOR UPDATE NOWAIT``; unfinished work raises
  :class:`OwnerWorkPending`, an intent held by a committing result
  :class:`OwnerContended` (ARCHITECTURE.md section 6, "Lock order": the one
  sanctioned reversal is never waited on);
- :func:`owner_intents_read`: the same intents read without locks, for
  support views only.

The errors live here so that records code and its APIs can handle them
without importing the Runtime; :mod:`runtime_outbox.owner` re-exports them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.ports import Port

#: Seconds a caller is told to wait before retrying a retryable owner conflict (HTTP ``Retry-After``).
RETRY_AFTER_SECONDS = 2


class OwnerConflict(NexusError):
    """The owner record cannot change authority now; retrying later can succeed (HTTP 409 + Retry-After)."""

    code = "owner_conflict"
    retryable = True
    retry_after = RETRY_AFTER_SECONDS


class OwnerWorkPending(OwnerConflict):
    """Pending, accepted or unknown-state outbound intents exist for the owner record."""

    code = "owner_outbound_pending"

    def __init__(self, message: str = "", *, intents: tuple[OwnerIntent, ...] = (), code: str | None = None):
        super().__init__(message, code=code)
        self.intents = intents


class OwnerContended(OwnerConflict):
    """An intent of the owner is locked by a committing result right now (``FOR UPDATE NOWAIT`` refused)."""

    code = "owner_contended"


@dataclass(frozen=True)
class OwnerIntent:
    """One outbound intent of an owner record and its Runtime-derived state."""

    command_id: int
    contract_key: str
    link_key: str
    state: str  # pending | accepted | terminal | unknown


#: ``(*, org_id, object_name, record_key) -> tuple[OwnerIntent, ...]``.
OwnerIntentsFn = Callable[..., tuple[OwnerIntent, ...]]


@dataclass(frozen=True)
class OwnerWork:
    """The Runtime's answers about an owner record: ``check`` (locking, may raise) and ``read`` (no locks)."""

    check: OwnerIntentsFn
    read: OwnerIntentsFn


_OWNER_WORK: Port[OwnerWork] = Port("owner work check", provider="runtime_outbox")


def register_owner_work(*, check: OwnerIntentsFn, read: OwnerIntentsFn) -> None:
    """Install the Runtime's owner-work answers (one provider, from ``RuntimeOutboxConfig.ready``).

    Raises:
        PortAlreadyRegistered: another provider is installed.
    """
    _OWNER_WORK.register(OwnerWork(check, read))


def owner_work_check(*, org_id: str, object_name: str, record_key: str) -> tuple[OwnerIntent, ...]:
    """Refuse an authority change while the owner record has unfinished Runtime outbound work.

    Run it inside the transaction that holds the owner fence, before any
    remote link is read (seed 000, "Transfer" and deletion).

    Returns:
        The owner's intents (all terminal) for the caller's evidence.

    Raises:
        OwnerWorkPending: an intent is ``pending``, ``accepted`` or ``unknown``.
        OwnerContended: an intent row is locked by a committing result.
        PortNotRegistered: the Runtime app is not installed.
    """
    return _OWNER_WORK.get().check(org_id=org_id, object_name=object_name, record_key=record_key)


def owner_intents_read(*, org_id: str, object_name: str, record_key: str) -> tuple[OwnerIntent, ...]:
    """Every outbound intent of the owner record with its state, read without locks (support views only).

    Never decide an authority change on this read: use :func:`owner_work_check` under the owner fence.

    Raises:
        PortNotRegistered: the Runtime app is not installed.
    """
    return _OWNER_WORK.get().read(org_id=org_id, object_name=object_name, record_key=record_key)
