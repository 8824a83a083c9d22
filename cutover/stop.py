"""``cutover stop``: deny V1 provider egress, terminate the V1 process generations, gates -> ``v1_stopped``.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 3; proof
S003-RP-41 (no egress-capable old generation). Once ``cutover drain`` reports
no V1 work (no open event, live lease or parked ambiguous call; a V1 call still
``prepared`` or ``sending`` is interrupted here and reconciled afterwards):

1. Isolation: one transaction locks the org's V1 egress mutex (the
   ``root_outbound`` barrier row, ``FOR UPDATE``) and inserts one
   :class:`~connectors.v1.models.V1EgressDenial` through the highest V1
   process generation. From its commit on, every V1 pre-I/O row or marker of
   a denied generation (or of a process that started none) is refused before
   I/O (:mod:`connectors.v1.egress`); a marker that committed first is an
   interrupted call ``cutover reconcile`` resolves. ``egress_isolation``
   evidence is the receipt.
2. Termination: every V1 process generation must be proven gone (pid absent or
   reused on its host). A live local process of the generation is sent
   SIGTERM (its worker loop exits cleanly) and this phase waits, up to
   ``wait_seconds``, for that proof; a process on another host, or one still
   alive, is a ``v1_generation_live`` blocker (exit 3; terminate it and rerun).
   Each proof is recorded once in the worker registry; ``process_termination``
   evidence is the receipt.
3. One transaction locks every gate and moves it ``halting_v1 -> v1_stopped``,
   binding both receipts and the attempt.

Termination is deployment-wide, as V1 ignores the per-account gates: every
recorded V1 process generation must be gone, whichever org it served. The
denial is the org's; a generation started after it (a later cold abort's new
generation) is not denied, and ``cutover certify`` refuses while one exists.

Resumable: each step is idempotent and a rerun continues where a crash left it.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass

from django.db import transaction

from connectors.models import AccountServingGate, V1EgressDenial
from connectors.serving.gates import gate_transition
from connectors.store import AccountServingGateStore
from connectors.v1.generations import v1_release
from connectors.v1.store import v1_egress_mutex_lock
from connectors.workers import holder_termination_proof, record_holder_termination
from nexusflow.kernel import failpoints
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

from . import reasons, selectors
from .halt import _check_certificate
from .models import CutoverEvidence
from .services import CutoverRefused, _evidence
from .store import certificate_lock
from .v1_shutdown import (
    ShutdownBlocked,
    attempt_certificate,
    blocker,
    inventory_blockers,
    record_blocked,
    v1_inventory,
)

FP_AFTER_ISOLATION = failpoints.declare("cutover.stop.after_isolation")
#: Default seconds ``cutover stop`` waits for a signalled V1 process to be proven gone before reporting it.
DEFAULT_WAIT_SECONDS = 30.0


@dataclass
class StopReport:
    """``generations``: V1 process generation ids proven terminated; ``denial_id``: the V1EgressDenial."""

    attempt_key: str
    gates: list[str]
    generations: list[int]
    denial_id: int
    termination_digest: str
    isolation_digest: str
    already: bool = False


def _isolate(org: OrgScope, attempt_key: str) -> dict:
    """Insert the attempt's V1EgressDenial under the egress mutex (once) and return its ``egress_isolation`` proof."""
    with transaction.atomic(durable=True):
        v1_egress_mutex_lock(org.org_id)
        denial = V1EgressDenial.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
        if denial is None:
            through = max((g["id"] for g in selectors.v1_generations()), default=0)
            denial = insert(V1EgressDenial, org_id=org.org_id, attempt_key=attempt_key, through_generation=through,
                            release=v1_release())
        return _evidence(org, attempt_key, "egress_isolation", "", {
            "denial_id": int(denial.pk), "through_generation": denial.through_generation,
            "release": denial.release, "scope": "v1 provider egress of the org, every generation up to the bound"})


