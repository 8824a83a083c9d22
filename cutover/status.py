"""``cutover status``: where an org's V1 -> V2 cutover stands, and the next command.

Seed 003 "Operational liveness and maintenance admission": every halt names
its reason code, evidence, owner and remediation; this report gathers them
for one org from the gates, the readiness certificates and the preflight
refusals. Read-only.
"""
from __future__ import annotations

import json

from connectors.models import AccountServingGate, ConnectorServiceConfigurationGeneration, V1MaintenanceBarrier
from connectors.serving.publication import open_barrier_set
from nexusflow.kernel.reasons import REASONS, load_all_reasons
from nexusflow.kernel.scope import OrgScope

from . import selectors
from .halt import SPENT_KINDS
from .models import CutoverDecision, CutoverEvidence, RestoreAttempt, V1RestorePoint, V1ShutdownCertificate

#: Gate states in procedure order (seed 003 "State machines", AccountServingGate).
GATE_ORDER = ("v1_serving", "halting_v1", "v1_stopped", "v1_drained", "v2_validating", "v2_serving", "v2_halted")


def _next_command(org_id: str, phase: str, certificate, refusal, open_v1: dict) -> str:
    if phase == "unconfigured":
        return f"manage.py connector_config_apply --org {org_id} FILE"
    if phase == "v1_serving":
        if certificate is None:
            detail = " (fix the blockers first, under a new attempt key)" if refusal is not None else ""
            return f"manage.py cutover preflight --org {org_id} --attempt KEY --plan FILE{detail}"
        spent = CutoverEvidence.objects.filter(org_id=org_id, attempt_key=certificate.attempt_key,
                                               kind__in=tuple(SPENT_KINDS)).values_list("kind", flat=True).first()
        if spent is not None:
            return (f"manage.py cutover preflight --org {org_id} --attempt NEW_KEY --plan FILE (attempt "
                    f"{certificate.attempt_key} is spent: {spent}; V1 serves)")
        return f"manage.py cutover halt-v1 --org {org_id} --attempt {certificate.attempt_key}"
    attempt = "KEY" if certificate is None else certificate.attempt_key
    if phase == "halting_v1":
        if CutoverEvidence.objects.filter(org_id=org_id, attempt_key=attempt, kind="v1_drain_inventory").exists():
            return f"manage.py cutover stop --org {org_id} --attempt {attempt}"
        in_flight = [c["id"] for c in open_v1["unresolved_calls"] if c["state"] in ("prepared", "sending")]
        if in_flight and not open_v1["open_events"] and not open_v1["live_leases"] \
                and len(in_flight) == len(open_v1["unresolved_calls"]):
            return (f"manage.py cutover stop --org {org_id} --attempt {attempt} (only V1 calls "
                    f"{', '.join(map(str, in_flight[:10]))} are prepared or sending: the stop interrupts them, "
                    "cutover reconcile resolves them after)")
        return (f"manage.py cutover drain --org {org_id} --attempt {attempt} (run_workers --role v1 finishes the "
                "accepted work; rerun until it reports no blocker)")
    if phase == "v1_stopped":
        if open_v1["unresolved_calls"]:
            ids = ", ".join(str(c["id"]) for c in open_v1["unresolved_calls"][:10])
            return (f"manage.py cutover reconcile --org {org_id} --attempt {attempt} --call ID --outcome "
                    f"remote_finalized|no_effect --evidence TEXT (interrupted V1 calls: {ids})")
        return f"manage.py cutover certify --org {org_id} --attempt {attempt}"
    if phase in ("v1_drained", "v2_validating"):
        restoring = RestoreAttempt.objects.filter(org_id=org_id, attempt_key=attempt).first()
        decision = CutoverDecision.objects.filter(org_id=org_id, attempt_key=attempt).first()
        if (restoring is not None and restoring.state != "completed") or \
                (decision is not None and decision.state in ("restoring_v1", "v1_restored")):
            return (f"manage.py cutover restore --org {org_id} --attempt {attempt} (a RestoreAttempt won the "
                    "decision: rerun it to finish the full V1 restore)")
    if phase == "v1_drained":
        if V1RestorePoint.objects.filter(org_id=org_id, attempt_key=attempt).exists():
            return (f"manage.py cutover validate --org {org_id} --attempt {attempt} (verify the V2 candidate with "
                    "every production path disabled)")
        return (f"manage.py cutover restore-point --org {org_id} --attempt {attempt} [--backup-dir DIR] (capture and "
                "rehearse the full-database V1 restore point)")
    if phase == "v2_validating":
        return (f"manage.py cutover activate --org {org_id} --attempt {attempt} (hold the publication barriers "
                "and activate V2; reruns resume)")
    if phase == "v2_serving":
        decision = CutoverDecision.objects.filter(org_id=org_id, attempt_key=attempt).first()
        if decision is not None and (decision.state != "v2_committed" or open_barrier_set(org_id=org_id)):
            return (f"manage.py cutover activate --org {org_id} --attempt {attempt} (activation committed locally: "
                    "finish the readback, v2_committed and the barrier release)")
        live = live_v2_workers()
        if not live:
            return ("manage.py run_workers --role all (start V2: the gates serve V2, but no live V2 worker process "
                    "is registered)")
        return f"none: V2 serves every account ({len(live)} live V2 worker process(es))"
    return f"manage.py cutover greenfield --org {org_id} (resumes a greenfield walk)"


