"""Connector's inbox for Runtime messages: an OutboundCommand envelope becomes its one RemoteEffect.

ARCHITECTURE.md section 2 "Runtime message families"; seed 004 sections
10.7 and 15.1. :func:`outbound_message_accept` is the consumer of
``outbound.command`` and ``flow.effect.submit`` (registered in
``ConnectorsConfig.ready``). The effect model (:mod:`connectors.outbound.intents`,
which loads the egress adapter) is imported on first delivery, so loading
the app registers the consumer without loading a provider client.
"""
from __future__ import annotations

from django.db import transaction

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.logs import log_context
from nexusflow.kernel.rows import first_row
from runtime_outbox import messages
from runtime_outbox.models import OutboundCommand

#: The consumer name the inbox rows of this app carry.
INBOX_CONSUMER = "connectors.inbox"


class InboxEnvelopeMismatch(NexusError):
    """A delivered envelope does not describe its OutboundCommand exactly: fail closed, create nothing."""

    code = "inbox_envelope_mismatch"
    definite = True


def outbound_message_accept(envelope: messages.Envelope) -> None:
    """Accept one ``outbound.command`` / ``flow.effect.submit`` envelope: InboxAcceptance + the one RemoteEffect.

    One transaction validates the envelope against its OutboundCommand (the
    full trusted scope, family, message key and payload digest recomputed
    from the intent row), then records the InboxAcceptance and creates (or
    finds) the RemoteEffect (:func:`connectors.outbound.intents.remote_effect_find_or_create`),
    and commits before returning: the Runtime relay acknowledges only after
    that. A duplicate delivery finds the acceptance and creates nothing.

    Args:
        envelope: the immutable envelope; its payload's ``command_id`` names the intent.

    Raises:
        InboxEnvelopeMismatch: no such intent in the envelope's org, or the envelope differs from it.
        InboxConflict / InboxRejected / InboxAcceptanceRaced: see :func:`runtime_outbox.messages.inbox_accept`.
        PushContractError: an existing effect does not match the command, or a successor's predecessor is
            not proven ``no_effect``.
    """
    from connectors.outbound import intents as outbound

    with transaction.atomic(durable=True):
        command = _envelope_command(envelope)

        def accept_effect() -> str:
            with log_context(trace_id=command.trace_id or None):  # the effect carries its intent's trace
                return f"remote_effect:{outbound.remote_effect_find_or_create(command=command).pk}"

        messages.inbox_accept(envelope, consumer=INBOX_CONSUMER, accepted_ref_fn=accept_effect)


def _envelope_command(envelope: messages.Envelope) -> OutboundCommand:
    scope = envelope.scope
    try:
        command_id = require_id(envelope.payload.get("command_id"), OutboundCommand, field="command_id")
    except NexusError as exc:
        raise InboxEnvelopeMismatch(f"{envelope.family} message {envelope.outbox_message_id}: {exc}") from None
    command = first_row(OutboundCommand, org_id=scope.org_id, pk=command_id)
    if command is None:
        raise InboxEnvelopeMismatch(f"{envelope.family} message {envelope.outbox_message_id}: no such intent")
    family, key, payload = messages.command_message(command)
    expected = messages.message_digest(family, messages.REGISTRY.family(family).payload_schema_version, key, payload)
    if (messages.scope_of(command), family, key, expected) != (
            scope, envelope.family, envelope.message_key, envelope.payload_digest):
        raise InboxEnvelopeMismatch(f"{envelope.family} message {envelope.outbox_message_id} does not describe "
                                    f"intent {command.pk}")
    return command
