"""Time waits: a Wait element's AlarmEvents on the database clock (seed 004 sections 10.5, 14.2-14.4; issue "Flows that wait").

The Flow file ``fixtures/waits/Reminder_Cooling_Off.flow-meta.xml`` is written in
Salesforce's metadata format: a Wait element with two AlarmEvents (three days
after the interview starts unless ``skip``; one hour when ``urgent``) and a
default path taken when no event's waiting conditions hold. Time never passes
by sleeping: the database clock moves (``db_clock_advance``).
"""
from __future__ import annotations

import datetime as dt
import json
import signal
from pathlib import Path

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import ActivationRejected, FlowExecutionError
from nexusflow.flows.models import FlowAuditEvent, FlowCheckpoint, FlowDependency, FlowRun, FlowStepExecution
from nexusflow.flows.producers import PRODUCER_CLOCK
from nexusflow.flows.services import (
    flow_deploy,
    flow_run_delete,
    flow_run_start,
    flow_try_resume_due_one,
    flow_waits_list,
)
from nexusflow.flows.services.time_waits import EXPIRY_FIRES
from nexusflow.flows.step_values import to_instant, wait_schedule
from tests.concurrency import race_behind_hold, run_at_once
from tests.conftest import run_manage, subprocess_env

from . import flowxml as fx
from .conftest import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

FLOW = "Reminder_Cooling_Off"
SOURCE = (Path(__file__).with_name("fixtures") / "waits" / f"{FLOW}.flow-meta.xml").read_bytes()
HOUR, DAY = 3600, 86400


@pytest.fixture
def deployed(org):
    result = flow_deploy(org=org, source=SOURCE, flow_api_name=FLOW)
    assert result.activated and result.plan.execution_profile == "durable_orchestration"
    return result.plan


def _start(org, *, urgent: bool = False, skip: bool = False, request_id: str = "r1") -> FlowRun:
    return flow_run_start(org=org, flow_api_name=FLOW, inputs={"urgent": urgent, "skip": skip},
                          request_id=request_id).run


def _run(org, run: FlowRun) -> FlowRun:
    return FlowRun.objects.get(org_id=org.org_id, pk=run.pk)


def _status(org, run: FlowRun):
    for payload in (FlowCheckpoint.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("-sequence")
                    .values_list("context_payload", flat=True)):
        if "context" in payload:
            return payload["context"]["vars"]["status"]
    raise AssertionError("no checkpoint context")


def _dependency(org, run: FlowRun) -> FlowDependency:
    return FlowDependency.objects.get(org_id=org.org_id, run_id=run.pk)


def test_a_three_day_wait_resumes_only_when_the_database_clock_reaches_it(org, deployed, db_clock_advance):
    run = _start(org)
    run_until_idle()
    run = _run(org, run)
    assert run.state == t.RUN_WAITING
    dependency = _dependency(org, run)
    due = (run.started_at or run.created_at) + dt.timedelta(days=3)
    assert (dependency.state, dependency.producer_kind, dependency.expiry_policy, dependency.deadline) == (
        t.DEP_WAITING, PRODUCER_CLOCK, EXPIRY_FIRES, due)
    assert dependency.condition == {"kind": "time", "events": [{"event": "Three_Days", "resume_at": due.isoformat()}]}
    assert FlowStepExecution.objects.get(pk=run.current_step_id).state == t.STEP_WAITING

    db_clock_advance(3 * DAY - 60)  # one minute early: nothing is due
    assert flow_try_resume_due_one() is False
    assert run_until_idle() == 0
    assert _run(org, run).state == t.RUN_WAITING

    db_clock_advance(120)
    assert flow_try_resume_due_one() is True
    assert flow_try_resume_due_one() is False  # resolved once
    dependency = _dependency(org, run)
    assert dependency.state == t.DEP_SATISFIED
    assert (dependency.resolution["event"], dependency.resolution["due_at"]) == ("Three_Days", due.isoformat())
    run_until_idle()
    assert (_run(org, run).state, _status(org, run)) == (t.RUN_SUCCEEDED, "reminded")
    assert FlowAuditEvent.objects.filter(org_id=org.org_id, run_id=run.pk, event="wait_resolved").count() == 1


