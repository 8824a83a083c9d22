"""Relationship paths (issue "The Flow language real flows use", item 4): ``$Record.Account.name`` reads the
record a lookup field names (Contact.account_id references Account in the metadata view), inside the step.
"""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import ActivationRejected, FlowExecutionError
from nexusflow.flows.interpreter import is_relationship, relationship_field
from nexusflow.flows.models import FlowRun, FlowStepAttempt
from nexusflow.flows.services import flow_deploy
from nexusflow.records.metadata import current_view

from . import flowxml as fx
from .conftest import run_until_idle, save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)


def _copy_flow(value_ref: str, *, target: str = "$Record.firstname", trigger: str = "RecordBeforeSave",
               profile: str | None = None) -> bytes:
    element = fx.assignment("Copy", None, [(target, "Assign", f"<elementReference>{value_ref}</elementReference>")])
    if trigger == "RecordAfterSave":
        element = fx.assignment("Copy", "Save", [(target, "Assign",
                                                  f"<elementReference>{value_ref}</elementReference>")])
        element += ("<recordUpdates><name>Save</name><label>Save</label><locationX>1</locationX><locationY>1</locationY>"
                    "<inputReference>$Record</inputReference></recordUpdates>")
    filters = ("<filters><field>lifecyclestage</field><operator>EqualTo</operator>"
               "<value><stringValue>lead</stringValue></value></filters>")
    return fx.flow(element, start=fx.start("Copy", trigger=trigger, filters=filters), profile=profile)


def _contact(org, account_key: str | None, stage: str = "lead"):
    return save_record(org, {"email": "a@example.com", "lifecyclestage": stage, "account_id": account_key})


def test_a_before_save_flow_reads_a_field_of_the_related_record(org):
    flow_deploy(org=org, source=_copy_flow("$Record.Account.name"), flow_api_name="Copy_Account_Name")
    acme = save_record(org, {"name": "Acme", "domain": "acme.example"}, object_name="Account")
    globex = save_record(org, {"name": "Globex"}, object_name="Account")
    assert _contact(org, acme.record_key).fields["firstname"] == "Acme"
    assert _contact(org, None).fields["firstname"] is None  # no account: the path is null
    assert _contact(org, "001999999999999999").fields["firstname"] is None  # names no record
    moved = _contact(org, acme.record_key)
    update_record(org, moved, {"account_id": globex.record_key})
    from nexusflow.records.models import Record

    assert Record.objects.get(org_id=org.org_id, record_key=moved.record_key).fields["firstname"] == "Globex"
    assert _contact(org, acme.record_key, stage="customer").fields.get("firstname") is None  # entry filter unmet


def test_a_path_through_a_field_value_or_into_a_related_record_is_refused_at_activation(org):
    with pytest.raises(ActivationRejected) as caught:
        flow_deploy(org=org, source=_copy_flow("$Record.email.Domain"), flow_api_name="Bad_Path")
    assert [(d.code, d.element) for d in caught.value.diagnostics] == [("engine_unsupported:reference", "Copy")]
    with pytest.raises(ActivationRejected) as caught:
        flow_deploy(org=org, source=_copy_flow("$Record.email", target="$Record.Account.name"),
                    flow_api_name="Bad_Target")
    assert [(d.code, d.element) for d in caught.value.diagnostics] == [("engine_unsupported:reference", "Copy")]


def test_a_relationship_the_metadata_does_not_declare_fails_the_step_definitely(org):
    flow_deploy(org=org, source=_copy_flow("$Record.Owner__r.name", trigger="RecordAfterSave",
                                           profile="DurableOrchestration"), flow_api_name="Unknown_Relationship")
    contact = _contact(org, None)
    run_until_idle()
    run = FlowRun.objects.get(org_id=org.org_id, record_key=contact.record_key)
    assert run.state == t.RUN_TERMINAL_FAILED
    attempt = FlowStepAttempt.objects.get(org_id=org.org_id, step__run=run)
    assert attempt.safe_error_code == "flow_relationship_unknown"


@pytest.mark.parametrize("part,relationship", [("Broker__r", True), ("Account", True), ("Owner", True),
                                               ("Broker__c", False), ("email", False), ("Id", False),
                                               ("Name__c", False)])
def test_which_path_segments_are_relationships(part, relationship):
    assert is_relationship(part) is relationship


def test_a_relationship_names_its_lookup_field_and_object():
    view = current_view()
    assert relationship_field(view, "Contact", "Account") == ("account_id", "Account")
    with pytest.raises(FlowExecutionError) as caught:
        relationship_field(view, "Contact", "Owner__r")
    assert caught.value.code == "flow_relationship_unknown"
    with pytest.raises(FlowExecutionError):
        relationship_field(view, "Contact", "Email")  # a field that is not a lookup is no relationship
