"""The ServingPublicationBarrierSet: external-owner publication frozen through activation.

Seed 003 "Generation and replay" (ServingPublicationBarrierSet) and "State machines". Before
activation the coordinator acquires one set per activation scope (the org): it writes
``acquiring``, reads and freezes the exact owner receipts, and moves the set to ``held``. While a
set of the org is not ``released`` every L2 configuration publication, credential publication and
credential revocation of that org fails in :func:`publication_barrier_admit`; the activation
transaction records ``activation_committed`` together with the epoch and gates, and only an
explicit fenced release reopens publication. Nothing expires.

Serialization: every write of a set locks the org's gates ``FOR UPDATE`` first and the org's
credential dispatch gates after the set; every configuration or credential publication share-locks
the same gates, and every revocation locks its credential dispatch gate, before it checks the set.
A publication already past its check therefore commits before the set changes, and one arriving
later sees the set.

Holder fence: :func:`barrier_acquire` by a new coordinator of the same attempt is the one
takeover; it increments ``holder_fence``. Every later write compares the caller's fence, so a
stale coordinator's hold, commit or release raises :class:`~nexusflow.kernel.errors.FenceRejected`.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from django.db import transaction

from connectors.models import (
    ConnectorServiceConfigurationGeneration,
    CredentialGenerationDispatchGate,
    ServingEpoch,
    ServingPublicationBarrierSet,
)
from connectors.store import AccountServingGateStore, CredentialDispatchGateStore, ServingPublicationBarrierSetStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import FenceRejected, NexusError
from nexusflow.kernel.scope import OrgScope

#: Owners whose publication the barrier set freezes (seed 003 "Generation and replay").
OWNERS = ("configuration", "credential_publication", "credential_revocation", "catalog", "binding_definition")
NONRELEASED = ("acquiring", "held", "activation_committed")

FP_AFTER_ACQUIRING = failpoints.declare("publication_barrier.after_acquiring")
FP_AFTER_HELD = failpoints.declare("publication_barrier.after_held")


class PublicationBarrierHeld(NexusError):
    """A publication was refused: an activation attempt holds the org's publication barriers (retry after it)."""

    code = "publication_barrier_held"


class BarrierSetConflict(NexusError):
    """The org already holds a barrier set of another activation attempt or epoch."""

    code = "publication_barrier_conflict"


class BarrierReceiptMismatch(NexusError):
    """An owner generation differs from the receipt frozen in the held set."""

    code = "publication_barrier_mismatch"


@dataclass(frozen=True)
class Holding:
    """What a coordinator holds: the set's id and the holder fence every later write compares."""

    set_id: int
    fence: int


def coordinator_name() -> str:
    """``host:pid`` of this process: recorded as the set's holder (for operators; never compared)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def open_barrier_set(*, org_id: str) -> ServingPublicationBarrierSet | None:
    """The org's set that is not ``released`` (at most one: ``open_key`` is unique), or ``None``."""
    return ServingPublicationBarrierSet.objects.filter(org_id=org_id, open_key=org_id).first()


def publication_barrier_admit(*, org_id: str, owner: str) -> None:
    """Admit one publication of ``owner`` for ``org_id`` inside the caller's transaction, or refuse it.

    Must run first in the transaction that writes the publication; the shared gate locks it takes last
    until that transaction ends. An org without gates has nothing to activate and is admitted. A
    ``credential_revocation`` takes no gate lock: it runs right after the revocation locked its
    CredentialGenerationDispatchGate, which every barrier-set write locks too, so revocations do not
    queue behind (or hold up) the org's production transactions on the gates.

    Args:
        owner: one of :data:`OWNERS`.

    Raises:
        PublicationBarrierHeld: a set of the org is ``acquiring``, ``held`` or ``activation_committed``.
        RuntimeError: called outside a transaction.
        ValueError: an unknown ``owner``.

    Seed 003 "Generation and replay"; proof S003-RP-47.
    """
    if owner not in OWNERS:
        raise ValueError(f"unknown publication owner {owner!r}")
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("a publication barrier is checked inside the transaction that publishes")
    if owner != "credential_revocation" and not AccountServingGateStore.share_lock_org(org_id):
        return
    held = open_barrier_set(org_id=org_id)
    if held is not None:
        raise PublicationBarrierHeld(
            f"the {owner} publication of {org_id} is frozen: activation attempt {held.attempt_key} holds the "
            f"publication barriers ({held.state}); retry after it releases them")


