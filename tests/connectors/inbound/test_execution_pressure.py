"""Inbound application is new mutation work: it waits under database pressure (seed 004 section 16.2; the
runtime policy's ``pressure`` bounds) while the webhook ingress keeps admitting below its own higher bounds.

Pressure is real: statements blocked on a held row lock (tests/pressure_support.py).
"""
from __future__ import annotations

import pytest

from connectors.models import Execution, ExecutionAttempt, Receipt
from nexusflow.flows.models import FlowExecutionPlan
from nexusflow.records.models import Record
from runtime_outbox.policy import runtime_policy_publish
from tests.conftest import drain, hubspot_event, make_serving_org, post_signed
from tests.pressure_support import blocked_statements

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

BLOCKED = 3


def _pressure(active_statements: int) -> None:
    runtime_policy_publish(scope="*", document={
        "pressure": {"active_statements": active_statements, "read_seconds": 0},
        "ingress": {"shed_active_statements": 10_000}}, authored_by="ops", reason="test")


def test_inbound_executions_wait_under_pressure_while_ingress_admits(client, billing_sandbox, settings):
    settings.NEXUS_POLICY_READ_SECONDS = 0
    org = make_serving_org(billing_sandbox.base_url)
    _pressure(BLOCKED)
    plan = FlowExecutionPlan.objects.filter(org_id=org.org_id).values_list("pk", flat=True).first()
    with blocked_statements(plan, BLOCKED):
        assert post_signed(client, [hubspot_event(1, 501, 1000)]).status_code == 202
        drain()
        assert Receipt.objects.count() == 1
        assert Execution.objects.filter(state="ready").exists()
        assert not ExecutionAttempt.objects.exists() and not Record.objects.exists()
        _pressure(10_000)
        drain()
    assert Record.objects.count() == 1 and not Execution.objects.filter(state="ready").exists()
