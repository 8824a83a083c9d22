"""Time waits: a Wait element's ``AlarmEvent`` on the database clock (seed 004 sections 10.5, 14.2-14.4).

First visit of a Wait step (:func:`_exec_dependency_wait`, in the step
transaction, root -> step -> attempt -> dependency): evaluate every event's
waiting conditions and resume time (:func:`nexusflow.flows.step_values.wait_schedule`).
No event to wait for: the step succeeds along the default path at once.
Otherwise one ``FlowDependency`` (producer ``runtime.clock``, its condition the
events and their times, its ``deadline`` the earliest) commits with attempt
``Committed``, step and root ``Waiting``. A Wait element with a record
event (``<Object>ChangeEvent``, :mod:`.record_waits`) locks the watched
record first and waits on a ``record.condition`` dependency instead, its
AlarmEvents as that dependency's deadline; a record that already meets the
resume condition takes the event's path at once, and a missing record fails
the step (``flow_wait_producer_missing``): a missing producer is never polled.

The clock producer needs no signal: the database clock is its evidence.
:func:`flow_try_resume_due_one` (worker unit ``flow.resume_due``) discovers a
due dependency without locks, then locks root -> step -> dependency, checks
state, versions, scope and ``deadline <= db_now()``, and commits dependency
``satisfied`` (resolution: the event that fired, when it was due, when it
resolved), step ``Pending`` and root ``Runnable`` together. The next claim of
the step sees the satisfied dependency and continues along that event's path.
A wait survives any process or deployment restart: nothing but rows holds it.
Cancellation (:func:`.lifecycle.flow_run_delete`) cancels the waiting
dependency in the same root-first transaction, so resume and cancel race on
the same versions and exactly one wins.
"""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now, db_now_sql
from nexusflow.kernel.identity import validate_key, validate_note
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.scope import OrgScope

from .. import policy
from .. import transitions as t
from ..compiler import TERMINAL_STEP_KEY
from ..conditions import conditions_hold
from ..errors import FlowExecutionError, FlowRunNotFound, PlanMismatch, WaitSignalRefused
from ..handlers import PATH_OFFSET_UNITS
from ..models import FlowCheckpoint, FlowDependency, FlowExecutionPlan, FlowRun
from ..producers import PRODUCER_CLOCK, PRODUCER_RECORD, PRODUCERS, change_event_object
from ..step_values import RecordEvent, WaitEvent, to_instant, wait_record_event, wait_schedule
from .admission import TRIGGER_CHECKPOINT_SEQUENCE
from .claim import StepClaim
from .record_waits import CONDITION_RECORD, record_condition_met, record_dependency_key
from .step_txn import FP_BEFORE_COMMIT, _commit_step, _input_state, _lock_fenced, _step_txn
from .subflows import _exec_subflow
from .wait_resolution import CONDITION_SCHEDULED_PATH, EXPIRY_FIRES, clock_wait_resolve
from .waits import _enter_waiting, _step_dependency, _wait_create, flow_wake_reconcile

log = logging.getLogger("nexusflow.flows")


FP_WAIT_CREATED = failpoints.declare("flow.wait.created")
FP_RECORD_WAIT_COMMITTED = failpoints.declare("flow.wait.record_wait_committed")
FP_RESUME_BEFORE_COMMIT = failpoints.declare("flow.wait.resume_before_commit")
FP_AFTER_RESUME = failpoints.declare("flow.wait.after_resume")


def _schedule(claim: StepClaim, run: FlowRun, plan: FlowExecutionPlan, step_def: dict[str, Any],
              now: dt.datetime) -> tuple[list[WaitEvent], RecordEvent | None]:
    """The Wait element's time events (earliest first) and its record event, whose waiting conditions hold."""
    snapshot = FlowCheckpoint.objects.get(org_id=claim.org_id, run_id=claim.run_id,
                                          sequence=TRIGGER_CHECKPOINT_SEQUENCE).context_payload["record"]
    prior = snapshot.get("prior_fields")
    args = dict(plan_payload=plan.plan_payload, node=step_def, object_name=snapshot["object"],
                record={"Id": snapshot["record_key"], **snapshot["fields"]},
                prior=None if prior is None else {"Id": snapshot["record_key"], **prior},
                is_new=snapshot.get("record_version") == 1, now=now,
                interview_start=run.started_at or run.created_at, state=_input_state(claim))
    return wait_schedule(**args), wait_record_event(**args)


def _watches_record(step_def: dict[str, Any]) -> bool:
    return any(change_event_object(e.get("event_type")) for e in step_def.get("events") or [])


