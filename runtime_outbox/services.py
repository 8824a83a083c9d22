"""Runtime use cases: application results, outbound intents, outbox delivery, intent receipts.

Seed 003 "Runtime-owned result" and "Outbound facts"; ARCHITECTURE.md
section 4 (the single outbound effect model) and section 2 "Runtime message
families" (:mod:`runtime_outbox.messages`).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging

from django.db import IntegrityError, OperationalError, transaction

from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import NexusError, StaleVersion
from nexusflow.kernel.models import insert
from nexusflow.kernel.rows import first_row
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope

from . import commands, handoff, messages, ports, replay_guard
from .models import ApplicationResult, IntentResultReceipt, OutboundCommand, OutboxMessage
from .owner import OwnerDeleted, OwnerFenceMissing
from .selectors import outbox_message_due
from .store import OutboxMessageStore
from .transitions import INTENT_RESULT_OUTCOMES

log = logging.getLogger(__name__)

FP_AFTER_EFFECT_ACCEPT = failpoints.declare("outbox.after_effect_accept")
FP_CLAIM_BEFORE_COMMIT = failpoints.declare("outbox.claim_before_commit")


class ResultMismatch(NexusError):
    """The command id exists under another ExecutionRef digest: fail closed."""

    code = "application_result_mismatch"


class IntentMismatch(NexusError):
    code = "outbound_intent_mismatch"


# --- Application results ------------------------------------------------------
def application_command_submit(*, org_id: str, command_id: str, execution_ref_digest: str,
                               command: dict) -> ApplicationResult:
    """Apply one application command exactly once and return its immutable result.

    The record mutation, any Flow runs it triggers and the ApplicationResult
    commit in one transaction. Submitting the same ``command_id`` and digest
    again returns the stored result without re-applying.

    Raises:
        ResultMismatch: ``command_id`` is stored with a different ExecutionRef digest.
        UnknownCommand: the route names an unknown application command.
    """
    for _ in range(5):
        existing = first_row(ApplicationResult, org_id=org_id, command_id=command_id)
        if existing is not None:
            if existing.execution_ref_digest != execution_ref_digest:
                raise ResultMismatch(f"command {command_id} has no result for this ExecutionRef")
            return existing
        try:
            with transaction.atomic(durable=True):
                return application_command_apply(org_id=org_id, command_id=command_id,
                                                  execution_ref_digest=execution_ref_digest, command=command,
                                                  result_absent=True)
        except IntegrityError:
            # Either the same command committed concurrently, or an inbound link
            # race lost: re-read, and re-apply on top of the winner if needed.
            continue
        except OperationalError as exc:
            # A deadlock victim or lock-wait timeout rolled back entirely: retry it.
            if exc.args and exc.args[0] in (1205, 1213):
                continue
            raise
    raise NexusError(f"command {command_id} could not be applied after retries", code="application_contention")


def application_command_apply(*, org_id: str, command_id: str, execution_ref_digest: str,
                              command: dict, result_absent: bool = False) -> ApplicationResult:
    """Apply one application command inside the caller's transaction; return its (new or stored) result.

    The shared body of :func:`application_command_submit` and of the Runtime
    command inbox (:mod:`runtime_outbox.command_inbox`): an existing result of
    ``command_id`` with the same digest is returned unapplied.

    Args:
        result_absent: the caller read no result of ``command_id`` just before this transaction
            (:func:`application_command_submit`): it is not read again; a result committed meanwhile still
            makes the insert fail on its unique key (``IntegrityError``), and the caller reads it then.

    Raises:
        RuntimeError: called outside a transaction.
        ResultMismatch: ``command_id`` is stored with a different ExecutionRef digest.
        UnknownCommand: the route names an unknown application command.
        IntegrityError: a concurrent application of the same command (the caller rolls back and retries).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("an application command is applied inside the Runtime application transaction")
    existing = None if result_absent else first_row(ApplicationResult, org_id=org_id, command_id=command_id)
    if existing is not None:
        if existing.execution_ref_digest != execution_ref_digest:
            raise ResultMismatch(f"command {command_id} has no result for this ExecutionRef")
        return existing
    with _execution_context(org_id, command_id, command):
        outcome, result = commands.run(OrgScope(org_id), command)
        result_digest = digest_v2("runtime.application-result", [
            ("command_id", command_id), ("outcome", outcome), ("result", canonical_json.dumps(result))]).hexdigest
        return insert(ApplicationResult, org_id=org_id, command_id=command_id,
                      execution_ref_digest=execution_ref_digest, profile_id=PROFILE_V2, outcome=outcome,
                      result=result, result_digest=result_digest)


