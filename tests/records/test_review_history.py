"""Record field history written by Flow steps (docs/operations.md "Record field history"; seed 004 section 13.1).

A Flow step reserves the history sequences of the records it writes before it locks its Flow root. The
deletion it applies must then use that reservation (one sequence per write, as an ordinary deletion), and a
tracked field changed by a before-save flow during the step's write must have been reserved as well.
"""
from __future__ import annotations

import pytest
from django.db import transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_deploy, flow_run_drive, flow_run_start
from nexusflow.records.services import record_create
from tests.flows import flowxml as fx
from tests.records.test_field_history import ORG_SCOPE, _history

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _team_flow(then: str) -> bytes:
    """Autolaunched: read the team named by ``teamId`` and hand it to ``then`` (the team is a late discovery)."""
    lookup = ("<recordLookups><name>Get_Team</name><label>Get Team</label><locationX>1</locationX><locationY>1</locationY>"
              "<assignNullValuesIfNoRecordsFound>false</assignNullValuesIfNoRecordsFound>"
              f"{fx.conn('Act')}<filterLogic>and</filterLogic><filters><field>Id</field><operator>EqualTo</operator>"
              "<value><elementReference>teamId</elementReference></value></filters>"
              "<getFirstRecordOnly>true</getFirstRecordOnly><object>Team__c</object>"
              "<storeOutputAutomatically>true</storeOutputAutomatically></recordLookups>")
    return fx.flow(lookup, then, fx.variable("teamId", is_input=True), start=fx.start("Get_Team"))


def _run(flow_api_name: str, source: bytes, team) -> FlowRun:
    flow_deploy(org=ORG_SCOPE, source=source, flow_api_name=flow_api_name)
    run = flow_run_start(org=ORG_SCOPE, flow_api_name=flow_api_name, inputs={"teamId": team.record_key},
                         request_id=flow_api_name).run
    flow_run_drive(org=ORG_SCOPE, run_id=run.pk, worker_id="w0")
    run.refresh_from_db()
    return run


def test_a_flow_deletion_takes_the_next_history_sequence_once(history_view, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    with transaction.atomic():
        team = record_create(org=ORG_SCOPE, object_name="Team__c", values={"Name": "red"})
    delete = ("<recordDeletes><name>Act</name><label>Act</label><locationX>1</locationX><locationY>2</locationY>"
              "<inputReference>Get_Team</inputReference></recordDeletes>")
    run = _run("Delete_Team", _team_flow(delete), team)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    assert _history(team) == [(1, "Name", "create", None, "red", 1), (2, "*", "delete", None, None, 2)]


def test_a_flow_write_whose_before_save_changes_a_tracked_field_records_it(history_view, monkeypatch):
    """The step writes the untracked Notes__c; the before-save flow copies it into the tracked Region__c."""
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    copy = fx.assignment("Copy", None, [("$Record.Region__c", "Assign",
                                         "<elementReference>$Record.Notes__c</elementReference>")])
    flow_deploy(org=ORG_SCOPE, flow_api_name="Team_Region",
                source=fx.flow(copy, start=fx.start("Copy", trigger="RecordBeforeSave", obj="Team__c")))
    with transaction.atomic():
        team = record_create(org=ORG_SCOPE, object_name="Team__c", values={"Name": "red", "Notes__c": "n"})
    note = fx.assignment("Act", "Save", [("Get_Team.Notes__c", "Assign", "<stringValue>EU</stringValue>")])
    run = _run("Note_Team", _team_flow(note + fx.update("Save", None, "Get_Team")), team)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    assert _history(team) == [(1, "Name", "create", None, "red", 1), (1, "Region__c", "create", None, "n", 1),
                              (2, "Region__c", "update", "n", "EU", 2)]
