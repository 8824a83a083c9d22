"""Schedule-triggered flows redeployed around an occurrence (docs/operations.md "Schedule-triggered flows":
a redeploy of the flow opens an occurrence once)."""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun, FlowScheduleOccurrence
from nexusflow.flows.services import flow_deploy
from nexusflow.kernel.clock import db_now

from .conftest import run_until_idle
from .test_schedules import _contacts, _deploy, _next_minute, _source, _stage

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_redeploy_after_a_due_occurrence_not_yet_swept_still_runs_it(org, db_clock_advance):
    """The flow was active (scheduled) at its occurrence; a redeploy before any sweep opened it must not lose
    it: the new plan runs it once."""
    first = _next_minute()
    _deploy(org, first)
    contacts = _contacts(org, ["lead"] * 2)
    db_clock_advance((first - db_now()).total_seconds() + 1)
    source = _source(start=first).replace(b"<label>Weekly Nurture</label>", b"<label>Weekly Nurture v2</label>")
    redeployed = flow_deploy(org=org, source=source, flow_api_name="Weekly_Nurture")
    assert redeployed.activated
    assert run_until_idle() > 0
    occurrence = FlowScheduleOccurrence.objects.get()
    assert (occurrence.occurrence_at, occurrence.plan_id, occurrence.state, occurrence.admitted) == (
        first, redeployed.plan.pk, t.OCCURRENCE_ADMITTED, 2)
    assert [_stage(c) for c in contacts] == ["nurtured"] * 2
    assert run_until_idle() == 0 and FlowRun.objects.count() == 2
