"""Every production V2 write locks the gate and its exact epoch (seed 003 "State machines", S003-RP-07).

Admission, Execution claim, OutboundCommand authoring and DispatchPermit
acquisition are each refused when the gate is not ``v2_serving`` or its
epoch reference does not byte-match the active epoch; nothing is written.
"""
import pytest
from django.db import connection, transaction

from connectors.inbound.executions import execution_try_claim_one
from connectors.models import DispatchPermit, Event, ExecutionAttempt, Receipt
from connectors.outbound.egress import permit_try_grant_one
from connectors.serving.gates import NotServing
from runtime_outbox.models import OutboundCommand
from runtime_outbox.services import outbox_try_deliver_one
from tests.conftest import hubspot_event, make_serving_org, post_signed
from tests.kits.outbound import author
from tests.kits.records import create_contact

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

BREAKS = {
    "gate_halting": "UPDATE connectors_accountservinggate SET state = 'halting_v2', reason_code = 'cutover_in_progress'",
    "epoch_digest_mismatch": "UPDATE connectors_accountservinggate SET epoch_digest = REPEAT('0', 64)",
    "epoch_draining": "UPDATE connectors_servingepoch SET state = 'draining'",
}


def _break(kind):
    with connection.cursor() as cursor:
        cursor.execute(BREAKS[kind])


def _author_new_contact():
    """Create a Contact and author its push in one application transaction."""
    with transaction.atomic():
        return author(create_contact(email="f@x.io", lifecyclestage="customer"), "s", root="r")


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_admission_is_refused(client, billing_sandbox, kind):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _break(kind)
    response = post_signed(client, [hubspot_event(1, 501, 1000)])
    assert response.status_code == 503
    assert Receipt.objects.count() == 0 and Event.objects.count() == 0


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_execution_claim_is_refused(client, billing_sandbox, kind):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    assert post_signed(client, [hubspot_event(1, 501, 1000)]).status_code == 202
    _break(kind)
    assert execution_try_claim_one(worker_id="w") is None
    assert ExecutionAttempt.objects.count() == 0


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_outbound_authoring_is_refused(billing_sandbox, kind):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _break(kind)
    with pytest.raises(NotServing):
        _author_new_contact()
    assert OutboundCommand.objects.count() == 0


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_permit_acquisition_is_refused(billing_sandbox, kind):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _author_new_contact()
    assert outbox_try_deliver_one()
    _break(kind)
    assert permit_try_grant_one(worker_id="w") is None
    assert DispatchPermit.objects.count() == 0
    assert billing_sandbox.state()["requests"] == 0


# --- The gate as a readers-writer fence (docs/performance.md, design item 3) ------------------------------
def test_outbound_writers_share_the_gate_and_a_gate_transition_waits_for_them(billing_sandbox):
    """Two shared holders of one account's gate run side by side; a writer (FOR UPDATE) queues behind them,
    and once it holds the gate no shared holder passes until it commits (then they see its fence)."""
    import threading

    from connectors.serving.gates import serving_lock
    from connectors.store import AccountServingGateStore
    from tests.concurrency import Worker, wait_until_blocked_on

    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    account = "billing-main"
    release_first = threading.Event()

    def shared_holder(wait_for=None):
        def run():
            with transaction.atomic(durable=True):
                ctx = serving_lock(org_id="test-org", account_key=account, shared=True)
                if wait_for is not None:
                    assert wait_for.wait(60)
                return ctx.gate.fence_token
        return run

    first = Worker(shared_holder(release_first), "first")
    first.start()
    assert first.ready.wait(60)
    # A second shared holder is not kept waiting by the first: it commits while the first still holds.
    second = Worker(shared_holder(), "second")
    second.start()
    second.join(60)
    assert not second.is_alive() and second.error is None and first.is_alive()

    def halt():
        with transaction.atomic(durable=True):
            gate = AccountServingGateStore.lock_by_account("test-org", account)
            AccountServingGateStore.touch(org_id=gate.org_id, pk=gate.pk, state=gate.state, version=gate.version,
                                          set_fields={"fence_token": gate.fence_token + 1})
            holds_marker.set()
            assert proceed.wait(60)
            return gate.fence_token + 1

    holds_marker, proceed = threading.Event(), threading.Event()
    writer = Worker(halt, "writer")
    writer.start()
    assert writer.ready.wait(60)
    wait_until_blocked_on(writer.connection_id, "connectors_accountservinggate", statement="FOR UPDATE")
    assert not holds_marker.is_set()  # the writer waits for the shared holder already past the gate
    release_first.set()
    first.join(60)
    assert first.error is None
    assert holds_marker.wait(60)
    # While the writer holds the gate, a new shared holder queues behind it and then sees its new fence.
    third = Worker(shared_holder(), "third")
    third.start()
    assert third.ready.wait(60)
    wait_until_blocked_on(third.connection_id, "connectors_accountservinggate", statement="LOCK IN SHARE MODE")
    proceed.set()
    writer.join(60)
    third.join(60)
    assert writer.error is None and third.error is None
    assert third.result == writer.result == first.result + 1