def _record_wait_create(claim: StepClaim, run: FlowRun, step, step_def: dict[str, Any], event: RecordEvent,
                        record, times: list[WaitEvent], now: dt.datetime) -> None:
    """Insert the step's ``record.condition`` dependency and enter ``Waiting`` (in the step transaction).

    The condition freezes the watched record, the resume rule and the
    record version this step saw (``after_version``: a signal no newer is
    stale). With AlarmEvents beside it the earliest is its deadline and it
    fires along that event (policy ``fires``); without, the runtime policy's
    maximum wait age is its deadline under the wait's fault path, or
    terminal failure. A deletion of the record takes the same path at once.
    """
    fault_step = (step_def.get("next") or {}).get("fault")
    on_deleted = "fault_path" if fault_step else "terminal_failure"
    key = record_dependency_key(record.object_name, record.record_key)
    condition = {"kind": CONDITION_RECORD, "event": event.name, "object": record.object_name,
                 "record_key": record.record_key, "match": event.match, "after_version": int(record.version),
                 "events": [e.as_json() for e in times], "on_deleted": on_deleted, "fault_step": fault_step}
    if times:
        policy_name, deadline = EXPIRY_FIRES, times[0].resume_at
    else:
        policy_name, deadline = on_deleted, now + dt.timedelta(seconds=policy.max_wait_age_seconds())
    _wait_create(claim, run, step, producer_kind=PRODUCER_RECORD, key=key, condition=condition,
                 expiry_policy=policy_name, deadline=deadline, now=now)


def _clock_wait_create(claim: StepClaim, run: FlowRun, step, condition: dict[str, Any], *, deadline: dt.datetime,
                       now: dt.datetime) -> None:
    """Insert the step's ``runtime.clock`` dependency and enter ``Waiting`` (in the step transaction)."""
    _wait_create(claim, run, step, producer_kind=PRODUCER_CLOCK, key=claim.step_key, condition=condition,
                 expiry_policy=EXPIRY_FIRES, deadline=deadline, now=now)


