"""Waiting for a record: a Wait element's record event, producer ``record.condition`` (seed 004 sections 14.1-14.4).

``fixtures/waits/Renewal_Await_Payment.flow-meta.xml`` is written in Salesforce's
metadata format: after-save on ``Renewal__c`` created open, a Wait element
with a record event (``Renewal__ChangeEvent``: the triggering renewal's
``Status__c`` becomes ``Paid``) beside an AlarmEvent three days after the
interview starts, and a fault path. ``Renewal_Await_Signature`` waits for
``Signed`` alone, with neither a time event nor a fault path. Time moves with
the database clock, never a sleep. A save whose own match is lost is a real
child process killed at ``flow.wake.record_producer_match``, right after its
commit.
"""
from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys

import pytest
from django.db import connection

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import CompileError, WaitSignalRefused
from nexusflow.flows.models import (
    FlowAuditEvent,
    FlowCheckpoint,
    FlowDependency,
    FlowRun,
    FlowStepAttempt,
    FlowWakeSignal,
)
from nexusflow.flows.services import (
    flow_deploy,
    flow_try_expire_one,
    flow_try_resume_due_one,
    flow_try_run_step_one,
    flow_try_wake_one,
    flow_wait_signal,
)
from nexusflow.flows.services.record_waits import record_wake_verdict
from nexusflow.flows.services.waits import _wake
from nexusflow.records.models import Record
from tests.concurrency import Worker, race_behind_hold, run_at_once
from tests.conftest import ROOT, run_manage, subprocess_env

from .conftest import WAITS, run_until_idle, save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)

OBJECT = "Renewal__c"
PAYMENT, SIGNATURE = "Renewal_Await_Payment", "Renewal_Await_Signature"
DAY = 86400
PRODUCER = "record.condition"



def _source(flow: str) -> bytes:
    return (WAITS / f"{flow}.flow-meta.xml").read_bytes()


def _deploy(org, flow, source: bytes | None = None):
    result = flow_deploy(org=org, source=source or _source(flow), flow_api_name=flow)
    assert result.activated, result.diagnostics
    assert result.plan.execution_profile == "durable_orchestration"
    return result.plan


@pytest.fixture
def payment(org, renewal_view):
    return _deploy(org, PAYMENT)


@pytest.fixture
def signature(org, renewal_view):
    return _deploy(org, SIGNATURE)


def _open(org):
    return save_record(org, {"Name": "r-1", "Status__c": "Open"}, object_name=OBJECT)


def _fields(org, record) -> dict:
    return Record.objects.get(org_id=org.org_id, object_name=OBJECT, record_key=record.record_key).fields


def _run(org, record) -> FlowRun:
    return FlowRun.objects.get(org_id=org.org_id, record_key=record.record_key)


def _dependency(org, record) -> FlowDependency:
    return FlowDependency.objects.get(org_id=org.org_id, run__record_key=record.record_key)


def _signals(org, record) -> list[FlowWakeSignal]:
    return list(FlowWakeSignal.objects.filter(org_id=org.org_id, flow_run_id=_run(org, record).pk)
                .order_by("wake_version"))


def _resolutions(org, record) -> int:
    return FlowAuditEvent.objects.filter(org_id=org.org_id, run_id=_run(org, record).pk,
                                         event="wait_resolved").count()


def _outcome(org, record):
    for payload in (FlowCheckpoint.objects.filter(org_id=org.org_id, run_id=_run(org, record).pk)
                    .order_by("-sequence").values_list("context_payload", flat=True)):
        if "context" in payload:
            return payload["context"]["vars"].get("outcome")
    return None


def _waiting(org):
    record = _open(org)
    run_until_idle()
    assert _run(org, record).state == t.RUN_WAITING
    return record


def _save_in_child_killed_after_commit(org, record, changes: dict) -> None:
    """Save ``changes`` in a real child process killed right after its commit, before its own match ran."""
    script = (
        "import django, os, json, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'nexusflow.settings');"
        "django.setup();"
        "from tests.flows.conftest import update_record;"
        "from nexusflow.kernel.scope import OrgScope;"
        "from nexusflow.records.models import Record;"
        "org = OrgScope(sys.argv[1]);"
        "record = Record.objects.get(org_id=sys.argv[1], object_name=sys.argv[2], record_key=sys.argv[3]);"
        "update_record(org, record, json.loads(sys.argv[4]))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, org.org_id, OBJECT, record.record_key, json.dumps(changes)], cwd=ROOT,
        env=subprocess_env(NEXUS_FAILPOINTS="flow.wake.record_producer_match", NEXUS_METADATA_DIR=str(WAITS)),
        capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]


