"""Kernel reads that need SQL the ORM cannot say (ARCHITECTURE.md section 2, "selectors.py")."""
from __future__ import annotations

import datetime as dt
from collections import defaultdict

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


def database_utc_timestamp_sql(offset_microseconds: int = 0):
    """``UTC_TIMESTAMP(6)`` (plus ``offset_microseconds``) as a query expression (a ``DateTimeField``): the
    clock of :func:`database_utc_timestamp`, read by the statement that uses it."""
    from django.db.models import DateTimeField
    from django.db.models.expressions import RawSQL

    if offset_microseconds:
        return RawSQL("UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND", [int(offset_microseconds)],
                      output_field=DateTimeField())
    return RawSQL("UTC_TIMESTAMP(6)", [], output_field=DateTimeField())


def live_foreign_key_names(connection, table: str) -> set[str]:
    """Names of the table's foreign key constraints (InnoDB backs each with an index of the same name)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS WHERE "
                       "CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = %s AND CONSTRAINT_TYPE = 'FOREIGN KEY'",
                       [table])
        return {row[0] for row in cursor.fetchall()}


def live_indexes(connection, table: str) -> dict[str, tuple[tuple[str, ...], bool]] | None:
    """``{index name: ((column or "column DESC", ...), unique)}`` of ``table`` from
    ``information_schema.STATISTICS``, columns in index order; ``None`` when the table does not exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME, COLLATION FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX", [table])
        rows = cursor.fetchall()
        if not rows:
            cursor.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                           "AND TABLE_NAME = %s", [table])
            if not cursor.fetchone()[0]:
                return None
    columns: dict[str, list[str]] = defaultdict(list)
    unique: dict[str, bool] = {}
    for name, non_unique, column, collation in rows:
        columns[name].append(f"{column} DESC" if collation == "D" else column)
        unique[name] = not int(non_unique)
    return {name: (tuple(cols), unique[name]) for name, cols in columns.items()}


def database_load(using: str = "default") -> tuple[int, int, int]:
    """This account's load on the database ``using``: ``(connections, active statements, max_connections)``.

    ``connections`` are the sessions open on this database (``information_schema.PROCESSLIST``, which
    shows an account without the PROCESS privilege its own sessions: the application's), ``active
    statements`` those of them running a statement now (lock waits included), both without the
    reading session itself; ``max_connections`` is the server's bound (0 where there is none, as on
    TiDB). Seed 004 section 16.2's "active mutation transactions" and "connection-pool saturation".
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*), COALESCE(SUM(COMMAND NOT IN ('Sleep', 'Daemon', 'Binlog Dump')), 0), "
            "@@max_connections FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()")
        count, active, bound = cursor.fetchone()
    return int(count), int(active), int(bound or 0)


#: The server status counters :func:`database_status` reads (MariaDB/MySQL names; absent ones read 0).
STATUS_COUNTERS = ("Innodb_row_lock_current_waits", "Innodb_row_lock_waits", "Innodb_deadlocks",
                   "Threads_connected", "Threads_running")


def database_status(using: str = "default") -> dict[str, int]:
    """The server's lock and session counters: ``{counter: value}`` for :data:`STATUS_COUNTERS`.

    ``Innodb_row_lock_current_waits`` (transactions waiting for a row lock now), ``Innodb_row_lock_waits``
    and ``Innodb_deadlocks`` (totals since start), ``Threads_connected`` / ``Threads_running`` (every
    account's sessions). A server without one of them (TiDB has no InnoDB counters) reads 0 for it. Seed
    004 section 16.2's lock-wait and deadlock signals.
    """
    placeholders = ", ".join(["%s"] * len(STATUS_COUNTERS))
    with connections[using].cursor() as cursor:
        cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({placeholders})", list(STATUS_COUNTERS))
        found = {name: value for name, value in cursor.fetchall()}
    out = {}
    for name in STATUS_COUNTERS:
        try:
            out[name] = int(found.get(name) or 0)
        except (TypeError, ValueError):
            out[name] = 0
    return out


def reason_rows(model, states, since: str | None) -> list[tuple[str, str, int, dt.datetime | None]]:
    """Rows of ``model`` (all orgs) in ``states`` by state and reason code: ``(state, reason_code, rows, oldest)``.

    ``oldest`` is the smallest ``since`` column of the group (``None`` when ``since`` is ``None``). Rows with an
    empty ``reason_code`` are left out (the CHECK constraint keeps reason-required states from having one).
    Read by ``nexusflow.kernel.metrics.reason_families`` (seed 003, "Operational liveness").
    """
    from django.db.models import Count, Min

    aggregates = {"rows": Count("pk")}
    if since is not None:
        aggregates["oldest"] = Min(since)
    qs = (model.objects.filter(state__in=sorted(states)).exclude(reason_code="")
          .values("state", "reason_code").annotate(**aggregates).order_by("state", "reason_code"))
    return [(r["state"], r["reason_code"], int(r["rows"]), r.get("oldest")) for r in qs]
