"""``make bench``: DBOS Transact beside NexusFlow (series ``dbos_noop`` and ``dbos_push``) on the local PostgreSQL.

DBOS Transact (``dbos`` 3.4.0) lives in a virtualenv of its own (``var/bench/dbos-venv``, installed by
``make bench`` from ``requirements-bench-dbos.txt``), never in the project's ``.venv``; every DBOS
process is :mod:`packs/bench/dbos_app.py <packs.bench.dbos_app>` run by that virtualenv's python.
Entry points: :func:`dbos_start` (recreate the peer's databases; the peer's status for the report),
:func:`dbos_noop_series` and :func:`dbos_push_series` (1, 2 and 4 worker processes each),
:func:`billing_sandbox_url` (the sandbox ``effects_confirmed`` pushes to). A point's rate is its
workflows over the span from the first one started (``started_at_epoch_ms``, when a worker dequeued
it) to the last one finished (``completed_at``), read from DBOS's ``dbos.workflow_status``.
See docs/performance.md "The DBOS Transact peer".
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packs.bench.measure import POINT_TIMEOUT_SECONDS, ROOT, RUN_DIR, WORKER_COUNTS, BenchError

DBOS_VERSION = "3.4.0"
DBOS_VENV = ROOT / "var" / "bench" / "dbos-venv"  # make bench installs it here, whatever the run dir
DBOS_APP = ROOT / "packs" / "bench" / "dbos_app.py"
#: The PostgreSQL server (no database): ``NEXUS_BENCH_PG_URL``, by default the local server's ``postgres``
#: user over TCP (trust authentication).
PG_URL = os.environ.get("NEXUS_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
#: Each worker process's DBOS queue settings: at most this many workflows of the queue running at once
#: (``worker_concurrency``), and the seconds between two dequeue polls (NexusFlow's workers sleep 0.2 s,
#: jittered, when idle). One process can start at most 64 / 0.2 = 320 workflows/s.
WORKER_CONCURRENCY, POLLING_SECONDS = 64, 0.2
#: ``dbos_push`` contacts of the point with n workers get object ids from ``n x OBJECT_RANGE`` on.
OBJECT_RANGE = 1_000_000
_UNREACHABLE = 3


@dataclass(frozen=True)
class DbosPeer:
    """The DBOS peer of one run: the virtualenv's python, the PostgreSQL server and the two databases."""

    python: Path
    pg_url: str
    app_db: str
    sys_db: str

    def argv(self, command: str, *extra: str) -> list[str]:
        """The command line running ``dbos_app.py command`` against this peer's databases."""
        return [str(self.python), str(DBOS_APP), command, "--pg", self.pg_url, "--app-db", self.app_db,
                "--sys-db", self.sys_db, *extra]


def peer_unavailable(reason: str, **known: Any) -> dict[str, Any]:
    """The report's ``peers.dbos`` for a peer that did not run: ``{"available": False, "reason": reason, **known}``."""
    return {"available": False, "reason": reason, **known}


