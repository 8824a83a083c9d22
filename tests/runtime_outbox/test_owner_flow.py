"""Seed 000 on the Flow path: an EffectSubmit step whose trigger record's deletion committed ends failed
with the definite ``owner_deleted`` refusal (no intent, no retry loop)."""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowCheckpoint, FlowEffectLink, FlowRun, FlowStepExecution
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.services import record_delete_by_key
from runtime_outbox.models import OutboundCommand
from tests.conftest import ORG, make_serving_org
from tests.flows.conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SUBMIT = "submit:Push_Customer_To_Billing"


def test_a_submit_step_after_a_committed_deletion_fails_once_with_owner_deleted(billing_sandbox):
    org = make_serving_org(billing_sandbox.base_url)
    record = save_record(org, {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee",
                               "lifecyclestage": "customer"})
    # The deletion (the installed lifecycle: owner work check, then soft delete) commits before the step runs.
    record_delete_by_key(org=OrgScope(ORG), object_name=record.object_name, record_key=record.record_key)

    run_until_idle()
    run = FlowRun.objects.get(org_id=ORG)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_trigger_record_deleted")
    step = FlowStepExecution.objects.get(run=run, plan_step_key=SUBMIT)
    assert step.state == t.STEP_FAILED
    checkpoint = FlowCheckpoint.objects.filter(run=run, step=step).get()
    assert checkpoint.context_payload["output"] == {"failure": "flow_trigger_record_deleted",
                                                    "refusal": "owner_deleted"}
    assert not OutboundCommand.objects.exists() and not FlowEffectLink.objects.exists()
    assert run_until_idle() == 0  # nothing is left to retry
