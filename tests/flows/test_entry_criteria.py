"""Record-triggered entry criteria as Salesforce defines them: ``IsChanged`` filters, and "only when a record is
updated to meet the condition requirements" over the truth value of the whole expression."""
from __future__ import annotations

import pytest

from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_deploy

from . import flowxml as fx
from .conftest import save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)


def _filter(field: str, operator: str, value: str) -> str:
    return f"<filters><field>{field}</field><operator>{operator}</operator><value>{value}</value></filters>"


def _flow(filters: str, *, trigger: str = "RecordAfterSave", requires_change: bool = False) -> bytes:
    change = "<doesRequireRecordChangedToMeetCriteria>true</doesRequireRecordChangedToMeetCriteria>" \
        if requires_change else ""
    return fx.flow(fx.assignment("Mark", None, [("seen", "Assign", "<booleanValue>true</booleanValue>")]),
                   fx.variable("seen", data_type="Boolean"),
                   start=fx.start("Mark", trigger=trigger, filters=change + filters))


def _runs(org, name: str) -> int:
    return FlowRun.objects.filter(org_id=org.org_id, plan__flow_api_name=name).count()


def test_is_changed_entry_criteria_admit_a_run_only_for_a_save_that_changed_the_field(org):
    """``(email IsChanged OR firstname IsChanged) AND lastname IsNull false``, created or updated: a create is
    no change; an update runs when one of the two fields took another value and the third is set."""
    changed = "<booleanValue>true</booleanValue>"
    filters = ("<filterLogic>(1 OR 2) AND 3</filterLogic>" + _filter("email", "IsChanged", changed)
               + _filter("firstname", "IsChanged", changed)
               + _filter("lastname", "IsNull", "<booleanValue>false</booleanValue>"))
    flow_deploy(org=org, source=_flow(filters), flow_api_name="On_Change")
    record = save_record(org, {"email": "a@example.test", "firstname": "Ada", "lastname": "L"})
    assert _runs(org, "On_Change") == 0  # a create changes nothing
    expected = []
    for changes, runs in (({"email": "b@example.test"}, True), ({"lifecyclestage": "555"}, False),
                          ({"email": "b@example.test"}, False),  # the same value again: no change
                          ({"firstname": "Grace"}, True), ({"lastname": ""}, False),
                          ({"firstname": "Ada"}, False),  # changed, but lastname is empty now
                          ({"lastname": "L", "email": ""}, True)):  # email cleared: a change too
        record = update_record(org, record, changes)
        expected.append(runs)
        assert _runs(org, "On_Change") == sum(expected), changes


def test_is_changed_false_admits_the_saves_that_left_the_field_alone(org):
    filters = _filter("email", "IsChanged", "<booleanValue>false</booleanValue>")
    flow_deploy(org=org, source=_flow(filters), flow_api_name="Unchanged")
    record = save_record(org, {"email": "a@example.test"})
    assert _runs(org, "Unchanged") == 1  # created: not a change
    update_record(org, record, {"lifecyclestage": "lead"})
    update_record(org, record, {"email": "c@example.test"})
    assert _runs(org, "Unchanged") == 2


def test_the_record_must_be_updated_to_meet_the_whole_expression(org):
    """Seed conformance sequence with ``firstname = go OR lastname = go`` and "only when updated to meet":
    1 false->true runs; 2 false->true while 1 stays true does not (the expression was already true); a change
    of another field does not; both true->false does not; 2 false->true afterwards runs."""
    filters = ("<filterLogic>or</filterLogic>" + _filter("firstname", "EqualTo", "<stringValue>go</stringValue>")
               + _filter("lastname", "EqualTo", "<stringValue>go</stringValue>"))
    flow_deploy(org=org, source=_flow(filters, requires_change=True), flow_api_name="Met")
    record = save_record(org, {"firstname": "no", "lastname": "no"})
    assert _runs(org, "Met") == 0
    expected = 0
    for changes, runs in (({"firstname": "go"}, 1), ({"lastname": "go"}, 0), ({"lifecyclestage": "customer"}, 0),
                          ({"firstname": "no", "lastname": "no"}, 0), ({"lastname": "go"}, 1)):
        record = update_record(org, record, changes)
        expected += runs
        assert _runs(org, "Met") == expected, changes


def test_before_save_entry_criteria_see_the_values_the_save_replaces(org):
    """Before save, ``IsChanged`` and "only when updated to meet" compare the values being saved with the
    stored ones: ``firstname`` is stamped only by a save that changes ``email``, and a create is no change."""
    from nexusflow.records.models import Record

    filters = _filter("email", "IsChanged", "<booleanValue>true</booleanValue>")
    source = fx.flow(fx.assignment("Stamp", None, [("$Record.firstname", "Assign",
                                                    "<elementReference>$Record.email</elementReference>")]),
                     start=fx.start("Stamp", trigger="RecordBeforeSave", filters=filters))
    flow_deploy(org=org, source=source, flow_api_name="Before_Change")

    def firstname(record) -> str | None:
        return Record.objects.get(pk=record.pk).fields.get("firstname")

    record = save_record(org, {"email": "a@example.test", "firstname": "kept"})
    assert firstname(record) == "kept"  # created: no change
    for changes, stamped in (({"lifecyclestage": "lead"}, "kept"), ({"email": "b@example.test"}, "b@example.test"),
                             ({"firstname": "hand"}, "hand"), ({"email": "b@example.test"}, "hand"),
                             ({"email": "c@example.test"}, "c@example.test")):
        record = update_record(org, record, changes)
        assert firstname(record) == stamped, changes
    assert not FlowRun.objects.exists()  # before save: inside the save, no run


def test_before_save_requires_change_runs_only_when_the_save_makes_the_expression_true(org):
    filters = _filter("lifecyclestage", "EqualTo", "<stringValue>customer</stringValue>")
    source = fx.flow(fx.assignment("Stamp", None, [("$Record.firstname", "Add", "<stringValue>!</stringValue>")]),
                     start=fx.start("Stamp", trigger="RecordBeforeSave",
                                    filters="<doesRequireRecordChangedToMeetCriteria>true"
                                            "</doesRequireRecordChangedToMeetCriteria>" + filters))
    flow_deploy(org=org, source=source, flow_api_name="Before_Met")
    from nexusflow.records.models import Record

    record = save_record(org, {"firstname": "a", "lifecyclestage": "lead"})
    for changes, expected in (({"lifecyclestage": "customer"}, "a!"), ({"email": "x@example.test"}, "a!"),
                              ({"lifecyclestage": "lead"}, "a!"), ({"lifecyclestage": "customer"}, "a!!")):
        record = update_record(org, record, changes)
        assert Record.objects.get(pk=record.pk).fields["firstname"] == expected, changes
