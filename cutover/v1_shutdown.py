"""What the V1 shutdown phases share: the live V1 inventory, its blockers, the attempt checks.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", steps 2-5, and
"Operational liveness and maintenance admission". ``cutover drain`` (step 2),
``stop`` (step 3), ``reconcile`` and ``certify`` (steps 4-5) each read the same
inventory; a blocker is a ``{"reason_code", "subject", "detail"}`` with a
registered code (``cutover/reasons.py``). A timeout, an expired lease or a
nominally terminal label never removes a blocker: only the owner's terminal
fact (or exact reconciliation evidence) does.
"""
from __future__ import annotations

from django.db import transaction

from connectors.workers import holder_termination_proof
from nexusflow.kernel import canonical_json
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from . import reasons, selectors
from .halt import CertificateMissing
from .models import CutoverEvidence, CutoverReadinessCertificate
from .services import _evidence

#: V1 event states a V1 worker still has to move on (accepted work without its terminal result).
OPEN_EVENT_STATES = ("pending", "running", "handed_off")
#: V1 provider-call states without durable proof of a remote outcome: ``prepared`` may still be sent,
#: ``sending`` may have reached the provider, ``ambiguous`` did without a proven answer.
UNRESOLVED_CALL_STATES = ("prepared", "sending", "ambiguous")


class ShutdownBlocked(NexusError):
    """A V1 shutdown phase found blockers; nothing moved (exit 3). ``blockers``: ``[{"reason_code", ...}]``."""

    code = "v1_shutdown_blocked"

    def __init__(self, phase: str, blockers: list[dict]):
        self.phase = phase
        self.blockers = blockers
        codes = sorted({b["reason_code"] for b in blockers})
        super().__init__(f"{phase} is blocked by {len(blockers)} blocker(s): {', '.join(codes)}")


def blocker(code: str, subject: str, detail: str) -> dict:
    return {"reason_code": code, "subject": subject, "detail": detail}


def attempt_certificate(org: OrgScope, attempt_key: str) -> tuple[str, CutoverReadinessCertificate]:
    """Validate ``attempt_key`` and return it with the attempt's readiness certificate.

    Raises:
        InvalidIdentity: not a canonical key.
        CertificateMissing: the attempt has no readiness certificate.
    """
    attempt_key = validate_key(attempt_key, field="attempt_key", max_length=80)
    certificate = CutoverReadinessCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if certificate is None:
        raise CertificateMissing(f"attempt {attempt_key} has no readiness certificate; run cutover preflight")
    return attempt_key, certificate


def gate_evidence_attempt(org: OrgScope, kind: str) -> str | None:
    """The attempt key of the org's latest ``kind`` evidence row, or ``None``."""
    row = CutoverEvidence.objects.filter(org_id=org.org_id, kind=kind).order_by("-id").first()
    return None if row is None else row.attempt_key


def _lease_is_live(lease, now) -> bool:
    """A held SchedulerLease is live until it expired *and* nothing runs under it, or its holder is proven gone."""
    return lease.expires_at is not None and lease.expires_at > now and holder_termination_proof(lease.holder) is None


def v1_inventory(org: OrgScope) -> dict:
    """Take the live V1 inventory of ``org`` (no locks; the caller decides which locks make it authoritative).

    Returns:
        ``{"open_events": {state: [id, ...]}, "unresolved_calls": [{"id", "state", "call_site", "kind",
        "subject"}], "live_leases": [{"name", "holder", "fence_token"}]}``; empty collections when drained.

    A running event is a live claim (its lease) whether or not its lease expired: only its owner's
    recovery or completion moves it. A held SchedulerLease is live while it has not expired and its
    holder is not proven gone.
    """
    now = db_now()
    return {
        "open_events": selectors.v1_open_events(org_id=org.org_id, states=OPEN_EVENT_STATES),
        "unresolved_calls": selectors.v1_unresolved_calls(org_id=org.org_id, states=UNRESOLVED_CALL_STATES),
        "live_leases": [{"name": lease.name, "holder": lease.holder, "fence_token": lease.fence_token}
                        for lease in selectors.v1_held_scheduler_leases(org_id=org.org_id)
                        if _lease_is_live(lease, now)],
    }


def inventory_blockers(inventory: dict) -> list[dict]:
    """The blockers of a V1 inventory (see :func:`v1_inventory`); empty when V1 has nothing left to move."""
    out = []
    for state, ids in sorted(inventory["open_events"].items()):
        shown = ", ".join(str(i) for i in ids[:10]) + (" ..." if len(ids) > 10 else "")
        out.append(blocker(reasons.V1_WORK_OPEN, f"v1_events.{state}",
                           f"{len(ids)} accepted V1 event(s) without a terminal result: {shown}"))
    for call in inventory["unresolved_calls"]:
        detail = {"prepared": "a pre-I/O row that may still be sent",
                  "sending": "the pre-I/O marker committed: I/O may have started, no answer recorded",
                  "ambiguous": "I/O happened without a proven answer"}[call["state"]]
        out.append(blocker(reasons.V1_EFFECT_UNRESOLVED, f"v1_provider_call.{call['id']}",
                           f"{call['call_site']} ({call['state']}): {detail}; needs remote-finalized or "
                           "proved-no-effect evidence"))
    for lease in inventory["live_leases"]:
        out.append(blocker(reasons.V1_LEASE_LIVE, f"v1_scheduler_lease.{lease['name']}",
                           f"held by {lease['holder']} (fence {lease['fence_token']}), not expired, holder not "
                           "proven gone"))
    return out


def inventory_digest(inventory: dict) -> str:
    """The v2 digest of an inventory's canonical JSON."""
    return digest_v2("cutover.v1-inventory", [("inventory", canonical_json.dumps(inventory))]).hexdigest


def record_blocked(org: OrgScope, attempt_key: str, phase: str, blockers: list[dict]) -> None:
    """Record one ``shutdown_blocked`` evidence row per distinct ``(phase, blockers)`` (its own transaction)."""
    payload = {"attempt_key": attempt_key, "phase": phase, "blockers": blockers}
    key = digest_v2("cutover.shutdown-blocked", [("payload", canonical_json.dumps(payload))]).hexdigest
    with transaction.atomic(durable=True):
        _evidence(org, attempt_key, "shutdown_blocked", key, payload)
