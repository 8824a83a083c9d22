"""Record-triggered scheduled paths on the database clock (seed 004 section 14.4; docs/operations.md "Scheduled paths").

``fixtures/waits/Renewal_Notice.flow-meta.xml`` is written in Salesforce's
metadata format: after-save on ``Renewal__c`` when a renewal is created open
or updated to become open, with no immediate path, a path three days before
the record's ``Renewal_Date__c`` and an ``AsyncAfterCommit`` path. The rule
implemented for pending paths: a save that changes the time field recomputes
the path's time; a save after which the record no longer meets the entry
conditions withdraws it. Time moves with the database clock, never a sleep.
"""
from __future__ import annotations

import datetime as dt

import pytest
from django.db import transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import analyze_flow
from nexusflow.flows.errors import ActivationRejected
from nexusflow.flows.models import FlowAuditEvent, FlowCheckpoint, FlowDependency, FlowRun
from nexusflow.flows.services import flow_deploy, flow_try_resume_due_one
from nexusflow.kernel.clock import db_now
from nexusflow.records.metadata import current_view
from nexusflow.records.models import Record
from tests.concurrency import race_behind_hold

from .conftest import CORPUS, WAITS, run_until_idle, save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)

FLOW = "Renewal_Notice"
SOURCE = (WAITS / f"{FLOW}.flow-meta.xml").read_bytes()
OBJECT = "Renewal__c"
DAY = 86400
DATE_PATH = "Three_Days_Before_Renewal"



@pytest.fixture
def deployed(org, renewal_view):
    result = flow_deploy(org=org, source=SOURCE, flow_api_name=FLOW)
    assert result.activated and result.plan.execution_profile == "durable_orchestration"
    return result.plan


def _day(offset: int) -> str:
    return (db_now().date() + dt.timedelta(days=offset)).isoformat()


def _midnight(date_text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(date_text).replace(tzinfo=dt.UTC)


def _fields(org, record) -> dict:
    return Record.objects.get(org_id=org.org_id, object_name=OBJECT, record_key=record.record_key).fields


def _path_runs(org, record) -> dict[str, FlowRun]:
    return {r.entry_path: r for r in FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key)
            .exclude(entry_path="@immediate").order_by("id")}


def _waits(org, run) -> list[FlowDependency]:
    return list(FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("id"))


def _open(org, *, renewal_in_days: int = 10):
    return save_record(org, {"Name": "r-1", "Status__c": "Open", "Renewal_Date__c": _day(renewal_in_days)},
                       object_name=OBJECT)


def test_each_scheduled_path_is_its_own_run_and_the_dated_one_waits_for_its_time(org, deployed, db_clock_advance):
    renewal_date = _day(10)
    record = save_record(org, {"Name": "r-1", "Status__c": "Open", "Renewal_Date__c": renewal_date},
                         object_name=OBJECT)
    runs = _path_runs(org, record)
    assert set(runs) == {DATE_PATH, "AsyncAfterCommit"}
    assert not FlowRun.objects.filter(org_id=org.org_id, entry_path="@immediate").exists()  # no immediate path
    run_until_idle()
    assert _fields(org, record)["Seen__c"] == "yes"  # the after-commit path ran at once
    dated = FlowRun.objects.get(pk=runs[DATE_PATH].pk)
    [wait] = _waits(org, dated)
    due = _midnight(renewal_date) - dt.timedelta(days=3)
    assert (dated.state, wait.state, wait.deadline, wait.condition["record_field"]) == (
        t.RUN_WAITING, t.DEP_WAITING, due, "Renewal_Date__c")
    db_clock_advance((due - db_now()).total_seconds() - 60)
    assert flow_try_resume_due_one() is False and _fields(org, record).get("Notice__c") is None
    db_clock_advance(120)
    run_until_idle()
    assert _fields(org, record)["Notice__c"] == "due-soon"
    assert FlowRun.objects.get(pk=dated.pk).state == t.RUN_SUCCEEDED


