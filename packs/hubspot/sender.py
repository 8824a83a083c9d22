"""Loopback provider side: deliver a webhook file over HTTP, signed like the provider.

A delivery file is JSON Lines, one delivery per line::

    {"body": [<event>, ...], "sign": "valid"}
    {"body": "not json", "sign": "missing"}

``body`` is either an array of events, serialized compactly
(``json.dumps(body, separators=(",", ":"))``), or a string sent verbatim as
UTF-8. ``sign`` (default ``"valid"``) selects how the request is signed with
the route's ``auth`` config from ``pack.json``:

- ``valid``: correct signature and current timestamp;
- ``invalid``: current timestamp, signature computed with a wrong secret;
- ``stale``: correct signature over a timestamp 10 minutes old;
- ``missing``: neither the signature nor the timestamp header.

Like the provider, a 503 or 429 answer is retried after ``Retry-After``
seconds (capped at 2 s here, 1 s when absent), at most 30 tries in all; the
retried request is re-signed with a fresh timestamp. Run as a program::

    python -m packs.hubspot.sender FILE --url URL --secret-env VAR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from connectors.contracts.signatures import header_timestamp, sign_request
from nexusflow.kernel.tls import tls_context
from packs.hubspot import webhook_route

SIGN_MODES: frozenset[str] = frozenset({"valid", "invalid", "stale", "missing"})
RETRY_STATUSES: frozenset[int] = frozenset({429, 503})
MAX_TRIES = 30
MAX_RETRY_WAIT_SECONDS = 2.0
DEFAULT_RETRY_WAIT_SECONDS = 1.0
STALE_AGE_SECONDS = 600.0
REQUEST_TIMEOUT_SECONDS = 10.0

_DELIVERY_KEYS = frozenset({"body", "sign"})
_WRONG_SECRET_SUFFIX = b"\x00not-the-client-secret"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook POST: ``body`` is a list of events or a verbatim string."""

    body: list[Any] | str
    sign: str = "valid"

    def body_bytes(self) -> bytes:
        """Return the exact bytes posted: compact JSON for arrays, UTF-8 for strings."""
        if isinstance(self.body, str):
            return self.body.encode("utf-8")
        return json.dumps(self.body, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """Outcome of one delivery after retries.

    ``index`` is the delivery's 0-based position in the list given to
    :func:`deliver_all`; ``status`` the final HTTP status; ``response`` the
    parsed JSON response body or ``None`` (empty or not JSON);
    ``retry_after`` the final response's raw ``Retry-After`` header, if any;
    ``attempts`` the number of HTTP requests made (1 when not retried).
    """

    index: int
    status: int
    response: Any
    retry_after: str | None
    attempts: int


def load_deliveries(path: str | os.PathLike[str]) -> list[Delivery]:
    """Read a JSON Lines delivery file; blank lines are skipped.

    Args:
        path: a UTF-8 file, one ``{"body": ..., "sign": ...}`` object per line.

    Returns:
        The deliveries in file order.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not JSON, not an object, has a key other than
            ``body``/``sign``, lacks ``body``, has a body that is neither an
            array nor a string, or an unknown ``sign``; the message names the
            1-based line number.
    """
    deliveries: list[Delivery] = []
    with Path(path).open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            deliveries.append(_parse_line(line, line_number))
    return deliveries


def deliver_all(
    deliveries: Sequence[Delivery],
    *,
    url: str,
    secret: bytes,
    client: httpx.Client | None = None,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> list[DeliveryResult]:
    """POST every delivery in order, signed per its ``sign`` mode.

    Args:
        deliveries: what to send, e.g. from :func:`load_deliveries`.
        url: the full ingress URL with scheme; it is also the signed URL.
        secret: the webhook client secret (non-empty bytes).
        client: an httpx client to reuse; when ``None`` one is created with a
            10 s timeout and closed afterwards.
        now: clock returning Unix seconds, used for signature timestamps.
        sleep: called with the wait in seconds before each retry.

    Returns:
        One :class:`DeliveryResult` per delivery, in order.

    Raises:
        httpx.TransportError: a request failed below HTTP (refused, reset,
            timed out); deliveries already made are not repeated.
        ValueError: an empty secret or an unknown sign mode.
    """
    if not secret:
        raise ValueError("secret must be non-empty bytes")
    auth = webhook_route()["auth"]
    own_client = client is None
    http = client if client is not None else httpx.Client(timeout=REQUEST_TIMEOUT_SECONDS, verify=tls_context())
    try:
        return [
            _deliver_one(index, delivery, http=http, url=url, auth=auth, secret=secret, now=now, sleep=sleep)
            for index, delivery in enumerate(deliveries)
        ]
    finally:
        if own_client:
            http.close()


def signed_headers(
    delivery: Delivery, *, auth: dict[str, Any], url: str, secret: bytes, now_epoch_seconds: float
) -> dict[str, str]:
    """Return the signature headers for ``delivery`` under its ``sign`` mode.

    Args:
        delivery: the delivery to sign.
        auth: the route's signature config from ``pack.json``.
        url: the exact URL the request is posted to.
        secret: the correct client secret.
        now_epoch_seconds: the sender's clock, Unix seconds.

    Raises:
        ValueError: an unknown sign mode or an invalid ``auth`` config.
    """
    if delivery.sign == "missing":
        return {}
    signed_at = now_epoch_seconds - STALE_AGE_SECONDS if delivery.sign == "stale" else now_epoch_seconds
    if delivery.sign == "invalid":
        key = secret + _WRONG_SECRET_SUFFIX
    elif delivery.sign in ("valid", "stale"):
        key = secret
    else:
        raise ValueError(f"unknown sign mode {delivery.sign!r}")
    timestamp = header_timestamp(auth, epoch_seconds=signed_at) if auth.get("timestamp_header") else None
    return sign_request(auth, secret=key, method="POST", url=url, body=delivery.body_bytes(), timestamp=timestamp)


def _deliver_one(
    index: int,
    delivery: Delivery,
    *,
    http: httpx.Client,
    url: str,
    auth: dict[str, Any],
    secret: bytes,
    now: Callable[[], float],
    sleep: Callable[[float], None],
) -> DeliveryResult:
    body = delivery.body_bytes()
    attempts = 0
    while True:
        attempts += 1
        headers = {"Content-Type": "application/json"}
        headers.update(signed_headers(delivery, auth=auth, url=url, secret=secret, now_epoch_seconds=now()))
        response = http.post(url, content=body, headers=headers)
        retry_after = response.headers.get("Retry-After")
        if response.status_code not in RETRY_STATUSES or attempts >= MAX_TRIES:
            return DeliveryResult(
                index=index,
                status=response.status_code,
                response=_json_or_none(response),
                retry_after=retry_after,
                attempts=attempts,
            )
        sleep(_retry_wait_seconds(retry_after))


def _retry_wait_seconds(retry_after: str | None) -> float:
    """Seconds to wait for a ``Retry-After`` value (delta-seconds form), capped."""
    if retry_after is None:
        return DEFAULT_RETRY_WAIT_SECONDS
    try:
        wait = float(retry_after.strip())
    except ValueError:
        return DEFAULT_RETRY_WAIT_SECONDS
    if wait != wait or wait < 0:  # NaN or negative
        return DEFAULT_RETRY_WAIT_SECONDS
    return min(wait, MAX_RETRY_WAIT_SECONDS)


def _json_or_none(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _parse_line(line: str, line_number: int) -> Delivery:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"line {line_number}: not valid JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise ValueError(f"line {line_number}: expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - _DELIVERY_KEYS)
    if unknown:
        raise ValueError(f"line {line_number}: unknown key(s) {', '.join(unknown)}")
    if "body" not in record:
        raise ValueError(f"line {line_number}: missing 'body'")
    body = record["body"]
    if not isinstance(body, (list, str)):
        raise ValueError(f"line {line_number}: 'body' must be an array or a string, got {type(body).__name__}")
    sign = record.get("sign", "valid")
    if sign not in SIGN_MODES:
        raise ValueError(f"line {line_number}: 'sign' must be one of {sorted(SIGN_MODES)}, got {sign!r}")
    return Delivery(body=body, sign=sign)


def main(argv: Sequence[str] | None = None) -> int:
    """Deliver a file and print one JSON line per result.

    Returns 0 once every delivery received an HTTP answer (rejections such as
    401 for a deliberately bad signature are expected and reported, not
    failures); an unreachable receiver raises ``httpx.TransportError``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="JSON Lines delivery file")
    parser.add_argument("--url", required=True, help="full ingress URL with scheme")
    parser.add_argument("--secret-env", required=True, help="environment variable holding the client secret")
    args = parser.parse_args(argv)
    secret = os.environ.get(args.secret_env, "")
    if not secret:
        parser.error(f"environment variable {args.secret_env} is empty or unset")
    results = deliver_all(load_deliveries(args.path), url=args.url, secret=secret.encode("utf-8"))
    for result in results:
        print(json.dumps({"index": result.index, "status": result.status, "attempts": result.attempts,
                          "response": result.response}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
