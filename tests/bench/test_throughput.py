"""Speed targets (run with ``make bench``; never part of ``make test``).

Targets are deliberately modest for a 2-core development machine with
MariaDB on the same host; they catch order-of-magnitude regressions.
"""
import time

import pytest

from connectors.models import Event
from nexusflow.records.models import Record
from tests.conftest import drain, hubspot_event, post_signed

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True, databases=["default", "control"])]

ADMISSION_EVENTS_PER_SECOND = 100
PIPELINE_EVENTS_PER_SECOND = 15


def _batches(n_batches: int, size: int):
    event_id = 0
    for _b in range(n_batches):
        batch = []
        for _i in range(size):
            event_id += 1
            batch.append(hubspot_event(event_id, 10_000 + (event_id % 200), 1_000 + event_id, "email",
                                       f"user{event_id}@example.com"))
        yield batch


def test_admission_throughput(client, serving_org):
    batches = list(_batches(50, 20))
    start = time.perf_counter()
    for batch in batches:
        assert post_signed(client, batch).status_code == 202
    elapsed = time.perf_counter() - start
    rate = 1000 / elapsed
    print(f"\nadmission: 1000 events in {elapsed:.2f} s = {rate:.0f} events/s")
    assert Event.objects.count() == 1000
    assert rate >= ADMISSION_EVENTS_PER_SECOND


def test_end_to_end_pipeline_throughput(client, serving_org):
    for batch in _batches(10, 20):
        assert post_signed(client, batch).status_code == 202
    start = time.perf_counter()
    drain()
    elapsed = time.perf_counter() - start
    rate = 200 / elapsed
    print(f"\npipeline (one in-process worker): 200 events in {elapsed:.2f} s = {rate:.0f} events/s")
    assert Record.objects.count() == 200
    assert rate >= PIPELINE_EVENTS_PER_SECOND