def test_the_earliest_waiting_event_decides_the_path(org, deployed, db_clock_advance):
    run = _start(org, urgent=True)
    run_until_idle()
    dependency = _dependency(org, run)
    start = _run(org, run).started_at or run.created_at
    assert [e["event"] for e in dependency.condition["events"]] == ["Urgent_Hour", "Three_Days"]
    assert dependency.deadline == start + dt.timedelta(hours=1)
    db_clock_advance(HOUR + 1)
    run_until_idle()
    assert (_run(org, run).state, _status(org, run)) == (t.RUN_SUCCEEDED, "urgent")
    assert _dependency(org, run).resolution["event"] == "Urgent_Hour"


def test_no_event_to_wait_for_takes_the_default_path_at_once(org, deployed):
    run = _start(org, skip=True)
    run_until_idle()
    assert (_run(org, run).state, _status(org, run)) == (t.RUN_SUCCEEDED, "skipped")
    assert not FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).exists()


def test_two_resume_sweeps_at_once_resolve_the_wait_once(org, deployed, db_clock_advance):
    run = _start(org)
    run_until_idle()
    db_clock_advance(3 * DAY + 1)
    results, errors = run_at_once(flow_try_resume_due_one, flow_try_resume_due_one)
    assert errors == [] and sorted(results) == [False, True]
    run = _run(org, run)
    assert run.state == t.RUN_RUNNABLE and _dependency(org, run).state == t.DEP_SATISFIED
    assert FlowAuditEvent.objects.filter(org_id=org.org_id, run_id=run.pk, event="wait_resolved").count() == 1


def test_a_cancel_queued_behind_a_resume_cancels_the_resumed_run(org, deployed, holds, db_clock_advance):
    run = _start(org)
    run_until_idle()
    db_clock_advance(3 * DAY + 1)
    resume, cancel = race_behind_hold(holds, "flow.wait.resume_before_commit", flow_try_resume_due_one,
                                      lambda: flow_run_delete(org=org, run_id=run.pk), "flows_flowrun")
    assert (resume.error, cancel.error, resume.result) == (None, None, True)
    run = _run(org, run)
    assert (run.state, run.is_deleted) == (t.RUN_CANCELLED, True)
    assert _dependency(org, run).state == t.DEP_SATISFIED  # resolved first; the cancel then ended the run
    assert run_until_idle() == 0 and flow_try_resume_due_one() is False


def test_a_resume_queued_behind_a_cancel_finds_the_wait_cancelled(org, deployed, holds, db_clock_advance):
    run = _start(org)
    run_until_idle()
    db_clock_advance(3 * DAY + 1)
    cancel, resume = race_behind_hold(holds, "flow.cancel.before_commit",
                                      lambda: flow_run_delete(org=org, run_id=run.pk), flow_try_resume_due_one,
                                      "flows_flowrun")
    assert (cancel.error, resume.error, resume.result) == (None, None, False)
    assert _run(org, run).state == t.RUN_CANCELLED
    assert _dependency(org, run).state == t.DEP_CANCELLED
    assert not FlowAuditEvent.objects.filter(org_id=org.org_id, run_id=run.pk, event="wait_resolved").exists()


@pytest.mark.parametrize("failpoint", ["flow.wait.created", "flow.wait.resume_before_commit",
                                       "flow.wait.after_resume"])
