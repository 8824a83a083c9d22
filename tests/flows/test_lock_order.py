"""Business locks in canonical resource order whatever the Flow metadata's order (seed 004 sections 13.1-13.2;
proof 22.3-02).

Two plans both react to a save of a member (``Member__c``) by writing the member and its team (``Team__c``):
``Parent_Then_Child`` updates the team first, ``Child_Then_Parent`` the member first. Each first attempt finds
the team outside its admitted lock plan (late discovery) and retries with both rows; the retries then run at
once on two real transactions. Locks follow the persistence comparator (object, then key), never element
order: the first transaction holds its first row while the second waits for that same row holding nothing, so
no wait cycle can form and both commit on their first overlapping attempt.
"""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun, FlowStepAttempt
from nexusflow.flows.services import flow_deploy, flow_run_drive
from nexusflow.records.models import Record
from tests.concurrency import race_behind_hold

from . import flowxml as fx
from .conftest import save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)


def _team_lookup(target: str | None) -> str:
    return ("<recordLookups><name>Get_Team</name><label>Get Team</label><locationX>1</locationX><locationY>1</locationY>"
            "<assignNullValuesIfNoRecordsFound>false</assignNullValuesIfNoRecordsFound>"
            f"{fx.conn(target)}<filterLogic>and</filterLogic><filters><field>Id</field><operator>EqualTo</operator>"
            "<value><elementReference>$Record.Team__c</elementReference></value></filters>"
            "<getFirstRecordOnly>true</getFirstRecordOnly><object>Team__c</object>"
            "<storeOutputAutomatically>true</storeOutputAutomatically></recordLookups>")


def _plan(order: str) -> bytes:
    """Both write ``Name`` of the member and of its team; ``order`` is the element order of the two writes."""
    mark_team = fx.assignment("Mark_Team", "Save_Team", [("Get_Team.Name", "Assign",
                                                          f"<stringValue>team by {order}</stringValue>")])
    save_team = fx.update("Save_Team", "Mark_Member" if order == "parent-first" else None, "Get_Team")
    mark_member = fx.assignment("Mark_Member", "Save_Member", [("$Record.Name", "Assign",
                                                                f"<stringValue>member by {order}</stringValue>")])
    save_member = fx.update("Save_Member", None if order == "parent-first" else "Get_Team", "$Record")
    first = "Get_Team" if order == "parent-first" else "Mark_Member"
    lookup = _team_lookup("Mark_Team")
    filters = ("<filters><field>Name</field><operator>EqualTo</operator><value><stringValue>go</stringValue></value>"
               "</filters>")
    return fx.flow(lookup, mark_team, save_team, mark_member, save_member,
                   start=fx.start(first, trigger="RecordAfterSave", obj="Member__c", rtt="Update", filters=filters))


def test_two_plans_writing_parent_and_child_in_opposite_orders_lock_them_in_one_order(org, team_view, holds,
                                                                                     monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    flow_deploy(org=org, source=_plan("parent-first"), flow_api_name="Parent_Then_Child")
    flow_deploy(org=org, source=_plan("child-first"), flow_api_name="Child_Then_Parent")
    team = save_record(org, {"Name": "team"}, object_name="Team__c")
    member = save_record(org, {"Name": "member", "Team__c": team.record_key}, object_name="Member__c")
    update_record(org, member, {"Name": "go"})
    runs = {r.plan.flow_api_name: r for r in FlowRun.objects.filter(org_id=org.org_id).select_related("plan")}
    assert set(runs) == {"Parent_Then_Child", "Child_Then_Parent"}
    for run in runs.values():  # first attempts: each discovers the team outside its plan and rolls back
        flow_run_drive(org=org, run_id=run.pk, worker_id="w0", max_steps=1)
        attempt = FlowStepAttempt.objects.get(step__run=run)
        assert (attempt.state, attempt.safe_error_code) == (t.ATTEMPT_ROLLED_BACK, "flow_late_lock_discovery")

    held, queued = race_behind_hold(
        holds, "flow.step.first_business_lock",
        lambda: flow_run_drive(org=org, run_id=runs["Parent_Then_Child"].pk, worker_id="w1"),
        lambda: flow_run_drive(org=org, run_id=runs["Child_Then_Parent"].pk, worker_id="w2"),
        table="records_record")
    assert (held.error, queued.error) == (None, None)
    assert (held.result, queued.result) == (t.RUN_SUCCEEDED, t.RUN_SUCCEEDED)
    for run in runs.values():
        attempts = list(FlowStepAttempt.objects.filter(step__run=run).order_by("attempt_number"))
        # One discovery, then one commit: no deadlock victim, no further retry.
        assert [(a.state, a.safe_error_code) for a in attempts] == [
            (t.ATTEMPT_ROLLED_BACK, "flow_late_lock_discovery"), (t.ATTEMPT_COMMITTED, "")]
        assert attempts[1].lock_plan == sorted(attempts[1].lock_plan) == [
            ["Member__c", member.record_key], ["Team__c", team.record_key]]
    names = {r.object_name: r.fields["Name"] for r in Record.objects.filter(
        record_key__in=[team.record_key, member.record_key])}
    # The held plan committed first, the queued one last: its values stand on both rows.
    assert names == {"Team__c": "team by child-first", "Member__c": "member by child-first"}
