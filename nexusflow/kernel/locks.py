"""The one lock order (ARCHITECTURE.md section 6 "Lock order"; seed 004 sections 13.1-13.2).

Every transaction locks rows in one total order, whichever apps it touches:
``(lock class, rank, resource key)``. The classes are the platform order
below; ``rank`` is an owner's sub-order inside its class (Flow root -> steps
-> attempts -> dependencies -> signals; gate -> epoch -> credential gate;
lane -> projection/window -> execution -> effect -> permit); the resource key
orders rows of the same kind.

Two ways in:

- :func:`acquire` takes a declared resource set, sorts it with the one
  comparator and locks it in that order (use it whenever a transaction knows
  several rows up front);
- :func:`note` is called by every single-row locking read (``CasStore.lock``)
  and refuses a position lower than one already held.

A reversal is a programming error. With ``settings.NEXUS_LOCK_ORDER ==
"raise"`` (tests, ``NEXUS_DEBUG=1``) it raises :class:`LockOrderViolation`;
otherwise (production) it is logged at ERROR with the stack and counted, and
the lock proceeds, because refusing would turn a latent deadlock risk into a
certain outage.

The one sanctioned reversal (seed 000, result commit: an intent is locked
before the record it projects onto) is declared with :func:`result_commit`;
it lets exactly one following business-record lock pass and nothing else.
"""
from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connections

from .errors import LockOrderViolation

log = logging.getLogger("nexusflow.locks")

#: Version of the comparator below; a change is a persistence decision (seed 004 section 13.1).
ORDERING_VERSION = 1

#: Server errors a ``NOWAIT`` locking read raises when a row is held: MariaDB 1205, MySQL/TiDB 3572.
#: A caller that reads ``FOR UPDATE NOWAIT`` to avoid a reverse wait maps them to a retryable conflict.
NOWAIT_LOCK_ERRORS = frozenset({1205, 3572})


class LockClass(enum.IntEnum):
    BUSINESS_RECORD = 1
    HISTORY_SEQUENCE = 2
    FLOW_LIFECYCLE = 3
    SERVING_GATE = 4
    CONNECTOR_WORK = 5
    RUNTIME = 6


#: Reversals seen while running in log mode (for the operator's metrics page).
violations_logged = 0


def _transaction_holder(conn):
    """The outermost real Atomic of the connection (a test case's wrapping block is skipped)."""
    blocks = [b for b in conn.atomic_blocks if not getattr(b, "_from_testcase", False)]
    return (blocks or conn.atomic_blocks or [conn])[0]


def _refuse(message: str) -> None:
    global violations_logged
    if getattr(settings, "NEXUS_LOCK_ORDER", "log") == "raise":
        raise LockOrderViolation(message)
    violations_logged += 1
    log.error("lock order violation: %s", message, stack_info=True)


