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
  processes until every run succeeded (:mod:`packs.bench.flow_runs`);
- **events_applied** and **effects_confirmed**: webhook events posted to the
  demo service's HTTP ingress, then applied as record changes by
  ``connector`` and ``runtime`` workers, or carried on to a confirmed effect
  at the billing sandbox by ``connector``, ``runtime``, ``flow`` and
  ``egress`` workers (:mod:`packs.bench.inbound`);
- **latency**: Flow start -> Succeeded, webhook admission (HTTP) and event ->
  applied p50/p95/p99 while units arrive on a fixed schedule at half the
  measured two-worker throughput;
- **history**: the Flow step claim and the webhook admission p99 with the
  terminal history the run left (1x) and with it copied to 10x
  (:mod:`packs.bench.history`).

A series' rate is its units over the span from the first unit started to
the last one finished, read from the rows themselves (django-q2's task
``started``/``stopped``, a FlowRun's ``started_at``/``completed_at``, an
ExecutionAttempt's start to an Execution's completion or a RemoteEffect's
finalization), so process start-up is not counted for either side.
Transactions and statements per unit are the server's ``Com_commit`` and
``Questions`` deltas over the worker phase (nothing else of the run works
then), not estimates.

The report (``var/bench/report.json``, plotted in
``var/bench/throughput.png``) holds every figure, the ratios of
:func:`ratios` under ``"ratios"`` and their verdicts against
:data:`TARGETS` (at-least and at-most bounds) under ``"targets"``. Each run
is bounded in units and time and stops by itself; ``--scale`` multiplies
the unit counts and the floor's duration.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import MySQLdb
from django.conf import settings

from packs.bench.flow_runs import (
    FLOW_FILE,
    FLOW_RUNS,
    LATENCY_RUNS,
    ORG,
    flow_latency,
    flow_runs_series,
)
from packs.bench.history import FACTOR, HISTORY_SAMPLES, history_p99
from packs.bench.inbound import (
    CONTACTS,
    EFFECT_CONTACTS,
    LATENCY_EVENTS,
    effects_confirmed_series,
    events_applied_series,
    inbound_latency,
    inbound_start,
)
from packs.bench.measure import (
    ROOT,
    RUN_DIR,
    WORKER_COUNTS,
    BenchError,
    connect,
    percentiles,
    point,
    server_counters,
    wait_for,
)
from packs.bench.profiles import summarise
from packs.demo.run import (
    DemoError,
    Processes,
    _db_url,
    _manage,
    _recreate_databases,
    _use_database,
    service_secrets_env,
)

#: Units per series point at scale 1 (and the floor's seconds per point).
Q2_TASKS, FLOOR_SECONDS, FLOOR_ROWS = 600, 3.0, 1000
__all__ = ["TARGETS", "percentiles", "ratios", "run_bench", "target_verdicts"]


# --------------------------------------------------------------------------------------------------------------
# The database floor
# --------------------------------------------------------------------------------------------------------------

def _floor_worker(cfg: dict, name: str, seconds: float, seed: int, out) -> None:
    conn = connect(cfg, name)
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
    conn = connect(cfg, name)
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
# The peer: django-q2
# --------------------------------------------------------------------------------------------------------------

def q2_series(cfg: dict, env: dict, tasks: int, say) -> list[dict[str, Any]]:
    """django-q2 no-op tasks per second with 1, 2 and 4 workers (ORM broker on the peer's own database)."""
    points = []
    for n in WORKER_COUNTS:
        _manage(["shell", "-c", "from django_q.models import OrmQ, Task\nfrom django_q.tasks import async_task\n"
                 "OrmQ.objects.all().delete()\nTask.objects.all().delete()\n"
                 f"for i in range({tasks}): async_task('packs.bench.tasks.noop', task_name=f'noop-{{i}}')"], env)
        say(f"bench: django-q2 with {n} worker(s): {tasks} tasks")
        procs = Processes()
        before = server_counters(cfg)
        try:
            procs.start(f"q2-cluster-{n}", [sys.executable, "manage.py", "qcluster"],
                        {**env, "NEXUS_Q_WORKERS": str(n)}, RUN_DIR)
            wait_for(f"{tasks} django-q2 tasks", lambda: _q2_done(cfg, env) >= tasks, procs)
        finally:
            after = server_counters(cfg)
            _stop_cluster(procs)
        span = _q2_span(cfg, env)
        points.append(point(n, tasks, span, before, after))
    return points