def _execution_context(org_id: str, command_id: str, command: dict):
    """The replay execution context when the command carries an external-effect mode (seed 003
    "Replay and external effects"), else a no-op context.

    Raises:
        ReplayModeUnsupported: the command names a mode other than ``suppress_external_effects``.
    """
    if "external_effects" not in command:
        return contextlib.nullcontext()
    return replay_guard.suppressed_external_effects(org_id=org_id, command_id=command_id,
                                                    mode=command["external_effects"])


# --- Outbound intents -----------------------------------------------------------
def intent_idempotency_key(scope: TrustedRuntimeWorkScope, effect_root_id: str, effect_slot_id: str,
                           effect_generation_id: str) -> str:
    """``OutboundCommand.IdempotencyKey``: the digest of the logical-effect tuple."""
    return digest_v2("runtime.outbound-command", [
        ("org_id", scope.org_id), ("app_installation_id", scope.app_installation_id),
        ("runtime_capability_id", scope.runtime_capability_id), ("binding_digest", scope.binding_digest),
        ("effect_root_id", effect_root_id), ("effect_slot_id", effect_slot_id),
        ("effect_generation_id", effect_generation_id)]).hexdigest


def outbound_command_author(*, scope: TrustedRuntimeWorkScope, effect_root_id: str, effect_slot_id: str,
                            effect_generation_id: str, contract_key: str, record,
                            origin_flow_run_id: int | None, origin_dependency_key: str | None = None,
                            successor: dict | None = None, predecessor: OutboundCommand | None = None,
                            origin: dict | None = None) -> OutboundCommand:
    """Author (or return) the immutable OutboundCommand + outbox message in the caller's transaction.

    The message is ``flow.effect.submit`` for an intent of a Flow
    EffectSubmit step (``origin_flow_run_id`` set), else ``outbound.command``
    (:func:`runtime_outbox.messages.command_message`); its key is the intent
    idempotency key.

    ``record`` must already be locked by the caller's transaction (business
    lock first: ``record_lock``, ``record_lock_owner`` or ``record_create``);
    that row lock is the owner fence of seed 000 ("Resource enqueue ... use
    the existing record owner fence"): a deletion cannot commit between this
    check and the intent insert, and owner checks see the intent once it commits.
    ``origin``: the originating user (``user_id``) and human-readable Flow
    names, frozen as snapshots only. The FrozenDispatchBinding is frozen by the
    effect owner under the locked gate and its exact active ServingEpoch
    (:func:`runtime_outbox.ports.push_binding_freeze`).

    Raises:
        NotServing: the contract's account is not ``v2_serving``.
        PushContractError: no unique account serves ``contract_key``, the
            contract does not apply to the record's object, or the mapping
            produces no body (fail closed before any POST).
        IntentMismatch: the same logical effect exists with other facts.
        ReplayOutboundRefused: the request comes from a replay execution
            context (seed 003 "Replay and external effects").
        OwnerDeleted: ``record`` is deleted (``owner_deleted``, definite); an
            exact retry whose intent exists and is terminal returns it instead.
        OwnerFenceMissing: ``record`` is not locked by this transaction.
    """
    from nexusflow.records.store import RecordStore

    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("outbound intents are authored inside the application transaction")
    if record.org_id != scope.org_id or not RecordStore.is_fenced(record):
        raise OwnerFenceMissing(f"{record.object_name}/{record.record_key}: lock the owner record in the authoring "
                                f"transaction first (record_lock / record_lock_owner)")
    replay_guard.outbound_authoring_check(org_id=scope.org_id, origin_flow_run_id=origin_flow_run_id)
    key = intent_idempotency_key(scope, effect_root_id, effect_slot_id, effect_generation_id)
    existing = first_row(OutboundCommand, idempotency_key=key)
    if existing is not None:
        if (existing.org_id, existing.contract_key, existing.source_object, existing.source_record_key) != (
                scope.org_id, contract_key, record.object_name, record.record_key):
            raise IntentMismatch(f"logical effect {key} exists with other facts")
        if not record.is_deleted or IntentResultReceipt.objects.filter(
                org_id=scope.org_id, command_id=existing.pk).exists():
            # An exact retry; after a committed deletion only a terminal intent is an idempotent duplicate.
            return existing
    if record.is_deleted:
        raise OwnerDeleted(f"{record.object_name}/{record.record_key} is deleted: no new outbound work for it")
    binding = ports.push_binding_freeze(org_id=scope.org_id, contract_key=contract_key, record=record,
                                        intent_key=key, effect_root_id=effect_root_id,
                                        effect_generation_id=effect_generation_id, successor=successor,
                                        origin=origin)
    command = insert(
        OutboundCommand, org_id=scope.org_id, app_installation_id=scope.app_installation_id,
        runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest,
        effect_root_id=effect_root_id, effect_slot_id=effect_slot_id, effect_generation_id=effect_generation_id,
        idempotency_key=key, profile_id=PROFILE_V2, account_key=binding["account_key"], contract_key=contract_key,
        source_object=record.object_name, source_record_key=record.record_key,
        source_record_version=record.version, link_key=binding["link_key"], request_fields=binding["request_fields"],
        frozen_binding=binding,
        frozen_binding_digest=digest_v2("runtime.frozen-dispatch-binding",
                                        [("binding", canonical_json.dumps(binding))]).hexdigest,
        origin_flow_run_id=origin_flow_run_id, origin_dependency_key=origin_dependency_key,
        predecessor=predecessor, successor_authorization=(successor or {}).get("authorization"),
    )
    family, message_key, payload = messages.command_message(command)
    messages.publish(scope, family, message_key, payload, command=command)
    return command


