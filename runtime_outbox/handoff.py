"""Handoff dead-letter convergence of ``flow.effect.submit`` messages (seed 004 section 15.4).

A ``flow.effect.submit`` message never becomes a silent dead letter while its
Flow waits on it. The relay (:func:`runtime_outbox.services.outbox_try_deliver_one`)
delivers it like any message; once its delivery budget is spent
(:func:`delivery_budget_spent`: at least :func:`delivery_max_attempts` tries
and :func:`delivery_min_age_seconds` since it was published) the relay moves
it to the non-terminal ``reconciling`` disposition instead of trying again.

:func:`outbox_try_reconcile_one` (worker unit ``outbox.reconcile``) then
asks the owner's ``RejectIfUnaccepted`` fence
(:func:`runtime_outbox.messages.inbox_reject_if_unaccepted`), outside any
Runtime mutation transaction, with the four exact values of the persisted
message (trusted work scope, handoff key, payload digest, outbox identity).
The durable answer decides:

- ``accepted``: the owner did accept it (the acknowledgement was lost): the
  message becomes ``delivered`` and the Flow keeps waiting for the separate
  completion receipt;
- ``rejected``: the tombstone proves that no command was accepted and none
  ever will be: the Flow's finalizer applies the completion step's compiled
  no-effect policy, then the message becomes ``handoff_rejected``;
- a lost response or an unavailable fence: asked again, with backoff, up
  to :func:`reconcile_max_attempts` times;
- a fence that fails closed (another scope, digest or outbox identity on
  the key), or reconciliation attempts spent: ``AcceptanceUnknown``, never
  proof of rejection: the Flow's finalizer quarantines dependency, step and
  root, then the message becomes ``dead_lettered``.

The finalizing transaction locks the Flow rows first (root -> step ->
dependency, through the :func:`register_handoff_finalizer` port the Flow app
answers) and the outbox row last, so the terminal non-delivery state commits
only together with the Flow's own transition (seed 004 section 12 order;
ARCHITECTURE.md section 6). A crash anywhere leaves the message
``reconciling`` and the next sweep repeats the same idempotent steps.
"""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from django.db import OperationalError, transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import NexusError, StaleVersion
from nexusflow.kernel.identity import validate_key, validate_note
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.ports import Port
from nexusflow.kernel.scope import TrustedRuntimeWorkScope
from nexusflow.kernel.tuning import setting_number

from . import messages
from .models import OutboxMessage
from .selectors import outbox_message_due
from .store import OutboxMessageStore

log = logging.getLogger(__name__)

#: The families whose spent delivery budget enters acceptance reconciliation (the others back off forever,
#: visible to operators: an ``outbound.command`` push must never be rejected for being late).
RECONCILED_FAMILIES = frozenset({messages.FLOW_EFFECT_SUBMIT})
#: The consumer name a RejectIfUnaccepted tombstone written by this module carries.
RECONCILER = "runtime.handoff_reconcile"

VERDICT_ACCEPTED = "accepted"
VERDICT_REJECTED = "rejected"
VERDICT_UNKNOWN = "acceptance_unknown"
_RETRY = "retry"

#: Terminal outbox state per verdict.
_TERMINAL = {VERDICT_ACCEPTED: "delivered", VERDICT_REJECTED: "handoff_rejected", VERDICT_UNKNOWN: "dead_lettered"}

FP_AFTER_FENCE = failpoints.declare("outbox.reconcile.after_fence")
FP_FINALIZE_BEFORE_COMMIT = failpoints.declare("outbox.reconcile.finalize_before_commit")




def delivery_max_attempts() -> int:
    """``NEXUS_HANDOFF_DELIVERY_MAX_ATTEMPTS`` (default 20): delivery tries before reconciliation."""
    return int(setting_number("NEXUS_HANDOFF_DELIVERY_MAX_ATTEMPTS", 20))


def delivery_min_age_seconds() -> float:
    """``NEXUS_HANDOFF_DELIVERY_MIN_AGE_SECONDS`` (default 1 hour): a message younger than this keeps trying."""
    return setting_number("NEXUS_HANDOFF_DELIVERY_MIN_AGE_SECONDS", 3600.0)


def reconcile_max_attempts() -> int:
    """``NEXUS_HANDOFF_RECONCILE_MAX_ATTEMPTS`` (default 5): fence questions before ``AcceptanceUnknown``."""
    return int(setting_number("NEXUS_HANDOFF_RECONCILE_MAX_ATTEMPTS", 5))


def delivery_budget_spent(message: OutboxMessage, now: dt.datetime) -> bool:
    """Has ``message`` (of a reconciled family) spent its delivery budget? Both the tries and the age count."""
    return (message.family in RECONCILED_FAMILIES and message.delivery_attempts >= delivery_max_attempts()
            and (now - message.created_at).total_seconds() >= delivery_min_age_seconds())


