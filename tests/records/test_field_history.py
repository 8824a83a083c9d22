"""Record field history and its history-sequence reservation (issue "The Flow language real flows use", item 4;
seed 004 section 13.1; proof 22.3-03).

``Team__c`` tracks the history of ``Name`` (``track_history``): every write of a team that changes it appends one
row per changed tracked field under the team's next history sequence. The sequence row is reserved after the
team's business row and before any Flow lifecycle row, so an ordinary write and a Flow step writing the same
team queue on the business row and never hold the history sequence while waiting for it.
"""
from __future__ import annotations

import json

import pytest
from django.db import transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowStepAttempt
from nexusflow.flows.services import flow_deploy, flow_run_drive, flow_run_start
from nexusflow.kernel.errors import LockOrderViolation
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import RecordFieldHistory
from nexusflow.records.services import record_create, record_delete, record_lock, record_update
from nexusflow.records.store import HistoryStore
from tests.concurrency import race_behind_hold
from tests.conftest import ORG, run_manage, subprocess_env
from tests.flows import flowxml as fx

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

ORG_SCOPE = OrgScope(ORG)


def _history(record) -> list[tuple]:
    return list(RecordFieldHistory.objects.filter(record_key=record.record_key).order_by("sequence", "field")
                .values_list("sequence", "field", "change", "old_value", "new_value", "record_version"))


def _update(record, changes):
    with transaction.atomic():
        return record_update(org=ORG_SCOPE, record=record_lock(org=ORG_SCOPE, object_name="Team__c",
                                                               record_key=record.record_key), changes=changes)


def test_each_write_appends_its_tracked_changes_under_the_next_sequence(history_view):
    with transaction.atomic():
        team = record_create(org=ORG_SCOPE, object_name="Team__c",
                             values={"Name": "red", "Region__c": "", "Notes__c": "n"})
    _update(team, {"Notes__c": "untracked only"})
    _update(team, {"Name": "red"})  # no change: no history
    _update(team, {"Name": "blue", "Region__c": "EU", "Notes__c": "x"})
    with transaction.atomic():
        record_delete(org=ORG_SCOPE, record=record_lock(org=ORG_SCOPE, object_name="Team__c",
                                                        record_key=team.record_key))
    assert _history(team) == [
        (1, "Name", "create", None, "red", 1),
        (2, "Name", "update", "red", "blue", 3), (2, "Region__c", "update", "", "EU", 3),
        (3, "*", "delete", None, None, 4),
    ]
    shown = json.loads(run_manage(["records", "show", "--org", ORG, "Team__c", team.record_key, "--json"],
                                  subprocess_env(NEXUS_METADATA_DIR=str(history_view))).stdout)
    assert [(h["sequence"], h["field"]) for h in shown["history"]] == [(3, "*"), (2, "Name"), (2, "Region__c"),
                                                                      (1, "Name")]


def test_an_object_without_track_history_writes_no_history(history_view):
    with transaction.atomic():
        record = record_create(org=ORG_SCOPE, object_name="Contact", values={"email": "a@example.com"})
    assert not RecordFieldHistory.objects.exists() and record.version == 1


def test_a_business_lock_after_a_history_reservation_is_a_lock_order_violation(history_view):
    with transaction.atomic():
        first = record_create(org=ORG_SCOPE, object_name="Team__c", values={"Name": "a"})
        second = record_create(org=ORG_SCOPE, object_name="Team__c", values={"Name": "b"})
    with pytest.raises(LockOrderViolation):
        with transaction.atomic():
            record_lock(org=ORG_SCOPE, object_name="Team__c", record_key=first.record_key)
            HistoryStore.reserve(ORG, "Team__c", first.record_key)
            record_lock(org=ORG_SCOPE, object_name="Team__c", record_key=second.record_key)


def _rename_flow() -> bytes:
    """Autolaunched: read the team named by ``teamId`` and rename it (the team is a late discovery)."""
    lookup = ("<recordLookups><name>Get_Team</name><label>Get Team</label><locationX>1</locationX><locationY>1</locationY>"
              "<assignNullValuesIfNoRecordsFound>false</assignNullValuesIfNoRecordsFound>"
              f"{fx.conn('Rename')}<filterLogic>and</filterLogic><filters><field>Id</field><operator>EqualTo</operator>"
              "<value><elementReference>teamId</elementReference></value></filters>"
              "<getFirstRecordOnly>true</getFirstRecordOnly><object>Team__c</object>"
              "<storeOutputAutomatically>true</storeOutputAutomatically></recordLookups>")
    rename = fx.assignment("Rename", "Save", [("Get_Team.Name", "Assign", "<stringValue>by flow</stringValue>")])
    return fx.flow(lookup, rename, fx.update("Save", None, "Get_Team"), fx.variable("teamId", is_input=True),
                   start=fx.start("Get_Team"))


def test_a_record_write_and_a_flow_step_contend_on_the_business_row_not_the_history_sequence(
        history_view, holds, monkeypatch):
    """Proof 22.3-03: an ordinary write holds the team's row and its history sequence (held at
    ``records.history.reserved``); a Flow step writing the same team queues on the business row holding no
    history lock; released, the write commits sequence 2 and the step reserves sequence 3 before its Flow
    root, committing on its first attempt after its discovery."""
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    with transaction.atomic():
        team = record_create(org=ORG_SCOPE, object_name="Team__c", values={"Name": "red"})
    flow_deploy(org=ORG_SCOPE, source=_rename_flow(), flow_api_name="Rename_Team")
    run = flow_run_start(org=ORG_SCOPE, flow_api_name="Rename_Team", inputs={"teamId": team.record_key},
                         request_id="rename").run
    flow_run_drive(org=ORG_SCOPE, run_id=run.pk, worker_id="w0", max_steps=1)  # the discovery attempt

    held, queued = race_behind_hold(
        holds, "records.history.reserved", lambda: _update(team, {"Name": "by hand"}),
        lambda: flow_run_drive(org=ORG_SCOPE, run_id=run.pk, worker_id="w1"), table="records_record")
    assert (held.error, queued.error) == (None, None)
    assert queued.result == t.RUN_SUCCEEDED
    assert _history(team) == [(1, "Name", "create", None, "red", 1), (2, "Name", "update", "red", "by hand", 2),
                              (3, "Name", "update", "by hand", "by flow", 3)]
    attempts = FlowStepAttempt.objects.filter(step__run=run).order_by("attempt_number")
    assert [(a.state, a.safe_error_code) for a in attempts] == [
        (t.ATTEMPT_ROLLED_BACK, "flow_late_lock_discovery"), (t.ATTEMPT_COMMITTED, "")]