def test_a_flow_worker_killed_during_a_wait_leaves_one_wait_and_one_resolution(org, deployed, failpoint,
                                                                               db_clock_advance, short_lease):
    """A real ``run_workers --role flow`` process is killed at the failpoint; a restarted one converges.

    ``flow.wait.after_resume``: the resolver died after its commit and before any claim of the step.
    """
    run = _start(org)
    if failpoint != "flow.wait.created":
        run_until_idle()
        db_clock_advance(3 * DAY + 1)
    crashed = run_manage(["run_workers", "--role", "flow", "--until-idle"],
                         subprocess_env(NEXUS_FAILPOINTS=failpoint), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    if failpoint == "flow.wait.created":
        # The wait's transaction died uncommitted: no dependency, the claimed step is recovered later.
        assert not FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).exists()
        db_clock_advance(120)  # the dead worker's lease runs out
    elif failpoint == "flow.wait.resume_before_commit":
        assert _dependency(org, run).state == t.DEP_WAITING  # the resolution died uncommitted
    else:
        assert (_dependency(org, run).state, _run(org, run).state) == (t.DEP_SATISFIED, t.RUN_RUNNABLE)
    restarted = run_manage(["run_workers", "--role", "flow", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    if failpoint == "flow.wait.created":
        assert _run(org, run).state == t.RUN_WAITING
        db_clock_advance(3 * DAY + 1)
        restarted = run_manage(["run_workers", "--role", "flow", "--until-idle"], subprocess_env(), timeout=120)
        assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert (_run(org, run).state, _status(org, run)) == (t.RUN_SUCCEEDED, "reminded")
    assert FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).count() == 1
    assert FlowAuditEvent.objects.filter(org_id=org.org_id, run_id=run.pk, event="wait_resolved").count() == 1


def test_a_waiting_run_keeps_its_plan_across_a_redeploy_of_its_flow(org, deployed, db_clock_advance):
    """Deployment restart: a new version of the Flow activates while the run waits; the run resumes on its plan."""
    run = _start(org)
    run_until_idle()
    changed = flow_deploy(org=org, source=SOURCE.replace(b"<stringValue>reminded</stringValue>",
                                                         b"<stringValue>reminded-v2</stringValue>"),
                          flow_api_name=FLOW)
    assert changed.activated and changed.plan.pk != deployed.pk
    db_clock_advance(3 * DAY + 1)
    run_until_idle()
    run = _run(org, run)
    assert (run.state, run.plan_id, _status(org, run)) == (t.RUN_SUCCEEDED, deployed.pk, "reminded")
    later = _start(org, request_id="r2")  # a run admitted now is bound to the new plan
    assert later.plan_id == changed.plan.pk


def test_the_waits_command_lists_the_org_s_waits_with_their_events(org, deployed):
    run = _start(org)
    run_until_idle()
    shown = run_manage(["flows", "waits", "--org", org.org_id, "--state", "waiting"], subprocess_env())
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["run_id"], row["producer_kind"], row["state"], row["expiry_policy"]) == (
        int(run.pk), PRODUCER_CLOCK, t.DEP_WAITING, EXPIRY_FIRES)
    assert [e["event"] for e in row["condition"]["events"]] == ["Three_Days"] and row["signals"] == []
    assert row["producer"]["kind"] == PRODUCER_CLOCK and row["producer"]["operator_signal"]
    assert flow_waits_list(org=org, state=t.DEP_SATISFIED) == []
    other = run_manage(["flows", "waits", "--org", "another-org"], subprocess_env())
    assert (other.returncode, json.loads(other.stdout)) == (0, [])
    for bad, message in ((["--state", "sleeping"], "invalid choice"), (["--limit", "0"], "invalid_argument"),
                         (["--limit", "501"], "invalid_argument")):
        refused = run_manage(["flows", "waits", "--org", org.org_id, *bad], subprocess_env())
        assert refused.returncode == 2 and message in refused.stderr, (bad, refused.stderr)


def test_an_operator_resumes_a_waiting_run_by_hand_along_its_earliest_event(org, deployed):
    run = _start(org, urgent=True)
    run_until_idle()
    env = subprocess_env()
    base = ["flows", "signal", str(run.pk), "--org", org.org_id, "--actor", "ops-ann", "--reason", "customer called"]
    refused = run_manage([*base[:5], "--producer", "runtime.intent_result", *base[5:]], env)
    assert refused.returncode == 2 and "flow_wait_signal_refused" in refused.stderr  # only its owner's receipt
    unknown = run_manage([*base[:5], "--producer", "no.such.producer", *base[5:]], env)
    assert unknown.returncode == 2 and "unknown producer 'no.such.producer'" in unknown.stderr
    other_org = run_manage(["flows", "signal", str(run.pk), "--org", "another-org", "--producer", "runtime.clock",
                            "--actor", "ops-ann", "--reason", "x"], env)
    assert other_org.returncode == 3 and "flow_run_not_found" in other_org.stderr
    assert _run(org, run).state == t.RUN_WAITING  # nothing above moved it
    done = run_manage([*base[:5], "--producer", "runtime.clock", *base[5:]], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"run_id": int(run.pk), "dependency_id": int(_dependency(org, run).pk),
                                       "producer_kind": PRODUCER_CLOCK, "event": "Urgent_Hour",
                                       "state": t.DEP_SATISFIED}
    assert _dependency(org, run).resolution["operator"] == {"actor": "ops-ann", "reason": "customer called"}
    again = run_manage([*base[:5], "--producer", "runtime.clock", *base[5:]], env)
    assert again.returncode == 2 and "does not wait" in again.stderr  # resolved once
    run_until_idle()
    assert (_run(org, run).state, _status(org, run)) == (t.RUN_SUCCEEDED, "urgent")


