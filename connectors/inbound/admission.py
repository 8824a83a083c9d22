"""Inbound admission: ReceiptAdmissionKey -> Receipt -> Components -> Events -> Projection -> Execution.

Seed 003 "Inbound facts" and "Durable source ordering". The route's pack
data says how to authenticate, split, validate, identify and order items; L0
only interprets those generic shapes.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError, transaction

from connectors import reasons
from connectors.contracts.ordering import encode_position
from connectors.contracts.signatures import verify_request
from connectors.inbound.windows import grouping_of, lock_open_windows, window_add_member, window_for_member
from connectors.models import (
    AccountServingGate,
    Event,
    OrderingLane,
    PackGeneration,
    Projection,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
    ServingEpoch,
)
from connectors.selectors import frozen_row
from connectors.serving.gates import (
    CredentialUnavailable,
    NotServing,
    find_account_org,
    resolve_frozen_secret,
    serving_lock,
)
from connectors.store import ExecutionStore, OrderingLaneStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import canonical_locator
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.models import insert
from nexusflow.kernel.rows import first_row

log = logging.getLogger(__name__)

FP_BEFORE_CHILDREN = failpoints.declare("admission.before_children")
FP_BETWEEN_CHUNKS = failpoints.declare("admission.between_children_chunks")
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
    receipt_id: Receipt.Id | None
    created: bool
    events_created: int = 0
    quarantined: int = 0
    already_accepted: bool = False


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
#: ``Event.tie_breaker`` column width: a longer value is an identity fault of the item, not of the batch.
_TIE_BREAKER_MAX = 80


def _typed(value: Any, type_name: str) -> bool:
    expected = _TYPES[type_name]
    return isinstance(value, expected) and not isinstance(value, bool)


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
            if not -(1 << 63) <= item.occurred_at_ms < (1 << 63):
                raise InvalidIdentity("occurrence time outside the 64-bit range")
            ordering = route["ordering"]
            partition_fields = spec.get("partition", ordering.get("partition", []))
            item.partition = [None if raw.get(f) is None else canonical_locator(raw[f], field=f) for f in partition_fields]
            position_values = [raw[f] for f in ordering.get("position", [])]
            if not all(_typed(v, "integer") and -(1 << 63) <= v < (1 << 63) for v in position_values):
                raise InvalidIdentity("position fields must be 64-bit integers")
            # The SourceEventKey closes the order: equal positions still compare deterministically.
            item.position = encode_position(position_values, item.source_event_key)
            item.tie_breaker = str(raw.get(ordering.get("tie_breaker", ""), ""))
            if len(item.tie_breaker) > _TIE_BREAKER_MAX:
                raise InvalidIdentity(f"tie-breaker longer than {_TIE_BREAKER_MAX} characters")
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
        # A pulled route is fetched with its credential (connectors/inbound/stream_poll.py), never posted to.
        raise UnknownIngress(f"account {account_key} has no enabled pushed route for channel {channel!r}")
    credential_ref = account["credentials"].get(route["credential_ref"])
    if credential_ref is None:
        raise CredentialUnavailable(f"account {account_key} has no credential {route['credential_ref']}")
    secret = resolve_frozen_secret(org_id=org_id, frozen=credential_ref)
    return gate, route, secret


def admit(*, account_key: str, channel: str, method: str, url: str, body: bytes,
          headers: Mapping[str, str], now: float | None = None) -> AdmissionResult:
    """Authenticate and admit one provider request exactly once.

    Two steps (seed 003 "Inbound facts"): one transaction reserves the
    ReceiptAdmissionKey and the immutable Receipt under the locked gate and
    exact active epoch; then :func:`receipt_materialize` adds the Components,
    Events, Projections and Executions that are still missing, in chunks.
    A crash between the two leaves a Receipt whose redelivery (or the
    reconciler) materializes only the missing children, under the Receipt's
    own epoch.

    Args:
        account_key, channel: from the ingress path.
        method, url: exactly as received (the signature covers them).
        body: the raw request bytes.
        headers: request headers (case-insensitive lookup).

    Returns:
        ``AdmissionResult``: ``created`` is False for a redelivery that
        resolved the original Receipt; ``already_accepted`` is True (and
        ``receipt_id`` None) when a V1 acceptance tombstone holds the key.

    Raises:
        UnknownIngress (404), SignatureError subclasses (401), MalformedBody (400),
        AdmissionConflict (409: same transport key, different content, or a
        V1 tombstone with another payload digest), NotServing (503),
        CredentialUnavailable (503).
    """
    org_id = find_account_org(account_key)
    if org_id is None:
        raise UnknownIngress(f"unknown account {account_key!r}")
    _gate, route, secret = _route_and_secret(org_id, account_key, channel)
    verify_request(route["auth"], secret=secret, method=method, url=url, body=body, headers=headers,
                   now_epoch_seconds=time.time() if now is None else now)
    return admit_items(org_id=org_id, account_key=account_key, channel=channel, route=route, body=body,
                       raw_items=parse_batch(route, body))


def split_body(route: dict, body: bytes) -> list[_Item]:
    """Parse a JSON-array body and classify its items under ``route``.

    Raises:
        MalformedBody: as :func:`parse_batch`.
    """
    return classify_items(route, parse_batch(route, body))


def parse_batch(route: dict, body: bytes) -> list:
    """Parse a pushed JSON-array body into its raw batch elements.

    Raises:
        MalformedBody: not strict JSON, not an array, empty or over ``max_items``.
    """
    parsed = parse_body(body)
    if not isinstance(parsed, list):
        raise MalformedBody("the body must be a JSON array of events")
    if not parsed:
        raise MalformedBody("the body is an empty batch")
    if len(parsed) > route["body"].get("max_items", 100):
        raise MalformedBody(f"the batch has more than {route['body'].get('max_items', 100)} items")
    return parsed


def admit_items(*, org_id: str, account_key: str, channel: str, route: dict, body: bytes, raw_items: list,
                transport_key: str | None = None) -> AdmissionResult:
    """Admit already-authenticated items of one channel exactly once (shared by pushed and pulled routes).

    Reserves the key and Receipt, then materializes the children (see :func:`admit`).

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
            break
        except IntegrityError:
            # A concurrent admission of the same key committed first: resolve it.
            continue
    else:
        raise AdmissionConflict("concurrent admissions of this key did not settle")
    if result.receipt_id is not None:
        failpoints.hit(FP_BEFORE_CHILDREN)
        if result.created or not _receipt_complete(org_id, result.receipt_id):
            # A complete Receipt is a pure redelivery: it resolves even when its epoch was succeeded.
            created, quarantined = receipt_materialize(org_id=org_id, receipt_id=result.receipt_id,
                                                       items=items if result.created else None)
            result.events_created, result.quarantined = created, quarantined
        failpoints.hit(FP_AFTER_RECEIPT)
    return result


