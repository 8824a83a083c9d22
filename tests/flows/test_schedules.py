"""Schedule-triggered flows (issue "The Flow language real flows use", item 2; docs/operations.md
"Schedule-triggered flows").

``Weekly_Nurture`` runs every week from its start over the Contact records
whose lifecyclestage is ``lead`` and sets it to ``nurtured``: one run per
matching record per occurrence. Time moves with the database clock
(``db_clock_advance``), never by sleeping.
"""
from __future__ import annotations

import datetime as dt
import json
import signal

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import ActivationRejected
from nexusflow.flows.models import FlowRun, FlowScheduleOccurrence
from nexusflow.flows.schedule import ScheduleInvalid, schedule_latest_due, schedule_next, schedule_start
from nexusflow.flows.services import flow_deploy, flow_try_schedule_one
from nexusflow.kernel.clock import db_now
from tests.concurrency import run_at_once
from tests.conftest import run_manage, subprocess_env

from .conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True)

FLOW = "Weekly_Nurture"
UTC = dt.UTC


def _source(*, frequency: str = "Weekly", start: dt.datetime, filters: str | None = None) -> bytes:
    filters = filters if filters is not None else (
        "<filters><field>lifecyclestage</field><operator>EqualTo</operator>"
        "<value><stringValue>lead</stringValue></value></filters>")
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Flow xmlns="http://soap.sforce.com/2006/04/metadata">
    <apiVersion>62.0</apiVersion>
    <label>Weekly Nurture</label>
    <processType>AutoLaunchedFlow</processType>
    <recordUpdates><name>Mark_Nurtured</name><label>Mark Nurtured</label><locationX>1</locationX>
        <locationY>1</locationY>
        <inputAssignments><field>lifecyclestage</field><value><stringValue>nurtured</stringValue></value>
        </inputAssignments>
        <inputReference>$Record</inputReference></recordUpdates>
    <start><locationX>50</locationX><locationY>0</locationY>
        <connector><targetReference>Mark_Nurtured</targetReference></connector>
        <filterLogic>and</filterLogic>{filters}
        <object>Contact</object>
        <schedule><frequency>{frequency}</frequency><startDate>{start:%Y-%m-%d}</startDate>
            <startTime>{start:%H:%M:%S}.000Z</startTime></schedule>
        <triggerType>Scheduled</triggerType></start>
    <status>Active</status>