def _wait_flow(event_type: str = "AlarmEvent", unit: str = "Days", alarm: str | None = "$Flow.CurrentDateTime") -> bytes:
    params = ""
    if alarm is not None:
        params += (f"<inputParameters><name>AlarmTime</name><value><elementReference>{alarm}</elementReference>"
                   "</value></inputParameters>")
    params += ("<inputParameters><name>TimeOffset</name><value><numberValue>2</numberValue></value></inputParameters>"
               f"<inputParameters><name>TimeOffsetUnit</name><value><stringValue>{unit}</stringValue></value>"
               "</inputParameters>")
    wait = ("<waits><name>Pause</name><label>Pause</label><locationX>1</locationX><locationY>1</locationY>"
            "<defaultConnectorLabel>x</defaultConnectorLabel><waitEvents><name>Later</name>"
            "<conditionLogic>and</conditionLogic>" + fx.conn("Done") + f"<eventType>{event_type}</eventType>"
            + params + "<label>x</label></waitEvents></waits>")
    done = fx.assignment("Done", None, [("elapsed", "Assign", "<booleanValue>true</booleanValue>")])
    return fx.flow(wait, done, fx.variable("elapsed", data_type="Boolean"), start=fx.start("Pause"))


@pytest.mark.parametrize("kwargs,code", [
    ({"event_type": "PlatformEventSubscription"}, "engine_unsupported:wait_event:PlatformEventSubscription"),
    ({"unit": "Weeks"}, "engine_unsupported:wait_event:TimeOffsetUnit"),
    ({"alarm": None}, "engine_unsupported:wait_event:AlarmTime"),
])
def test_a_wait_the_engine_cannot_time_is_refused_at_activation(org, kwargs, code):
    with pytest.raises(ActivationRejected) as refused:
        flow_deploy(org=org, source=_wait_flow(**kwargs), flow_api_name="Pause_Flow")
    assert code in {d.code for d in refused.value.diagnostics}
    assert not FlowRun.objects.exists()


def test_a_wait_the_engine_can_time_activates(org):
    assert flow_deploy(org=org, source=_wait_flow(), flow_api_name="Pause_Flow").activated


