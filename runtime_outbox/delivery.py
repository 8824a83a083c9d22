"""Platform delivery effects of Flows: ``emailSimple`` and ``customNotificationAction`` (seed 004 sections 8.2
and 15; catalog owner ``runtime.delivery``).

A Flow's email or notification is one outbound effect like any other (ARCHITECTURE.md, "the single outbound
effect model"): in the EffectSubmit step's transaction the Runtime inserts one *message record* of the object
the delivering push contract pushes (the pack's ``"delivers"`` block names which field holds each action input;
:func:`delivery_message_create`, a business row, before the Flow root) and, once the step holds its Flow root,
authors the one immutable :class:`~runtime_outbox.models.OutboundCommand` for it, owner-fenced by that record
(seed 000; :func:`delivery_intent_author`). The connector then creates the remote message once, through a DispatchPermit, the
provider's idempotency key and the RemoteLink of the message record: a retry never sends twice, an ambiguous
answer is parked for reconciliation, and the message record is the support view of what was sent.

Which provider delivers a family is L2 configuration: the one ``v2_serving`` account whose pack's contract
``delivers`` it (:func:`runtime_outbox.ports.delivery_contract`). The sealed catalog's handler references
``runtime_outbox.delivery.email_send`` and ``runtime_outbox.delivery.notification_send`` name this module's
delivery of the ``email`` and ``notification`` families (:func:`delivery_message_create` with that family).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope

from . import ports
from .models import OutboundCommand

#: Items of a collection input (``emailAddressesArray``, ``recipientIds``) are joined with this separator.
LIST_SEPARATOR = ","


class DeliveryRefused(NexusError):
    """The action's inputs cannot become a message of the delivering contract: a definite refusal, before
    anything is written (``delivery_input_unmapped``: an input the contract has no field for is set;
    ``delivery_empty``: no input is set at all)."""

    code = "delivery_input_unmapped"
    definite = True


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        items = [str(item).strip() for item in value if item not in (None, "")]
        return LIST_SEPARATOR.join(items) if items else None
    return str(value)


def message_fields(contract: ports.DeliveryContract, inputs: dict[str, Any]) -> dict[str, str]:
    """The message record's fields for the action's evaluated ``inputs`` (``{input name: value}``).

    Text as given; a boolean ``true``/``false``; a collection its non-empty items joined with ``,``.
    When two inputs map to one field (``emailAddresses`` and ``emailAddressesArray``) their values are
    joined the same way, in input-name order. Unset inputs (``None``, ``""``, ``[]``) are left out.

    Raises:
        DeliveryRefused: a set input has no field in ``contract.fields`` (``delivery_input_unmapped``) or
            no input is set (``delivery_empty``).
    """
    fields: dict[str, str] = {}
    unmapped = []
    for name in sorted(inputs):
        text = _text(inputs[name])
        if text in (None, ""):
            continue
        target = contract.fields.get(name)
        if target is None:
            unmapped.append(name)
            continue
        fields[target] = f"{fields[target]}{LIST_SEPARATOR}{text}" if target in fields else text
    if unmapped:
        raise DeliveryRefused(f"contract {contract.contract_key} carries no {', '.join(unmapped)}")
    if not fields:
        raise DeliveryRefused(f"nothing to deliver through {contract.contract_key}", code="delivery_empty")
    return fields


@dataclass(frozen=True)
class DeliveryMessage:
    """A message record inserted for one delivery and the contract that delivers it."""

    contract: ports.DeliveryContract
    record: Any


def delivery_intent_existing(*, scope: TrustedRuntimeWorkScope, effect_root_id: str, effect_slot_id: str,
                             effect_generation_id: str) -> OutboundCommand | None:
    """The intent of this logical effect if it exists already (an exact retry: no second message record)."""
    from .services import intent_idempotency_key

    return OutboundCommand.objects.filter(idempotency_key=intent_idempotency_key(
        scope, effect_root_id, effect_slot_id, effect_generation_id)).first()


def delivery_message_create(*, scope: TrustedRuntimeWorkScope, family: str, inputs: dict[str, Any]) -> DeliveryMessage:
    """Insert the message record of one delivery (a business row: the caller locks the Flow root after it,
    seed 004 section 13.1) in the caller's transaction.

    Raises:
        DeliveryRefused: see :func:`message_fields`.
        NotServing / PushContractError: no serving account delivers ``family``, or several do.
        UnknownObject, UnknownField, InvalidFieldValue: the message object or a field of the delivering
            contract is not declared in the metadata view, or a value does not fit its type.
    """
    from nexusflow.records.services import record_create

    contract = ports.delivery_contract(org_id=scope.org_id, family=family)
    record = record_create(org=OrgScope(scope.org_id), object_name=contract.source_object,
                           values=message_fields(contract, inputs))
    return DeliveryMessage(contract, record)


def delivery_intent_author(*, scope: TrustedRuntimeWorkScope, message: DeliveryMessage, effect_root_id: str,
                           effect_slot_id: str, effect_generation_id: str, origin_flow_run_id: int,
                           origin: dict | None = None) -> OutboundCommand:
    """Author the one intent of ``message`` (owner-fenced by its record, which this transaction created), after
    the caller locked its Flow root (the serving gate the binding freeze locks comes after it).

    Returns:
        The OutboundCommand; its ``source_object``/``source_record_key`` name the message record.

    Raises:
        NotServing / PushContractError: the contract cannot be frozen (see
            :func:`runtime_outbox.services.outbound_command_author`).
    """
    from .services import outbound_command_author

    return outbound_command_author(
        scope=scope, effect_root_id=effect_root_id, effect_slot_id=effect_slot_id,
        effect_generation_id=effect_generation_id, contract_key=message.contract.contract_key,
        record=message.record, origin_flow_run_id=origin_flow_run_id, origin=origin)
