"""Inbound admission: ReceiptAdmissionKey -> Receipt -> Components -> Events -> Projection -> Execution.

Seed 003 "Inbound facts" and "Durable source ordering". The route's pack
data says how to authenticate, split, validate, identify and order items; L0
only interprets those generic shapes.
"""
from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import canonical_locator
from nexusflow.kernel.models import insert

from . import reasons
from .models import (
    AccountServingGate,
    CredentialGeneration,
    Event,
    OrderingLane,
    PackGeneration,
    Projection,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
    ServingEpoch,
)
from .serving import CredentialUnavailable, NotServing, find_account_org, resolve_secret, serving_lock
from .signatures import verify_request
from .store import ExecutionStore, OrderingLaneStore

FP_AFTER_RECEIPT = failpoints.declare("admission.after_receipt_commit")


class AdmissionError(NexusError):
    """An ingress request that cannot be admitted; ``http_status`` says how to answer."""

    http_status = 400


class UnknownIngress(AdmissionError):
    code = "unknown_ingress"
    http_status = 404


class MalformedBody(AdmissionError):
    code = "malformed_body"
    http_status = 400


class AdmissionConflict(AdmissionError):
    code = "admission_conflict"
    http_status = 409


@dataclass
class AdmissionResult:
    receipt_id: int
    created: bool
    events_created: int = 0
    quarantined: int = 0


@dataclass
class _Item:
    ordinal: int
    raw: Any
    reason: str = ""
    kind: str = ""
    source_event_key: str = ""
    locator: str = ""
    occurred_at_ms: int = 0
    partition: list = field(default_factory=list)
    position: bytes = b""
    tie_breaker: str = ""
    identity: bytes = b""


_TYPES = {"integer": int, "string": str}


def _typed(value: Any, type_name: str) -> bool:
    expected = _TYPES[type_name]
    return isinstance(value, expected) and not isinstance(value, bool)


def _encode_position(values: list[int]) -> bytes:
    """Fixed-width big-endian encoding whose byte order equals numeric order."""
    return b"".join(struct.pack(">Q", v + (1 << 63)) for v in values)


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number out of range")
    return value


def parse_body(body: bytes) -> Any:
    """Parse a request body as strict, interoperable JSON.

    Raises:
        MalformedBody: not UTF-8, not JSON, NaN/Infinity or out-of-range
            numbers, integers beyond the parser's digit limit, nesting too
            deep, or strings that are not valid Unicode (lone surrogates).
    """
    try:
        parsed = json.loads(body.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)
        canonical_json.dumps(parsed)  # every string must encode as UTF-8
    except (UnicodeError, ValueError, RecursionError):
        raise MalformedBody("the body is not strict UTF-8 JSON") from None
    return parsed


def _frame_key(parts: list[str]) -> str:
    return "/".join(f"{len(p)}:{p}" for p in parts)


def _strip(item: dict, volatile: list[str]) -> dict:
    return {k: v for k, v in item.items() if k not in volatile}


def classify_items(route: dict, items: list) -> list[_Item]:
    """Validate each batch element against the route schema and derive its source facts.

    Elements failing the schema get a closed reason code and no event facts.
    """
    volatile = route.get("volatile_fields", [])
    out: list[_Item] = []
    for ordinal, raw in enumerate(items):
        item = _Item(ordinal=ordinal, raw=raw)
        out.append(item)
        if not isinstance(raw, dict):
            item.reason = reasons.ITEM_NOT_OBJECT
            item.identity = canonical_json.dumps(raw)
            continue
        item.identity = canonical_json.dumps(_strip(raw, volatile))
        kind = raw.get(route["kind_field"], raw.get(route.get("kind_field_fallback", ""), None))
        if isinstance(kind, str) and kind.startswith(tuple(route.get("gap_kind_prefixes", ()))):
            item.reason = reasons.SOURCE_GAP_REPORTED  # the source says changes were lost or skipped
            continue
        spec = route["kinds"].get(kind) if isinstance(kind, str) else None
        if spec is None:
            item.reason = reasons.ITEM_KIND_UNSUPPORTED
            continue
        required = {**route.get("common_required", {}), **spec.get("required", {})}
        missing = [name for name, type_name in required.items() if not _typed(raw.get(name), type_name)]
        if missing:
            item.reason = reasons.ITEM_SCHEMA_INVALID
            continue
        try:
            item.kind = spec["canonical_kind"]
            item.source_event_key = _frame_key([canonical_locator(raw[f], field=f, max_length=64)
                                                for f in route["source_event_key"]])
            if len(item.source_event_key) > 160:
                raise InvalidIdentity("source event key longer than 160 characters")
            item.locator = canonical_locator(raw[route["source_locator"]], field="source_locator", max_length=160)
            occurred = route["occurred_at"]
            item.occurred_at_ms = int(raw[occurred["field"]]) * (1000 if occurred.get("unit") == "s" else 1)
            ordering = route["ordering"]
            partition_fields = spec.get("partition", ordering["partition"])
            item.partition = [None if raw.get(f) is None else canonical_locator(raw[f], field=f) for f in partition_fields]
            position_values = [raw[f] for f in ordering["position"]]
            if not all(_typed(v, "integer") and -(1 << 63) <= v < (1 << 63) for v in position_values):
                raise InvalidIdentity("position fields must be 64-bit integers")
            # The SourceEventKey closes the order: equal positions still compare deterministically.
            item.position = _encode_position(position_values) + b"\x00" + item.source_event_key.encode("utf-8")
            item.tie_breaker = str(raw.get(ordering["tie_breaker"], ""))
        except (InvalidIdentity, KeyError, TypeError, ValueError):
            item.reason = reasons.ITEM_IDENTITY_INVALID
            item.kind = ""
    return out


