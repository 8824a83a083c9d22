"""Loopback billing sandbox: a Stripe-like customers API for demos and tests.

Endpoints (all JSON responses, ``Content-Type: application/json``):

- ``POST /v1/customers`` -> 200 customer ``{"id": "cus_...", "object": "customer",
  "email", "name", "created"}`` (``created`` in Unix seconds);
- ``POST /v1/customers/{id}`` -> 200 updated customer, 404 ``resource_missing``;
- ``GET /v1/customers/{id}`` -> 200 customer or 404;
- ``GET /v1/customers[?email=&limit=&starting_after=]`` -> 200
  ``{"object": "list", "data": [...], "has_more": bool, "url": "/v1/customers"}``,
  newest first, ``limit`` 1-100 (default 10).

POST parameters are ``email`` and ``name``, form-encoded (as the provider
expects) or a JSON object; an empty string unsets a field; any other
parameter is a 400 ``parameter_unknown``. Every ``/v1`` request needs
``Authorization: Bearer <api key>`` (401 otherwise). Errors are shaped
``{"error": {"type", "code"?, "message", "param"?}}``.

``Idempotency-Key`` (1-255 characters) on a POST: the first executed result,
status and body, is stored and replayed (header ``Idempotent-Replayed: true``)
for later requests with the same key and parameters; the same key with other
parameters or another path is a 400 ``idempotency_error``; a request whose
key is still being executed gets 409 ``idempotency_key_in_use``. Requests
rejected before execution (401, 400 validation, injected
``fail_before_commit``) store nothing.

Per customer the sandbox counts ``create_requests`` (create requests that
created or replayed this customer) and ``update_requests`` (update requests
that reached it, replays included).

Test controls (no auth): ``GET /_sandbox/state`` ->
``{"customers": [{"id", "email", "name", "create_requests", "update_requests"}],
"requests": <API requests received, any path outside /_sandbox>}`` (customers oldest first);
``POST /_sandbox/reset``; ``GET|POST /_sandbox/faults`` with any of
``{"drop_response_after_commit": N}`` (the next N executed or replayed
create/update requests are stored, then the connection is closed without a
response), ``{"fail_before_commit": {"status": S, "count": N, "headers": {...}}}`` (the
next N create/update requests get status S, with the optional headers such as
``Retry-After``, and are not executed) and
``{"delay_seconds": X}`` (every create/update waits X seconds after claiming
its idempotency key and before executing, until changed).

Run as a process: ``python -m packs.billing.sandbox --port 0 --api-key KEY
--port-file PATH`` writes the bound port to PATH once listening and serves
until SIGTERM or SIGINT.
"""
from __future__ import annotations

import json
import re
import secrets
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import SplitResult, parse_qs

from packs.sandbox_kit import LoopbackSandbox, Rejected, SandboxHandler, SandboxState, serve_process, write_faults

CUSTOMER_PARAMS: tuple[str, ...] = ("email", "name")
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_IDEMPOTENCY_KEY_LENGTH = 255
DEFAULT_LIST_LIMIT = 10
MAX_LIST_LIMIT = 100

_CUSTOMER_PATH = re.compile(r"/v1/customers/([^/]+)")
_ID_ALPHABET = string.ascii_letters + string.digits

Params = dict[str, str | None]


def _rejected(status: int, error: dict[str, Any], headers: dict[str, str] | None = None) -> Rejected:
    """A request error that maps to one HTTP response ``{"error": error}`` (with ``headers``, if any)."""
    return Rejected(status, {"error": error}, headers or None, message=error.get("message", ""))


@dataclass(slots=True)
class _IdempotencyEntry:
    fingerprint: tuple[Any, ...]
    status: int | None = None  # None while the first request is executing
    body: dict[str, Any] | None = None
    customer_id: str | None = None


@dataclass(slots=True)
class _State(SandboxState):
    """Everything the sandbox remembers (``secret`` is the API key); guarded by ``lock``."""

    customers: dict[str, dict[str, Any]] = field(default_factory=dict)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    idempotency: dict[str, _IdempotencyEntry] = field(default_factory=dict)

    def forget(self) -> None:
        self.customers.clear()
        self.counters.clear()
        self.idempotency.clear()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "customers": [
                    {
                        "id": customer_id,
                        "email": customer["email"],
                        "name": customer["name"],
                        "create_requests": self.counters[customer_id]["create_requests"],
                        "update_requests": self.counters[customer_id]["update_requests"],
                    }
                    for customer_id, customer in self.customers.items()
                ],
                "requests": self.requests.count,
            }


class BillingSandbox(LoopbackSandbox):
    """An in-process sandbox server on ``127.0.0.1``, served from a daemon thread.

    Usage::

        with BillingSandbox("sk_test_123") as sandbox:
            httpx.post(f"{sandbox.base_url}/v1/customers", ...)
    """

    handler_class: type[BaseHTTPRequestHandler]  # set below, once _SandboxHandler exists
    thread_name = "billing-sandbox"

    def __init__(self, api_key: str, *, port: int = 0):
        """Prepare a sandbox accepting ``Bearer api_key``; ``port`` 0 picks a free port.

        Raises:
            ValueError: an empty API key or a port outside 0-65535.
        """
        if not api_key:
            raise ValueError("api_key must be non-empty")
        super().__init__(_State(secret=api_key, faults=write_faults()), port=port)


