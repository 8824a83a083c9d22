"""The database clock (ARCHITECTURE.md section 6, "Time").

Leases, deadlines and backoff compare against the database's clock, never the
worker's, so skewed workers cannot steal or extend ownership.
"""
from __future__ import annotations

import datetime as dt

from .selectors import database_utc_timestamp


def db_now(using: str = "default") -> dt.datetime:
    """Return the database's current UTC time (microsecond precision, aware)."""
    return database_utc_timestamp(using).replace(tzinfo=dt.timezone.utc)


def db_now_plus(seconds: float, using: str = "default") -> dt.datetime:
    """Return the database clock plus ``seconds`` (may be negative)."""
    return db_now(using) + dt.timedelta(seconds=seconds)