def _stop_cluster(procs: Processes) -> None:
    """Stop a django-q2 cluster: SIGTERM to its main process only, then :meth:`Processes.stop_all`.

    The cluster stops its own workers within a second that way; a SIGTERM to
    its whole process group (what ``stop_all`` sends) leaves it hanging until
    it is killed 10 s later.
    """
    for _name, proc in procs.procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for _name, proc in procs.procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    procs.stop_all()


def _q2_db(env: dict) -> str:
    return env["NEXUS_DB_URL"].rsplit("/", 1)[1]


def _q2_done(cfg: dict, env: dict) -> int:
    conn = connect(cfg, _q2_db(env))
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT COUNT(*) FROM django_q_task WHERE success = 1")
        return int(cursor.fetchone()[0])
    finally:
        conn.close()


def _q2_span(cfg: dict, env: dict) -> float:
    conn = connect(cfg, _q2_db(env))
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, MIN(started), MAX(stopped)) FROM django_q_task")
        return int(cursor.fetchone()[0]) / 1e6
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------------

def _at(points: list[dict[str, Any]], workers: int) -> float:
    return next(p["per_second"] for p in points if p["workers"] == workers)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.inf


def ratios(report: dict[str, Any]) -> dict[str, float]:
    """The report's ratios, each computed from this run's figures (2 workers per role unless named).

    ``report`` needs ``series`` with ``floor``, ``q2``, ``flow_runs``,
    ``events_applied`` and ``effects_confirmed`` (points with ``workers`` and
    ``per_second``) and ``history`` with ``1x``/``10x`` ``claim`` and
    ``admission`` ``p99_ms``. A zero denominator gives ``inf``.
    """
    series, history = report["series"], report["history"]
    flows, q2, floor = series["flow_runs"], series["q2"], series["floor"]
    applied, effects = series["events_applied"], series["effects_confirmed"]
    return {
        "flow_runs_vs_q2": _ratio(_at(flows, 2), _at(q2, 2)),
        "events_applied_vs_q2": _ratio(_at(applied, 2), _at(q2, 2)),
        "effects_confirmed_vs_q2": _ratio(_at(effects, 2), _at(q2, 2)),
        "scaling_2v1_flow_runs": _ratio(_at(flows, 2), _at(flows, 1)),
        "scaling_2v1_events_applied": _ratio(_at(applied, 2), _at(applied, 1)),
        "scaling_2v1_effects_confirmed": _ratio(_at(effects, 2), _at(effects, 1)),
        "scaling_2v1_q2": _ratio(_at(q2, 2), _at(q2, 1)),
        "flow_runs_vs_floor": _ratio(_at(flows, 2), _at(floor, 2)),
        "claim_p99_10x_vs_1x": _ratio(history["10x"]["claim"]["p99_ms"], history["1x"]["claim"]["p99_ms"]),
        "admission_p99_10x_vs_1x": _ratio(history["10x"]["admission"]["p99_ms"],
                                          history["1x"]["admission"]["p99_ms"]),
    }


#: The issue's targets: ratio -> ``(">=", least value)`` or ``("<=", greatest value)`` that meets it.
TARGETS: dict[str, tuple[str, float]] = {
    "flow_runs_vs_q2": (">=", 2.0),
    "effects_confirmed_vs_q2": (">=", 1.0),
    "scaling_2v1_flow_runs": (">=", 1.6),
    "scaling_2v1_events_applied": (">=", 1.6),
    "claim_p99_10x_vs_1x": ("<=", 1.15),
}