# --- the time arithmetic, no database ------------------------------------------------------------------------
NOW = dt.datetime(2026, 12, 4, 9, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize("value,expected", [
    ("2026-12-04T09:30:00Z", NOW), ("2026-12-04T10:30:00+01:00", NOW), ("2026-12-04T09:30:00.000+0000", NOW),
    ("2026-12-04", dt.datetime(2026, 12, 4, tzinfo=dt.UTC)), (NOW.replace(tzinfo=None), NOW),
    (dt.date(2026, 12, 4), dt.datetime(2026, 12, 4, tzinfo=dt.UTC)),
])
def test_alarm_times_are_read_as_utc_instants(value, expected):
    assert to_instant(value, what="t") == expected


@pytest.mark.parametrize("value", ["", " 2026-12-04", "tomorrow", None, 5, "2026-13-01"])
def test_a_malformed_alarm_time_is_a_definite_error(value):
    with pytest.raises(FlowExecutionError):
        to_instant(value, what="t")


def _node(*events):
    return {"element": "Pause", "events": list(events)}


def _alarm(name, *, base, offset=None, unit=None, conditions=()):
    inputs = {"AlarmTime": base}
    if offset is not None:
        inputs["TimeOffset"] = {"kind": "numberValue", "value": str(offset)}
    if unit is not None:
        inputs["TimeOffsetUnit"] = {"kind": "stringValue", "value": unit}
    return {"name": name, "event_type": "AlarmEvent", "class": "time", "inputs": inputs,
            "conditions": list(conditions), "logic": "and"}


def _schedule(node, record=None):
    return wait_schedule(plan_payload={}, node=node, record=record or {"Id": "1"}, object_name="Contact",
                         now=NOW, interview_start=NOW - dt.timedelta(hours=5))


def test_the_schedule_orders_events_by_time_then_declaration_and_reads_record_dates():
    start = {"kind": "elementReference", "value": "$Flow.InterviewStartTime"}
    close = {"kind": "elementReference", "value": "$Record.closedate"}
    events = _schedule(_node(
        _alarm("Before_Close", base=close, offset=-2, unit="Days"),
        _alarm("Tied", base=start, offset=5, unit="Hours"),
        _alarm("Now", base={"kind": "elementReference", "value": "$Flow.CurrentDateTime"}),
        _alarm("Half_Hour", base=start, offset=0.5, unit="Hours"),
    ), record={"Id": "1", "closedate": "2026-12-10"})
    assert [(e.name, e.resume_at) for e in events] == [
        ("Half_Hour", NOW - dt.timedelta(hours=4, minutes=30)), ("Tied", NOW), ("Now", NOW),
        ("Before_Close", dt.datetime(2026, 12, 8, tzinfo=dt.UTC))]


def test_an_empty_record_date_or_a_bad_unit_fails_the_step_definitely():
    close = {"kind": "elementReference", "value": "$Record.closedate"}
    with pytest.raises(FlowExecutionError, match="AlarmTime is empty"):
        _schedule(_node(_alarm("Close", base=close)), record={"Id": "1", "closedate": None})
    now = {"kind": "elementReference", "value": "$Flow.CurrentDateTime"}
    with pytest.raises(FlowExecutionError, match="TimeOffsetUnit"):
        _schedule(_node(_alarm("Weeks", base=now, offset=1, unit="Weeks")))


@pytest.mark.parametrize("base,offset", [
    ("9999-12-30", 5), ("0001-01-02", -5), ("2026-12-10", 10**9), ("2026-12-10", "1e308"),
])
def test_a_resume_time_beyond_the_calendar_fails_the_step_definitely(base, offset):
    """A date plus an offset past year 9999 (or before year 1) is a definite error, never an OverflowError that
    the executor would retry as if it were transient."""
    record_date = {"kind": "elementReference", "value": "$Record.closedate"}
    with pytest.raises(FlowExecutionError, match="out of the calendar's range"):
        _schedule(_node(_alarm("Far", base=record_date, offset=offset, unit="Days")),
                  record={"Id": "1", "closedate": base})


def test_a_wait_far_beyond_the_calendar_fails_its_run_after_one_attempt(org):
    """End to end: the step fails definitely (one attempt, run TerminalFailed), not after five retries."""
    source = _wait_flow().replace(b"<numberValue>2</numberValue>", b"<numberValue>999999999999</numberValue>")
    assert flow_deploy(org=org, source=source, flow_api_name="Pause_Flow").activated
    run = flow_run_start(org=org, flow_api_name="Pause_Flow", inputs={}, request_id="far").run
    run_until_idle()
    assert _run(org, run).state == t.RUN_TERMINAL_FAILED
    assert FlowStepExecution.objects.get(org_id=org.org_id, run_id=run.pk).attempts.count() == 1


@pytest.mark.parametrize("run_id", ["²", "0", "-1", "01", "1.0", " 1", "9" * 19, "9223372036854775808", "١"])
def test_the_flows_commands_refuse_a_malformed_run_id_with_exit_2(org, run_id):
    from django.core.management import CommandError, call_command

    for argv in (["cancel", run_id, "--org", org.org_id], ["show", run_id, "--org", org.org_id],
                 ["signal", run_id, "--org", org.org_id, "--producer", "runtime.clock", "--actor", "ops-ann",
                  "--reason", "x"]):
        with pytest.raises(CommandError) as refused:
            call_command("flows", *argv)
        assert refused.value.returncode == 2 and "invalid_identity" in str(refused.value), argv



@pytest.mark.parametrize("reason", ["undecodable \udcff reason", "bell \x07 in it", "escape \x1b[31m red"])
def test_a_signal_reason_that_is_not_printable_text_is_refused_before_sql(org, deployed, reason):
    from nexusflow.flows.services import flow_wait_signal
    from nexusflow.kernel.errors import InvalidIdentity

    run = _start(org, urgent=True)
    run_until_idle()
    with pytest.raises(InvalidIdentity, match="printable text"):
        flow_wait_signal(org=org, run_id=run.pk, producer_kind=PRODUCER_CLOCK, actor="ops-ann", reason=reason)
    assert _dependency(org, run).state == t.DEP_WAITING