def test_moving_the_date_recomputes_the_pending_path(org, deployed, db_clock_advance):
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    dated = _path_runs(org, record)[DATE_PATH]
    later = _day(20)
    update_record(org, record, {"Renewal_Date__c": later})
    assert _path_runs(org, record).keys() == {DATE_PATH, "AsyncAfterCommit"}  # the update admitted no new run
    run_until_idle()
    first, second = _waits(org, dated)
    assert (first.state, first.resolution["event"]) == (t.DEP_SATISFIED, "record_changed")
    assert (second.state, second.deadline) == (t.DEP_WAITING, _midnight(later) - dt.timedelta(days=3))
    db_clock_advance(8 * DAY)  # past the first date's time: nothing runs
    run_until_idle()
    assert _fields(org, record).get("Notice__c") is None and FlowRun.objects.get(pk=dated.pk).state == t.RUN_WAITING
    db_clock_advance(10 * DAY)
    run_until_idle()
    assert _fields(org, record)["Notice__c"] == "due-soon"


def test_a_date_moved_into_the_past_runs_the_path_at_once(org, deployed):
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    update_record(org, record, {"Renewal_Date__c": _day(1)})  # three days before tomorrow is already past
    run_until_idle()
    assert _fields(org, record)["Notice__c"] == "due-soon"


def test_leaving_the_entry_conditions_withdraws_the_pending_path(org, deployed, db_clock_advance):
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    dated = _path_runs(org, record)[DATE_PATH]
    update_record(org, record, {"Status__c": "Closed"})
    run_until_idle()
    run = FlowRun.objects.get(pk=dated.pk)
    assert run.state == t.RUN_SUCCEEDED
    outputs = [p["output"] for p in FlowCheckpoint.objects.filter(org_id=org.org_id, run_id=run.pk)
               .order_by("sequence").values_list("context_payload", flat=True) if "output" in p]
    assert {"outcome": "withdrawn", "why": "entry conditions no longer hold"}.items() <= outputs[-2].items()
    db_clock_advance(30 * DAY)
    run_until_idle()
    assert _fields(org, record).get("Notice__c") is None


def _date_moves_during(org, holds, db_clock_advance, *, held: str):
    """The dated path's time comes while a save moves the date ten days later; ``held`` commits first."""
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    dated = _path_runs(org, record)[DATE_PATH]
    db_clock_advance(8 * DAY)  # three days before the old date has passed
    later = _day(20)

    def save():
        return update_record(org, record, {"Renewal_Date__c": later})

    first, second = (flow_try_resume_due_one, save) if held == "resume" else (save, flow_try_resume_due_one)
    failpoint = "flow.wait.resume_before_commit" if held == "resume" else "flow.path.recheck_resolved"
    a, b = race_behind_hold(holds, failpoint, first, second, "flows_flowrun")
    assert (a.error, b.error) == (None, None)
    run_until_idle()
    return record, dated, later, (a.result, b.result)


@pytest.mark.parametrize("held", ["resume", "save"])
def test_the_time_coming_and_a_save_moving_the_date_race_onto_one_resolution(org, deployed, holds, db_clock_advance,
                                                                              held):
    """Seed 004 22.4-11 for a clock wait: deadline and notification (the save's recheck) race on the run's row.

    Whichever commits first resolves the wait; the other finds it resolved and does nothing. The path's step then
    reads the record as it is: the date moved, so it waits for the new time and has not run.
    """
    record, dated, later, results = _date_moves_during(org, holds, db_clock_advance, held=held)
    if held == "resume":
        assert results[0] is True  # the clock resolved it; the save's recheck found it no longer waiting
    else:
        assert results[1] is False  # the save resolved it early; the sweep found it no longer waiting
    first, second = _waits(org, dated)
    assert first.state == t.DEP_SATISFIED
    assert first.resolution["event"] == (DATE_PATH if held == "resume" else "record_changed")
    assert (second.state, second.deadline) == (t.DEP_WAITING, _midnight(later) - dt.timedelta(days=3))
    assert _fields(org, record).get("Notice__c") is None
    assert FlowRun.objects.get(pk=dated.pk).state == t.RUN_WAITING


