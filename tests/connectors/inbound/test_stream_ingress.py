"""Pulled stream ingress: durable cursor, envelope fan-out, gap quarantine, redelivery, stop and crash.

Seed 003 "Inbound facts" (one Receipt per transport key, Components per
Receipt and ordinal, one live Event per SourceEventKey) and "each ingress
owner can stop pollers and streams without advancing its durable cursor";
issue #4 item 7. The stream is the loopback sandbox of ``packs/salesforce_cdc``
on 127.0.0.1; every test runs on the real MariaDB.
"""
from __future__ import annotations

import json
import signal
import threading

import pytest
from django.db import connection

from connectors.contracts.stream_routes import encode_cursor
from connectors.inbound.stream_poll import stream_cursor_set_state, stream_poll_once
from connectors.inbound.stream_transport import StreamFetchFailed
from connectors.models import (
    AccountServingGate,
    Event,
    Execution,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
    StreamCursor,
)
from packs.salesforce_cdc import change_event
from tests.conftest import run_manage, subprocess_env
from tests.stream_support import STREAM_ACCOUNT, stream_target

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _cursor() -> StreamCursor:
    return StreamCursor.objects.get(account_key=STREAM_ACCOUNT)


def _publish_transaction(sandbox, tx: str, records_per_change: list[list[str]], start_ms: int = 1_700_000_000_000):
    """Publish one source transaction: change ``i`` names ``records_per_change[i]`` at sequence ``i + 1``."""
    return sandbox.publish([
        change_event(change_type="CREATE" if i == 0 else "UPDATE", record_ids=ids, transaction_key=tx,
                     sequence=i + 1, commit_ms=start_ms + i,
                     fields={"Email": f"{tx}-{i}@x.io"} if i else {"LastName": tx})
        for i, ids in enumerate(records_per_change)])


def test_one_envelope_naming_several_records_becomes_several_components_and_events(stream_org):
    ids = _publish_transaction(stream_org.stream, "tx-a", [["003A1"], ["003A1", "003A2", "003A3"]])
    result = stream_poll_once(stream_target())
    assert (result.fetched, result.receipts_created, result.events_created, result.advanced) == (2, 2, 4, True)
    fanned = Receipt.objects.get(account_key=STREAM_ACCOUNT, pk=result_receipt_for(ids[1]))
    components = list(ReceiptComponent.objects.filter(receipt=fanned).order_by("ordinal"))
    assert [(c.ordinal, c.disposition, c.event.source_locator) for c in components] == [
        (0, "event", "003A1"), (1, "event", "003A2"), (2, "event", "003A3")]
    events = Event.objects.filter(receipt=fanned).order_by("id")
    # Ordering facts: strict sequence per transactionKey, the fan-out shares the position, the record breaks ties.
    assert {e.ordering_contract for e in events} == {"strict_source_sequence"}
    assert {tuple(e.partition) for e in events} == {("tx-a",)}
    assert {bytes(e.position)[:8] for e in events} == {(2 + (1 << 63)).to_bytes(8, "big")}
    assert [e.tie_breaker for e in events] == ["003A1", "003A2", "003A3"]
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1])


def result_receipt_for(replay_id) -> int:
    """The Receipt whose envelope carries ``replay_id`` (found through its Events' SourceEventKey)."""
    prefix = f"{len(str(replay_id))}:{replay_id}/"
    event = Event.objects.filter(account_key=STREAM_ACCOUNT, source_event_key__startswith=prefix).first()
    return event.receipt_id


def test_gap_events_quarantine_with_a_registered_reason_and_the_cursor_moves_past_them(stream_org):
    from nexusflow.kernel.reasons import REASONS

    ids = stream_org.stream.publish([
        change_event(change_type="GAP_UPDATE", record_ids=["003G1", "003G2"], transaction_key="tx-g"),
        change_event(change_type="GAP_OVERFLOW", record_ids=[], transaction_key="tx-o"),
        change_event(change_type="UPDATE", record_ids=["003G1"], transaction_key="tx-u", fields={"Email": "g@x.io"}),
    ])
    result = stream_poll_once(stream_target())
    assert (result.receipts_created, result.events_created, result.quarantined) == (3, 1, 3)
    quarantined = ReceiptComponent.objects.filter(receipt__account_key=STREAM_ACCOUNT, disposition="quarantined")
    assert sorted(quarantined.values_list("reason_code", flat=True)) == ["source_gap_reported"] * 3
    assert REASONS["source_gap_reported"].owner == "connectors"
    assert all(c.event_id is None for c in quarantined)
    assert list(Event.objects.filter(account_key=STREAM_ACCOUNT).values_list("source_locator", flat=True)) == ["003G1"]
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1])


