"""Greenfield activation: the first ServingEpoch of a fresh install (seed 003 state machines).

A fresh install has no V1. :func:`cutover_greenfield` still walks every gate
through the seed states, with empty V1 inventories as evidence, and then
activates the epoch and every gate in one transaction under the external
CutoverDecision ``rollback_open -> activating_v2 -> v2_committed``. It is
resumable: a crash at any step leaves states it can continue from.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from connectors.models import AccountServingGate, ConnectorServiceConfigurationGeneration, ServingEpoch
from connectors.serving.epoch import epoch_recheck_for_activation
from connectors.serving.gates import epoch_prepare, epoch_verify, gate_transition
from connectors.store import AccountServingGateStore, ServingEpochStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

from . import decision as decisions
from . import reasons
from .models import CutoverEvidence

FP_BEFORE_ACTIVATION = failpoints.declare("cutover.before_activation")

GREENFIELD_WALK = [
    ("v1_serving", "halting_v1", "maintenance_barrier"),
    ("halting_v1", "v1_stopped", "process_termination"),
    ("v1_stopped", "v1_drained", "v1_shutdown_certificate"),
    ("v1_drained", "v2_validating", "v1_restore_point"),
]


class CutoverRefused(NexusError):
    code = "cutover_refused"


@dataclass
class GreenfieldReport:
    epoch_id: ServingEpoch.Id
    epoch_digest: str
    accounts: list[str]
    decision: str
    already_active: bool


def _evidence(org: OrgScope, attempt_key: str, kind: str, account_key: str, payload: dict) -> dict:
    existing = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key, kind=kind,
                                              account_key=account_key).first()
    if existing is None:
        digest = digest_v2("cutover.evidence", [("kind", kind), ("payload", canonical_json.dumps(payload))]).hexdigest
        existing = insert(CutoverEvidence, org_id=org.org_id, attempt_key=attempt_key, kind=kind,
                          account_key=account_key, payload=payload, digest=digest)
    return {"evidence_id": existing.pk, "kind": kind, "digest": existing.digest}


def v1_serving_configuration(*, org: OrgScope, purpose: str) -> tuple[ConnectorServiceConfigurationGeneration,
                                                                       list[AccountServingGate]]:
    """The org's current connector configuration generation and its gates, ordered by account key, when
    every gate is still ``v1_serving`` (a V1 install, a preflight before maintenance).

    Raises:
        CutoverRefused: the org has no configuration or no accounts, or a gate left ``v1_serving``
            (``purpose`` says what needed them all there).
    """
    configuration = (ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id)
                     .order_by("-generation").first())
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    if configuration is None or not gates:
        raise CutoverRefused(f"org {org.org_id} has no accounts; apply a connector configuration first")
    moved = [f"{g.account_key}={g.state}" for g in gates if g.state != "v1_serving"]
    if moved:
        raise CutoverRefused(f"{purpose}; found {', '.join(moved)}")
    return configuration, gates


def cutover_greenfield(*, org: OrgScope) -> GreenfieldReport:
    """Activate the first ServingEpoch of ``org`` with empty V1 inventories.

    Returns:
        The report; ``already_active`` when the org was already serving V2.

    Raises:
        CutoverRefused: a gate is in a state a fresh install cannot be in, or
            V2 already served under another epoch.
        EpochVerificationFailed: the candidate failed owner verification.
    """
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    if not gates:
        raise CutoverRefused(f"org {org.org_id} has no accounts; apply a connector configuration first")
    if all(g.state == "v2_serving" for g in gates):
        epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=gates[0].epoch_id)
        return GreenfieldReport(epoch.pk, epoch.digest, [g.account_key for g in gates], "v2_committed", True)
    walkable = {"v1_serving", "halting_v1", "v1_stopped", "v1_drained", "v2_validating"}
    bad = [f"{g.account_key}={g.state}" for g in gates if g.state not in walkable]
    if bad:
        raise CutoverRefused(f"greenfield activation needs fresh gates; found {', '.join(bad)}")

    epoch = epoch_prepare(org=org)
    epoch = epoch_verify(org=org, epoch_id=epoch.pk)
    attempt_key = f"greenfield-{epoch.pk}"
    decisions.decision_open(org_id=org.org_id, attempt_key=attempt_key, epoch_id=epoch.pk,
                            epoch_digest=epoch.digest, mode="greenfield")

    empty_inventory = {"v1_process_generations": [], "v1_open_work": 0, "v1_unreconciled_effects": 0,
                       "observed_at": db_now().isoformat(), "mode": "greenfield"}
    for gate in gates:
        for src, dst, kind in GREENFIELD_WALK:
            with transaction.atomic(durable=True):
                locked = AccountServingGateStore.lock_by_account(org.org_id, gate.account_key)
                if locked.state != src:
                    continue
                proof = _evidence(org, attempt_key, kind, gate.account_key, empty_inventory)
                gate_transition(gate=locked, dst=dst, evidence=proof, reason_code=reasons.CUTOVER_IN_PROGRESS)

    try:
        decisions.begin_activation(org.org_id, attempt_key)
    except decisions.DecisionLost as exc:
        raise CutoverRefused(f"cutover decision is {exc.state}; activation cannot proceed") from None
    failpoints.hit(FP_BEFORE_ACTIVATION)
    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=epoch.pk)
    if epoch.state == "verified":
        # "verified" is evidence at one point in time: reread every owner before the atomic activation.
        epoch_recheck_for_activation(org=org, epoch=epoch)
    _activate(org, epoch, attempt_key)
    decisions.commit_activation(org.org_id, attempt_key)
    return GreenfieldReport(epoch.pk, epoch.digest, [g.account_key for g in gates], "v2_committed", False)


def _activate(org: OrgScope, epoch: ServingEpoch, attempt_key: str) -> None:
    """One transaction: every gate ``v2_validating -> v2_serving`` and the epoch ``verified -> active``."""
    with transaction.atomic(durable=True):
        # Every gate of the org, in the canonical key order of the one lock order (ascending id).
        gates = AccountServingGateStore.lock_all(org.org_id)
        locked_epoch = ServingEpochStore.lock(org.org_id, epoch.pk)
        if locked_epoch.state == "active" and all(g.state == "v2_serving" and g.epoch_id == epoch.pk for g in gates):
            return
        activate_locked(org=org, attempt_key=attempt_key, epoch=locked_epoch, gates=gates,
                        evidence={"epoch_id": epoch.pk, "epoch_digest": epoch.digest})


def activate_locked(*, org: OrgScope, attempt_key: str, epoch: ServingEpoch, gates: list, evidence: dict,
                    expected_digest: str | None = None) -> ServingEpoch:
    """Inside the caller's transaction, with every gate of the org and ``epoch`` locked: check the epoch is
    the ``verified`` candidate (of ``expected_digest`` when given), every gate is ``v2_validating`` and the
    gates are exactly the epoch's accounts, then move the epoch ``verified -> active`` and every gate to
    ``v2_serving`` on it under one ``activation`` evidence row carrying ``evidence``. Returns the active epoch.

    Raises:
        CutoverRefused: the epoch, a gate or the account set is not as required (nothing written).
    """
    if epoch.state != "verified" or (expected_digest is not None and epoch.digest != expected_digest):
        raise CutoverRefused(f"epoch {epoch.pk} is {epoch.state}, not the verified candidate")
    not_ready = [g.account_key for g in gates if g.state != "v2_validating"]
    if not_ready:
        raise CutoverRefused(f"gates not in v2_validating: {', '.join(not_ready)}")
    if {a["account_key"] for a in epoch.document["accounts"]} != {g.account_key for g in gates}:
        raise CutoverRefused("the epoch's account set differs from the exhaustive gate set")
    ServingEpochStore.transition(org_id=org.org_id, pk=epoch.pk, src="verified", dst="active",
                                 version=epoch.version, set_fields={"activated_at": db_now()})
    epoch.refresh_from_db()
    proof = _evidence(org, attempt_key, "activation", "", evidence)
    for gate in gates:
        gate_transition(gate=gate, dst="v2_serving", evidence=proof, epoch=epoch)
    return epoch
