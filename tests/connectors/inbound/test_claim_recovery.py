"""Claim recovery keeps the one lock order (ARCHITECTURE.md section 6).

When a lane's active Execution is no longer ``ready``, the claim clears the
lane's pointer and claims the next ready Execution. The lane (rank 0) is
locked once, before any Execution (rank 2); it is never locked again after.
"""
from __future__ import annotations

import pytest

from connectors.inbound.executions import _claim_in_lane
from connectors.models import AccountServingGate, Execution, OrderingLane, ServingEpoch
from tests.kernel import rows

ORG = "claim-org"
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lane_whose_active_execution_waits_is_recovered_without_a_lock_reversal():
    ordering = {"contract": "latest_source_position", "partition": [], "position": ["n"], "tie_breaker": "n",
                "comparator_version": "1"}
    epoch = rows.make(ServingEpoch, org_id=ORG, state="active", version=1, document={"accounts": [
        {"account_key": "acct", "routes": {"r1": {"ordering": ordering}}}]})
    rows.make(AccountServingGate, org_id=ORG, account_key="acct", state="v2_serving", version=1, epoch=epoch,
              epoch_digest=epoch.digest)
    lane = rows.make(OrderingLane, org_id=ORG, epoch=epoch, state="open", version=1, route_key="r1")
    waiting = rows.make(Execution, org_id=ORG, lane=lane, state="waiting_dependency", version=1,
                        position=b"\x01")
    ready = rows.make(Execution, org_id=ORG, lane=lane, state="ready", version=1, position=b"\x02")
    from connectors.store import OrderingLaneStore

    OrderingLaneStore.touch(org_id=ORG, pk=lane.pk, state="open", version=1,
                            set_fields={"active_execution_id": waiting.pk})
    claim = _claim_in_lane(ORG, "acct", lane.pk, "worker-1")
    assert claim is not None and claim.execution_id == ready.pk
    lane_row = OrderingLane.objects.get(org_id=ORG, pk=lane.pk)
    assert lane_row.active_execution_id == ready.pk
    assert Execution.objects.get(org_id=ORG, pk=waiting.pk).state == "waiting_dependency"