def test_transport_redelivery_of_a_pulled_batch_resolves_every_receipt_and_materializes_nothing_twice(stream_org):
    sandbox = stream_org.stream
    first = _publish_transaction(sandbox, "tx-r", [["003R1"], ["003R1", "003R2"]])
    assert stream_poll_once(stream_target()).receipts_created == 2
    more = _publish_transaction(sandbox, "tx-s", [["003S1"]])
    sandbox.set_faults(rewind=2, duplicate_delivery=1)  # re-serve the two admitted envelopes, each one twice
    result = stream_poll_once(stream_target())
    assert (result.fetched, result.receipts_created, result.receipts_resolved, result.events_created) == (6, 1, 5, 1)
    assert Receipt.objects.filter(account_key=STREAM_ACCOUNT).count() == len(first) + len(more)
    assert ReceiptAdmissionKey.objects.filter(account_key=STREAM_ACCOUNT).count() == len(first) + len(more)
    keys = list(Event.objects.filter(account_key=STREAM_ACCOUNT).values_list("source_event_key", flat=True))
    assert len(keys) == len(set(keys)) == 4
    assert bytes(_cursor().cursor) == encode_cursor(more[-1])


def test_a_dropped_connection_or_error_status_leaves_the_cursor_and_loses_nothing(stream_org):
    ids = _publish_transaction(stream_org.stream, "tx-d", [["003D1"], ["003D2"]])
    stream_org.stream.set_faults(drop_connection=1)
    with pytest.raises(StreamFetchFailed):
        stream_poll_once(stream_target())
    stream_org.stream.set_faults(fail_status={"status": 503, "count": 1})
    with pytest.raises(StreamFetchFailed):
        stream_poll_once(stream_target())
    assert _cursor().cursor is None and _cursor().batches == 0
    assert not Receipt.objects.filter(account_key=STREAM_ACCOUNT).exists()
    assert stream_poll_once(stream_target()).receipts_created == 2
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1])


def test_a_stopped_poller_fetches_nothing_and_keeps_its_cursor(stream_org):
    sandbox = stream_org.stream
    first = _publish_transaction(sandbox, "tx-p", [["003P1"]])
    stream_poll_once(stream_target())
    _publish_transaction(sandbox, "tx-q", [["003Q1"]])
    stopped = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--stop"], subprocess_env())
    assert stopped.returncode == 0, stopped.stderr
    fetches = sandbox.state()["fetches"]
    result = stream_poll_once(stream_target())
    assert result.stopped and result.fetched == 0
    assert sandbox.state()["fetches"] == fetches
    assert bytes(_cursor().cursor) == encode_cursor(first[-1]) and _cursor().state == "stopped"
    status = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--status"], subprocess_env())
    assert json.loads(status.stdout) == {"account": STREAM_ACCOUNT, "route": "contacts.changes", "state": "stopped",
                                         "cursor": str(first[-1]), "batches": 1}
    resumed = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--resume"], subprocess_env())
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["state"] == "active"
    assert stream_poll_once(stream_target()).receipts_created == 1


