"""``make bench``: NexusFlow beside the database floor, django-q2 and DBOS Transact, in one run.

One command (``manage.py bench [--scale S] [--json]``) runs, in its own
databases (``<main>_bench``, ``<main>_bench_control`` and, for the peers,
``<main>_bench_q2`` on the same MariaDB and ``<main>_bench_dbos`` with its
system database on the local PostgreSQL), each series with 1, 2 and 4
worker processes:

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
  (:mod:`packs.bench.history`);
- **dbos_noop** and **dbos_push**: DBOS Transact 3.4.0 (its own virtualenv,
  PostgreSQL) draining one-step no-op workflows and pushing contacts to the
  same billing sandbox as ``effects_confirmed`` (:mod:`packs.bench.dbos_peer`);
  without PostgreSQL the report says why and the ratios that need them are
  ``None`` with a reason (``"ratios_not_computed"``).

A series' rate is its units over the span from the first unit started to
the last one finished, read from the rows themselves (django-q2's task
``started``/``stopped``, a FlowRun's ``started_at``/``completed_at``, an
ExecutionAttempt's start to an Execution's completion or a RemoteEffect's
finalization, a DBOS workflow's ``started_at_epoch_ms``/``completed_at``),
so process start-up is not counted for any side.
Transactions and statements per unit are the server's ``Com_commit`` and
``Questions`` deltas over the worker phase (nothing else of the run works
then; for DBOS, PostgreSQL's ``xact_commit``), not estimates.

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

from packs.bench.dbos_peer import (
    DbosPeer,
    billing_sandbox_url,
    dbos_noop_series,
    dbos_push_series,
    dbos_start,
)
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
    LATENCY_EFFECTS,
    LATENCY_EVENTS,
    effect_latency,
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
    _manage,
    db_url,
    recreate_databases,
    service_secrets_env,
    use_database,
)

#: Units per series point at scale 1 (and the floor's seconds per point).
Q2_TASKS, FLOOR_SECONDS, FLOOR_ROWS = 600, 3.0, 1000
__all__ = ["SCALED_SERIES", "TARGETS", "percentiles", "ratio_reasons", "ratios", "run_bench", "target_verdicts"]


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


#: Series whose four-worker rate is held against its two-worker rate (``scaling_4v2_<series>``).
SCALED_SERIES = ("floor", "q2", "flow_runs", "events_applied", "effects_confirmed", "dbos_noop", "dbos_push")
#: Latency measurements whose p99 (ms) is a figure of its own (``<name>_p99_ms``).
P99_LATENCIES = ("flow_start_to_succeeded", "event_to_applied", "admission_to_confirmed_effect")


class _NotMeasured(Exception):
    """A figure a ratio needs is not in the report; the message says why."""


def _series_missing(report: dict[str, Any], name: str) -> str:
    if name.startswith("dbos_"):
        peer = (report.get("peers") or {}).get("dbos") or {}
        if not peer:
            return "the DBOS peer did not run"
        if not peer.get("available"):
            return f"the DBOS peer did not run: {peer.get('reason', 'no reason recorded')}"
        if name in (peer.get("failed") or {}):
            return f"{name} failed: {peer['failed'][name]}"
    return f"series {name} is not in the report"


def _figures(report: dict[str, Any]):
    """Readers of the report's figures that raise :class:`_NotMeasured` (with the reason) for a missing one."""

    def point(series: str, workers: int) -> dict[str, Any]:
        points = (report.get("series") or {}).get(series)
        if not points:
            raise _NotMeasured(_series_missing(report, series))
        found = next((p for p in points if p["workers"] == workers), None)
        if found is None:
            raise _NotMeasured(f"series {series} has no point with {workers} workers")
        return found

    def rate(series: str, workers: int = 2) -> float:
        return point(series, workers)["per_second"]

    def per_unit(series: str, key: str) -> float:
        found = point(series, 2)
        if key not in found:
            raise _NotMeasured(f"series {series} does not count {key.split('_per_')[0]}")
        return found[key]

    def p99(name: str) -> float:
        figures = (report.get("latency") or {}).get(name)
        if not figures or figures.get("p99_ms") is None:
            raise _NotMeasured(f"latency {name} was not measured in this run")
        return figures["p99_ms"]

    def history(size: str, what: str) -> float:
        try:
            return report["history"][size][what]["p99_ms"]
        except (KeyError, TypeError):
            raise _NotMeasured(f"history {size} {what} p99 was not measured in this run") from None

    return rate, per_unit, p99, history


