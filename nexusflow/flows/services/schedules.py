"""Schedule-triggered flows: one durable run per matching record at each occurrence, on the database clock
(seed 004 section 12.1; docs/operations.md "Schedule-triggered flows").

A Flow whose start is ``Scheduled`` names a schedule (``frequency`` ``Once``,
``Daily`` or ``Weekly``; ``startDate``; ``startTime``, UTC), an object and
entry filters. The worker unit ``flow.schedule`` (:func:`flow_try_schedule_one`):

1. finishes an occurrence still ``admitting`` first: one transaction locks the
   :class:`FlowScheduleOccurrence`, reads the next batch of the object's live
   records after its cursor (record key order, at most
   :func:`..policy.schedule_batch`), admits one run per record that meets the
   filters (entry path ``@schedule:<occurrence>``; the run key ``(org, plan,
   record, record version, entry path)`` admits a record once) and moves the
   cursor, or ends the occurrence ``admitted`` after the last batch;
2. otherwise opens the latest due occurrence of one active schedule-triggered
   activation: the schedule's latest time at or before the database clock
   and not before the activation itself (an activation never runs the
   occurrences that came before it; missed occurrences coalesce into the
   latest one). A redeploy counts from the first of the unbroken run of
   schedule-triggered activations it superseded, so an occurrence due before
   it and not yet opened is not lost. The occurrence row is unique per ``(org, flow, time)``, so
   concurrent sweeps and a redeploy of the flow open it once.

Each run is an ordinary record-bound run (``$Record`` is the record as it was
at admission; there is no prior record), claimed and executed like any other.
"""
from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError, transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.scope import OrgScope

from .. import policy
from .. import transitions as t
from ..conditions import filters_hold_unchanged
from ..models import FlowActivation, FlowScheduleOccurrence
from ..schedule import SCHEDULED, ScheduleInvalid, entry_path_of, schedule_latest_due, schedule_next, schedule_start
from ..store import FlowScheduleOccurrenceStore
from .admission import _run_admit

log = logging.getLogger("nexusflow.flows")

FP_SCHEDULE_BATCH = failpoints.declare("flow.schedule.batch_before_commit")


def _scheduled_activations():
    return (FlowActivation.objects.filter(state=t.ACTIVATION_ACTIVE,
                                          plan__plan_payload__trigger__trigger_type=SCHEDULED)
            .select_related("plan").order_by("id"))


def _scheduled_since(activation: FlowActivation):
    """Since when the activation's flow has been schedule-triggered without a break: its own time, or that of
    the activations it superseded (newest first) while their plans were schedule-triggered too."""
    since = activation.created_at
    for created_at, payload in (FlowActivation.objects.filter(
            org_id=activation.org_id, flow_api_name=activation.flow_api_name, created_at__lt=since)
            .order_by("-created_at", "-id").values_list("created_at", "plan__plan_payload").iterator()):
        if ((payload or {}).get("trigger") or {}).get("trigger_type") != SCHEDULED:
            break
        since = created_at
    return since


def flow_try_schedule_one() -> bool:
    """Admit one batch of a due schedule occurrence, or open one (worker unit ``flow.schedule``; module
    docstring). True when it did work."""
    pending = (FlowScheduleOccurrence.objects.filter(state=t.OCCURRENCE_ADMITTING).order_by("id")
               .values_list("org_id", "id").first())
    if pending is not None:
        return _admit_batch(org_id=pending[0], occurrence_id=pending[1])
    now = db_now()
    for activation in _scheduled_activations():
        schedule = activation.plan.plan_payload["trigger"].get("schedule")
        try:
            due = schedule_latest_due(schedule, now=now, not_before=activation.created_at)
            if due is None:  # a redeploy after an occurrence not yet opened must not lose it
                due = schedule_latest_due(schedule, now=now, not_before=_scheduled_since(activation))
        except ScheduleInvalid as exc:  # activation refuses it; an older plan row cannot be run
            log.warning("schedule not timed: %s", exc, extra={"org_id": activation.org_id})
            continue
        if due is None or FlowScheduleOccurrence.objects.filter(
                org_id=activation.org_id, flow_api_name=activation.flow_api_name, occurrence_at=due).exists():
            continue
        try:
            with transaction.atomic(durable=True):
                FlowScheduleOccurrenceStore.create(
                    org_id=activation.org_id, flow_api_name=activation.flow_api_name, plan=activation.plan,
                    occurrence_at=due, state=t.OCCURRENCE_ADMITTING, created_at=db_now())
        except IntegrityError:  # another sweep opened it
            continue
        return True
    return False