def test_stop_racing_an_inflight_batch_admits_it_but_does_not_advance_the_cursor(stream_org, monkeypatch):
    """The stop commits from another connection after the fetch; the batch's Receipts commit, the cursor stays."""
    import connectors.inbound.stream_poll as stream

    ids = _publish_transaction(stream_org.stream, "tx-x", [["003X1"], ["003X2"]])
    real_fetch = stream.fetch_batch

    def fetch_then_stop(**kwargs):
        batch = real_fetch(**kwargs)
        errors = []

        def operator_stops():
            try:
                stream_cursor_set_state(stream_target(), state="stopped")
            except Exception as exc:  # surfaced below
                errors.append(exc)
            finally:
                connection.close()

        worker = threading.Thread(target=operator_stops)
        worker.start()
        worker.join(30)
        assert not errors and not worker.is_alive()
        return batch

    monkeypatch.setattr(stream, "fetch_batch", fetch_then_stop)
    result = stream_poll_once(stream_target())
    assert (result.receipts_created, result.advanced) == (2, False)
    assert _cursor().cursor is None and _cursor().state == "stopped" and _cursor().batches == 0
    monkeypatch.setattr(stream, "fetch_batch", real_fetch)
    stream_cursor_set_state(stream_target(), state="active")
    again = stream_poll_once(stream_target())
    assert (again.receipts_created, again.receipts_resolved, again.advanced) == (0, 2, True)
    assert Event.objects.filter(account_key=STREAM_ACCOUNT).count() == 2
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1])


@pytest.mark.parametrize("failpoint,committed", [("stream.after_fetch", 0), ("admission.after_receipt_commit", 1),
                                                 ("stream.after_receipts_commit", 3)])
def test_partial_batch_recovery_after_a_poller_crash_materializes_every_component_and_event_once(stream_org, failpoint,
                                                                                               committed):
    """Crash a real poller process after (some of) a batch's Receipts committed and before the cursor moved.

    Seed 003 "Required proof": transport redelivery and partial batch recovery materialize every Component
    and live Event once without changing the original V2 epoch. ``admission.after_receipt_commit`` kills it
    after the first envelope's Receipt (a partial batch), ``stream.after_receipts_commit`` after all of them,
    ``stream.after_fetch`` before any.
    """
    sandbox = stream_org.stream
    ids = _publish_transaction(sandbox, "tx-k", [["003K1"], ["003K1", "003K2"], ["003K3"]])
    crashed = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--once"],
                         subprocess_env(NEXUS_FAILPOINTS=failpoint), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert Receipt.objects.filter(account_key=STREAM_ACCOUNT).count() == committed
    assert _cursor().cursor is None and _cursor().batches == 0  # never ahead of what committed
    restarted = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--until-idle"],
                           subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert Receipt.objects.filter(account_key=STREAM_ACCOUNT).count() == len(ids)
    assert ReceiptAdmissionKey.objects.filter(account_key=STREAM_ACCOUNT).count() == len(ids)
    assert ReceiptComponent.objects.filter(receipt__account_key=STREAM_ACCOUNT).count() == 4
    locators = sorted(Event.objects.filter(account_key=STREAM_ACCOUNT).values_list("source_locator", flat=True))
    assert locators == ["003K1", "003K1", "003K2", "003K3"]
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1]) and _cursor().batches == 1
    # Recovery never moves admitted work to another epoch: everything stays on the gate's one epoch.
    epoch_id = AccountServingGate.objects.get(account_key=STREAM_ACCOUNT).epoch_id
    assert set(Receipt.objects.filter(account_key=STREAM_ACCOUNT).values_list("epoch_id", flat=True)) == {epoch_id}
    assert set(Event.objects.filter(account_key=STREAM_ACCOUNT).values_list("epoch_id", flat=True)) == {epoch_id}


def test_the_stream_worker_role_polls_every_serving_pulled_route(stream_org):
    ids = _publish_transaction(stream_org.stream, "tx-w", [["003W1"], ["003W2", "003W3"]])
    worker = run_manage(["run_workers", "--role", "stream", "--until-idle"], subprocess_env(), timeout=120)
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert Event.objects.filter(account_key=STREAM_ACCOUNT).count() == 3
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1])


def test_the_poll_command_reports_bad_input_with_a_code_and_moves_nothing(stream_org):
    unknown = run_manage(["connector_stream_poll", "--account", "no-such-account", "--once"], subprocess_env())
    assert unknown.returncode == 1 and "unknown_stream" in unknown.stderr
    stream_org.stream.set_faults(fail_status={"status": 503, "count": 1})
    failed = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--once"], subprocess_env())
    assert failed.returncode == 1 and "stream_fetch_failed" in failed.stderr
    assert _cursor().cursor is None


