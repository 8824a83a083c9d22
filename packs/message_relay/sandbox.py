"""Loopback message relay sandbox: a Resend-like ``/emails`` API and an in-app ``/notifications`` API of one
messaging provider, for demos and tests.

Endpoints (JSON in and out; every one needs ``Authorization: Bearer <api key>``, else 401):

- ``POST /emails`` ``{"to": "a@x.org,b@y.org" | [...], "subject", "text"?, "html"?, "from"?}`` -> 200
  ``{"id": "<uuid>"}``; ``from`` defaults to the sandbox's sender; ``to`` holds 1-50 addresses; a missing
  ``to``/``subject``, a body with neither ``text`` nor ``html``, an address without ``@`` or an unknown
  parameter is a 422 ``validation_error``;
- ``POST /notifications`` ``{"recipients": "u1,u2" | [...], "title", "body", "type"?, "target"?}`` -> 200
  ``{"id": "<uuid>"}``; ``recipients`` holds 1-500 user ids; a missing ``recipients``/``title``/``body`` or
  an unknown parameter is a 422 ``validation_error``;
- ``GET /emails/{id}``, ``GET /notifications/{id}`` -> 200 the message (``"object": "email"`` or
  ``"notification"``, its fields, ``created_at``, ``last_event: "delivered"``) or 404 ``not_found``;
- ``PATCH /emails/{id}``, ``PATCH /notifications/{id}`` -> 200 ``{"object", "id"}`` (nothing to change on a
  sent message) or 404.

Errors are shaped ``{"statusCode", "name", "message"}``.

``Idempotency-Key`` (1-256 characters) on a POST: the first executed result is replayed for a later
request with the same key, path and body; the same key with another body is a 409
``invalid_idempotent_request``, a key still executing a 409 ``concurrent_idempotent_requests``. Requests
rejected before execution (401, 422, injected ``fail_before_commit``) store nothing.

Test controls (no auth): ``GET /_sandbox/state`` -> ``{"emails": [{"id", "to", "from", "subject", "text",
"send_requests"}], "notifications": [{"id", "recipients", "title", "body", "type", "target",
"send_requests"}], "requests": n}`` (oldest first; ``send_requests`` counts the POSTs that created or
replayed the message); ``POST /_sandbox/reset``; ``GET|POST /_sandbox/faults`` with the write faults of
:func:`packs.sandbox_kit.write_faults` (``drop_response_after_commit``, ``fail_before_commit``,
``delay_seconds``) applied to both POSTs.

Run as a process: ``python -m packs.message_relay.sandbox --port 0 --api-key KEY --port-file PATH``.
"""
from __future__ import annotations

import datetime as dt
import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import SplitResult

from packs.sandbox_kit import LoopbackSandbox, Rejected, SandboxHandler, SandboxState, serve_process, write_faults

EMAIL_PARAMS = frozenset({"to", "subject", "text", "html", "from"})
NOTIFICATION_PARAMS = frozenset({"recipients", "title", "body", "type", "target"})
DEFAULT_SENDER = "Flows <flows@relay.invalid>"
MAX_RECIPIENTS = 50
MAX_NOTIFICATION_RECIPIENTS = 500
MAX_IDEMPOTENCY_KEY_LENGTH = 256
#: Collection path -> the ``object`` of its messages.
KINDS = {"emails": "email", "notifications": "notification"}
_MESSAGE_PATH = re.compile(r"/(emails|notifications)/([^/]+)")


def _error(status: int, name: str, message: str, headers: dict[str, str] | None = None) -> Rejected:
    return Rejected(status, {"statusCode": status, "name": name, "message": message}, headers or None,
                    message=message)


@dataclass(slots=True)
class _Key:
    request: tuple[str, dict[str, Any]]  # (collection, body)
    message_id: str | None = None  # None while the first request executes


@dataclass(slots=True)
class _State(SandboxState):
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    sends: dict[str, int] = field(default_factory=dict)
    keys: dict[str, _Key] = field(default_factory=dict)

    def forget(self) -> None:
        self.messages.clear()
        self.sends.clear()
        self.keys.clear()

    def snapshot(self) -> dict[str, Any]:
        shown = {"email": ("to", "from", "subject", "text"),
                 "notification": ("recipients", "title", "body", "type", "target")}
        with self.lock:
            out: dict[str, Any] = {"emails": [], "notifications": []}
            for m in self.messages.values():
                row = {"id": m["id"], **{k: m[k] for k in shown[m["object"]]}, "send_requests": self.sends[m["id"]]}
                out[m["object"] + "s"].append(row)
            out["requests"] = self.requests.count
            return out


class MessageRelaySandbox(LoopbackSandbox):
    """An in-process message relay on ``127.0.0.1`` (``with MessageRelaySandbox("re_test") as relay: ...``)."""

    handler_class: type[BaseHTTPRequestHandler]
    thread_name = "message-relay-sandbox"

    def __init__(self, api_key: str, *, port: int = 0):
        """Raises ValueError: an empty API key or a port outside 0-65535."""
        if not api_key:
            raise ValueError("api_key must be non-empty")
        super().__init__(_State(secret=api_key, faults=write_faults()), port=port)


