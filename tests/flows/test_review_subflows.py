"""Inline subflows and the element visit budget (seed 004 section 9.1 "execution budget"; docs/operations.md
"Subflows"): the visits of a subflow run inline count against the caller's one budget, so a graph and the
flows it calls cannot make more visits in one transaction than the budget allows."""
from __future__ import annotations

import pytest

from nexusflow.flows.errors import FlowExecutionError
from nexusflow.flows.interpreter import run_graph
from nexusflow.flows.selectors import flow_subflow_payloads
from nexusflow.kernel.clock import db_now

from .test_subflows import _deploy

pytestmark = pytest.mark.django_db(transaction=True)


def _walk(org, plan, budget: int):
    """Run the bounded atomic caller's graph (3 own visits, 3 in each of its two inline calls: 9 in all)."""
    step = plan.plan_payload["steps"][0]
    return run_graph(plan_payload=plan.plan_payload, graph=step["graph"], entry=step.get("entry_element"),
                     record={}, object_name="", now=db_now(), reader=None, budget=budget,
                     state={"vars": {"score": "70", "divisor": "7"}},
                     subflows=flow_subflow_payloads(org_id=org.org_id, payload=plan.plan_payload))


def test_inline_subflow_visits_count_against_the_callers_budget(org):
    plan = _deploy(org, None)
    assert len(_walk(org, plan, 9).path) == 9
    with pytest.raises(FlowExecutionError) as caught:
        _walk(org, plan, 8)
    assert caught.value.code == "flow_budget_exhausted"
