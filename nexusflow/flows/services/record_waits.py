"""Waiting for a record: the producer side of a Wait element's record event (seed 004 sections 14.1-14.2).

A Wait element may wait for its flow's triggering record to meet a
condition: an event whose ``eventType`` is the record's Change Data Capture
name (``<Object>ChangeEvent``) with ``field = value`` resume conditions
(docs/operations.md "Waiting for a record"). Its producer is
``record.condition``:

- **Producer and notification** (14.2 step 1): every save or deletion of a
  record writes, in the saving transaction, one ``FlowWakeSignal`` for each
  live run of that record whose plan has a record event on its object,
  whether or not the run waits yet (:func:`record_wait_signals_write`, called
  by the records hooks in :mod:`.waits`). It locks no Flow row: the signal
  carries the run id as a typed column.
- **Wake version**: the record version the save wrote (a deletion: the next
  one). A signal no newer than the version the wait saw when it committed
  is stale and changes nothing.
- **Fresh-snapshot match** (steps 2, 4): right after the saving transaction
  commits, and right after a wait's dependency commits, the run's unmatched
  signals are matched in a fresh transaction; the ``flow.wake`` sweep repeats
  it for a crash on either side.
- **Authoritative evidence** (step 5, :func:`record_wake_verdict`): the
  record as it is when the match runs, not the signal, decides: ``met``,
  ``unmet`` (a later save undid it), ``stale`` or ``deleted``.

This module imports no executor module: the executor's wait step and the
wake (:mod:`.waits`) import it, never the other way round.
"""
from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.rows import fetch_where
from nexusflow.kernel.scope import OrgScope

from .. import transitions as t
from ..conditions import conditions_hold
from ..models import FlowDependency, FlowExecutionPlan, FlowRun, FlowWakeSignal
from ..producers import PRODUCER_RECORD, change_event_object
from ..store import wake_signal_insert

#: ``FlowDependency.condition["kind"]`` of a record event's wait.
CONDITION_RECORD = "record"
#: Run states in which a run may still reach (or be at) a record event's wait.
LIVE_RUN_STATES = (t.RUN_ACCEPTED, t.RUN_RUNNABLE, t.RUN_RUNNING, t.RUN_WAITING)

#: plan digest -> the objects its record events watch (a plan's payload never changes under its digest).
_WATCHED: dict[str, frozenset[str]] = {}


def record_dependency_key(object_name: str, record_key: str) -> str:
    """The producer key of a record event's wait: ``<object>/<record key>``."""
    return f"{object_name}/{record_key}"


def record_event_objects(plan_payload: dict[str, Any]) -> frozenset[str]:
    """The objects whose records a plan's Wait elements watch (``<Object>ChangeEvent`` events)."""
    out = set()
    for step in plan_payload.get("steps") or []:
        if step.get("type") != "waits":
            continue
        for event in step.get("events") or []:
            watched = change_event_object(event.get("event_type"))
            if watched:
                out.add(watched)
    return frozenset(out)


def _watched_by(org_id: str, plan_pk: int, plan_digest: str) -> frozenset[str]:
    watched = _WATCHED.get(plan_digest)
    if watched is None:
        payload = FlowExecutionPlan.objects.values_list("plan_payload", flat=True).get(org_id=org_id, pk=plan_pk)
        watched = _WATCHED[plan_digest] = record_event_objects(payload)
    return watched


def record_wait_signals_write(*, org: OrgScope, record, deleting: bool = False,
                              saving_run_id: int | None = None) -> tuple[str, list[int]]:
    """Write this save's (or deletion's) wake signals, in the saving transaction.

    One ``record.condition`` signal per live run of ``record`` whose plan
    watches its object, with ``wake_version`` = the version this save wrote
    (a deletion: one past the last), except ``saving_run_id``: a run's own
    record write is not news to it (a later Wait of that run reads the record
    anyway). Idempotent per (run, version). The records hooks
    (:mod:`.waits`) match them right after the saving transaction commits.

    Returns ``(producer key, ids of the runs signalled)``.
    """
    key = record_dependency_key(record.object_name, record.record_key)
    runs = [(run.pk, run.plan_id, run.plan_digest, run.app_installation_id, run.runtime_capability_id,
             run.binding_digest)
            for run in fetch_where(FlowRun, {"org_id": org.org_id, "record_key": record.record_key,
                                             "state__in": tuple(LIVE_RUN_STATES),
                                             "trigger_object_name": record.object_name, "is_deleted": False})]
    runs = [r for r in runs if r[0] != saving_run_id and record.object_name in _watched_by(org.org_id, r[1], r[2])]
    if not runs:
        return key, []
    version = int(record.version) + (1 if deleting else 0)
    evidence = digest_v2("flows.wake-evidence", [
        ("producer_kind", PRODUCER_RECORD), ("dependency_key", key), ("wake_version", version),
        ("deleted", deleting),
    ]).hexdigest
    now, written = db_now(), []
    for run_id, _plan_pk, _plan_digest, installation, capability, binding in runs:
        try:
            with transaction.atomic():
                wake_signal_insert(
                    org_id=org.org_id, app_installation_id=installation, runtime_capability_id=capability,
                    binding_digest=binding, flow_run_id=run_id, producer_kind=PRODUCER_RECORD,
                    dependency_key=key, wake_version=version, receipt_id=None, evidence_digest=evidence,
                    state=t.SIGNAL_UNMATCHED, received_at=now,
                )
        except IntegrityError:
            continue  # this version's signal for this run exists already
        written.append(int(run_id))
    return key, written


def record_wake_verdict(dependency: FlowDependency, signal: FlowWakeSignal) -> tuple[str, int | None]:
    """``(verdict, record version)`` of one record signal against its waiting dependency (section 14.2 step 5).

    Reads the watched record as it is now (the authoritative producer
    evidence; the caller holds root -> step -> dependency -> signal locks):

    - ``stale``: the signal is no newer than the version the wait saw;
    - ``deleted``: the record is gone;
    - ``met``: the record meets every resume condition now;
    - ``unmet``: it does not (a later save undid it, or never did).
    """
    from nexusflow.records.models import Record

    condition = dependency.condition or {}
    if signal.wake_version <= int(condition.get("after_version", 0)):
        return "stale", None
    row = (Record.objects.filter(org_id=dependency.org_id, object_name=condition.get("object"),
                                 record_key=condition.get("record_key"))
           .values_list("version", "fields", "is_deleted").first())
    if row is None or row[2]:
        return "deleted", None
    version, fields, _deleted = row
    return ("met" if record_condition_met(condition.get("match") or {}, fields) else "unmet"), int(version)


def record_condition_met(match: dict[str, Any], fields: dict[str, Any]) -> bool:
    """True when ``fields`` meet every ``field = value`` resume condition (an empty rule never does)."""
    if not match:
        return False
    return conditions_hold([{"field": name, "operator": "EqualTo", "value": value}
                            for name, value in sorted(match.items())], "and", fields)
