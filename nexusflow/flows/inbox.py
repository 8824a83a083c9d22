"""Flow's inbox for Runtime messages: an ``intent.completed`` envelope becomes a durable FlowWakeSignal.

ARCHITECTURE.md section 2 "Runtime message families"; seed 004 sections
14.2 and 15.2. Registered in ``FlowsConfig.ready``. The FlowWakeSignal is the
durable acceptance: a duplicate delivery of the same receipt finds it and is
a no-op.
"""
from __future__ import annotations

from django.db import transaction

from runtime_outbox.messages import Envelope

from .services import flow_wake_signal_accept


def intent_completed_accept(envelope: Envelope) -> None:
    """Accept one ``intent.completed`` envelope as the FlowWakeSignal of its run and dependency key.

    Runs in its own transaction when the Runtime relay delivers it, or in a
    savepoint of the producer's transaction for a same-transaction delivery;
    either way the signal is committed (or rolled back) with it before the
    message is acknowledged.

    Args:
        envelope: ``payload`` holds ``flow_run_id`` (int), ``dependency_key`` (str) and ``receipt_id``
            (int, the IntentResultReceipt); ``scope`` is the intent's trusted Runtime work scope.

    Raises:
        WakeSignalRejected: no such run in that complete scope, or not a receipt id.
        WakeSignalConflict: the key was accepted before with another receipt.
        InvalidIdentity: a non-canonical dependency key or a run id of another model.
    """
    payload = envelope.payload
    with transaction.atomic():
        flow_wake_signal_accept(scope=envelope.scope, flow_run_id=payload["flow_run_id"],
                                dependency_key=payload["dependency_key"], receipt_id=payload["receipt_id"])
