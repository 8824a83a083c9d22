"""The one provider fetch of pulled routes: GET a batch of envelopes after an opaque cursor.

This is the only stream module that imports an HTTP client (tests/test_guardrails.py
allowlist); it holds no transaction and writes nothing. The request is built
entirely from the route's ``stream`` and ``auth`` blocks
(``connectors/contracts/stream_routes.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from connectors.inbound.admission import MalformedBody, parse_body
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.tls import tls_context


class StreamFetchFailed(NexusError):
    """The source did not answer with a batch (connection lost, timeout, non-200); nothing was read."""

    code = "stream_fetch_failed"


@dataclass(frozen=True)
class FetchedBatch:
    """One fetch: the envelopes as parsed JSON, and the source's opaque position after them."""

    envelopes: list[Any]
    next_cursor: Any


def fetch_batch(*, base_url: str, route: dict, token: bytes, cursor: str | None,
                client: httpx.Client | None = None) -> FetchedBatch:
    """Fetch at most ``stream.batch_limit`` envelopes of ``route`` after ``cursor``.

    Args:
        base_url: the account's base URL (no trailing slash needed).
        route: the pulled pack route.
        token: the credential bytes, sent as ``<auth.header>: <auth.scheme> <token>``.
        cursor: the rendered cursor parameter, ``None`` for the earliest retained event.
        client: an httpx client to reuse (tests); a short-lived one otherwise.

    Returns:
        ``FetchedBatch(envelopes, next_cursor)``.

    Raises:
        StreamFetchFailed: transport error, timeout or a non-200 status.
        MalformedBody: the 200 body is not strict JSON, has no envelope list,
            or names no next cursor for a non-empty batch.
    """
    stream, auth = route["stream"], route["auth"]
    params = {stream["topic_param"]: stream["topic"], stream["limit_param"]: str(stream["batch_limit"])}
    if cursor is not None:
        params[stream["cursor_param"]] = cursor
    scheme = auth.get("scheme", "")
    headers = {auth["header"]: (f"{scheme} " if scheme else "") + token.decode("utf-8")}
    url = base_url.rstrip("/") + stream["path"]
    owned = client is None
    client = client or httpx.Client(timeout=float(stream.get("timeout_seconds", 10)), verify=tls_context())
    try:
        response = client.request(stream.get("method", "GET"), url, params=params, headers=headers)
    except httpx.HTTPError as exc:
        raise StreamFetchFailed(f"fetch from {url} failed: {type(exc).__name__}") from None
    finally:
        if owned:
            client.close()
    if response.status_code != 200:
        raise StreamFetchFailed(f"fetch from {url} answered {response.status_code}: {response.text[:200]}")
    parsed = parse_body(response.content)
    if not isinstance(parsed, dict) or not isinstance(parsed.get(stream["events_field"]), list):
        raise MalformedBody(f"the fetch response has no {stream['events_field']!r} list")
    envelopes = parsed[stream["events_field"]]
    next_cursor = parsed.get(stream["next_cursor_field"])
    if envelopes and (next_cursor is None or isinstance(next_cursor, (dict, list, bool, float))):
        raise MalformedBody(f"the fetch response names no usable {stream['next_cursor_field']!r}")
    return FetchedBatch(envelopes=envelopes, next_cursor=next_cursor)