# --- the Flow's finalizer ---------------------------------------------------------------------------
HandoffFinalizer = Callable[..., str]
_FINALIZER: Port[HandoffFinalizer] = Port("effect-handoff finalizer", provider="nexusflow.flows")


def register_handoff_finalizer(finalize: HandoffFinalizer) -> None:
    """Install the one finalizer of a rejected or acceptance-unknown ``flow.effect.submit`` handoff.

    ``finalize(*, scope, flow_run_id, dependency_key, verdict, evidence) ->
    str`` runs in the caller's transaction, locks the run's root, the waiting
    EffectCompletion step and its dependency (in that order) and commits the
    verdict's Flow transition, or nothing when the dependency already left
    ``waiting``; it returns what it did (for the log).

    Raises:
        PortAlreadyRegistered: another finalizer is installed.
    """
    _FINALIZER.register(finalize)


# --- reconciliation -------------------------------------------------------------------------------------
def retry_backoff_seconds(attempts: int) -> int:
    """Seconds before the next try after ``attempts`` earlier ones: 1, 2, 4 ... capped at 60 (delivery and fence)."""
    return min(60, 2 ** min(attempts, 6))


def to_reconciling(message: OutboxMessage, now: dt.datetime) -> None:
    """Move a ``pending`` message whose delivery budget is spent to ``reconciling``, due at once, in the
    caller's transaction (seed 004 section 15.4: never a silent dead letter; the owner's fence decides).

    Raises:
        StaleVersion: another relay claimed or delivered the message meanwhile (its version moved).
    """
    OutboxMessageStore.transition(org_id=message.org_id, pk=message.pk, src="pending", dst="reconciling",
                                  version=message.version, set_fields={"next_attempt_at": now})
    log.warning("outbox %s message %s spent its delivery budget (%s tries); reconciling its acceptance",
                message.family, message.pk, message.delivery_attempts, extra={"org_id": message.org_id})


def start_reconciling(message: OutboxMessage, now: dt.datetime) -> None:
    """:func:`to_reconciling` in a transaction of its own; a message whose version moved is left as it is."""
    with transaction.atomic(durable=True):
        try:
            to_reconciling(message, now)
        except StaleVersion:
            pass


def outbox_try_reconcile_one() -> bool:
    """Reconcile one due ``reconciling`` message (module docstring). True when one was claimed.

    Raises:
        RuntimeError: called inside a transaction.
        django.db.Error: a database error while finalizing (the message stays ``reconciling``).
    """
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("handoff reconciliation runs outside any transaction")
    now = db_now()
    message = outbox_message_due(state="reconciling", now=now)
    if message is None:
        return False
    _reconcile(message, now)
    return True


def _reconcile(message: OutboxMessage, now: dt.datetime, *, operator: dict[str, str] | None = None) -> str | None:
    """Claim one ``reconciling`` message (count the question, back off), ask the fence, finalize or wait.

    Returns the message's terminal state, or None when it stays ``reconciling`` (asked again later) or
    another reconciler claimed it first.
    """
    asked = message.reconcile_attempts  # fence questions already asked (a crashed one counts too)
    with transaction.atomic(durable=True):
        try:
            OutboxMessageStore.touch(
                org_id=message.org_id, pk=message.pk, state="reconciling", version=message.version,
                set_fields={"reconcile_attempts": asked + 1,
                            "next_attempt_at": now + dt.timedelta(seconds=retry_backoff_seconds(asked))})
        except StaleVersion:
            return None  # another reconciler claimed or finalized it first
    verdict, evidence = _ask_fence(message)
    if verdict == _RETRY:
        if asked + 1 < reconcile_max_attempts():
            log.warning("RejectIfUnaccepted for outbox message %s gave no answer (%s); asking again later",
                        message.pk, evidence.get("code"), extra={"org_id": message.org_id})
            return None
        verdict, evidence = VERDICT_UNKNOWN, {**evidence, "why": "reconciliation attempts spent"}
    failpoints.hit(FP_AFTER_FENCE)
    if operator is not None:
        evidence = {**evidence, "operator": operator}
    return handoff_finalize(message_id=int(message.pk), org_id=message.org_id, verdict=verdict, evidence=evidence)


class OutboxMessageNotFound(NexusError):
    """No such outbox message in the org."""

    code = "outbox_message_not_found"
    http_status = 404


class HandoffReconcileRefused(NexusError):
    """The message cannot be reconciled by hand: not a ``flow.effect.submit`` message, or already settled."""

    code = "outbox_reconcile_refused"
    definite = True


