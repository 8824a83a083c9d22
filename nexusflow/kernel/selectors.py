"""Kernel reads that need SQL the ORM cannot say (ARCHITECTURE.md section 2, "selectors.py")."""
from __future__ import annotations

import datetime as dt

from django.db import connections


def database_utc_timestamp(using: str = "default") -> dt.datetime:
    """Return ``UTC_TIMESTAMP(6)`` of the database ``using`` as a naive datetime (microseconds).

    ARCHITECTURE.md section 6, "Time": the clock leases and deadlines compare against.

    Raises:
        django.db.DatabaseError: the database does not answer.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT UTC_TIMESTAMP(6)")
        (value,) = cursor.fetchone()
    return value
