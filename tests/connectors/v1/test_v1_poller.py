"""The V1 cursor poller of pulled routes (seed 003 "V1 concepts to retire"), against the loopback stream sandbox.

Each fetch is one V1ProviderCall behind its committed pre-I/O row; envelopes become V1 deliveries
keyed as V2 keys them; the cursor advances only after they commit.
"""
from __future__ import annotations

import pytest

from connectors.models import AccountServingGate, V1Event, V1ProviderCall, V1StreamCursor, V1TransportKey
from connectors.v1.events import v1_event_try_complete_one, v1_event_try_run_one
from connectors.v1.poller import V1PollFailed, v1_stream_poll, v1_stream_try_poll_one
from packs.salesforce_cdc import change_event
from tests.conftest import ORG
from tests.stream_support import STREAM_ACCOUNT, stream_service_configure

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def v1_stream_org(billing_sandbox, cdc_sandbox, tmp_path):
    """The stream org configured as an operator would, installed as a fresh V1 service (no greenfield)."""
    stream_service_configure(billing_sandbox.base_url, cdc_sandbox.base_url, tmp_path, procedure="v1-install")
    return cdc_sandbox


def test_v1_install_opens_one_cursor_per_pulled_route_and_the_poller_advances_it_after_commit(v1_stream_org):
    (cursor,) = V1StreamCursor.objects.filter(org_id=ORG)
    assert (cursor.account_key, cursor.state, cursor.cursor) == (STREAM_ACCOUNT, "polling", None)
    v1_stream_org.publish([
        change_event(change_type="CREATE", record_ids=["003A1"], transaction_key="tx-1", sequence=1,
                     commit_ms=1_700_000_000_000, fields={"LastName": "One"}),
        change_event(change_type="UPDATE", record_ids=["003A1"], transaction_key="tx-2", sequence=1,
                     commit_ms=1_700_000_000_100, fields={"Email": "one@x.io"})])
    assert v1_stream_poll(org_id=ORG, cursor_id=cursor.pk, worker_id="v1-poller") == 2
    assert V1TransportKey.objects.filter(account_key=STREAM_ACCOUNT).count() == 2
    assert V1Event.objects.filter(account_key=STREAM_ACCOUNT, state="pending").count() == 2
    cursor.refresh_from_db()
    assert cursor.cursor is not None and cursor.polled_at is not None
    (call,) = V1ProviderCall.objects.filter(kind="poll")
    assert (call.call_site, call.state, call.response_status) == ("v1.poll.fetch", "confirmed", 200)
    assert call.io_may_have_started_at is not None
    # Nothing new after the cursor: an empty batch, no new V1 rows, one more pre-I/O row.
    assert not v1_stream_try_poll_one(worker_id="v1-poller")
    assert V1TransportKey.objects.filter(account_key=STREAM_ACCOUNT).count() == 2
    assert V1ProviderCall.objects.filter(kind="poll", state="confirmed").count() == 2
    # The pulled events run through the same Runtime handoff; the gates never left v1_serving.
    while v1_event_try_run_one(worker_id="v1-worker") or v1_event_try_complete_one():
        pass
    assert set(V1Event.objects.filter(account_key=STREAM_ACCOUNT).values_list("state", flat=True)) == {"completed"}
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}


def test_a_failed_fetch_leaves_the_cursor_where_it_was(v1_stream_org):
    cursor = V1StreamCursor.objects.get(org_id=ORG)
    v1_stream_org.stop()
    with pytest.raises(V1PollFailed):
        v1_stream_poll(org_id=ORG, cursor_id=cursor.pk, worker_id="v1-poller")
    cursor.refresh_from_db()
    assert cursor.cursor is None and cursor.version == 1
    (call,) = V1ProviderCall.objects.filter(kind="poll")
    assert call.state == "refused" and call.reason_code == "v1_not_performed"
    v1_stream_org.start()


def test_a_closed_ingress_barrier_holds_the_cursor_without_a_fetch(v1_stream_org):
    """Seed 003 halt contract of a pulled route: the poller stops without advancing its cursor."""
    from django.db import transaction

    from connectors.v1.store import V1MaintenanceBarrierStore

    (cursor,) = V1StreamCursor.objects.filter(org_id=ORG)
    v1_stream_org.publish([change_event(change_type="CREATE", record_ids=["003B1"], transaction_key="tx-9",
                                        sequence=1, commit_ms=1_700_000_000_000, fields={"LastName": "Nine"})])
    with transaction.atomic():
        barrier = V1MaintenanceBarrierStore.lock_where(ORG, kind="ingress")
        V1MaintenanceBarrierStore.transition(org_id=ORG, pk=barrier.pk, src="open", dst="closed",
                                             version=barrier.version, set_fields={"fence_token": 1})
    assert v1_stream_poll(org_id=ORG, cursor_id=cursor.pk, worker_id="v1-poller") is None
    cursor.refresh_from_db()
    assert cursor.cursor is None and not V1ProviderCall.objects.exists() and not V1TransportKey.objects.exists()