def test_only_an_update_that_makes_the_record_meet_the_conditions_schedules_paths(org, deployed):
    record = save_record(org, {"Name": "r-2", "Status__c": "Draft", "Renewal_Date__c": _day(10)}, object_name=OBJECT)
    assert _path_runs(org, record) == {}
    update_record(org, record, {"Status__c": "Open"})
    assert set(_path_runs(org, record)) == {DATE_PATH, "AsyncAfterCommit"}
    run_until_idle()
    update_record(org, record, {"Name": "r-2 renamed"})  # still open: no change to meet the criteria
    assert FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key).count() == 2


def test_an_empty_date_withdraws_the_path(org, deployed):
    record = save_record(org, {"Name": "r-3", "Status__c": "Open"}, object_name=OBJECT)
    run_until_idle()
    run = FlowRun.objects.get(pk=_path_runs(org, record)[DATE_PATH].pk)
    assert run.state == t.RUN_SUCCEEDED and _waits(org, run) == []
    assert _fields(org, record).get("Notice__c") is None


@pytest.mark.parametrize("old,new,code", [
    ("<offsetUnit>Days</offsetUnit>", "<offsetUnit>Months</offsetUnit>", "engine_unsupported:scheduled_path:unit"),
    ("<timeSource>RecordField</timeSource>", "<timeSource>Calendar</timeSource>",
     "engine_unsupported:scheduled_path:time_source"),
    ("<offsetNumber>-3</offsetNumber>", "<offsetNumber>-99999999</offsetNumber>",
     "engine_unsupported:scheduled_path:offset"),
    ("<offsetNumber>-3</offsetNumber>", "<offsetNumber>" + "9" * 5000 + "</offsetNumber>",
     "engine_unsupported:scheduled_path:offset"),
])
def test_a_scheduled_path_the_engine_cannot_time_is_refused_at_activation(org, renewal_view, old, new, code):
    with pytest.raises(ActivationRejected) as refused:
        flow_deploy(org=org, source=SOURCE.replace(old.encode(), new.encode()), flow_api_name=FLOW)
    assert code in {d.code for d in refused.value.diagnostics}


def test_the_corpus_scheduled_path_is_compiled_into_the_trigger():
    """The corpus after-save flow with an AsyncAfterCommit path: its schedule is read even though its actions
    stay unknown (the plan is rejected for those, not for the path)."""
    from nexusflow.flows.binding import flow_runtime_binding
    from nexusflow.flows.catalog import catalog_current
    from nexusflow.flows.inventory import CHECK_ORG

    source = next(CORPUS.glob("*Create_Slack_Channel_For_Reseller_Order_Collaboration.flow-meta.xml")).read_bytes()
    view = current_view()
    catalog = catalog_current(binding=flow_runtime_binding(org_id=CHECK_ORG, metadata_view_digest=view.digest))
    result = analyze_flow(source=source, flow_api_name="Create_Slack_Channel", catalog=catalog, view=view,
                          subflows={}, schema="open")
    assert {d.code.split(":")[0] for d in result.errors} == {"unknown_action"}
    assert not [d for d in result.diagnostics if "scheduled" in d.code or d.element == "start"]


# --- Three dated paths on one record (fixtures/waits/Renewal_Lapse.flow-meta.xml) ---------------------------------
LAPSE = "Renewal_Lapse"
BEFORE, LAPSED, ARCHIVE = "Three_Days_Before", "One_Day_After", "Thirty_Days_After"


@pytest.fixture
def lapse_deployed(org, renewal_view):
    source = (WAITS / f"{LAPSE}.flow-meta.xml").read_bytes()
    result = flow_deploy(org=org, source=source, flow_api_name=LAPSE)
    assert result.activated
    return result.plan


