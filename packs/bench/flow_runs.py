"""``make bench``: durable one-step Flow runs (series ``flow_runs``) and Flow start -> Succeeded latency.

The unit is one run of ``Bench_One_Step`` (an autolaunched flow with one
assignment, ``packs/bench/flows/``) started through the public start path
(``flow_run_start``) and driven by ``run_workers --role flow`` processes
until it succeeded.
"""
from __future__ import annotations

from typing import Any

from packs.bench.measure import ROOT, WORKER_COUNTS, latency_ms, open_loop, point, server_counters, wait_for, workers
from packs.demo.run import Processes

FLOW_FILE = ROOT / "packs" / "bench" / "flows" / "Bench_One_Step.flow-meta.xml"
FLOW_NAME = "Bench_One_Step"
ORG = "bench-org"
#: Runs per series point and latency runs at scale 1.
FLOW_RUNS, LATENCY_RUNS = 400, 200


def start_run(request_id: str, counted: int = 0) -> int:
    """Start one ``Bench_One_Step`` run of :data:`ORG` through ``flow_run_start``; return its FlowRun id.

    ``request_id`` is the start's idempotency key (unique per run).
    """
    from nexusflow.flows.services import flow_run_start
    from nexusflow.kernel.scope import OrgScope

    return int(flow_run_start(org=OrgScope(ORG), flow_api_name=FLOW_NAME, inputs={"counted": counted},
                              request_id=request_id).run.pk)


def wait_succeeded(ids: list[int], procs: Processes) -> None:
    """Wait until every FlowRun of ``ids`` is ``Succeeded`` (see :func:`packs.bench.measure.wait_for`)."""
    from nexusflow.flows.models import FlowRun

    wait_for(f"{len(ids)} Flow runs", lambda: FlowRun.objects.filter(
        org_id=ORG, pk__in=ids, state="Succeeded").count() == len(ids), procs)


#: Runs started and awaited (not measured) once every latency worker is up: their first claims load what a
#: worker reads once per process (plan, policy, connections).
WARM_UP_RUNS = 4


def workers_ready(procs: Processes, warm_up: list[int]) -> None:
    """Wait until every process of ``procs`` logged its ``worker.start`` line and the runs ``warm_up`` succeeded.

    The latency is that of running workers: without this wait the first runs of the open loop would also
    wait for the worker processes to start (about a second on this machine) and be charged for it.

    Raises:
        BenchError: as :func:`packs.bench.measure.wait_for`.
    """
    from packs.bench.measure import workers_started

    wait_for("the flow workers' start", lambda: workers_started(procs), procs)
    wait_succeeded(warm_up, procs)


def flow_runs_series(cfg: dict, env: dict, runs: int, say) -> list[dict[str, Any]]:
    """Durable one-step Flow runs per second with 1, 2 and 4 ``run_workers --role flow`` processes.

    Per point ``runs`` runs are started first, then the workers drain them;
    the span is the runs' first ``started_at`` to their last ``completed_at``.
    Returns one :func:`packs.bench.measure.point` per worker count.
    """
    from nexusflow.flows.models import FlowRun

    points = []
    for n in WORKER_COUNTS:
        ids = [start_run(f"w{n}-{i}", i) for i in range(runs)]
        say(f"bench: NexusFlow flow workers x{n}: {len(ids)} runs")
        before = server_counters(cfg)
        try:
            with workers(("flow",), n, f"flow-{n}", env) as procs:
                wait_succeeded(ids, procs)
        finally:
            after = server_counters(cfg)
        rows = FlowRun.objects.filter(org_id=ORG, pk__in=ids)
        started = min(r.started_at for r in rows if r.started_at)
        completed = max(r.completed_at for r in rows if r.completed_at)
        points.append(point(n, len(ids), (completed - started).total_seconds(), before, after))
    return points


def flow_latency(env: dict, *, rate: float, runs: int, say) -> dict[str, Any]:
    """Flow start -> Succeeded latency (ms) under an open-loop arrival of ``rate`` starts/s, two flow workers.

    Runs are started on a fixed schedule once the workers run (:func:`workers_ready`; a start that falls
    behind the schedule is not skipped); each run's latency is its ``completed_at`` minus its ``created_at``
    (both the database clock).
    Returns ``{"arrival_per_second", "units", "workers", "p50_ms", "p95_ms", "p99_ms"}``.
    """
    from nexusflow.flows.models import FlowRun

    say(f"bench: Flow start -> Succeeded latency, {runs} runs at {rate:.0f}/s, 2 flow workers")
    ids: list[int] = []
    with workers(("flow",), 2, "flow-latency", env) as procs:
        workers_ready(procs, [start_run(f"latency-warm-{i}", i) for i in range(WARM_UP_RUNS)])
        open_loop(runs, rate, lambda i: ids.append(start_run(f"latency-{i}", i)))
        wait_succeeded(ids, procs)
    latencies = [(r.completed_at - r.created_at).total_seconds() * 1000
                 for r in FlowRun.objects.filter(org_id=ORG, pk__in=ids).only("created_at", "completed_at")]
    return {"arrival_per_second": rate, "units": len(ids), "workers": 2, **latency_ms(latencies)}
