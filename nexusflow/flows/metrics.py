"""The Flow Runtime's Prometheus families (seed 004 section 19), read at scrape time from the database.

Registered in :class:`nexusflow.flows.apps.FlowsConfig.ready` with
:func:`nexusflow.kernel.metrics.register_families`. Labels are closed sets
(states, failure classes, queue classes, step kinds, plan step keys, producer
kinds). docs/operations.md "Metrics" lists every family.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from prometheus_client.core import Metric

from nexusflow.kernel.metrics import age_seconds, counter, gauge, summary

from . import reasons, selectors
from . import transitions as t

#: The reason codes that mean a step's retry budget (attempts or lease expiries) is spent.
RETRY_BUDGET_CODES = (reasons.STEP_RETRY_EXHAUSTED, reasons.LEASE_EXPIRY_EXHAUSTED)


#: The expired leases one scrape counts at most (the gauge saturates there).
UNRECOVERED_LIMIT = 100_000


def flow_families(now: dt.datetime) -> Iterable[Metric]:
    """Every Flow family; ``now`` is the database clock of this scrape."""
    runs = gauge("flow_runs", "FlowRuns by state.", ("state",))
    for state, n in selectors.flow_run_summary().items():
        runs.add_metric([state], n)
    yield runs

    depth = gauge("queue_depth", "Due work waiting for a claim, by worker role and lane.", ("role", "lane"))
    oldest = gauge("queue_oldest_age_seconds", "Seconds the oldest due item of the lane has been eligible.",
                   ("role", "lane"))
    for queue_class, n, since in selectors.flow_queue_by_class(now):
        depth.add_metric(["flow", queue_class], n)
        oldest.add_metric(["flow", queue_class], age_seconds(now, since))
    yield depth
    yield oldest

    outcomes = selectors.flow_attempt_outcomes()
    claims = counter("flow_step_claims", "FlowStepAttempts started (each is one successful claim).")
    claims.add_metric([], sum(n for _s, _f, n in outcomes))
    yield claims
    by_outcome = counter("flow_step_attempts", "FlowStepAttempts by outcome state and failure class.",
                         ("state", "failure_class"))
    for state, failure_class, n in outcomes:
        by_outcome.add_metric([state, failure_class], n)
    yield by_outcome
    expiries = counter("lease_expiries", "Leases that expired and were fenced by recovery, by worker role.", ("role",))
    expiries.add_metric(["flow"], sum(n for s, _f, n in outcomes if s == t.ATTEMPT_FENCED))
    yield expiries
    unrecovered = gauge("leases_expired_unrecovered", "Leases expired and not yet fenced by recovery now, by worker "
                        "role (a pressure signal: at the runtime policy's bound, new step claims wait).", ("role",))
    unrecovered.add_metric(["flow"], selectors.flow_expired_leases(now=now, limit=UNRECOVERED_LIMIT))
    yield unrecovered
    retries = counter("retries", "Attempts after the first, by worker role.", ("role",))
    retries.add_metric(["flow"], selectors.flow_attempt_retries())
    yield retries
    exhausted = gauge("retry_budget_exhausted", "Work whose retry budget is spent, by worker role and reason code.",
                      ("role", "reason_code"))
    for code, n in selectors.flow_steps_by_reason(RETRY_BUDGET_CODES).items():
        exhausted.add_metric(["flow", code], n)
    yield exhausted

    durations = summary("flow_step_attempt_duration_seconds",
                        "Seconds from claim to outcome of finished attempts, by step kind and plan step.",
                        ("step_kind", "plan_step"))
    longest = gauge("flow_step_attempt_max_duration_seconds", "Longest finished attempt, by step kind and plan step.",
                    ("step_kind", "plan_step"))
    for kind, key, n, total, top in selectors.flow_attempt_durations():
        durations.add_metric([kind, key], n, total)
        longest.add_metric([kind, key], top)
    yield durations
    yield longest

    n, total, top = selectors.flow_checkpoint_sizes()
    sizes = summary("flow_checkpoint_bytes", "Bytes of the stored checkpoint context payloads.")
    sizes.add_metric([], n, total)
    biggest = gauge("flow_checkpoint_max_bytes", "Bytes of the largest stored checkpoint context payload.")
    biggest.add_metric([], top)
    yield sizes
    yield biggest

    waiting = gauge("dependencies_waiting", "Waiting dependencies by worker role and producer kind.",
                    ("role", "producer_kind"))
    dep_age = gauge("dependency_oldest_age_seconds", "Seconds the oldest waiting dependency has waited.",
                    ("role", "producer_kind"))
    for producer_kind, rows, since in selectors.flow_dependencies_waiting():
        waiting.add_metric(["flow", producer_kind], rows)
        dep_age.add_metric(["flow", producer_kind], age_seconds(now, since))
    yield waiting
    yield dep_age

    signals = gauge("flow_wake_signals", "FlowWakeSignals by state (unmatched: no waiting dependency named).",
                    ("state",))
    consumed, latency = 0, 0.0
    for state, rows, total in selectors.flow_wake_signals():
        signals.add_metric([state], rows)
        if state == "consumed":
            consumed, latency = rows, total
    wake = summary("flow_wake_latency_seconds", "Seconds from a wake signal's receipt to its consumption.")
    wake.add_metric([], consumed, latency)
    yield signals
    yield wake

    missing = gauge("flow_missing_producers", "Waits whose producer was missing or deleted, by cause.", ("cause",))
    for cause, rows in selectors.flow_missing_producers().items():
        missing.add_metric([cause], rows)
    yield missing
