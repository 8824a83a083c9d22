"""The Flow reconcilers run as their installed django-q2 schedules (nexusflow/kernel/schedules.py; issue 22
item 4): expired-lease recovery moves on the database clock, never on a wait."""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowStepAttempt, FlowStepExecution
from nexusflow.flows.services import execute, flow_deploy, flow_step_claim_one
from tests.kernel.test_schedules import _run, _run_scheduled

from .conftest import decision_flow_xml, save_record

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_flow_recover_schedule_fences_an_expired_lease_once(org, short_lease, db_clock_advance):
    flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only")
    save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    stale = execute._start(flow_step_claim_one(worker_id="slow"))  # Running under a 1 s lease
    _run("schedules", "install")
    assert _run_scheduled("flow.recover") == 0  # the lease has not lapsed
    assert FlowStepExecution.objects.get(pk=stale.step_id).state == t.STEP_RUNNING
    db_clock_advance(2)
    assert _run_scheduled("flow.recover") == 1
    step = FlowStepExecution.objects.get(pk=stale.step_id)
    assert step.state == t.STEP_RETRY_SCHEDULED and step.lease_token_digest is None
    assert FlowStepAttempt.objects.get(pk=stale.attempt_id).state == t.ATTEMPT_FENCED
    assert _run_scheduled("flow.recover") == 0  # run twice: nothing more to recover