class SuccessorRefused(NexusError):
    """A successor EffectGeneration was requested for a predecessor that is not proven terminal ``no_effect``."""

    code = "successor_refused"


#: Why a predecessor effect state refuses a successor (seed 003 "Replay and external effects").
_SUCCESSOR_REFUSALS = {
    None: ("predecessor_not_delivered", "the predecessor has no RemoteEffect yet; it resumes"),
    "prepared": ("predecessor_in_flight", "the predecessor effect resumes; a new one is blocked"),
    "dispatching": ("predecessor_in_flight", "the predecessor effect resumes; a new one is blocked"),
    "uncertain": ("predecessor_uncertain", "reconcile the predecessor to confirmed or proven no_effect first"),
    "remote_confirmed": ("predecessor_confirmed", "the predecessor effect occurred"),
    "finalized": ("predecessor_confirmed", "the predecessor effect occurred"),
    "quarantined": ("predecessor_not_proven_no_effect",
                    "a quarantined effect is proof of no effect only when a seed 002 Before-POST gate refused it "
                    "before any Attempt"),
}


def outbound_command_author_successor(*, org_id: str, predecessor_command_id: int, actor: str,
                                      reason: str) -> tuple[OutboundCommand, bool]:
    """Mint the next EffectGenerationID for a predecessor proven terminal ``no_effect`` (operator intent).

    Seed 003 "Replay and external effects": only a proven terminal
    ``no_effect`` predecessor may authorize a successor, with explicit
    predecessor linkage and a newly frozen dispatch binding. One transaction
    locks the source record, then the gate and exact epoch (freezing), then
    the predecessor RemoteEffect, then writes the command and its outbox
    message. Asking again for the same predecessor returns the existing
    successor (``created`` is ``False``).

    Args:
        org_id: the trusted org (from the operator's authentication).
        predecessor_command_id: the OutboundCommand id of the predecessor.
        actor / reason: who authorizes the new remote call and why (non-empty).

    Returns:
        ``(command, created)``.

    Raises:
        OutboundCommand.DoesNotExist: no such command in ``org_id``.
        SuccessorRefused: the predecessor is not terminal ``no_effect`` (nor
            ``quarantined`` before any Attempt: refused before POST)
            (``predecessor_in_flight``, ``predecessor_uncertain``,
            ``predecessor_confirmed``, ``predecessor_not_proven_no_effect``,
            ``predecessor_not_delivered``), its source record is gone
            (``predecessor_source_deleted``), or actor/reason are empty.
        NotServing / PushContractError: the binding cannot be frozen now.
    """
    if not actor.strip() or not reason.strip():
        raise SuccessorRefused("a successor needs the authorizing actor and a reason", code="successor_unauthorized")
    predecessor = OutboundCommand.objects.get(org_id=org_id, pk=predecessor_command_id)
    existing = first_row(OutboundCommand, org_id=org_id, predecessor=predecessor)
    if existing is not None:
        return existing, False
    scope = TrustedRuntimeWorkScope(predecessor.org_id, predecessor.app_installation_id,
                                    predecessor.runtime_capability_id, predecessor.binding_digest)
    try:
        return _author_successor(org_id, scope, predecessor, actor, reason)
    except IntegrityError:
        # A concurrent request minted the successor first: the same intent.
        return OutboundCommand.objects.get(org_id=org_id, predecessor=predecessor), False


