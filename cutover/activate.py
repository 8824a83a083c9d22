"""``cutover activate``: the first production activation of a validated V2 candidate.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 8; "Generation and replay"
(ServingPublicationBarrierSet); proofs S003-RP-46..49. Each boundary below is a named failpoint:

1. acquire the org's ServingPublicationBarrierSet (``acquiring``; a rerun is the one holder-fenced
   takeover of the same set), freeze the exact owner receipts, ``held``;
2. final reread under the held barriers: the candidate's owners (fresh reads, byte-compared), the
   frozen receipts, the readiness and V1 shutdown certificates, the V1RestorePoint and the exhaustive gate
   set. While the decision is ``rollback_open`` a mismatch releases the barriers and refuses;
3. win ``CutoverDecision: rollback_open -> activating_v2`` (control database). If a RestoreAttempt won
   ``restoring_v1`` instead, nothing local is committed and the barriers are released (fenced);
4. one transaction: every gate, the barrier set, the epoch locked; the set ``held ->
   activation_committed``, the epoch ``verified -> active``, every gate ``v2_validating -> v2_serving``
   with the epoch id, digest and a new fence: all or nothing;
5. readback (a fresh read proves the epoch active and the whole gate set on it), ``v2_committed``, then
   the barriers released and the configuration owner's maintenance barrier reopened.

A crash anywhere leaves either the verified epoch with every gate ``v2_validating`` (restore still
authorized while the decision is ``rollback_open``) or the active epoch with every gate ``v2_serving``;
rerunning ``activate`` resumes from what is durable. Nothing here waits on elapsed time.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from connectors.models import AccountServingGate, ServingEpoch, ServingPublicationBarrierSet, V1MaintenanceBarrier
from connectors.serving.epoch import EpochVerificationFailed, epoch_recheck_for_activation
from connectors.serving.publication import (
    Holding,
    PublicationBarrierHeld,
    barrier_acquire,
    barrier_commit,
    barrier_hold,
    barrier_lock_for_commit,
    barrier_release,
    open_barrier_set,
    owner_receipts,
    receipts_digest,
)
from connectors.store import AccountServingGateStore, ServingEpochStore
from connectors.v1.store import V1MaintenanceBarrierStore
from nexusflow.kernel import failpoints
from nexusflow.kernel.scope import OrgScope

from . import decision as decisions
from .models import CutoverDecision, CutoverReadinessCertificate, V1RestorePoint, V1ShutdownCertificate
from .services import CutoverRefused, activate_locked
from .store import CutoverDecisionStore
from .v1_shutdown import attempt_certificate

log = logging.getLogger(__name__)

FP_AFTER_HELD = failpoints.declare("cutover.activate.after_held")
FP_BEFORE_DECISION = failpoints.declare("cutover.activate.before_decision")
FP_AFTER_DECISION = failpoints.declare("cutover.activate.after_decision")
FP_BEFORE_COMMIT = failpoints.declare("cutover.activate.before_commit")
FP_AFTER_COMMIT = failpoints.declare("cutover.activate.after_commit")
FP_AFTER_V2_COMMITTED = failpoints.declare("cutover.activate.after_v2_committed")
#: Inside the activation's decision transaction: the row locked, the barriers proven still held, before the CAS.
FP_DECISION_GUARDED = failpoints.declare("cutover.activate.decision_guarded")
#: Inside the urgent abort's decision transaction: the row locked and ``rollback_open``, before the release.
FP_ABORT_BEFORE_RELEASE = failpoints.declare("cutover.activate.abort_before_release")
#: Every first-activation boundary, in order (tests crash a real process at each).
BOUNDARIES = ("publication_barrier.after_acquiring", "publication_barrier.after_held", FP_AFTER_HELD,
              FP_BEFORE_DECISION, FP_AFTER_DECISION, FP_BEFORE_COMMIT, FP_AFTER_COMMIT, FP_AFTER_V2_COMMITTED)


class ActivationAborted(CutoverRefused):
    """The final reread found drift while rollback was open: barriers released, nothing activated."""

    code = "activation_aborted"


@dataclass
class ActivateReport:
    """``barrier_set_id``/``holder_fence``: the set this run held; ``decision``: ``v2_committed``."""

    attempt_key: str
    epoch_id: int
    epoch_digest: str
    gates: list[str]
    barrier_set_id: int
    holder_fence: int
    decision: str
    already: bool


def _final_reread(org: OrgScope, attempt_key: str, certificate: CutoverReadinessCertificate,
                  epoch: ServingEpoch, frozen: ServingPublicationBarrierSet) -> list[str]:
    """Problems found by rereading every frozen fact under the held barriers (empty: activation may win)."""
    problems = []
    try:
        epoch_recheck_for_activation(org=org, epoch=epoch)
    except EpochVerificationFailed as exc:
        problems.append(f"owner drift: {exc}")
    if receipts_digest(owner_receipts(org=org, epoch=epoch)) != frozen.receipts_digest:
        problems.append("an owner generation differs from the receipt frozen in the barrier set")
    current = CutoverReadinessCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if current is None or current.digest != certificate.digest:
        problems.append("the readiness certificate changed")
    shutdown = V1ShutdownCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    point = V1RestorePoint.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if shutdown is None or point is None or point.certificate_digest != shutdown.digest:
        problems.append("the V1 shutdown certificate or restore point is missing or unbound")
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id))
    if {g.account_key for g in gates} != {a["account_key"] for a in epoch.document["accounts"]}:
        problems.append("the gate set differs from the candidate's accounts")
    problems += [f"gate {g.account_key} is {g.state}" for g in gates if g.state != "v2_validating"]
    return problems


def _commit(org: OrgScope, attempt_key: str, epoch: ServingEpoch, holding: Holding) -> None:
    """One transaction: barrier set ``activation_committed``, epoch ``active``, every gate ``v2_serving``."""
    with transaction.atomic(durable=True):
        gates = AccountServingGateStore.lock_all(org.org_id)
        barrier = barrier_lock_for_commit(org=org, holding=holding)
        locked_epoch = ServingEpochStore.lock(org.org_id, epoch.pk)
        if barrier.state == "activation_committed" and locked_epoch.state == "active" \
                and all(g.state == "v2_serving" and g.epoch_id == epoch.pk for g in gates):
            return
        if locked_epoch.state == "verified" and \
                receipts_digest(owner_receipts(org=org, epoch=locked_epoch)) != barrier.receipts_digest:
            raise CutoverRefused("an owner generation drifted from the frozen barrier receipts")
        barrier_commit(org=org, locked=barrier, holding=holding)
        activate_locked(org=org, attempt_key=attempt_key, epoch=locked_epoch, gates=gates,
                        expected_digest=epoch.digest, evidence={
                            "epoch_id": int(epoch.pk), "epoch_digest": epoch.digest,
                            "barrier_set_id": int(barrier.pk), "receipts_digest": barrier.receipts_digest})
        failpoints.hit(FP_BEFORE_COMMIT)


def activation_readback(*, org: OrgScope, epoch_id: int) -> list[str]:
    """Problems in a fresh read of the activation (empty: the epoch is active and every gate serves it)."""
    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=epoch_id)
    problems = [] if epoch.state == "active" else [f"epoch {epoch_id} is {epoch.state}"]
    for gate in AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"):
        if gate.state != "v2_serving" or gate.epoch_id != epoch.pk or gate.epoch_digest != epoch.digest:
            problems.append(f"gate {gate.account_key} is {gate.state} on epoch {gate.epoch_id}")
    return problems


def _reopen_configuration(org: OrgScope, attempt_key: str) -> None:
    """Reopen the configuration owner's maintenance barrier after ``v2_committed`` (V1 ingress and root
    outbound stay closed: V1 tables are terminal read-only once V2 committed)."""
    if not V1MaintenanceBarrier.objects.filter(org_id=org.org_id, kind="configuration", state="closed").exists():
        return
    with transaction.atomic(durable=True):
        barrier = V1MaintenanceBarrierStore.lock_where(org.org_id, kind="configuration")
        if barrier.state == "closed":
            V1MaintenanceBarrierStore.transition(
                org_id=org.org_id, pk=barrier.pk, src="closed", dst="open", version=barrier.version,
                set_fields={"fence_token": barrier.fence_token + 1, "attempt_key": attempt_key})


def urgent_revocation_abort(*, org_id: str, actor: str) -> None:
    """Abort the org's open first-activation attempt before an urgent credential revocation (seed 003).

    Under the attempt's CutoverDecision row lock (control database): while it is ``rollback_open`` the barrier
    set is taken over (one holder-fenced takeover) and released ``urgent_revocation``; the activation still
    running cannot win the decision afterwards (:func:`_still_held`). Nothing happens when no set is open.

    Raises:
        PublicationBarrierHeld: activation won the decision (``activating_v2``/``v2_committed``), or the open
            set has no first-activation decision: the revocation applies after the release.
    """
    org = OrgScope(org_id)
    current = open_barrier_set(org_id=org_id)
    if current is None:
        return
    with transaction.atomic(using="control", durable=True):
        try:
            decision = CutoverDecisionStore.lock_where(org_id, attempt_key=current.attempt_key)
        except CutoverDecision.DoesNotExist:
            raise PublicationBarrierHeld(f"an activation of org {org_id} holds the publication barriers; revoke "
                                         "after its release") from None
        if decision.state != "rollback_open":
            raise PublicationBarrierHeld(f"attempt {current.attempt_key} won activation ({decision.state}); the "
                                         "revocation applies after its release: run it again then")
        failpoints.hit(FP_ABORT_BEFORE_RELEASE)
        holding = barrier_acquire(org=org, attempt_key=current.attempt_key, epoch=current.epoch)
        barrier_release(org=org, holding=holding, reason="urgent_revocation")
    log.warning("urgent revocation by %s aborted activation attempt %s", actor, current.attempt_key,
                extra={"org_id": org_id})


def _still_held(org: OrgScope, attempt_key: str, holding) -> None:
    """Refuse to win the decision unless this coordinator still holds its barrier set (``held``, its fence).

    Raises:
        ActivationAborted: the set was released (an urgent credential revocation aborted the attempt) or
            taken over; nothing is activated and the decision stays ``rollback_open``.
    """
    current = ServingPublicationBarrierSet.objects.get(org_id=org.org_id, pk=holding.set_id)
    if current.state != "held" or current.holder_fence != holding.fence:
        raise ActivationAborted(f"attempt {attempt_key}: the publication barriers are {current.state} "
                                f"({current.release_reason or 'taken over'}); nothing activated, run cutover "
                                "activate again")
    failpoints.hit(FP_DECISION_GUARDED)


def activation_release_after_restore(*, org: OrgScope, attempt_key: str, holding: Holding | None = None) -> bool:
    """Release the attempt's open publication barrier set once a RestoreAttempt won its decision.

    ``cutover restore`` may call it after :func:`cutover.decision.begin_restore` so a crashed activation's
    barriers never outlive the restore; it is the one holder-fenced takeover (``holding`` given: this
    coordinator's own fence) followed by the release.

    Returns:
        ``True`` when a set was released, ``False`` when the attempt held none.

    Raises:
        CutoverRefused: the decision is not ``restoring_v1`` / ``v1_restored`` (release is not legal).
        FenceRejected: a newer coordinator took the set over meanwhile.

    Seed 003 "State machines" (``ServingPublicationBarrierSet: held -> released``); proof S003-RP-49.
    """
    decision = decisions.decision_of(org.org_id, attempt_key)
    if decision is None or decision.state not in ("restoring_v1", "v1_restored"):
        raise CutoverRefused(f"attempt {attempt_key}: restore has not won the cutover decision")
    current = open_barrier_set(org_id=org.org_id)
    if current is None or current.attempt_key != attempt_key:
        return False
    if holding is None or holding.set_id != int(current.pk):
        holding = barrier_acquire(org=org, attempt_key=attempt_key, epoch=current.epoch)
    return barrier_release(org=org, holding=holding, reason="restore_won")


def _release_for_restore(org: OrgScope, attempt_key: str, holding: Holding | None, state: str):
    """Restore won: take over (if needed) and fenced-release the attempt's open set; refuse."""
    activation_release_after_restore(org=org, attempt_key=attempt_key, holding=holding)
    raise decisions.DecisionLost(f"attempt {attempt_key}: a RestoreAttempt won the cutover decision ({state}); "
                                 "nothing was activated and the publication barriers are released", state=state)


def cutover_activate(*, org: OrgScope, attempt_key: str) -> ActivateReport:
    """Activate the validated candidate of ``attempt_key``: every gate ``v2_serving`` on the active epoch.

    Returns:
        The :class:`ActivateReport`; ``already`` when the attempt was already ``v2_committed`` with its
        barriers released.

    Raises:
        InvalidIdentity / CertificateMissing: a bad key or no readiness certificate.
        DecisionMissing: ``cutover validate`` has not opened the decision.
        DecisionLost: a RestoreAttempt won the decision; no activation commit, barriers released.
        ActivationAborted: the final reread found drift while rollback was open; barriers released.
        CutoverRefused: gates outside ``v2_validating`` / ``v2_serving``, or the candidate is not verified.
        BarrierSetConflict: another attempt holds the org's publication barriers.
        FenceRejected: a newer coordinator took the barrier set over during this run (this run stops).
        EpochVerificationDeferred: an owner could not be read now (run it again).

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 8; proofs S003-RP-46..49.
    """
    attempt_key, certificate = attempt_certificate(org, attempt_key)
    decision = decisions.decision_of(org.org_id, attempt_key)
    if decision is None or decision.epoch_id is None:
        raise decisions.DecisionMissing(f"attempt {attempt_key} has no validated candidate; run cutover validate")
    if decision.state in ("restoring_v1", "v1_restored"):
        _release_for_restore(org, attempt_key, None, decision.state)
    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=decision.epoch_id)
    gates = [g.account_key for g in AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key")]
    current = open_barrier_set(org_id=org.org_id)
    if decision.state == "v2_committed" and current is None:
        return ActivateReport(attempt_key, int(epoch.pk), epoch.digest, gates, 0, 0, decision.state, True)

    holding = barrier_acquire(org=org, attempt_key=attempt_key, epoch=epoch)
    barrier = ServingPublicationBarrierSet.objects.get(org_id=org.org_id, pk=holding.set_id)
    if barrier.state == "acquiring":
        barrier = barrier_hold(org=org, holding=holding, receipts=owner_receipts(org=org, epoch=epoch))
    failpoints.hit(FP_AFTER_HELD)

    if decision.state == "rollback_open":
        problems = _final_reread(org, attempt_key, certificate, epoch, barrier)
        if problems:
            barrier_release(org=org, holding=holding, reason="final_reread_mismatch")
            raise ActivationAborted(f"attempt {attempt_key}: the final reread found drift; publication barriers "
                                    "released, nothing activated: " + "; ".join(problems))
        failpoints.hit(FP_BEFORE_DECISION)
        try:
            decision = decisions.begin_activation(org.org_id, attempt_key,
                                                  guard=lambda: _still_held(org, attempt_key, holding))
        except decisions.DecisionLost as exc:
            _release_for_restore(org, attempt_key, holding, exc.state)
        failpoints.hit(FP_AFTER_DECISION)
    if decision.state == "activating_v2":
        _commit(org, attempt_key, epoch, holding)
        failpoints.hit(FP_AFTER_COMMIT)
        problems = activation_readback(org=org, epoch_id=epoch.pk)
        if problems:
            raise CutoverRefused("activation readback failed (barriers stay held): " + "; ".join(problems))
        decision = decisions.commit_activation(org.org_id, attempt_key)
        failpoints.hit(FP_AFTER_V2_COMMITTED)
    problems = activation_readback(org=org, epoch_id=epoch.pk)
    if problems:
        raise CutoverRefused("activation readback failed (barriers stay held): " + "; ".join(problems))
    barrier_release(org=org, holding=holding, reason="activation_readback")
    _reopen_configuration(org, attempt_key)
    return ActivateReport(attempt_key, int(epoch.pk), epoch.digest, gates, holding.set_id, holding.fence,
                          decision.state, False)