def _terminate(generations: list[dict], wait_seconds: float) -> tuple[dict[int, dict], list[dict]]:
    """Prove every generation gone, signalling live local ones; return ``({id: proof}, blockers)``."""
    here, me = socket.gethostname(), os.getpid()
    proofs: dict[int, dict] = {}
    pending: dict[int, dict] = {}
    for generation in generations:
        if generation["terminated"]:
            proofs[generation["id"]] = generation["termination_proof"]
            continue
        if not generation["registered"]:
            pending[generation["id"]] = generation
            continue
        proof = holder_termination_proof(generation["worker_id"])
        if proof is not None:
            proofs[generation["id"]] = record_holder_termination(generation["worker_id"], proof)
            continue
        if generation["host"] == here and generation["pid"] != me:
            try:  # the pid is this generation's own process: holder_termination_proof just checked its start ticks
                os.kill(generation["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        pending[generation["id"]] = generation
    deadline = time.monotonic() + wait_seconds
    while pending:
        for gid, generation in list(pending.items()):
            proof = holder_termination_proof(generation["worker_id"]) if generation["registered"] else None
            if proof is not None:
                proofs[gid] = record_holder_termination(generation["worker_id"], proof)
                del pending[gid]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.1)  # polling for a proven state (the pid gone), never deciding by elapsed time
    blockers = []
    for gid, generation in sorted(pending.items()):
        why = ("has no worker registry row, so its end cannot be proven" if not generation["registered"]
               else f"pid {generation['pid']} on {generation['host']} is still running"
               + ("" if generation["host"] == here else " (another host: terminate it there, then rerun)"))
        blockers.append(blocker(reasons.V1_GENERATION_LIVE, f"v1_process_generation.{gid}",
                                f"{generation['worker_id']} {why}"))
    return proofs, blockers


def cutover_stop(*, org: OrgScope, attempt_key: str, wait_seconds: float = DEFAULT_WAIT_SECONDS) -> StopReport:
    """Isolate and terminate every V1 process generation, then move every gate ``halting_v1 -> v1_stopped``.

    Args:
        attempt_key: the attempt ``cutover halt-v1`` halted.
        wait_seconds: how long to wait for signalled local V1 processes to be proven gone (>= 0).

    Returns:
        :class:`StopReport`; ``already`` when every gate was already ``v1_stopped`` (or past it).

    Raises:
        InvalidIdentity / CertificateMissing: see :func:`cutover.v1_shutdown.attempt_certificate`.
        CutoverRefused: the attempt did not halt V1, or the gates are not ``halting_v1``.
        CertificateMismatch: a current account, configuration generation or gate is outside the certificate's
            frozen exhaustive set (checked before isolation and again under the gate locks; nothing moves).
        ShutdownBlocked: V1 work, a live lease or a parked ambiguous call remains, or a generation is not proven
            gone (exit 3). Calls ``prepared``/``sending`` at isolation are listed as interrupted, not blockers.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (step 3); proof S003-RP-41.
    """
    attempt_key, readiness = attempt_certificate(org, attempt_key)
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    states = {g.state for g in gates}
    evidence = {row.kind: row for row in CutoverEvidence.objects.filter(
        org_id=org.org_id, attempt_key=attempt_key, kind__in=("process_termination", "egress_isolation"))}
    if gates and states <= {"v1_stopped", "v1_drained"} and len(evidence) == 2:
        denial = V1EgressDenial.objects.get(org_id=org.org_id, attempt_key=attempt_key)
        return StopReport(attempt_key, [g.account_key for g in gates],
                          sorted(int(k) for k in evidence["process_termination"].payload["generations"]),
                          int(denial.pk), evidence["process_termination"].digest,
                          evidence["egress_isolation"].digest, already=True)
    remeasure = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                               kind="halt_remeasure").first()
    if remeasure is None or remeasure.payload["blockers"]:
        raise CutoverRefused(f"attempt {attempt_key} did not halt V1; run cutover halt-v1 first")
    if not gates or not states <= {"halting_v1", "v1_stopped"}:
        raise CutoverRefused(f"stop needs every gate halting_v1; gates are {', '.join(sorted(states)) or 'none'}")

    _check_certificate(org, readiness, gates)  # an account or gate outside the frozen set: nothing isolated yet
    if "egress_isolation" not in evidence:
        # V1 work and leases must be gone, and no parked ambiguity may leave halting_v1. A call still
        # prepared or sending is frozen by the isolation and termination below, and reconciled after.
        inventory = v1_inventory(org)
        inventory["unresolved_calls"] = [c for c in inventory["unresolved_calls"] if c["state"] == "ambiguous"]
        blockers = inventory_blockers(inventory)
        if blockers:
            record_blocked(org, attempt_key, "stop", blockers)
            raise ShutdownBlocked("stop", blockers)
    isolation = _isolate(org, attempt_key)
    failpoints.hit(FP_AFTER_ISOLATION)

    generations = selectors.v1_generations()
    proofs, blockers = _terminate(generations, max(0.0, wait_seconds))
    if blockers:
        record_blocked(org, attempt_key, "stop", blockers)
        raise ShutdownBlocked("stop", blockers)
    interrupted = selectors.v1_unresolved_calls(org_id=org.org_id, states=("prepared", "sending"))
    with transaction.atomic(durable=True):
        termination = _evidence(org, attempt_key, "process_termination", "", {
            "interrupted_calls": interrupted,
            "generations": {str(gid): {"worker_id": g["worker_id"], "release": g["release"], "proof": proofs[g["id"]]}
                            for g in generations for gid in [g["id"]]},
            "isolation_digest": isolation["digest"]})

    with transaction.atomic(durable=True):
        locked = AccountServingGateStore.lock_all(org.org_id)
        _check_certificate(org, certificate_lock(org.org_id, attempt_key), locked)
        for gate in locked:
            if gate.state == "halting_v1":
                gate_transition(gate=gate, dst="v1_stopped", reason_code=reasons.CUTOVER_IN_PROGRESS, evidence={
                    "attempt_key": attempt_key, "process_termination": termination, "egress_isolation": isolation})
    denial = V1EgressDenial.objects.get(org_id=org.org_id, attempt_key=attempt_key)
    return StopReport(attempt_key, sorted(g.account_key for g in locked), sorted(proofs), int(denial.pk),
                      termination["digest"], isolation["digest"])
