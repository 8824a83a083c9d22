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

import datetime as dt
import os
import random
import socket

from django.conf import settings

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.workers import (  # noqa: F401  (the registry lives with the worker roles it names)
    SCHEDULE_PREFIX,
    Reconciler,
    reconcilers,
    register_reconciler,
    scheduled,
    units_for,
)

#: The function path every reconciler schedule runs.
FUNC = "nexusflow.kernel.schedules.run_reconciler"


class UnknownReconciler(NexusError):
    code = "unknown_reconciler"


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
    found = next((r for r in reconcilers() if r.unit == unit), None)
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
    longer registered are left alone. Run it from one place per deployment
    (beside ``migrate``): two installs racing on an empty table could both
    create a schedule (django-q2's schedule name is not unique); a duplicate
    run is harmless (every reconciler is safe to run twice) and the later
    one can be deleted in the admin.
    """
    from django.db import transaction
    from django_q.models import Schedule

    rng = rng or random.Random()
    created, updated = [], []
    with transaction.atomic():
        for reconciler in reconcilers():
            wanted = {"func": FUNC, "args": repr(reconciler.unit), "schedule_type": Schedule.MINUTES,
                      "minutes": reconciler.minutes, "repeats": -1}
            row = Schedule.objects.filter(name=reconciler.schedule_name).order_by("id").first()
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
