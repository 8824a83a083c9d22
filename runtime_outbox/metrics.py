"""The Runtime outbox's Prometheus families (seed 004 section 19), read at scrape time from the database.

Registered in :class:`runtime_outbox.apps.RuntimeOutboxConfig.ready`; the lane is the message family (a
closed, declared set).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from prometheus_client.core import Metric

from nexusflow.kernel.metrics import age_seconds, gauge

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
