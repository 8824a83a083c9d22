"""The database clock (ARCHITECTURE.md section 6, "Time").

Leases, deadlines and backoff compare against the database's clock, never the
worker's, so skewed workers cannot steal or extend ownership.
"""
from __future__ import annotations

import datetime as dt

from .selectors import database_utc_timestamp, database_utc_timestamp_sql


def db_now(using: str = "default") -> dt.datetime:
    """Return the database's current UTC time (microsecond precision, aware)."""
    return database_utc_timestamp(using).replace(tzinfo=dt.UTC)


def db_now_plus(seconds: float, using: str = "default") -> dt.datetime:
    """Return the database clock plus ``seconds`` (may be negative)."""
    return db_now(using) + dt.timedelta(seconds=seconds)


def db_clock_offset_seconds() -> float:
    """Seconds the process's database clock reads ahead of ``UTC_TIMESTAMP(6)`` (0 unless a test moved it:
    tests/db_clock.py wraps :func:`database_utc_timestamp` in clocks that carry an ``offset``)."""
    total, reader = 0.0, database_utc_timestamp
    while hasattr(reader, "offset"):
        total += float(reader.offset)
        reader = getattr(reader, "real", None)
    return total


def db_now_sql():
    """The database clock as an SQL expression (``UTC_TIMESTAMP(6)``, plus the offset :func:`db_now` adds):
    a query or a locking read that compares against the clock reads it in the same statement, one round
    trip fewer than a :func:`db_now` before it."""
    return database_utc_timestamp_sql(round(db_clock_offset_seconds() * 1_000_000))
