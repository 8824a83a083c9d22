"""The database clock as tests move it: an offset on every ``db_now()``, never a real wait.

ARCHITECTURE.md section 6, "Time": leases, deadlines and backoff compare
against the database clock (``nexusflow.kernel.clock.db_now``, which reads
``UTC_TIMESTAMP(6)``). A test that needs one of them to pass moves that clock
forward with the ``db_clock_advance`` fixture (tests/conftest.py) instead of
sleeping. The offset applies to every thread of the test process and to every
child process started with ``subprocess_env()`` after the move (their settings
module, :data:`SETTINGS_MODULE`, installs the same offset at start-up).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from nexusflow.kernel import clock

#: The child processes' offset in seconds.
OFFSET_ENV = "NEXUS_TEST_DB_CLOCK_OFFSET_SECONDS"
#: The settings module of a child process whose test moved the clock.
SETTINGS_MODULE = "tests.db_clock_settings"


class ShiftedClock:
    """``database_utc_timestamp(using)`` plus ``offset`` seconds (``offset`` only grows)."""

    def __init__(self, real: Callable[[str], dt.datetime], offset: float = 0.0):
        self.real = real
        self.offset = offset

    def __call__(self, using: str = "default") -> dt.datetime:
        return self.real(using) + dt.timedelta(seconds=self.offset)

    def child_env(self) -> dict[str, str]:
        """The environment a child process needs to read this clock (empty while not moved)."""
        if not self.offset:
            return {}
        return {"DJANGO_SETTINGS_MODULE": SETTINGS_MODULE, OFFSET_ENV: repr(self.offset)}


def install(offset: float) -> None:
    """Make ``db_now()`` of this process read the database clock plus ``offset`` seconds (a child's start-up)."""
    clock.database_utc_timestamp = ShiftedClock(clock.database_utc_timestamp, offset)