def _ratio_table(report: dict[str, Any]) -> dict[str, tuple[float | None, str | None]]:
    rate, per_unit, p99, history = _figures(report)
    wanted = {
        "flow_runs_vs_q2": lambda: _ratio(rate("flow_runs"), rate("q2")),
        "events_applied_vs_q2": lambda: _ratio(rate("events_applied"), rate("q2")),
        "effects_confirmed_vs_q2": lambda: _ratio(rate("effects_confirmed"), rate("q2")),
        "effects_confirmed_vs_dbos_push": lambda: _ratio(rate("effects_confirmed"), rate("dbos_push")),
        "flow_runs_vs_dbos_noop": lambda: _ratio(rate("flow_runs"), rate("dbos_noop")),
        "flow_runs_vs_floor": lambda: _ratio(rate("flow_runs"), rate("floor")),
        **{f"scaling_2v1_{s}": (lambda s=s: _ratio(rate(s, 2), rate(s, 1)))
           for s in ("flow_runs", "events_applied", "effects_confirmed", "q2", "dbos_noop", "dbos_push")},
        **{f"scaling_4v2_{s}": (lambda s=s: _ratio(rate(s, 4), rate(s, 2))) for s in SCALED_SERIES},
        "effects_confirmed_commits_per_unit": lambda: per_unit("effects_confirmed", "commits_per_unit"),
        "effects_confirmed_statements_per_unit": lambda: per_unit("effects_confirmed", "statements_per_unit"),
        "dbos_push_commits_per_unit": lambda: per_unit("dbos_push", "commits_per_unit"),
        **{f"{name}_p99_ms": (lambda name=name: p99(name)) for name in P99_LATENCIES},
        "claim_p99_10x_vs_1x": lambda: _ratio(history(f"{FACTOR}x", "claim"), history("1x", "claim")),
        "admission_p99_10x_vs_1x": lambda: _ratio(history(f"{FACTOR}x", "admission"), history("1x", "admission")),
    }
    table: dict[str, tuple[float | None, str | None]] = {}
    for name, compute in wanted.items():
        try:
            table[name] = (compute(), None)
        except _NotMeasured as missing:
            table[name] = (None, str(missing))
    return table


def ratios(report: dict[str, Any]) -> dict[str, float | None]:
    """The report's ratios and per-unit and p99 figures, from this run's figures (2 workers per role unless named).

    ``report`` has ``series`` (name -> points with ``workers``, ``per_second`` and, for the per-unit
    figures, ``commits_per_unit``/``statements_per_unit``): ``floor``, ``q2``, ``flow_runs``,
    ``events_applied``, ``effects_confirmed`` and the DBOS peer's ``dbos_noop``/``dbos_push``;
    ``latency`` (name -> ``p99_ms``) and ``history`` (``1x``/``10x`` ``claim`` and ``admission`` ``p99_ms``).
    ``scaling_2v1_<s>`` is the 2-worker over the 1-worker rate, ``scaling_4v2_<s>`` the 4-worker over the
    2-worker rate; ``*_p99_ms`` are milliseconds. A figure missing from the report (a peer that did not
    run, a latency not measured) gives ``None``, :func:`ratio_reasons` says why; a zero denominator gives
    ``inf``. Raises nothing for a missing figure.
    """
    return {name: value for name, (value, _reason) in _ratio_table(report).items()}


def ratio_reasons(report: dict[str, Any]) -> dict[str, str]:
    """Why each ratio of :func:`ratios` that is ``None`` could not be computed: ratio name -> reason."""
    return {name: reason for name, (_value, reason) in _ratio_table(report).items() if reason is not None}