def _author_successor(org_id: str, scope: TrustedRuntimeWorkScope, predecessor: OutboundCommand, actor: str,
                      reason: str) -> tuple[OutboundCommand, bool]:
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock

    with transaction.atomic(durable=True):
        try:
            record = record_lock(org=OrgScope(org_id), object_name=predecessor.source_object,
                                 record_key=predecessor.source_record_key)
        except Record.DoesNotExist:
            raise SuccessorRefused(f"command {predecessor.pk}: its source record "
                                   f"{predecessor.source_object}/{predecessor.source_record_key} no longer exists",
                                   code="predecessor_source_deleted") from None
        # Under the record lock: a concurrent request that minted the successor first has committed.
        existing = first_row(OutboundCommand, org_id=org_id, predecessor=predecessor)
        if existing is not None:
            return existing, False
        # ``no_effect`` is terminal: once read committed it cannot change, so the
        # decision needs no lock on the effect row (any other state refuses).
        effect = ports.predecessor_effect(org_id=org_id, command=predecessor)
        state = effect.state if effect is not None else None
        if effect is None or not effect.proven_no_effect:
            code, why = _SUCCESSOR_REFUSALS[state]
            raise SuccessorRefused(f"command {predecessor.pk}: {why}", code=code)
        try:
            number = int(predecessor.effect_generation_id)
        except ValueError:
            raise SuccessorRefused(f"effect generation {predecessor.effect_generation_id!r} is not a number",
                                   code="successor_generation_invalid") from None
        authorization = {"actor": actor.strip(), "reason": reason.strip(), "authorized_at": db_now().isoformat()}
        successor = {"authorization": authorization, "predecessor_command_key": predecessor.idempotency_key,
                     "predecessor_binding_digest": predecessor.frozen_binding_digest,
                     "predecessor_effect_id": int(effect.effect_id)}
        command = outbound_command_author(
            scope=scope, effect_root_id=predecessor.effect_root_id, effect_slot_id=predecessor.effect_slot_id,
            effect_generation_id=str(number + 1), contract_key=predecessor.contract_key, record=record,
            origin_flow_run_id=None, successor=successor, predecessor=predecessor,
            origin={**(predecessor.frozen_binding.get("action_config") or {}).get("flow", {}),
                    "user_id": (predecessor.frozen_binding.get("authority") or {}).get("originating_user")})
    return command, True


# --- Outbox delivery ----------------------------------------------------------
def outbox_try_deliver_one() -> bool:
    """Deliver one due outbox message to its family's consumer (outside any transaction).

    The relay first claims the message by counting the delivery attempt and
    moving its next due time (exponential backoff, capped at 60 s) in its own
    transaction; then it hands the consumer the message's immutable
    :class:`~runtime_outbox.messages.Envelope` (the consumer commits its
    acceptance, e.g. the InboxAcceptance and the command's one RemoteEffect,
    before it returns) and only then marks the message delivered. A crash
    between the two redelivers the same envelope, which the consumer's
    acceptance turns into a no-op; a message whose consumer refuses or keeps
    killing the relay backs off alone instead of blocking every later
    message of its org, and ``delivery_attempts`` counts every try, crashed
    ones included. A ``flow.effect.submit`` message whose delivery budget is
    spent moves to ``reconciling`` instead of being tried again
    (:mod:`runtime_outbox.handoff`, seed 004 section 15.4).

    Returns:
        True when a message was claimed (delivered or backed off), False when none is due.

    Raises:
        RuntimeError: called inside a transaction.
        django.db.Error: a database error of the consumer (the claim's backoff is already committed).
    """
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("outbox draining runs outside any transaction")
    now = db_now()
    message = outbox_message_due(state="pending", now=now)
    if message is None:
        return False
    backoff = handoff.retry_backoff_seconds(message.delivery_attempts)
    if handoff.delivery_budget_spent(message, now):
        handoff.start_reconciling(message, now)
        return True
    _deliver_claimed(message, now, backoff)
    return True


