"""The DBOS Transact peer of ``make bench``: a standalone DBOS app, run by the DBOS virtualenv's python.

Never imported by NexusFlow (it needs ``dbos`` 3.4.0 from ``requirements-bench-dbos.txt``, installed in
``var/bench/dbos-venv`` by ``make bench``); :mod:`packs.bench.dbos_peer` runs it as subprocesses::

    dbos_app.py setup --pg URL --app-db A --sys-db S
    dbos_app.py point --series noop|push --workers N --count C --queue Q --pg URL --app-db A --sys-db S ...
    dbos_app.py work  --series noop|push --queue Q --executor ID --pg URL --app-db A --sys-db S ...

``setup`` recreates both databases and migrates them; ``point`` enqueues ``C`` workflows on queue ``Q``,
then starts ``N`` ``work`` processes (each a DBOS app listening on ``Q``), waits until every workflow
ended, stops them and prints the point's figures as one JSON line, read from ``dbos.workflow_status``
and ``pg_stat_database``. The billing API key travels in ``NEXUS_DEMO_BILLING_API_KEY``, never on the
command line. Exit codes: 0 done, 1 the point failed, 3 PostgreSQL could not be reached. See
docs/performance.md "The DBOS Transact peer".
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The DBOS application's name and version: every process of a run registers the same, so workers
#: dequeue what the enqueuer enqueued.
APP_NAME, APP_VERSION = "nexus-bench", "nexus-bench-1"
#: Terminal workflow states that are not a success (the point counts them as failed units).
FAILED_STATES = ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")
POLL_SECONDS = 0.2
#: Connections per worker process: DBOS's system database pool and the contacts datasource's pool (at
#: most 4 x 15 of PostgreSQL's 100 connections with four workers).
SYS_DB_POOL, APP_DB_POOL = 10, 5
EXIT_FAILED, EXIT_UNREACHABLE = 1, 3


class PointError(Exception):
    """A point could not be measured (a worker exited, the workflows did not end in time)."""


def _url(pg: str, database: str) -> str:
    return f"{pg.rstrip('/')}/{database}"


def _connect(pg: str, database: str):
    import psycopg

    return psycopg.connect(_url(pg, database), autocommit=True, connect_timeout=5)


# --------------------------------------------------------------------------------------------------------------
# setup
# --------------------------------------------------------------------------------------------------------------

CONTACT_TABLE = """
CREATE TABLE bench_contact (
    id BIGSERIAL PRIMARY KEY,
    object_id BIGINT NOT NULL UNIQUE,
    email TEXT NOT NULL,
    name TEXT NOT NULL,
    lifecyclestage TEXT NOT NULL,
    billing_id TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


def setup(args: argparse.Namespace) -> dict[str, Any]:
    """Drop and create the app and system databases, create ``bench_contact`` and run DBOS's migrations.

    Returns ``{"server": <PostgreSQL version string>, "dbos_version": <installed dbos>}``. Raises
    ``psycopg.OperationalError`` when the server cannot be reached.
    """
    from importlib.metadata import version as installed

    from dbos import DBOS, SQLAlchemyDatasource

    with _connect(args.pg, "postgres") as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        for name in (args.app_db, args.sys_db):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    with _connect(args.pg, args.app_db) as conn:
        conn.execute(CONTACT_TABLE)
    # Once here, so the workers that start side by side find both schemas current and migrate nothing.
    DBOS.migrate(_url(args.pg, args.sys_db))
    SQLAlchemyDatasource.migrate(_url(args.pg, args.app_db))
    return {"server": version, "dbos_version": installed("dbos")}


# --------------------------------------------------------------------------------------------------------------
# The workflows
# --------------------------------------------------------------------------------------------------------------

def _workflows(args: argparse.Namespace) -> Callable[..., Any]:
    """Register the series' workflow (and its steps) with DBOS; return the workflow function.

    ``noop``: one workflow with one no-op step. ``push``: upsert the contact in ``bench_contact``
    (a DBOS datasource transaction), create the customer at the billing sandbox (a step, POST
    ``/v1/customers`` form-encoded with the workflow id as ``Idempotency-Key``), store the returned
    id on the contact (a datasource transaction).
    """
    from dbos import DBOS

    if args.series == "noop":
        @DBOS.step()
        def noop_step() -> None:
            return None

        @DBOS.workflow()
        def noop_workflow() -> None:
            noop_step()

        return noop_workflow

    import httpx
    from dbos import SQLAlchemyDatasource
    from sqlalchemy import text

    if not args.billing_url:
        raise PointError("the push series needs --billing-url")
    contacts = SQLAlchemyDatasource.create(_url(args.pg, args.app_db), run_migrations=False,
                                           engine_kwargs={"pool_size": APP_DB_POOL, "max_overflow": 0})
    billing = httpx.Client(base_url=args.billing_url, timeout=5.0,
                           headers={"Authorization": f"Bearer {os.environ.get('NEXUS_DEMO_BILLING_API_KEY', '')}"})

    @contacts.transaction()
    def contact_upsert(object_id: int, email: str, name: str) -> int:
        return int(contacts.sql_session().execute(text(
            "INSERT INTO bench_contact (object_id, email, name, lifecyclestage) "
            "VALUES (:object_id, :email, :name, 'customer') "
            "ON CONFLICT (object_id) DO UPDATE SET email = EXCLUDED.email, name = EXCLUDED.name, "
            "lifecyclestage = EXCLUDED.lifecyclestage, updated_at = now() RETURNING id"),
            {"object_id": object_id, "email": email, "name": name}).scalar_one())

    @DBOS.step(retries_allowed=True, max_attempts=10, interval_seconds=0.2)
    def customer_create(email: str, name: str) -> str:
        response = billing.post("/v1/customers", data={"email": email, "name": name},
                                headers={"Idempotency-Key": f"dbos-{DBOS.workflow_id}"})
        response.raise_for_status()
        return str(response.json()["id"])

    @contacts.transaction()
    def contact_link(contact_id: int, billing_id: str) -> None:
        contacts.sql_session().execute(text("UPDATE bench_contact SET billing_id = :billing_id WHERE id = :id"),
                                       {"billing_id": billing_id, "id": contact_id})

    @DBOS.workflow()
    def contact_push(object_id: int, email: str, name: str) -> str:
        contact_id = contact_upsert(object_id, email, name)
        billing_id = customer_create(email, name)
        contact_link(contact_id, billing_id)
        return billing_id

    return contact_push


def _launch(args: argparse.Namespace, executor: str, queues: list[str]) -> Callable[..., Any]:
    """Construct and launch this process's DBOS app listening on ``queues``; return the series' workflow."""
    from dbos import DBOS

    workflow = _workflows(args)
    DBOS(config={"name": APP_NAME, "application_version": APP_VERSION, "executor_id": executor,
                 "system_database_url": _url(args.pg, args.sys_db), "log_level": "WARNING",
                 "sys_db_pool_size": SYS_DB_POOL, "run_migrations": False})
    DBOS.listen_queues(queues)
    DBOS.launch()
    return workflow


def enqueue(args: argparse.Namespace) -> None:
    """Register queue ``args.queue`` and enqueue ``args.count`` workflows on it (this process dequeues none).

    ``push`` workflows get contacts ``args.first_object`` on, each with an e-mail and a name, and the
    workflow id ``<queue>-<object id>``.
    """
    from dbos import DBOS, SetWorkflowID

    workflow = _launch(args, f"{args.queue}-enqueue", [])
    try:
        queue = DBOS.register_queue(args.queue, worker_concurrency=args.worker_concurrency,
                                    polling_interval_sec=args.polling_seconds)
        for i in range(args.count):
            with SetWorkflowID(f"{args.queue}-{args.first_object + i}"):
                if args.series == "noop":
                    queue.enqueue(workflow)
                else:
                    o = args.first_object + i
                    queue.enqueue(workflow, o, f"bench{o}@example.com", f"Bench{o}")
    finally:
        DBOS.destroy()


def work(args: argparse.Namespace) -> None:
    """Run one worker: a DBOS app listening on ``args.queue`` until SIGTERM or SIGINT."""
    from dbos import DBOS

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    _launch(args, args.executor, [args.queue])
    stop.wait()
    DBOS.destroy()


# --------------------------------------------------------------------------------------------------------------
# point: measure one worker count
# --------------------------------------------------------------------------------------------------------------

def _commits(args: argparse.Namespace) -> dict[str, int]:
    """``xact_commit`` and ``xact_rollback`` summed over the app and system databases, from a fresh snapshot.

    Read over a connection to ``postgres`` (its own transactions count there, not here).
    """
    with _connect(args.pg, "postgres") as conn:
        row = conn.execute("SELECT COALESCE(SUM(xact_commit), 0), COALESCE(SUM(xact_rollback), 0) "
                           "FROM pg_stat_database WHERE datname IN (%s, %s)", [args.app_db, args.sys_db]).fetchone()
    return {"xact_commit": int(row[0]), "xact_rollback": int(row[1])}


def _quiet(args: argparse.Namespace, seconds: float = 10.0) -> None:
    """Wait until no session is connected to the app or system database (their statistics are then flushed)."""
    deadline = time.monotonic() + seconds
    with _connect(args.pg, "postgres") as conn:
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname IN (%s, %s)",
                           [args.app_db, args.sys_db]).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(0.2)  # a leaving backend clears its activity entry just before it flushes its counters


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _argv(args: argparse.Namespace, command: str, *extra: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), command, "--series", args.series, "--queue", args.queue,
            "--pg", args.pg, "--app-db", args.app_db, "--sys-db", args.sys_db,
            "--worker-concurrency", str(args.worker_concurrency), "--polling-seconds", str(args.polling_seconds),
            "--billing-url", args.billing_url or "", *extra]


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def point(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue, drain with ``args.workers`` worker processes and read the figures of queue ``args.queue``.

    Returns ``{"workers", "enqueued", "units" (SUCCESS), "failed", "first_started_ms", "last_finished_ms",
    "seconds" (first ``started_at_epoch_ms`` to last ``completed_at``, the database clock),
    "xact_commit", "xact_rollback"}`` (commit and rollback deltas of both databases over the worker phase,
    this process's own progress reads taken out).

    Raises:
        PointError: the enqueuer or a worker exited non-zero, or the workflows did not all end within
            ``args.timeout`` seconds.
    """
    log_dir = Path(args.log_dir)
    label = f"dbos-{args.series}-{args.workers}"
    enqueuer = subprocess.run(_argv(args, "enqueue", "--count", str(args.count), "--first-object",
                                    str(args.first_object)), capture_output=True, text=True)
    (log_dir / f"{label}-enqueue.log").write_text(enqueuer.stdout + enqueuer.stderr, encoding="utf-8")
    if enqueuer.returncode:
        raise PointError(f"enqueueing failed ({enqueuer.returncode}): {enqueuer.stderr.strip()[-400:]}")
    _quiet(args)
    before = _commits(args)
    procs: list[subprocess.Popen] = []
    reads = 0
    try:
        for i in range(args.workers):
            procs.append(_spawn(_argv(args, "work", "--executor", f"{args.queue}-w{i}"),
                                log_dir / f"{label}-worker-{i}.log"))
        began = time.monotonic()
        with _connect(args.pg, args.sys_db) as conn:
            while True:
                reads += 1
                done = conn.execute("SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s AND "
                                    "(status = 'SUCCESS' OR status = ANY(%s))",
                                    [args.queue, list(FAILED_STATES)]).fetchone()[0]
                if done >= args.count:
                    break
                for i, proc in enumerate(procs):
                    if proc.poll() is not None:
                        raise PointError(f"worker {i} exited with {proc.returncode} after {done} of {args.count} "
                                         f"workflows (var/bench/{label}-worker-{i}.log)")
                if time.monotonic() - began > args.timeout:
                    raise PointError(f"{args.count - done} of {args.count} workflows did not end within "
                                     f"{args.timeout:.0f} s")
                time.sleep(POLL_SECONDS)
    finally:
        _stop(procs)
    _quiet(args)
    after = _commits(args)
    with _connect(args.pg, args.sys_db) as conn:
        units, first, last = conn.execute(
            "SELECT count(*), min(COALESCE(started_at_epoch_ms, created_at)), max(COALESCE(completed_at, updated_at)) "
            "FROM dbos.workflow_status WHERE queue_name = %s AND status = 'SUCCESS'", [args.queue]).fetchone()
        failed = conn.execute("SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s AND status = ANY(%s)",
                              [args.queue, list(FAILED_STATES)]).fetchone()[0]
    return {"workers": args.workers, "enqueued": args.count, "units": int(units), "failed": int(failed),
            "first_started_ms": first, "last_finished_ms": last,
            "seconds": (last - first) / 1000 if units else 0.0,
            "xact_commit": after["xact_commit"] - before["xact_commit"] - reads,
            "xact_rollback": after["xact_rollback"] - before["xact_rollback"]}


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="The DBOS Transact peer of make bench.")
    parser.add_argument("command", choices=("setup", "point", "enqueue", "work"))
    parser.add_argument("--pg", required=True, help="PostgreSQL server URL without a database")
    parser.add_argument("--app-db", required=True)
    parser.add_argument("--sys-db", required=True)
    parser.add_argument("--series", choices=("noop", "push"), default="noop")
    parser.add_argument("--queue", default="bench")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--first-object", type=int, default=1)
    parser.add_argument("--executor", default="bench")
    parser.add_argument("--worker-concurrency", type=int, default=64)
    parser.add_argument("--polling-seconds", type=float, default=0.2)
    parser.add_argument("--billing-url", default="")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--log-dir", default=".")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; print its result as one JSON line on stdout (``setup``, ``point``); the exit code."""
    import psycopg

    args = _parser().parse_args(argv)
    try:
        if args.command == "setup":
            print(json.dumps(setup(args)))
        elif args.command == "point":
            print(json.dumps(point(args)))
        elif args.command == "enqueue":
            enqueue(args)
        else:
            work(args)
    except psycopg.OperationalError as exc:
        print(f"PostgreSQL at {args.pg} could not be reached: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except PointError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
