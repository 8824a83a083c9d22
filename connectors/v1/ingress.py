"""V1 webhook ingress and V1 transport idempotency (seed 003 "V1 concepts to retire").

One accepted delivery is one :class:`~connectors.v1.models.V1TransportKey` row
plus one :class:`~connectors.v1.models.V1Event` per item, in one transaction. The
transport key and identity digest are derived exactly as V2 admission derives
them (:func:`connectors.inbound.admission.transport_key_for`), so the drained
V1 identities become V2 ``ReceiptAdmissionKey`` tombstones byte for byte.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from connectors.contracts.signatures import verify_request
from connectors.inbound.admission import (
    AdmissionConflict,
    UnknownIngress,
    classify_items,
    identity_digest_for,
    parse_batch,
    transport_key_for,
)
from connectors.v1.barriers import v1_barrier_admit
from connectors.v1.config import live_route, live_secret, v1_account
from connectors.v1.models import V1Event, V1TransportKey
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.models import insert

#: Inside the admission transaction, past the ingress barrier and every insert, before the commit:
#: a delivery held here crosses a barrier close (``cutover halt-v1`` waits for it).
FP_BEFORE_COMMIT = failpoints.declare("v1.ingress.before_commit")


@dataclass(frozen=True)
class V1AdmissionResult:
    """``transport_id``: the V1TransportKey row; ``created``: False for a redelivery; ``events``: new V1 events."""

    transport_id: V1TransportKey.Id
    created: bool
    events: int


def v1_admit(*, account_key: str, channel: str, method: str, url: str, body: bytes,
             headers: Mapping[str, str], now: float | None = None) -> V1AdmissionResult:
    """Authenticate and accept one pushed provider delivery into V1, exactly once.

    Args:
        account_key, channel: from the V1 ingress path.
        method, url: exactly as received (the route's signature covers them).
        body: the raw request bytes (a JSON array of provider items).
        headers: request headers (case-insensitive lookup).
        now: the verifier's clock in Unix seconds (tests); the wall clock otherwise.

    Returns:
        :class:`V1AdmissionResult`.

    Raises:
        UnknownIngress (404): the account is not a V1 account, or has no enabled pushed route on ``channel``.
        SignatureError subclasses (401), MalformedBody (400), AdmissionConflict (409: the same transport
        key with other content), V1CredentialUnavailable (503), V1MaintenanceClosed (503: the ingress
        maintenance barrier is closed; the delivery stays unacknowledged and the source retries).

    Seed 003 "V1 concepts to retire" (V1 ingress and transport idempotency).
    """
    registered = v1_account(account_key)
    if registered is None:
        raise UnknownIngress(f"unknown account {account_key!r}")
    account, route = live_route(registered.org_id, account_key, channel)
    secret = live_secret(registered.org_id, account, route["credential_ref"])
    verify_request(route["auth"], secret=secret, method=method, url=url, body=body, headers=headers,
                   now_epoch_seconds=time.time() if now is None else now)
    return v1_accept(org_id=registered.org_id, account_key=account_key, channel=channel, route=route, body=body,
                     raw_items=parse_batch(route, body))


def v1_accept(*, org_id: str, account_key: str, channel: str, route: dict, body: bytes, raw_items: list,
              transport_key: str | None = None) -> V1AdmissionResult:
    """Record one authenticated delivery (pushed body or pulled envelope) and its V1 events once.

    Args:
        raw_items: the delivery's items, as parsed.
        transport_key: the key of a pulled envelope (its opaque id); derived from the items otherwise.

    Returns:
        :class:`V1AdmissionResult`; a redelivery with the same identity digest creates nothing.

    Raises:
        AdmissionConflict: the key is taken by a delivery of other content.
        V1MaintenanceClosed: the org's ingress maintenance barrier is closed (nothing written).
    """
    items = classify_items(route, raw_items)
    key = transport_key or transport_key_for(route, items)
    identity = identity_digest_for(items)
    for _ in range(3):
        existing = V1TransportKey.objects.filter(org_id=org_id, account_key=account_key, channel=channel,
                                                 transport_key=key).first()
        if existing is not None:
            if existing.identity_digest != identity:
                raise AdmissionConflict(f"transport key {key[:16]} was accepted with other content")
            return V1AdmissionResult(existing.pk, False, 0)
        try:
            with transaction.atomic(durable=True):
                return _accept_locked(org_id, account_key, channel, route, body, items, key, identity)
        except IntegrityError:
            continue  # a concurrent delivery of the same key won: compare with its row
    raise AdmissionConflict(f"transport key {key[:16]} could not be settled")


def _accept_locked(org_id, account_key, channel, route, body, items, key, identity) -> V1AdmissionResult:
    v1_barrier_admit(org_id=org_id, kind="ingress")  # first: a close waits for this transaction to return
    transport = insert(V1TransportKey, org_id=org_id, account_key=account_key, channel=channel,
                       route_key=route["route_key"], transport_key=key, identity_digest=identity, body=body,
                       body_digest=digest_v2("connectors.v1.body", [("body", body)]).hexdigest,
                       event_count=len(items))
    keys = [i.source_event_key for i in items if not i.reason and i.source_event_key]
    # An item V1 already holds from another delivery is the same event: V1 runs it once.
    seen = set(V1Event.objects.filter(org_id=org_id, account_key=account_key, source_event_key__in=keys)
               .values_list("source_event_key", flat=True)) if keys else set()
    created = 0
    for item in items:
        common = dict(org_id=org_id, account_key=account_key, channel=channel, route_key=route["route_key"],
                      transport=transport, ordinal=item.ordinal, payload=item.raw if isinstance(item.raw, dict)
                      else {"item": item.raw})
        if item.reason:
            insert(V1Event, **common, source_event_key=f"q:{key[:32]}:{item.ordinal}", state="quarantined",
                   reason_code=item.reason)
            created += 1
            continue
        if item.source_event_key in seen:
            continue
        seen.add(item.source_event_key)
        insert(V1Event, **common, source_event_key=item.source_event_key, canonical_kind=item.kind,
               source_locator=item.locator, occurred_at_ms=item.occurred_at_ms, state="pending")
        created += 1
    failpoints.hit(FP_BEFORE_COMMIT)
    return V1AdmissionResult(transport.pk, True, created)


def payload_digest(payload) -> str:
    """The digest of one V1 event payload (canonical JSON), as its handoff ExecutionRef binds it."""
    return digest_v2("connectors.v1.event-payload", [("payload", canonical_json.dumps(payload))]).hexdigest
