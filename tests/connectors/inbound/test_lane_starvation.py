"""Claims held by live (or dead, lease not yet expired) workers on 20 lanes starve every other lane."""
import pytest

from connectors.inbound.executions import execution_try_claim_one, execution_try_run_one
from connectors.models import Execution
from tests.conftest import hubspot_event, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def test_twenty_held_lanes_do_not_block_a_ready_lane(client, serving_org):
    # 21 contacts -> 21 creation lanes, oldest first
    for i in range(21):
        assert post_signed(client, [hubspot_event(100 + i, 6000 + i, 1000)]).status_code == 202
    # 20 workers claim one lane each and are slow (or were SIGKILLed: their leases still run)
    claims = [execution_try_claim_one(worker_id=f"slow-{i}") for i in range(20)]
    assert all(c is not None for c in claims)
    ready_unclaimed = Execution.objects.filter(state="ready").exclude(
        pk__in=[c.execution_id for c in claims])
    assert ready_unclaimed.count() == 1
    # a fresh worker must find the 21st lane
    assert execution_try_run_one(worker_id="fresh"), "a ready execution on a free lane was not claimable"
