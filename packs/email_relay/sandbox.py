"""Loopback email relay sandbox: a Resend-like ``/emails`` API for demos and tests.

Endpoints (JSON in and out; every one needs ``Authorization: Bearer <api key>``, else 401):

- ``POST /emails`` ``{"to": "a@x.org,b@y.org" | [...], "subject", "text"?, "html"?, "from"?}`` -> 200
  ``{"id": "<uuid>"}``; ``from`` defaults to the sandbox's sender; ``to`` holds 1-50 addresses; a missing
  ``to``/``subject``, a body with neither ``text`` nor ``html``, an address without ``@`` or an unknown
  parameter is a 422 ``validation_error``;
- ``GET /emails/{id}`` -> 200 ``{"object": "email", "id", "to": [...], "from", "subject", "text", "html",
  "created_at", "last_event": "delivered"}`` or 404 ``not_found``;
- ``PATCH /emails/{id}`` -> 200 ``{"object": "email", "id"}`` (nothing to change on a sent email) or 404.

Errors are shaped ``{"statusCode", "name", "message"}``.

``Idempotency-Key`` (1-256 characters) on ``POST /emails``: the first executed result is replayed for a
later request with the same key and body; the same key with another body is a 409
``invalid_idempotent_request``, a key still executing a 409 ``concurrent_idempotent_requests``. Requests
rejected before execution (401, 422, injected ``fail_before_commit``) store nothing.

Test controls (no auth): ``GET /_sandbox/state`` -> ``{"emails": [{"id", "to", "from", "subject", "text",
"send_requests"}], "requests": n}`` (oldest first; ``send_requests`` counts the POSTs that created or
replayed the email); ``POST /_sandbox/reset``; ``GET|POST /_sandbox/faults`` with the write faults of
:func:`packs.sandbox_kit.write_faults` (``drop_response_after_commit``, ``fail_before_commit``,
``delay_seconds``) applied to ``POST /emails``.

Run as a process: ``python -m packs.email_relay.sandbox --port 0 --api-key KEY --port-file PATH``.
"""
from __future__ import annotations

import datetime as dt
import re
import secrets
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Sequence
from urllib.parse import SplitResult

from packs.sandbox_kit import LoopbackSandbox, Rejected, SandboxHandler, SandboxState, serve_process, write_faults

SEND_PARAMS = frozenset({"to", "subject", "text", "html", "from"})
DEFAULT_SENDER = "Flows <flows@relay.invalid>"
MAX_RECIPIENTS = 50
MAX_IDEMPOTENCY_KEY_LENGTH = 256
_EMAIL_PATH = re.compile(r"/emails/([^/]+)")


def _error(status: int, name: str, message: str, headers: dict[str, str] | None = None) -> Rejected:
    return Rejected(status, {"statusCode": status, "name": name, "message": message}, headers or None,
                    message=message)


@dataclass(slots=True)
class _Key:
    body: dict[str, Any]
    email_id: str | None = None  # None while the first request executes


@dataclass(slots=True)
class _State(SandboxState):
    emails: dict[str, dict[str, Any]] = field(default_factory=dict)
    sends: dict[str, int] = field(default_factory=dict)
    keys: dict[str, _Key] = field(default_factory=dict)

    def forget(self) -> None:
        self.emails.clear()
        self.sends.clear()
        self.keys.clear()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"emails": [{"id": e["id"], "to": list(e["to"]), "from": e["from"], "subject": e["subject"],
                                "text": e["text"], "send_requests": self.sends[e["id"]]}
                               for e in self.emails.values()],
                    "requests": self.requests.count}


class EmailRelaySandbox(LoopbackSandbox):
    """An in-process email relay on ``127.0.0.1`` (``with EmailRelaySandbox("re_test") as relay: ...``)."""

    handler_class: type[BaseHTTPRequestHandler]
    thread_name = "email-relay-sandbox"

    def __init__(self, api_key: str, *, port: int = 0):
        """Raises ValueError: an empty API key or a port outside 0-65535."""
        if not api_key:
            raise ValueError("api_key must be non-empty")
        super().__init__(_State(secret=api_key, faults=write_faults()), port=port)


class _Handler(SandboxHandler):
    def serve(self, method: str, url: SplitResult, body: bytes) -> None:
        self._authenticate()
        match = _EMAIL_PATH.fullmatch(url.path)
        if method == "POST" and url.path == "/emails":
            self._send(self._message(body))
        elif method in ("GET", "PATCH") and match:
            with self.server.state.lock:
                email = self.server.state.emails.get(match.group(1))
                found = dict(email) if email is not None else None
            if found is None:
                raise _error(404, "not_found", "Email not found")
            self.send_json(200, found if method == "GET" else {"object": "email", "id": found["id"]})
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

    def _message(self, body: bytes) -> dict[str, Any]:
        raw = self.parse_json(body)
        if not isinstance(raw, dict):
            raise _error(422, "validation_error", "The body must be a JSON object.")
        unknown = sorted(set(raw) - SEND_PARAMS)
        if unknown:
            raise _error(422, "validation_error", f"Unknown parameter `{unknown[0]}`.")
        to = raw.get("to")
        recipients = [a.strip() for a in (to.split(",") if isinstance(to, str) else to or []) if str(a).strip()]
        if not recipients or len(recipients) > MAX_RECIPIENTS or not all(
                isinstance(a, str) and "@" in a for a in recipients):
            raise _error(422, "validation_error", f"`to` holds 1-{MAX_RECIPIENTS} email addresses.")
        if not isinstance(raw.get("subject"), str) or not raw["subject"]:
            raise _error(422, "validation_error", "Missing `subject` field.")
        if not raw.get("text") and not raw.get("html"):
            raise _error(422, "validation_error", "Missing `text` or `html` field.")
        return {"to": recipients, "from": raw.get("from") or DEFAULT_SENDER, "subject": raw["subject"],
                "text": raw.get("text"), "html": raw.get("html")}

    def _send(self, message: dict[str, Any]) -> None:
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
                if entry.body != message:
                    raise _error(409, "invalid_idempotent_request",
                                 "Same idempotency key used with a different request payload.")
                if entry.email_id is None:
                    raise _error(409, "concurrent_idempotent_requests",
                                 "Same idempotency key used while the original request is still in progress.")
                state.sends[entry.email_id] += 1
                drop = state.faults.take("drop_response_after_commit")
                replay = entry.email_id
            else:
                replay = None
                if key is not None:
                    state.keys[key] = _Key(message)
        if replay is not None:
            self.drop_response() if drop else self.send_json(200, {"id": replay})
            return
        try:
            state.faults.wait("delay_seconds")
            with state.lock:
                email_id = str(uuid.uuid4())
                state.emails[email_id] = {"object": "email", "id": email_id, **message,
                                          "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                                          "last_event": "delivered"}
                state.sends[email_id] = 1
                if key is not None and key in state.keys:
                    state.keys[key].email_id = email_id
                drop = state.faults.take("drop_response_after_commit")
        except BaseException:
            if key is not None:
                with state.lock:
                    if key in state.keys and state.keys[key].email_id is None:
                        del state.keys[key]
            raise
        self.drop_response() if drop else self.send_json(200, {"id": email_id})


EmailRelaySandbox.handler_class = _Handler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the sandbox as a process until SIGTERM/SIGINT; return the exit status."""
    return serve_process(argv, description="Loopback email relay sandbox.", secret_flag="--api-key",
                         secret_help="the bearer key clients must present", build=EmailRelaySandbox)


if __name__ == "__main__":
    raise SystemExit(main())
