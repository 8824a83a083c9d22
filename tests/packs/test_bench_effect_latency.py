"""``make bench``'s admission -> confirmed effect latency: the correlation from the rows and the report entry.

The series itself (worker processes, the open-loop schedule) runs in ``make bench``; here the rows are the
real chain's, made in-process: signed webhook deliveries through the ingress view, then the worker units
drained in this process (``tests.conftest.drain``).
"""
import pytest
from django.test import Client

from connectors.inbound.executions import execution_try_run_one
from connectors.models import Event, Execution, RemoteEffect
from nexusflow.flows.models import FlowRun
from nexusflow.records.models import Record
from packs.bench.inbound import confirmed_effect_latencies, effect_latency_figures
from tests.conftest import ORG, drain, hubspot_event, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CONFIRMED, PENDING = (7101, 7102), 7103


def _max_execution() -> int:
    return int(Execution.objects.order_by("-id").values_list("id", flat=True).first() or 0)


def _customer_event(object_id: int) -> Event:
    return Event.objects.get(org_id=ORG, pk__in=Execution.objects.filter(
        org_id=ORG, projection__event__payload__objectId=object_id,
        projection__event__payload__propertyName="lifecyclestage").values("projection__event_id"))


def _record_key(object_id: int) -> str:
    return Record.objects.get(org_id=ORG, object_name="Contact", fields__email=f"c{object_id}@example.com").record_key


def test_each_customer_event_is_carried_to_the_finalized_effect_of_its_records_run(serving_org):
    client = Client()
    objects = (*CONFIRMED, PENDING)
    contacts = [hubspot_event(10 + i, o, 1000 + i, "email", f"c{o}@example.com") for i, o in enumerate(objects)]
    contacts += [hubspot_event(20 + i, o, 2000 + i, "firstname", f"C{o}") for i, o in enumerate(objects)]
    assert post_signed(client, contacts).status_code == 202
    drain()
    last = _max_execution()
    for i, object_id in enumerate(CONFIRMED):
        assert post_signed(client, [hubspot_event(30 + i, object_id, 3000 + i, "lifecyclestage", "customer")]
                           ).status_code == 202
    drain()
    # The last contact's event is applied (its record saved, its Flow run admitted) but its run is not run yet.
    assert post_signed(client, [hubspot_event(40, PENDING, 4000, "lifecyclestage", "customer")]).status_code == 202
    while execution_try_run_one(worker_id="test-worker"):
        pass
    assert FlowRun.objects.filter(org_id=ORG, record_key=_record_key(PENDING)).count() == 1

    latencies = confirmed_effect_latencies(org_id=ORG, execution_id=last, object_name="Contact")

    assert set(latencies) == {_customer_event(o).pk for o in objects}  # only the events after ``last``
    for object_id in CONFIRMED:
        event = _customer_event(object_id)
        (effect,) = RemoteEffect.objects.filter(org_id=ORG, source_object="Contact",
                                                source_record_key=_record_key(object_id), state="finalized")
        assert latencies[event.pk] == pytest.approx((effect.updated_at - event.created_at).total_seconds() * 1000)
    assert latencies[_customer_event(PENDING).pk] is None


def test_the_report_entry_counts_the_unconfirmed_and_takes_percentiles_of_the_confirmed_only():
    latencies = {event_id: float(event_id) for event_id in range(1, 101)} | {101: None, 102: None}
    assert effect_latency_figures(latencies, rate=2.5, workers=2) == {
        "arrival_per_second": 2.5, "workers": 2, "units": 100, "unconfirmed": 2,
        "p50_ms": 50.0, "p95_ms": 95.0, "p99_ms": 99.0}


def test_no_confirmed_event_gives_no_units():
    figures = effect_latency_figures({1: None}, rate=1.0, workers=2)
    assert (figures["units"], figures["unconfirmed"]) == (0, 1)