</Flow>
""".encode()


def _next_minute() -> dt.datetime:
    now = db_now()
    return (now + dt.timedelta(minutes=2)).replace(second=0, microsecond=0)


def _deploy(org, start: dt.datetime, **kwargs):
    deployed = flow_deploy(org=org, source=_source(start=start, **kwargs), flow_api_name=FLOW)
    assert deployed.activated
    return deployed.plan


def _contacts(org, stages: list[str]) -> list:
    return [save_record(org, {"email": f"c{i}@example.com", "lifecyclestage": stage}) for i, stage in
            enumerate(stages)]


def _stage(record) -> str:
    from nexusflow.records.models import Record

    return Record.objects.get(org_id=record.org_id, object_name=record.object_name,
                              record_key=record.record_key).fields["lifecyclestage"]


@pytest.mark.parametrize("frequency,now,not_before,due", [
    ("Daily", "2026-03-10T09:00", "2026-01-01T00:00", "2026-03-10T06:30"),
    ("Daily", "2026-03-10T06:30", "2026-01-01T00:00", "2026-03-10T06:30"),   # exactly at its time
    ("Daily", "2026-03-10T06:29", "2026-01-01T00:00", "2026-03-09T06:30"),
    ("Daily", "2026-03-10T09:00", "2026-03-10T07:00", None),                 # before the activation
    ("Weekly", "2026-03-10T09:00", "2026-01-01T00:00", "2026-03-08T06:30"),  # start is a Sunday
    ("Weekly", "2026-03-01T06:30", "2026-01-01T00:00", "2026-03-01T06:30"),
    ("Once", "2027-01-01T00:00", "2026-01-01T00:00", "2026-03-01T06:30"),
    ("Once", "2026-03-01T06:29", "2026-01-01T00:00", None),                  # not yet
])
def test_the_latest_due_occurrence(frequency, now, not_before, due):
    schedule = {"frequency": frequency, "startDate": "2026-03-01", "startTime": "06:30:00.000Z"}

    def at(text):
        return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)

    expected = None if due is None else at(due)
    assert schedule_latest_due(schedule, now=at(now), not_before=at(not_before)) == expected


def test_the_next_occurrence_and_a_schedule_that_cannot_be_timed():
    daily = {"frequency": "Daily", "startDate": "2026-03-01", "startTime": "06:30:00Z"}
    assert schedule_next(daily, after=dt.datetime(2026, 3, 5, 6, 30, tzinfo=UTC)) == dt.datetime(
        2026, 3, 6, 6, 30, tzinfo=UTC)
    assert schedule_next({**daily, "frequency": "Once"}, after=dt.datetime(2026, 3, 5, tzinfo=UTC)) is None
    assert schedule_start({"frequency": "Daily", "startDate": "2026-03-01"}) == dt.datetime(2026, 3, 1, tzinfo=UTC)
    for bad in ({"frequency": "Monthly", "startDate": "2026-03-01"}, {"frequency": "Daily", "startDate": "March"},
                {"frequency": "Daily", "startDate": "2026-03-01", "startTime": "25:00"}, None):
        with pytest.raises(ScheduleInvalid):
            schedule_start(bad)


@pytest.mark.parametrize("kwargs,code", [
    ({"frequency": "Monthly"}, "engine_unsupported:schedule"),
    ({"filters": "<filters><field>lifecyclestage</field><operator>IsChanged</operator>"
                 "<value><booleanValue>true</booleanValue></value></filters>"}, "engine_unsupported:trigger"),
])
def test_a_schedule_the_engine_cannot_run_is_refused_at_activation(org, kwargs, code):
    with pytest.raises(ActivationRejected) as caught:
        flow_deploy(org=org, source=_source(start=_next_minute(), **kwargs), flow_api_name=FLOW)
    assert [d.code for d in caught.value.diagnostics] == [code]


def test_each_occurrence_runs_once_per_matching_record_from_the_activation_on(org, db_clock_advance, settings):
    settings.NEXUS_FLOW_SCHEDULE_BATCH = 2  # several admission transactions per occurrence
    first = _next_minute()
    plan = _deploy(org, first)
    contacts = _contacts(org, ["lead", "customer", "lead", "lead", "lead", ""])
    assert run_until_idle() == 0 and not FlowScheduleOccurrence.objects.exists()  # not yet its time
    db_clock_advance((first - db_now()).total_seconds() + 1)
    assert run_until_idle() > 0
    assert [_stage(c) for c in contacts] == ["nurtured", "customer", "nurtured", "nurtured", "nurtured", ""]
    occurrence = FlowScheduleOccurrence.objects.get()
    assert (occurrence.occurrence_at, occurrence.state, occurrence.considered, occurrence.admitted) == (
        first, t.OCCURRENCE_ADMITTED, 6, 4)
    runs = list(FlowRun.objects.filter(org_id=org.org_id, plan=plan))
    assert sorted(r.record_key for r in runs) == sorted(contacts[i].record_key for i in (0, 2, 3, 4))
    assert {(r.state, r.entry_path) for r in runs} == {(t.RUN_SUCCEEDED, f"@schedule:{first:%Y-%m-%dT%H:%M:%SZ}")}
    # A new lead, then three weeks pass unswept: the missed occurrences coalesce into the latest one.
    late = _contacts(org, ["lead"])[0]
    db_clock_advance(3 * 7 * 86400)
    assert run_until_idle() > 0
    assert _stage(late) == "nurtured"
    assert list(FlowScheduleOccurrence.objects.order_by("occurrence_at").values_list("occurrence_at", "admitted")) == [
        (first, 4), (first + dt.timedelta(weeks=3), 1)]
    assert run_until_idle() == 0


def test_concurrent_sweeps_open_an_occurrence_once(org, db_clock_advance):
    first = _next_minute()
    _deploy(org, first)
    contacts = _contacts(org, ["lead"] * 3)
    db_clock_advance((first - db_now()).total_seconds() + 1)
    results, errors = run_at_once(flow_try_schedule_one, flow_try_schedule_one, flow_try_schedule_one)
    assert not errors, errors
    assert FlowScheduleOccurrence.objects.count() == 1
    run_until_idle()
    assert FlowRun.objects.filter(org_id=org.org_id).count() == len(contacts)
    assert FlowScheduleOccurrence.objects.get().admitted == len(contacts)


def test_a_redeployed_flow_does_not_run_an_occurrence_again(org, db_clock_advance):
    first = _next_minute()
    _deploy(org, first)
    _contacts(org, ["lead"] * 2)
    db_clock_advance((first - db_now()).total_seconds() + 1)
    run_until_idle()
    # Redeployed (another plan) after the occurrence ran: the new activation starts with the next one.
    source = _source(start=first).replace(b"<label>Weekly Nurture</label>", b"<label>Weekly Nurture v2</label>")
    assert flow_deploy(org=org, source=source, flow_api_name=FLOW).plan_created
    _contacts(org, ["lead"])
    assert run_until_idle() == 0
    assert FlowScheduleOccurrence.objects.count() == 1 and FlowRun.objects.count() == 2


def test_a_worker_killed_inside_an_admission_batch_leaves_one_run_per_record(org, db_clock_advance):
    first = _next_minute()
    _deploy(org, first)
    contacts = _contacts(org, ["lead"] * 5)
    db_clock_advance((first - db_now()).total_seconds() + 1)
    env = {"NEXUS_FLOW_SCHEDULE_BATCH": "2"}
    assert flow_try_schedule_one()  # the occurrence is open; its batches come next
    crashed = run_manage(["run_workers", "--role", "flow", "--until-idle"],
                         subprocess_env(NEXUS_FAILPOINTS="flow.schedule.batch_before_commit", **env), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    occurrence = FlowScheduleOccurrence.objects.get()
    assert (occurrence.state, occurrence.considered) == (t.OCCURRENCE_ADMITTING, 0)  # the batch died uncommitted
    assert not FlowRun.objects.exists()
    restarted = run_manage(["run_workers", "--role", "flow", "--until-idle"], subprocess_env(**env), timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    occurrence.refresh_from_db()
    assert (occurrence.state, occurrence.considered, occurrence.admitted) == (t.OCCURRENCE_ADMITTED, 5, 5)
    assert sorted(FlowRun.objects.values_list("record_key", flat=True)) == sorted(c.record_key for c in contacts)
    assert [_stage(c) for c in contacts] == ["nurtured"] * 5


def test_the_schedules_command_lists_next_and_latest_occurrences(org, db_clock_advance):
    first = _next_minute()
    _deploy(org, first)
    _contacts(org, ["lead"])
    listed = json.loads(run_manage(["flows", "schedules", "--org", org.org_id], subprocess_env()).stdout)
    assert [(s["flow"], s["object"], s["frequency"], s["next_occurrence"], s["occurrences"]) for s in listed] == [
        (FLOW, "Contact", "Weekly", first.isoformat(), [])]
    db_clock_advance((first - db_now()).total_seconds() + 1)
    run_until_idle()
    listed = json.loads(run_manage(["flows", "schedules", "--org", org.org_id], subprocess_env()).stdout)
    assert listed[0]["next_occurrence"] == (first + dt.timedelta(weeks=1)).isoformat()
    assert [(o["occurrence_at"], o["state"], o["admitted"]) for o in listed[0]["occurrences"]] == [
        (first.isoformat(), t.OCCURRENCE_ADMITTED, 1)]
    refused = run_manage(["flows", "schedules", "--org", "o" * 65], subprocess_env())  # longer than an org id
    assert refused.returncode == 2 and "invalid" in refused.stderr
