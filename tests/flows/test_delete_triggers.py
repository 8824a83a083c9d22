"""Delete-triggered flows and Delete Records (issue "The Flow language real flows use", items 1 and 4).

A team keeps ``Member_Count__c``, its number of live members, by two flows on
``Member__c``: after a member is created, and before one is deleted
(``RecordBeforeDelete``), each reads the member's team, adds or subtracts one
in a Number variable and writes it back. The count must reach 0 when the last
member is deleted, also with two real flow workers running at once.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import CompileError
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_compile_check, flow_deploy
from nexusflow.records.models import Record
from nexusflow.records.services import record_delete_by_key
from tests.conftest import subprocess_env

from . import flowxml as fx
from .conftest import run_until_idle, save_record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("short_lease")]

def count_flow(*, operator: str, trigger: str, rtt: str, obj: str = "Member__c", team_field: str = "Id",
               team_of: str = "$Record.Team__c") -> bytes:
    """A flow on ``obj`` that adds (``operator`` Add) or subtracts one to the ``Member_Count__c`` of the team
    whose ``team_field`` equals ``team_of``."""
    lookup = ("<recordLookups><name>Get_Team</name><label>Get Team</label><locationX>1</locationX>"
              "<locationY>1</locationY><assignNullValuesIfNoRecordsFound>false</assignNullValuesIfNoRecordsFound>"
              f"{fx.conn('Count')}<filterLogic>and</filterLogic><filters><field>{team_field}</field>"
              f"<operator>EqualTo</operator><value><elementReference>{team_of}</elementReference></value></filters>"
              "<getFirstRecordOnly>true</getFirstRecordOnly><object>Team__c</object>"
              "<storeOutputAutomatically>true</storeOutputAutomatically></recordLookups>")
    count = fx.assignment("Count", "Save", [
        ("members", "Assign", "<elementReference>Get_Team.Member_Count__c</elementReference>"),
        ("members", operator, "<numberValue>1</numberValue>"),
        ("Get_Team.Member_Count__c", "Assign", "<elementReference>members</elementReference>")])
    save = fx.update("Save", None, "Get_Team")
    variable = ("<variables><name>members</name><dataType>Number</dataType><isCollection>false</isCollection>"
                "<isInput>false</isInput><isOutput>false</isOutput><scale>0</scale></variables>")
    return fx.flow(lookup, count, save, variable, start=fx.start("Get_Team", trigger=trigger, obj=obj, rtt=rtt))


def _deploy(org):
    flow_deploy(org=org, source=count_flow(operator="Add", trigger="RecordAfterSave", rtt="Create"),
                flow_api_name="Count_Member_Created")
    flow_deploy(org=org, source=count_flow(operator="Subtract", trigger="RecordBeforeDelete", rtt="Delete"),
                flow_api_name="Count_Member_Deleted")


def _count(org, team) -> str:
    return Record.objects.get(org_id=org.org_id, object_name="Team__c", record_key=team.record_key).fields[
        "Member_Count__c"]


def _live_members(org, team) -> int:
    return sum(1 for fields in Record.objects.filter(org_id=org.org_id, object_name="Member__c", is_deleted=False)
               .values_list("fields", flat=True) if fields.get("Team__c") == team.record_key)


def test_a_parent_count_kept_on_create_and_delete_reaches_zero(org, team_view):
    _deploy(org)
    red = save_record(org, {"Name": "red", "Member_Count__c": "0"}, object_name="Team__c")
    blue = save_record(org, {"Name": "blue", "Member_Count__c": "0"}, object_name="Team__c")
    members = [save_record(org, {"Name": f"m{i}", "Team__c": team.record_key}, object_name="Member__c")
               for i, team in enumerate([red, red, red, blue])]
    run_until_idle()
    assert (_count(org, red), _count(org, blue)) == ("3", "1")
    for member in members[:3]:
        record_delete_by_key(org=org, object_name="Member__c", record_key=member.record_key)
        run_until_idle()
        assert _count(org, red) == str(_live_members(org, red))
    assert (_count(org, red), _count(org, blue)) == ("0", "1")
    deleted = FlowRun.objects.filter(org_id=org.org_id, plan__flow_api_name="Count_Member_Deleted")
    assert sorted(r.record_key for r in deleted) == sorted(m.record_key for m in members[:3])
    assert {r.state for r in deleted} == {t.RUN_SUCCEEDED}
    # The delete-triggered run saw the record as it was deleted (its trigger snapshot), not a later state.
    assert {r.record_version for r in deleted} == {1}


def test_the_count_is_exact_with_two_real_workers_applying_creates_and_deletes_at_once(org, team_view):
    _deploy(org)
    team = save_record(org, {"Name": "green", "Member_Count__c": "0"}, object_name="Team__c")
    members = [save_record(org, {"Name": f"m{i}", "Team__c": team.record_key}, object_name="Member__c")
               for i in range(6)]
    for member in members[:4]:
        record_delete_by_key(org=org, object_name="Member__c", record_key=member.record_key)
    env = subprocess_env(NEXUS_METADATA_DIR=str(team_view))
    args = [sys.executable, "manage.py", "run_workers", "--role", "flow", "--until-idle", "--idle-rounds", "3",
            "--idle-sleep", "0.05"]
    workers = [subprocess.Popen(args, cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(2)]
    for worker in workers:
        _out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err[-2000:]
    assert run_until_idle() == 0
    assert _count(org, team) == "2" == str(_live_members(org, team))
    assert FlowRun.objects.filter(org_id=org.org_id).count() == 10
    assert set(FlowRun.objects.values_list("state", flat=True)) == {t.RUN_SUCCEEDED}


def test_delete_records_deletes_what_a_reference_holds_and_what_a_filter_selects(org, team_view):
    """A Delete Records of a Get Records result (by reference) and one by object and filter; each deletion
    goes through the record deletion lifecycle, so the delete-triggered count flow runs for each."""
    _deploy(org)
    team = save_record(org, {"Name": "gold", "Member_Count__c": "0"}, object_name="Team__c")
    keep = save_record(org, {"Name": "keep", "Team__c": team.record_key}, object_name="Member__c")
    drop = [save_record(org, {"Name": f"drop-{i}", "Team__c": team.record_key}, object_name="Member__c")
            for i in range(2)]
    run_until_idle()
    assert _count(org, team) == "3"
    get = ("<recordLookups><name>Get_Drops</name><label>Get Drops</label><locationX>1</locationX><locationY>1</locationY>"
           "<assignNullValuesIfNoRecordsFound>false</assignNullValuesIfNoRecordsFound>"
           f"{fx.conn('Delete_Them')}<filterLogic>and</filterLogic><filters><field>Name</field>"
           "<operator>StartsWith</operator><value><stringValue>drop-</stringValue></value></filters>"
           "<getFirstRecordOnly>false</getFirstRecordOnly><object>Member__c</object>"
           "<storeOutputAutomatically>true</storeOutputAutomatically></recordLookups>")
    delete = ("<recordDeletes><name>Delete_Them</name><label>Delete Them</label><locationX>1</locationX>"
              "<locationY>2</locationY><inputReference>Get_Drops</inputReference></recordDeletes>")
    flow_deploy(org=org, source=fx.flow(get, delete, start=fx.start("Get_Drops"), profile="DurableOrchestration"),
                flow_api_name="Drop_Members")
    from nexusflow.flows.services import flow_run_start

    run = flow_run_start(org=org, flow_api_name="Drop_Members", inputs={}, request_id="drop").run
    run_until_idle()
    assert FlowRun.objects.get(pk=run.pk).state == t.RUN_SUCCEEDED
    live = set(Record.objects.filter(org_id=org.org_id, object_name="Member__c", is_deleted=False)
               .values_list("record_key", flat=True))
    assert live == {keep.record_key} and not live & {d.record_key for d in drop}
    assert _count(org, team) == "1"
    # By filter: every member of the team whose Name is keep.
    by_filter = ("<recordDeletes><name>Delete_Keep</name><label>Delete Keep</label><locationX>1</locationX>"
                 "<locationY>2</locationY><filterLogic>and</filterLogic><filters><field>Name</field>"
                 "<operator>EqualTo</operator><value><stringValue>keep</stringValue></value></filters>"
                 "<object>Member__c</object></recordDeletes>")
    flow_deploy(org=org, source=fx.flow(by_filter, start=fx.start("Delete_Keep"), profile="DurableOrchestration"),
                flow_api_name="Drop_Keep")
    flow_run_start(org=org, flow_api_name="Drop_Keep", inputs={}, request_id="keep")
    run_until_idle()
    assert _count(org, team) == "0" and _live_members(org, team) == 0


def test_a_delete_trigger_is_compiled_only_as_before_delete_with_no_prior_record(org, team_view):
    bad = count_flow(operator="Add", trigger="RecordAfterSave", rtt="Delete")
    with pytest.raises(CompileError) as caught:
        flow_compile_check(source=bad, flow_api_name="Bad", org=org)
    assert "unsupported_record_trigger_type:Delete" in [d.code for d in caught.value.diagnostics]
    prior = count_flow(operator="Add", trigger="RecordBeforeDelete", rtt="Delete").replace(
        b"$Record.Team__c", b"$Record__Prior.Team__c")
    with pytest.raises(CompileError) as caught:
        flow_compile_check(source=prior, flow_api_name="Bad", org=org)
    assert "unresolved_reference:$Record__Prior" in [d.code for d in caught.value.diagnostics]