#: Most messages one relay round claims, delivers and acknowledges (:func:`outbox_try_deliver_batch`).
DELIVER_BATCH = 16


def outbox_try_deliver_batch(*, limit: int = DELIVER_BATCH) -> bool:
    """Deliver up to ``limit`` due outbox messages: one claim transaction, each consumer, one acknowledgement.

    The relay unit of the ``runtime`` role. Per message it is :func:`outbox_try_deliver_one`'s protocol
    (count the attempt and move the due time, deliver the immutable envelope, mark it delivered only after
    the consumer's acceptance committed); the claims of the batch commit together, as do the
    acknowledgements, instead of two transactions per message. The claim locks the due rows
    ``FOR UPDATE SKIP LOCKED`` (:meth:`OutboxMessageStore.lock_due`), so two relays claim disjoint
    batches instead of queueing behind each other. A crash after some acceptances and before the
    acknowledgement redelivers those envelopes, which their acceptances turn into no-ops (as for one
    message); a consumer that refuses backs its message off alone. A message whose delivery budget is
    spent moves to ``reconciling`` (seed 004 section 15.4).

    Returns:
        True when a message was claimed (delivered or backed off), False when none is due.

    Raises:
        RuntimeError: called inside a transaction.
        django.db.Error: a database error of a consumer (the batch's claims are already committed; the
            messages delivered before it stay pending and are redelivered as no-ops).
    """
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("outbox draining runs outside any transaction")
    claimed = []
    with transaction.atomic(durable=True):
        now = db_now()
        due = OutboxMessageStore.lock_due(state="pending", now=now, limit=limit)
        for message in due:
            if handoff.delivery_budget_spent(message, now):
                handoff.to_reconciling(message, now)  # locked above: its version cannot move
                continue
            backoff = handoff.retry_backoff_seconds(message.delivery_attempts)
            claimed.append((message, _claim(message, now, backoff), backoff))
        if claimed:
            failpoints.hit(FP_CLAIM_BEFORE_COMMIT)
    if not claimed:
        return bool(due)
    delivered = [(message, version) for message, version, backoff in claimed
                 if _deliver_envelope(message, backoff)]
    if delivered:
        with transaction.atomic(durable=True):
            for message, version in delivered:
                _acknowledge(message, version, now)
    return True


def _claim(message: OutboxMessage, now: dt.datetime, backoff: int) -> int:
    """Count a delivery attempt of ``message`` and move its due time ``backoff`` seconds on (in the caller's
    transaction); the message's new version.

    Raises:
        StaleVersion: another relay claimed or delivered it first.
    """
    return OutboxMessageStore.touch(
        org_id=message.org_id, pk=message.pk, state="pending", version=message.version,
        set_fields={"delivery_attempts": message.delivery_attempts + 1,
                    "next_attempt_at": now + dt.timedelta(seconds=backoff)})


def _acknowledge(message: OutboxMessage, version: int, now: dt.datetime) -> None:
    """Mark ``message`` (claimed at ``version``) delivered, in the caller's transaction."""
    try:
        OutboxMessageStore.transition(org_id=message.org_id, pk=message.pk, src="pending", dst="delivered",
                                      version=version, set_fields={"delivered_at": now})
    except StaleVersion:
        pass  # another relay delivered it after our claim expired; the acceptance is the same row