class _SandboxHandler(SandboxHandler):
    def serve(self, method: str, url: SplitResult, body: bytes) -> None:
        state = self.server.state
        path = url.path
        if not path.startswith("/v1/"):
            raise _rejected(404, _unrecognized(method, path))
        self._authenticate()
        if method == "POST" and path == "/v1/customers":
            self._write_customer(path, body, customer_id=None)
        elif method == "POST" and (match := _CUSTOMER_PATH.fullmatch(path)):
            self._write_customer(path, body, customer_id=match.group(1))
        elif method == "GET" and path == "/v1/customers":
            self._respond(200, self._list(parse_qs(url.query, keep_blank_values=True)))
        elif method == "GET" and (match := _CUSTOMER_PATH.fullmatch(path)):
            with state.lock:
                customer = state.customers.get(match.group(1))
                found = dict(customer) if customer is not None else None
            if found is None:
                raise _rejected(404, _missing(match.group(1)))
            self._respond(200, found)
        else:
            raise _rejected(404, _unrecognized(method, path))

    def invalid(self, message: str) -> dict[str, Any]:
        return {"error": _invalid(message)}

    def unknown_control(self, method: str, path: str) -> Rejected:
        return _rejected(404, _unrecognized(method, path))

    def internal_error(self) -> dict[str, Any]:
        return {"error": {"type": "api_error", "message": "Unexpected sandbox error."}}

    def extra_headers(self) -> dict[str, str]:
        return {"Request-Id": "req_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(14))}

    # -- /v1 -----------------------------------------------------------------

    def _authenticate(self) -> None:
        header = self.headers.get("Authorization")
        if not header:
            raise _rejected(401, _invalid(
                "You did not provide an API key. Provide it in the Authorization header as 'Bearer <key>'."))
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
            key.encode("utf-8", "surrogateescape"), self.server.state.secret.encode("utf-8")
        ):
            raise _rejected(401, _invalid("Invalid API Key provided."))

    def _write_customer(self, path: str, body: bytes, *, customer_id: str | None) -> None:
        """Create (``customer_id`` None) or update a customer, honouring idempotency and faults."""
        state = self.server.state
        params = self._customer_params(body)
        key = self._idempotency_key()
        fingerprint = (path, tuple(sorted(params.items())))
        counter = "create_requests" if customer_id is None else "update_requests"

        response: tuple[int, dict[str, Any]] | None = None
        drop = False
        with state.lock:
            failure = state.faults.take_status("fail_before_commit")
            if failure is not None:
                raise _rejected(failure, _injected(failure), state.faults.status_headers("fail_before_commit"))
            if key is not None:
                entry = state.idempotency.get(key)
                if entry is not None:
                    response = self._replay(entry, key, fingerprint, counter)
                    drop = state.faults.take("drop_response_after_commit")
                else:
                    state.idempotency[key] = _IdempotencyEntry(fingerprint=fingerprint)
        if response is not None:
            status, payload = response
            if drop:
                self.drop_response()
            else:
                self._respond(status, payload, replayed=True)
            return

        try:
            state.faults.wait("delay_seconds")
            with state.lock:
                status, payload, affected = self._execute(params, customer_id=customer_id)
                if affected is not None:
                    state.counters[affected][counter] += 1
                entry = state.idempotency.get(key) if key is not None else None
                if entry is not None and entry.status is None:  # absent only after a concurrent reset
                    entry.status, entry.body, entry.customer_id = status, payload, affected
                drop = state.faults.take("drop_response_after_commit")
        except BaseException:
            if key is not None:
                with state.lock:
                    entry = state.idempotency.get(key)
                    if entry is not None and entry.status is None:
                        del state.idempotency[key]
            raise
        if drop:
            self.drop_response()
        else:
            self._respond(status, payload)

    def _execute(self, params: Params, *, customer_id: str | None) -> tuple[int, dict[str, Any], str | None]:
        """Perform a create/update under the state lock; return (status, body, customer id)."""
        state = self.server.state
        if customer_id is None:
            customer_id = "cus_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(14))
            customer = {
                "id": customer_id,
                "object": "customer",
                "email": params.get("email"),
                "name": params.get("name"),
                "created": int(time.time()),
            }
            state.customers[customer_id] = customer
            state.counters[customer_id] = {"create_requests": 0, "update_requests": 0}
            return 200, dict(customer), customer_id
        customer = state.customers.get(customer_id)
        if customer is None:
            return 404, {"error": _missing(customer_id)}, None
        customer.update(params)
        return 200, dict(customer), customer_id

    def _replay(
        self, entry: _IdempotencyEntry, key: str, fingerprint: tuple[Any, ...], counter: str
    ) -> tuple[int, dict[str, Any]]:
        """Return the stored result for ``key`` (state lock held) or raise 409/400."""
        state = self.server.state
        if entry.status is None or entry.body is None:
            raise _rejected(409, {
                "type": "invalid_request_error",
                "code": "idempotency_key_in_use",
                "message": "There is currently another in-progress request using this Idempotency Key "
                           "(that probably means you submitted twice, and the other request is still going "
                           "through). Please try again later.",
            })
        if entry.fingerprint != fingerprint:
            raise _rejected(400, {
                "type": "idempotency_error",
                "message": f"Keys for idempotent requests can only be used with the same parameters they were "
                           f"first used with. Try using a key other than '{key}' if you meant to execute a "
                           f"different request.",
            })
        if entry.customer_id is not None and entry.customer_id in state.counters:
            state.counters[entry.customer_id][counter] += 1
        return entry.status, entry.body

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        unknown = sorted(set(query) - {"email", "limit", "starting_after"})
        if unknown:
            raise _rejected(400, _unknown_param(unknown[0]))
        limit_text = query.get("limit", [str(DEFAULT_LIST_LIMIT)])[-1]
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIST_LIMIT:
            raise _rejected(400, _invalid(f"limit must be an integer 1-{MAX_LIST_LIMIT}", param="limit"))
        limit = int(limit_text)
        email = query.get("email", [None])[-1]
        starting_after = query.get("starting_after", [None])[-1]
        with self.server.state.lock:
            newest_first = [dict(customer) for customer in reversed(self.server.state.customers.values())]
        if email is not None:
            newest_first = [customer for customer in newest_first if customer["email"] == email]
        if starting_after is not None:
            ids = [customer["id"] for customer in newest_first]
            if starting_after not in ids:
                raise _rejected(400, _invalid(f"No such customer: '{starting_after}'", param="starting_after"))
            newest_first = newest_first[ids.index(starting_after) + 1 :]
        return {
            "object": "list",
            "data": newest_first[:limit],
            "has_more": len(newest_first) > limit,
            "url": "/v1/customers",
        }

    def _customer_params(self, body: bytes) -> Params:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type == "application/json":
            try:
                raw = json.loads(body.decode("utf-8")) if body else {}
            except ValueError as exc:
                raise _rejected(400, _invalid(f"Invalid JSON body: {exc}")) from exc
            if not isinstance(raw, dict):
                raise _rejected(400, _invalid("The JSON body must be an object."))
            pairs = list(raw.items())
        elif content_type in ("application/x-www-form-urlencoded", ""):
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _rejected(400, _invalid("The request body is not valid UTF-8.")) from exc
            parsed = parse_qs(text, keep_blank_values=True)
            for name, values in parsed.items():
                if len(values) > 1:
                    raise _rejected(400, _invalid(f"Parameter {name} was given more than once.", param=name))
            pairs = [(name, values[0]) for name, values in parsed.items()]
        else:
            raise _rejected(400, _invalid(f"Unsupported Content-Type {content_type!r}."))
        params: Params = {}
        for name, value in pairs:
            if name not in CUSTOMER_PARAMS:
                raise _rejected(400, _unknown_param(name))
            if value is not None and not isinstance(value, str):
                raise _rejected(400, _invalid(f"Invalid string: {value!r}", param=name))
            params[name] = value or None
        return params

    def _idempotency_key(self) -> str | None:
        key = self.headers.get(IDEMPOTENCY_HEADER)
        if key is None:
            return None
        if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
            raise _rejected(400, _invalid(
                f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_LENGTH} characters.", param=IDEMPOTENCY_HEADER))
        return key

    # -- transport -------------------------------------------------------------

    def _respond(self, status: int, payload: dict[str, Any], *, replayed: bool = False) -> None:
        self.send_json(status, payload, headers={"Idempotent-Replayed": "true"} if replayed else None)


def _invalid(message: str, *, param: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": "invalid_request_error", "message": message}
    if param is not None:
        error["param"] = param
    return error


def _unknown_param(name: str) -> dict[str, Any]:
    return {"type": "invalid_request_error", "code": "parameter_unknown", "param": name,
            "message": f"Received unknown parameter: {name}"}


def _missing(customer_id: str) -> dict[str, Any]:
    return {"type": "invalid_request_error", "code": "resource_missing", "param": "id",
            "message": f"No such customer: '{customer_id}'"}


def _unrecognized(method: str, path: str) -> dict[str, Any]:
    return {"type": "invalid_request_error", "message": f"Unrecognized request URL ({method}: {path})."}


def _injected(status: int) -> dict[str, Any]:
    kind = "rate_limit_error" if status == 429 else "api_error" if status >= 500 else "invalid_request_error"
    return {"type": kind, "message": f"Injected failure before commit (HTTP {status}); nothing was performed."}


BillingSandbox.handler_class = _SandboxHandler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the sandbox as a process until SIGTERM/SIGINT; return the exit status."""
    return serve_process(argv, description="Loopback billing customers API sandbox.", secret_flag="--api-key",
                         secret_help="the bearer key clients must present", build=BillingSandbox)


if __name__ == "__main__":
    raise SystemExit(main())