def _advance_to(db_clock_advance, instant: dt.datetime) -> None:
    db_clock_advance((instant - db_now()).total_seconds())


def _step_outputs(org, run) -> list[dict]:
    return [p["output"] for p in FlowCheckpoint.objects.filter(org_id=org.org_id, run_id=run.pk)
            .order_by("sequence").values_list("context_payload", flat=True) if "output" in p]


def _path_output(org, run) -> dict:
    """The output of the run's last scheduled-path step (its verdict)."""
    return [o for o in _step_outputs(org, run) if "scheduled_path" in o][-1]


def test_one_save_withdraws_every_waiting_path_of_its_record(org, lapse_deployed, db_clock_advance):
    """Three runs wait at their paths' first steps; one save that closes the renewal wakes all three in one
    transaction (roots, then steps, then dependencies, in the one lock order) and each withdraws."""
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    runs = _path_runs(org, record)
    assert {p: FlowRun.objects.get(pk=r.pk).state for p, r in runs.items()} == dict.fromkeys(
        (BEFORE, LAPSED, ARCHIVE), t.RUN_WAITING)
    update_record(org, record, {"Status__c": "Closed"})
    assert {p: _waits(org, r)[0].resolution["event"] for p, r in runs.items()} == dict.fromkeys(
        (BEFORE, LAPSED, ARCHIVE), "record_changed")
    run_until_idle()
    for run in runs.values():
        assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED
        assert _path_output(org, run)["outcome"] == "withdrawn"
    db_clock_advance(60 * DAY)
    run_until_idle()
    assert _fields(org, record)["Status__c"] == "Closed" and _fields(org, record).get("Notice__c") is None


def test_a_save_leaves_a_wait_element_inside_a_started_path_alone(org, lapse_deployed, db_clock_advance):
    """The renewal's date moves after the three-days-before path entered its Grace_Period Wait element: the
    path has started, so the save does not end that wait (it only re-times the paths still waiting for their
    time); the grace period ends when it was computed to and the path finishes."""
    renewal_date = _day(10)
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    before = _path_runs(org, record)[BEFORE]
    _advance_to(db_clock_advance, _midnight(renewal_date) - dt.timedelta(days=3) + dt.timedelta(hours=1))
    run_until_idle()
    path_wait, grace = _waits(org, before)
    assert (path_wait.state, grace.state, grace.condition["kind"]) == (t.DEP_SATISFIED, t.DEP_WAITING, "time")
    update_record(org, record, {"Renewal_Date__c": _day(40)})
    run_until_idle()
    assert FlowDependency.objects.get(pk=grace.pk).state == t.DEP_WAITING
    assert FlowRun.objects.get(pk=before.pk).state == t.RUN_WAITING
    _advance_to(db_clock_advance, _midnight(renewal_date) + dt.timedelta(days=2, hours=1))
    run_until_idle()
    assert FlowRun.objects.get(pk=before.pk).state == t.RUN_SUCCEEDED
    assert _fields(org, record)["Notice__c"] == "grace-ended"
    assert _fields(org, record)["Status__c"] == "Open"  # the lapse path moved to the new date with the save


