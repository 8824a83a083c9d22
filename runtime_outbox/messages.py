"""Runtime message families: one outbox/inbox boundary between authorities.

ARCHITECTURE.md section 2 "Runtime message families"; seed 004 sections
10.7, 14.2 and 15.1-15.2. Every crossing between authorities is a Runtime
message, never a direct call:

- a family is declared here once (:func:`declare_family`, at import time)
  and gets exactly one consumer, registered by the owning app in its
  ``AppConfig.ready()`` (:func:`register_consumer`);
- the producer calls :func:`publish` inside its own transaction: the
  ``OutboxMessage`` carries family, message key, frozen payload, payload
  digest and the full trusted Runtime work scope; ``(family, message_key)``
  dedupes, and a different payload under the same key fails closed;
- delivery hands the consumer an immutable :class:`Envelope`, never an ORM
  row; the consumer commits its durable acceptance before it returns, and
  only then is the message marked delivered (the relay,
  ``services.outbox_try_deliver_one``, or the same-transaction
  :func:`deliver_in_transaction` allowed by seed 004 section 14.2 step 1);
- a consumer without an acceptance row of its own records one with
  :func:`inbox_accept` (the ``InboxAcceptance`` keyed by message key alone,
  seed 004 section 10.7); :func:`inbox_reject_if_unaccepted` is the
  ``RejectIfUnaccepted`` fence.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from django.db import IntegrityError, OperationalError, transaction

from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.rows import first_row, row_exists
from nexusflow.kernel.scope import TrustedRuntimeWorkScope

from .models import InboxAcceptance, OutboxMessage
from .store import InboxAcceptanceStore, OutboxMessageStore

log = logging.getLogger(__name__)

#: Inside the accepting (or rejecting) transaction, after its row insert: race tests hold it open here.
FP_ACCEPT_BEFORE_COMMIT = failpoints.declare("inbox.accept_before_commit")
FP_REJECT_BEFORE_COMMIT = failpoints.declare("inbox.reject_before_commit")


class MessageFamilyError(NexusError):
    """A family is declared twice, unknown, without its one consumer, or given a second one."""

    code = "message_family_invalid"
    definite = True


class OutboxConflict(NexusError):
    """``(family, message_key)`` is already published with another payload digest or work scope: fail closed."""

    code = "outbox_digest_conflict"
    definite = True


class EnvelopeCorrupt(NexusError):
    """A stored message's payload no longer matches its digest: it is never handed to a consumer."""

    code = "outbox_payload_digest_mismatch"
    definite = True


class InboxConflict(NexusError):
    """The message key is fenced with other validation attributes (scope, digest, family, outbox identity).

    Seed 004 section 10.7: fail closed against the existing row, create
    nothing, disclose nothing of the other work scope.
    """

    code = "inbox_digest_conflict"
    definite = True


class InboxRejected(InboxConflict):
    """The message key carries a durable ``rejected`` tombstone: no acceptance can ever commit."""

    code = "inbox_handoff_rejected"


class InboxAcceptanceRaced(NexusError):
    """Another transaction committed an acceptance or tombstone for the key first: this one rolls back (retry)."""

    code = "inbox_acceptance_raced"


class AcceptanceMissing(NexusError):
    """The consumer returned without a matching committed acceptance: the message is not acknowledged."""

    code = "inbox_acceptance_missing"


# --- families -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Family:
    """One declared message family.

    Attributes:
        name: the family name, e.g. ``"outbound.command"``.
        payload_schema_version: version of the payload shape (part of the payload digest).
        inbox: the consumer records an :class:`InboxAcceptance` (:func:`inbox_accept`); the relay checks
            that row before it acknowledges. Otherwise the consumer's own durable row is its acceptance.
        seed: the section that specifies the family.
    """

    name: str
    payload_schema_version: int
    inbox: bool
    seed: str


Consumer = Callable[["Envelope"], None]


