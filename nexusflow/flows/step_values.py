"""What a durable step evaluates outside an element graph, over the interpreter's state (seed 004 sections
10.5 and 14.2): a Wait element's time and record events (:func:`wait_schedule`, :func:`wait_record_event`) and
a subflow step's input and output variables (:func:`subflow_call_inputs`, :func:`subflow_call_outputs`) and an
effect step's action inputs (:func:`action_call_inputs`).

Pure, like :mod:`.interpreter`: the caller supplies the record, the state and the database clock.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .conditions import conditions_hold
from .errors import FlowExecutionError
from .interpreter import DEFAULT_VISIT_BUDGET, _jsonable, _numeric, _Run, subflow_inputs
from .producers import RECORD_ID_INPUT, change_event_object

# --- time waits -------------------------------------------------------------------------------------------
#: Seconds per ``TimeOffsetUnit`` of a Wait element's ``AlarmEvent`` (the Flow metadata allows Hours and Days).
ALARM_OFFSET_UNITS = {"Hours": 3600, "Days": 86400}


@dataclass(frozen=True)
class WaitEvent:
    """One time event a Wait element waits for: its name and when it fires (aware UTC)."""

    name: str
    resume_at: dt.datetime

    def as_json(self) -> dict[str, Any]:
        return {"event": self.name, "resume_at": self.resume_at.isoformat()}


def to_instant(value: Any, *, what: str) -> dt.datetime:
    """A date/time value as an aware UTC datetime (a date is its midnight UTC).

    Accepts ``datetime`` (naive means UTC), ``date`` and ISO 8601 text
    (``2026-12-04T09:30:00Z``, ``2026-12-04T09:30:00.000+0100``, ``2026-12-04``).

    Raises:
        FlowExecutionError: ``value`` is empty or not a date/time (definite).
    """
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    if isinstance(value, str) and value.strip() == value and value:
        text = value[:-1] + "+00:00" if value.endswith("Z") else value
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            parsed = None
        if parsed is not None:
            return to_instant(parsed, what=what)
    raise FlowExecutionError(f"{what}: {value!r} is not a date/time")


def alarm_offset(inputs: dict[str, Any], run_value: Any, *, what: str) -> dt.timedelta:
    """``TimeOffset`` x ``TimeOffsetUnit`` of an ``AlarmEvent`` (no offset: zero).

    Raises:
        FlowExecutionError: the offset is not a number, the unit is not Hours/Days, or the
            offset is out of the calendar's range (definite).
    """
    raw = inputs.get("TimeOffset")
    if raw is None:
        return dt.timedelta(0)
    number = run_value(raw)
    unit = run_value(inputs.get("TimeOffsetUnit")) if inputs.get("TimeOffsetUnit") is not None else None
    if unit not in ALARM_OFFSET_UNITS:
        raise FlowExecutionError(f"{what}: TimeOffsetUnit {unit!r} is not one of {sorted(ALARM_OFFSET_UNITS)}")
    if isinstance(number, bool) or not _numeric(number) or not Decimal(str(number)).is_finite():
        raise FlowExecutionError(f"{what}: TimeOffset {number!r} is not a number")
    try:
        return dt.timedelta(seconds=float(Decimal(str(number)) * ALARM_OFFSET_UNITS[unit]))
    except (OverflowError, ValueError):
        raise FlowExecutionError(f"{what}: TimeOffset {number!r} {unit} is out of the calendar's range") from None


def _wait_run(*, plan_payload: dict[str, Any], record: dict[str, Any], object_name: str, now: dt.datetime,
              interview_start: dt.datetime, prior: dict[str, Any] | None, is_new: bool,
              state: dict[str, Any] | None) -> _Run:
    """The interpreter state a Wait element's events are evaluated in (no reader: a wait reads no records)."""
    run = _Run(plan_payload=plan_payload, record=record, object_name=object_name, prior=prior, is_new=is_new,
               now=now, reader=None, budget=DEFAULT_VISIT_BUDGET, fan_out_limit=0, interview_start=interview_start)
    if state:
        run.load_state(state)
    return run


def _event_waits(run: _Run, event: dict[str, Any], what: str) -> bool:
    """Whether a Wait event's waiting conditions hold (the run waits for it only then)."""
    try:
        return conditions_hold(event.get("conditions") or [], event.get("logic") or "and", dict(run.record),
                               run.resolve)
    except ValueError as exc:
        raise FlowExecutionError(f"{what}: {exc}") from None


