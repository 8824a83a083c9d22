"""The CutoverDecision transitions of a V1 -> V2 attempt: activation versus restore.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (steps 8 and the full restore) and
"Compressed durable model" (the external L2 CutoverDecision). The decision lives on the ``control``
database; each function is one short ``control`` transaction that locks the decision row and
compare-and-swaps it, so activation and a RestoreAttempt serialize on it and exactly one of
``activating_v2`` and ``restoring_v1`` wins ``rollback_open``. Elapsed time never decides: no
function here reads a clock.

- :func:`decision_open`: ``cutover validate`` opens the decision (``rollback_open``) with the candidate epoch;
- :func:`begin_activation` / :func:`commit_activation`: ``cutover activate``;
- :func:`begin_restore` / :func:`complete_restore`: ``cutover restore``.
"""
from __future__ import annotations

from django.db import transaction

from nexusflow.kernel import failpoints
from nexusflow.kernel.errors import NexusError

from .models import CutoverDecision
from .store import CutoverDecisionStore

MODE = "v1_upgrade"
#: Inside the decision's control transaction, after its row lock and before the CAS.
FP_BEFORE_CAS = failpoints.declare("cutover.decision.before_cas")


class DecisionLost(NexusError):
    """The other branch already won the attempt's CutoverDecision (``state`` says which)."""

    code = "cutover_decision_lost"

    def __init__(self, message: str, *, state: str):
        super().__init__(message)
        self.state = state


class DecisionMissing(NexusError):
    """The attempt has no CutoverDecision (``cutover validate`` opens it)."""

    code = "cutover_decision_missing"


def decision_of(org_id: str, attempt_key: str) -> CutoverDecision | None:
    """The attempt's decision as committed now (control database), or ``None``."""
    return CutoverDecision.objects.filter(org_id=org_id, attempt_key=attempt_key).first()


def decision_open(*, org_id: str, attempt_key: str, epoch_id: int | None, epoch_digest: str,
                  mode: str = MODE) -> CutoverDecision:
    """Create the attempt's decision in ``rollback_open`` for the candidate epoch, or return it.

    Args:
        epoch_id / epoch_digest: the verified candidate ServingEpoch (``None`` / ``""`` when a restore
            opens it before any candidate exists).
        mode: ``v1_upgrade`` (a V1 -> V2 attempt) or ``greenfield``.

    Returns:
        The decision row (any state: a rerun never reopens a decided attempt).
    """
    existing = decision_of(org_id, attempt_key)
    if existing is not None:
        return existing
    with transaction.atomic(using="control", durable=True):
        return CutoverDecisionStore.create(org_id=org_id, attempt_key=attempt_key, mode=mode, state="rollback_open",
                                           epoch_id=epoch_id, epoch_digest=epoch_digest)


def _move(org_id: str, attempt_key: str, src: str, dst: str, done: tuple[str, ...],
          guard=None) -> CutoverDecision:
    with transaction.atomic(using="control", durable=True):
        try:
            locked = CutoverDecisionStore.lock_where(org_id, attempt_key=attempt_key)
        except CutoverDecision.DoesNotExist:
            raise DecisionMissing(f"attempt {attempt_key} of {org_id} has no cutover decision; run cutover validate "
                                  "first") from None
        failpoints.hit(FP_BEFORE_CAS)
        if locked.state in done:
            return locked
        if locked.state != src:
            raise DecisionLost(f"attempt {attempt_key}: the cutover decision is {locked.state}; {dst} cannot win it",
                               state=locked.state)
        if guard is not None:  # under the decision row lock: an urgent abort either happened or waits for us
            guard()
        CutoverDecisionStore.transition(org_id=org_id, pk=locked.pk, src=src, dst=dst, version=locked.version)
    return CutoverDecision.objects.get(org_id=org_id, pk=locked.pk)


def begin_activation(org_id: str, attempt_key: str, *, guard=None) -> CutoverDecision:
    """Win ``rollback_open -> activating_v2`` for the attempt (idempotent once activation won).

    ``guard``: called under the decision's row lock just before the CAS; it raises to win nothing (the
    activation checks that its publication barriers are still held: an urgent revocation may have aborted it).

    Returns:
        The decision, ``activating_v2`` or ``v2_committed``.

    Raises:
        DecisionLost: a RestoreAttempt won (``restoring_v1`` / ``v1_restored``): activation must record no
            commit and release its barriers.
        DecisionMissing: no decision exists.

    Seed 003 "Offline V1 shutdown ...", step 8; proofs S003-RP-45, S003-RP-49.
    """
    return _move(org_id, attempt_key, "rollback_open", "activating_v2", ("activating_v2", "v2_committed"), guard)


def commit_activation(org_id: str, attempt_key: str) -> CutoverDecision:
    """``activating_v2 -> v2_committed`` after the activation readback (idempotent once committed).

    Raises:
        DecisionLost: the decision is not ``activating_v2`` (activation never won it).
        DecisionMissing: no decision exists.
    """
    return _move(org_id, attempt_key, "activating_v2", "v2_committed", ("v2_committed",))


def begin_restore(org_id: str, attempt_key: str) -> CutoverDecision:
    """Win ``rollback_open -> restoring_v1`` for the attempt (idempotent once restore won).

    Opens the decision first (``rollback_open``, no epoch) when the attempt never reached
    ``cutover validate``, so a restore of a drained service needs no candidate.

    Args:
        org_id: the org's canonical id; attempt_key: the service cutover attempt key.

    Returns:
        The decision, ``restoring_v1`` or ``v1_restored``.

    Raises:
        DecisionLost: activation won (``activating_v2`` / ``v2_committed``): V1 can no longer be restored
            by this attempt.

    Seed 003 "Offline V1 shutdown ...", the full restore; proofs S003-RP-45, S003-RP-49.
    """
    decision_open(org_id=org_id, attempt_key=attempt_key, epoch_id=None, epoch_digest="")
    return _move(org_id, attempt_key, "rollback_open", "restoring_v1", ("restoring_v1", "v1_restored"))


def complete_restore(org_id: str, attempt_key: str) -> CutoverDecision:
    """``restoring_v1 -> v1_restored`` once the V1 restore point is restored and verified (idempotent).

    Raises:
        DecisionLost: the decision is not ``restoring_v1`` (restore never won it).
        DecisionMissing: no decision exists.
    """
    return _move(org_id, attempt_key, "restoring_v1", "v1_restored", ("v1_restored",))