def test_a_path_that_closes_its_record_withdraws_the_other_waiting_paths(org, lapse_deployed, db_clock_advance):
    """The one-day-after path's own record write takes the renewal out of the entry conditions while the
    thirty-days-after run waits for its time and the three-days-before run waits inside its path: the write's
    step transaction holds its own run, so the recheck runs right after it commits (record lock first); the
    waiting path withdraws, the started one finishes."""
    renewal_date = _day(10)
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    runs = _path_runs(org, record)
    _advance_to(db_clock_advance, _midnight(renewal_date) + dt.timedelta(days=1, hours=1))
    run_until_idle()
    assert _fields(org, record)["Status__c"] == "Lapsed"
    assert FlowRun.objects.get(pk=runs[LAPSED].pk).state == t.RUN_SUCCEEDED
    archive = FlowRun.objects.get(pk=runs[ARCHIVE].pk)
    assert archive.state == t.RUN_SUCCEEDED
    assert (_path_output(org, archive)["outcome"], _path_output(org, archive)["why"]) == (
        "withdrawn", "entry conditions no longer hold")
    assert FlowRun.objects.get(pk=runs[BEFORE].pk).state == t.RUN_WAITING  # inside its Grace_Period wait
    _advance_to(db_clock_advance, _midnight(renewal_date) + dt.timedelta(days=31))
    run_until_idle()
    assert FlowRun.objects.get(pk=runs[BEFORE].pk).state == t.RUN_SUCCEEDED
    assert _fields(org, record)["Notice__c"] == "grace-ended" and _fields(org, record).get("Seen__c") is None


def test_an_operators_resume_runs_a_waiting_path_now(org, lapse_deployed):
    from nexusflow.flows.services import flow_wait_signal

    record = _open(org, renewal_in_days=10)
    run_until_idle()
    archive = _path_runs(org, record)[ARCHIVE]
    out = flow_wait_signal(org=org, run_id=archive.pk, producer_kind="runtime.clock", actor="ops-1",
                           reason="archive now")
    assert (out["state"], out["event"]) == (t.DEP_SATISFIED, ARCHIVE)
    run_until_idle()
    assert FlowRun.objects.get(pk=archive.pk).state == t.RUN_SUCCEEDED
    assert _fields(org, record)["Seen__c"] == "archived"
    assert (_path_output(org, archive)["outcome"], _path_output(org, archive)["operator"]) == (
        "due", {"actor": "ops-1", "reason": "archive now"})


def test_an_operators_resume_of_a_path_whose_record_left_the_conditions_withdraws_it(org, lapse_deployed):
    from nexusflow.flows.services import flow_wait_signal
    from nexusflow.records.services import record_lock
    from nexusflow.records.store import RecordStore

    record = _open(org, renewal_in_days=10)
    run_until_idle()
    archive = _path_runs(org, record)[ARCHIVE]
    with transaction.atomic():  # closed behind the Flow's back: the bare store write runs no after-save hook
        locked = record_lock(org=org, object_name=OBJECT, record_key=record.record_key)
        RecordStore.write(locked, fields={**locked.fields, "Status__c": "Closed"})
    flow_wait_signal(org=org, run_id=archive.pk, producer_kind="runtime.clock", actor="ops-1", reason="now")
    run_until_idle()
    assert _path_output(org, archive)["outcome"] == "withdrawn"
    assert _fields(org, record).get("Seen__c") is None


def test_a_save_landing_while_the_path_decides_its_time_is_seen(org, lapse_deployed, holds):
    """The path's first step holds its trigger record's lock while it decides the path's time (held at
    ``flow.wait.created``, before its commit): a save moving the date queues on the record, and once the
    wait committed the save's recheck re-times it. Without the record lock the save would slip in between
    the step's read and its commit, and the path would wait for the old date."""
    from nexusflow.flows.services import flow_try_run_step_one

    record = _open(org, renewal_in_days=10)
    later = _day(50)

    def first_path_step():
        while flow_try_run_step_one(worker_id="w-held"):
            pass

    held, queued = race_behind_hold(holds, "flow.wait.created", first_path_step,
                                    lambda: update_record(org, record, {"Renewal_Date__c": later}), "records_record")
    assert (held.error, queued.error) == (None, None)
    run_until_idle()
    for name, offset in ((BEFORE, -3), (LAPSED, 1), (ARCHIVE, 30)):
        waits = _waits(org, _path_runs(org, record)[name])
        assert waits[-1].state == t.DEP_WAITING
        assert waits[-1].deadline == _midnight(later) + dt.timedelta(days=offset)


