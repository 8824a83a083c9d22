"""Dispatch resolves only the frozen credential generation's exact secret version
(seed 003 "Generation and replay": no rotation, mutable-name or newer-secret fallback;
missing material blocks dispatch while the Permit is provably pre-I/O)."""
import pytest
from django.db import transaction

from connectors.models import DispatchPermit, RemoteEffect
from connectors.outbound.egress import permit_send, permit_settle, permit_try_grant_one
from connectors.serving.generations import credential_publish
from connectors.serving.secret_store import secret_path
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.services import record_create, record_lock
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.conftest import ORG, SECRET_VERSION, make_serving_org

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")


def _push_one() -> None:
    with transaction.atomic():
        record = record_create(org=OrgScope(ORG), object_name="Contact",
                               values={"email": "ann@x.io", "firstname": "Ann", "lifecyclestage": "customer"})
    with transaction.atomic():
        record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        outbound_command_author(scope=SCOPE, effect_root_id="root-1", effect_slot_id="push-1",
                               effect_generation_id="1", contract_key="billing.customer", record=record,
                               origin_flow_run_id=None)
    assert outbox_try_deliver_one()


def _publish_newer_version() -> None:
    # A newer version holding the right key exists; the frozen generation must not use it.
    credential_publish(org=OrgScope(ORG), document={
        "account_key": "billing-main", "credential_ref": "api_key", "version": "test-2",
        "secret": {"from_env": "NEXUS_TEST_BILLING_KEY"}, "transport": {"scheme": "bearer"}})


def test_a_missing_frozen_secret_version_blocks_before_io_and_never_falls_forward(billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _push_one()
    frozen = secret_path(org_id=ORG, account_key="billing-main", credential_ref="api_key",
                         secret_version=SECRET_VERSION)
    moved = frozen.with_name("moved-away")
    frozen.rename(moved)
    try:
        _publish_newer_version()
        # Acquisition refuses while the exact version is unreadable: no Permit, no Attempt, no I/O.
        assert permit_try_grant_one(worker_id="w1") is None
        effect = RemoteEffect.objects.get(org_id=ORG)
        assert (effect.state, effect.attempt_count) == ("prepared", 0)
        assert not DispatchPermit.objects.filter(org_id=ORG).exists()
        assert billing_sandbox.state()["requests"] == 0
    finally:
        moved.rename(frozen)
    grant = permit_try_grant_one(worker_id="w1")
    response = permit_send(grant)
    assert response is not None and response.status == 200
    permit_settle(grant, response)
    assert billing_sandbox.state()["requests"] == 1


def test_material_lost_after_acquisition_closes_the_permit_before_io(billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    _push_one()
    grant = permit_try_grant_one(worker_id="w1")
    assert grant is not None
    frozen = secret_path(org_id=ORG, account_key="billing-main", credential_ref="api_key",
                         secret_version=SECRET_VERSION)
    moved = frozen.with_name("moved-away")
    frozen.rename(moved)
    try:
        _publish_newer_version()
        assert permit_send(grant) is None
        permit = DispatchPermit.objects.get(org_id=ORG, pk=grant.permit_id)
        assert (permit.state, permit.io_may_have_started_at) == ("abandoned", None)
        assert permit.closed_evidence["proof"] == "holder_released_before_sending"
        assert RemoteEffect.objects.get(org_id=ORG).state == "prepared"
        assert billing_sandbox.state()["requests"] == 0
    finally:
        moved.rename(frozen)
    regrant = permit_try_grant_one(worker_id="w1")
    response = permit_send(regrant)
    assert response.status == 200
    assert permit_settle(regrant, response) == "remote_confirmed"
    assert billing_sandbox.state()["requests"] == 1
