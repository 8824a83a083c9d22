"""What the capacity bench cases (seed 004 section 22.7) measure with, on the real MariaDB.

Structural measures first: the server's own session counters (statements,
commits, handler row reads), InnoDB's view of a live transaction (rows and
lock structures it holds), ``EXPLAIN`` / ``ANALYZE`` of the exact statement a
use case sent (captured, never rebuilt by hand), and percentiles of timings
taken side by side in one test.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

#: Session counters a :class:`Counters` block reads (``SHOW SESSION STATUS``).
COUNTERS = ("Questions", "Com_commit", "Handler_read_first", "Handler_read_key", "Handler_read_next",
            "Handler_read_prev", "Handler_read_rnd", "Handler_read_rnd_next")
#: Handler counters whose sum is the number of index/table rows a session read.
ROW_READS = ("Handler_read_first", "Handler_read_key", "Handler_read_next", "Handler_read_prev",
             "Handler_read_rnd", "Handler_read_rnd_next")


def session_status(names: Sequence[str] = COUNTERS, using: str = "default") -> dict[str, int]:
    """The current session's ``SHOW SESSION STATUS`` values of ``names`` (``{name: int}``)."""
    with connections[using].cursor() as cursor:
        marks = ", ".join(["%s"] * len(names))
        cursor.execute(f"SHOW SESSION STATUS WHERE Variable_name IN ({marks})", list(names))
        return {name: int(value) for name, value in cursor.fetchall()}


@dataclass
class Counters:
    """Deltas of the session counters over a block; ``statements`` excludes the reading statements themselves."""

    delta: dict[str, int] = field(default_factory=dict)

    @property
    def statements(self) -> int:
        return self.delta.get("Questions", 0) - 1  # the closing SHOW SESSION STATUS counts itself

    @property
    def commits(self) -> int:
        return self.delta.get("Com_commit", 0)

    @property
    def rows_read(self) -> int:
        return sum(self.delta.get(name, 0) for name in ROW_READS)


@contextmanager
def counted(using: str = "default") -> Iterator[Counters]:
    """Count the statements, commits and handler row reads the block sends on connection ``using``.

    The block must keep using this one connection (the counters are per session).
    """
    counters = Counters()
    before = session_status(using=using)
    yield counters
    after = session_status(using=using)
    counters.delta = {name: after[name] - before[name] for name in after}


def own_transaction(using: str = "default") -> dict[str, Any] | None:
    """InnoDB's row for the open transaction of connection ``using`` (``information_schema.INNODB_TRX``).

    Returns:
        ``{"rows_locked", "lock_structs", "rows_modified", "tables_locked", "seconds_open"}`` or ``None``
        when the session has no InnoDB transaction.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT trx_rows_locked, trx_lock_structs, trx_rows_modified, trx_tables_locked, "
            "TIMESTAMPDIFF(MICROSECOND, trx_started, NOW(6)) / 1e6 "
            "FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = CONNECTION_ID()")
        row = cursor.fetchone()
    if row is None:
        return None
    return {"rows_locked": int(row[0]), "lock_structs": int(row[1]), "rows_modified": int(row[2]),
            "tables_locked": int(row[3]), "seconds_open": float(row[4])}


def captured_statements(call: Callable[[], Any], using: str = "default") -> tuple[Any, list[str]]:
    """Run ``call`` and return its result and the SQL text of every statement it sent on ``using``."""
    with CaptureQueriesContext(connections[using]) as ctx:
        result = call()
    return result, [q["sql"] for q in ctx.captured_queries]


def first_statement(statements: Sequence[str], pattern: str) -> str:
    """The first captured statement matching the regular expression ``pattern`` (case-insensitive)."""
    for sql in statements:
        if re.search(pattern, sql, re.IGNORECASE | re.DOTALL):
            return sql
    raise AssertionError(f"no statement matches {pattern!r} among {len(statements)} captured")


def explain(sql: str, using: str = "default") -> list[dict[str, Any]]:
    """``EXPLAIN`` rows of one captured statement: ``[{"table", "type", "key", "rows", "Extra"}, ...]``."""
    with connections[using].cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def analyze(sql: str, using: str = "default") -> dict[str, Any]:
    """MariaDB ``ANALYZE FORMAT=JSON`` of one captured read-only statement: it runs and reports the rows
    each table access really examined (``r_rows``) beside the optimizer's estimate."""
    with connections[using].cursor() as cursor:
        cursor.execute("ANALYZE FORMAT=JSON " + sql)
        return json.loads(cursor.fetchone()[0])


