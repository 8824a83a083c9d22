"""Stream ingress: pull envelopes of a pulled route, admit them, then advance a durable cursor.

Seed 003 "Inbound facts" and its maintenance contract "each ingress owner can
stop pollers and streams without advancing its durable cursor". One poll:

1. read the route's :class:`StreamCursor` (``stopped``: do nothing);
2. fetch at most ``batch_limit`` envelopes after the cursor
   (``connectors/inbound/stream_transport.py``, no transaction held);
3. admit every envelope through the shared admission path
   (:func:`connectors.inbound.admission.admit_items`): one Receipt per envelope, keyed
   by a transport key derived from the envelope's opaque id, one
   ReceiptComponent per fanned-out item, each in its own fenced transaction;
4. only then, in its own transaction, move the cursor to the source's next
   position by compare-and-swap on the version read in step 1.

A crash between 3 and 4 leaves the cursor where it was: the next poll reads
the same batch again and every envelope resolves its existing Receipt through
its ReceiptAdmissionKey, so nothing is lost or doubled. A stop (or another
poller) moving the cursor row meanwhile makes step 4 a no-op.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from connectors.contracts.stream_routes import encode_cursor, envelope_transport_key, expand_envelope, render_cursor
from connectors.inbound.admission import AdmissionError, admit_items
from connectors.inbound.stream_transport import StreamFetchFailed, fetch_batch
from connectors.models import AccountServingGate, CredentialGeneration, PackGeneration, StreamCursor
from connectors.serving.gates import CredentialUnavailable, NotServing, find_account_org, resolve_secret
from connectors.store import StreamCursorStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.errors import NexusError

log = logging.getLogger(__name__)

FP_AFTER_FETCH = failpoints.declare("stream.after_fetch")
FP_AFTER_RECEIPTS = failpoints.declare("stream.after_receipts_commit")

#: Errors that end one poll of one route without advancing its cursor.
POLL_ERRORS = (NotServing, CredentialUnavailable, StreamFetchFailed, AdmissionError)


class UnknownStream(NexusError):
    """No serving account has this pulled route."""

    code = "unknown_stream"


@dataclass(frozen=True)
class PullTarget:
    """One pulled route of one serving account, as its active epoch froze it."""

    org_id: str
    account_key: str
    route: dict
    base_url: str
    credential_id: int

    @property
    def route_key(self) -> str:
        return self.route["route_key"]


@dataclass(frozen=True)
class PollResult:
    """What one poll did. ``advanced`` is False when the cursor did not move."""

    fetched: int = 0
    receipts_created: int = 0
    receipts_resolved: int = 0
    events_created: int = 0
    quarantined: int = 0
    advanced: bool = False
    stopped: bool = False
    cursor: bytes | None = None


def _targets_of(gate: AccountServingGate) -> list[PullTarget]:
    if gate.state != "v2_serving" or gate.epoch is None:
        return []
    account = next((a for a in gate.epoch.document["accounts"] if a["account_key"] == gate.account_key), None)
    if account is None:
        return []
    pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
    out = []
    for route in pack.document.get("inbound_routes", []):
        if route.get("delivery") != "pull" or route["route_key"] not in account["routes"]:
            continue
        credential = account["credentials"].get(route["credential_ref"])
        if credential is None or not account.get("base_url"):
            log.warning("pulled route %s of %s has no credential or base_url", route["route_key"], gate.account_key)
            continue
        out.append(PullTarget(gate.org_id, gate.account_key, route, account["base_url"], credential["id"]))
    return out


def pull_targets(*, account_key: str | None = None, route_key: str | None = None) -> list[PullTarget]:
    """Every pulled route of every ``v2_serving`` account (or of one account), in key order.

    Raises:
        UnknownStream: ``account_key`` is given and has no such pulled route.
        NotServing: ``account_key`` is given and its gate is not ``v2_serving``.
    """
    if account_key is not None:
        org_id = find_account_org(account_key)
        gates = list(AccountServingGate.objects.filter(org_id=org_id, account_key=account_key)
                     .select_related("epoch")) if org_id else []
        if gates and gates[0].state != "v2_serving":
            raise NotServing(f"account {account_key} gate is {gates[0].state}")
    else:
        gates = list(AccountServingGate.objects.filter(state="v2_serving").select_related("epoch")
                     .order_by("org_id", "account_key"))
    targets = [t for gate in gates for t in _targets_of(gate) if route_key in (None, t.route_key)]
    if account_key is not None and not targets:
        raise UnknownStream(f"account {account_key!r} serves no pulled route{f' {route_key!r}' if route_key else ''}")
    return targets


def stream_cursor_for(target: PullTarget) -> StreamCursor:
    """Return the route's cursor, creating it ``active`` at the start of the stream on first use."""
    key = {"org_id": target.org_id, "account_key": target.account_key, "route_key": target.route_key}
    existing = StreamCursor.objects.filter(**key).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic(durable=True):
            return StreamCursorStore.create(state="active", cursor=None, **key)
    except IntegrityError:  # a concurrent poller created it first
        return StreamCursor.objects.get(**key)


