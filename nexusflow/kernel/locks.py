"""The one lock order (ARCHITECTURE.md section 6, "Lock order").

Stores call :func:`note` before each locking read. The order is
``(lock class, rank)``: the platform classes below, and inside one class an
owner's sub-order (for example seed 004 section 12: Flow root -> steps ->
attempts -> dependencies -> signals). A transaction that asks for a lower
position after a higher one raises :class:`LockOrderViolation` instead of
risking a deadlock in reverse order.
"""
from __future__ import annotations

import enum

from django.db import connections

from .errors import LockOrderViolation


class LockClass(enum.IntEnum):
    BUSINESS_RECORD = 1
    HISTORY_SEQUENCE = 2
    FLOW_LIFECYCLE = 3
    SERVING_GATE = 4
    CONNECTOR_WORK = 5
    RUNTIME = 6


def _transaction_holder(conn):
    """The outermost real Atomic of the connection (a test case's wrapping block is skipped)."""
    blocks = [b for b in conn.atomic_blocks if not getattr(b, "_from_testcase", False)]
    return (blocks or conn.atomic_blocks or [conn])[0]


def note(lock_class: LockClass, using: str = "default", *, rank: int = 0, label: str = "") -> None:
    """Record that the current transaction is about to lock rows at ``(lock_class, rank)``.

    Args:
        lock_class: the platform lock class.
        rank: position inside the class's own sub-order (0 when it has none).
        label: name of the locked row kind, for the error message.

    Raises:
        LockOrderViolation: a higher position is already held in this transaction.
        RuntimeError: called outside a transaction (a lock would be released at once).
    """
    conn = connections[using]
    if not conn.in_atomic_block:
        raise RuntimeError("locking read outside a transaction")
    # The position lives on the transaction's outermost Atomic, so it ends with it.
    holder = _transaction_holder(conn)
    held = getattr(holder, "_nexus_lock_position", (0, 0, ""))
    wanted = (int(lock_class), rank, label)
    if wanted[:2] < held[:2]:
        raise LockOrderViolation(
            f"lock {LockClass(lock_class).name}/{label or rank} requested after "
            f"{LockClass(held[0]).name}/{held[2] or held[1]}"
        )
    if wanted[:2] > held[:2]:
        holder._nexus_lock_position = wanted
