"""A schedule-triggered Flow's schedule as times (pure; docs/operations.md "Schedule-triggered flows").

The Flow metadata's ``<start><schedule>``: ``frequency`` (``Once``, ``Daily``,
``Weekly``), ``startDate`` and ``startTime``. The activation gate
(:mod:`.handlers`) and the ``flow.schedule`` worker unit
(:mod:`.services.schedules`) read it through these functions.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

#: The trigger type of a schedule-triggered start.
SCHEDULED = "Scheduled"
#: Seconds between occurrences per ``frequency`` (``Once``: a single occurrence).
FREQUENCIES: dict[str, int | None] = {"Once": None, "Daily": 86400, "Weekly": 7 * 86400}
#: ``FlowRun.entry_path`` prefix of a run an occurrence admitted.
ENTRY_PATH_PREFIX = "@schedule:"


class ScheduleInvalid(ValueError):
    """A schedule this engine cannot time (refused at activation: ``engine_unsupported:schedule``)."""


def schedule_start(schedule: dict[str, Any] | None) -> dt.datetime:
    """The first occurrence of ``schedule`` as an aware UTC instant.

    ``startDate`` is ``YYYY-MM-DD``; ``startTime`` ``HH:MM[:SS[.fff]]``, with or without a trailing ``Z``
    (read as UTC either way; absent: midnight).

    Raises:
        ScheduleInvalid: no schedule, an unknown frequency, or a date or time that does not parse.
    """
    if not isinstance(schedule, dict):
        raise ScheduleInvalid("a scheduled start needs a schedule")
    if schedule.get("frequency") not in FREQUENCIES:
        raise ScheduleInvalid(f"frequency {schedule.get('frequency')!r} is not one of {', '.join(FREQUENCIES)}")
    try:
        day = dt.date.fromisoformat(str(schedule.get("startDate")))
        text = str(schedule.get("startTime") or "00:00:00").removesuffix("Z")
        clock = dt.time.fromisoformat(text)
    except ValueError as exc:
        raise ScheduleInvalid(f"start {schedule.get('startDate')!r} {schedule.get('startTime')!r}: {exc}") from None
    return dt.datetime.combine(day, clock.replace(tzinfo=None), tzinfo=dt.UTC)


def schedule_latest_due(schedule: dict[str, Any], *, now: dt.datetime, not_before: dt.datetime) -> dt.datetime | None:
    """The latest occurrence of ``schedule`` at or before ``now`` and not before ``not_before``, else ``None``.

    Raises:
        ScheduleInvalid: see :func:`schedule_start`.
    """
    start = schedule_start(schedule)
    if now < start:
        return None
    period = FREQUENCIES[schedule["frequency"]]
    due = start if period is None else start + dt.timedelta(seconds=period * ((now - start) // dt.timedelta(
        seconds=period)))
    return due if due >= not_before else None


def schedule_next(schedule: dict[str, Any], *, after: dt.datetime) -> dt.datetime | None:
    """The first occurrence of ``schedule`` strictly after ``after`` (``None``: a ``Once`` schedule that passed).

    Raises:
        ScheduleInvalid: see :func:`schedule_start`.
    """
    start = schedule_start(schedule)
    if after < start:
        return start
    period = FREQUENCIES[schedule["frequency"]]
    if period is None:
        return None
    return start + dt.timedelta(seconds=period * ((after - start) // dt.timedelta(seconds=period) + 1))


def entry_path_of(occurrence_at: dt.datetime) -> str:
    """The ``FlowRun.entry_path`` of the runs an occurrence at ``occurrence_at`` admits."""
    return ENTRY_PATH_PREFIX + occurrence_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