def owner_receipts(*, org: OrgScope, epoch: ServingEpoch) -> dict:
    """Read the exact owner generations the candidate ``epoch`` names, as the receipts to freeze.

    Returns:
        ``{"configuration": {"id", "generation", "digest"}`` (the org's latest generation),
        ``"epoch": {"id", "digest"}``, ``"packs": {account_key: {"id", "digest"}}``,
        ``"credentials": [{"id", "digest", "gate_state", "gate_fence"}]`` sorted by id ``}``.
    """
    latest = (ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id)
              .order_by("-generation").first())
    credentials = {}
    for account in epoch.document["accounts"]:
        for ref in account["credentials"].values():
            credentials[ref["id"]] = ref["digest"]
    gates = {g.credential_generation_id: g for g in CredentialGenerationDispatchGate.objects.filter(
        org_id=org.org_id, credential_generation_id__in=list(credentials))}
    return {
        "configuration": None if latest is None else {"id": int(latest.pk), "generation": latest.generation,
                                                      "digest": latest.digest},
        "epoch": {"id": int(epoch.pk), "digest": epoch.digest},
        "packs": {a["account_key"]: a["pack_generation"] for a in epoch.document["accounts"]},
        "credentials": [{"id": cid, "digest": credentials[cid],
                         "gate_state": gates[cid].state if cid in gates else None,
                         "gate_fence": gates[cid].fence_token if cid in gates else None}
                        for cid in sorted(credentials)],
    }


def receipts_digest(receipts: dict) -> str:
    return digest_v2("connectors.publication-receipts", [("receipts", canonical_json.dumps(receipts))]).hexdigest


def _lock_publishers(org: OrgScope) -> None:
    """Lock what publications lock, after the set: every credential dispatch gate of the org (revocations)."""
    CredentialDispatchGateStore.lock_all(org.org_id)


def _lock(org: OrgScope, holding: Holding) -> ServingPublicationBarrierSet:
    """Lock the org's gates, the set, then the credential dispatch gates; require the caller's fence."""
    AccountServingGateStore.lock_all(org.org_id)
    locked = ServingPublicationBarrierSetStore.lock(org.org_id, holding.set_id)
    _lock_publishers(org)
    if locked.holder_fence != holding.fence:
        raise FenceRejected(f"publication barrier set {holding.set_id} is held under fence {locked.holder_fence}, "
                            f"not {holding.fence}: a newer coordinator took it over")
    return locked


def barrier_acquire(*, org: OrgScope, attempt_key: str, epoch: ServingEpoch) -> Holding:
    """Write the org's set ``acquiring`` for ``(attempt_key, epoch)``, or take over the one already open.

    A takeover (the set of the same attempt and epoch is still open, whatever its state) increments
    ``holder_fence``: the previous coordinator's fence is stale from then on. A released set is never
    reopened: a new set is written.

    Returns:
        The :class:`Holding` (set id, the new fence).

    Raises:
        BarrierSetConflict: the org's open set belongs to another attempt or epoch.

    Seed 003 "Generation and replay"; proof S003-RP-48.
    """
    with transaction.atomic(durable=True):
        AccountServingGateStore.lock_all(org.org_id)
        current = open_barrier_set(org_id=org.org_id)
        if current is not None:
            if current.attempt_key != attempt_key or current.epoch_id != epoch.pk:
                raise BarrierSetConflict(f"org {org.org_id} has an open publication barrier set of attempt "
                                         f"{current.attempt_key} (epoch {current.epoch_id})")
            locked = ServingPublicationBarrierSetStore.lock(org.org_id, current.pk)
            _lock_publishers(org)
            fence = locked.holder_fence + 1
            ServingPublicationBarrierSetStore.touch(
                org_id=org.org_id, pk=locked.pk, state=locked.state, version=locked.version,
                fences={"holder_fence": locked.holder_fence},
                set_fields={"holder_fence": fence, "holder": coordinator_name()})
            return Holding(int(locked.pk), fence)
        _lock_publishers(org)  # a revocation already past its check commits first
        created = ServingPublicationBarrierSetStore.create(
            org_id=org.org_id, attempt_key=attempt_key, epoch=epoch, state="acquiring", holder_fence=1,
            holder=coordinator_name(), open_key=org.org_id)
    failpoints.hit(FP_AFTER_ACQUIRING)
    return Holding(int(created.pk), 1)


