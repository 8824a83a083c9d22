"""The connector's Prometheus families (seed 004 section 19), read at scrape time from the database.

Registered in :class:`connectors.apps.ConnectorsConfig.ready` with
:func:`nexusflow.kernel.metrics.register_families`. Labels are closed sets
(states, reason codes, gate kinds): never an account, a lane key or a record
id. docs/operations.md "Metrics" lists every family.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from prometheus_client.core import Metric

from connectors import reasons, selectors
from nexusflow.kernel.metrics import age_seconds, counter, gauge, summary

#: The reason code that means an effect's retry budget is spent.
RETRY_BUDGET_CODES = (reasons.RETRY_EXHAUSTED,)


def connector_families(now: dt.datetime) -> Iterable[Metric]:
    """Every connector family; ``now`` is the database clock of this scrape."""
    depth = gauge("queue_depth", "Due work waiting for a claim, by worker role and lane.", ("role", "lane"))
    oldest = gauge("queue_oldest_age_seconds", "Seconds the oldest due item of the lane has been eligible.",
                   ("role", "lane"))
    for role, lane, (n, since) in (("connector", "execution", selectors.executions_ready_queue()),
                                   ("egress", "effect", selectors.effects_due_queue(now))):
        depth.add_metric([role, lane], n)
        oldest.add_metric([role, lane], age_seconds(now, since))
    yield depth
    yield oldest

    expiries = counter("lease_expiries", "Leases that expired and were fenced by recovery, by worker role.", ("role",))
    expiries.add_metric(["connector"], sum(n for state, n in selectors.execution_attempts_by_state()
                                           if state == "expired"))
    yield expiries
    retries = counter("retries", "Attempts after the first, by worker role.", ("role",))
    retries.add_metric(["egress"], selectors.effect_attempt_retries())
    yield retries

    effects = gauge("effects", "RemoteEffects by state and reason code (uncertain and quarantined carry one).",
                    ("state", "reason_code"))
    exhausted = gauge("retry_budget_exhausted", "Work whose retry budget is spent, by worker role and reason code.",
                      ("role", "reason_code"))
    spent = dict.fromkeys(RETRY_BUDGET_CODES, 0)
    for state, code, n in selectors.effects_by_state_and_reason():
        effects.add_metric([state, code], n)
        if code in spent:
            spent[code] += n
    for code, n in spent.items():
        exhausted.add_metric(["egress", code], n)
    yield effects
    yield exhausted

    latencies = selectors.effect_latencies()
    submit = summary("effect_submit_latency_seconds", "Seconds from an effect's intent to its first request.")
    submit.add_metric([], *latencies["submit"])
    completion = summary("effect_completion_latency_seconds",
                         "Seconds from an effect's intent to its terminal state, by that state.", ("state",))
    for state in ("finalized", "no_effect"):
        completion.add_metric([state], *latencies[state])
    yield submit
    yield completion

    permits = gauge("dispatch_permits_open", "Open DispatchPermits (granted or sending) by state.", ("state",))
    permit_age = gauge("dispatch_permit_oldest_age_seconds", "Seconds the oldest open DispatchPermit has been open.",
                       ("state",))
    for state, n, since in selectors.permits_open_by_state():
        permits.add_metric([state], n)
        permit_age.add_metric([state], age_seconds(now, since))
    yield permits
    yield permit_age

    gates = gauge("gates", "Serving and credential dispatch gates by kind and state.", ("gate", "state"))
    for kind, state, n in selectors.gates_by_state():
        gates.add_metric([kind, state], n)
    yield gates

    waiting = gauge("dependencies_waiting", "Waiting dependencies by worker role and producer kind.",
                    ("role", "producer_kind"))
    dep_age = gauge("dependency_oldest_age_seconds", "Seconds the oldest waiting dependency has waited.",
                    ("role", "producer_kind"))
    n, since = selectors.execution_dependencies_waiting()
    waiting.add_metric(["connector", "ordering_lane"], n)
    dep_age.add_metric(["connector", "ordering_lane"], age_seconds(now, since))
    yield waiting
    yield dep_age