def _exec_dependency_wait(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """Execute a ``DependencyWait`` step of a Wait element (module docstring).

    Returns ``"waiting"`` (dependency committed), or ``"succeeded"`` (default
    path, or the path of the event whose time came).

    Raises:
        PlanMismatch: the step is not a Wait element, or its dependency is in
            a state no claim should see (cancelled, expired).
        FlowExecutionError: an event's time cannot be computed (definite).
    """
    if step_def.get("type") == "scheduled_path":
        return _exec_scheduled_path(claim, plan, step_def)
    if step_def.get("type") == "subflows":
        return _exec_subflow(claim, plan, step_def)
    if step_def.get("type") != "waits":
        raise PlanMismatch(f"no executor for a {step_def.get('type')} dependency wait")
    context = _input_state(claim)
    with _step_txn():
        # A record event's wait locks its record first (business class, before root -> step -> attempt), so a
        # save either lands before this step reads the record or after the wait committed (and then signals it).
        record = _lock_trigger_record(claim) if _watches_record(step_def) else None
        now = db_now()
        run, step, attempt = _lock_fenced(claim)
        dependency = _step_dependency(claim, run)
        if dependency is None:
            events, record_event = _schedule(claim, run, plan, step_def, now)
            if record_event is not None:
                if record is None:
                    raise FlowExecutionError(f"wait {step_def.get('element')}: the record its event "
                                             f"{record_event.name} watches does not exist",
                                             code="flow_wait_producer_missing")
                if record_condition_met(record_event.match, record.fields):
                    _commit_step(claim, plan, run, attempt, now, output={
                        "wait": "event", "event": record_event.name, "record_version": int(record.version),
                        "met_on_arrival": True,
                    }, step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE,
                        next_key=step_def["next"][f"wait:{record_event.name}"], context=context)
                    failpoints.hit(FP_BEFORE_COMMIT)
                    return "succeeded"
                _record_wait_create(claim, run, step, step_def, record_event, record, events, now)
                failpoints.hit(FP_WAIT_CREATED)
                watched = record_dependency_key(record.object_name, record.record_key)
            elif not events:
                _commit_step(claim, plan, run, attempt, now, output={"wait": "default"}, step_dst=t.STEP_SUCCEEDED,
                             root_dst=t.RUN_RUNNABLE, next_key=step_def["next"]["default"], context=context)
                failpoints.hit(FP_BEFORE_COMMIT)
                return "succeeded"
            else:
                _clock_wait_create(claim, run, step, {"kind": "time", "events": [e.as_json() for e in events]},
                                   deadline=events[0].resume_at, now=now)
                failpoints.hit(FP_WAIT_CREATED)
                return "waiting"
        elif dependency.state == t.DEP_WAITING:
            _enter_waiting(claim, now)  # a re-claimed waiting step waits again on the same dependency
            failpoints.hit(FP_BEFORE_COMMIT)
            if dependency.producer_kind != PRODUCER_RECORD:
                return "waiting"
            watched = dependency.dependency_key
        else:
            if dependency.state != t.DEP_SATISFIED or not dependency.resolution:
                raise PlanMismatch(f"wait dependency {dependency.pk} is {dependency.state}")
            event = dependency.resolution["event"]
            next_key = (step_def.get("next") or {}).get(f"wait:{event}")
            if f"wait:{event}" not in (step_def.get("next") or {}):
                raise FlowExecutionError(f"wait {step_def.get('element')}: no path for event {event}")
            _commit_step(claim, plan, run, attempt, now, output={"wait": "event", **dependency.resolution},
                         step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=next_key, context=context)
            failpoints.hit(FP_BEFORE_COMMIT)
            return "succeeded"
    # A record event's wait committed. Section 14.2 step 4: a save may have signalled between this step's read
    # and its commit; match now, in a fresh transaction (the flow.wake sweep repeats it if this process dies first).
    failpoints.hit(FP_RECORD_WAIT_COMMITTED)
    flow_wake_reconcile(org_id=claim.org_id, run_id=claim.run_id, dependency_key=watched)
    return "waiting"


def _lock_trigger_record(claim: StepClaim):
    """Lock the run's trigger record (business class, before the Flow root); ``None`` when it is gone."""
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock

    run = FlowRun.objects.only("trigger_object_name", "record_key").get(org_id=claim.org_id, pk=claim.run_id)
    try:
        return record_lock(org=OrgScope(claim.org_id), object_name=run.trigger_object_name,
                           record_key=run.record_key)
    except Record.DoesNotExist:
        return None


def _path_verdict(run: FlowRun, plan: FlowExecutionPlan, path: dict[str, Any], record,
                  now: dt.datetime) -> tuple[str, dt.datetime | None, str]:
    """``(outcome, due, why)`` of a scheduled path against its record as it is now (``record`` locked, or ``None``).

    ``withdrawn`` when the record is gone, no longer meets the flow's entry
    conditions, or its time field is empty, or (a flow admitted only when a
    record is updated to meet its conditions) a later save admitted the same
    path again (:func:`_readmitted`); else ``wait`` (due later) or
    ``due``. The time is the triggering save (``RecordTriggerEvent``: the
    run's admission) or the record's field (``RecordField``) plus
    ``offset`` x ``unit`` (negative: before); ``AsyncAfterCommit`` is due at once.

    Raises:
        FlowExecutionError: the time field is not a date/time, or the path's
            time is out of the calendar's range (definite).
    """
    if record is None or record.is_deleted:
        return "withdrawn", None, "the record was deleted"
    trigger = plan.plan_payload["trigger"]
    if not conditions_hold(trigger.get("filters") or [], trigger.get("filter_logic") or "and", record.fields):
        return "withdrawn", None, "entry conditions no longer hold"
    if trigger.get("requires_change") and _readmitted(run, plan):
        # Only a save that made the record meet the conditions again admits the path again: the record left
        # them after this run's save, which withdrew this path, whether or not that save's recheck saw it.
        return "withdrawn", None, "the record left the entry conditions and a later save admitted this path again"
    if path.get("path_type") == "AsyncAfterCommit":
        return "due", run.created_at, ""
    if path.get("time_source") == "RecordField":
        value = record.fields.get(path["record_field"])
        if value in (None, ""):
            return "withdrawn", None, f"time field {path['record_field']} is empty"
        base = to_instant(value, what=f"scheduled path {path['name']} field {path['record_field']}")
    else:
        base = run.created_at
    try:
        due = base + dt.timedelta(seconds=int(str(path["offset"])) * PATH_OFFSET_UNITS[path["unit"]])
    except OverflowError:
        raise FlowExecutionError(f"scheduled path {path['name']}: {base.isoformat()} plus {path['offset']} "
                                 f"{path['unit']} is out of the calendar's range") from None
    return ("wait" if due > now else "due"), due, ""


def _readmitted(run: FlowRun, plan: FlowExecutionPlan) -> bool:
    """True when a later save of the run's record admitted the same flow's same path (any plan version).

    Read under the record lock the path step holds, which every admitting save of that record takes first.
    """
    return FlowRun.objects.filter(
        org_id=run.org_id, trigger_object_name=run.trigger_object_name, record_key=run.record_key,
        entry_path=run.entry_path, plan__flow_api_name=plan.flow_api_name, record_version__gt=run.record_version,
    ).exists()


def _exec_scheduled_path(claim: StepClaim, plan: FlowExecutionPlan, step_def: dict[str, Any]) -> str:
    """The first step of a scheduled path's run (docs/operations.md "Scheduled paths").

    Locks the trigger record first (business class, before root -> step ->
    attempt), so a save of the record either lands before this step reads it
    or waits until this step's wait committed and then makes it look again.
    Evaluates the record as it is now (:func:`_path_verdict`): withdrawn (the
    run ends without running the path), waits on the clock until the path's
    time, or continues into the path. A resolved wait (time came, or a
    record save ended it early) commits this step and evaluates again in the
    step's next invocation, so a moved date waits anew and a record that left
    the entry conditions withdraws the path. A path that runs gives its
    elements the record as it is now as ``$Record``. An operator's resume
    (``flows signal``) runs the path now unless the record is withdrawn.
    """
    path = step_def["path"]
    context = _input_state(claim)
    with _step_txn():
        record = _lock_trigger_record(claim)
        now = db_now()
        run, step, attempt = _lock_fenced(claim)
        dependency = _step_dependency(claim, run)
        if dependency is not None:
            if dependency.state == t.DEP_WAITING:
                _enter_waiting(claim, now)
                failpoints.hit(FP_BEFORE_COMMIT)
                return "waiting"
            if dependency.state != t.DEP_SATISFIED:
                raise PlanMismatch(f"scheduled path dependency {dependency.pk} is {dependency.state}")
            resolution = dependency.resolution or {}
            if resolution.get("withdraw"):
                # The save (or deletion) that ended this wait took the record out of the flow: that save's
                # verdict stands, whatever later saves did (docs/operations.md "Scheduled paths").
                _commit_step(claim, plan, run, attempt, now,
                             output={"scheduled_path": path["name"], "outcome": "withdrawn", "why": resolution["why"],
                                     "event": resolution.get("event"), "record_version": resolution.get("record_version")},
                             step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=TERMINAL_STEP_KEY,
                             context=context)
                failpoints.hit(FP_BEFORE_COMMIT)
                return "succeeded"
            if "operator" not in resolution:
                _commit_step(claim, plan, run, attempt, now, output={"scheduled_path": path["name"],
                                                                     "outcome": "recheck", **resolution},
                             step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=claim.step_key,
                             context=context)
                failpoints.hit(FP_BEFORE_COMMIT)
                return "succeeded"
            outcome, due, why = _path_verdict(run, plan, path, record, now)
            if outcome == "wait":
                outcome = "due"  # the operator's resume: the path's time is now
            output = {"scheduled_path": path["name"], "outcome": outcome, "due_at": resolution.get("due_at"),
                      "operator": resolution["operator"]}
        else:
            outcome, due, why = _path_verdict(run, plan, path, record, now)
            output = {"scheduled_path": path["name"], "outcome": outcome, "due_at": due.isoformat() if due else None}
        if outcome == "withdrawn":
            _commit_step(claim, plan, run, attempt, now, output={**output, "why": why}, step_dst=t.STEP_SUCCEEDED,
                         root_dst=t.RUN_RUNNABLE, next_key=TERMINAL_STEP_KEY, context=context)
        elif outcome == "due":
            # The path's elements see the record as it is when the path runs, not as its admitting save left it
            # ($Record__Prior stays that save's prior values).
            entered = {**context, "record": {"Id": record.record_key, **record.fields}}
            _commit_step(claim, plan, run, attempt, now, output={**output, "record_version": int(record.version)},
                         step_dst=t.STEP_SUCCEEDED, root_dst=t.RUN_RUNNABLE, next_key=step_def["next"]["resume"],
                         context=entered)
        else:
            condition = {"kind": CONDITION_SCHEDULED_PATH, "path": path["name"],
                         "time_source": path.get("time_source"), "record_field": path.get("record_field"),
                         "events": [{"event": path["name"], "resume_at": due.isoformat()}]}
            _clock_wait_create(claim, run, step, condition, deadline=due, now=now)
            failpoints.hit(FP_WAIT_CREATED)
            return "waiting"
        failpoints.hit(FP_BEFORE_COMMIT)
    return "succeeded"


def flow_try_resume_due_one() -> bool:
    """Resolve one due time wait (seed 004 sections 14.2 step 6 and 14.4). True when one resolved.

    Discovers waiting ``runtime.clock`` dependencies with ``deadline <=
    db_now()`` without locks (oldest deadline first, a bounded batch), then
    resolves the first that still qualifies under root -> step -> dependency
    locks. A candidate that moved meanwhile (cancelled, already resolved,
    another worker won) is skipped, never forced.
    """
    now = db_now_sql()  # discovery reads the database clock in its own statement
    candidates = list(
        FlowDependency.objects.filter(state=t.DEP_WAITING, producer_kind__in=(PRODUCER_CLOCK, PRODUCER_RECORD),
                                      expiry_policy=EXPIRY_FIRES, deadline__lte=now)
        .order_by("deadline", "id").values_list("org_id", "run_id", "step_id", "id")[: policy.CLAIM_BATCH]
    )
    for org_id, run_id, step_id, dependency_id in candidates:
        if _resume(org_id=org_id, run_id=run_id, step_id=step_id, dependency_id=dependency_id):
            return True
    return False


def _resume(*, org_id: str, run_id: int, step_id: int, dependency_id: int) -> bool:
    with transaction.atomic(durable=True):
        resolved = clock_wait_resolve(org_id=org_id, run_id=run_id, step_id=step_id, dependency_id=dependency_id)
        if resolved:
            failpoints.hit(FP_RESUME_BEFORE_COMMIT)
    if resolved:
        failpoints.hit(FP_AFTER_RESUME)
    return resolved


def flow_wait_signal(*, org: OrgScope, run_id: FlowRun.Id | int, producer_kind: str, actor: str,
                     reason: str) -> dict[str, Any]:
    """An operator's resume of one waiting run (``manage.py flows signal``; seed 004 sections 14.1-14.2).

    Resolves the run's waiting dependency of ``producer_kind`` now, through
    the same root -> step -> dependency transition as the producer itself,
    recording ``actor`` and ``reason`` in the resolution evidence.

    Returns:
        ``{"run_id", "dependency_id", "producer_kind", "event", "state"}``.

    Raises:
        InvalidIdentity: a malformed ``run_id``, ``actor`` or ``reason`` (before SQL).
        WaitSignalRefused: ``producer_kind`` is unknown or takes no operator signal, or the
            run does not wait on it now.
        FlowRunNotFound: no visible run ``run_id`` in ``org``.
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    validate_key(actor, field="actor", max_length=120)
    reason = validate_note(reason, field="reason")
    signalable = sorted(k for k, c in PRODUCERS.items() if c.operator_signal)
    if producer_kind not in PRODUCERS:
        raise WaitSignalRefused(f"unknown producer {producer_kind!r}; the producers that take an operator signal: "
                                f"{', '.join(signalable)}")
    if producer_kind not in signalable:
        # The Runtime intent receipt is not one: only its owner's finalize can tell whether the effect happened.
        raise WaitSignalRefused(f"producer {producer_kind!r} takes no operator signal; one of: {', '.join(signalable)}")
    run = FlowRun.objects.filter(org_id=org.org_id, pk=run_id, is_deleted=False).first()
    if run is None:
        raise FlowRunNotFound(f"no flow run {int(run_id)} in this org")
    dependency = (FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk, step_id=run.current_step_id,
                                                state=t.DEP_WAITING, producer_kind=producer_kind)
                  .values_list("pk", flat=True).first())
    if dependency is None or run.current_step_id is None:
        waits_on = sorted(FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk, state=t.DEP_WAITING)
                          .values_list("producer_kind", flat=True))
        now_on = f"; it waits on {', '.join(waits_on)}" if waits_on else ""
        raise WaitSignalRefused(f"run {int(run_id)} does not wait on {producer_kind} (state {run.state}{now_on})")
    with transaction.atomic(durable=True):
        resolved = clock_wait_resolve(org_id=org.org_id, run_id=run.pk, step_id=run.current_step_id,
                                      dependency_id=dependency,
                                      operator={"actor": actor, "reason": reason})
    if not resolved:
        raise WaitSignalRefused(f"run {int(run_id)} stopped waiting meanwhile")
    row = FlowDependency.objects.get(org_id=org.org_id, pk=dependency)
    return {"run_id": int(run.pk), "dependency_id": int(row.pk), "producer_kind": producer_kind,
            "event": row.resolution["event"], "state": row.state}