def _receipt_complete(org_id: str, receipt_id) -> bool:
    """Every Component of the Receipt exists (children are never deleted, so this only turns True)."""
    count = Receipt.objects.values_list("component_count", flat=True).get(org_id=org_id, pk=receipt_id)
    return ReceiptComponent.objects.filter(receipt_id=receipt_id).count() >= count


def _admit_locked(org_id, account_key, channel, route, body, items, transport_key, identity) -> AdmissionResult:
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=org_id, account_key=account_key)
        existing = first_row(ReceiptAdmissionKey, org_id=org_id, account_key=account_key, channel=channel,
                             transport_key=transport_key)
        if existing is not None:
            if existing.identity_digest != identity:
                raise AdmissionConflict("this transport key was admitted with different content")
            if existing.receipt_id is None:
                # A V1 acceptance tombstone: already accepted, nothing materializes in V2.
                return AdmissionResult(receipt_id=None, created=False, already_accepted=True)
            return AdmissionResult(receipt_id=existing.receipt_id, created=False)
        quarantined = sum(1 for i in items if i.reason)
        receipt = insert(Receipt, org_id=org_id, epoch=ctx.epoch, account_key=account_key, channel=channel,
                         route_key=route["route_key"], body=body,
                         body_digest=digest_v2("connectors.receipt-body", [("body", body)]).hexdigest,
                         component_count=len(items), quarantined_count=quarantined)
        insert(ReceiptAdmissionKey, org_id=org_id, account_key=account_key, channel=channel,
               transport_key=transport_key, identity_digest=identity, profile_id=PROFILE_V2, receipt=receipt)
        return AdmissionResult(receipt_id=receipt.pk, created=True)


