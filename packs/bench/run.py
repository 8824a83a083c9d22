"""``make bench``: NexusFlow beside the database floor and django-q2, in one run on one MariaDB.

One command (``manage.py bench [--scale S] [--json]``) runs, in its own
databases (``<main>_bench``, ``<main>_bench_control`` and, for the peer,
``<main>_bench_q2``), each series with 1, 2 and 4 worker processes:

- **floor**: the database alone: per transaction one locking read
  (``SELECT ... FOR UPDATE``) and one compare-and-set update, then COMMIT,
  on 1, 2 and 4 connections (one process each) for a fixed time;
- **q2**: django-q2 (the pinned version, ORM broker on its own database)
  processing no-op tasks (:func:`packs.bench.tasks.noop`) enqueued beforehand;
- **flow_runs**: durable Flow runs of ``Bench_One_Step`` (an autolaunched
  flow with one assignment) admitted through the public start path
  (``flow_run_start``) beforehand, then driven by ``run_workers --role flow``
  processes until every run succeeded;
- **latency**: Flow start -> Succeeded p50/p95/p99 with two flow workers
  while runs arrive on a fixed schedule at half the measured two-worker
  throughput (:func:`flow_latency`).

A series' rate is its units over the span from the first unit started to
the last one finished, read from the rows themselves (django-q2's task
``started``/``stopped``, a FlowRun's ``started_at``/``completed_at``), so
process start-up is not counted for either side. Transactions and
statements per unit are the server's ``Com_commit`` and ``Questions``
deltas over the worker phase (nothing else runs then), not estimates.

The report (``var/bench/report.json``, plotted in ``var/bench/throughput.png``) holds every figure and, under
``"ratios"``, ``flow_runs_vs_q2`` (2 workers each), ``scaling_2v1_flow_runs``
and ``flow_runs_vs_floor``. Each run is bounded in units and time and stops
by itself; ``--scale`` multiplies the unit counts and the floor's duration.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import MySQLdb
from django.conf import settings

from packs.demo.run import DemoError, Processes, _db_url, _manage, _recreate_databases, _use_database

ROOT = Path(settings.BASE_DIR)
RUN_DIR = ROOT / "var" / "bench"
FLOW_FILE = ROOT / "packs" / "bench" / "flows" / "Bench_One_Step.flow-meta.xml"
FLOW_NAME = "Bench_One_Step"
ORG = "bench-org"
WORKER_COUNTS = (1, 2, 4)
#: Units per series point at scale 1 (and the floor's seconds per point).
FLOW_RUNS, Q2_TASKS, FLOOR_SECONDS, FLOOR_ROWS, LATENCY_RUNS = 400, 600, 3.0, 1000, 200
#: No series point may take longer than this (seconds); it then fails the run instead of hanging.
POINT_TIMEOUT_SECONDS = 240.0


class BenchError(Exception):
    """The benchmark could not run (a process or set-up step failed, a series did not finish)."""


# --------------------------------------------------------------------------------------------------------------
# The database floor
# --------------------------------------------------------------------------------------------------------------

def _connect(cfg: dict, name: str):
    return MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                           password=cfg["PASSWORD"], database=name, autocommit=False)


def _floor_worker(cfg: dict, name: str, seconds: float, seed: int, out) -> None:
    conn = _connect(cfg, name)
    rng, done = random.Random(seed), 0
    cursor = conn.cursor()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = rng.randrange(1, FLOOR_ROWS + 1)
        cursor.execute("SELECT v, version FROM bench_floor WHERE id = %s FOR UPDATE", [row])
        _v, version = cursor.fetchone()
        cursor.execute("UPDATE bench_floor SET v = v + 1, version = version + 1 WHERE id = %s AND version = %s",
                       [row, version])
        if cursor.rowcount != 1:
            raise RuntimeError("the compare-and-set lost a row it had locked")
        conn.commit()
        done += 1
    conn.close()
    out.send(done)


def floor_series(cfg: dict, name: str, seconds: float) -> list[dict[str, Any]]:
    """Locking-read + CAS-update transactions per second on 1, 2 and 4 connections (one process each)."""
    conn = _connect(cfg, name)
    cursor = conn.cursor()
    cursor.execute("CREATE TABLE bench_floor (id INT PRIMARY KEY, v BIGINT NOT NULL, version BIGINT NOT NULL) "
                   "ENGINE=InnoDB")
    cursor.executemany("INSERT INTO bench_floor (id, v, version) VALUES (%s, 0, 1)",
                       [(i,) for i in range(1, FLOOR_ROWS + 1)])
    conn.commit()
    conn.close()
    ctx = multiprocessing.get_context("spawn")
    points = []
    for n in WORKER_COUNTS:
        pipes, procs = [], []
        for i in range(n):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_floor_worker, args=(cfg, name, seconds, 1000 * n + i, child))
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        total = sum(p.recv() for p in pipes)
        for proc in procs:
            proc.join(30)
        points.append({"workers": n, "units": total, "seconds": seconds, "per_second": total / seconds})
    return points


# --------------------------------------------------------------------------------------------------------------
# Measuring a worker phase
# --------------------------------------------------------------------------------------------------------------

def _server_counters(cfg: dict) -> dict[str, int]:
    conn = _connect(cfg, "mysql")
    try:
        cursor = conn.cursor()
        cursor.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Questions')")
        return {name: int(value) for name, value in cursor.fetchall()}
    finally:
        conn.close()


def _wait_for(what: str, done: Callable[[], bool], procs: Processes) -> None:
    deadline = time.monotonic() + POINT_TIMEOUT_SECONDS
    while not done():
        for name, proc in procs.procs:
            if proc.poll() not in (None, 0):
                raise BenchError(f"{name} exited with {proc.returncode} before {what} (var/bench/{name}.log)")
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not happen within {POINT_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.2)


def _point(n: int, units: int, span: float, counters_before: dict, counters_after: dict) -> dict[str, Any]:
    return {"workers": n, "units": units, "seconds": span, "per_second": units / span if span > 0 else 0.0,
            "commits_per_unit": (counters_after["Com_commit"] - counters_before["Com_commit"]) / units,
            "statements_per_unit": (counters_after["Questions"] - counters_before["Questions"]) / units}


# --------------------------------------------------------------------------------------------------------------
# The peer: django-q2
# --------------------------------------------------------------------------------------------------------------

def q2_series(cfg: dict, env: dict, tasks: int, say) -> list[dict[str, Any]]:
    """django-q2 no-op tasks per second with 1, 2 and 4 workers (ORM broker on the peer's own database)."""
    points = []
    for n in WORKER_COUNTS:
        _manage(["shell", "-c", "from django_q.models import OrmQ, Task; OrmQ.objects.all().delete(); "
                 "Task.objects.all().delete()"], env)
        _manage(["shell", "-c", "from django_q.tasks import async_task\n"
                 f"for i in range({tasks}): async_task('packs.bench.tasks.noop', task_name=f'noop-{{i}}')"], env)
        say(f"bench: django-q2 with {n} worker(s): {tasks} tasks")
        procs = Processes()
        before = _server_counters(cfg)
        try:
            procs.start(f"q2-cluster-{n}", [sys.executable, "manage.py", "qcluster"],
                        {**env, "NEXUS_Q_WORKERS": str(n)}, RUN_DIR)
            _wait_for(f"{tasks} django-q2 tasks", lambda: _q2_done(cfg, env) >= tasks, procs)
        finally:
            after = _server_counters(cfg)
            procs.stop_all()
        span = _q2_span(cfg, env)
        points.append(_point(n, tasks, span, before, after))
    return points


def _q2_db(env: dict) -> str:
    return env["NEXUS_DB_URL"].rsplit("/", 1)[1]


def _q2_done(cfg: dict, env: dict) -> int:
    conn = _connect(cfg, _q2_db(env))
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT COUNT(*) FROM django_q_task WHERE success = 1")
        return int(cursor.fetchone()[0])
    finally:
        conn.close()


def _q2_span(cfg: dict, env: dict) -> float:
    conn = _connect(cfg, _q2_db(env))
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, MIN(started), MAX(stopped)) FROM django_q_task")
        return int(cursor.fetchone()[0]) / 1e6
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------------------------
# NexusFlow: durable one-step Flow runs
# --------------------------------------------------------------------------------------------------------------