def test_a_renewal_paid_while_the_flow_waits_takes_the_paid_path_once(org, payment):
    record = _waiting(org)
    dependency = _dependency(org, record)
    run = _run(org, record)
    assert (dependency.producer_kind, dependency.dependency_key, dependency.expiry_policy) == (
        PRODUCER, f"{OBJECT}/{record.record_key}", "fires")
    assert dependency.condition["match"] == {"Status__c": "Paid"}
    assert dependency.condition["after_version"] == 1
    assert dependency.deadline == (run.started_at or run.created_at) + dt.timedelta(days=3)
    update_record(org, record, {"Status__c": "Paid"})
    # The save's own fresh match resolved the wait right after its commit: no sweep was needed.
    assert _dependency(org, record).state == t.DEP_SATISFIED
    run_until_idle()
    assert (_fields(org, record)["Notice__c"], _run(org, record).state) == ("thanks", t.RUN_SUCCEEDED)
    [sig] = _signals(org, record)
    assert (sig.state, sig.wake_version, sig.dependency_id) == (t.SIGNAL_CONSUMED, 2, dependency.pk)
    resolution = _dependency(org, record).resolution
    assert (resolution["event"], resolution["record_version"], resolution["signal"]) == ("Paid", 2, sig.pk)
    assert _resolutions(org, record) == 1


def test_a_save_that_does_not_meet_the_condition_expires_its_signal_and_the_run_keeps_waiting(org, payment):
    record = _waiting(org)
    update_record(org, record, {"Name": "r-1 renamed"})
    assert _dependency(org, record).state == t.DEP_WAITING
    assert [s.state for s in _signals(org, record)] == [t.SIGNAL_EXPIRED]
    update_record(org, record, {"Status__c": "Paid"})
    run_until_idle()
    assert [s.state for s in _signals(org, record)] == [t.SIGNAL_EXPIRED, t.SIGNAL_CONSUMED]
    assert _fields(org, record)["Notice__c"] == "thanks"


def test_three_days_unpaid_takes_the_alarm_path_and_a_later_payment_changes_nothing(org, payment, db_clock_advance):
    record = _waiting(org)
    db_clock_advance(3 * DAY - 60)
    assert flow_try_resume_due_one() is False
    db_clock_advance(120)
    run_until_idle()
    assert (_fields(org, record)["Notice__c"], _run(org, record).state) == ("lapsed", t.RUN_SUCCEEDED)
    assert _dependency(org, record).resolution["event"] == "Three_Days_Unpaid"
    update_record(org, record, {"Status__c": "Paid"})
    run_until_idle()
    assert _fields(org, record)["Notice__c"] == "lapsed" and _signals(org, record) == []  # the run has ended


def test_a_payment_committed_before_the_wait_step_ran_takes_the_paid_path_once(org, payment):
    """Seed 004 22.4-02, the notification first: the save's signal commits before any dependency exists."""
    record = _open(org)
    update_record(org, record, {"Status__c": "Paid"})  # the run is admitted, its Wait step has not run
    [early] = _signals(org, record)
    assert (early.state, early.wake_version) == (t.SIGNAL_UNMATCHED, 2)  # kept, though nothing waits yet
    run_until_idle()
    assert (_fields(org, record)["Notice__c"], _run(org, record).state) == ("thanks", t.RUN_SUCCEEDED)
    # The Wait step read the record under its lock and found it paid: no dependency, nothing consumed twice.
    assert not FlowDependency.objects.filter(org_id=org.org_id, run__record_key=record.record_key).exists()
    assert FlowWakeSignal.objects.get(pk=early.pk).dependency_id is None


def test_a_payment_queued_behind_the_wait_commit_resumes_the_run_once(org, payment, holds):
    """Seed 004 22.4-02, the race: the save waits on the record lock the Wait step holds until its dependency commits."""
    record = _open(org)
    step, save = race_behind_hold(holds, "flow.wait.created", lambda: flow_try_run_step_one(worker_id="w1"),
                                  lambda: update_record(org, record, {"Status__c": "Paid"}), "records_record")
    assert (step.error, save.error) == (None, None)
    dependency = _dependency(org, record)
    assert (dependency.condition["after_version"], dependency.state) == (1, t.DEP_SATISFIED)
    run_until_idle()
    assert (_fields(org, record)["Notice__c"], _resolutions(org, record)) == ("thanks", 1)
    assert [s.state for s in _signals(org, record)] == [t.SIGNAL_CONSUMED]