def live_v2_workers() -> list[str]:
    """``worker_id`` of every registered V2 worker process not proven gone (a V1 generation is not one)."""
    from connectors.models import WorkerProcess
    from connectors.workers import holder_termination_proof

    rows = (WorkerProcess.objects.filter(terminated_at__isnull=True).exclude(role__startswith="v1")
            .exclude(role__contains="+v1").order_by("id").values_list("worker_id", flat=True))
    return [worker_id for worker_id in rows if holder_termination_proof(worker_id) is None]


def cutover_status(*, org: OrgScope) -> dict:
    """Report the cutover of ``org``.

    Returns:
        ``{"org_id", "phase": str (the common gate state, "mixed", or "unconfigured"),
        "configuration": {"generation", "digest"} | None,
        "gates": {state: count} (every state with a gate, in procedure order),
        "barriers": {kind: "open" | "closed"} (the V1 maintenance barriers; empty before v1-install),
        "certificate": {"attempt_key", "digest", "epoch_id", "created_at"} | None (latest, current configuration),
        "budgets": {phase: {"budget_seconds", "projected_seconds", "used_seconds"}} (from that certificate;
        ``used_seconds`` is null until the phase has run; ``owner_barrier_closure`` is measured by
        ``halt-v1`` on the database clock, reporting only: elapsed time never decides safety),
        "blockers": [{"reason_code", "subject", "detail", "owner", "remediations", "alert_after_seconds"}],
        "decision": {"attempt_key", "state"} | None,
        "publication_barriers": {"id", "attempt_key", "state", "holder_fence", "holder"} | None (the org's
        ServingPublicationBarrierSet that is not released),
        "shutdown_certificate": {"attempt_key", "digest"} | None (the latest V1ShutdownCertificate),
        "restore_point": {"attempt_key", "manifest_digest", "certificate_digest", "backup_path", "created_at"}
        | None (the latest V1RestorePoint, control database),
        "restore": {"attempt_key", "state", "holder_fence", "holder", "refusal"} | None (the latest RestoreAttempt,
        control database),
        "next_command": str}``. In ``halting_v1`` and ``v1_stopped`` the blockers include the live V1
        inventory (open work, live leases, unresolved V1 calls) that drain, stop and certify would report.

    Seed 003 "Operational liveness and maintenance admission".
    """
    load_all_reasons()
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    configuration = (ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id)
                     .order_by("-generation").first())
    counts: dict[str, int] = {}
    for gate in gates:
        counts[gate.state] = counts.get(gate.state, 0) + 1
    states = sorted(counts, key=lambda s: GATE_ORDER.index(s) if s in GATE_ORDER else len(GATE_ORDER))
    phase = "unconfigured" if not gates else states[0] if len(states) == 1 else "mixed"

    certificate = None
    if configuration is not None:
        certificate = selectors.readiness_certificates(org_id=org.org_id).filter(
            configuration_id=configuration.pk).first()
    refusal = selectors.preflight_refusals(org_id=org.org_id).first()
    if refusal is not None and certificate is not None and certificate.created_at >= refusal.created_at:
        refusal = None

    blockers = []
    for gate in gates:
        if gate.reason_code:
            blockers.append({"reason_code": gate.reason_code, "subject": gate.account_key,
                             "detail": f"gate {gate.state}"})
    if refusal is not None:
        blockers += [{**b, "subject": f"{refusal.payload['attempt_key']}: {b['subject']}"}
                     for b in refusal.payload.get("blockers", [])]
    open_v1 = {"open_events": {}, "unresolved_calls": [], "live_leases": []}
    if phase in ("halting_v1", "v1_stopped"):
        from .v1_shutdown import inventory_blockers, v1_inventory

        open_v1 = v1_inventory(org)
        blockers += inventory_blockers(open_v1)
    for blocker in blockers:
        reason = REASONS.get(blocker["reason_code"])
        if reason is not None:
            blocker.update({"owner": reason.owner, "remediations": list(reason.remediations),
                            "alert_after_seconds": reason.alert_after_seconds})

    budgets = {}
    if certificate is not None:
        document = json.loads(bytes(certificate.document))
        budgets = {phase_name: {"budget_seconds": p["budget_seconds"], "projected_seconds": p["projected_seconds"],
                                "used_seconds": None}
                   for phase_name, p in document["projections"].items()}
    remeasure = None if certificate is None else CutoverEvidence.objects.filter(
        org_id=org.org_id, attempt_key=certificate.attempt_key, kind="halt_remeasure").first()
    for phase_name, seconds in ({} if remeasure is None else remeasure.payload.get("used_seconds", {})).items():
        if phase_name in budgets:
            budgets[phase_name]["used_seconds"] = seconds
    barriers = {b.kind: b.state for b in V1MaintenanceBarrier.objects.filter(org_id=org.org_id).order_by("kind")}
    decision = CutoverDecision.objects.filter(org_id=org.org_id).order_by("-id").first()
    shutdown = V1ShutdownCertificate.objects.filter(org_id=org.org_id).order_by("-id").first()
    restore_point = V1RestorePoint.objects.filter(org_id=org.org_id).order_by("-id").first()
    barrier_set = open_barrier_set(org_id=org.org_id)
    restoring = RestoreAttempt.objects.filter(org_id=org.org_id).order_by("-id").first()
    return {
        "org_id": org.org_id, "phase": phase,
        "configuration": None if configuration is None else {"generation": configuration.generation,
                                                             "digest": configuration.digest},
        "gates": {s: counts[s] for s in states},
        "certificate": None if certificate is None else {
            "attempt_key": certificate.attempt_key, "digest": certificate.digest,
            "epoch_id": int(certificate.epoch_id), "created_at": certificate.created_at.isoformat()},
        "barriers": barriers, "budgets": budgets, "blockers": blockers,
        "decision": None if decision is None else {"attempt_key": decision.attempt_key, "state": decision.state},
        "publication_barriers": None if barrier_set is None else {
            "id": int(barrier_set.pk), "attempt_key": barrier_set.attempt_key, "state": barrier_set.state,
            "holder_fence": barrier_set.holder_fence, "holder": barrier_set.holder},
        "shutdown_certificate": None if shutdown is None else {"attempt_key": shutdown.attempt_key,
                                                               "digest": shutdown.digest},
        "restore_point": None if restore_point is None else {
            "attempt_key": restore_point.attempt_key, "manifest_digest": restore_point.manifest_digest,
            "certificate_digest": restore_point.certificate_digest, "backup_path": restore_point.backup_path,
            "created_at": restore_point.created_at.isoformat()},
        "restore": None if restoring is None else {
            "attempt_key": restoring.attempt_key, "state": restoring.state, "holder_fence": restoring.holder_fence,
            "holder": restoring.holder, "refusal": (restoring.evidence or {}).get("refusal")},
        "next_command": _next_command(org.org_id, phase, certificate, refusal, open_v1),
    }
