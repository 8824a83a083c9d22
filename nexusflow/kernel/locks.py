"""The one lock order (ARCHITECTURE.md section 6, "Lock order").

Stores call :func:`note` before each locking read. A transaction that takes a
lock of a lower class after a higher one raises :class:`LockOrderViolation`
instead of risking a deadlock in reverse order.
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


def note(lock_class: LockClass, using: str = "default") -> None:
    """Record that the current transaction is about to lock ``lock_class`` rows.

    Raises:
        LockOrderViolation: a higher class is already held in this transaction.
        RuntimeError: called outside a transaction (a lock would be released at once).
    """
    conn = connections[using]
    if not conn.in_atomic_block:
        raise RuntimeError("locking read outside a transaction")
    outer = id(conn.atomic_blocks[0]) if conn.atomic_blocks else None
    state = getattr(conn, "_nexus_lock_state", None)
    if state is None or state[0] != outer:
        state = (outer, 0)
    if lock_class < state[1]:
        raise LockOrderViolation(
            f"lock class {LockClass(lock_class).name} requested after {LockClass(state[1]).name}"
        )
    conn._nexus_lock_state = (outer, max(state[1], int(lock_class)))