def test_a_wait_committed_by_a_killed_worker_and_a_save_killed_before_its_match_meet_in_the_sweep(org, payment):
    """Seed 004 22.4-04 and 22.4-05: both fresh matches died with their processes; the flow.wake sweep matches."""
    record = _open(org)
    crashed = run_manage(["run_workers", "--role", "flow", "--until-idle"],
                         subprocess_env(NEXUS_FAILPOINTS="flow.wait.record_wait_committed",
                                        NEXUS_METADATA_DIR=str(WAITS)), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert (_dependency(org, record).state, _run(org, record).state) == (t.DEP_WAITING, t.RUN_WAITING)
    _save_in_child_killed_after_commit(org, record, {"Status__c": "Paid"})
    [sig] = _signals(org, record)
    assert (sig.state, _dependency(org, record).state) == (t.SIGNAL_UNMATCHED, t.DEP_WAITING)
    assert flow_try_wake_one() is True
    assert flow_try_wake_one() is False  # matched once
    restarted = run_manage(["run_workers", "--role", "flow", "--until-idle"],
                           subprocess_env(NEXUS_METADATA_DIR=str(WAITS)), timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert (_fields(org, record)["Notice__c"], _run(org, record).state) == ("thanks", t.RUN_SUCCEEDED)
    assert (_resolutions(org, record), FlowWakeSignal.objects.get(pk=sig.pk).state) == (1, t.SIGNAL_CONSUMED)


def test_a_stale_paid_signal_never_resumes_a_renewal_that_is_no_longer_paid(org, payment):
    """Seed 004 22.4-08: the record as it is when the match runs decides, not the order signals arrive in."""
    record = _waiting(org)
    _save_in_child_killed_after_commit(org, record, {"Status__c": "Paid"})  # wake version 2
    _save_in_child_killed_after_commit(org, record, {"Status__c": "Open"})  # wake version 3: undone
    older, newer = _signals(org, record)
    run = _run(org, record)
    assert (older.wake_version, newer.wake_version) == (2, 3)
    assert _wake(org_id=org.org_id, run_id=run.pk, signal_id=older.pk) is False  # "Paid", but it is Open now
    assert _wake(org_id=org.org_id, run_id=run.pk, signal_id=newer.pk) is False
    assert [s.state for s in _signals(org, record)] == [t.SIGNAL_EXPIRED, t.SIGNAL_EXPIRED]
    assert (_dependency(org, record).state, _run(org, record).state) == (t.DEP_WAITING, t.RUN_WAITING)
    update_record(org, record, {"Status__c": "Paid"})
    run_until_idle()
    assert (_fields(org, record)["Notice__c"], _resolutions(org, record)) == ("thanks", 1)


def test_a_stale_signal_arriving_after_the_newer_one_resolved_the_wait_is_a_no_op(org, payment):
    """Seed 004 22.4-08: the newer version resolves; the older one delivered afterwards changes nothing."""
    record = _waiting(org)
    _save_in_child_killed_after_commit(org, record, {"Name": "renamed"})  # wake version 2, not paid
    _save_in_child_killed_after_commit(org, record, {"Status__c": "Paid"})  # wake version 3
    older, newer = _signals(org, record)
    run = _run(org, record)
    assert _wake(org_id=org.org_id, run_id=run.pk, signal_id=newer.pk) is True
    resolved = _dependency(org, record)
    assert _wake(org_id=org.org_id, run_id=run.pk, signal_id=older.pk) is False
    assert flow_try_wake_one() is False
    again = _dependency(org, record)
    assert (again.version, again.resolution) == (resolved.version, resolved.resolution)
    assert resolved.resolution["wake_version"] == 3
    run_until_idle()
    assert (_fields(org, record)["Notice__c"], _resolutions(org, record)) == ("thanks", 1)


def test_a_signal_no_newer_than_the_wait_is_stale_and_expires(org, payment):
    """Seed 004 22.4-08: a wake version the wait already saw when it committed cannot wake it."""
    record = _open(org)
    update_record(org, record, {"Name": "renamed"})  # wake version 2 while the run is not waiting yet
    run_until_idle()
    dependency = _dependency(org, record)
    assert dependency.condition["after_version"] == 2
    [sig] = _signals(org, record)
    assert record_wake_verdict(dependency, sig) == ("stale", None)
    assert _wake(org_id=org.org_id, run_id=_run(org, record).pk, signal_id=sig.pk) is False
    assert FlowWakeSignal.objects.get(pk=sig.pk).state == t.SIGNAL_EXPIRED
    assert _dependency(org, record).state == t.DEP_WAITING


def test_a_renewal_deleted_before_the_wait_step_ran_never_starts_a_wait(org, payment):
    """Seed 004 22.4-09: the producer is missing; no dependency is written and nothing polls for it."""
    record = _open(org)
    _delete(org, record)
    run_until_idle()
    run = _run(org, record)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_step_execution_error")
    assert list(FlowStepAttempt.objects.filter(org_id=org.org_id, step__run_id=run.pk)
                .values_list("safe_error_code", flat=True)) == ["flow_wait_producer_missing"]
    assert not FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).exists()
    assert run_until_idle() == 0


def _delete(org, record):
    from django.db import transaction

    from nexusflow.records.services import record_delete, record_lock

    with transaction.atomic():
        record_delete(org=org, record=record_lock(org=org, object_name=OBJECT, record_key=record.record_key))


def test_a_renewal_deleted_while_the_flow_waits_takes_the_fault_path(org, payment):
    """Seed 004 22.4-10 with a fault path: the deletion's signal ends the wait along it at once."""
    record = _waiting(org)
    _delete(org, record)
    dependency = _dependency(org, record)
    assert (dependency.state, dependency.reason_code) == (t.DEP_EXPIRED, "flow_wait_producer_deleted")
    run_until_idle()
    assert (_run(org, record).state, _outcome(org, record)) == (t.RUN_SUCCEEDED, "record-gone")
    assert [s.state for s in _signals(org, record)] == [t.SIGNAL_CONSUMED]


def test_a_renewal_deleted_while_a_wait_without_a_fault_path_waits_fails_the_run(org, signature):
    """Seed 004 22.4-10 without a fault path: the run fails with flow_wait_producer_deleted, step and root together."""
    record = _waiting(org)
    _delete(org, record)
    run = _run(org, record)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_wait_producer_deleted")
    assert FlowAuditEvent.objects.filter(org_id=org.org_id, run_id=run.pk, event="wait_producer_deleted").count() == 1


def test_a_wait_without_a_time_event_expires_at_the_policy_maximum_wait_age(org, signature, db_clock_advance):
    """Seed 004 14.4: a producer wait cannot wait forever; the maximum wait age comes from the runtime policy."""
    record = _waiting(org)
    dependency = _dependency(org, record)
    assert (dependency.expiry_policy, dependency.deadline - dependency.created_at) == (
        "terminal_failure", dt.timedelta(days=30))
    db_clock_advance(30 * DAY - 60)
    assert flow_try_expire_one() is False
    db_clock_advance(120)
    assert flow_try_expire_one() is True
    run = _run(org, record)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_dependency_expired")


def test_payment_and_timeout_at_the_boundary_end_in_exactly_one_branch(org, payment, db_clock_advance):
    """The bug report: two recoveries of one waiting run, the signal arriving at the timeout boundary."""
    record = _waiting(org)
    db_clock_advance(3 * DAY + 1)
    _save_in_child_killed_after_commit(org, record, {"Status__c": "Paid"})
    results, errors = run_at_once(flow_try_resume_due_one, flow_try_wake_one, flow_try_resume_due_one,
                                  flow_try_wake_one)
    assert errors == [] and sorted(results) == [False, False, False, True]
    run_until_idle()
    event = _dependency(org, record).resolution["event"]
    [sig] = _signals(org, record)
    expected = {"Paid": ("thanks", t.SIGNAL_CONSUMED), "Three_Days_Unpaid": ("lapsed", t.SIGNAL_UNMATCHED)}[event]
    assert (_fields(org, record)["Notice__c"], sig.state) == expected
    assert (_run(org, record).state, _resolutions(org, record)) == (t.RUN_SUCCEEDED, 1)


def test_a_severed_connection_during_the_timeout_commits_nothing_and_the_payment_then_wins(org, payment, holds,
                                                                                          db_clock_advance):
    """The bug report after a severed DB connection during recovery."""
    record = _waiting(org)
    db_clock_advance(3 * DAY + 1)
    _save_in_child_killed_after_commit(org, record, {"Status__c": "Paid"})
    holds.arm("flow.wait.resume_before_commit")
    resume = Worker(flow_try_resume_due_one, "resume")
    resume.start()
    marker = holds.wait_held("flow.wait.resume_before_commit")
    with connection.cursor() as cursor:
        cursor.execute("KILL CONNECTION %s", [resume.connection_id])
    holds.release(marker)
    resume.join(60)
    assert resume.error is not None and _dependency(org, record).state == t.DEP_WAITING
    assert flow_try_wake_one() is True
    run_until_idle()
    assert (_fields(org, record)["Notice__c"], _resolutions(org, record)) == ("thanks", 1)
    assert [s.state for s in _signals(org, record)] == [t.SIGNAL_CONSUMED]


def test_an_operator_resume_takes_the_record_event_path(org, payment):
    record = _waiting(org)
    run = _run(org, record)
    result = flow_wait_signal(org=org, run_id=run.pk, producer_kind=PRODUCER, actor="ops-1",
                              reason="paid by wire; the CRM was not updated")
    assert (result["event"], result["state"]) == ("Paid", t.DEP_SATISFIED)
    run_until_idle()
    assert _fields(org, record)["Notice__c"] == "thanks"
    assert _dependency(org, record).resolution["operator"]["actor"] == "ops-1"
    with pytest.raises(WaitSignalRefused):
        flow_wait_signal(org=org, run_id=run.pk, producer_kind=PRODUCER, actor="ops-1", reason="again")


@pytest.mark.parametrize(("edit", "code"), [
    (lambda s: s.replace(b"<elementReference>$Record.Id</elementReference>",
                         b"<stringValue>a7R000000000001</stringValue>"), "engine_unsupported:wait_event:RecordId"),
    # An object the metadata view lacks is refused by the compiler, before the engine looks at the wait.
    (lambda s: s.replace(b"Renewal__ChangeEvent", b"ContactChangeEvent"), "unknown_object:Contact"),
    # A second record event on the same Wait element (its inputs renamed to fields the object defines).
    (lambda s: s.replace(b"<eventType>AlarmEvent</eventType>", b"<eventType>Renewal__ChangeEvent</eventType>")
     .replace(b"<name>AlarmTime</name>", b"<name>Name</name>").replace(b"<name>TimeOffset</name>",
                                                                      b"<name>Notice__c</name>")
     .replace(b"<name>TimeOffsetUnit</name>", b"<name>Seen__c</name>"), "engine_unsupported:wait_event:record"),
])
def test_a_record_event_the_engine_cannot_watch_is_refused_at_activation(org, renewal_view, edit, code):
    with pytest.raises(CompileError) as refused:
        flow_deploy(org=org, source=edit(_source(PAYMENT)), flow_api_name=PAYMENT)
    assert code in {d.code for d in refused.value.diagnostics}


def test_a_resume_condition_on_a_field_the_object_lacks_is_refused_at_deploy(org, renewal_view):
    """A misspelled resume field would never match: the compiler refuses it like any unknown field."""
    source = _source(SIGNATURE).replace(b"<name>Status__c</name>", b"<name>Stauts__c</name>")
    with pytest.raises(CompileError) as refused:
        flow_deploy(org=org, source=source, flow_api_name=SIGNATURE)
    assert "unknown_field:Stauts__c" in {d.code for d in refused.value.diagnostics}
    assert not FlowRun.objects.filter(org_id=org.org_id).exists()


def test_merging_away_the_watched_record_ends_the_wait_as_a_deletion_does(org, signature):
    """A merge soft-deletes its source without record_delete: the waits on the source learn it is gone all the same."""
    from nexusflow.records.transfer import record_merge

    record = _waiting(org)
    other = save_record(org, {"Name": "r-2", "Status__c": "Closed"}, object_name=OBJECT)
    record_merge(org=org, transfer_id="m-1", object_name=OBJECT, source_key=record.record_key,
                 target_key=other.record_key, actor="ops")
    run = _run(org, record)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_wait_producer_deleted")
    assert [s.state for s in _signals(org, record)] == [t.SIGNAL_CONSUMED]


def test_flows_waits_lists_a_record_wait_with_its_signals_under_the_wait_they_touched(org, payment):
    from nexusflow.flows.services import flow_waits_list

    record = _waiting(org)
    update_record(org, record, {"Name": "renamed"})  # wake version 2: not paid, expired
    update_record(org, record, {"Status__c": "Paid"})  # wake version 3: resolves
    [row] = flow_waits_list(org=org, state=t.DEP_SATISFIED)
    assert (row["producer_kind"], row["dependency_key"], row["condition"]["match"]) == (
        PRODUCER, f"{OBJECT}/{record.record_key}", {"Status__c": "Paid"})
    assert row["producer"]["kind"] == PRODUCER and row["signals_total"] == 2
    assert [(s["wake_version"], s["state"], s["dependency_id"], s["resolution_receipt_id"]) for s in row["signals"]] == [
        (2, t.SIGNAL_EXPIRED, None, None), (3, t.SIGNAL_CONSUMED, row["dependency_id"], None)]