def handoff_reconcile_now(*, org_id: str, message_id: int, actor: str, reason: str) -> dict[str, Any]:
    """An operator gives up waiting on one ``flow.effect.submit`` delivery (``manage.py outbox reconcile``).

    A ``pending`` message moves to ``reconciling`` at once, whatever its
    delivery budget; then (as for a ``reconciling`` one) the owner's fence is
    asked and the verdict finalized exactly as the sweep does (module
    docstring): the owner accepted it (delivered, the run keeps waiting), or
    a tombstone now refuses it for good and the run takes its no-effect
    route, or ``AcceptanceUnknown`` quarantines the run. ``actor`` and
    ``reason`` go into the Flow's audit evidence.

    Returns:
        ``{"message_id", "family", "state", "reconcile_attempts"}`` after the attempt.

    Raises:
        InvalidIdentity: a malformed id, actor or reason (before SQL).
        OutboxMessageNotFound: no such message in ``org_id``.
        HandoffReconcileRefused: another family, or a message already delivered or terminal.
        RuntimeError: called inside a transaction.
    """
    message_id = require_id(message_id, OutboxMessage, field="message_id")
    validate_key(actor, field="actor", max_length=120)
    reason = validate_note(reason, field="reason")
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("handoff reconciliation runs outside any transaction")
    message = OutboxMessage.objects.filter(org_id=org_id, pk=message_id).first()
    if message is None:
        raise OutboxMessageNotFound(f"no outbox message {int(message_id)} in this org")
    if message.family not in RECONCILED_FAMILIES:
        raise HandoffReconcileRefused(f"message {int(message_id)} is {message.family}: only "
                                      f"{', '.join(sorted(RECONCILED_FAMILIES))} messages are reconciled")
    now = db_now()
    if message.state == "pending":
        start_reconciling(message, now)
        message = OutboxMessage.objects.get(org_id=org_id, pk=message_id)  # delivered meanwhile, or reconciling
    if message.state != "reconciling":
        raise HandoffReconcileRefused(f"message {int(message_id)} is {message.state}: nothing to reconcile")
    _reconcile(message, now, operator={"actor": actor, "reason": reason})
    message = OutboxMessage.objects.get(org_id=org_id, pk=message_id)
    return {"message_id": int(message.pk), "family": message.family, "state": message.state,
            "reconcile_attempts": message.reconcile_attempts}


def _ask_fence(message: OutboxMessage) -> tuple[str, dict[str, Any]]:
    """The owner fence's durable answer for ``message``'s four persisted values: ``(verdict, evidence)``."""
    try:
        row = messages.inbox_reject_if_unaccepted(
            scope=messages.scope_of(message), family=message.family, message_key=message.message_key,
            payload_digest=message.payload_digest, outbox_message_id=int(message.pk), consumer=RECONCILER)
    except messages.InboxConflict as exc:
        # Another scope, digest or outbox identity holds the key: fail closed, never proof of rejection.
        return VERDICT_UNKNOWN, {"code": exc.code}
    except (OperationalError, messages.InboxAcceptanceRaced) as exc:
        return _RETRY, {"code": getattr(exc, "code", type(exc).__name__)}
    verdict = VERDICT_ACCEPTED if row.state == "accepted" else VERDICT_REJECTED
    return verdict, {"inbox_acceptance_id": int(row.pk), "inbox_state": row.state}


def handoff_finalize(*, message_id: int, org_id: str, verdict: str, evidence: dict[str, Any]) -> str | None:
    """Commit ``verdict`` for one ``reconciling`` message: the Flow's transition, then the outbox row's.

    One transaction: for ``rejected`` / ``acceptance_unknown`` the Flow
    finalizer (root -> step -> dependency) runs first, then the outbox row is
    locked and moved to its terminal state; ``accepted`` only repairs the
    delivery. A message that already left ``reconciling`` is left alone.

    Returns:
        The message's new state, or None when another finalizer won.

    Raises:
        ValueError: an unknown ``verdict``.
        PortNotRegistered: the Flow app did not register its finalizer.
    """
    if verdict not in _TERMINAL:
        raise ValueError(f"unknown handoff verdict {verdict!r}")
    message = OutboxMessage.objects.get(org_id=org_id, pk=message_id)  # discovered without a lock
    if message.state != "reconciling":
        return None
    scope: TrustedRuntimeWorkScope = messages.scope_of(message)
    with transaction.atomic(durable=True):
        now = db_now()
        flow_outcome = None
        if verdict != VERDICT_ACCEPTED:
            flow_outcome = _FINALIZER.get()(
                scope=scope, flow_run_id=int(message.payload["flow_run_id"]),
                dependency_key=str(message.payload["command_id"]), verdict=verdict,
                evidence={**evidence, "outbox_message_id": int(message.pk), "message_key": message.message_key})
        locked = OutboxMessageStore.lock(org_id, message_id)
        if locked.state != "reconciling":
            transaction.set_rollback(True)
            return None
        dst = _TERMINAL[verdict]
        OutboxMessageStore.transition(org_id=org_id, pk=message_id, src="reconciling", dst=dst,
                                      version=locked.version,
                                      set_fields={"delivered_at": now} if dst == "delivered" else {})
        failpoints.hit(FP_FINALIZE_BEFORE_COMMIT)
    log.warning("flow.effect.submit message %s reconciled: %s (flow: %s)", message_id, verdict, flow_outcome,
                extra={"org_id": org_id})
    return dst