def transport_key_for(route: dict, items: list[_Item]) -> str:
    """The transport idempotency key: the sorted set of item identities."""
    keys = sorted(i.source_event_key if i.source_event_key else "q:" + i.identity.hex() for i in items)
    return digest_v2("connectors.transport-key", [("route_key", route["route_key"]),
                                                   ("items", canonical_json.dumps(keys))]).hexdigest


def identity_digest_for(items: list[_Item]) -> str:
    return digest_v2("connectors.admission-identity",
                     [("items", canonical_json.dumps(sorted(i.identity.hex() for i in items)))]).hexdigest


def _route_and_secret(org_id: str, account_key: str, channel: str) -> tuple[AccountServingGate, dict, bytes]:
    gate = AccountServingGate.objects.filter(org_id=org_id, account_key=account_key).select_related("epoch").first()
    if gate is None:
        raise UnknownIngress(f"unknown account {account_key!r}")
    if gate.state != "v2_serving" or gate.epoch is None:
        raise NotServing(f"account {account_key} is {gate.state}")
    account = next((a for a in gate.epoch.document["accounts"] if a["account_key"] == account_key), None)
    if account is None:
        raise NotServing(f"account {account_key} is not part of its serving epoch")
    pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
    route = next((r for r in pack.document.get("inbound_routes", [])
                  if r["channel"] == channel and r["route_key"] in account["routes"]), None)
    if route is None or route.get("delivery", "push") != "push":
        # A pulled route is fetched with its credential (connectors/stream.py), never posted to.
        raise UnknownIngress(f"account {account_key} has no enabled pushed route for channel {channel!r}")
    credential_ref = account["credentials"].get(route["credential_ref"])
    if credential_ref is None:
        raise CredentialUnavailable(f"account {account_key} has no credential {route['credential_ref']}")
    secret = resolve_secret(CredentialGeneration.objects.get(org_id=org_id, pk=credential_ref["id"]))
    return gate, route, secret


def admit(*, account_key: str, channel: str, method: str, url: str, body: bytes,
          headers: Mapping[str, str], now: float | None = None) -> AdmissionResult:
    """Authenticate and admit one provider request exactly once.

    Args:
        account_key, channel: from the ingress path.
        method, url: exactly as received (the signature covers them).
        body: the raw request bytes.
        headers: request headers (case-insensitive lookup).

    Returns:
        ``AdmissionResult(receipt_id, created)``; ``created`` is False for a
        redelivery that resolved the original Receipt.

    Raises:
        UnknownIngress (404), SignatureError subclasses (401), MalformedBody (400),
        AdmissionConflict (409: same transport key, different content),
        NotServing (503), CredentialUnavailable (503).
    """
    org_id = find_account_org(account_key)
    if org_id is None:
        raise UnknownIngress(f"unknown account {account_key!r}")
    _gate, route, secret = _route_and_secret(org_id, account_key, channel)
    verify_request(route["auth"], secret=secret, method=method, url=url, body=body, headers=headers,
                   now_epoch_seconds=time.time() if now is None else now)
    parsed = parse_body(body)
    if not isinstance(parsed, list):
        raise MalformedBody("the body must be a JSON array of events")
    if not parsed:
        raise MalformedBody("the body is an empty batch")
    if len(parsed) > route["body"].get("max_items", 100):
        raise MalformedBody(f"the batch has more than {route['body'].get('max_items', 100)} items")
    return admit_items(org_id=org_id, account_key=account_key, channel=channel, route=route, body=body,
                       raw_items=parsed)


def admit_items(*, org_id: str, account_key: str, channel: str, route: dict, body: bytes, raw_items: list,
                transport_key: str | None = None) -> AdmissionResult:
    """Admit already-authenticated items of one channel exactly once (shared by pushed and pulled routes).

    Args:
        route: the pack route (from the account's serving epoch).
        body: the bytes the Receipt keeps (the request body, or one pulled envelope).
        raw_items: the parsed batch elements (one per ReceiptComponent).
        transport_key: the route's transport key when the caller derives it
            (a pulled envelope's opaque id); default: the sorted item identities.

    Returns:
        ``AdmissionResult``; ``created`` False when the key resolved an existing Receipt.

    Raises:
        AdmissionConflict (same key, other content), NotServing.

    Seed 003 "Inbound facts" (ReceiptAdmissionKey, Receipt, ReceiptComponent, Event).
    """
    items = classify_items(route, raw_items)
    transport_key = transport_key or transport_key_for(route, items)
    identity = identity_digest_for(items)
    for _ in range(3):
        try:
            result = _admit_locked(org_id, account_key, channel, route, body, items, transport_key, identity)
            failpoints.hit(FP_AFTER_RECEIPT)
            return result
        except IntegrityError:
            # A concurrent admission of the same key committed first: resolve it.
            continue
    raise AdmissionConflict("concurrent admissions of this key did not settle")


