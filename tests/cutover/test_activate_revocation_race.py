"""An urgent credential revocation racing ``cutover activate`` on the CutoverDecision row (proof S003-RP-47).

Seed 003 "Generation and replay": while first activation's decision is ``rollback_open`` an urgent revocation
aborts the attempt and releases its barriers before it revokes; once ``activating_v2`` won, the revocation
waits through activation and applies after the release. Both serialize on the decision row (control database):
one side is held at a named failpoint with that row locked, the other is started, and the hold is released
only once the database shows the other waiting on the row (or done: a revocation or activation that never
waits has nothing to serialize on, and the invariant below catches what it did). Real concurrent
transactions, each thread on its own connections; every wait is on a state the database or a thread proves.

The invariant: exactly one of the two outcomes, consistent in every owner. Either the revocation won
(decision still ``rollback_open``, epoch verified, the activation's barriers released ``urgent_revocation``,
the credential revoked, the activation aborted) or the activation won (``v2_committed``, epoch active, barriers
released after the readback, the revocation refused and the credential still enabled). Never a decision won
by activation beside barriers released for the revocation and a revoked credential.
"""
from __future__ import annotations

import time

import pytest
from django.db import connections

from connectors.models import CredentialGeneration, CredentialGenerationDispatchGate, ServingPublicationBarrierSet
from connectors.serving.credential_gates import credential_revoke_urgent
from connectors.serving.publication import PublicationBarrierHeld
from cutover import activate as activation
from cutover.activate import cutover_activate
from cutover.decision import decision_of
from tests.conftest import ORG
from tests.cutover.conftest import ATTEMPT
from tests.cutover.test_activate import ControlWorker, _assert_all_or_nothing

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _queued_on_decision_or_done(worker: ControlWorker, timeout: float = 60) -> bool:
    """Wait until ``worker``'s control connection waits on a locking read of the CutoverDecision (``True``) or
    the worker finished without waiting there (``False``). Each poll is bounded by the worker's own end."""
    assert worker.ready.wait(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connections["control"].cursor() as cursor:
            cursor.execute("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = %s", [worker.control_id])
            row = cursor.fetchone()
        info = (row[0] or "") if row else ""
        if "cutover_cutoverdecision" in info and "FOR UPDATE" in info:
            return True
        worker.join(0.02)
        if not worker.is_alive():
            return False
    raise AssertionError("the queued side neither waited on the cutover decision nor finished")


def _outcome(activate: ControlWorker, revoke: ControlWorker, credential_id: int) -> str:
    """``"revocation"`` or ``"activation"``: which side won, after proving that side's outcome is whole and the
    other side's is absent (fails on any mix)."""
    decision = decision_of(ORG, ATTEMPT).state
    sets = list(ServingPublicationBarrierSet.objects.filter(org_id=ORG).order_by("id"))
    released_for = [(s.state, s.release_reason) for s in sets]
    gate = CredentialGenerationDispatchGate.objects.get(credential_generation_id=credential_id).state
    shape = _assert_all_or_nothing()
    observed = (f"decision {decision}, gates {shape}, barrier sets {released_for}, credential gate {gate}, "
                f"activation {activate.error!r}, revocation {revoke.error!r}")
    revocation_won = (decision == "rollback_open" and shape == "offline"
                      and released_for == [("released", "urgent_revocation")] and gate == "revoked"
                      and isinstance(activate.error, activation.ActivationAborted) and revoke.error is None)
    activation_won = (decision == "v2_committed" and shape == "serving"
                      and released_for == [("released", "activation_readback")] and gate == "enabled"
                      and activate.error is None and isinstance(revoke.error, PublicationBarrierHeld))
    assert revocation_won != activation_won, f"not exactly one consistent outcome: {observed}"
    return "revocation" if revocation_won else "activation"


@pytest.mark.parametrize("first", ["activation", "revocation"])
def test_an_urgent_revocation_and_activation_queued_on_the_decision_row_end_in_exactly_one_outcome(validated,
                                                                                                    holds, first):
    """S003-RP-47: ``activation`` holds the decision row after its barrier guard passed (before its CAS) and the
    revocation queues behind it; ``revocation`` holds the row after reading ``rollback_open`` (before its
    release) and the activation, already holding its barriers, queues behind it. The side holding the row wins;
    the queued side sees the outcome and gives way: the revocation is refused once ``activating_v2`` won, the
    activation can no longer win once its barriers were released for the revocation."""
    credential = CredentialGeneration.objects.filter(org_id=ORG).first()
    activate = ControlWorker(lambda: cutover_activate(org=validated, attempt_key=ATTEMPT))
    revoke = ControlWorker(lambda: credential_revoke_urgent(org_id=ORG, credential_generation_id=credential.pk,
                                                            actor="security"))
    if first == "activation":
        holds.arm(activation.FP_DECISION_GUARDED)
        activate.start()
        held = holds.wait_held(activation.FP_DECISION_GUARDED)  # decision row locked, barriers held
        queued = revoke
        revoke.start()
    else:
        holds.arm(activation.FP_BEFORE_DECISION)
        activate.start()
        before_decision = holds.wait_held(activation.FP_BEFORE_DECISION)
        assert ServingPublicationBarrierSet.objects.get(org_id=ORG).state == "held"  # the set the revocation aborts
        holds.arm(activation.FP_ABORT_BEFORE_RELEASE)
        revoke.start()
        held = holds.wait_held(activation.FP_ABORT_BEFORE_RELEASE)  # decision row locked, read rollback_open
        queued = activate
        holds.release(before_decision)
    waited = _queued_on_decision_or_done(queued)
    holds.release(held)
    activate.join(60)
    revoke.join(60)
    assert not activate.is_alive() and not revoke.is_alive(), "a racing side hung"

    assert _outcome(activate, revoke, int(credential.pk)) == first  # the side holding the decision row won
    assert waited, "the queued side never waited on the cutover decision row"
