"""Every production V2 write locks the gate and its exact epoch (seed 003 "State machines", S003-RP-07).

Admission, Execution claim, OutboundCommand authoring and DispatchPermit
acquisition are each refused when the gate is not ``v2_serving`` or its
epoch reference does not byte-match the active epoch; nothing is written.
"""
import pytest
from django.db import connection, transaction

from connectors.outbound.egress import permit_try_grant_one
from connectors.inbound.executions import execution_try_claim_one
from connectors.models import DispatchPermit, Event, ExecutionAttempt, Receipt
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