class MessageRegistry:
    """Families and their one consumer each (as Sentry binds an ``OutboxCategory`` to one ``OutboxScope``)."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self._consumers: dict[str, Consumer] = {}

    def declare_family(self, name: str, *, payload_schema_version: int, inbox: bool, seed: str) -> Family:
        """Declare family ``name`` (once, at import time) and return it.

        Raises:
            MessageFamilyError: ``name`` is already declared (``message_family_redeclared``) or the
                schema version is not a positive int.
        """
        if name in self._families:
            raise MessageFamilyError(f"message family {name!r} is already declared", code="message_family_redeclared")
        if type(payload_schema_version) is not int or payload_schema_version < 1:
            raise MessageFamilyError(f"{name}: payload_schema_version must be a positive int")
        family = Family(name, payload_schema_version, inbox, seed)
        self._families[name] = family
        return family

    def register_consumer(self, family: str, fn: Consumer) -> None:
        """Make ``fn(envelope)`` the one consumer of ``family`` (from the owning app's ``ready()``).

        Registering the same function again is a no-op.

        Raises:
            MessageFamilyError: ``family`` is not declared (``message_family_unknown``) or already has
                another consumer (``message_family_consumer_taken``).
        """
        self.family(family)
        current = self._consumers.get(family)
        if current is fn:
            return
        if current is not None:
            raise MessageFamilyError(f"message family {family!r} already has consumer "
                                     f"{current.__module__}.{current.__qualname__}",
                                     code="message_family_consumer_taken")
        self._consumers[family] = fn

    def family(self, name: str) -> Family:
        """Raises: MessageFamilyError: ``name`` is not declared (``message_family_unknown``)."""
        try:
            return self._families[name]
        except KeyError:
            raise MessageFamilyError(f"unknown message family {name!r}", code="message_family_unknown") from None

    def consumer(self, name: str) -> Consumer:
        """Raises: MessageFamilyError: unknown family, or no consumer registered (``message_family_unconsumed``)."""
        self.family(name)
        try:
            return self._consumers[name]
        except KeyError:
            raise MessageFamilyError(f"message family {name!r} has no consumer",
                                     code="message_family_unconsumed") from None

    def families(self) -> tuple[Family, ...]:
        return tuple(self._families.values())

    def unconsumed(self) -> list[str]:
        """Declared families without a consumer (the system check reports them)."""
        return sorted(set(self._families) - set(self._consumers))


def check_every_family_consumed(app_configs=None, **kwargs) -> list:
    """Django system check: one error per declared family without a consumer (``runtime_outbox.E001``)."""
    from django.core import checks

    return [checks.Error(f"Runtime message family {name!r} has no consumer",
                         hint="register one in the owning app's AppConfig.ready() (register_consumer)",
                         id="runtime_outbox.E001") for name in REGISTRY.unconsumed()]


REGISTRY = MessageRegistry()
declare_family = REGISTRY.declare_family
register_consumer = REGISTRY.register_consumer

OUTBOUND_COMMAND = declare_family(
    "outbound.command", payload_schema_version=1, inbox=True,
    seed="ARCHITECTURE.md section 4; seed 003 \"Outbound facts\"").name
FLOW_EFFECT_SUBMIT = declare_family(
    "flow.effect.submit", payload_schema_version=1, inbox=True, seed="seed 004 sections 10.7 and 15.1").name
INTENT_COMPLETED = declare_family(
    "intent.completed", payload_schema_version=1, inbox=False, seed="seed 004 sections 14.2 and 15.2").name
#: V1's RuntimeCommandHandoff: one V1 event's application command into the durable Runtime command inbox.
#: Its acceptance (the InboxAcceptance) is the V1 event's completion (seed 003 "Existing foundations and
#: schema ownership": "the V1 handoff receipt remains a V1 recovery ledger until V1 drains").
RUNTIME_COMMAND_HANDOFF = declare_family(
    "runtime.command.handoff", payload_schema_version=1, inbox=True,
    seed='seed 003 "Existing foundations and schema ownership" and "V1 concepts to retire"').name
#: The families that deliver an OutboundCommand to its effect owner (one message per command).
COMMAND_FAMILIES = (OUTBOUND_COMMAND, FLOW_EFFECT_SUBMIT)


# --- payloads -------------------------------------------------------------------------------------------
def message_digest(family: str, payload_schema_version: int, message_key: str, payload: Mapping[str, Any]) -> str:
    """The payload digest of a message: v2 profile over family, schema version, key and canonical payload JSON.

    Returns:
        64 lowercase hex characters.
    """
    return digest_v2("runtime.outbox-message", [
        ("family", family), ("payload_schema_version", payload_schema_version), ("message_key", message_key),
        ("payload", canonical_json.dumps(_thaw(payload)))]).hexdigest


def seal(family: str, key: str, payload: Mapping[str, Any]) -> tuple[int, dict[str, Any], str]:
    """``(payload_schema_version, stored payload, payload_digest)`` exactly as :func:`publish` stores them.

    The stored payload is the canonical JSON round trip of ``payload`` (tuples
    become lists, int subclasses ints), so the digest recomputed from the
    stored row is the one written.

    Raises:
        MessageFamilyError: ``family`` is not declared.
        ValueError / TypeError: ``payload`` is not JSON.
    """
    version = REGISTRY.family(family).payload_schema_version
    stored = json.loads(canonical_json.dumps(_thaw(payload)))
    return version, stored, message_digest(family, version, key, stored)


def command_message(command) -> tuple[str, str, dict[str, Any]]:
    """``(family, message_key, payload)`` of the message that delivers ``command`` to its effect owner.

    ``flow.effect.submit`` for an intent authored by a Flow EffectSubmit step
    (``origin_flow_run_id`` set), else ``outbound.command``; the key is the
    intent idempotency key (the ``EffectHandoffKey``: it encodes the full
    trusted scope and the logical effect). The payload names what the
    consumer needs to load and validate the intent. Pure: the backfill
    migration computes existing rows with it.
    """
    payload: dict[str, Any] = {
        "command_id": int(command.pk), "idempotency_key": command.idempotency_key,
        "frozen_binding_digest": command.frozen_binding_digest, "account_key": command.account_key,
        "contract_key": command.contract_key, "link_key": command.link_key,
        "effect_root_id": command.effect_root_id, "effect_slot_id": command.effect_slot_id,
        "effect_generation_id": command.effect_generation_id,
    }
    if command.origin_flow_run_id is None:
        return OUTBOUND_COMMAND, command.idempotency_key, payload
    payload["flow_run_id"] = int(command.origin_flow_run_id)
    return FLOW_EFFECT_SUBMIT, command.idempotency_key, payload


def intent_completed_message(command, receipt) -> tuple[str, dict[str, Any]]:
    """``(message_key, payload)`` of the ``intent.completed`` message of ``receipt`` (one per intent)."""
    return command.idempotency_key, {
        "command_id": int(command.pk), "receipt_id": int(receipt.pk), "receipt_digest": receipt.digest,
        "flow_run_id": int(command.origin_flow_run_id),
        "dependency_key": command.origin_dependency_key or str(command.pk),
    }


def scope_of(row) -> TrustedRuntimeWorkScope:
    """The trusted Runtime work scope persisted on ``row`` (a message, acceptance or intent)."""
    return TrustedRuntimeWorkScope(row.org_id, row.app_installation_id, row.runtime_capability_id,
                                   row.binding_digest)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item) for item in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(item) for item in value]
    return value


#: A consumer's mutable copy of a frozen envelope payload value (read-only mappings and tuples back to dicts and lists).
thaw = _thaw


# --- envelopes ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Envelope:
    """The immutable delivery of one message to its consumer (never an ORM row).

    Attributes:
        scope: the full trusted Runtime work scope persisted with the message.
        family / message_key / payload_schema_version: as published.
        payload: a deep-frozen copy (read-only mappings, tuples for lists).
        payload_digest: :func:`message_digest` of the above (64 hex).
        outbox_message_id: the canonical Runtime outbox identity.
    """

    scope: TrustedRuntimeWorkScope
    family: str
    message_key: str
    payload_schema_version: int
    payload: Mapping[str, Any]
    payload_digest: str
    outbox_message_id: int


def envelope_of(message: OutboxMessage) -> Envelope:
    """Build the envelope of a stored message, checking its payload against its digest.

    Raises:
        EnvelopeCorrupt: the stored payload does not produce the stored digest.
        MessageFamilyError: the family is not declared.
    """
    family = REGISTRY.family(message.family)
    if message_digest(family.name, message.payload_schema_version, message.message_key,
                      message.payload) != message.payload_digest:
        raise EnvelopeCorrupt(f"outbox message {message.pk}: payload does not match its digest")
    return Envelope(scope=scope_of(message), family=message.family, message_key=message.message_key,
                    payload_schema_version=message.payload_schema_version, payload=_freeze(message.payload),
                    payload_digest=message.payload_digest, outbox_message_id=message.pk)


# --- publish ----------------------------------------------------------------------------------------------
def publish(scope: TrustedRuntimeWorkScope, family: str, key: str, payload: Mapping[str, Any], *,
            command=None) -> OutboxMessage:
    """Write the outbox message ``(family, key)`` in the caller's transaction and return it.

    Publishing the same ``(family, key)`` again with the same payload digest
    and scope returns the existing row (an exact retry). The unique key is
    taken last, after the producer's own rows (ARCHITECTURE.md section 6,
    "Runtime rows last").

    Args:
        scope: the producer's trusted Runtime work scope (from its persisted binding, never a payload).
        family: a declared family name.
        key: the canonical message key (at most 128 characters).
        payload: JSON-serializable mapping; stored as its canonical JSON round trip.
        command: the OutboundCommand the message is about (its scope must be ``scope``).

    Raises:
        RuntimeError: called outside a transaction.
        MessageFamilyError: ``family`` is not declared.
        OutboxConflict: the key is published with another payload digest (``outbox_digest_conflict``) or
            another work scope (``outbox_scope_conflict``), or ``command`` is of another scope.
        InvalidIdentity: ``key`` is not canonical (before SQL).
        ValueError / TypeError: ``payload`` is not JSON (NaN, a set, ...).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("Runtime messages are published inside the producer's transaction")
    version, stored, digest = seal(family, key, payload)
    if command is not None and scope_of(command) != scope:
        raise OutboxConflict(f"{family}: the command is of another work scope", code="outbox_scope_conflict")
    existing = first_row(OutboxMessage, family=family, message_key=key)
    if existing is None:
        try:
            with transaction.atomic():
                return OutboxMessageStore.create(
                    org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                    runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest,
                    family=family, message_key=key, payload_schema_version=version, payload=stored,
                    payload_digest=digest, command=command, state="pending")
        except IntegrityError:
            # A concurrent producer committed the same key first: compare with its row.
            existing = first_row(OutboxMessage, family=family, message_key=key)
            if existing is None:
                raise
    if scope_of(existing) != scope:
        raise OutboxConflict(f"{family} message {key} exists under another work scope", code="outbox_scope_conflict")
    if existing.payload_digest != digest:
        raise OutboxConflict(f"{family} message {key} exists with another payload digest")
    return existing


