"""Periodic reconcilers as django-q2 schedules on the ORM broker (seed 004 section 16: the
maintenance/reconciliation class; issue 22 item 4).

A reconciler is a worker role's unit that repairs or closes work left behind
(expired leases, dead holders' Permits, uncertain effects, windows to close,
dependencies to expire, waits to repair, cancellations to clean up). Apps
register theirs with :func:`register_reconciler` when they load; the unit
itself stays the worker role's (one implementation, two runners).

``manage.py schedules install`` writes one ``django_q.Schedule`` per
reconciler, named ``nexusflow.reconcile.<unit>``, whose function is
:func:`run_reconciler` with the unit's name: ``manage.py qcluster`` runs it
every ``minutes``; each run takes at most ``NEXUS_SCHEDULE_BATCH`` items
(default 100) and stops at the first empty try. Its last run, result (items
done) and failures are in django-q2's admin (*Scheduled tasks*, *Successful
tasks*, *Failed tasks*).

Which runner is authoritative is the setting ``NEXUS_RECONCILERS``:
``workers`` (default: ``run_workers`` loops run the reconcilers between their
other units, for deployments without ``qcluster``) or ``schedules``
(``run_workers`` leaves the reconcilers out; ``qcluster`` runs them). Every
reconciler unit already runs in many worker processes at once, so two runs
of the same one (a schedule overlapping a worker, a slow run overlapping the
next) are safe: each item is claimed under its own row lock and version.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import random
import socket

from django.conf import settings

from nexusflow.kernel.errors import NexusError

#: Prefix of every installed schedule's name.
SCHEDULE_PREFIX = "nexusflow.reconcile."
#: The function path every reconciler schedule runs.
FUNC = "nexusflow.kernel.schedules.run_reconciler"


class UnknownReconciler(NexusError):
    code = "unknown_reconciler"


@dataclasses.dataclass(frozen=True)
class Reconciler:
    """One registered reconciler: the worker ``role`` whose unit ``unit`` it runs every ``minutes``."""

    unit: str
    role: str
    minutes: int

    @property
    def schedule_name(self) -> str:
        return SCHEDULE_PREFIX + self.unit


_RECONCILERS: dict[str, Reconciler] = {}


def register_reconciler(unit: str, *, role: str, minutes: int = 1) -> None:
    """Register the unit ``unit`` of worker role ``role`` as a reconciler run every ``minutes`` (>= 1).

    Raises:
        ValueError: ``minutes`` below 1, or ``unit`` registered already for another role.
    """
    if minutes < 1:
        raise ValueError("a reconciler runs at most once a minute")
    current = _RECONCILERS.get(unit)
    if current is not None and current.role != role:
        raise ValueError(f"reconciler {unit!r} is registered already for role {current.role!r}")
    _RECONCILERS[unit] = Reconciler(unit, role, int(minutes))


def reconcilers() -> tuple[Reconciler, ...]:
    """The registered reconcilers, by unit name."""
    return tuple(_RECONCILERS[name] for name in sorted(_RECONCILERS))


def scheduled() -> bool:
    """``True`` when ``NEXUS_RECONCILERS=schedules``: ``qcluster`` is the authoritative reconciler runner."""
    return getattr(settings, "NEXUS_RECONCILERS", "workers") == "schedules"


def batch_size() -> int:
    """Most items one scheduled run takes (``NEXUS_SCHEDULE_BATCH``, default 100)."""
    return int(getattr(settings, "NEXUS_SCHEDULE_BATCH", 100))


def run_reconciler(unit: str, batch: int | None = None) -> int:
    """Run reconciler ``unit`` until it finds nothing or ``batch`` items are done; the schedules' function.

    Returns:
        The number of items done (django-q2 stores it as the task's result).

    Raises:
        UnknownReconciler: ``unit`` is not a registered reconciler.
    """
    from nexusflow.kernel.workers import units_for

    found = _RECONCILERS.get(unit)
    if found is None:
        raise UnknownReconciler(f"{unit!r} is not a registered reconciler")
    worker_id = f"schedule-{socket.gethostname()[:40]}-{os.getpid()}"
    step = dict(units_for(found.role, worker_id, include_reconcilers=True))[unit]
    limit = batch_size() if batch is None else int(batch)
    done = 0
    while done < limit and step():
        done += 1
    return done


def install(*, now: dt.datetime, rng: random.Random | None = None) -> tuple[list[str], list[str]]:
    """Write one ``django_q.Schedule`` per reconciler, idempotently; returns ``(created, updated)`` names.

    A missing schedule is created with its first run jittered uniformly over
    one interval after ``now`` (reconcilers installed together do not all run
    in the same second); an existing one keeps its next run and only has its
    function, argument, kind and interval corrected. Schedules of units no
    longer registered are left alone (listed by ``schedules list``).
    """
    from django.db import transaction
    from django_q.models import Schedule

    rng = rng or random.Random()
    created, updated = [], []
    with transaction.atomic():
        for reconciler in reconcilers():
            wanted = {"func": FUNC, "args": repr(reconciler.unit), "schedule_type": Schedule.MINUTES,
                      "minutes": reconciler.minutes, "repeats": -1}
            row = Schedule.objects.select_for_update().filter(name=reconciler.schedule_name).first()
            if row is None:
                Schedule.objects.create(name=reconciler.schedule_name, next_run=now + dt.timedelta(
                    seconds=rng.uniform(0, reconciler.minutes * 60)), **wanted)
                created.append(reconciler.schedule_name)
            elif any(getattr(row, key) != value for key, value in wanted.items()):
                for key, value in wanted.items():
                    setattr(row, key, value)
                row.save(update_fields=list(wanted))
                updated.append(reconciler.schedule_name)
    return created, updated