def note(lock_class: LockClass, using: str = "default", *, rank: int = 0, label: str = "",
         key: tuple | None = None, nowait: bool = False) -> None:
    """Record that the current transaction is about to lock rows at ``(lock_class, rank)``.

    Args:
        lock_class: the platform lock class.
        using: database alias of the transaction.
        rank: position inside the class's own sub-order (0 when it has none).
        label: name of the locked row kind, for the error message.
        key: the row's resource key, when one row is locked; inside one
            ``(class, rank)`` keys must come in ascending order too.

    Raises:
        LockOrderViolation: a higher position (or, at the same position, a
            higher key) is already held in this transaction and the order
            mode is ``raise``.
        RuntimeError: called outside a transaction (a lock would be released at once).

    A ``nowait`` locking read (``FOR UPDATE NOWAIT``) below the held position
    is allowed and leaves the position as it is: it never waits, so it cannot
    close a wait cycle; the caller maps its refusal to a retryable conflict
    (seed 000, the record-owner checks after a held intent).
    """
    conn = connections[using]
    if not conn.in_atomic_block:
        raise RuntimeError("locking read outside a transaction")
    # The position lives on the transaction's outermost Atomic, so it ends with it.
    holder = _transaction_holder(conn)
    held = getattr(holder, "_nexus_lock_position", (0, 0, "", None))
    wanted = (int(lock_class), rank, label, _sortable(key))
    allowance = getattr(holder, "_nexus_result_commit", None)
    if allowance is not None:
        # Seed 000 result commit: the intent is held; only the record it projects onto may come next.
        holder._nexus_result_commit = None
        if lock_class == LockClass.BUSINESS_RECORD and held[:2] == allowance:
            holder._nexus_lock_position = wanted
            return
    if nowait and (wanted[:2] < held[:2] or (wanted[:2] == held[:2] and wanted[3] is not None
                                             and held[3] is not None and wanted[3] < held[3])):
        return
    if wanted[:2] < held[:2]:
        _refuse(f"lock {LockClass(lock_class).name}/{label or rank} requested after "
                f"{LockClass(held[0]).name}/{held[2] or held[1]}")
        return
    if wanted[:2] == held[:2] and wanted[3] is not None and held[3] is not None and wanted[3] < held[3]:
        _refuse(f"lock {LockClass(lock_class).name}/{label or rank} key {key!r} requested after a higher key")
        return
    if wanted[:2] > held[:2] or wanted[3] is not None:
        holder._nexus_lock_position = wanted


@contextlib.contextmanager
def result_commit(lock_intent: Callable[[], Any], *, using: str = "default", label: str = "OutboundCommand"):
    """Lock a Runtime intent first, then let the one following business-record lock pass (seed 000).

    Seed 000 "Result commit locks its intent before local record projection";
    ARCHITECTURE.md section 6 names it the one sanctioned lock-order reversal.
    Record-owner checks (deletion, identity transfer) read intents with
    ``FOR UPDATE NOWAIT``, so they never wait in the reverse order.

    Usage::

        with transaction.atomic(durable=True):
            with locks.result_commit(lambda: OutboundCommandStore.lock(org_id, pk)) as intent:
                record = record_lock(...)    # allowed once, right after the intent
            ...                              # the usual order from the record on

    Args:
        lock_intent: takes the intent row lock and returns the row (it may
            call :func:`note` with the RUNTIME class).
        using: database alias of the transaction.

    Yields:
        The locked intent row.

    Raises:
        LockOrderViolation: the transaction already holds another lock (the
            intent must be its first lock), or anything other than a
            business-record lock follows the intent (mode ``raise``).
        RuntimeError: called outside a transaction.
    """
    conn = connections[using]
    if not conn.in_atomic_block:
        raise RuntimeError("result commit outside a transaction")
    holder = _transaction_holder(conn)
    held = getattr(holder, "_nexus_lock_position", (0, 0, "", None))
    if held[:2] != (0, 0):
        _refuse(f"result commit {label} requested after {LockClass(held[0]).name}/{held[2] or held[1]}: "
                f"the intent must be the transaction's first lock")
    row = lock_intent()
    note(LockClass.RUNTIME, using, label=label)
    position = getattr(holder, "_nexus_lock_position", (0, 0, "", None))
    holder._nexus_result_commit = position[:2]
    try:
        yield row
    finally:
        # Unused or used, the allowance ends with the block: no later reversal is excused.
        holder._nexus_result_commit = None


def mark_held(namespace: str, key: tuple, using: str = "default") -> None:
    """Remember that the current transaction holds the row ``(namespace, key)`` (an owner fence)."""
    holder = _transaction_holder(connections[using])
    held = getattr(holder, "_nexus_held_rows", None)
    if held is None:
        held = holder._nexus_held_rows = set()
    held.add((namespace, tuple(key)))


def remember(namespace: str, key: tuple, value, using: str = "default") -> None:
    """Keep ``value`` under ``(namespace, key)`` until the current transaction ends (e.g. a reserved number)."""
    holder = _transaction_holder(connections[using])
    kept = getattr(holder, "_nexus_kept", None)
    if kept is None:
        kept = holder._nexus_kept = {}
    kept[(namespace, tuple(key))] = value


