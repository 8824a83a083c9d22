"""The port to a record's remote links (seed 002 identity model; seed 000 "Transfer").

RemoteLink rows are Connector facts: the one external-identity authority of
a record. The records app never reads or writes them itself; it asks the
Connector through the port registered in ``ConnectorsConfig.ready``
(:mod:`connectors.links.identity_transfer` implements it):

- ``lock(org_id=, owners=)``: lock every link of the given ``(object, record
  key)`` pairs, ascending id (class 2 of the transfer's lock order, after the
  record rows); returns them opaque to records;
- ``plan(org=, source=, target=, target_object=, target_key=, links=)``: decide
  every link move of an identity transfer and check every conflict, writing
  nothing; returns :class:`TransferMove` values; raises the ``Transfer*``
  refusals of :mod:`nexusflow.records.transfer`;
- ``apply(org=, moves=, transfer_id=, actor=, target_object=, target_key=)``:
  retire each moved link and create its successor on the target, in the
  caller's transaction;
- ``validate_replay(org=, stored=, target=)``: check a completed transfer's
  target authority owner by owner, writing nothing; raises the ``Transfer*``
  refusals;
- ``describe(org_id=, object_name=, record_key=)``: the record's links for
  support views (``[{"link", "link_key", "action_type", "state",
  "reason_code", "remote_id"}]``, ascending id), read without locks.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from nexusflow.kernel.ports import Port


class TransferMove(Protocol):
    """One planned link move, as the records side of a transfer sees it."""

    #: The target object's mirror field that takes ``remote_id`` (``""``: none).
    mirror_field: str

    @property
    def remote_id(self) -> str: ...

    def as_fact(self, target_object: str) -> dict:
        """The move as stored in ``IdentityTransfer.moves`` (JSON)."""


@dataclass(frozen=True)
class RemoteLinks:
    """The Connector's operations on a record's remote links (see the module docstring for each signature)."""

    lock: Callable[..., Sequence[object]]
    plan: Callable[..., Sequence[TransferMove]]
    apply: Callable[..., None]
    validate_replay: Callable[..., None]
    describe: Callable[..., list[dict]]


_REMOTE_LINKS: Port[RemoteLinks] = Port("remote-link authority", provider="connectors")


def register_remote_links(links: RemoteLinks) -> None:
    """Install the Connector's remote-link operations (one provider, from ``ConnectorsConfig.ready``).

    Raises:
        PortAlreadyRegistered: another provider is installed.
    """
    _REMOTE_LINKS.register(links)


def remote_links() -> RemoteLinks:
    """The registered remote-link operations.

    Raises:
        PortNotRegistered: the Connector app is not installed.
    """
    return _REMOTE_LINKS.get()
