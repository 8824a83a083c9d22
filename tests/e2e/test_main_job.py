"""The main job end to end on the bundled provider file (walking slice evidence).

Every delivery of ``packs/hubspot/fixtures/demo_webhooks.jsonl`` goes through
the real ingress view; all workers then drain in-process against MariaDB.
"""
import pytest

from connectors.models import Event, Execution, RemoteEffect, RemoteLink
from nexusflow.flows.models import FlowRun, FlowStepAttempt
from nexusflow.records.models import Record
from packs.hubspot.fixtures.make_demo_webhooks import OUTPUT_PATH, expected_final_state
from packs.hubspot.sender import load_deliveries
from runtime_outbox.models import ApplicationResult, OutboundCommand
from tests.conftest import drain, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _local_by_object_id():
    links = RemoteLink.objects.filter(action_type="InboundUpsert", state="active")
    records = {r.record_key: r for r in Record.objects.all()}
    return {link.remote_id: records[link.source_record_key] for link in links}


def test_bundled_file_converges_to_latest_events_and_one_customer_each(client, serving_org):
    deliveries = load_deliveries(OUTPUT_PATH)
    statuses = [post_signed(client, d.body, sign=d.sign).status_code for d in deliveries]
    assert set(statuses) <= {200, 202, 400, 401}
    assert statuses.count(401) == sum(1 for d in deliveries if d.sign != "valid")
    drain()

    expected = expected_final_state(deliveries)
    local = _local_by_object_id()
    assert set(local) == set(expected)
    for object_id, props in expected.items():
        fields = local[object_id].fields
        for prop, value in props.items():
            assert fields.get(prop) == value, (object_id, prop)

    customers = {c["id"]: c for c in serving_org.sandbox.state()["customers"]}
    push_links = {link.source_record_key: link.remote_id
                  for link in RemoteLink.objects.filter(action_type="PushToConnector")}
    assert len(customers) == len(push_links), "a customer exists without a link: duplicate create"
    customer_contacts = [r for r in local.values() if r.fields.get("lifecyclestage") == "customer"]
    assert len(customer_contacts) >= 15
    for record in customer_contacts:
        customer = customers[push_links[record.record_key]]
        name = " ".join(v for v in (record.fields.get("firstname"), record.fields.get("lastname")) if v)
        assert (customer["email"], customer["name"]) == (record.fields.get("email"), name)
        assert record.mirrors["billing_id"] == customer["id"]
    assert sum(c["update_requests"] for c in customers.values()) >= 8
    # Every push finalized, or was superseded: its record version (or a newer one) had already reached the
    # remote through the same link, so nothing was sent and its Flow succeeded.
    unfinished = RemoteEffect.objects.exclude(state="finalized")
    assert set(unfinished.values_list("state", "reason_code")) <= {("quarantined", "superseded_by_newer_version")}
    assert not unfinished.filter(attempts__isnull=False).exists(), "a superseded push never made an Attempt"
    failed = FlowRun.objects.exclude(state="Succeeded")
    assert set(failed.values_list("reason_code", flat=True)) <= {"flow_step_expected_refusal"}
    refusals = FlowStepAttempt.objects.filter(step__run__in=failed, state="RolledBack")
    assert set(refusals.values_list("safe_error_code", flat=True)) <= {"mapping_produced_no_body"}
    assert not Execution.objects.filter(state__in=("ready", "waiting_dependency")).exists()


def test_redelivery_creates_no_new_event_and_no_new_effect(client, serving_org):
    from tests.conftest import hubspot_event

    batch = [hubspot_event(1, 901, 1000), hubspot_event(2, 901, 2000, "email", "ivy@x.io"),
             hubspot_event(3, 901, 3000, "lifecyclestage", "customer")]
    assert post_signed(client, batch).status_code == 202
    drain()
    counts = (Event.objects.count(), ApplicationResult.objects.count(), OutboundCommand.objects.count(),
              FlowRun.objects.count())
    for event in batch:
        event["attemptNumber"] += 1
    assert post_signed(client, batch).status_code == 200
    assert post_signed(client, batch[1:]).status_code == 202  # regrouped: new receipt, duplicate components
    drain()
    assert (Event.objects.count(), ApplicationResult.objects.count(), OutboundCommand.objects.count(),
            FlowRun.objects.count()) == counts
    assert len(serving_org.sandbox.state()["customers"]) == 1
