"""Runtime reads: results, intents and receipts by owner (seed 000)."""
from __future__ import annotations

from nexusflow.kernel.ids import require_id
from nexusflow.kernel.rows import first_row

from .models import ApplicationResult, IntentResultReceipt, OutboundCommand, OutboxMessage
from .store import OutboxMessageStore
from .transitions import OUTBOX_MESSAGE


def intent_result_receipt_for(*, org_id: str, command_id: OutboundCommand.Id | int) -> IntentResultReceipt | None:
    """Return the result receipt of the org's intent ``command_id``, or None.

    Raises:
        InvalidIdentity: ``command_id`` is not an OutboundCommand id (or a positive int).
    """
    command_id = require_id(command_id, OutboundCommand, field="command_id")
    return first_row(IntentResultReceipt, org_id=org_id, command_id=command_id)


def application_result_for(*, org_id: str, command_id: str) -> ApplicationResult | None:
    return first_row(ApplicationResult, org_id=org_id, command_id=command_id)


def pending_intents_for_record(*, org_id: str, source_object: str, source_record_key: str):
    """Intents of one owner record without a completed result receipt."""
    return (OutboundCommand.objects.filter(org_id=org_id, source_object=source_object,
                                           source_record_key=source_record_key, intentresultreceipt__isnull=True)
            .order_by("id"))


def outbox_pending_count() -> int:
    """Outbox messages not delivered yet, all orgs (open work, ``kernel.workers.register_open_work``)."""
    return OutboxMessage.objects.exclude(state__in=OUTBOX_MESSAGE.settled).count()


def inbox_acceptance_state(*, org_id: str, message_key: str) -> str | None:
    """The state of the inbox row of ``message_key`` in ``org_id``: ``accepted``, ``rejected`` or ``None`` (none yet).

    The acceptance is the consumer's durable receipt of a Runtime message (ARCHITECTURE.md section 2);
    a ``runtime.command.handoff`` acceptance is the V1 event's completion.
    """
    from .models import InboxAcceptance

    return (InboxAcceptance.objects.filter(org_id=org_id, message_key=message_key)
            .values_list("state", flat=True).first())


def outbox_due_by_family(now) -> list[tuple[str, int, object]]:
    """``pending`` OutboxMessages due on the database clock ``now`` (all orgs), by message family:
    ``(family, messages, oldest eligible time)``; a message is eligible from ``next_attempt_at`` or, without
    one, its ``created_at``. Read by ``runtime_outbox/metrics.py`` (seed 004 section 19)."""
    from django.db.models import Count, Min, Q
    from django.db.models.functions import Coalesce

    rows = (OutboxMessage.objects.filter(state="pending")
            .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
            .values("family").annotate(n=Count("pk"), oldest=Min(Coalesce("next_attempt_at", "created_at")))
            .order_by("family"))
    return [(r["family"], int(r["n"]), r["oldest"]) for r in rows]


def outbox_message_due(*, state: str, now) -> OutboxMessage | None:
    """The ``state`` message due first at ``now`` (``next_attempt_at`` unset or not after it), all orgs
    (:meth:`runtime_outbox.store.OutboxMessageStore.due`; the relay and the handoff reconciler ask it).

    Args:
        state: ``pending`` (the relay) or ``reconciling`` (runtime_outbox/handoff.py).
        now: the database clock (an aware datetime).
    """
    rows = OutboxMessageStore.due(state=state, now=now, limit=1)
    return rows[0] if rows else None
