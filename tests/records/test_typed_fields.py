"""Typed record fields (issue "The Flow language real flows use", item 4): declared in the object metadata and
validated on every write path (REST, a Flow's writes, any service write: the inbound application writes through
the same ``record_create`` / ``record_update``), so a value that is not in its type's form is refused and
nothing is written."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun, FlowStepAttempt
from nexusflow.flows.services import flow_deploy
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import InvalidFieldValue, current_view, load_view
from nexusflow.records.models import Record
from nexusflow.records.services import record_create
from tests.conftest import ORG
from tests.flows import flowxml as fx
from tests.flows.conftest import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

INVOICE = {"object": "Invoice__c", "label": "Invoice", "key_prefix": "a2I", "fields": [
    {"name": "Name", "type": "text", "max_length": 80},
    {"name": "Amount__c", "type": "currency", "max_length": 20},
    {"name": "Lines__c", "type": "number", "max_length": 20},
    {"name": "Discount__c", "type": "percent", "max_length": 20},
    {"name": "Paid__c", "type": "boolean", "max_length": 5},
    {"name": "Due__c", "type": "date", "max_length": 10},
    {"name": "Sent__c", "type": "datetime", "max_length": 40},
    {"name": "Stage__c", "type": "picklist", "max_length": 40, "values": ["Draft", "Sent", "Paid"]},
    {"name": "Billing_Email__c", "type": "email", "max_length": 120},
    {"name": "Phone__c", "type": "phone", "max_length": 40},
    {"name": "Notes__c", "type": "textarea", "max_length": 2000},
]}


def _write_view(directory: Path, *docs: dict) -> Path:
    objects = directory / "objects"
    objects.mkdir(parents=True)
    for path in (Path(settings.BASE_DIR) / "metadata" / "objects").glob("*.object.json"):
        shutil.copy(path, objects / path.name)
    for doc in docs:
        (objects / f"{doc['object']}.object.json").write_text(json.dumps(doc), encoding="utf-8")
    return directory


@pytest.fixture
def invoice_view(settings, tmp_path):
    directory = _write_view(tmp_path / "metadata", INVOICE)
    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = directory
    current_view.cache_clear()
    yield directory
    current_view.cache_clear()


@pytest.mark.parametrize("field,value,ok", [
    ("Amount__c", "1250.50", True), ("Amount__c", "-3", True), ("Amount__c", ".5", True),
    ("Amount__c", "1,250.50", False), ("Amount__c", "1e3", False), ("Amount__c", "ten", False),
    ("Lines__c", "12", True), ("Lines__c", "12.", True), ("Lines__c", "--1", False),
    ("Discount__c", "15.5", True), ("Discount__c", "15%", False),
    ("Paid__c", "true", True), ("Paid__c", "false", True), ("Paid__c", "True", False), ("Paid__c", "1", False),
    ("Due__c", "2026-02-28", True), ("Due__c", "2026-02-30", False), ("Due__c", "28/02/2026", False),
    ("Due__c", "2026-2-28", False),
    ("Sent__c", "2026-03-01T06:30:00Z", True), ("Sent__c", "2026-03-01T06:30:00+02:00", True),
    ("Sent__c", "2026-03-01T06:30:00", False), ("Sent__c", "2026-03-01", False),
    ("Stage__c", "Sent", True), ("Stage__c", "sent", False), ("Stage__c", "Void", False),
    ("Billing_Email__c", "ap@acme.example", True), ("Billing_Email__c", "ap@acme", False),
    ("Billing_Email__c", "ap acme@x.example", False),
    ("Phone__c", "+1 (555) 010-2030", True), ("Phone__c", "call me", False),
    ("Notes__c", "anything at all: 1e3, true", True),
    ("Amount__c", "", True), ("Stage__c", None, True),  # no value is no value for every type
])
def test_each_type_accepts_only_its_form(invoice_view, field, value, ok):
    org = OrgScope(ORG)
    if ok:
        with transaction.atomic():
            record = record_create(org=org, object_name="Invoice__c", values={"Name": "inv", field: value})
        assert Record.objects.get(pk=record.pk).fields[field] == value
        return
    with pytest.raises(InvalidFieldValue) as caught:
        with transaction.atomic():
            record_create(org=org, object_name="Invoice__c", values={"Name": "inv", field: value})
    assert caught.value.code == "invalid_field_value" and field in str(caught.value)
    assert not Record.objects.filter(object_name="Invoice__c").exists()


@pytest.mark.parametrize("change,message", [
    ({"type": "money"}, "unknown field type 'money'"),
    ({"type": "picklist"}, "a picklist field lists its values"),
    ({"values": ["a"]}, "a picklist field lists its values"),
])
def test_metadata_with_an_unknown_type_or_a_misdeclared_picklist_does_not_load(tmp_path, change, message):
    doc = {**INVOICE, "fields": [{"name": "Odd__c", "type": "text", "max_length": 10, **change}]}
    with pytest.raises(ValueError, match=message):
        load_view(_write_view(tmp_path / "metadata", doc))


def test_the_rest_api_refuses_a_value_not_in_its_type_with_400(invoice_view, client):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name=f"org:{ORG}"))
    client.force_login(user)
    refused = client.post("/api/v2/records/Invoice__c/", content_type="application/json",
                          data=json.dumps({"fields": {"Name": "inv", "Due__c": "tomorrow"}}))
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"] == "invalid_field_value"
    assert not Record.objects.filter(object_name="Invoice__c").exists()
    created = client.post("/api/v2/records/Invoice__c/", content_type="application/json",
                          data=json.dumps({"fields": {"Name": "inv", "Due__c": "2026-12-31"}}))
    assert created.status_code == 201, created.content


def test_a_flow_write_not_in_the_field_type_fails_its_step_and_writes_nothing(invoice_view, monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")
    org = OrgScope(ORG)
    stamp = fx.assignment("Stamp", "Save", [("$Record.Paid__c", "Assign", "<stringValue>yes</stringValue>")])
    save = ("<recordUpdates><name>Save</name><label>Save</label><locationX>1</locationX><locationY>1</locationY>"
            "<inputReference>$Record</inputReference></recordUpdates>")
    flow_deploy(org=org, source=fx.flow(stamp, save, start=fx.start("Stamp", trigger="RecordAfterSave",
                                                                       obj="Invoice__c", rtt="Create")),
                flow_api_name="Mark_Paid")
    with transaction.atomic():
        record = record_create(org=org, object_name="Invoice__c", values={"Name": "inv", "Paid__c": "false"})
    run_until_idle()
    run = FlowRun.objects.get(record_key=record.record_key)
    assert run.state == t.RUN_TERMINAL_FAILED
    assert FlowStepAttempt.objects.filter(step__run=run).values_list("safe_error_code", flat=True).last() == (
        "flow_record_write_refused")
    assert Record.objects.get(pk=record.pk).fields["Paid__c"] == "false" and Record.objects.get(pk=record.pk).version == 1