@contextmanager
def _flow_workers(n: int, label: str, env: dict):
    """``n`` ``run_workers --role flow`` processes (logs ``var/bench/<label>-<i>.log``), stopped on exit."""
    procs = Processes()
    try:
        for i in range(n):
            procs.start(f"{label}-{i}", [sys.executable, "manage.py", "run_workers", "--role", "flow"], env, RUN_DIR)
        yield procs
    finally:
        procs.stop_all()


def _wait_succeeded(ids: list[int], procs: Processes) -> None:
    from nexusflow.flows.models import FlowRun

    _wait_for(f"{len(ids)} Flow runs", lambda: FlowRun.objects.filter(
        pk__in=ids, state="Succeeded").count() == len(ids), procs)


def flow_runs_series(cfg: dict, env: dict, runs: int, say) -> list[dict[str, Any]]:
    """Durable one-step Flow runs per second with 1, 2 and 4 ``run_workers --role flow`` processes."""
    from nexusflow.flows.models import FlowRun
    from nexusflow.flows.services import flow_run_start
    from nexusflow.kernel.scope import OrgScope

    org = OrgScope(ORG)
    points = []
    for n in WORKER_COUNTS:
        ids = [int(flow_run_start(org=org, flow_api_name=FLOW_NAME, inputs={"counted": i},
                                  request_id=f"w{n}-{i}").run.pk) for i in range(runs)]
        say(f"bench: NexusFlow flow workers x{n}: {len(ids)} runs")
        before = _server_counters(cfg)
        try:
            with _flow_workers(n, f"flow-{n}", env) as procs:
                _wait_succeeded(ids, procs)
        finally:
            after = _server_counters(cfg)
        rows = FlowRun.objects.filter(pk__in=ids)
        started = min(r.started_at for r in rows if r.started_at)
        completed = max(r.completed_at for r in rows if r.completed_at)
        points.append(_point(n, len(ids), (completed - started).total_seconds(), before, after))
    return points