#: The issue's targets: figure of :func:`ratios` -> ``(">=", least value)`` or ``("<=", greatest value)``.
TARGETS: dict[str, tuple[str, float]] = {
    "effects_confirmed_vs_dbos_push": (">=", 1.0),
    "flow_runs_vs_dbos_noop": (">=", 1.5),
    "events_applied_vs_q2": (">=", 1.5),
    **{f"scaling_4v2_{s}": (">=", 0.9) for s in SCALED_SERIES},
    "scaling_2v1_flow_runs": (">=", 1.6),
    "scaling_2v1_events_applied": (">=", 1.6),
    "scaling_2v1_effects_confirmed": (">=", 1.6),
    "effects_confirmed_commits_per_unit": ("<=", 6.0),
    "effects_confirmed_statements_per_unit": ("<=", 60.0),
    "flow_start_to_succeeded_p99_ms": ("<=", 250.0),
    "event_to_applied_p99_ms": ("<=", 500.0),
    "admission_to_confirmed_effect_p99_ms": ("<=", 1000.0),
}


def target_verdicts(values: dict[str, float | None], reasons: dict[str, str] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Judge ``values`` (figure -> number, or ``None`` when not measured) against :data:`TARGETS`.

    Returns, per target, ``{"at_least": bound}`` or ``{"at_most": bound}`` with ``"verdict"``
    (``"met"``, ``"missed"`` or ``"not measured"``), ``"met"`` (bool; ``None`` when not measured) and
    ``"gap"`` (how far the value is on the wrong side of the bound; 0.0 when met, ``None`` when not
    measured). A figure that is ``None`` or absent from ``values`` is ``"not measured"``, with its
    ``"reason"`` from ``reasons`` (see :func:`ratio_reasons`). A NaN value misses. Raises nothing.
    """
    reasons = reasons or {}
    out = {}
    for name, (op, bound) in TARGETS.items():
        side = {"at_least" if op == ">=" else "at_most": bound}
        value = values.get(name)
        if value is None:
            out[name] = {**side, "verdict": "not measured", "met": None, "gap": None,
                         "reason": reasons.get(name, f"{name} is not among this run's figures")}
            continue
        gap = max(0.0, bound - value) if op == ">=" else max(0.0, value - bound)
        met = gap == 0.0 and not math.isnan(value)
        out[name] = {**side, "verdict": "met" if met else "missed", "met": met, "gap": gap}
    return out


def _verdict(name: str, report: dict[str, Any]) -> str:
    if name not in TARGETS:
        return ""
    op, bound = TARGETS[name]
    judged = report["targets"][name]
    if judged["verdict"] == "not measured":
        return f"{op} {bound:g} not measured"
    return f"{op} {bound:g} met" if judged["met"] else f"{op} {bound:g} missed by {judged['gap']:.2f}"


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
        statements = two.get("statements_per_unit")
        table.add_row(name, *[f"{_at(points, n):.0f}" for n in WORKER_COUNTS],
                      f"{two.get('commits_per_unit', 1.0):.1f}", "-" if statements is None else f"{statements:.1f}")
    console = Console(file=sys.stderr, width=120)
    console.print(table)
    dbos = (report.get("peers") or {}).get("dbos")
    if dbos and dbos.get("available"):
        console.print(f"dbos_*: DBOS Transact {dbos['dbos_version']}, PostgreSQL {dbos['postgresql'].split()[0]}, "
                      f"worker_concurrency {dbos['worker_concurrency']}, polling {dbos['polling_seconds']} s; "
                      "commits/unit: xact_commit"
                      + "".join(f"; {name} failed: {why}" for name, why in (dbos.get("failed") or {}).items()))
    elif dbos:
        console.print(f"DBOS peer not run: {dbos['reason']}")
    table = Table(title="ratios")
    table.add_column("ratio")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    reasons = report.get("ratios_not_computed") or {}
    for name, value in report["ratios"].items():
        table.add_row(name, "-" if value is None else f"{value:.2f}", _verdict(name, report))
    console.print(table)
    for reason in dict.fromkeys(reasons.values()):
        console.print(f"not computed ({reason}): {', '.join(n for n, why in reasons.items() if why == reason)}")
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
        peer = name == "q2" or name.startswith("dbos_")  # the peers dashed, NexusFlow and the floor solid
        ax.plot([p["workers"] for p in points], [p["per_second"] for p in points], marker="o", label=name,
                linestyle="--" if peer else "-")
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


def _dbos_series(report: dict[str, Any], peer: DbosPeer | None, name: str, run, say) -> None:
    """Run a DBOS series into ``report["series"][name]`` when the peer is up; a failure is recorded, not raised.

    ``run`` is ``() -> points``. A :class:`BenchError` (a DBOS process failed, a point did not finish)
    goes to ``report["peers"]["dbos"]["failed"][name]``; the series is then absent and the bench goes on.
    """
    status = report["peers"]["dbos"]
    if peer is None or not status.get("available"):
        return
    try:
        report["series"][name] = run()
    except BenchError as exc:
        status.setdefault("failed", {})[name] = str(exc)
        say(f"bench: {name} not measured: {exc}")


def _series(report: dict[str, Any], cfg: dict, env: dict, q2_env: dict, scale: float, databases: tuple[str, str],
            say) -> None:
    """Run every series into ``report`` (``series``, ``peers``, ``latency``, ``history``), in the bench's databases."""
    main, control = databases
    say(f"bench: database floor, {FLOOR_SECONDS * scale:.1f} s per point")
    report["series"]["floor"] = floor_series(cfg, main, FLOOR_SECONDS * scale)
    report["series"]["q2"] = q2_series(cfg, q2_env, _count(Q2_TASKS, scale, 50), say)
    dbos, report["peers"]["dbos"] = dbos_start(f"{cfg['NAME']}_bench_dbos", say)
    if dbos is None:
        say(f"bench: the DBOS peer does not run: {report['peers']['dbos']['reason']}")
    _dbos_series(report, dbos, "dbos_noop", lambda: dbos_noop_series(dbos, _count(FLOW_RUNS, scale, 50), say), say)
    use_database(main, control)
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
        # While the billing sandbox effects_confirmed pushed to still runs: DBOS pushes to the same one.
        _dbos_series(report, dbos, "dbos_push",
                     lambda: dbos_push_series(dbos, effect_contacts, billing_sandbox_url(RUN_DIR), env, say), say)
        report["latency"].update(inbound_latency(
            inbound, env, rate=max(1.0, _at(series["events_applied"], 2) / 2), events=_count(LATENCY_EVENTS, scale),
            say=say))
        report["latency"].update(effect_latency(
            inbound, env, rate=max(1.0, _at(series["effects_confirmed"], 2) / 2),
            events=_count(LATENCY_EFFECTS, scale), say=say))
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
    env = {**os.environ, "NEXUS_DB_URL": db_url(cfg, main), "NEXUS_CONTROL_DB_URL": db_url(cfg, control),
           **service_secrets_env(RUN_DIR), "PYTHONUNBUFFERED": "1", "NEXUS_LOCK_ORDER": "log"}
    env.pop("NEXUS_FAILPOINTS", None)
    env.pop("NEXUS_WORKER_PROFILE_DIR", None)
    q2_env = {**env, "NEXUS_DB_URL": db_url(cfg, q2), "NEXUS_Q_SAVE_LIMIT": "0"}
    profile_dir = RUN_DIR / "profiles"
    shutil.rmtree(profile_dir, ignore_errors=True)
    if profile:
        env["NEXUS_WORKER_PROFILE_DIR"] = str(profile_dir)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {message}", file=sys.stderr)

    report: dict[str, Any] = {"scale": scale, "machine": {"cpus": os.cpu_count()}, "profiled": profile,
                              "series": {}, "peers": {}}
    try:
        say(f"bench: recreating databases {main}, {control}, {q2}")
        recreate_databases(cfg, [main, control, q2])
        _manage_side_by_side([(["migrate", "--noinput", "-v0"], env), (["migrate", "--noinput", "-v0"], q2_env),
                              (["migrate", "--noinput", "-v0", "--database", "control"], env)])
        say("bench: " + _manage(["flow_deploy", "--org", ORG, str(FLOW_FILE)], env))
        _series(report, cfg, env, q2_env, scale, (main, control), say)
    except (BenchError, DemoError, MySQLdb.Error) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    report["ratios"] = ratios(report)
    report["ratios_not_computed"] = ratio_reasons(report)
    report["targets"] = target_verdicts(report["ratios"], report["ratios_not_computed"])
    dbos = report["peers"].get("dbos")
    if dbos is not None:
        dbos["ratios_not_computed"] = [name for name in report["ratios_not_computed"] if "dbos" in name]
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
