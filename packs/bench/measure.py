"""What every series of ``make bench`` measures with: worker processes, the server's counters, spans and percentiles.

:mod:`packs.bench.run` (the floor, django-q2, Flow runs and the report),
:mod:`packs.bench.inbound` (webhook events) and :mod:`packs.bench.history`
(retained history) share these, so a point is measured the same way in
every series.
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import MySQLdb
from django.conf import settings

from packs.demo.run import Processes

ROOT = Path(settings.BASE_DIR)
#: Where a run writes its logs, port files and report: ``var/bench``, or ``NEXUS_BENCH_DIR`` (two runs side by
#: side, each with its own ``NEXUS_DB_URL`` database name, then do not share files).
RUN_DIR = Path(os.environ.get("NEXUS_BENCH_DIR") or ROOT / "var" / "bench").resolve()
WORKER_COUNTS = (1, 2, 4)
#: No series point may take longer than this (seconds); it then fails the run instead of hanging.
POINT_TIMEOUT_SECONDS = 240.0


class BenchError(Exception):
    """The benchmark could not run (a process or set-up step failed, a series did not finish)."""


def connect(cfg: dict, name: str | None):
    """A MySQLdb connection (autocommit off) to database ``name`` (``None``: no default database) of the server
    of ``cfg`` (a DATABASES entry)."""
    extra = {} if name is None else {"database": name}
    return MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                           password=cfg["PASSWORD"], autocommit=False, **extra)


def server_counters(cfg: dict) -> dict[str, int]:
    """The server's global ``Com_commit`` and ``Questions`` counters now: ``{"Com_commit": int, "Questions": int}``."""
    conn = connect(cfg, None)  # the application account may not use the server's own `mysql` database
    try:
        cursor = conn.cursor()
        cursor.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Questions')")
        return {name: int(value) for name, value in cursor.fetchall()}
    finally:
        conn.close()


def wait_for(what: str, done: Callable[[], bool], procs: Processes, *, progress: Callable[[], Any] | None = None,
             stall_seconds: float = 0.0) -> bool:
    """Poll ``done()`` every 0.2 s until it is true; return ``True`` then.

    With ``progress`` (a ``() -> value`` that changes while work moves on),
    return ``False`` instead once its value stayed the same for
    ``stall_seconds``: the rest is stuck, and the caller counts what finished.

    Raises:
        BenchError: a process of ``procs`` exited (its log is ``var/bench/<name>.log``) or
            :data:`POINT_TIMEOUT_SECONDS` passed first; ``what`` names the awaited outcome.
    """
    began = time.monotonic()
    last, moved = None, began
    while not done():
        for name, proc in procs.procs:
            if proc.poll() not in (None, 0):
                raise BenchError(f"{name} exited with {proc.returncode} before {what} (var/bench/{name}.log)")
        now = time.monotonic()
        if now - began > POINT_TIMEOUT_SECONDS:
            raise BenchError(f"{what} did not happen within {POINT_TIMEOUT_SECONDS:.0f} s")
        if progress is not None:
            value = progress()
            if value != last:
                last, moved = value, now
            elif now - moved > stall_seconds:
                return False
        time.sleep(0.2)
    return True


def point(n: int, units: int, span: float, counters_before: dict, counters_after: dict,
          **extra: Any) -> dict[str, Any]:
    """One series point: ``units`` over ``span`` seconds with ``n`` worker processes (per role).

    Returns ``{"workers", "units", "seconds", "per_second", "commits_per_unit", "statements_per_unit",
    **extra}``; the per-unit figures are the :func:`server_counters` deltas divided by ``units`` (0 units: 0).
    """
    per = (lambda key: (counters_after[key] - counters_before[key]) / units) if units else (lambda key: 0.0)
    return {"workers": n, "units": units, "seconds": span, "per_second": units / span if span > 0 else 0.0,
            "commits_per_unit": per("Com_commit"), "statements_per_unit": per("Questions"), **extra}


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """``p50``/``p95``/``p99`` of ``values`` (nearest rank; an empty list gives zeros)."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    return {f"p{q}": ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]
            for q in (50, 95, 99)}


def latency_ms(values_ms: Sequence[float]) -> dict[str, float]:
    """``{"p50_ms", "p95_ms", "p99_ms"}`` of latencies given in milliseconds (see :func:`percentiles`)."""
    return {f"{k}_ms": v for k, v in percentiles(values_ms).items()}


def open_loop(count: int, rate: float, send: Callable[[int], None]) -> None:
    """Call ``send(i)`` for ``i`` in ``range(count)`` at ``i / rate`` seconds after the first call.

    An open-loop arrival: a call that falls behind its time is made at once,
    never skipped, and a slow call does not push the later times back.
    """
    begin = time.monotonic()
    for i in range(count):
        pause = begin + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        send(i)


@contextmanager
def workers(roles: Sequence[str], n: int, label: str, env: dict) -> Iterator[Processes]:
    """``n`` ``run_workers --role R`` processes for each R of ``roles``, stopped on exit.

    Logs go to ``var/bench/<label>-<role>-<i>.log``.
    """
    procs = Processes()
    try:
        for role in roles:
            for i in range(n):
                procs.start(f"{label}-{role}-{i}", [sys.executable, "manage.py", "run_workers", "--role", role], env,
                            RUN_DIR)
        yield procs
    finally:
        procs.stop_all()


def workers_started(procs: Processes) -> bool:
    """Every process of ``procs`` (started by :func:`workers`) logged its ``worker.start`` line in
    ``RUN_DIR/<name>.log``: past its start-up, claiming. A latency point starts its clock only then."""
    for name, _proc in procs.procs:
        log = RUN_DIR / f"{name}.log"
        if not log.exists() or b'"worker.start"' not in log.read_bytes():
            return False
    return True
