"""Waiting for a record: a Wait element's record event, producer ``record.condition`` (seed 004 sections 14.1-14.2).

``fixtures/waits/Renewal_Await_Payment.flow-meta.xml`` is written in Salesforce's
metadata format: after-save on ``Renewal__c`` created open, a Wait element
with a record event (``Renewal__ChangeEvent``: the triggering renewal's
``Status__c`` becomes ``Paid``) beside an AlarmEvent three days after the
interview starts, and a fault path. ``Renewal_Await_Signature`` waits for
``Signed`` alone, with neither a time event nor a fault path. Time moves with
the database clock, never a sleep.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowDependency, FlowRun, FlowWakeSignal
from nexusflow.flows.services import flow_deploy
from nexusflow.records.metadata import current_view
from nexusflow.records.models import Record

from .conftest import run_until_idle, save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)

WAITS = Path(__file__).with_name("fixtures") / "waits"
OBJECT = "Renewal__c"
PAYMENT, SIGNATURE = "Renewal_Await_Payment", "Renewal_Await_Signature"
DAY = 86400


@pytest.fixture
def renewal_view(settings):
    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = WAITS
    current_view.cache_clear()
    yield current_view()
    current_view.cache_clear()


def _deploy(org, flow):
    result = flow_deploy(org=org, source=(WAITS / f"{flow}.flow-meta.xml").read_bytes(), flow_api_name=flow)
    assert result.activated, result.diagnostics
    assert result.plan.execution_profile == "durable_orchestration"
    return result.plan


@pytest.fixture
def payment(org, renewal_view):
    return _deploy(org, PAYMENT)


def _open(org):
    return save_record(org, {"Name": "r-1", "Status__c": "Open"}, object_name=OBJECT)


def _fields(org, record) -> dict:
    return Record.objects.get(org_id=org.org_id, object_name=OBJECT, record_key=record.record_key).fields


def _run(org, record) -> FlowRun:
    return FlowRun.objects.get(org_id=org.org_id, record_key=record.record_key)


def test_a_renewal_paid_while_the_flow_waits_takes_the_paid_path(org, payment):
    record = _open(org)
    run_until_idle()
    run = _run(org, record)
    assert run.state == t.RUN_WAITING
    [dependency] = FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk)
    assert dependency.producer_kind == "record.condition"
    update_record(org, record, {"Status__c": "Paid"})
    run_until_idle()
    assert _fields(org, record)["Notice__c"] == "thanks"
    assert _run(org, record).state == t.RUN_SUCCEEDED
    assert FlowWakeSignal.objects.filter(org_id=org.org_id, flow_run_id=run.pk, state=t.SIGNAL_CONSUMED).count() == 1