def recall(namespace: str, key: tuple, *, pop: bool = False, using: str = "default"):
    """The value :func:`remember` kept under ``(namespace, key)`` in the current transaction (``None``: none)."""
    conn = connections[using]
    if not conn.in_atomic_block:
        return None
    kept = getattr(_transaction_holder(conn), "_nexus_kept", {})
    return kept.pop((namespace, tuple(key)), None) if pop else kept.get((namespace, tuple(key)))


def is_held(namespace: str, key: tuple, using: str = "default") -> bool:
    """Whether :func:`mark_held` recorded ``(namespace, key)`` in the current transaction."""
    conn = connections[using]
    if not conn.in_atomic_block:
        return False
    return (namespace, tuple(key)) in getattr(_transaction_holder(conn), "_nexus_held_rows", set())


def _sortable(key: tuple | None):
    return None if key is None else tuple(_key_bytes(part) for part in key)


@dataclass(frozen=True)
class Resource:
    """One row to lock, declared before any lock is taken (seed 004 section 13.2).

    Attributes:
        lock_class / rank / label: the row kind's position in the one order.
        namespace: object or namespace identity, e.g. ``"connectors.RemoteEffect"``.
        key: stable identity inside the namespace (org id, then the row key).
        partition: optional partition identity.
        using: database alias whose transaction holds the lock.
        locker: ``locker() -> row`` takes the lock; it runs inside the transaction.
    """

    lock_class: LockClass
    rank: int
    namespace: str
    key: tuple[Any, ...]
    locker: Callable[[], Any] = field(compare=False, hash=False, repr=False)
    partition: str = ""
    label: str = ""
    using: str = "default"

    def sort_key(self) -> tuple:
        """The one comparator: class, rank, namespace, key, partition, all byte-exact."""
        return (int(self.lock_class), self.rank, self.namespace.encode("utf-8"),
                tuple(_key_bytes(part) for part in self.key), self.partition.encode("utf-8"), ORDERING_VERSION)


def _key_bytes(part: Any) -> tuple[int, bytes]:
    # Integers sort numerically, text byte-wise (utf8mb4_bin); a type tag keeps mixed keys total.
    if isinstance(part, bool) or not isinstance(part, (int, str, bytes)):
        raise TypeError(f"resource key part {part!r} is not int, str or bytes")
    if isinstance(part, int):
        return (0, part.to_bytes(9, "big", signed=True))
    return (1, part.encode("utf-8") if isinstance(part, str) else bytes(part))


def store_resource(store, org_id: str, pk: int, *, nowait: bool = False) -> Resource:
    """Declare the row ``(org_id, pk)`` of a CAS store (``store.lock`` takes the lock)."""
    model = store.model
    return Resource(store.lock_class, store.lock_rank, f"{model._meta.app_label}.{model.__name__}",
                    (org_id, int(pk)), lambda: store.lock(org_id, pk, nowait=nowait), label=store.lock_label,
                    using=store.db())


def acquire(resources: Iterable[Resource]) -> list[Any]:
    """Lock every declared resource in the one canonical order; return rows in declaration order.

    Duplicates are locked once. Must run inside ``transaction.atomic``; the
    usual :func:`note` check still applies against locks already held.

    Raises:
        LockOrderViolation: the set starts below a position already held
            (mode ``raise``).
        Model.DoesNotExist / django.db.OperationalError: as the lockers raise.
    """
    declared = list(resources)
    rows: dict[tuple, Any] = {}
    for resource in sorted(declared, key=Resource.sort_key):
        if resource.sort_key() not in rows:
            note(resource.lock_class, resource.using, rank=resource.rank, label=resource.label)
            rows[resource.sort_key()] = resource.locker()
    return [rows[r.sort_key()] for r in declared]
