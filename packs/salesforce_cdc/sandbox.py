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
import logging
import secrets
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Sequence
from urllib.parse import parse_qs, urlsplit

from packs.loopback import LoopbackSandbox, LoopbackServer, serve_process

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
MAX_BODY_BYTES = 5_000_000


class _Rejected(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(slots=True)
class _Faults:
    drop_connection: int = 0
    duplicate_delivery: int = 0
    rewind: int = 0
    fail_status: int = 503
    fail_count: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"drop_connection": self.drop_connection, "duplicate_delivery": self.duplicate_delivery,
                "rewind": self.rewind, "fail_status": {"status": self.fail_status, "count": self.fail_count}}


@dataclass(slots=True)
class _State:
    token: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: list[dict[str, Any]] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    next_replay: int = field(default_factory=lambda: 1000 + secrets.randbelow(9000))
    faults: _Faults = field(default_factory=_Faults)
    fetches: int = 0
    served: int = 0

    def publish(self, envelopes: list[Any]) -> list[int]:
        ids = []
        with self.lock:
            for envelope in envelopes:
                if not isinstance(envelope, dict) or not isinstance(envelope.get("data"), dict):
                    raise _Rejected(400, "INVALID_FIELD", "an envelope is an object with a 'data' object")
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
            if self.faults.drop_connection:
                self.faults.drop_connection -= 1
                return None
            if self.faults.fail_count:
                self.faults.fail_count -= 1
                raise _Rejected(self.faults.fail_status, "SERVICE_UNAVAILABLE", "injected failure; retry later")
            if after is None:
                start = 0
            elif after in self.index:
                start = self.index[after] + 1
            else:
                raise _Rejected(400, "INVALID_REPLAY_ID", f"replayId {after} is not retained")
            if self.faults.rewind:
                start, self.faults.rewind = max(0, start - self.faults.rewind), 0
            batch = [e for e in self.events[start:] if e.get("channel") == topic][:limit]
            if self.faults.duplicate_delivery and batch:
                self.faults.duplicate_delivery -= 1
                batch = [copy.deepcopy(e) for e in batch for _ in range(2)]
            self.served += len(batch)
            latest = batch[-1]["data"]["event"]["replayId"] if batch else (None if after is None else _opaque(after))
            return {"events": copy.deepcopy(batch), "latestReplayId": latest}

    def apply_faults(self, spec: Any) -> dict[str, Any]:
        if not isinstance(spec, dict):
            raise _Rejected(400, "INVALID_FIELD", "faults must be a JSON object")
        with self.lock:
            for name, value in spec.items():
                if name in ("drop_connection", "duplicate_delivery", "rewind"):
                    setattr(self.faults, name, _count(value, name))
                elif name == "fail_status":
                    if not isinstance(value, dict):
                        raise _Rejected(400, "INVALID_FIELD", "fail_status is {status, count}")
                    status = value.get("status", 503)
                    if not isinstance(status, int) or not 400 <= status <= 599:
                        raise _Rejected(400, "INVALID_FIELD", "fail_status.status must be 400-599")
                    self.faults.fail_status, self.faults.fail_count = status, _count(value.get("count", 1), "count")
                else:
                    raise _Rejected(400, "INVALID_FIELD", f"unknown fault {name!r}")
            return self.faults.as_dict()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"events": len(self.events), "fetches": self.fetches, "served": self.served,
                    "faults": self.faults.as_dict()}

    def reset(self) -> None:
        with self.lock:
            self.events.clear()
            self.index.clear()
            self.faults = _Faults()
            self.fetches = self.served = 0


def _opaque(text: str) -> Any:
    """Hand ``after`` back in the type the stream served it (an integer here)."""
    return int(text) if text.isdigit() else text


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Rejected(400, "INVALID_FIELD", f"{name} must be a non-negative integer")
    return value


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
        super().__init__(_State(token=token), port=port)

    def publish(self, envelopes: dict[str, Any] | list[dict[str, Any]]) -> list[int]:
        """Append envelopes to the stream and return their assigned ``replayId`` values.

        Raises:
            ValueError: an envelope without a ``data`` object.
        """
        try:
            return self._state.publish(envelopes if isinstance(envelopes, list) else [envelopes])
        except _Rejected as exc:
            raise ValueError(exc.message) from exc

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Merge faults as ``POST /_sandbox/faults`` does; return the faults in force.

        Raises:
            ValueError: an unknown fault or an out-of-range value.
        """
        try:
            return self._state.apply_faults(faults)
        except _Rejected as exc:
            raise ValueError(exc.message) from exc


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: LoopbackServer

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("stream sandbox: " + format, *args)

    def _dispatch(self, method: str) -> None:
        state = self.server.state
        url = urlsplit(self.path)
        try:
            body = self._read_body()
            if url.path.startswith("/_sandbox/"):
                self._control(method, url.path, body)
                return
            if (method, url.path) != ("GET", "/stream/events"):
                raise _Rejected(404, "NOT_FOUND", f"no resource {method} {url.path}")
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                raise _Rejected(401, "INVALID_SESSION_ID", "Session expired or invalid")
            query = parse_qs(url.query, keep_blank_values=True)
            topic = (query.get("topic") or [""])[0]
            if not topic:
                raise _Rejected(400, "INVALID_FIELD", "topic is required")
            after = query.get("after", [None])[0]
            limit_text = (query.get("limit") or [str(DEFAULT_LIMIT)])[0]
            if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
                raise _Rejected(400, "INVALID_FIELD", f"limit must be 1-{MAX_LIMIT}")
            response = state.fetch(topic, after, int(limit_text))
            if response is None:
                self.close_connection = True  # dropped: no status line, no body
                return
            self._respond(200, response)
        except _Rejected as exc:
            self._respond(exc.status, [{"errorCode": exc.code, "message": exc.message}])

    def _control(self, method: str, path: str, body: bytes) -> None:
        state = self.server.state
        if (method, path) == ("GET", "/_sandbox/state"):
            self._respond(200, state.snapshot())
        elif (method, path) == ("POST", "/_sandbox/reset"):
            state.reset()
            self._respond(200, state.snapshot())
        elif (method, path) == ("POST", "/_sandbox/publish"):
            envelopes = _json(body)
            self._respond(200, {"replayIds": state.publish(envelopes if isinstance(envelopes, list) else [envelopes])})
        elif path == "/_sandbox/faults" and method in ("GET", "POST"):
            self._respond(200, state.apply_faults(_json(body)) if method == "POST" else state.faults.as_dict())
        else:
            raise _Rejected(404, "NOT_FOUND", f"no control {method} {path}")

    def _read_body(self) -> bytes:
        length_text = self.headers.get("Content-Length") or "0"
        if not length_text.isdigit() or int(length_text) > MAX_BODY_BYTES:
            self.close_connection = True
            raise _Rejected(400, "INVALID_FIELD", "invalid or too large Content-Length")
        length = int(length_text)
        return self.rfile.read(length) if length else b""

    def _respond(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        self.send_response(status, phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8") or "null")
    except (UnicodeError, ValueError):
        raise _Rejected(400, "JSON_PARSER_ERROR", "the body is not JSON") from None


StreamSandbox.handler_class = _Handler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the sandbox as a process until SIGTERM/SIGINT; return the exit status."""
    return serve_process(argv, description="Loopback change-data-capture stream sandbox.", secret_flag="--token",
                         secret_help="the bearer token clients must present", build=lambda secret, port: StreamSandbox(secret, port=port))


if __name__ == "__main__":
    raise SystemExit(main())