def test_a_path_time_beyond_the_calendar_fails_its_run_after_one_attempt(org, lapse_deployed):
    """A renewal dated 9999-12-31: one day after it is past the calendar's end. That path's run fails
    definitely on its first attempt (not retried as if transient); the paths whose time exists wait."""
    from nexusflow.flows.models import FlowStepExecution

    record = save_record(org, {"Name": "r-far", "Status__c": "Open", "Renewal_Date__c": "9999-12-31"},
                         object_name=OBJECT)
    run_until_idle()
    runs = _path_runs(org, record)
    lapsed = FlowRun.objects.get(pk=runs[LAPSED].pk)
    assert lapsed.state == t.RUN_TERMINAL_FAILED
    assert FlowStepExecution.objects.get(org_id=org.org_id, run_id=lapsed.pk).attempts.count() == 1
    assert FlowRun.objects.get(pk=runs[BEFORE].pk).state == t.RUN_WAITING


def test_deleting_the_record_withdraws_its_waiting_paths_at_once(org, lapse_deployed):
    """The deletion (records before-delete hook, under the record lock, before the Connector's link handling)
    wakes every path still waiting for its time; each finds the record deleted and withdraws: nothing is left
    waiting until a time that no longer means anything. The support read shows each path's verdict."""
    from nexusflow.flows.services import flow_run_support_read
    from nexusflow.records.services import record_delete_by_key

    record = _open(org, renewal_in_days=10)
    run_until_idle()
    runs = _path_runs(org, record)
    record_delete_by_key(org=org, object_name=OBJECT, record_key=record.record_key)
    assert not FlowDependency.objects.filter(org_id=org.org_id, state=t.DEP_WAITING).exists()
    run_until_idle()
    for run in runs.values():
        assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED
        [verdict] = [s["wait_outcome"] for s in flow_run_support_read(org=org, run_id=run.pk)["steps"]
                     if s["wait_outcome"]]
        assert (verdict["outcome"], verdict["why"], verdict["event"]) == (
            "withdrawn", "the record was deleted", "record_changed")


def test_closing_then_reopening_before_any_worker_runs_withdraws_the_old_paths_once(org, lapse_deployed,
                                                                                  db_clock_advance):
    """The save that closed the renewal withdrew its waiting paths; re-opening it before a Flow worker looked
    admits a new set of paths but does not revive the old ones: each path's elements run once."""
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    old = _path_runs(org, record)
    update_record(org, record, {"Status__c": "Closed"})
    update_record(org, record, {"Status__c": "Open"})  # updated to meet the conditions again: a new set
    run_until_idle()
    for run in old.values():
        assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED
        assert _path_output(org, run)["outcome"] == "withdrawn"
    waiting = FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key, state=t.RUN_WAITING)
    assert sorted(waiting.values_list("entry_path", flat=True)) == sorted([BEFORE, LAPSED, ARCHIVE])
    _advance_to(db_clock_advance, _midnight(_day(10)) + dt.timedelta(days=1, hours=1))
    run_until_idle()
    assert FlowAuditEvent.objects.filter(run__record_key=record.record_key, event="step_committed",
                                         detail__step="write:Mark_Lapsed").count() == 1


def test_a_transaction_that_saves_the_record_then_locks_another_keeps_the_lock_order(org, lapse_deployed):
    """A save that wakes waiting paths locks no Flow row in the saving transaction (the recheck runs right
    after its commit), so the same transaction may go on to lock and save further records: nothing raises
    a lock-order violation, and the paths are withdrawn once it commits."""
    from nexusflow.records.services import record_lock, record_update

    first = _open(org, renewal_in_days=10)
    second = save_record(org, {"Name": "r-2", "Status__c": "Draft"}, object_name=OBJECT)
    run_until_idle()
    with transaction.atomic():
        a = record_lock(org=org, object_name=OBJECT, record_key=first.record_key)
        record_update(org=org, record=a, changes={"Status__c": "Closed"})
        b = record_lock(org=org, object_name=OBJECT, record_key=second.record_key)
        record_update(org=org, record=b, changes={"Name": "r-2 renamed"})
        assert FlowDependency.objects.filter(org_id=org.org_id, state=t.DEP_WAITING).count() == 3  # not yet
    run_until_idle()
    for run in _path_runs(org, first).values():
        assert _path_output(org, run)["outcome"] == "withdrawn"


