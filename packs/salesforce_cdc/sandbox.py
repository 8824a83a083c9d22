"""Loopback Change Data Capture stream sandbox: serves change envelopes by opaque ``replayId``.

Endpoints (JSON responses, ``Content-Type: application/json``):

- ``GET /stream/events?topic=<channel>[&after=<replayId>][&limit=N]`` with
  ``Authorization: Bearer <token>`` -> 200 ``{"events": [<envelope>...],
  "latestReplayId": <replayId of the last served event, or ``after``>}``:
  the events of ``topic`` published after the one whose ``replayId`` is
  ``after`` (from the earliest retained when ``after`` is absent), oldest
  first, at most ``limit`` (1-200, default 50). ``after`` is compared as the
  exact text of a served ``replayId``; an unknown or expired one is a 400
  ``[{"errorCode": "INVALID_REPLAY_ID", "message"}]``; a missing token 401
  ``[{"errorCode": "INVALID_SESSION_ID", ...}]``.

``replayId`` values are opaque and not contiguous: each publish adds a random
gap, so a client can never compute one from another.

Test controls (no auth): ``POST /_sandbox/publish`` with one envelope or a
list (``data.event.replayId`` is assigned; ``channel`` is kept) ->
``{"replayIds": [...]}``; ``GET /_sandbox/state`` -> ``{"events": n,
"fetches": n, "served": n, "faults": {...}}``; ``POST /_sandbox/reset``;
``GET|POST /_sandbox/faults`` with any of ``{"drop_connection": N}`` (the
next N fetches close the connection without a response),
``{"duplicate_delivery": N}`` (the next N fetches serve every event of the
batch twice in a row), ``{"rewind": N}`` (the next fetch starts N events
before ``after``: a redelivered overlap), ``{"fail_status": {"status": S,
"count": N}}`` (the next N fetches answer S with an error body).

Run as a process: ``python -m packs.salesforce_cdc.sandbox --port 0 --token
TOKEN --port-file PATH`` serves until SIGTERM or SIGINT.
"""
from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import SplitResult, parse_qs

from packs.sandbox_kit import (
    Count,
    FaultScript,
    LoopbackSandbox,
    Rejected,
    SandboxHandler,
    SandboxState,
    StatusCount,
    serve_process,
)

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
MAX_BODY_BYTES = 5_000_000


def _rejected(status: int, code: str, message: str) -> Rejected:
    """A request error answered as ``[{"errorCode": code, "message": message}]``."""
    return Rejected(status, [{"errorCode": code, "message": message}], message=message)


def _stream_faults() -> FaultScript:
    """The faults the next fetches meet (see the module docstring)."""
    return FaultScript(Count("drop_connection"), Count("duplicate_delivery"), Count("rewind"),
                       StatusCount("fail_status", default_status=503))


@dataclass(slots=True)
class _State(SandboxState):
    """The published stream (``secret`` is the bearer token); guarded by ``lock``."""

    events: list[dict[str, Any]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    next_replay: int = field(default_factory=lambda: 1000 + secrets.randbelow(9000))
    fetches: int = 0
    served: int = 0

    def publish(self, envelopes: list[Any]) -> list[int]:
        ids = []
        with self.lock:
            for envelope in envelopes:
                if not isinstance(envelope, dict) or not isinstance(envelope.get("data"), dict):
                    raise _rejected(400, "INVALID_FIELD", "an envelope is an object with a 'data' object")
                stored = copy.deepcopy(envelope)
                self.next_replay += 1 + secrets.randbelow(97)  # opaque: gaps of random size
                replay_id = self.next_replay
                stored["data"].setdefault("event", {})
                stored["data"]["event"]["replayId"] = replay_id
                self.index[str(replay_id)] = len(self.events)
                self.events.append(stored)
                ids.append(replay_id)
        return ids

    def fetch(self, topic: str, after: str | None, limit: int) -> dict[str, Any] | None:
        """The fetch response, or ``None`` when the connection must be dropped."""
        with self.lock:
            self.fetches += 1
            if self.faults.take("drop_connection"):
                return None
            failure = self.faults.take_status("fail_status")
            if failure is not None:
                raise _rejected(failure, "SERVICE_UNAVAILABLE", "injected failure; retry later")
            if after is None:
                start = 0
            elif after in self.index:
                start = self.index[after] + 1
            else:
                raise _rejected(400, "INVALID_REPLAY_ID", f"replayId {after} is not retained")
            start = max(0, start - self.faults.take_all("rewind"))
            batch = [e for e in self.events[start:] if e.get("channel") == topic][:limit]
            if batch and self.faults.take("duplicate_delivery"):
                batch = [copy.deepcopy(e) for e in batch for _ in range(2)]
            self.served += len(batch)
            latest = batch[-1]["data"]["event"]["replayId"] if batch else (None if after is None else _opaque(after))
            return {"events": copy.deepcopy(batch), "latestReplayId": latest}

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"events": len(self.events), "fetches": self.fetches, "served": self.served,
                    "faults": self.faults.as_dict()}

    def forget(self) -> None:
        self.events.clear()
        self.index.clear()
        self.fetches = self.served = 0


