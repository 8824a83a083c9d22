"""Claims share fairly between the Flows of one org, as between orgs (seed 004 sections 12.1 and 16.2:
"per-org (and per plan) fair share in claims").

One org runs a hot Flow with a backlog of 40 due runs and a second Flow with one run started after them.
Claim rounds take turns between the two plans, so the single run is claimed in the second round instead of
after the backlog (ten rounds of four).
"""
from __future__ import annotations

import pytest

from nexusflow.flows import policy
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_deploy, flow_run_start
from nexusflow.flows.services.claim import flow_step_claim_batch
from nexusflow.kernel.scope import OrgScope
from tests.bench import capacity_flows as cf

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 40


def test_a_flow_with_one_run_is_claimed_in_the_second_round_beside_another_flows_backlog():
    org = OrgScope("fair-org")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Hot_Chain")
    flow_deploy(org=org, source=cf.durable_chain(2), flow_api_name="Cold_Chain")
    hot = [flow_run_start(org=org, flow_api_name="Hot_Chain", inputs={"counter": 0}).run.pk for _ in range(BACKLOG)]
    cold = flow_run_start(org=org, flow_api_name="Cold_Chain", inputs={"counter": 0}).run.pk
    # The backlog is older: by due time alone the cold run would come after every hot run.
    assert max(FlowRun.objects.filter(pk__in=hot).values_list("run_after", flat=True)) <= \
        FlowRun.objects.get(pk=cold).run_after
    batch = policy.claim_batch()
    first = flow_step_claim_batch(worker_id="fair-worker")
    second = flow_step_claim_batch(worker_id="fair-worker")
    assert [c.run_id for c in first] == hot[:batch]
    assert [c.run_id for c in second] == [cold]
    third = flow_step_claim_batch(worker_id="fair-worker")
    assert [c.run_id for c in third] == hot[batch:2 * batch]  # back to the hot plan, in its own order