# --- delivery ---------------------------------------------------------------------------------------------
def deliver(envelope: Envelope) -> None:
    """Hand ``envelope`` to its family's consumer; return once its acceptance is committed and matches.

    For an ``inbox`` family the committed :class:`InboxAcceptance` must match
    the envelope's full scope, family, outbox identity and payload digest
    (seed 004 section 10.7) before the caller may acknowledge.

    Raises:
        MessageFamilyError: the family has no consumer.
        AcceptanceMissing: the consumer returned without a matching accepted row.
        NexusError: whatever the consumer refuses with (the message is not acknowledged).
    """
    REGISTRY.consumer(envelope.family)(envelope)
    if REGISTRY.family(envelope.family).inbox:
        row = first_row(InboxAcceptance, org_id=envelope.scope.org_id, message_key=envelope.message_key)
        if row is None or row.state != "accepted" or _fence_mismatch(
                _fence_of(row), envelope.scope, envelope.family, envelope.payload_digest, envelope.outbox_message_id):
            raise AcceptanceMissing(f"{envelope.family} message {envelope.outbox_message_id}: no matching "
                                    f"acceptance committed")


def deliver_in_transaction(message: OutboxMessage) -> bool:
    """Deliver a just-published message inside the producer's transaction (a same-process optimization).

    Seed 004 section 14.2 step 1 (producer evidence shares the database): the
    consumer runs in a savepoint and the message is marked delivered in it.
    When the consumer raises, only the savepoint rolls back: the message
    stays pending for the relay (``outbox_try_deliver_one``) and the
    producer's transaction goes on. An ``OperationalError`` (deadlock, lost
    connection) may have ended the whole transaction and is raised.

    Returns:
        True when delivered (now or before), False when left to the relay.
    """
    if message.state != "pending":
        return True
    try:
        with transaction.atomic():
            deliver(envelope_of(message))
            OutboxMessageStore.transition(org_id=message.org_id, pk=message.pk, src="pending", dst="delivered",
                                          version=message.version, set_fields={"delivered_at": db_now()})
    except OperationalError:
        raise
    except Exception as exc:  # a consumer failure must not fail the producer
        log.warning("local delivery of %s message %s failed, left to the relay: %s", message.family, message.pk,
                    exc, extra={"org_id": message.org_id, "code": getattr(exc, "code", type(exc).__name__)})
        return False
    return True


