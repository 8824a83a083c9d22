"""The Runtime outbox's Prometheus families (seed 004 section 19), read at scrape time from the database.

Registered in :class:`runtime_outbox.apps.RuntimeOutboxConfig.ready`; the lane is the message family (a
closed, declared set).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from prometheus_client.core import Metric

from nexusflow.kernel.metrics import age_seconds, counter, gauge

from .selectors import outbox_due_by_family


def outbox_families(now: dt.datetime) -> Iterable[Metric]:
    """Due outbox deliveries by message family; ``now`` is the database clock of this scrape."""
    depth = gauge("queue_depth", "Due work waiting for a claim, by worker role and lane.", ("role", "lane"))
    oldest = gauge("queue_oldest_age_seconds", "Seconds the oldest due item of the lane has been eligible.",
                   ("role", "lane"))
    for family, n, since in outbox_due_by_family(now):
        depth.add_metric(["runtime", family], n)
        oldest.add_metric(["runtime", family], age_seconds(now, since))
    yield depth
    yield oldest


#: The admission purposes judged at a scrape (``nexusflow.kernel.pressure``).
ADMISSION_PURPOSES = ("mutation", "ingress")


def admission_families(now: dt.datetime) -> Iterable[Metric]:
    """The database's own load and lock counters, and what the runtime policy in force admits now (seed 004
    section 16.2 pressure signals; docs/operations.md "The runtime policy")."""
    from nexusflow.kernel.pressure import judge, read_pressure
    from nexusflow.kernel.selectors import database_status

    from .policy import runtime_policy

    status = database_status()
    waits = gauge("database_row_lock_waits", "Transactions of the server waiting for a row lock now.")
    waits.add_metric([], status["Innodb_row_lock_current_waits"])
    yield waits
    waits_total = counter("database_row_lock_waits", "Row lock waits of the server since it started.")
    waits_total.add_metric([], status["Innodb_row_lock_waits"])
    yield waits_total
    deadlocks = counter("database_deadlocks", "Deadlocks the server resolved since it started.")
    deadlocks.add_metric([], status["Innodb_deadlocks"])
    yield deadlocks
    policy = runtime_policy()
    mutation = read_pressure(policy.pressure, status=status)
    judged = {"mutation": mutation,
              "ingress": judge(mutation, policy.ingress.as_pressure(policy.pressure.read_seconds))}
    sessions = gauge("database_sessions", "Sessions on the database: this account's on its database, and the "
                     "server's.", ("scope", "state"))
    sessions.add_metric(["account", "connected"], judged["mutation"].connections)
    sessions.add_metric(["account", "running"], judged["mutation"].active_statements)
    sessions.add_metric(["server", "connected"], status["Threads_connected"])
    sessions.add_metric(["server", "running"], status["Threads_running"])
    yield sessions
    paused = gauge("admission_paused", "1 while the runtime policy's bounds pause new work of the purpose "
                   "(mutation: Flow step claims; ingress: webhook shedding).", ("purpose",))
    for purpose in ADMISSION_PURPOSES:
        paused.add_metric([purpose], 1 if judged[purpose].reason else 0)
    yield paused
    info = gauge("runtime_policy_info", "The runtime policy version in force for the environment.", ("version",))
    info.add_metric([policy.version], 1)
    yield info