def _deliver_envelope(message: OutboxMessage, backoff: int) -> bool:
    """Hand ``message``'s envelope to its consumer (its acceptance commits there); True when accepted."""
    try:
        messages.deliver(messages.envelope_of(message))
    except NexusError as exc:
        log.warning("outbox delivery of %s message %s failed (attempt %s, next in %s s): %s", message.family,
                    message.pk, message.delivery_attempts + 1, backoff, exc,
                    extra={"org_id": message.org_id, "code": exc.code})
        return False
    failpoints.hit(FP_AFTER_EFFECT_ACCEPT)
    return True


def outbox_deliver_now(*, org_id: str, message_id: int) -> bool:
    """Deliver one pending outbox message now, exactly as the relay would (a same-process delivery).

    ARCHITECTURE.md section 2: a same-process delivery is an optimization, never
    a bypass of the acceptance row; the message is claimed, handed to its one
    consumer and acknowledged only after the consumer's acceptance committed.

    Args:
        org_id / message_id: the message (its org scopes the read).

    Returns:
        True when the message is delivered (now or before); False when the consumer refused or another
        relay holds it (the relay retries with its backoff).

    Raises:
        RuntimeError: called inside a transaction.
        InvalidIdentity: ``message_id`` is not an OutboxMessage id.
    """
    from nexusflow.kernel.ids import require_id

    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("outbox delivery runs outside any transaction")
    message_id = require_id(message_id, OutboxMessage, field="message_id")
    message = first_row(OutboxMessage, org_id=org_id, pk=message_id)
    if message is None or message.state != "pending":
        return message is not None and message.state == "delivered"
    now = db_now()
    return _deliver_claimed(message, now, handoff.retry_backoff_seconds(message.delivery_attempts))


def _deliver_claimed(message: OutboxMessage, now: dt.datetime, backoff: int) -> bool:
    """Claim ``message`` (count the attempt, move its due time), deliver it, acknowledge it; True when delivered."""
    with transaction.atomic(durable=True):
        try:
            version = _claim(message, now, backoff)
        except StaleVersion:
            return False  # another relay claimed or delivered it first
    if not _deliver_envelope(message, backoff):
        return False
    with transaction.atomic(durable=True):
        _acknowledge(message, version, now)
    return True


# --- Intent results --------------------------------------------------------------
class NoEffectUnproven(NexusError):
    """A ``no_effect`` result was offered without proof that no remote effect can exist (seed 000)."""

    code = "no_effect_unproven"
    definite = True


#: Reasons that can never settle as ``no_effect``, whoever declares them (seed 000: timeout, lease
#: expiry, ambiguous delivery and partial success cannot produce that receipt).
NO_EFFECT_NEVER = frozenset({"timeout", "lease_expired", "holder_abandoned", "response_ambiguous", "ambiguous",
                             "unclassified_response", "partial_success", "response_id_missing"})

#: ``owner -> reasons``: the definite pre-dispatch refusals each integration declares it may settle as ``no_effect``.
_NO_EFFECT_REASONS: dict[str, frozenset[str]] = {}


def no_effect_reasons_declare(*, owner: str, reasons) -> None:
    """Declare the closed set of refusal reasons ``owner`` may settle as a ``no_effect`` result.

    Called once from the integration's ``AppConfig.ready``. Seed 000 "A
    validated NO_EFFECT resource result".

    Raises:
        ValueError: a reason is one that can never prove no effect (:data:`NO_EFFECT_NEVER`).
    """
    declared = frozenset(reasons)
    if declared & NO_EFFECT_NEVER:
        raise ValueError(f"{sorted(declared & NO_EFFECT_NEVER)} can never settle as no_effect")
    _NO_EFFECT_REASONS[owner] = declared


def no_effect_reasons() -> frozenset[str]:
    """Every declared ``no_effect`` reason."""
    return frozenset().union(*_NO_EFFECT_REASONS.values()) if _NO_EFFECT_REASONS else frozenset()


