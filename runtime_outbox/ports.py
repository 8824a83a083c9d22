"""What the Runtime asks the effect owner (ARCHITECTURE.md section 2, "Which way imports point").

The Runtime authors intents, applies admitted commands and records intent
results; the dispatch facts (serving gates and epochs, RemoteEffects,
DispatchPermits, RemoteLinks) belong to the Connector, which sits above it.
Each question is a single-provider :class:`~nexusflow.kernel.ports.Port`
that the connector app answers from ``ConnectorsConfig.ready``:

- :func:`push_binding_freeze`: freeze the FrozenDispatchBinding of a new
  intent under the locked gate and its exact active epoch (seed 003
  "Outbound facts");
- :func:`no_effect_unsettled_attempt`: the no-effect proof, the first
  Attempt of an intent that may have reached the provider without a
  definite refusal (seed 000 "A validated NO_EFFECT resource result"); the
  rules (:data:`runtime_outbox.services.NO_EFFECT_NEVER`, the declared
  reasons) stay with the Runtime;
- :func:`predecessor_effect`: the RemoteEffect of a predecessor intent and
  whether it proves no effect, for successor authoring (seed 003 "Replay and
  external effects");
- :func:`delivery_contract`: the one push contract a serving account offers
  for a platform delivery family (``email``, ``notification``), for the
  delivery effects of Flows (:mod:`runtime_outbox.delivery`);
- :func:`inbound_link_find` / :func:`inbound_link_create`: the inbound
  RemoteLink that maps a provider object to a local record (seed 002
  "Link Key").

Every function raises :class:`~nexusflow.kernel.ports.PortNotRegistered`
when the connector app is not installed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nexusflow.kernel.ports import Port

_PROVIDER = "connectors"


# --- push-binding freezer ------------------------------------------------------------
_FREEZER: Port[Callable[..., dict]] = Port("push-binding freezer", provider=_PROVIDER)


def register_push_binding_freezer(freeze: Callable[..., dict]) -> None:
    """Install the one FrozenDispatchBinding freezer.

    ``freeze(*, org_id, contract_key, record, intent_key, effect_root_id,
    effect_generation_id, successor, origin) -> dict`` locks the serving gate
    and epoch in the caller's transaction and returns the binding (with at
    least ``account_key``, ``link_key`` and ``request_fields``); it raises the
    owner's definite refusals (not serving, invalid contract).

    Raises:
        PortAlreadyRegistered: another freezer is installed.
    """
    _FREEZER.register(freeze)


def push_binding_freeze(*, org_id: str, contract_key: str, record, intent_key: str, effect_root_id: str,
                        effect_generation_id: str, successor: dict | None, origin: dict | None) -> dict:
    """Freeze the dispatch binding of one intent (see :func:`register_push_binding_freezer`)."""
    return _FREEZER.get()(org_id=org_id, contract_key=contract_key, record=record, intent_key=intent_key,
                          effect_root_id=effect_root_id, effect_generation_id=effect_generation_id,
                          successor=successor, origin=origin)


# --- delivery contract -----------------------------------------------------------------
@dataclass(frozen=True)
class DeliveryContract:
    """The push contract that delivers one platform family: its key, the message object it pushes and
    ``fields``, ``{catalog input name: message object field}``."""

    contract_key: str
    source_object: str
    fields: dict[str, str]


_DELIVERY: Port[Callable[..., DeliveryContract]] = Port("delivery contract read", provider=_PROVIDER)


def register_delivery_contract(read: Callable[..., DeliveryContract]) -> None:
    """Install the one delivery-contract read.

    ``read(*, org_id, family) -> DeliveryContract``: the contract of the one
    ``v2_serving`` account whose pack declares ``"delivers": {"family":
    family, ...}`` for it; raises the owner's definite refusals (none
    serving, several).

    Raises:
        PortAlreadyRegistered: another read is installed.
    """
    _DELIVERY.register(read)


def delivery_contract(*, org_id: str, family: str) -> DeliveryContract:
    """The contract delivering ``family`` for ``org_id`` (see :func:`register_delivery_contract`)."""
    return _DELIVERY.get()(org_id=org_id, family=family)


# --- no-effect proof -----------------------------------------------------------------
_NO_EFFECT_PROOF: Port[Callable[..., int | None]] = Port("no-effect proof", provider=_PROVIDER)


def register_no_effect_proof(unsettled_attempt: Callable[..., int | None]) -> None:
    """Install the one no-effect proof.

    ``unsettled_attempt(*, org_id, command_id) -> int | None`` returns the id
    of the first Attempt of the intent whose I/O may have started without
    ending in a definite refusal the frozen profile classifies as not
    performed, or ``None`` when no such Attempt exists. It reads only the
    intent's own dispatch facts, never the source record.

    Raises:
        PortAlreadyRegistered: another proof is installed.
    """
    _NO_EFFECT_PROOF.register(unsettled_attempt)


def no_effect_unsettled_attempt(*, org_id: str, command_id: int) -> int | None:
    """The Attempt that refuses a ``no_effect`` result of ``command_id``, or ``None`` (see above)."""
    return _NO_EFFECT_PROOF.get()(org_id=org_id, command_id=command_id)


# --- predecessor effect (successor authoring) -----------------------------------------
@dataclass(frozen=True)
class PredecessorEffect:
    """The one RemoteEffect of a predecessor intent: its id, state and whether it proves no effect."""

    effect_id: int
    state: str
    proven_no_effect: bool


_PREDECESSOR: Port[Callable[..., PredecessorEffect | None]] = Port("predecessor effect read", provider=_PROVIDER)


def register_predecessor_effect(read: Callable[..., PredecessorEffect | None]) -> None:
    """Install the one predecessor-effect read.

    ``read(*, org_id, command) -> PredecessorEffect | None``: ``None`` when
    the intent has no RemoteEffect yet. ``proven_no_effect`` is true only for
    a terminal effect with proof that the provider performed nothing (read
    committed, no lock: such a state cannot change).

    Raises:
        PortAlreadyRegistered: another read is installed.
    """
    _PREDECESSOR.register(read)


def predecessor_effect(*, org_id: str, command) -> PredecessorEffect | None:
    """The RemoteEffect of the OutboundCommand ``command`` (see :func:`register_predecessor_effect`)."""
    return _PREDECESSOR.get()(org_id=org_id, command=command)


# --- inbound links -------------------------------------------------------------------
class InboundLink(Protocol):
    """The local record an inbound link names."""

    source_object: str
    source_record_key: str


@dataclass(frozen=True)
class InboundLinks:
    """``find(*, org_id, owner_key, destination_slot_id, remote_scope, remote_id) -> InboundLink | None``
    (the non-retired link holding that remote id, byte-exact) and ``create(*, org_id, owner_key, route_key,
    destination_slot_id, source_object, source_record_key, remote_scope, remote_id)`` (the link of a record
    created from an inbound event; a concurrent duplicate raises ``IntegrityError``)."""

    find: Callable[..., InboundLink | None]
    create: Callable[..., object]


_INBOUND_LINKS: Port[InboundLinks] = Port("inbound link resolution", provider=_PROVIDER)


def register_inbound_links(*, find: Callable[..., InboundLink | None], create: Callable[..., object]) -> None:
    """Install the one inbound-link resolution (see :class:`InboundLinks`).

    Raises:
        PortAlreadyRegistered: another resolution is installed.
    """
    _INBOUND_LINKS.register(InboundLinks(find, create))


def inbound_link_find(*, org_id: str, owner_key: str, destination_slot_id: str, remote_scope: str,
                      remote_id: str) -> InboundLink | None:
    """The non-retired inbound link holding ``remote_id`` in that slot, if any."""
    return _INBOUND_LINKS.get().find(org_id=org_id, owner_key=owner_key, destination_slot_id=destination_slot_id,
                                     remote_scope=remote_scope, remote_id=remote_id)


def inbound_link_create(*, org_id: str, owner_key: str, route_key: str, destination_slot_id: str,
                        source_object: str, source_record_key: str, remote_scope: str, remote_id: str) -> None:
    """Create the inbound link of a record just created from an inbound event, in the caller's transaction.

    Raises:
        django.db.IntegrityError: a concurrent transaction linked the same remote id first.
    """
    _INBOUND_LINKS.get().create(org_id=org_id, owner_key=owner_key, route_key=route_key,
                                destination_slot_id=destination_slot_id, source_object=source_object,
                                source_record_key=source_record_key, remote_scope=remote_scope, remote_id=remote_id)
