"""Provider deletes applied by the inbound chain run delete-triggered Flows as local deletes do (issue "The Flow
language real flows use", item 1, and its recount evidence).

A team keeps ``Member_Count__c``, its number of live contacts (a contact belongs to the team named by its last
name), by two flows on Contact: after a contact is created, and before one is deleted (``RecordBeforeDelete``).
Contacts arrive from the pulled change stream (``packs/salesforce_cdc``): a CREATE and a DELETE of the same
record in one source transaction (sequence 1 then 2 of one ``transactionKey``) must leave the count where it
was, and a redelivered batch deletes nothing twice.
"""
from __future__ import annotations

import pytest

from connectors.inbound.stream_poll import stream_poll_once
from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_deploy
from nexusflow.records.models import Record
from packs.salesforce_cdc import change_event
from runtime_outbox.models import ApplicationResult
from tests.conftest import drain
from tests.stream_support import stream_target

from .conftest import save_record
from .test_delete_triggers import count_flow

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "control"]),
              pytest.mark.usefixtures("short_lease")]


def _count_flow(*, operator: str, trigger: str, rtt: str) -> bytes:
    return count_flow(operator=operator, trigger=trigger, rtt=rtt, obj="Contact", team_field="Name",
                      team_of="$Record.lastname")


def _contact(remote_id: str):
    from connectors.models import RemoteLink

    link = RemoteLink.objects.filter(remote_id=remote_id).first()
    return None if link is None else Record.objects.get(object_name="Contact", record_key=link.source_record_key)


def test_a_provider_delete_in_the_source_transaction_of_its_create_leaves_the_count_exact(stream_org, team_view):
    org = stream_org.org
    flow_deploy(org=org, source=_count_flow(operator="Add", trigger="RecordAfterSave", rtt="Create"),
                flow_api_name="Count_Contact_Created")
    flow_deploy(org=org, source=_count_flow(operator="Subtract", trigger="RecordBeforeDelete", rtt="Delete"),
                flow_api_name="Count_Contact_Deleted")
    team = save_record(org, {"Name": "Acme", "Member_Count__c": "0"}, object_name="Team__c")
    stream_org.stream.publish([
        change_event(change_type="CREATE", record_ids=["003Z1"], transaction_key="tx-z", sequence=1,
                     fields={"LastName": "Acme"}),
        change_event(change_type="DELETE", record_ids=["003Z1"], transaction_key="tx-z", sequence=2),
        change_event(change_type="CREATE", record_ids=["003Z2"], transaction_key="tx-y", sequence=1,
                     fields={"LastName": "Acme"}),
        change_event(change_type="DELETE", record_ids=["003Z9"], transaction_key="tx-x", sequence=1),
    ])
    stream_poll_once(stream_target())
    drain()

    gone, kept = _contact("003Z1"), _contact("003Z2")
    assert (gone.is_deleted, kept.is_deleted) == (True, False)
    assert Record.objects.get(pk=team.pk).fields["Member_Count__c"] == "1"
    runs = FlowRun.objects.filter(org_id=org.org_id)
    assert sorted((r.plan.flow_api_name, r.record_key) for r in runs) == sorted([
        ("Count_Contact_Created", gone.record_key), ("Count_Contact_Created", kept.record_key),
        ("Count_Contact_Deleted", gone.record_key)])
    assert {r.state for r in runs} == {t.RUN_SUCCEEDED}
    results = sorted((r.outcome, r.result.get("reason") or ("deleted" if r.result.get("deleted") else "upsert"))
                     for r in ApplicationResult.objects.filter(org_id=org.org_id))
    assert results == [("applied", "deleted"), ("applied", "upsert"), ("applied", "upsert"),
                       ("noop", "record_not_linked")]

    # The provider redelivers the whole batch, and sends one more change for the deleted record: nothing is
    # applied twice, the deleted record stays deleted, no Flow runs again.
    stream_org.stream.set_faults(rewind=4, duplicate_delivery=1)
    stream_poll_once(stream_target())
    stream_org.stream.publish([change_event(change_type="UPDATE", record_ids=["003Z1"], transaction_key="tx-w",
                                            sequence=1, fields={"Email": "late@x.io"})])
    stream_poll_once(stream_target())
    drain()
    assert Record.objects.get(pk=gone.pk).is_deleted and "email" not in Record.objects.get(pk=gone.pk).fields
    assert Record.objects.get(pk=team.pk).fields["Member_Count__c"] == "1"
    assert FlowRun.objects.filter(org_id=org.org_id).count() == 3
    late = ApplicationResult.objects.filter(org_id=org.org_id).order_by("-pk").first()
    assert (late.outcome, late.result["reason"]) == ("noop", "record_deleted")
