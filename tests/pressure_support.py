"""Real database pressure for tests (seed 004 section 16.2): statements blocked on a held row lock, idle
connections. A test waits until the database itself shows the state (``information_schema.PROCESSLIST``),
never for a time."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from django.db import connection, transaction

from nexusflow.flows.models import FlowExecutionPlan
from nexusflow.kernel import pressure

#: The longest a proven state may take to appear before the test fails (it is never waited out).
STATE_DEADLINE_SECONDS = 30.0


def until(what: str, done) -> None:
    """Poll ``done()`` until it is true; fail after :data:`STATE_DEADLINE_SECONDS` (a stuck state, not a slow one)."""
    deadline = time.monotonic() + STATE_DEADLINE_SECONDS
    while not done():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.02)


@contextmanager
def blocked_statements(row_pk: int, count: int):
    """``count`` threads each run ``SELECT ... FOR UPDATE`` of one FlowExecutionPlan row while another thread's
    open transaction holds it: ``count`` running statements on this database until the block ends."""
    held, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold():
        try:
            with transaction.atomic():
                FlowExecutionPlan.objects.select_for_update().get(pk=row_pk)
                held.set()
                release.wait(STATE_DEADLINE_SECONDS * 2)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    def wait_for_row():
        try:
            with transaction.atomic():
                FlowExecutionPlan.objects.select_for_update().get(pk=row_pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(STATE_DEADLINE_SECONDS)
    waiters = [threading.Thread(target=wait_for_row) for _ in range(count)]
    for waiter in waiters:
        waiter.start()
    try:
        until(f"{count} statements blocked", lambda: pressure.read_pressure().active_statements >= count)
        yield
    finally:
        release.set()
        for thread in (holder, *waiters):
            thread.join(STATE_DEADLINE_SECONDS)
    assert not errors, errors


@contextmanager
def idle_connections(count: int):
    """``count`` threads each hold an open, idle connection to this database for the block."""
    opened, release = threading.Semaphore(0), threading.Event()

    def idle():
        try:
            connection.ensure_connection()
            opened.release()
            release.wait(STATE_DEADLINE_SECONDS * 2)
        finally:
            connection.close()

    threads = [threading.Thread(target=idle) for _ in range(count)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert opened.acquire(timeout=STATE_DEADLINE_SECONDS)
    try:
        yield
    finally:
        release.set()
        for thread in threads:
            thread.join(STATE_DEADLINE_SECONDS)


