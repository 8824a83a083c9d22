"""``cutover drain``: wait for V1 to finish the work it accepted before the barriers closed.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 2; proof
S003-RP-41. The unchanged V1 runtime (``run_workers --role v1``) finishes
every accepted item under its own authority, including the continuation
outbound calls it requires (the ``root_outbound`` barrier refuses only new
roots). This phase does not run V1 work; it takes the live inventory and:

- reports the blockers (exit 3, one ``shutdown_blocked`` evidence row per
  distinct answer) while any V1 event lacks its terminal result, any V1 claim
  or SchedulerLease is live, or any V1 provider call lacks durable proof of
  its outcome (``prepared``, ``sending``, ``ambiguous``);
- once nothing remains, records the first zero inventory as one
  ``v1_drain_inventory`` evidence row. A rerun returns it (``already``).

Nothing here relabels uncertainty: an ambiguous V1 call keeps the service in
``halting_v1`` until ``cutover reconcile`` appends its exact evidence.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from connectors.models import AccountServingGate
from nexusflow.kernel.scope import OrgScope

from .halt import halt_budget_blockers
from .models import CutoverEvidence
from .services import CutoverRefused, _evidence
from .v1_shutdown import (
    ShutdownBlocked,
    attempt_certificate,
    inventory_blockers,
    inventory_digest,
    record_blocked,
    v1_inventory,
)


@dataclass
class DrainReport:
    """``inventory_digest``: the digest of the recorded zero inventory; ``already``: it was recorded before."""

    attempt_key: str
    evidence_id: int
    inventory_digest: str
    already: bool = False


def cutover_drain(*, org: OrgScope, attempt_key: str) -> DrainReport:
    """Check that V1 finished its accepted work and record the first zero inventory of ``org``.

    Args:
        attempt_key: the attempt ``cutover halt-v1`` halted.

    Returns:
        :class:`DrainReport`.

    Raises:
        InvalidIdentity: ``attempt_key`` is not a canonical key.
        CertificateMissing: the attempt has no readiness certificate.
        CutoverRefused: the gates are not ``halting_v1`` for this attempt (or past it without a drain).
        ShutdownBlocked: V1 work, a live lease or an unresolved V1 call remains (exit 3; rerun later); over the
            certified barrier-closure and drain budget it also carries ``cutover_budget_exceeded`` (abort with
            ``cutover abort-halt``: seed 003 "Operational liveness and maintenance admission", S003-RP-36).

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (step 2); proof S003-RP-41.
    """
    attempt_key, _ = attempt_certificate(org, attempt_key)
    existing = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                              kind="v1_drain_inventory").first()
    if existing is not None:
        return DrainReport(attempt_key, int(existing.pk), existing.payload["inventory_digest"], already=True)
    states = set(AccountServingGate.objects.filter(org_id=org.org_id).values_list("state", flat=True))
    remeasure = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                               kind="halt_remeasure").first()
    halted = remeasure is not None and not remeasure.payload["blockers"]
    if states != {"halting_v1"} or not halted:
        raise CutoverRefused(f"drain needs every gate halting_v1 under attempt {attempt_key} (run cutover "
                             f"halt-v1 first); gates are {', '.join(sorted(states)) or 'none'}")
    inventory = v1_inventory(org)
    blockers = inventory_blockers(inventory)
    if blockers:  # over budget: the operator's go/no-go, never a reason to treat the open work as done
        blockers += halt_budget_blockers(org=org, attempt_key=attempt_key)
        record_blocked(org, attempt_key, "drain", blockers)
        raise ShutdownBlocked("drain", blockers)
    digest = inventory_digest(inventory)
    with transaction.atomic(durable=True):
        proof = _evidence(org, attempt_key, "v1_drain_inventory", "", {"inventory": inventory,
                                                                        "inventory_digest": digest})
    return DrainReport(attempt_key, int(proof["evidence_id"]), digest)