def test_a_poll_of_an_account_that_does_not_serve_v2_is_refused_with_not_serving(stream_org):
    from django.db import transaction

    from connectors.serving.gates import gate_transition
    from connectors.store import AccountServingGateStore

    with transaction.atomic(durable=True):
        gate = AccountServingGateStore.lock_by_account(stream_org.org.org_id, STREAM_ACCOUNT)
        gate_transition(gate=gate, dst="halting_v2", evidence={"test": "halt"}, reason_code=halt_reason())
    refused = run_manage(["connector_stream_poll", "--account", STREAM_ACCOUNT, "--once"], subprocess_env())
    assert refused.returncode == 1 and "not_serving" in refused.stderr
    assert not StreamCursor.objects.filter(account_key=STREAM_ACCOUNT).exists()


def halt_reason() -> str:
    from connectors.transitions import ACCOUNT_SERVING_GATE
    from tests.kernel.rows import reason_for

    return reason_for(ACCOUNT_SERVING_GATE)


def test_the_webhook_ingress_refuses_a_pulled_channel(stream_org, client):
    response = client.post(f"/api/v2/ingress/{STREAM_ACCOUNT}/contact-changes/", data=b"[]",
                           content_type="application/json")
    assert response.status_code == 404 and response.json()["error"] == "unknown_ingress"


def test_concurrent_pollers_of_one_cursor_admit_each_envelope_once_and_advance_it_once(stream_org, monkeypatch):
    """Two pollers fetch the same batch, admit it concurrently (real transactions), and race the advance."""
    import connectors.inbound.stream_poll as stream

    ids = _publish_transaction(stream_org.stream, "tx-c", [["003C1"], ["003C1", "003C2"], ["003C3"]])
    real_fetch = stream.fetch_batch
    both_fetched = threading.Barrier(2, timeout=30)

    def fetch_together(**kwargs):
        assert not connection.in_atomic_block, "the fetch must not hold a transaction"
        batch = real_fetch(**kwargs)
        both_fetched.wait()
        return batch

    monkeypatch.setattr(stream, "fetch_batch", fetch_together)
    target = stream_target()
    stream.stream_cursor_for(target)
    results, errors = [], []

    def poller():
        try:
            results.append(stream_poll_once(target))
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=poller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(r.advanced for r in results) == [False, True]
    assert sum(r.receipts_created for r in results) == len(ids)
    assert sum(r.receipts_created + r.receipts_resolved for r in results) == 2 * len(ids)
    assert Receipt.objects.filter(account_key=STREAM_ACCOUNT).count() == len(ids)
    assert Event.objects.filter(account_key=STREAM_ACCOUNT).count() == 4
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1]) and _cursor().batches == 1


def test_an_envelope_without_a_usable_header_is_kept_quarantined_and_the_stream_goes_on(stream_org):
    broken = change_event(record_ids=["003B1"])
    del broken["data"]["payload"]["ChangeEventHeader"]["transactionKey"]
    unknown = change_event(change_type="MERGE", record_ids=["003B2"])
    ids = stream_org.stream.publish([broken, unknown, change_event(record_ids=["003B3"], transaction_key="tx-b")])
    result = stream_poll_once(stream_target())
    assert (result.receipts_created, result.events_created, result.quarantined) == (3, 1, 2)
    reasons = sorted(ReceiptComponent.objects.filter(receipt__account_key=STREAM_ACCOUNT, disposition="quarantined")
                     .values_list("reason_code", flat=True))
    assert reasons == ["item_kind_unsupported", "item_schema_invalid"]
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1])


