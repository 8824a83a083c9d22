"""``make bench``: the Flow step claim and webhook admission p99 with 1x and 10x retained terminal history.

A durable runtime keeps its terminal rows (runs, steps, attempts,
checkpoints, audit; receipts, events, executions, results), so its claim
and admission paths must not slow down as they pile up. The run measures
both twice:

1. **1x**: the history is what the earlier series left (every one-step Flow
   run ``Succeeded``, every webhook event applied). ``samples`` claims of
   ``flow_step_claim_one`` (each claimed step then executed, untimed, so
   its run succeeds like the others), in this process with no worker
   running; then ``samples`` single-event webhook POSTs timed at the client
   (admission only, no worker running).
2. **10x**: the terminal rows of 1x are copied nine times in the bench
   database (:func:`amplify`), the tables analyzed, and both measured again.

The copies are the real terminal rows, ``INSERT ... SELECT`` with every id
and every reference among the copied rows moved by a per-table offset, and
each unique key rewritten to a new value of the same shape (a Flow start's
``start:<sha1>`` record key, an event's ``subscriptionId/eventId`` source
key with a new event id, the transport key and the Runtime command id as new
SHA-256 digests); everything else (states, timestamps, payloads, plan,
lanes, records) is the original's. Record-triggered runs (the billing push
with its dependency, effect and wake rows) stay 1x.
"""
from __future__ import annotations

import time
from typing import Any

from packs.bench.flow_runs import start_run
from packs.bench.inbound import Inbound
from packs.bench.measure import BenchError, connect, latency_ms
from packs.demo.run import TimedPoster

#: Claims and admissions measured per history size at scale 1.
HISTORY_SAMPLES = 250
#: History multiplier of the second measurement.
FACTOR = 10
CLAIM_WORKER_ID = "bench-claim"
#: Claims and admissions made before the timed ones of each measurement.
WARM_UP = 5

#: A one-step run's own start key: ``start:`` and a SHA-1 (flows.services.admission).
_START_KEY = "CONCAT('start:', SHA1(CONCAT(t.record_key, '/', ks.k)))"
#: The route's source event key ``<len>:<subscriptionId>/<len>:<eventId>`` with the event id moved by k x 10^12.
_EVENT_ID = "(CAST(SUBSTRING_INDEX(t.source_event_key, ':', -1) AS UNSIGNED) + ks.k * 1000000000000)"
_SOURCE_EVENT_KEY = (f"CONCAT(SUBSTRING_INDEX(t.source_event_key, '/', 1), '/', LENGTH({_EVENT_ID}), ':', "
                     f"{_EVENT_ID})")
_NEW_DIGEST = "SHA2(CONCAT(t.{column}, '/', ks.k), 256)"
#: Autolaunched one-step runs that succeeded: the Flow history the copies multiply.
_RUNS = "SELECT id FROM flows_flowrun WHERE trigger_object_name = '-' AND state = 'Succeeded' AND id <= {run_snapshot}"


def _history_models() -> list[tuple[Any, str, dict[str, str]]]:
    """``(model, row filter, {column: rewritten value})`` per copied table, parents first.

    A filter may name ``{run_snapshot}`` (the highest FlowRun id at the
    snapshot); the copied rows are always those at or below their table's.
    """
    from connectors.models import (
        Event,
        Execution,
        ExecutionAttempt,
        Projection,
        Receipt,
        ReceiptAdmissionKey,
        ReceiptComponent,
    )
    from nexusflow.flows.models import FlowAuditEvent, FlowCheckpoint, FlowRun, FlowStepAttempt, FlowStepExecution
    from runtime_outbox.models import ApplicationResult

    steps = f"SELECT s.id FROM flows_flowstepexecution s WHERE s.run_id IN ({_RUNS})"
    return [
        (FlowRun, "t.trigger_object_name = '-' AND t.state = 'Succeeded'", {"record_key": _START_KEY}),
        (FlowStepExecution, f"t.run_id IN ({_RUNS})", {}),
        (FlowStepAttempt, f"t.step_id IN ({steps})", {}),
        (FlowCheckpoint, f"t.run_id IN ({_RUNS})", {}),
        (FlowAuditEvent, f"t.run_id IN ({_RUNS})", {}),
        (Receipt, "TRUE", {}),
        (ReceiptAdmissionKey, "t.receipt_id IS NOT NULL",
         {"transport_key": _NEW_DIGEST.format(column="transport_key")}),
        (Event, "TRUE", {"source_event_key": _SOURCE_EVENT_KEY}),
        (ReceiptComponent, "TRUE", {}),
        (Projection, "TRUE", {}),
        (ApplicationResult, "TRUE", {"command_id": _NEW_DIGEST.format(column="command_id")}),
        (Execution, "TRUE", {"command_id": _NEW_DIGEST.format(column="command_id")}),
        (ExecutionAttempt, "TRUE", {}),
    ]


