"""The webhook sender signs like the provider and retries 503 like the provider."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from connectors.contracts.signatures import SignatureError, verify_request
from packs.hubspot import webhook_route
from packs.hubspot.fixtures.make_demo_webhooks import OUTPUT_PATH
from packs.hubspot.sender import Delivery, deliver_all, load_deliveries

SECRET = b"client-secret-0f1e2d"
AUTH = webhook_route()["auth"]


@dataclass
class Recorded:
    url: str
    headers: dict[str, str]
    body: bytes
    outcome: str


@dataclass
class Receiver:
    """A tiny webhook endpoint that verifies signatures and records requests."""

    url: str
    requests: list[Recorded] = field(default_factory=list)
    scripted: list[tuple[int, str | None]] = field(default_factory=list)  # (status, Retry-After) served first


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            url = f"http://{self.headers['Host']}{self.path}"
            headers = dict(self.headers.items())
            try:
                verify_request(AUTH, secret=SECRET, method="POST", url=url, body=body, headers=headers,
                               now_epoch_seconds=time.time())
                outcome = "ok"
            except SignatureError as exc:
                outcome = exc.code
            with lock:
                state.requests.append(Recorded(url, headers, body, outcome))
                scripted = state.scripted.pop(0) if state.scripted else None
            if scripted is not None:
                status, retry_after = scripted
                payload: dict[str, Any] = {"status": "busy"}
            else:
                status, retry_after = (200, None) if outcome == "ok" else (401, None)
                payload = {"outcome": outcome}
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/ingress/webhooks/acct-1?route=contacts")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


EVENTS = [{"eventId": 5, "subscriptionId": 7, "occurredAt": 1735725600000, "objectId": 9,
           "subscriptionType": "contact.propertyChange", "propertyName": "firstname", "propertyValue": "Zoë"}]


def test_sign_modes_meet_the_verifier(receiver: Receiver) -> None:
    deliveries = [Delivery(EVENTS, "valid"), Delivery(EVENTS, "invalid"), Delivery(EVENTS, "stale"),
                  Delivery(EVENTS, "missing"), Delivery("not json", "valid")]
    results = deliver_all(deliveries, url=receiver.url, secret=SECRET)
    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    assert [r.status for r in results] == [200, 401, 401, 401, 200]
    assert [r.attempts for r in results] == [1, 1, 1, 1, 1]
    assert [r.outcome for r in receiver.requests] == [
        "ok", "signature_invalid", "signature_stale", "signature_missing", "ok"]
    assert results[1].response == {"outcome": "signature_invalid"}
    assert all(r.url == receiver.url for r in receiver.requests)
    assert receiver.requests[0].body == json.dumps(EVENTS, separators=(",", ":")).encode()
    assert receiver.requests[4].body == b"not json"
    lowered = [{k.lower() for k in r.headers} for r in receiver.requests]
    assert {"x-hubspot-signature-v3", "x-hubspot-request-timestamp"} <= lowered[0]
    assert not {"x-hubspot-signature-v3", "x-hubspot-request-timestamp"} & lowered[3]
    stale_ts = int(receiver.requests[2].headers["X-HubSpot-Request-Timestamp"])
    assert abs(time.time() * 1000 - stale_ts - 600_000) < 30_000


def test_string_body_is_sent_verbatim_as_utf8(receiver: Receiver) -> None:
    text = '[{"propertyValue":"李 Øyvind"}]'
    deliver_all([Delivery(text)], url=receiver.url, secret=SECRET)
    assert receiver.requests[0].body == text.encode("utf-8")
    assert receiver.requests[0].outcome == "ok"


def test_503_is_retried_after_capped_retry_after(receiver: Receiver) -> None:
    receiver.scripted = [(503, "7"), (503, "0"), (503, None)]
    waits: list[float] = []
    with httpx.Client(timeout=5) as client:
        results = deliver_all([Delivery(EVENTS), Delivery(EVENTS)], url=receiver.url, secret=SECRET,
                              client=client, sleep=waits.append)
    assert waits == [2.0, 0.0, 1.0]
    assert [(r.status, r.attempts) for r in results] == [(200, 4), (200, 1)]
    assert results[0].retry_after is None
    assert [r.outcome for r in receiver.requests] == ["ok"] * 5
    assert len({r.body for r in receiver.requests}) == 1


def test_503_gives_up_after_30_tries(receiver: Receiver) -> None:
    receiver.scripted = [(503, "1")] * 40
    waits: list[float] = []
    [result] = deliver_all([Delivery(EVENTS)], url=receiver.url, secret=SECRET, sleep=waits.append)
    assert (result.status, result.attempts, result.retry_after) == (503, 30, "1")
    assert result.response == {"status": "busy"}
    assert len(waits) == 29
    assert len(receiver.requests) == 30


def test_non_retryable_errors_are_not_retried(receiver: Receiver) -> None:
    receiver.scripted = [(500, "1")]
    [result] = deliver_all([Delivery(EVENTS)], url=receiver.url, secret=SECRET, sleep=lambda _: None)
    assert (result.status, result.attempts, result.retry_after) == (500, 1, "1")


def test_load_deliveries(tmp_path: Path) -> None:
    path = tmp_path / "deliveries.jsonl"
    path.write_text('{"body": [{"a": 1}]}\n\n{"body": "not json", "sign": "stale"}\n', encoding="utf-8")
    assert load_deliveries(path) == [Delivery([{"a": 1}], "valid"), Delivery("not json", "stale")]


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"sign": "valid"}', "missing 'body'"),
        ('{"body": 3}', "array or a string"),
        ('{"body": [], "sign": "forged"}', "'sign'"),
        ('{"body": [], "extra": 1}', "unknown key"),
    ],
)
def test_load_deliveries_names_the_bad_line(tmp_path: Path, line: str, fragment: str) -> None:
    path = tmp_path / "deliveries.jsonl"
    path.write_text('{"body": []}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"line 2: .*{fragment}"):
        load_deliveries(path)


def test_demo_file_signatures_verify_as_declared(receiver: Receiver) -> None:
    deliveries = load_deliveries(OUTPUT_PATH)
    results = deliver_all(deliveries, url=receiver.url, secret=SECRET)
    expected = {"valid": "ok", "invalid": "signature_invalid", "stale": "signature_stale",
                "missing": "signature_missing"}
    assert [r.outcome for r in receiver.requests] == [expected[d.sign] for d in deliveries]
    assert [r.body for r in receiver.requests] == [d.body_bytes() for d in deliveries]
    assert len(results) == len(deliveries)


def test_429_is_retried_like_503(receiver: Receiver) -> None:
    receiver.scripted = [(429, "0.5")]
    waits: list[float] = []
    [result] = deliver_all([Delivery(EVENTS)], url=receiver.url, secret=SECRET, sleep=waits.append)
    assert (result.status, result.attempts, waits) == (200, 2, [0.5])