def test_pulled_changes_apply_to_local_records_once_through_the_runtime(stream_org):
    """End to end: poll, redeliver, run the connector workers; each record is created once with its values."""
    from nexusflow.records.models import Record
    from runtime_outbox.models import ApplicationResult
    from tests.conftest import drain

    sandbox = stream_org.stream
    sandbox.publish([
        change_event(change_type="CREATE", record_ids=["003E1"], transaction_key="tx-e1",
                     fields={"LastName": "Ada", "FirstName": "Lovelace"}),
        change_event(change_type="CREATE", record_ids=["003E2"], transaction_key="tx-e2", fields={"LastName": "Bo"}),
        change_event(change_type="UPDATE", record_ids=["003E1"], transaction_key="tx-e3", fields={"Email": "a@x.io"}),
        change_event(change_type="UPDATE", record_ids=["003E2"], transaction_key="tx-e4", fields={"Email": "b@x.io"}),
        change_event(change_type="DELETE", record_ids=["003E9"], transaction_key="tx-e5"),
    ])
    stream_poll_once(stream_target())
    sandbox.set_faults(rewind=5, duplicate_delivery=1)
    stream_poll_once(stream_target())
    drain()
    records = {r.fields.get("lastname"): r.fields for r in Record.objects.filter(org_id=stream_org.org.org_id)}
    assert records == {"Ada": {"lastname": "Ada", "firstname": "Lovelace", "email": "a@x.io"},
                       "Bo": {"lastname": "Bo", "email": "b@x.io"}}
    assert Event.objects.filter(account_key=STREAM_ACCOUNT).count() == 5
    outcomes = sorted(ApplicationResult.objects.filter(org_id=stream_org.org.org_id).values_list("outcome", flat=True))
    assert outcomes == ["applied"] * 4 + ["noop"]  # the removal is recorded, not applied as an upsert


def test_sigterm_ends_a_running_poller_cleanly_at_its_committed_cursor(stream_org):
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    ids = _publish_transaction(stream_org.stream, "tx-t", [["003T1"], ["003T2"]])
    poller = subprocess.Popen([sys.executable, "manage.py", "connector_stream_poll", "--account", STREAM_ACCOUNT,
                               "--idle-sleep", "0.2"], cwd=ROOT, env=subprocess_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not StreamCursor.objects.filter(
                account_key=STREAM_ACCOUNT, batches__gte=1).exists():
            time.sleep(0.2)
        poller.send_signal(signal.SIGTERM)
        _out, err = poller.communicate(timeout=60)
    finally:
        if poller.poll() is None:
            poller.kill()
    assert poller.returncode == 0, err[-2000:]
    assert bytes(_cursor().cursor) == encode_cursor(ids[-1])
    assert Receipt.objects.filter(account_key=STREAM_ACCOUNT).count() == len(ids)


def test_a_transaction_of_several_changes_and_records_applies_every_item_in_sequence_order(stream_org):
    """strict_source_sequence per transactionKey: sequence 1 (two records) then 2; a gap waits, nothing is lost."""
    from nexusflow.records.models import Record
    from runtime_outbox.models import ApplicationResult
    from tests.conftest import drain

    sandbox = stream_org.stream
    sandbox.publish([
        change_event(change_type="CREATE", record_ids=["003T1", "003T2"], transaction_key="tx-many", sequence=1,
                     fields={"LastName": "Same"}),
        change_event(change_type="UPDATE", record_ids=["003T1"], transaction_key="tx-many", sequence=3,
                     fields={"Email": "three@x.io"}),
    ])
    stream_poll_once(stream_target())
    drain()
    # sequence 2 has not arrived: sequence 3 waits without a lease, both records of sequence 1 applied
    assert Execution.objects.filter(projection__event__account_key=STREAM_ACCOUNT, state="waiting_dependency").count() == 1
    assert Record.objects.filter(org_id=stream_org.org.org_id).count() == 2
    sandbox.publish([change_event(change_type="UPDATE", record_ids=["003T2"], transaction_key="tx-many", sequence=2,
                                  fields={"Email": "two@x.io"})])
    stream_poll_once(stream_target())
    drain()
    emails = sorted(r.fields.get("email") for r in Record.objects.filter(org_id=stream_org.org.org_id))
    assert emails == ["three@x.io", "two@x.io"]
    states = set(Execution.objects.filter(projection__event__account_key=STREAM_ACCOUNT).values_list("state", flat=True))
    assert states == {"completed"}
    assert ApplicationResult.objects.filter(org_id=stream_org.org.org_id).count() == 4
