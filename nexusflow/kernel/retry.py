"""Re-run a whole transaction that the database chose as a deadlock victim (ARCHITECTURE.md section 6, "Lock order").

Every transaction takes its row locks in the one lock order, yet InnoDB can
still pick a victim where the order cannot reach: the shared locks that a
foreign-key check takes on a parent row while another transaction holds it,
or a gap lock on an index range. The victim's whole transaction was rolled
back, so nothing it did is visible and running it again from the start is
safe. :func:`retry_deadlock_victim` does exactly that for a function that
opens its own durable transaction; it never retries inside a caller's
transaction, where only the statement, not the work, would be repeated.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, connection

log = logging.getLogger(__name__)

T = TypeVar("T")

#: MariaDB error codes of a transaction the server rolled back whole: deadlock victim, lock wait timeout
#: (``innodb_rollback_on_timeout`` is off, but the durable block's exit rolls the rest back).
VICTIM_CODES = (1213, 1205)
#: Runs of the function in all, the first included.
DEFAULT_ATTEMPTS = 5


def retry_deadlock_victim(fn: Callable[..., T] | None = None, *, attempts: int = DEFAULT_ATTEMPTS):
    """Decorate ``fn`` (which opens a durable transaction) to run again when chosen as a deadlock victim.

    Raises:
        RuntimeError: called inside a transaction (the retry would repeat only part of the work).
        OperationalError: the last attempt's error, or any other database error at once.
    """
    def wrap(func: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(func)
        def run(*args, **kwargs) -> T:
            if connection.in_atomic_block:
                raise RuntimeError(f"{func.__qualname__} retries whole transactions; call it outside one")
            for attempt in range(1, attempts + 1):
                try:
                    return func(*args, **kwargs)
                except OperationalError as exc:
                    if not exc.args or exc.args[0] not in VICTIM_CODES or attempt == attempts:
                        raise
                    log.info("%s was a deadlock victim (attempt %d of %d); running it again",
                             func.__qualname__, attempt, attempts)
            raise AssertionError("unreachable")

        return run

    return wrap(fn) if fn is not None else wrap