def _admit_batch(*, org_id: str, occurrence_id: int) -> bool:
    """One bounded admission transaction of an ``admitting`` occurrence (module docstring, step 1)."""
    from nexusflow.records.models import Record

    with transaction.atomic(durable=True):
        occurrence = FlowScheduleOccurrenceStore.lock(org_id, occurrence_id)
        if occurrence.state != t.OCCURRENCE_ADMITTING:
            return False
        plan = occurrence.plan
        trigger = plan.plan_payload["trigger"]
        batch_size = policy.schedule_batch()
        records = Record.objects.filter(org_id=org_id, object_name=trigger["object"], is_deleted=False)
        if occurrence.cursor_record_key is not None:
            records = records.filter(record_key__gt=occurrence.cursor_record_key)
        batch = list(records.order_by("record_key")[:batch_size])
        path = entry_path_of(occurrence.occurrence_at)
        admitted = 0
        for record in batch:
            if filters_hold_unchanged(trigger, record.fields) and _run_admit(
                    org=OrgScope(org_id), plan=plan, record=record, prior_fields=None, entry_path=path) is not None:
                admitted += 1
        progress = {"considered": occurrence.considered + len(batch), "admitted": occurrence.admitted + admitted,
                    "cursor_record_key": batch[-1].record_key if batch else occurrence.cursor_record_key}
        if len(batch) < batch_size:
            FlowScheduleOccurrenceStore.transition(
                org_id=org_id, pk=occurrence.pk, src=t.OCCURRENCE_ADMITTING, dst=t.OCCURRENCE_ADMITTED,
                version=occurrence.version, set_fields={**progress, "completed_at": db_now()})
        else:
            FlowScheduleOccurrenceStore.touch(org_id=org_id, pk=occurrence.pk, state=t.OCCURRENCE_ADMITTING,
                                              version=occurrence.version, set_fields=progress)
        failpoints.hit(FP_SCHEDULE_BATCH)
    return True


def flow_schedules_list(*, org: OrgScope) -> list[dict[str, Any]]:
    """The org's active schedule-triggered flows: schedule, next occurrence and the latest occurrences.

    Returns:
        One object per flow: ``flow``, ``object``, ``frequency``, ``start`` and ``next_occurrence`` (ISO
        UTC), ``active_since``, and ``occurrences`` (newest first, at most 5: ``occurrence_at``, ``state``,
        ``considered``, ``admitted``, ``completed_at``).
    """
    now = db_now()
    out = []
    for activation in _scheduled_activations().filter(org_id=org.org_id):
        trigger = activation.plan.plan_payload["trigger"]
        schedule = trigger.get("schedule") or {}
        try:
            start = schedule_start(schedule).isoformat()
            following = schedule_next(schedule, after=now)
        except ScheduleInvalid:
            start, following = None, None
        occurrences = FlowScheduleOccurrence.objects.filter(
            org_id=org.org_id, flow_api_name=activation.flow_api_name).order_by("-occurrence_at")[:5]
        out.append({
            "flow": activation.flow_api_name, "object": trigger.get("object"),
            "frequency": schedule.get("frequency"), "start": start,
            "next_occurrence": following.isoformat() if following else None,
            "active_since": activation.created_at.isoformat(),
            "occurrences": [{"occurrence_at": o.occurrence_at.isoformat(), "state": o.state,
                             "considered": o.considered, "admitted": o.admitted,
                             "completed_at": o.completed_at.isoformat() if o.completed_at else None}
                            for o in occurrences],
        })
    return out