def test_a_late_recheck_of_a_close_never_withdraws_the_paths_a_later_reopen_admitted(org, lapse_deployed):
    """A close's recheck that runs late (after a re-opening save admitted a new set of paths, which already
    wait) judges only the runs admitted before the close: the new set keeps waiting."""
    from nexusflow.flows.services import wait_resolution

    record = _open(org, renewal_in_days=10)
    run_until_idle()
    old = _path_runs(org, record)
    closed = update_record(org, record, {"Status__c": "Closed"})
    closed_fields, closed_version = dict(closed.fields), closed.version
    update_record(org, record, {"Status__c": "Open"})
    run_until_idle()
    new = FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key, state=t.RUN_WAITING)
    assert new.count() == 3 and not set(new.values_list("pk", flat=True)) & {r.pk for r in old.values()}
    # The close's recheck, replayed late with the values and version of the close:
    assert wait_resolution._recheck_after_commit(
        org=org, object_name=OBJECT, record_key=record.record_key, fields=closed_fields, version=closed_version,
        admitted_before=closed_version, changed_fields=frozenset({"Status__c"}), deleting=False) == 0
    assert FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key,
                                  state=t.RUN_WAITING).count() == 3


def test_closing_and_reopening_after_a_paths_time_came_runs_only_the_new_path(org, lapse_deployed, db_clock_advance):
    """Once a path's time came (its wait resolved) and before a Flow worker ran it, the renewal is closed and
    re-opened: the close's recheck finds no waiting path, the re-opening save admits a new set; the old path,
    when its step runs, finds itself admitted again by a later save and is withdrawn. The path's elements run once."""
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    old = _path_runs(org, record)
    _advance_to(db_clock_advance, _midnight(_day(10)) + dt.timedelta(days=1, hours=1))
    while flow_try_resume_due_one():
        pass  # the times came; no step has run
    assert FlowRun.objects.get(pk=old[LAPSED].pk).state == t.RUN_RUNNABLE
    update_record(org, record, {"Status__c": "Closed"})
    update_record(org, record, {"Status__c": "Open"})
    run_until_idle()
    assert _path_output(org, FlowRun.objects.get(pk=old[LAPSED].pk)) == {
        "scheduled_path": LAPSED, "outcome": "withdrawn", "due_at": None,
        "why": "the record left the entry conditions and a later save admitted this path again"}
    assert FlowAuditEvent.objects.filter(run__record_key=record.record_key, event="step_committed",
                                         detail__step="write:Mark_Lapsed").count() == 1


def test_a_wait_inside_a_path_reads_the_record_as_it_is_when_the_path_runs(org, lapse_deployed, db_clock_advance):
    """The renewal date moved after admission: the path's time was recomputed, and the Wait element inside the
    path (two days after the renewal date) counts from the moved date too, not from the admitting save's."""
    record = _open(org, renewal_in_days=10)
    run_until_idle()
    before = _path_runs(org, record)[BEFORE]
    moved = _day(20)
    update_record(org, record, {"Renewal_Date__c": moved})
    run_until_idle()
    _advance_to(db_clock_advance, _midnight(moved) - dt.timedelta(days=3) + dt.timedelta(hours=1))
    run_until_idle()
    [grace] = [w for w in _waits(org, FlowRun.objects.get(pk=before.pk)) if w.state == t.DEP_WAITING]
    assert grace.deadline == _midnight(moved) + dt.timedelta(days=2)
    assert _path_output(org, FlowRun.objects.get(pk=before.pk))["outcome"] == "due"