class _Handler(SandboxHandler):
    def serve(self, method: str, url: SplitResult, body: bytes) -> None:
        self._authenticate()
        match = _MESSAGE_PATH.fullmatch(url.path)
        if method == "POST" and url.path == "/emails":
            self._send("emails", self._email(body))
        elif method == "POST" and url.path == "/notifications":
            self._send("notifications", self._notification(body))
        elif method in ("GET", "PATCH") and match:
            with self.server.state.lock:
                message = self.server.state.messages.get(match.group(2))
                found = dict(message) if message is not None and message["object"] == KINDS[match.group(1)] else None
            if found is None:
                raise _error(404, "not_found", f"{KINDS[match.group(1)].capitalize()} not found")
            self.send_json(200, found if method == "GET" else {"object": found["object"], "id": found["id"]})
        else:
            raise _error(404, "not_found", f"Unrecognized route {method} {url.path}")

    def invalid(self, message: str) -> dict[str, Any]:
        return {"statusCode": 400, "name": "validation_error", "message": message}

    def unknown_control(self, method: str, path: str) -> Rejected:
        return _error(404, "not_found", f"Unrecognized control route {method} {path}")

    def internal_error(self) -> dict[str, Any]:
        return {"statusCode": 500, "name": "internal_server_error", "message": "Unexpected sandbox error."}

    def _authenticate(self) -> None:
        scheme, _, key = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                key.encode("utf-8", "surrogateescape"), self.server.state.secret.encode("utf-8")):
            raise _error(401, "missing_api_key" if not key else "validation_error", "API key is invalid")

    def _body(self, body: bytes, params: frozenset[str]) -> dict[str, Any]:
        raw = self.parse_json(body)
        if not isinstance(raw, dict):
            raise _error(422, "validation_error", "The body must be a JSON object.")
        unknown = sorted(set(raw) - params)
        if unknown:
            raise _error(422, "validation_error", f"Unknown parameter `{unknown[0]}`.")
        return raw

    @staticmethod
    def _list(value: Any) -> list:
        items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else []
        return [item.strip() if isinstance(item, str) else item for item in items
                if not isinstance(item, str) or item.strip()]

    def _email(self, body: bytes) -> dict[str, Any]:
        raw = self._body(body, EMAIL_PARAMS)
        recipients = self._list(raw.get("to"))
        if not recipients or len(recipients) > MAX_RECIPIENTS or not all(
                isinstance(a, str) and "@" in a for a in recipients):
            raise _error(422, "validation_error", f"`to` holds 1-{MAX_RECIPIENTS} email addresses.")
        if not isinstance(raw.get("subject"), str) or not raw["subject"]:
            raise _error(422, "validation_error", "Missing `subject` field.")
        if not raw.get("text") and not raw.get("html"):
            raise _error(422, "validation_error", "Missing `text` or `html` field.")
        return {"to": recipients, "from": raw.get("from") or DEFAULT_SENDER, "subject": raw["subject"],
                "text": raw.get("text"), "html": raw.get("html")}

    def _notification(self, body: bytes) -> dict[str, Any]:
        raw = self._body(body, NOTIFICATION_PARAMS)
        recipients = self._list(raw.get("recipients"))
        if not recipients or len(recipients) > MAX_NOTIFICATION_RECIPIENTS or not all(
                isinstance(r, str) for r in recipients):
            raise _error(422, "validation_error", f"`recipients` holds 1-{MAX_NOTIFICATION_RECIPIENTS} user ids.")
        for name in ("title", "body"):
            if not isinstance(raw.get(name), str) or not raw[name]:
                raise _error(422, "validation_error", f"Missing `{name}` field.")
        return {"recipients": recipients, "title": raw["title"], "body": raw["body"], "type": raw.get("type"),
                "target": raw.get("target")}

    def _send(self, collection: str, message: dict[str, Any]) -> None:
        state = self.server.state
        key = self.headers.get("Idempotency-Key")
        if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH:
            raise _error(422, "validation_error", f"Idempotency-Key is 1-{MAX_IDEMPOTENCY_KEY_LENGTH} characters.")
        with state.lock:
            failure = state.faults.take_status("fail_before_commit")
            if failure is not None:
                raise _error(failure, "rate_limit_exceeded" if failure == 429 else "application_error",
                             "Injected failure before commit; nothing was sent.",
                             state.faults.status_headers("fail_before_commit"))
            entry = state.keys.get(key) if key is not None else None
            if entry is not None:
                if entry.request != (collection, message):
                    raise _error(409, "invalid_idempotent_request",
                                 "Same idempotency key used with a different request payload.")
                if entry.message_id is None:
                    raise _error(409, "concurrent_idempotent_requests",
                                 "Same idempotency key used while the original request is still in progress.")
                state.sends[entry.message_id] += 1
                drop = state.faults.take("drop_response_after_commit")
                replay = entry.message_id
            else:
                replay = None
                if key is not None:
                    state.keys[key] = _Key((collection, message))
        if replay is not None:
            self.drop_response() if drop else self.send_json(200, {"id": replay})
            return
        try:
            state.faults.wait("delay_seconds")
            with state.lock:
                message_id = str(uuid.uuid4())
                state.messages[message_id] = {"object": KINDS[collection], "id": message_id, **message,
                                              "created_at": dt.datetime.now(dt.UTC).isoformat(),
                                              "last_event": "delivered"}
                state.sends[message_id] = 1
                if key is not None and key in state.keys:
                    state.keys[key].message_id = message_id
                drop = state.faults.take("drop_response_after_commit")
        except BaseException:
            if key is not None:
                with state.lock:
                    if key in state.keys and state.keys[key].message_id is None:
                        del state.keys[key]
            raise
        self.drop_response() if drop else self.send_json(200, {"id": message_id})


MessageRelaySandbox.handler_class = _Handler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the sandbox as a process until SIGTERM/SIGINT; return the exit status."""
    return serve_process(argv, description="Loopback message relay sandbox (emails, notifications).",
                         secret_flag="--api-key", secret_help="the bearer key clients must present",
                         build=MessageRelaySandbox)


if __name__ == "__main__":
    raise SystemExit(main())