def target_verdicts(values: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Judge ``values`` (ratio -> number) against :data:`TARGETS`.

    Returns, per target, ``{"at_least": bound}`` or ``{"at_most": bound}``
    with ``"met"`` (bool) and ``"gap"`` (how far the value is on the wrong
    side of the bound; 0.0 when met).

    Raises:
        KeyError: ``values`` lacks a ratio that has a target.
    """
    out = {}
    for name, (op, bound) in TARGETS.items():
        value = values[name]
        gap = max(0.0, bound - value) if op == ">=" else max(0.0, value - bound)
        out[name] = {"at_least" if op == ">=" else "at_most": bound, "met": gap == 0.0 and not math.isnan(value),
                     "gap": gap}
    return out


def _verdict(name: str, report: dict[str, Any]) -> str:
    if name not in TARGETS:
        return ""
    op, bound = TARGETS[name]
    judged = report["targets"][name]
    return f"{op} {bound} met" if judged["met"] else f"{op} {bound} missed by {judged['gap']:.2f}"


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
    console = Console(file=sys.stderr, width=120)
    console.print(table)
    table = Table(title="ratios")
    table.add_column("ratio")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    for name, value in report["ratios"].items():
        table.add_row(name, f"{value:.2f}", _verdict(name, report))
    console.print(table)
    for name, figures in (report.get("latency") or {}).items():
        console.print(f"latency {name} at {figures['arrival_per_second']:.0f}/s arrival, {figures['workers']} workers: "
                      f"p50 {figures['p50_ms']:.0f} ms, p95 {figures['p95_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms")
    history = report.get("history")
    if history:
        for size in ("1x", f"{FACTOR}x"):
            figures = history[size]
            console.print(f"history {size} ({figures['history']['flow_runs']} runs, {figures['history']['events']} "
                          f"events): claim p99 {figures['claim']['p99_ms']:.1f} ms, admission p99 "
                          f"{figures['admission']['p99_ms']:.0f} ms")
    for role, figures in (report.get("profiles") or {}).items():
        own = ", ".join(f"{k} {v:.1f} s" for k, v in figures["seconds"].items())
        slowest = "; ".join(f"{r['function']} {r['seconds']:.1f} s" for r in figures["top_cumulative"][:3])
        console.print(f"profile {role} ({figures['processes']} processes): {own}; slowest: {slowest}")


def _plot(report: dict[str, Any], path: Path) -> bool:
    """Units/s against worker processes for every series (log scale), as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, points in report["series"].items():
        ax.plot([p["workers"] for p in points], [p["per_second"] for p in points], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(WORKER_COUNTS), [str(n) for n in WORKER_COUNTS])
    ax.set_yscale("log")
    ax.set_xlabel("worker processes (floor: connections)")
    ax.set_ylabel("units per second")
    ax.set_title(f"make bench, scale {report['scale']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _manage_side_by_side(commands: list[tuple[list[str], dict]]) -> None:
    """Run ``manage.py ARGS`` with each ``(ARGS, env)`` at the same time (other databases); wait for all.

    Raises:
        DemoError: a command exited non-zero (its output is in the message).
    """
    procs = [(args, subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)) for args, env in commands]
    outputs = [(args, proc.communicate()[0], proc.returncode) for args, proc in procs]
    failed = [f"manage.py {' '.join(args)} failed:\n{output}" for args, output, code in outputs if code != 0]
    if failed:
        raise DemoError("\n".join(failed))


def _count(base: int, scale: float, least: int = 25) -> int:
    return max(least, int(base * scale))


def _series(report: dict[str, Any], cfg: dict, env: dict, q2_env: dict, scale: float, databases: tuple[str, str],
            say) -> None:
    """Run every series into ``report`` (``series``, ``latency``, ``history``), in the bench's databases."""
    main, control = databases
    say(f"bench: database floor, {FLOOR_SECONDS * scale:.1f} s per point")
    report["series"]["floor"] = floor_series(cfg, main, FLOOR_SECONDS * scale)
    report["series"]["q2"] = q2_series(cfg, q2_env, _count(Q2_TASKS, scale, 50), say)
    _use_database(main, control)
    report["series"]["flow_runs"] = flow_runs_series(cfg, env, _count(FLOW_RUNS, scale, 50), say)
    # Half the measured two-worker throughput: the latency of a system that keeps up, not of a backlog.
    report["latency"] = {"flow_start_to_succeeded": flow_latency(
        env, rate=max(1.0, _at(report["series"]["flow_runs"], 2) / 2), runs=_count(LATENCY_RUNS, scale, 50),
        say=say)}
    say("bench: the webhook service (billing sandbox, packs, credentials, configuration, greenfield cutover, "
        "flows, web server)")
    inbound = inbound_start(env, say)
    try:
        series = report["series"]
        series["events_applied"], contacts = events_applied_series(cfg, env, inbound, _count(CONTACTS, scale), say)
        effect_contacts = _count(EFFECT_CONTACTS, scale)
        series["effects_confirmed"] = effects_confirmed_series(
            cfg, env, inbound, {n: made[:effect_contacts] for n, made in contacts.items()}, say)
        report["latency"].update(inbound_latency(
            inbound, env, rate=max(1.0, _at(series["events_applied"], 2) / 2), events=_count(LATENCY_EVENTS, scale),
            say=say))
        report["history"] = history_p99(cfg, main, inbound, samples=_count(HISTORY_SAMPLES, scale, 50), say=say)
    finally:
        inbound.procs.stop_all()


def run_bench(*, scale: float = 1.0, as_json: bool = False, profile: bool = False) -> int:
    """Run every series and write ``var/bench/report.json``; 0 ran (targets reported, not enforced), 2 could not run.

    With ``profile`` every worker process profiles itself (cProfile, ``var/bench/profiles/``) and the report
    gains ``"profiles"``: per role, the seconds spent in database round trips, Django, NexusFlow code and
    idle sleep, and the slowest NexusFlow functions (:func:`packs.bench.profiles.summarise`). A profiled
    run's rates are lower than an unprofiled one's; compare ratios only between runs of the same kind.
    """
    if not 0 < scale <= 20:
        print("bench: --scale must be within (0, 20]", file=sys.stderr)
        return 2
    cfg = settings.DATABASES["default"]
    main, control, q2 = (f"{cfg['NAME']}_bench", f"{cfg['NAME']}_bench_control", f"{cfg['NAME']}_bench_q2")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    for old in RUN_DIR.glob("*.log"):
        old.unlink()
    env = {**os.environ, "NEXUS_DB_URL": _db_url(cfg, main), "NEXUS_CONTROL_DB_URL": _db_url(cfg, control),
           **service_secrets_env(RUN_DIR), "PYTHONUNBUFFERED": "1", "NEXUS_LOCK_ORDER": "log"}
    env.pop("NEXUS_FAILPOINTS", None)
    env.pop("NEXUS_WORKER_PROFILE_DIR", None)
    q2_env = {**env, "NEXUS_DB_URL": _db_url(cfg, q2), "NEXUS_Q_SAVE_LIMIT": "0"}
    profile_dir = RUN_DIR / "profiles"
    shutil.rmtree(profile_dir, ignore_errors=True)
    if profile:
        env["NEXUS_WORKER_PROFILE_DIR"] = str(profile_dir)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {message}", file=sys.stderr)

    report: dict[str, Any] = {"scale": scale, "machine": {"cpus": os.cpu_count()}, "profiled": profile,
                              "series": {}}
    try:
        say(f"bench: recreating databases {main}, {control}, {q2}")
        _recreate_databases(cfg, [main, control, q2])
        _manage_side_by_side([(["migrate", "--noinput", "-v0"], env), (["migrate", "--noinput", "-v0"], q2_env),
                              (["migrate", "--noinput", "-v0", "--database", "control"], env)])
        say("bench: " + _manage(["flow_deploy", "--org", ORG, str(FLOW_FILE)], env))
        _series(report, cfg, env, q2_env, scale, (main, control), say)
    except (BenchError, DemoError, MySQLdb.Error) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    report["ratios"] = ratios(report)
    report["targets"] = target_verdicts(report["ratios"])
    if profile:
        report["profiles"] = summarise(profile_dir)
    report["wall_seconds"] = time.monotonic() - started
    (RUN_DIR / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    _print_table(report)
    if not _plot(report, RUN_DIR / "throughput.png"):
        say("bench: matplotlib is not installed (make bench installs requirements-bench.txt): no plot")
    if as_json:
        print(json.dumps(report))
    return 0