def _admit_locked(org_id, account_key, channel, route, body, items, transport_key, identity) -> AdmissionResult:
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=org_id, account_key=account_key)
        existing = ReceiptAdmissionKey.objects.filter(
            org_id=org_id, account_key=account_key, channel=channel, transport_key=transport_key).first()
        if existing is not None:
            if existing.identity_digest != identity or existing.receipt_id is None:
                raise AdmissionConflict("this transport key was admitted with different content")
            return AdmissionResult(receipt_id=existing.receipt_id, created=False)
        epoch: ServingEpoch = ctx.epoch
        quarantined = sum(1 for i in items if i.reason)
        receipt = insert(Receipt, org_id=org_id, epoch=epoch, account_key=account_key, channel=channel,
                         route_key=route["route_key"], body=body,
                         body_digest=digest_v2("connectors.receipt-body", [("body", body)]).hexdigest,
                         component_count=len(items), quarantined_count=quarantined)
        insert(ReceiptAdmissionKey, org_id=org_id, account_key=account_key, channel=channel,
               transport_key=transport_key, identity_digest=identity, profile_id=PROFILE_V2, receipt=receipt)
        account = ctx.account
        ordering = account["routes"][route["route_key"]]
        created = 0
        for item in items:
            if item.reason:
                insert(ReceiptComponent, receipt=receipt, ordinal=item.ordinal, disposition="quarantined",
                       reason_code=item.reason, item=item.raw)
                continue
            event = Event.objects.filter(org_id=org_id, account_key=account_key, route_key=route["route_key"],
                                         source_event_key=item.source_event_key, event_generation="live").first()
            if event is not None:
                insert(ReceiptComponent, receipt=receipt, ordinal=item.ordinal, disposition="duplicate",
                       item=item.raw, event=event)
                continue
            event = _materialize(org_id, account_key, epoch, route, account, ordering, receipt, item)
            insert(ReceiptComponent, receipt=receipt, ordinal=item.ordinal, disposition="event", item=item.raw, event=event)
            created += 1
        return AdmissionResult(receipt_id=receipt.pk, created=True, events_created=created, quarantined=quarantined)


def _materialize(org_id, account_key, epoch, route, account, ordering, receipt, item: _Item) -> Event:
    """Insert Event, Projection and its first Execution generation on its OrderingLane."""
    payload_bytes = canonical_json.dumps(item.raw)
    partition_key = digest_v2("connectors.ordering-partition", [
        ("route_key", route["route_key"]), ("partition", canonical_json.dumps(item.partition))]).hexdigest
    event = insert(
        Event, org_id=org_id, epoch=epoch, account_key=account_key, route_key=route["route_key"],
        canonical_kind=item.kind, source_event_key=item.source_event_key, source_locator=item.locator,
        occurred_at_ms=item.occurred_at_ms, ordering_contract=ordering["ordering"]["contract"],
        ordering_contract_digest=ordering["ordering_digest"], partition_key=partition_key, partition=item.partition,
        position=item.position, tie_breaker=item.tie_breaker, payload=item.raw,
        payload_digest=digest_v2("connectors.event-payload", [("payload", payload_bytes)]).hexdigest, receipt=receipt,
    )
    definition_digest = digest_v2("connectors.route-definition", [
        ("pack_digest", account["pack_generation"]["digest"]), ("route_key", route["route_key"])]).hexdigest
    input_digest = event.payload_digest
    projection = insert(Projection, org_id=org_id, event=event, route_key=route["route_key"],
                        definition_digest=definition_digest, input_digest=input_digest)
    lane = None
    if ordering["ordering"]["contract"] != "order_independent":
        lane = OrderingLane.objects.filter(epoch=epoch, route_key=route["route_key"], partition_key=partition_key).first()
        if lane is None:
            lane = OrderingLaneStore.create(org_id=org_id, epoch=epoch, account_key=account_key,
                                            route_key=route["route_key"], partition_key=partition_key,
                                            partition=item.partition, state="open")
    command_id = digest_v2("connectors.runtime-command", [
        ("org_id", org_id), ("projection_id", projection.pk), ("generation", 1)]).hexdigest
    execution_ref = digest_v2("connectors.execution-ref", [
        ("command_id", command_id), ("projection_id", projection.pk),
        ("pack_generation_id", account["pack_generation"]["id"]), ("epoch_digest", epoch.digest),
        ("definition_digest", definition_digest), ("input_digest", input_digest)]).hexdigest
    ExecutionStore.create(org_id=org_id, projection=projection, generation=1, lane=lane, position=item.position,
                          state="ready", command_id=command_id, execution_ref_digest=execution_ref)
    return event
