"""Credential dispatch gates: revocation and explicit re-enablement (seed 003 "State machines").

``CredentialGenerationDispatchGate: enabled -> revoked``, ``revoked -> enabled``
(explicit authorized re-enablement only). Every transition advances the
gate's fence token. Both Permit acquisition and the adapter's
``granted -> sending`` lock this exact gate row, so:

- revocation first: acquisition sees ``revoked`` and grants nothing; a
  ``granted`` Permit can never reach ``sending`` (its credential fence is
  stale), so revocation closes it in the same transaction (``abandoned``
  with proof of no I/O; the effect returns to ``prepared`` and stays
  blocked while the gate is revoked);
- ``sending`` first: the Permit authorized its one call; revocation leaves
  it open and it settles normally (settlement uses Permit and holder fences).

Re-enablement uses a new fence, so no Permit granted before revocation can
ever send. Dispatch never falls forward to another generation.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from connectors import reasons
from connectors.models import (
    CredentialGeneration,
    CredentialGenerationDispatchGate,
    DispatchPermit,
    RemoteEffectAttempt,
)
from connectors.serving.publication import publication_barrier_admit
from connectors.store import (
    CredentialDispatchGateStore,
    DispatchPermitStore,
    RemoteEffectAttemptStore,
    RemoteEffectStore,
)
from nexusflow.kernel import failpoints, locks
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.ports import Port
from nexusflow.kernel.retry import retry_deadlock_victim

FP_REVOKE_BEFORE_COMMIT = failpoints.declare("credential.revoke_before_commit")


class CredentialGateError(NexusError):
    code = "credential_gate_invalid"


@dataclass(frozen=True)
class GateChange:
    """Outcome of a revocation or re-enablement: the gate after it and the Permits it closed."""

    credential_generation_id: int
    state: str
    fence_token: int
    changed: bool
    closed_permits: tuple[int, ...]
    open_sending_permits: tuple[int, ...]


def _gate_of(org_id: str, credential_generation_id: int) -> CredentialGenerationDispatchGate:
    if not CredentialGeneration.objects.filter(org_id=org_id, pk=credential_generation_id).exists():
        raise CredentialGateError(f"no credential generation {credential_generation_id} in org {org_id}",
                                  code="credential_generation_unknown")
    return CredentialDispatchGateStore.lock_where(org_id, credential_generation_id=credential_generation_id)


#: The cutover app's abort of an open first activation before an urgent revocation (seed 003 "Generation and
#: replay"): ``abort(org_id=..., actor=...)``; raises PublicationBarrierHeld once activation won its decision.
_URGENT_ABORT: Port[Callable[..., None]] = Port("urgent revocation abort", provider="cutover")


def register_urgent_revocation_abort(abort: Callable[..., None]) -> None:
    """The cutover app registers the abort :func:`credential_revoke_urgent` runs first (in ``ready()``)."""
    _URGENT_ABORT.register(abort)


def credential_revoke_urgent(*, org_id: str, credential_generation_id: int, actor: str, note: str = "") -> GateChange:
    """Revoke now, aborting an activation attempt that holds the org's publication barriers while it may.

    While a first activation's CutoverDecision is ``rollback_open`` the attempt is aborted: its barrier set is
    taken over and released (``urgent_revocation``), the decision stays open (activate again later), and the
    revocation applies. Once activation won (``activating_v2``) nothing is aborted: the revocation is refused
    ``publication_barrier_held`` and applies after the activation's release (run it again). Never bypasses
    the barrier's fence.

    Raises:
        PublicationBarrierHeld: activation already won, or another attempt acquired the barriers meanwhile.
        CredentialGateError: see :func:`credential_revoke`.

    Seed 003 "Generation and replay" (urgent credential revocation); proof S003-RP-47.
    """
    if not actor.strip():
        raise CredentialGateError("revocation is an operator action: name the actor",
                                  code="credential_revoke_unauthorized")
    _URGENT_ABORT.get()(org_id=org_id, actor=actor.strip())
    return credential_revoke(org_id=org_id, credential_generation_id=credential_generation_id, actor=actor, note=note)


@retry_deadlock_victim
def credential_revoke(*, org_id: str, credential_generation_id: int, actor: str, note: str = "") -> GateChange:
    """Revoke one CredentialGeneration for dispatch; idempotent when already revoked.

    Args:
        org_id: trusted org of the operator.
        credential_generation_id: the generation to revoke.
        actor: who revoked it (recorded on each closed Permit).
        note: free text kept with the closure evidence.

    Returns:
        The :class:`GateChange`; ``open_sending_permits`` lists Permits that
        crossed ``granted -> sending`` before revocation and will settle.

    Raises:
        CredentialGateError: unknown generation (``credential_generation_unknown``) or an empty
            ``actor`` (``credential_revoke_unauthorized``).
    """
    if not actor.strip():
        raise CredentialGateError("revocation is an operator action: name the actor",
                                  code="credential_revoke_unauthorized")
    actor = actor.strip()
    with transaction.atomic(durable=True):
        gate = _gate_of(org_id, credential_generation_id)
        # Revocation serializes through the publication barriers (on this credential gate's lock): refused
        # while an activation holds them.
        publication_barrier_admit(org_id=org_id, owner="credential_revocation")
        changed = gate.state == "enabled"
        fence = gate.fence_token
        if changed:
            fence = gate.fence_token + 1
            CredentialDispatchGateStore.transition(
                org_id=org_id, pk=gate.pk, src="enabled", dst="revoked", version=gate.version,
                set_fields={"fence_token": fence, "reason_code": reasons.CREDENTIAL_REVOKED})
        closed = []
        granted = list(DispatchPermit.objects.filter(org_id=org_id, credential_gate_id=gate.pk,
                                                     state="granted").order_by("id"))
        attempts = {a.pk: a for a in RemoteEffectAttempt.objects.filter(
            org_id=org_id, pk__in=[p.attempt_id for p in granted])}
        # Every closed Permit's rows are locked as one set in the canonical order (all effects,
        # then all Permits, then all Attempts): locking them Permit by Permit would take an
        # effect after an Attempt.
        rows = locks.acquire([resource for permit in granted for resource in (
            locks.store_resource(RemoteEffectStore, org_id, attempts[permit.attempt_id].effect_id),
            locks.store_resource(DispatchPermitStore, org_id, permit.pk),
            locks.store_resource(RemoteEffectAttemptStore, org_id, permit.attempt_id))])
        for index in range(0, len(rows), 3):
            effect, locked, attempt = rows[index:index + 3]
            if locked.state != "granted" or effect.state != "dispatching":
                continue
            from connectors.outbound.egress_common import append_evidence
            from connectors.outbound.permit_send import close_pre_io

            proof = {"proof": "credential_revoked_before_sending", "credential_fence_token": fence, "actor": actor,
                     "note": note}
            append_evidence(effect, kind="credential_revoked", actor=actor, to_state="prepared", detail=proof)
            close_pre_io(effect, locked, attempt, proof=proof, error=reasons.CREDENTIAL_REVOKED)
            closed.append(int(locked.pk))
        sending = tuple(int(pk) for pk in DispatchPermit.objects.filter(
            org_id=org_id, credential_gate_id=gate.pk, state="sending").values_list("pk", flat=True))
        failpoints.hit(FP_REVOKE_BEFORE_COMMIT)
    return GateChange(credential_generation_id, "revoked", fence, changed, tuple(closed), sending)


@retry_deadlock_victim
def credential_reenable(*, org_id: str, credential_generation_id: int, actor: str) -> GateChange:
    """Explicitly re-enable a revoked generation under a new fence; idempotent when enabled.

    Raises:
        CredentialGateError: unknown generation, or an empty ``actor``.
    """
    if not actor.strip():
        raise CredentialGateError("re-enablement is an authorized operator action: name the actor",
                                  code="credential_reenable_unauthorized")
    with transaction.atomic(durable=True):
        gate = _gate_of(org_id, credential_generation_id)
        if gate.state == "enabled":
            return GateChange(credential_generation_id, "enabled", gate.fence_token, False, (), ())
        fence = gate.fence_token + 1
        CredentialDispatchGateStore.transition(
            org_id=org_id, pk=gate.pk, src="revoked", dst="enabled", version=gate.version,
            set_fields={"fence_token": fence, "reason_code": ""})
    return GateChange(credential_generation_id, "enabled", fence, True, (), ())


def gate_summary(gate: CredentialGenerationDispatchGate) -> str:
    """One line for operators."""
    return json.dumps({"credential_generation": gate.credential_generation_id, "state": gate.state,
                       "fence_token": gate.fence_token, "reason_code": gate.reason_code})