def wait_schedule(*, plan_payload: dict[str, Any], node: dict[str, Any], record: dict[str, Any], object_name: str,
                  now: dt.datetime, interview_start: dt.datetime, prior: dict[str, Any] | None = None,
                  is_new: bool = False, state: dict[str, Any] | None = None) -> list[WaitEvent]:
    """The time events a compiled Wait element waits for, earliest first (ties: declaration order).

    An event whose waiting conditions do not hold is skipped; an empty list
    means the run takes the Wait element's default path at once (the Flow
    language's rule: the default path runs when no event's waiting conditions are met).
    An ``AlarmEvent`` fires at ``AlarmTime + TimeOffset x TimeOffsetUnit``
    (Hours or Days); a time already past fires at the next resume sweep.

    Args:
        node: the durable step's element (``{"events": [...]}`` as the compiler wrote it).
        record, object_name, prior, is_new, state: as :func:`run_graph`.
        now: the database clock; interview_start: the run's start (``$Flow.InterviewStartTime``).

    Raises:
        FlowExecutionError: an event that is not a time event, an empty or
            malformed ``AlarmTime``, offset or unit, or a resume time out of
            the calendar's range (definite: replay cannot fix it).
    """
    run = _wait_run(plan_payload=plan_payload, record=record, object_name=object_name, now=now,
                    interview_start=interview_start, prior=prior, is_new=is_new, state=state)
    found: list[tuple[dt.datetime, int, WaitEvent]] = []
    for index, event in enumerate(node.get("events") or []):
        what = f"wait {node.get('element')} event {event.get('name')}"
        if change_event_object(event.get("event_type")) or not _event_waits(run, event, what):
            continue  # a record event is the record producer's (wait_record_event)
        if event.get("event_type") != "AlarmEvent":
            raise FlowExecutionError(f"{what}: {event.get('event_type')} is not a time event this engine runs")
        inputs = event.get("inputs") or {}
        if inputs.get("AlarmTime") is None:
            raise FlowExecutionError(f"{what}: AlarmTime is required")
        base = run.value(inputs["AlarmTime"])
        if base is None:
            raise FlowExecutionError(f"{what}: AlarmTime is empty")
        start = to_instant(base, what=f"{what} AlarmTime")
        offset = alarm_offset(inputs, run.value, what=what)
        try:
            at = start + offset
        except OverflowError:
            raise FlowExecutionError(f"{what}: {start.isoformat()} plus {offset} is out of the calendar's range") from None
        found.append((at, index, WaitEvent(name=event["name"], resume_at=at)))
    return [event for _at, _i, event in sorted(found, key=lambda f: (f[0], f[1]))]


@dataclass(frozen=True)
class RecordEvent:
    """The record event a Wait element waits for: its name and the ``field -> value`` resume conditions."""

    name: str
    match: dict[str, Any]


def wait_record_event(*, plan_payload: dict[str, Any], node: dict[str, Any], record: dict[str, Any],
                      object_name: str, now: dt.datetime, interview_start: dt.datetime,
                      prior: dict[str, Any] | None = None, is_new: bool = False,
                      state: dict[str, Any] | None = None) -> RecordEvent | None:
    """The record event (``<Object>ChangeEvent``) of a compiled Wait element, or ``None``.

    ``None`` when the Wait has no record event or its waiting conditions do
    not hold. The resume conditions (every input but ``RecordId``) are
    resolved now, against the run's state, into plain values: a wait's
    satisfaction rule is immutable once its dependency commits. Arguments as
    :func:`wait_schedule`.

    Raises:
        FlowExecutionError: a waiting condition or a resume value cannot be evaluated (definite).
    """
    run = _wait_run(plan_payload=plan_payload, record=record, object_name=object_name, now=now,
                    interview_start=interview_start, prior=prior, is_new=is_new, state=state)
    for event in node.get("events") or []:
        if change_event_object(event.get("event_type")) is None:
            continue
        if not _event_waits(run, event, f"wait {node.get('element')} event {event.get('name')}"):
            return None
        match = {}
        for field_name, value in sorted((event.get("inputs") or {}).items()):
            if field_name == RECORD_ID_INPUT:
                continue
            match[field_name] = _jsonable(run.value(value))
        return RecordEvent(name=event["name"], match=match)
    return None


# --- action calls of a Durable Orchestration plan --------------------------------------------------------
def action_call_inputs(*, plan_payload: dict[str, Any], inputs: dict[str, Any], record: dict[str, Any],
                       object_name: str, now: dt.datetime, interview_start: dt.datetime,
                       state: dict[str, Any] | None) -> dict[str, Any]:
    """An effect step's action inputs (``{name: compiled value}``) evaluated in the run's state:
    ``{name: value}`` (text, ``Decimal``, bool, date/datetime, a list for a collection, ``None``).

    Raises:
        FlowExecutionError: a value cannot be computed (an unresolved reference, a formula error).
    """
    run = _wait_run(plan_payload=plan_payload, record=record, object_name=object_name, now=now,
                    interview_start=interview_start, prior=None, is_new=False, state=state)
    return {name: _jsonable(run.value(raw)) for name, raw in sorted(inputs.items())}


# --- subflow steps of a Durable Orchestration plan --------------------------------------------------------
def subflow_call_inputs(*, plan_payload: dict[str, Any], node: dict[str, Any], child_payload: dict[str, Any],
                        record: dict[str, Any], object_name: str, now: dt.datetime, interview_start: dt.datetime,
                        prior: dict[str, Any] | None, is_new: bool, state: dict[str, Any] | None) -> dict[str, Any]:
    """The child run's input variables of a durable subflow step, evaluated in the calling run's state.

    Raises:
        FlowExecutionError: an input names no input variable of the child, or a value cannot be computed.
    """
    run = _wait_run(plan_payload=plan_payload, record=record, object_name=object_name, now=now,
                    interview_start=interview_start, prior=prior, is_new=is_new, state=state)
    return subflow_inputs(node, child_payload, run.value)


def subflow_call_outputs(*, plan_payload: dict[str, Any], node: dict[str, Any], child_payload: dict[str, Any],
                         values: dict[str, Any], record: dict[str, Any], object_name: str, now: dt.datetime,
                         interview_start: dt.datetime, state: dict[str, Any] | None) -> dict[str, Any]:
    """The calling run's state after a finished child's output variables (``values``) are copied back.

    Raises:
        FlowExecutionError: an output assignment names no output variable of the child.
    """
    run = _wait_run(plan_payload=plan_payload, record=record, object_name=object_name, now=now,
                    interview_start=interview_start, prior=None, is_new=False, state=state)
    run.subflow_outputs(node, child_payload, values)
    return run.export_state()
