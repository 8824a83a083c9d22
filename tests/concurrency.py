"""Real concurrent transactions in tests: a thread with its own connection, and lock-wait detection."""
from __future__ import annotations

import threading
import time

from django.db import connection, connections


def connection_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


#: What marks a locking read: exclusive (``FOR UPDATE``) or shared (``LOCK IN SHARE MODE``, the outbound
#: writes' side of the account and credential gate fences, docs/performance.md).
LOCKING_READS = ("FOR UPDATE", "LOCK IN SHARE MODE")


def wait_until_blocked_on(thread_connection_id: int, table: str, timeout: float = 60,
                          statement: str | None = None) -> None:
    """Block until the connection ``thread_connection_id`` runs a locking read of ``table``.

    The caller holds that row's lock in another transaction, so a connection
    seen inside the statement is waiting for it (a connection sees its own
    user's threads in PROCESSLIST without extra privileges). ``statement``
    is the text that marks the waiting statement: by default either locking
    read of :data:`LOCKING_READS`; ``"INSERT INTO"`` for an insert queued
    behind another transaction's uncommitted row of the same unique key.
    Fails after ``timeout``.
    """
    marks = LOCKING_READS if statement is None else (statement,)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = %s", [thread_connection_id])
            row = cursor.fetchone()
        info = (row[0] or "") if row else ""
        if table in info and any(mark in info for mark in marks):
            return
        time.sleep(0.02)
    raise AssertionError(f"connection {thread_connection_id} never waited on a lock of {table}")


def run_at_once(*targets, timeout: float = 90) -> tuple[list, list[BaseException]]:
    """Start every target at once (behind one barrier), each on its own thread and database connection.

    Args:
        targets: callables without arguments.
        timeout: seconds each thread is joined for; a thread still alive after it fails the test.

    Returns:
        ``(results, errors)``: ``results[i]`` is what ``targets[i]`` returned (``None`` if it raised);
        ``errors`` every exception raised, in the order raised.
    """
    results: list = [None] * len(targets)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = targets[i]()
        except BaseException as exc:  # reported to the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a racing thread hung"
    return results, errors


class Worker(threading.Thread):
    """Run ``fn`` on its own database connection; keep its result or exception."""

    def __init__(self, fn, name: str):
        super().__init__(name=name, daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.connection_id = None
        self.ready = threading.Event()

    def run(self):
        try:
            self.connection_id = connection_id()
            self.ready.set()
            self.result = self.fn()
        except Exception as exc:  # the test inspects it
            self.error = exc
        finally:
            self.ready.set()
            connections.close_all()


def race_behind_hold(holds, failpoint: str, held_fn, queued_fn, table: str,
                     names: tuple[str, str] = ("held", "queued"),
                     statement: str | None = None) -> tuple[Worker, Worker]:
    """Run ``held_fn`` until its transaction is held at ``failpoint``, queue ``queued_fn`` behind it, release.

    ``holds`` is the ``holds`` fixture (tests/conftest.py). The second worker
    starts only once the first is held, and the hold is released only once
    the database reports the second waiting on a row lock of ``table``: the
    two real transactions overlap in exactly that order.

    Returns:
        ``(held, queued)`` after both finished (inspect ``.result`` / ``.error``).
    """
    holds.arm(failpoint)
    held = Worker(held_fn, names[0])
    held.start()
    marker = holds.wait_held(failpoint)
    queued = Worker(queued_fn, names[1])
    queued.start()
    assert queued.ready.wait(60)
    wait_until_blocked_on(queued.connection_id, table, statement=statement)
    holds.release(marker)
    held.join(60)
    queued.join(60)
    return held, queued
