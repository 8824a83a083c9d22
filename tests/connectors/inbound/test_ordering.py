"""Durable source ordering: latest_source_position lanes (seed 003 "Durable source ordering")."""
import threading

import pytest
from django.db import connection

from connectors.inbound.executions import execution_run, execution_try_claim_one, execution_try_run_one
from connectors.models import Execution, OrderingDecision, OrderingLane
from runtime_outbox.models import ApplicationResult
from tests.conftest import hubspot_event, make_serving_org, post_signed
from tests.kits.records import only_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def org(billing_sandbox):
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def _run_all():
    while execution_try_run_one(worker_id="t"):
        pass


def test_newest_position_wins_and_older_ones_never_reach_runtime(client, org):
    post_signed(client, [hubspot_event(3, 501, 3000, "email", "new@x.io"),
                         hubspot_event(1, 501, 1000, "email", "old@x.io"),
                         hubspot_event(2, 501, 2000, "email", "mid@x.io")])
    _run_all()
    assert only_record().fields["email"] == "new@x.io"
    states = dict(Execution.objects.values_list("projection__event__occurred_at_ms", "state"))
    assert states == {3000: "completed", 1000: "superseded", 2000: "superseded"}
    assert ApplicationResult.objects.count() == 1
    assert OrderingDecision.objects.count() == 2


def test_late_lower_position_is_superseded_below_the_high_water(client, org):
    post_signed(client, [hubspot_event(5, 501, 5000, "firstname", "Zoë")])
    _run_all()
    post_signed(client, [hubspot_event(4, 501, 4000, "firstname", "Stale")])
    _run_all()
    assert only_record().fields["firstname"] == "Zoë"
    late = Execution.objects.get(projection__event__occurred_at_ms=4000)
    assert late.state == "superseded"
    assert ApplicationResult.objects.filter(command_id=late.command_id).count() == 0


def test_equal_occurred_at_is_broken_by_event_id(client, org):
    post_signed(client, [hubspot_event(9, 501, 1000, "lastname", "Nine"), hubspot_event(8, 501, 1000, "lastname", "Eight")])
    _run_all()
    assert only_record().fields["lastname"] == "Nine"


def test_partitions_are_independent_per_property(client, org):
    post_signed(client, [hubspot_event(1, 501, 9000, "email", "e@x.io"), hubspot_event(2, 501, 1000, "firstname", "Ann")])
    _run_all()
    assert only_record().fields == {"email": "e@x.io", "firstname": "Ann"}
    assert OrderingLane.objects.count() == 2


def test_concurrent_claims_take_a_lane_once(client, org):
    post_signed(client, [hubspot_event(i, 501, 1000 * i, "email", f"v{i}@x.io") for i in range(1, 6)])
    claims, barrier = [], threading.Barrier(4)

    def worker(n):
        try:
            barrier.wait()
            claims.append(execution_try_claim_one(worker_id=f"w{n}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [c for c in claims if c is not None]
    assert len(won) == 1
    assert Execution.objects.filter(state="ready").count() == 1
    assert OrderingLane.objects.get().active_execution_id == won[0].execution_id
    assert execution_run(won[0]) is True
    assert only_record().fields["email"] == "v5@x.io"


def test_expired_lease_is_reacquired_with_the_same_identity(client, org, monkeypatch):
    post_signed(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")])
    monkeypatch.setenv("NEXUS_EXECUTION_LEASE_SECONDS", "-1")
    first = execution_try_claim_one(worker_id="crashed")
    assert first is not None
    second = execution_try_claim_one(worker_id="rescuer")
    assert second is not None and second.execution_id == first.execution_id
    assert second.attempt_id != first.attempt_id
    assert execution_run(first) is False  # the old holder is fenced
    assert execution_run(second) is True
    assert ApplicationResult.objects.count() == 1
    assert Execution.objects.get().state == "completed"