def _opaque(text: str) -> Any:
    """Hand ``after`` back in the type the stream served it (an integer here)."""
    return int(text) if text.isdigit() else text


class StreamSandbox(LoopbackSandbox):
    """An in-process stream sandbox on ``127.0.0.1``, served from a daemon thread.

    Usage::

        with StreamSandbox("token") as sandbox:
            sandbox.publish([change_event(...)])
    """

    handler_class: type[BaseHTTPRequestHandler]  # set below, once _Handler exists
    thread_name = "stream-sandbox"

    def __init__(self, token: str, *, port: int = 0):
        """Prepare a sandbox accepting ``Bearer token``; ``port`` 0 picks a free port.

        Raises:
            ValueError: an empty token or a port outside 0-65535.
        """
        if not token:
            raise ValueError("token must be non-empty")
        super().__init__(_State(secret=token, faults=_stream_faults()), port=port)

    def publish(self, envelopes: dict[str, Any] | list[dict[str, Any]]) -> list[int]:
        """Append envelopes to the stream and return their assigned ``replayId`` values.

        Raises:
            ValueError: an envelope without a ``data`` object.
        """
        try:
            return self._state.publish(envelopes if isinstance(envelopes, list) else [envelopes])
        except Rejected as exc:
            raise ValueError(str(exc)) from exc


class _Handler(SandboxHandler):
    max_body_bytes = MAX_BODY_BYTES
    refuse_chunked = False
    counts_requests = False  # the stream counts fetches and served events instead

    def serve(self, method: str, url: SplitResult, body: bytes) -> None:
        state = self.server.state
        if (method, url.path) != ("GET", "/stream/events"):
            raise _rejected(404, "NOT_FOUND", f"no resource {method} {url.path}")
        if self.headers.get("Authorization") != f"Bearer {state.secret}":
            raise _rejected(401, "INVALID_SESSION_ID", "Session expired or invalid")
        query = parse_qs(url.query, keep_blank_values=True)
        topic = (query.get("topic") or [""])[0]
        if not topic:
            raise _rejected(400, "INVALID_FIELD", "topic is required")
        after = query.get("after", [None])[0]
        limit_text = (query.get("limit") or [str(DEFAULT_LIMIT)])[0]
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
            raise _rejected(400, "INVALID_FIELD", f"limit must be 1-{MAX_LIMIT}")
        response = state.fetch(topic, after, int(limit_text))
        if response is None:
            self.drop_response()  # no status line, no body
            return
        self.send_json(200, response)

    def extra_control(self, method: str, path: str, body: bytes) -> Any:
        if (method, path) == ("POST", "/_sandbox/publish"):
            envelopes = self.parse_json(body)
            return {"replayIds": self.server.state.publish(envelopes if isinstance(envelopes, list) else [envelopes])}
        raise self.unknown_control(method, path)

    def reset_answer(self) -> Any:
        return self.server.state.snapshot()

    def parse_json(self, body: bytes) -> Any:
        """The body as JSON (empty: ``null``). Raises Rejected 400."""
        try:
            return json.loads(body.decode("utf-8") or "null")
        except (UnicodeError, ValueError):
            raise _rejected(400, "JSON_PARSER_ERROR", "the body is not JSON") from None

    def invalid(self, message: str) -> list[dict[str, str]]:
        return [{"errorCode": "INVALID_FIELD", "message": message}]

    def unknown_control(self, method: str, path: str) -> Rejected:
        return _rejected(404, "NOT_FOUND", f"no control {method} {path}")

    def internal_error(self) -> list[dict[str, str]]:
        return [{"errorCode": "UNKNOWN_EXCEPTION", "message": "unexpected sandbox error"}]


StreamSandbox.handler_class = _Handler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the sandbox as a process until SIGTERM/SIGINT; return the exit status."""
    return serve_process(argv, description="Loopback change-data-capture stream sandbox.", secret_flag="--token",
                         secret_help="the bearer token clients must present", build=StreamSandbox)


if __name__ == "__main__":
    raise SystemExit(main())