def table_accesses(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``"table"`` node of an ``ANALYZE FORMAT=JSON`` plan, in plan order."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "table_name" in node and ("access_type" in node or "r_rows" in node):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


def rows_examined(plan: dict[str, Any]) -> float:
    """Rows the statement read over all its table accesses (``r_rows`` times ``r_loops``)."""
    return sum(float(t.get("r_rows") or 0) * float(t.get("r_loops") or 1) for t in table_accesses(plan))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` percentile (0-100, nearest rank) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def close_thread_connections() -> None:
    """Close this thread's database connections (a worker thread ends with this)."""
    for conn in connections.all():
        conn.close()


class TransactionLog:
    """Statements of the outermost ``atomic`` blocks a connection runs, with their start and commit times.

    Installed with :func:`transaction_log`; :meth:`mark_commit` (called inside a block, e.g. from a
    before-commit seam) registers an ``on_commit`` callback that stamps the block's end right after its
    COMMIT returned. ``closed`` then holds ``{"statements", "seconds", "sql"}`` per marked block.
    """

    def __init__(self, conn):
        self.conn = conn
        self._outer = None  # the outermost Atomic of the block being logged (held: its id is never reused)
        self._block: dict[str, Any] | None = None
        self.closed: list[dict[str, Any]] = []

    def __call__(self, execute, sql, params, many, context):
        import time

        if self.conn.in_atomic_block and self.conn.atomic_blocks:
            outer = self.conn.atomic_blocks[0]
            if outer is not self._outer:
                self._outer, self._block = outer, {"start": time.perf_counter(), "sql": []}
            self._block["sql"].append(sql)
        return execute(sql, params, many, context)

    def mark_commit(self, **extra: Any) -> None:
        """Stamp the current outermost block's end when it commits (call inside the block, after a statement)."""
        import time

        from django.db import transaction

        block = self._block
        if block is None or self.conn.atomic_blocks[0] is not self._outer:
            raise AssertionError("mark_commit outside a logged block")
        statements = len(block["sql"])

        def done() -> None:
            self.closed.append({"statements": statements, "seconds": time.perf_counter() - block["start"],
                                "sql": block["sql"][:statements], **extra})

        transaction.on_commit(done, using=self.conn.alias)


@contextmanager
def transaction_log(using: str = "default") -> Iterator[TransactionLog]:
    """Log the statements of every outermost atomic block on connection ``using`` (see :class:`TransactionLog`)."""
    conn = connections[using]
    log = TransactionLog(conn)
    with conn.execute_wrapper(log):
        yield log


def raw_session(using: str = "default"):
    """A separate MySQLdb session (autocommit off, READ COMMITTED) on the database of connection ``using``."""
    import MySQLdb

    cfg = connections[using].settings_dict
    conn = MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                           password=cfg["PASSWORD"] or "", database=cfg["NAME"], autocommit=False, charset="utf8mb4")
    cursor = conn.cursor()
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
    return conn


def _columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
                       "AND table_name = %s ORDER BY ordinal_position", [table])
        return [name for (name,) in cursor.fetchall()]


def _copy(table: str, source_where: str, source_params: list, count: int, overrides: dict[str, str]) -> None:
    columns = _columns(table)
    chosen = ", ".join(overrides.get(name, f"src.`{name}`") for name in columns)
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO `{table}` ({', '.join(f'`{c}`' for c in columns)}) SELECT {chosen} "
                       f"FROM `{table}` src JOIN seq_1_to_{int(count)} s WHERE {source_where}", source_params)


def clone_run(run_id: int, count: int) -> None:
    """Insert ``count`` copies of one run: its root, its current step and that step's dependency (if any).

    The copies differ from the original only in their ids and record key (the run key), and share its
    plan and checkpoints, so every index holds ``count`` more entries of exactly the shape the original run
    wrote. One ``INSERT ... SELECT`` per table over MariaDB's sequence engine (``seq_1_to_<count>``);
    foreign key checks are off only while the three statements run (a root names its step before the
    step row exists).
    """
    from nexusflow.flows.models import FlowDependency, FlowRun

    run = FlowRun.objects.get(pk=run_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(MAX(id), 0) FROM flows_flowrun")
        run_base = int(cursor.fetchone()[0])
        cursor.execute("SELECT COALESCE(MAX(id), 0) FROM flows_flowstepexecution")
        step_base = int(cursor.fetchone()[0])
        cursor.execute("SELECT COALESCE(MAX(id), 0) FROM flows_flowdependency")
        dependency_base = int(cursor.fetchone()[0])
        cursor.execute("SET SESSION foreign_key_checks = 0")
        try:
            _copy("flows_flowrun", "src.id = %s", [int(run.pk)], count, {
                "id": f"{run_base} + s.seq", "record_key": f"CONCAT('clone-{run_base}-', s.seq)",
                "current_step_id": f"{step_base} + s.seq"})
            _copy("flows_flowstepexecution", "src.id = %s", [int(run.current_step_id)], count, {
                "id": f"{step_base} + s.seq", "run_id": f"{run_base} + s.seq"})
            if FlowDependency.objects.filter(step_id=run.current_step_id).exists():
                _copy("flows_flowdependency", "src.step_id = %s", [int(run.current_step_id)], count, {
                    "id": f"{dependency_base} + s.seq", "run_id": f"{run_base} + s.seq",
                    "step_id": f"{step_base} + s.seq"})
        finally:
            cursor.execute("SET SESSION foreign_key_checks = 1")