def percentiles(values: list[float]) -> dict[str, float]:
    """``p50``/``p95``/``p99`` of ``values`` (nearest rank; an empty list gives zeros)."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    return {f"p{q}": ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]
            for q in (50, 95, 99)}


def flow_latency(cfg: dict, env: dict, *, rate: float, runs: int, say) -> dict[str, Any]:
    """Flow start -> Succeeded latency (ms) under an open-loop arrival of ``rate`` starts/s, two flow workers.

    Runs are started on a fixed schedule while the workers run (a start that falls behind it is not
    skipped); each run's latency is its ``completed_at`` minus its ``created_at`` (both the database clock).
    """
    from nexusflow.flows.models import FlowRun
    from nexusflow.flows.services import flow_run_start
    from nexusflow.kernel.scope import OrgScope

    org = OrgScope(ORG)
    say(f"bench: Flow start -> Succeeded latency, {runs} runs at {rate:.0f}/s, 2 flow workers")
    ids: list[int] = []
    with _flow_workers(2, "flow-latency", env) as procs:
        begin = time.monotonic()
        for i in range(runs):
            pause = begin + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            ids.append(int(flow_run_start(org=org, flow_api_name=FLOW_NAME, inputs={"counted": i},
                                          request_id=f"latency-{i}").run.pk))
        _wait_succeeded(ids, procs)
    latencies = [(r.completed_at - r.created_at).total_seconds() * 1000
                 for r in FlowRun.objects.filter(pk__in=ids).only("created_at", "completed_at")]
    return {"arrival_per_second": rate, "units": len(ids), "workers": 2,
            **{f"{k}_ms": v for k, v in percentiles(latencies).items()}}


# --------------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------------

def _at(points: list[dict[str, Any]], workers: int) -> float:
    return next(p["per_second"] for p in points if p["workers"] == workers)


def _ratios(report: dict[str, Any]) -> dict[str, float]:
    flows, q2, floor = report["series"]["flow_runs"], report["series"]["q2"], report["series"]["floor"]
    return {
        "flow_runs_vs_q2": _at(flows, 2) / _at(q2, 2),
        "scaling_2v1_flow_runs": _at(flows, 2) / _at(flows, 1),
        "scaling_2v1_q2": _at(q2, 2) / _at(q2, 1),
        "flow_runs_vs_floor": _at(flows, 2) / _at(floor, 2),
    }


#: The issue's targets: ratio -> the least value that meets it.
TARGETS = {"flow_runs_vs_q2": 2.0, "scaling_2v1_flow_runs": 1.6}


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"make bench (scale {report['scale']})")
    table.add_column("series")
    for n in WORKER_COUNTS:
        table.add_column(f"{n} worker(s) /s", justify="right")
    table.add_column("commits/unit (2)", justify="right")
    table.add_column("statements/unit (2)", justify="right")
    for name, points in report["series"].items():
        two = next(p for p in points if p["workers"] == 2)
        table.add_row(name, *[f"{_at(points, n):.0f}" for n in WORKER_COUNTS],
                      f"{two.get('commits_per_unit', 1.0):.1f}", f"{two.get('statements_per_unit', 0):.1f}")
    console = Console(file=sys.stderr)
    console.print(table)
    ratios = Table(title="ratios")
    ratios.add_column("ratio")
    ratios.add_column("value", justify="right")
    ratios.add_column("target", justify="right")
    for name, value in report["ratios"].items():
        target = TARGETS.get(name)
        verdict = "" if target is None else (f">= {target} met" if value >= target else
                                             f">= {target} missed by {target - value:.2f}")
        ratios.add_row(name, f"{value:.2f}", verdict)
    console.print(ratios)
    for name, figures in (report.get("latency") or {}).items():
        console.print(f"latency {name} at {figures['arrival_per_second']:.0f}/s arrival, {figures['workers']} workers: "
                      f"p50 {figures['p50_ms']:.0f} ms, p95 {figures['p95_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms")


def _plot(report: dict[str, Any], path: Path) -> bool:
    """Units/s against worker processes for every series (log scale), as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in report["series"].items():
        ax.plot([p["workers"] for p in points], [p["per_second"] for p in points], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(WORKER_COUNTS), [str(n) for n in WORKER_COUNTS])
    ax.set_yscale("log")
    ax.set_xlabel("worker processes (floor: connections)")
    ax.set_ylabel("units per second")
    ax.set_title(f"make bench, scale {report['scale']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run_bench(*, scale: float = 1.0, as_json: bool = False) -> int:
    """Run every series and write ``var/bench/report.json``; 0 ran (targets reported, not enforced), 2 could not run."""
    if not 0 < scale <= 20:
        print("bench: --scale must be within (0, 20]", file=sys.stderr)
        return 2
    cfg = settings.DATABASES["default"]
    main, control, q2 = (f"{cfg['NAME']}_bench", f"{cfg['NAME']}_bench_control", f"{cfg['NAME']}_bench_q2")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    for old in RUN_DIR.glob("*.log"):
        old.unlink()
    env = {**os.environ, "NEXUS_DB_URL": _db_url(cfg, main), "NEXUS_CONTROL_DB_URL": _db_url(cfg, control),
           "PYTHONUNBUFFERED": "1", "NEXUS_LOCK_ORDER": "log"}
    env.pop("NEXUS_FAILPOINTS", None)
    q2_env = {**env, "NEXUS_DB_URL": _db_url(cfg, q2), "NEXUS_Q_SAVE_LIMIT": "0"}
    say = (lambda *a: print(*a, file=sys.stderr))
    started = time.monotonic()
    try:
        say(f"bench: recreating databases {main}, {control}, {q2}")
        _recreate_databases(cfg, [main, control, q2])
        for e in (env, q2_env):
            _manage(["migrate", "--noinput", "-v0"], e)
        _manage(["migrate", "--noinput", "-v0", "--database", "control"], env)
        say("bench: " + _manage(["flow_deploy", "--org", ORG, str(FLOW_FILE)], env))
        report: dict[str, Any] = {"scale": scale, "machine": {"cpus": os.cpu_count()}, "series": {}}
        say(f"bench: database floor, {FLOOR_SECONDS * scale:.1f} s per point")
        report["series"]["floor"] = floor_series(cfg, main, FLOOR_SECONDS * scale)
        report["series"]["q2"] = q2_series(cfg, q2_env, max(50, int(Q2_TASKS * scale)), say)
        _use_database(main, control)
        report["series"]["flow_runs"] = flow_runs_series(cfg, env, max(50, int(FLOW_RUNS * scale)), say)
        # Half the measured two-worker throughput: the latency of a system that keeps up, not of a backlog.
        report["latency"] = {"flow_start_to_succeeded": flow_latency(
            cfg, env, rate=max(1.0, _at(report["series"]["flow_runs"], 2) / 2), runs=max(50, int(LATENCY_RUNS * scale)),
            say=say)}
    except (BenchError, DemoError, MySQLdb.Error) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    report["ratios"] = _ratios(report)
    report["targets"] = {name: {"at_least": target, "met": report["ratios"][name] >= target}
                         for name, target in TARGETS.items()}
    report["wall_seconds"] = time.monotonic() - started
    (RUN_DIR / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    _print_table(report)
    if not _plot(report, RUN_DIR / "throughput.png"):
        say("bench: matplotlib is not installed (make bench installs requirements-bench.txt): no plot")
    if as_json:
        print(json.dumps(report))
    return 0