# --- inbox ---------------------------------------------------------------------------------------------------
def _fence_mismatch(stored: tuple[TrustedRuntimeWorkScope, str, int, str], scope: TrustedRuntimeWorkScope,
                    family: str, payload_digest: str, outbox_message_id: int) -> str | None:
    """The code of the first validation attribute that differs from ``stored``, or None (scope first).

    ``stored``: ``(scope, family, outbox message id, payload digest)`` of the persisted row.
    """
    stored_scope, stored_family, stored_outbox_id, stored_digest = stored
    if stored_scope != scope:
        return "inbox_scope_conflict"
    if stored_family != family or int(stored_outbox_id) != int(outbox_message_id):
        return "inbox_outbox_conflict"
    if stored_digest != payload_digest:
        return "inbox_digest_conflict"
    return None


def _fence_of(row: InboxAcceptance) -> tuple[TrustedRuntimeWorkScope, str, int, str]:
    return scope_of(row), row.family, row.outbox_message_id, row.payload_digest


def _check_fence(row: InboxAcceptance, scope: TrustedRuntimeWorkScope, family: str, payload_digest: str,
                 outbox_message_id: int) -> None:
    code = _fence_mismatch(_fence_of(row), scope, family, payload_digest, outbox_message_id)
    if code is not None:
        # No value of the existing row is disclosed: it may belong to another work scope.
        raise InboxConflict(f"message key {row.message_key} is fenced with other validation attributes", code=code)


