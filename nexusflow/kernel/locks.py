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
    # The level lives on the outermost Atomic object, so it ends with the transaction.
    outer = conn.atomic_blocks[0] if conn.atomic_blocks else conn
    held = getattr(outer, "_nexus_lock_level", 0)
    if lock_class < held:
        raise LockOrderViolation(f"lock class {LockClass(lock_class).name} requested after {LockClass(held).name}")
    outer._nexus_lock_level = max(held, int(lock_class))