def frozen_route(epoch: ServingEpoch, account_key: str, route_key: str) -> tuple[dict, dict]:
    """The account's frozen facts and the exact route definition of ``epoch``'s pack generation.

    Raises:
        NotServing: the account or route is not part of the epoch.
    """
    account = next((a for a in epoch.document["accounts"] if a["account_key"] == account_key), None)
    if account is None or route_key not in account["routes"]:
        raise NotServing(f"route {route_key} of account {account_key} is not part of epoch {epoch.pk}")
    frozen = account["pack_generation"]
    pack = frozen_row(PackGeneration, pk=frozen["id"], digest=frozen["digest"])  # immutable: once per process
    route = next(r for r in pack.document.get("inbound_routes", []) if r["route_key"] == route_key)
    return account, route


def _chunk_size() -> int:
    return settings.NEXUS_ADMISSION_CHUNK


def receipt_materialize(*, org_id: str, receipt_id: Receipt.Id | int,
                        items: list[_Item] | None = None) -> tuple[int, int]:
    """Materialize the Components (and Events, Projections, Executions) a Receipt still lacks.

    Each chunk is one transaction that locks the gate and the exact active
    epoch, requires it to be the Receipt's own epoch, and inserts only the
    ordinals that do not exist yet; existing children are never rewritten.

    Args:
        items: the classified items of this Receipt's own admission, when the
            caller just classified its body (otherwise the stored body is
            split again under the Receipt epoch's frozen route).

    Returns:
        ``(events_created, quarantined)`` by this call.

    Raises:
        NotServing: the gate is not serving the Receipt's epoch (nothing is inserted).
    """
    receipt = Receipt.objects.get(org_id=org_id, pk=require_id(receipt_id, Receipt, field="receipt_id"))
    _account, route = frozen_route(receipt.epoch, receipt.account_key, receipt.route_key)
    if items is None:
        items = _split_stored(route, bytes(receipt.body))
    if len(items) != receipt.component_count:
        raise AdmissionConflict(f"receipt {receipt.pk} no longer splits into {receipt.component_count} items")
    created = quarantined = 0
    while True:
        with transaction.atomic(durable=True):
            ctx = serving_lock(org_id=org_id, account_key=receipt.account_key)
            if ctx.epoch.pk != receipt.epoch_id:
                raise NotServing(f"receipt {receipt.pk} belongs to epoch {receipt.epoch_id}, not the serving one")
            done = set(ReceiptComponent.objects.filter(receipt=receipt).values_list("ordinal", flat=True))
            missing = [i for i in items if i.ordinal not in done][:_chunk_size()]
            if not missing:
                return created, quarantined
            c, q = _materialize_items(org_id, receipt.account_key, ctx, route, receipt, missing)
            created, quarantined = created + c, quarantined + q
        failpoints.hit(FP_BETWEEN_CHUNKS)


def _split_stored(route: dict, body: bytes) -> list[_Item]:
    """Re-split a stored Receipt body exactly as admission did (deterministic).

    A pulled route's Receipt keeps one envelope; a pushed route's keeps the request body.
    """
    if route.get("delivery") == "pull":
        from connectors.contracts.stream_routes import expand_envelope

        return classify_items(route, expand_envelope(route, parse_body(body)))
    return split_body(route, body)