def inbox_accept(envelope: Envelope, *, consumer: str, accepted_ref_fn: Callable[[], str]) -> InboxAcceptance:
    """Record the acceptance of ``envelope`` inside the consumer's own transaction, once per message key.

    Seed 004 sections 10.7 and 15.1. An existing row for the key is locked
    and compared: the same scope, family, outbox identity and digest return
    it without calling ``accepted_ref_fn`` (a duplicate delivery creates
    nothing); anything else fails closed. For a new key ``accepted_ref_fn()``
    creates (or finds) the consumer's one record and names it, then the
    ``accepted`` row is inserted last; the unique key serializes this against
    a concurrent acceptance or ``RejectIfUnaccepted`` tombstone.

    Args:
        envelope: the delivered envelope.
        consumer: stable consumer name stored on the row (e.g. ``"connectors.inbox"``).
        accepted_ref_fn: ``() -> str`` run in the caller's transaction; returns e.g. ``"remote_effect:<id>"``.

    Returns:
        The accepted row (existing or new).

    Raises:
        RuntimeError: called outside a transaction.
        MessageFamilyError: the family does not record inbox acceptances.
        InboxConflict: the key is fenced under another scope (``inbox_scope_conflict``), family or outbox
            identity (``inbox_outbox_conflict``) or payload digest (``inbox_digest_conflict``).
        InboxRejected: the key carries a rejected tombstone (``inbox_handoff_rejected``).
        InboxAcceptanceRaced: another transaction committed the key first; the caller's transaction must
            roll back (raising out of it does) and the delivery is retried.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("inbox acceptance runs inside the consumer's transaction")
    if not REGISTRY.family(envelope.family).inbox:
        raise MessageFamilyError(f"{envelope.family} does not record inbox acceptances",
                                 code="message_family_not_inbox")
    # Discover without a lock: the consumer's own rows come before Runtime rows in the lock order.
    if row_exists(InboxAcceptance, message_key=envelope.message_key):
        existing = InboxAcceptanceStore.lock_key(envelope.message_key)
        _check_fence(existing, envelope.scope, envelope.family, envelope.payload_digest, envelope.outbox_message_id)
        if existing.state != "accepted":
            raise InboxRejected(f"message key {envelope.message_key} was rejected: it can never be accepted")
        return existing
    accepted_ref = accepted_ref_fn()
    scope = envelope.scope
    try:
        with transaction.atomic():
            row = InboxAcceptanceStore.create(
                org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest,
                family=envelope.family, message_key=envelope.message_key,
                outbox_message_id=envelope.outbox_message_id, payload_digest=envelope.payload_digest,
                consumer=consumer, accepted_ref=accepted_ref, state="accepted")
    except IntegrityError:
        raise InboxAcceptanceRaced(f"message key {envelope.message_key} was accepted or rejected concurrently; "
                                   f"this delivery rolls back") from None
    failpoints.hit(FP_ACCEPT_BEFORE_COMMIT)
    return row


def inbox_reject_if_unaccepted(*, scope: TrustedRuntimeWorkScope, family: str, message_key: str,
                               payload_digest: str, outbox_message_id: int, consumer: str) -> InboxAcceptance:
    """The ``RejectIfUnaccepted`` fence: return the key's existing row, or record a durable rejected tombstone.

    Seed 004 sections 10.7 and 15.4. Runs outside any transaction, in its
    own: it locks the key's row (waiting for an in-flight acceptance of the
    same key to commit or roll back) and validates the four exact values of
    the persisted canonical message. A tombstone refuses every later
    acceptance of the key (:class:`InboxRejected`).

    Args:
        scope / family / message_key / payload_digest / outbox_message_id: the persisted message's values.
        consumer: the consumer name stored on a new tombstone.

    Returns:
        The existing ``accepted`` (or ``rejected``) row, or the new ``rejected`` tombstone.

    Raises:
        RuntimeError: called inside a transaction.
        MessageFamilyError: the family does not record inbox acceptances.
        InboxConflict: a value differs from the existing row or from the persisted outbox message.
        InvalidIdentity: a non-canonical key or a non-OutboxMessage id (before SQL).
    """
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("RejectIfUnaccepted runs outside any Runtime mutation transaction")
    if not REGISTRY.family(family).inbox:
        raise MessageFamilyError(f"{family} does not record inbox acceptances", code="message_family_not_inbox")
    outbox_message_id = require_id(outbox_message_id, OutboxMessage, field="outbox_message_id")
    for _ in range(3):
        try:
            with transaction.atomic(durable=True):
                existing = InboxAcceptanceStore.lock_key(message_key)
                if existing is not None:
                    _check_fence(existing, scope, family, payload_digest, outbox_message_id)
                    return existing
                message = first_row(OutboxMessage, family=family, message_key=message_key)
                if message is None or _fence_mismatch(
                        (scope_of(message), message.family, message.pk, message.payload_digest), scope, family,
                        payload_digest, outbox_message_id):
                    raise InboxConflict(f"message key {message_key}: the values are not those of the persisted "
                                        f"outbox message", code="inbox_outbox_conflict")
                row = InboxAcceptanceStore.create(
                    org_id=scope.org_id, app_installation_id=scope.app_installation_id,
                    runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest,
                    family=family, message_key=message_key, outbox_message_id=outbox_message_id,
                    payload_digest=payload_digest, consumer=consumer, accepted_ref="", state="rejected")
                failpoints.hit(FP_REJECT_BEFORE_COMMIT)
                return row
        except IntegrityError:
            continue  # an acceptance committed between the lock and the insert: read it under the lock
    raise InboxAcceptanceRaced(f"message key {message_key}: the fence could not be read or written")

