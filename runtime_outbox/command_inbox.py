"""The durable Runtime command inbox: the one consumer of ``runtime.command.handoff`` messages.

Seed 003 "Existing foundations and schema ownership" (the ``RuntimeCommandHandoff``
transport adapter and the durable Runtime command inbox) and "V1 concepts to
retire" ("Runtime handoff acceptance as a substitute for ApplicationResult").
The V1 connector runtime publishes one message per V1 event
(:mod:`connectors.v1.events`); this consumer accepts it once per message key,
applying the command and recording its ``ApplicationResult`` in the same
transaction as the :class:`~runtime_outbox.models.InboxAcceptance`. The V1 event
completes on that acceptance; V1 never reads the ApplicationResult.

Payload (schema version 1)::

    {"command_id": "<text, at most 120>", "execution_ref_digest": "<64 hex>", "command": {...application command...}}
"""
from __future__ import annotations

from django.db import transaction

from nexusflow.kernel.errors import NexusError

from . import messages
from .services import application_command_apply

CONSUMER = "runtime.command_inbox"


class HandoffPayloadInvalid(NexusError):
    """The handoff payload lacks its command id, digest or command object: it is never accepted."""

    code = "handoff_payload_invalid"
    definite = True


def command_handoff_accept(envelope: messages.Envelope) -> None:
    """Accept one handed-off application command into the Runtime inbox, applying it once.

    Args:
        envelope: a ``runtime.command.handoff`` envelope (payload shape in the module docstring).

    Raises:
        HandoffPayloadInvalid: a payload field is missing or of the wrong type (before any write).
        InboxConflict / InboxRejected / InboxAcceptanceRaced: see :func:`runtime_outbox.messages.inbox_accept`.
        ResultMismatch / UnknownCommand: see :func:`runtime_outbox.services.application_command_apply`.
    """
    payload = envelope.payload
    command_id, digest = payload.get("command_id"), payload.get("execution_ref_digest")
    command = payload.get("command")
    if not isinstance(command_id, str) or not isinstance(digest, str) or not hasattr(command, "keys"):
        raise HandoffPayloadInvalid(f"handoff message {envelope.outbox_message_id}: payload needs command_id, "
                                    f"execution_ref_digest and command")
    org_id = envelope.scope.org_id

    def apply() -> str:
        result = application_command_apply(org_id=org_id, command_id=command_id, execution_ref_digest=digest,
                                           command=messages.thaw(command))
        return f"application_result:{int(result.pk)}"

    with transaction.atomic(durable=True):
        messages.inbox_accept(envelope, consumer=CONSUMER, accepted_ref_fn=apply)