def _materialize_items(org_id, account_key, ctx, route, receipt, items: list[_Item]) -> tuple[int, int]:
    epoch, account = ctx.epoch, ctx.account
    ordering = account["routes"][route["route_key"]]
    windows: dict[str, Any] = {}
    if "window" in route:
        keys = [grouping_of(route, i.raw, i.partition)[1] for i in items if not i.reason]
        windows = lock_open_windows(org_id=org_id, epoch=epoch, route_key=route["route_key"], grouping_keys=keys)
    created = quarantined = 0
    for item in items:
        if item.reason:
            insert(ReceiptComponent, receipt=receipt, ordinal=item.ordinal, disposition="quarantined",
                   reason_code=item.reason, item=item.raw)
            quarantined += 1
            continue
        event = first_row(Event, org_id=org_id, account_key=account_key,
                          source_event_key=item.source_event_key, event_generation="live")
        if event is not None:
            insert(ReceiptComponent, receipt=receipt, ordinal=item.ordinal, disposition="duplicate",
                   item=item.raw, event=event)
            continue
        event = _materialize(org_id, account_key, epoch, route, account, ordering, receipt, item, windows)
        insert(ReceiptComponent, receipt=receipt, ordinal=item.ordinal, disposition="event", item=item.raw, event=event)
        created += 1
    return created, quarantined


def _materialize(org_id, account_key, epoch, route, account, ordering, receipt, item: _Item,
                 windows: dict | None = None) -> Event:
    """Insert Event, Projection and its first Execution generation on its OrderingLane.

    A windowed route's Projection joins the open window of its grouping key
    instead; the window's seal mints the Execution (``connectors/inbound/windows.py``).
    """
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
    lane = None
    if ordering["ordering"]["contract"] != "order_independent":
        lane = first_row(OrderingLane, epoch=epoch, route_key=route["route_key"], partition_key=partition_key)
        if lane is None:
            lane = OrderingLaneStore.create(org_id=org_id, epoch=epoch, account_key=account_key,
                                            route_key=route["route_key"], partition_key=partition_key,
                                            partition=item.partition, state="open")
    if "window" in route:
        grouping, grouping_key = grouping_of(route, item.raw, item.partition)
        window = window_for_member(org_id=org_id, epoch=epoch, account_key=account_key, route=route, lane=lane,
                                   grouping=grouping, grouping_key=grouping_key, held=windows)
        insert(Projection, org_id=org_id, event=event, route_key=route["route_key"],
               definition_digest=definition_digest, input_digest=input_digest, window=window)
        window_add_member(window, epoch, account)
        return event
    projection = insert(Projection, org_id=org_id, event=event, route_key=route["route_key"],
                        definition_digest=definition_digest, input_digest=input_digest)
    command_id = digest_v2("connectors.runtime-command", [
        ("org_id", org_id), ("projection_id", projection.pk), ("generation", 1)]).hexdigest
    execution_ref = digest_v2("connectors.execution-ref", [
        ("command_id", command_id), ("projection_id", projection.pk),
        ("pack_generation_id", account["pack_generation"]["id"]), ("epoch_digest", epoch.digest),
        ("definition_digest", definition_digest), ("input_digest", input_digest)]).hexdigest
    ExecutionStore.create(org_id=org_id, projection=projection, generation=1, lane=lane, position=item.position,
                          state="ready", command_id=command_id, execution_ref_digest=execution_ref)
    return event


def receipt_try_reconcile_one() -> bool:
    """Materialize the missing children of one Receipt (crash recovery). Returns ``True`` if it did work."""
    from connectors.selectors import receipts_missing_children

    for org_id, receipt_id in receipts_missing_children():
        try:
            receipt_materialize(org_id=org_id, receipt_id=receipt_id)
        except NotServing:
            continue  # its epoch is not serving: it stays visible until the gate serves it again
        except (AdmissionError, DataError) as exc:
            # One Receipt that cannot be split again (or whose item does not fit a column) must not
            # stop recovery of every other one.
            log.error("receipt %s cannot be materialized: %s", receipt_id, exc,
                      extra={"code": getattr(exc, "code", None)})
            continue
        return True
    return False