def _label(model) -> str:
    return model._meta.label


def _max_ids(cursor, models) -> dict[str, int]:
    out = {}
    for model in models:
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM `{model._meta.db_table}`")
        out[_label(model)] = int(cursor.fetchone()[0])
    return out


def copy_statement(model, *, where: str, rekey: dict[str, str], snapshot: dict[str, int], offsets: dict[str, int],
                   copies: int) -> str:
    """The ``INSERT ... SELECT`` that copies ``model``'s rows ``copies`` times (copy k = 1..copies).

    Args:
        model: a Django model of the bench database.
        where: SQL over the source row ``t``; ``{run_snapshot}`` is the snapshot's highest FlowRun id.
        rekey: ``{column: SQL}``: the copy's value of a unique column (``t`` the row, ``ks.k`` the copy number).
        snapshot: ``{label: highest id}``: rows above it are never copied.
        offsets: ``{label: id offset}``: copy k of a row (and of every reference to it) is id + k x offset.
        copies: how many copies of each row.

    Returns:
        One SQL statement (no parameters).
    """
    from nexusflow.kernel.models import TypedIdReference

    label = _label(model)
    values = []
    for field in model._meta.concrete_fields:
        column = field.column
        target = None
        if field.primary_key:
            target = label
        elif field.is_relation and field.related_model is not None:
            target = _label(field.related_model)
        elif isinstance(field, TypedIdReference):
            target = field.to
        if column in rekey:
            values.append(rekey[column])
        elif target in offsets:
            values.append(f"t.`{column}` + ks.k * {offsets[target]}")
        else:
            values.append(f"t.`{column}`")
    numbers = " UNION ALL ".join(f"SELECT {k} AS k" for k in range(1, copies + 1))
    columns = ", ".join(f"`{f.column}`" for f in model._meta.concrete_fields)
    condition = where.format(run_snapshot=snapshot.get("flows.FlowRun", 0))
    return (f"INSERT INTO `{model._meta.db_table}` ({columns}) SELECT {', '.join(values)} "
            f"FROM `{model._meta.db_table}` t CROSS JOIN ({numbers}) ks "
            f"WHERE t.id <= {snapshot[label]} AND ({condition})")


def amplify(cfg: dict, database: str, *, factor: int = FACTOR, snapshot: dict[str, int]) -> dict[str, int]:
    """Copy the terminal history at or below ``snapshot`` ``factor - 1`` times; return the rows inserted per table.

    Runs in one transaction on its own connection with foreign-key checks off
    for that session (a run and its current step reference each other), then
    ``ANALYZE TABLE`` on every copied table.

    Raises:
        BenchError: an Execution of the history is not settled (the history must be terminal).
        MySQLdb.Error: a statement failed.
    """
    models = _history_models()
    conn = connect(cfg, database)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT COUNT(*) FROM connectors_execution WHERE id <= %s AND state NOT IN "
                       "('completed', 'superseded', 'quarantined')", [snapshot["connectors.Execution"]])
        if cursor.fetchone()[0]:
            raise BenchError("the webhook history holds unsettled executions; it cannot be copied as terminal")
        offsets = _max_ids(cursor, [m for m, _, _ in models])
        cursor.execute("SET SESSION foreign_key_checks = 0")
        inserted = {}
        for model, where, rekey in models:
            cursor.execute(copy_statement(model, where=where, rekey=rekey, snapshot=snapshot, offsets=offsets,
                                          copies=factor - 1))
            inserted[_label(model)] = cursor.rowcount
        conn.commit()
        cursor.execute("SET SESSION foreign_key_checks = 1")
        for model, _, _ in models:
            cursor.execute(f"ANALYZE TABLE `{model._meta.db_table}`")
            cursor.fetchall()
        return inserted
    finally:
        conn.close()