def stream_poll_once(target: PullTarget, *, client=None) -> PollResult:
    """Fetch one batch of ``target``, admit every envelope, then advance its cursor.

    Args:
        target: from :func:`pull_targets`.
        client: an ``httpx.Client`` to reuse (tests); default a short-lived one.

    Returns:
        :class:`PollResult`; ``stopped`` when the cursor is stopped (nothing fetched).

    Raises:
        NotServing / CredentialUnavailable (503-class, retry later),
        StreamFetchFailed (source unreachable or non-200),
        MalformedBody (unusable fetch response), AdmissionConflict (an opaque id
        re-served with other content). In every case the cursor stays where it was.
    """
    cursor = stream_cursor_for(target)
    if cursor.state != "active":
        return PollResult(stopped=True, cursor=_bytes(cursor.cursor))
    token = resolve_secret(CredentialGeneration.objects.get(org_id=target.org_id, pk=target.credential_id))
    batch = fetch_batch(base_url=target.base_url, route=target.route, token=token,
                        cursor=render_cursor(_bytes(cursor.cursor)), client=client)
    failpoints.hit(FP_AFTER_FETCH)
    if not batch.envelopes:
        return PollResult(cursor=_bytes(cursor.cursor))
    created = resolved = events = quarantined = 0
    last_receipt = None
    for envelope in batch.envelopes:
        result = admit_items(org_id=target.org_id, account_key=target.account_key, channel=target.route["channel"],
                             route=target.route, body=canonical_json.dumps(envelope),
                             raw_items=expand_envelope(target.route, envelope),
                             transport_key=envelope_transport_key(target.route, envelope))
        last_receipt = result.receipt_id
        if result.created:
            created += 1
            events += result.events_created
            quarantined += result.quarantined
        else:
            resolved += 1
    failpoints.hit(FP_AFTER_RECEIPTS)
    new_cursor = encode_cursor(batch.next_cursor)
    advanced = stream_cursor_advance(cursor, to=new_cursor, last_receipt_id=last_receipt)
    return PollResult(fetched=len(batch.envelopes), receipts_created=created, receipts_resolved=resolved,
                      events_created=events, quarantined=quarantined, advanced=advanced,
                      cursor=new_cursor if advanced else _bytes(cursor.cursor))


def stream_cursor_advance(read: StreamCursor, *, to: bytes, last_receipt_id) -> bool:
    """Move the cursor from the state it had when its batch was fetched to ``to``.

    Runs after the batch's Receipts committed. Returns False, moving nothing,
    when the cursor was stopped, resumed or advanced by another poller since
    ``read`` was taken (its version moved).
    """
    with transaction.atomic(durable=True):
        row = StreamCursorStore.lock(read.org_id, read.pk)
        if row.state != "active" or row.version != read.version:
            log.info("stream cursor %s moved since the fetch (v%s -> v%s, %s); not advanced",
                     read.pk, read.version, row.version, row.state)
            return False
        StreamCursorStore.touch(org_id=row.org_id, pk=row.pk, state="active", version=row.version,
                                set_fields={"cursor": to, "batches": row.batches + 1,
                                            "last_receipt_id": last_receipt_id})
    return True


def stream_cursor_set_state(target: PullTarget, *, state: str) -> StreamCursor:
    """Stop (``stopped``) or resume (``active``) a route's poller; the cursor position is never touched.

    Returns the cursor row as it is afterwards (unchanged when already in ``state``).

    Raises:
        IllegalTransition: ``state`` is not ``active`` or ``stopped``.
    """
    cursor = stream_cursor_for(target)
    with transaction.atomic(durable=True):
        row = StreamCursorStore.lock(cursor.org_id, cursor.pk)
        if row.state != state:
            StreamCursorStore.transition(org_id=row.org_id, pk=row.pk, src=row.state, dst=state, version=row.version)
    return StreamCursor.objects.get(org_id=cursor.org_id, pk=cursor.pk)


def stream_try_poll_one(*, client=None) -> bool:
    """Poll one batch of every serving pulled route; ``True`` if any envelope was fetched.

    A route whose poll fails is logged and skipped; its cursor stays put.
    """
    worked = False
    for target in pull_targets():
        try:
            result = stream_poll_once(target, client=client)
        except POLL_ERRORS as exc:
            log.warning("stream poll of %s/%s failed (%s): %s", target.account_key, target.route_key, exc.code, exc,
                        extra={"org_id": target.org_id, "code": exc.code})
            continue
        worked = worked or result.fetched > 0
    return worked


def _bytes(value) -> bytes | None:
    return None if value is None else bytes(value)