def _validate_no_effect(command: OutboundCommand, remote_id: str, evidence: dict) -> None:
    """Seed 000: only a definite refusal with nothing possibly sent may settle as ``no_effect``.

    Reads only the intent's own dispatch facts, never the source record.
    Every Attempt whose Permit reached ``sending`` (``io_may_have_started_at``
    set) must itself have ended ``no_effect`` from a definite provider answer
    the frozen profile classifies as not performed; an Attempt left
    ``uncertain`` (timeout, lost response, abandoned holder) or ``confirmed``
    refuses. The effect owner finds such an Attempt
    (:func:`runtime_outbox.ports.no_effect_unsettled_attempt`); the rules
    above it stay here.

    Raises:
        NoEffectUnproven: ``remote_id`` is not empty (``no_effect_remote_id``),
            the reason is missing or undeclared (``no_effect_reason_unknown``),
            or I/O may have had an effect (``no_effect_unproven``).
    """
    if remote_id:
        raise NoEffectUnproven(f"command {command.pk}: a no_effect result proves no remote identity "
                               f"(remote id {remote_id!r} given)", code="no_effect_remote_id")
    reason = evidence.get("reason") if isinstance(evidence, dict) else None
    if reason in NO_EFFECT_NEVER:
        raise NoEffectUnproven(f"command {command.pk}: {reason} cannot prove that no effect happened")
    if reason not in no_effect_reasons():
        raise NoEffectUnproven(f"command {command.pk}: no_effect reason {reason!r} is not a declared definite "
                               f"refusal", code="no_effect_reason_unknown")
    unsettled = ports.no_effect_unsettled_attempt(org_id=command.org_id, command_id=int(command.pk))
    if unsettled is not None:
        raise NoEffectUnproven(f"command {command.pk}: attempt {unsettled} may have reached the provider "
                               f"without a definite refusal")


def intent_result_record(*, command: OutboundCommand, outcome: str, remote_id: str, evidence: dict) -> IntentResultReceipt:
    """Record the completed result of an intent inside the caller's transaction and wake its Flow.

    For an intent of a Flow (``origin_flow_run_id`` set) the receipt commits
    with an ``intent.completed`` message, delivered at once in a savepoint of
    the same transaction (seed 004 section 14.2 step 1): the Flow's
    FlowWakeSignal commits with the receipt; if the Flow side refuses, only
    the savepoint rolls back and the message stays pending for the relay, so
    the Connector finalize is never blocked by the Flow.

    Idempotent: an equal receipt is returned; a different one raises. A
    ``no_effect`` result is validated first (:func:`_validate_no_effect`,
    seed 000 "A validated NO_EFFECT resource result"): ``remote_id`` empty,
    ``evidence["reason"]`` a declared definite refusal, and no Attempt that
    may have reached the provider without a definite refusal. It never reads
    or locks the source record.

    Args:
        command: the intent.
        outcome: ``finalized``, ``superseded``, ``no_effect`` or ``quarantined``.
        remote_id: the remote identity the result proves (empty unless ``finalized`` / ``superseded``).
        evidence: JSON evidence; ``{"reason": ...}`` for ``no_effect``.

    Raises:
        ValueError: ``outcome`` is not a completed intent outcome.
        NoEffectUnproven: a ``no_effect`` result fails validation
            (``no_effect_unproven``, ``no_effect_remote_id``, ``no_effect_reason_unknown``).
        IntentMismatch: a different receipt exists for the command.
    """
    if outcome not in INTENT_RESULT_OUTCOMES:
        raise ValueError(f"{outcome!r} is not an intent result outcome")
    existing = first_row(IntentResultReceipt, command=command)
    if existing is not None:
        if (existing.outcome, existing.remote_id) != (outcome, remote_id):
            raise IntentMismatch(f"command {command.pk} already completed as {existing.outcome}")
        return existing
    if outcome == "no_effect":
        _validate_no_effect(command, remote_id, evidence)
    digest = digest_v2("runtime.intent-result", [
        ("command_key", command.idempotency_key), ("outcome", outcome), ("remote_id", remote_id),
        ("evidence", canonical_json.dumps(evidence))]).hexdigest
    receipt = insert(IntentResultReceipt, org_id=command.org_id, command=command, outcome=outcome,
                     remote_id=remote_id, evidence=evidence, digest=digest)
    if command.origin_flow_run_id is not None:
        key, payload = messages.intent_completed_message(command, receipt)
        message = messages.publish(messages.scope_of(command), messages.INTENT_COMPLETED, key, payload,
                                   command=command)
        messages.deliver_in_transaction(message)
    return receipt