def _env(env: dict | None = None) -> dict[str, str]:
    """The DBOS processes' environment: no Django settings or database URLs of NexusFlow's, the billing key only."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    key = (env or {}).get("NEXUS_DEMO_BILLING_API_KEY")
    return {**keep, "PYTHONUNBUFFERED": "1", **({"NEXUS_DEMO_BILLING_API_KEY": key} if key else {})}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def dbos_start(app_db: str, say, *, python: Path | None = None, pg_url: str = PG_URL
               ) -> tuple[DbosPeer | None, dict[str, Any]]:
    """Recreate the peer's databases (``app_db`` and ``<app_db>_sys``) and migrate them; return the peer.

    Returns ``(peer, status)``: ``status`` is the report's ``peers.dbos``, ``{"available": True,
    "dbos_version", "postgresql", "pg_url", "app_database", "system_database", "worker_concurrency",
    "polling_seconds"}``, or ``(None, peer_unavailable(reason))`` when the virtualenv is missing, PostgreSQL
    cannot be reached or the set-up failed: the bench goes on without the peer. ``python`` defaults to
    ``var/bench/dbos-venv/bin/python``. Raises nothing of its own.
    """
    python = python or DBOS_VENV / "bin" / "python"
    known = {"pg_url": pg_url, "app_database": app_db, "system_database": f"{app_db}_sys"}
    if not python.exists():
        return None, peer_unavailable(f"the DBOS virtualenv is not installed ({python} is missing; make bench "
                                      f"installs it from requirements-bench-dbos.txt)", **known)
    peer = DbosPeer(python=python, pg_url=pg_url, app_db=app_db, sys_db=f"{app_db}_sys")
    try:
        done = subprocess.run(peer.argv("setup"), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, peer_unavailable(f"setting up the DBOS databases at {pg_url} took over 120 s", **known)
    if done.returncode == _UNREACHABLE:
        return None, peer_unavailable(_last_line(done.stderr), **known)
    if done.returncode:
        return None, peer_unavailable(f"setting up the DBOS databases failed: {_last_line(done.stderr)}", **known)
    try:
        setup = json.loads(_last_line(done.stdout))
        setup["server"], setup["dbos_version"]
    except (ValueError, KeyError, TypeError):
        return None, peer_unavailable(f"the DBOS set-up printed no figures: {_last_line(done.stdout)}", **known)
    if setup["dbos_version"] != DBOS_VERSION:
        say(f"bench: DBOS Transact {setup['dbos_version']} is installed, not {DBOS_VERSION}")
    say(f"bench: DBOS Transact {setup['dbos_version']} on PostgreSQL {setup['server']} ({app_db}, {peer.sys_db})")
    return peer, {"available": True, "dbos_version": setup["dbos_version"], "postgresql": setup["server"], **known,
                  "worker_concurrency": WORKER_CONCURRENCY, "polling_seconds": POLLING_SECONDS}


def dbos_point(figures: dict[str, Any]) -> dict[str, Any]:
    """One series point from ``dbos_app.py point``'s figures, shaped like :func:`packs.bench.measure.point`.

    ``figures`` has ``workers``, ``units`` (SUCCESS workflows), ``seconds`` (their span), ``enqueued``,
    ``failed``, ``xact_commit`` and ``xact_rollback`` (deltas over the worker phase). Returns
    ``{"workers", "units", "seconds", "per_second", "commits_per_unit", "rollbacks_per_unit", "enqueued",
    "failed"}``; PostgreSQL counts no statements, so there is no ``statements_per_unit``. 0 units give 0.0.
    """
    units, span = figures["units"], figures["seconds"]
    return {"workers": figures["workers"], "units": units, "seconds": span,
            "per_second": units / span if span > 0 else 0.0,
            "commits_per_unit": figures["xact_commit"] / units if units else 0.0,
            "rollbacks_per_unit": figures["xact_rollback"] / units if units else 0.0,
            "enqueued": figures["enqueued"], "failed": figures["failed"]}


def _series(peer: DbosPeer, series: str, count: int, say, *, billing_url: str = "", env: dict | None = None
            ) -> list[dict[str, Any]]:
    points = []
    for n in WORKER_COUNTS:
        say(f"bench: DBOS {series} with {n} worker process(es): {count} workflows")
        argv = peer.argv("point", "--series", series, "--workers", str(n), "--count", str(count),
                         "--queue", f"{series}-{n}", "--first-object", str(n * OBJECT_RANGE),
                         "--worker-concurrency", str(WORKER_CONCURRENCY), "--polling-seconds", str(POLLING_SECONDS),
                         "--billing-url", billing_url, "--timeout", str(POINT_TIMEOUT_SECONDS),
                         "--log-dir", str(RUN_DIR))
        try:
            done = subprocess.run(argv, cwd=ROOT, env=_env(env), capture_output=True, text=True,
                                  timeout=POINT_TIMEOUT_SECONDS + 120)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"the DBOS {series} point with {n} workers did not finish") from exc
        if done.returncode:
            raise BenchError(f"the DBOS {series} point with {n} workers failed: {_last_line(done.stderr)}")
        point = dbos_point(json.loads(_last_line(done.stdout)))
        if point["units"] != count:
            say(f"bench: {count - point['units']} of {count} DBOS {series} workflows did not succeed")
        points.append(point)
    return points


def dbos_noop_series(peer: DbosPeer, runs: int, say) -> list[dict[str, Any]]:
    """DBOS no-op workflows (one no-op step each) per second with 1, 2 and 4 worker processes.

    Per point ``runs`` workflows are enqueued on a queue of their own first, then that many DBOS apps
    listening on it drain them. Returns one :func:`dbos_point` per worker count.

    Raises:
        BenchError: enqueueing failed, a worker exited, or the point did not finish in time.
    """
    return _series(peer, "noop", runs, say)


def dbos_push_series(peer: DbosPeer, contacts: int, billing_url: str, env: dict, say) -> list[dict[str, Any]]:
    """DBOS contact pushes per second with 1, 2 and 4 worker processes, at the billing sandbox ``billing_url``.

    One workflow per contact: upsert it in ``bench_contact`` (a DBOS datasource transaction), create the
    customer at the sandbox (``POST /v1/customers``, form-encoded ``email`` and ``name``, bearer key
    ``env["NEXUS_DEMO_BILLING_API_KEY"]``, the workflow id as ``Idempotency-Key``), store the returned id
    on the row (another transaction). ``contacts`` workflows per point are enqueued first. Returns one
    :func:`dbos_point` per worker count.

    Raises:
        BenchError: enqueueing failed, a worker exited, or the point did not finish in time.
    """
    return _series(peer, "push", contacts, say, billing_url=billing_url, env=env)


def billing_sandbox_url(run_dir: Path = RUN_DIR) -> str:
    """The running billing sandbox's base URL (``http://127.0.0.1:PORT``), from the port file it wrote.

    :func:`packs.demo.run.start_billing_sandbox` starts it with ``--port-file run_dir/billing.port``.

    Raises:
        BenchError: no port file (the sandbox was not started in ``run_dir``).
    """
    port_file = run_dir / "billing.port"
    try:
        return f"http://127.0.0.1:{int(port_file.read_text(encoding='utf-8'))}"
    except (OSError, ValueError) as exc:
        raise BenchError(f"the billing sandbox's port file {port_file} is missing or empty") from exc
