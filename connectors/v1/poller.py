"""V1 cursor poller for pulled routes (seed 003 "V1 concepts to retire": V1 cursor and poller).

One poll of one :class:`~connectors.v1.models.V1StreamCursor`: under the org's
``v1.poll`` SchedulerLease, fetch one batch after the stored cursor (one
provider call behind its committed pre-I/O row, :mod:`connectors.v1.egress`),
accept every envelope as one V1 delivery (its transport key is the envelope's
opaque id, as V2 keys it), and only then advance the cursor to the batch's
next cursor. A crash before the advance refetches the same batch, which V1
transport idempotency turns into redeliveries.
"""
from __future__ import annotations

import urllib.parse

import httpx
from django.db import transaction

from connectors.contracts.stream_routes import encode_cursor, envelope_transport_key, expand_envelope, render_cursor
from connectors.inbound.admission import MalformedBody, parse_body
from connectors.v1.barriers import v1_barrier_is_closed
from connectors.v1.config import live_route, live_secret
from connectors.v1.egress import v1_call_prepare, v1_call_send
from connectors.v1.events import scheduler_lease_hold
from connectors.v1.ingress import v1_accept
from connectors.v1.models import V1StreamCursor
from connectors.v1.store import V1StreamCursorStore
from nexusflow.kernel import canonical_json
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import NexusError

POLL_SCHEDULER = "v1.poll"


class V1PollFailed(NexusError):
    """The source did not answer one batch (transport error or non-200): the cursor did not move."""

    code = "stream_fetch_failed"
    http_status = 503
    retry_after = 5


def _fetch_profile(stream: dict) -> dict:
    """The L0 outcome profile of a stream fetch: 4xx refused, 5xx ambiguous (a read has no remote effect)."""
    return {"outcomes": {"refused": list(range(400, 500)), "ambiguous": list(range(500, 600))},
            "idempotency": {"replay_safe": False}, "retry": {"max_attempts": 1},
            "timeout_seconds": stream.get("timeout_seconds", 10)}


def v1_stream_poll(*, org_id: str, cursor_id: V1StreamCursor.Id, worker_id: str,
                   client: httpx.Client | None = None) -> int | None:
    """Poll one V1 stream cursor once.

    Returns:
        The number of envelopes accepted (0 for an empty batch), or ``None`` when another live worker holds
        the org's ``v1.poll`` SchedulerLease, the cursor is stopped or the ingress maintenance barrier is closed.

    Raises:
        V1PollFailed: the fetch was refused, ambiguous or not answered (the cursor did not move).
        MalformedBody: the 200 answer is not a batch of the route's shape (the cursor did not move).
        UnknownIngress / V1CredentialUnavailable: the route or its credential is gone from the live configuration.
    """
    with transaction.atomic(durable=True):
        if scheduler_lease_hold(org_id=org_id, name=POLL_SCHEDULER, worker_id=worker_id, now=db_now()) is None:
            return None
    cursor = V1StreamCursor.objects.get(org_id=org_id, pk=cursor_id)
    if cursor.state != "polling" or v1_barrier_is_closed(org_id=org_id, kind="ingress"):
        return None  # a closed ingress barrier holds the cursor where it is: no fetch, no advance
    account, route = live_route(org_id, cursor.account_key, _channel_of(org_id, cursor), delivery="pull")
    stream, auth = route["stream"], route["auth"]
    params = {stream["topic_param"]: stream["topic"], stream["limit_param"]: str(stream["batch_limit"])}
    position = render_cursor(bytes(cursor.cursor) if cursor.cursor is not None else None)
    if position is not None:
        params[stream["cursor_param"]] = position
    url = account["base_url"].rstrip("/") + stream["path"] + "?" + urllib.parse.urlencode(sorted(params.items()))
    token = live_secret(org_id, account, route["credential_ref"])
    scheme = auth.get("scheme", "")
    headers = {auth["header"]: (f"{scheme} " if scheme else "") + token.decode("utf-8")}
    call = v1_call_prepare(org_id=org_id, account_key=cursor.account_key, call_site="v1.poll.fetch", kind="poll",
                           subject=cursor.route_key, method=stream.get("method", "GET"), url=url, body=b"")
    result = v1_call_send(call, headers=headers, profile=_fetch_profile(stream), client=client)
    if result.state != "confirmed" or result.status != 200:
        raise V1PollFailed(f"fetch of {cursor.route_key} ended {result.state} ({result.status})")
    parsed = parse_body(result.body)
    if not isinstance(parsed, dict) or not isinstance(parsed.get(stream["events_field"]), list):
        raise MalformedBody(f"the fetch response has no {stream['events_field']!r} list")
    envelopes, next_cursor = parsed[stream["events_field"]], parsed.get(stream["next_cursor_field"])
    for envelope in envelopes:
        v1_accept(org_id=org_id, account_key=cursor.account_key, channel=route["channel"], route=route,
                  body=canonical_json.dumps(envelope), raw_items=expand_envelope(route, envelope),
                  transport_key=envelope_transport_key(route, envelope))
    with transaction.atomic(durable=True):
        locked = V1StreamCursorStore.lock(org_id, cursor_id)
        fields = {"polled_at": db_now()}
        if envelopes and next_cursor is not None:
            fields["cursor"] = encode_cursor(next_cursor)
        V1StreamCursorStore.touch(org_id=org_id, pk=locked.pk, state=locked.state, version=locked.version,
                                  set_fields=fields)
    return len(envelopes)


def _channel_of(org_id: str, cursor: V1StreamCursor) -> str:
    """The channel of the cursor's route (a cursor is keyed by route; live_route looks routes up by channel)."""
    from connectors.v1.config import live_account, live_pack

    account = live_account(org_id, cursor.account_key)
    route = next((r for r in live_pack(account).get("inbound_routes", []) if r["route_key"] == cursor.route_key), None)
    if route is None:
        raise MalformedBody(f"route {cursor.route_key} is gone from the live configuration")
    return route["channel"]


def v1_stream_try_poll_one(*, worker_id: str) -> bool:
    """Poll the least recently polled ``polling`` V1 cursor once; True when a batch had envelopes."""
    cursor = V1StreamCursor.objects.filter(state="polling").order_by("polled_at", "id").first()
    if cursor is None:
        return False
    accepted = v1_stream_poll(org_id=cursor.org_id, cursor_id=cursor.pk, worker_id=worker_id)
    return bool(accepted)
