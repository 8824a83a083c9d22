"""Many worker processes of each role at once on the bundled input: same end state as the oracle."""
import pytest

from connectors.models import RemoteEffect
from packs.hubspot.fixtures.make_demo_webhooks import OUTPUT_PATH, expected_final_state
from packs.hubspot.sender import load_deliveries
from tests.adversarial.helpers import check_end_state, pending_work, run_parallel
from tests.conftest import post_signed, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.mark.chaos
def test_parallel_workers_converge_on_bundled_file(client, serving_org):
    deliveries = load_deliveries(OUTPUT_PATH)
    for d in deliveries:
        assert post_signed(client, d.body, sign=d.sign).status_code < 500
    env = subprocess_env(NEXUS_EXECUTION_LEASE_SECONDS="30")
    run_parallel(env, {"connector": 4, "runtime": 2, "flow": 3, "egress": 3})
    assert not any(pending_work().values()), pending_work()
    problems = check_end_state(expected_final_state(deliveries), serving_org.sandbox)
    assert not problems, "\n".join(problems[:30])
    # Every push finalized, or was superseded before any Attempt (its version had already reached the remote).
    unfinished = RemoteEffect.objects.exclude(state="finalized").exclude(
        state="quarantined", reason_code="superseded_by_newer_version", attempts__isnull=True)
    assert not unfinished.exists(), list(unfinished.values_list("state", "reason_code"))