def barrier_hold(*, org: OrgScope, holding: Holding, receipts: dict) -> ServingPublicationBarrierSet:
    """Freeze ``receipts`` and move the set ``acquiring -> held`` (idempotent when already held with them).

    Raises:
        FenceRejected: a newer coordinator holds the set.
        BarrierReceiptMismatch: the set is already held with other receipts.
        BarrierSetConflict: the set is no longer ``acquiring`` or ``held``.
    """
    digest = receipts_digest(receipts)
    with transaction.atomic(durable=True):
        locked = _lock(org, holding)
        if locked.state == "held":
            if locked.receipts_digest != digest:
                raise BarrierReceiptMismatch(f"publication barrier set {locked.pk} froze other owner receipts")
        elif locked.state == "acquiring":
            ServingPublicationBarrierSetStore.transition(
                org_id=org.org_id, pk=locked.pk, src="acquiring", dst="held", version=locked.version,
                fences={"holder_fence": holding.fence}, set_fields={"receipts": canonical_json.dumps(receipts).decode(),
                                                     "receipts_digest": digest})
        else:
            raise BarrierSetConflict(f"publication barrier set {locked.pk} is {locked.state}")
    failpoints.hit(FP_AFTER_HELD)
    return ServingPublicationBarrierSet.objects.get(org_id=org.org_id, pk=holding.set_id)


def barrier_lock_for_commit(*, org: OrgScope, holding: Holding) -> ServingPublicationBarrierSet:
    """Lock the held set inside the activation transaction, after the gates (the caller locked them).

    Raises:
        FenceRejected: a newer coordinator holds the set.
    """
    locked = ServingPublicationBarrierSetStore.lock(org.org_id, holding.set_id)
    if locked.holder_fence != holding.fence:
        raise FenceRejected(f"publication barrier set {holding.set_id} is held under fence {locked.holder_fence}, "
                            f"not {holding.fence}")
    return locked


def barrier_commit(*, org: OrgScope, locked: ServingPublicationBarrierSet, holding: Holding) -> None:
    """``held -> activation_committed`` inside the activation transaction (no-op when already committed).

    Raises:
        FenceRejected: the set moved or a newer coordinator holds it.
        BarrierSetConflict: the set is neither ``held`` nor ``activation_committed``.
    """
    if locked.state == "activation_committed":
        return
    if locked.state != "held":
        raise BarrierSetConflict(f"publication barrier set {locked.pk} is {locked.state}, not held")
    ServingPublicationBarrierSetStore.transition(org_id=org.org_id, pk=locked.pk, src="held",
                                                 dst="activation_committed", version=locked.version,
                                                 fences={"holder_fence": holding.fence})


def barrier_release(*, org: OrgScope, holding: Holding, reason: str) -> bool:
    """Release the set (fenced): publication reopens. Returns ``False`` when it was already released.

    The caller decides that release is legal (seed 003 "State machines"): an abort while the decision is
    open or restore won, or after activation readback.

    Args:
        reason: why (``activation_readback``, ``restore_won``, ``aborted``), kept on the row.

    Raises:
        FenceRejected: a newer coordinator holds the set (a stale coordinator never releases).
    """
    with transaction.atomic(durable=True):
        locked = _lock(org, holding)
        if locked.state == "released":
            return False
        ServingPublicationBarrierSetStore.transition(
            org_id=org.org_id, pk=locked.pk, src=locked.state, dst="released", version=locked.version,
            fences={"holder_fence": holding.fence}, set_fields={"open_key": None, "release_reason": reason})
    return True