def history_counts() -> dict[str, int]:
    """Terminal rows retained now: ``{"flow_runs": Succeeded FlowRuns, "events": applied Events}`` (all orgs)."""
    from connectors.models import Execution
    from nexusflow.flows.models import FlowRun

    return {"flow_runs": FlowRun.objects.filter(state="Succeeded").count(),
            "events": Execution.objects.filter(state="completed").count()}


def claim_latencies(samples: int, label: str) -> list[float]:
    """Start ``samples`` one-step runs, then claim each with ``flow_step_claim_one`` here; return each claim's ms.

    Each claimed step is executed (``flow_step_execute``, untimed) so the
    run succeeds and joins the history like every other. The first
    :data:`WARM_UP` claims are not timed (first-use costs of this process).

    Raises:
        BenchError: a claim found no due step although one was started.
    """
    from nexusflow.flows.services import flow_step_claim_one, flow_step_execute

    for i in range(WARM_UP + samples):
        start_run(f"{label}-{i}", i)
    out = []
    for i in range(WARM_UP + samples):
        began = time.perf_counter()
        claim = flow_step_claim_one(worker_id=CLAIM_WORKER_ID)
        if i >= WARM_UP:
            out.append((time.perf_counter() - began) * 1000)
        if claim is None:
            raise BenchError(f"flow_step_claim_one found no due step of the runs of {label}")
        flow_step_execute(claim=claim)
    return out


def admission_latencies(inbound: Inbound, samples: int) -> list[float]:
    """POST ``samples`` single-event deliveries (an ``email`` change of a new contact each); return each POST's ms.

    The first :data:`WARM_UP` POSTs (a new connection) are not timed.
    """
    with TimedPoster(url=inbound.url, secret=inbound.secret) as poster:
        times = [inbound.post(poster, [inbound.event(o, "email", f"hist{o}@example.com")]) * 1000
                 for o in inbound.new_contacts(WARM_UP + samples)]
    return times[WARM_UP:]


def _measure(inbound: Inbound, samples: int, label: str) -> dict[str, Any]:
    return {"history": history_counts(), "claim": latency_ms(claim_latencies(samples, f"claim-{label}")),
            "admission": latency_ms(admission_latencies(inbound, samples))}


def history_p99(cfg: dict, database: str, inbound: Inbound, *, samples: int, say) -> dict[str, Any]:
    """Claim and admission latency (ms) with the history as the run left it (1x) and copied to ``FACTOR`` x.

    Returns ``{"samples", "1x": {...}, "10x": {...}, "copied_rows": {table: rows}}``; each size holds
    ``history`` (:func:`history_counts`), ``claim`` and ``admission`` (``p50_ms``, ``p95_ms``, ``p99_ms``).

    Raises:
        BenchError: a claim found nothing or the history was not terminal.
        DemoError: a POST failed below HTTP.
    """
    from connectors.models import Execution

    conn = connect(cfg, database)
    try:
        snapshot = _max_ids(conn.cursor(), [m for m, _, _ in _history_models()])
    finally:
        conn.close()
    if Execution.objects.filter(pk__lte=snapshot["connectors.Execution"], state__in=("ready", "waiting_dependency")
                                ).exists():
        raise BenchError("the webhook history holds unsettled executions")
    say(f"bench: claim and admission p99 with 1x history ({samples} of each, no worker running)")
    one = _measure(inbound, samples, "1x")
    began = time.monotonic()
    copied = amplify(cfg, database, snapshot=snapshot)
    say(f"bench: history copied to {FACTOR}x in {time.monotonic() - began:.1f} s ({sum(copied.values())} rows)")
    ten = _measure(inbound, samples, f"{FACTOR}x")
    return {"samples": samples, "1x": one, f"{FACTOR}x": ten, "copied_rows": copied}
