"""``cutover restore``: the full V1 restore of a cutover attempt, journaled outside the restored database.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (the full restore), "Compressed durable
model" (RestoreAttempt, V1RestorePoint, CutoverDecision) and "Transaction and crash rules"; proofs
S003-RP-44 (the restore half) and S003-RP-45. The steps, each resumable (a coordinator killed at any
boundary, :data:`BOUNDARIES`, is resumed by rerunning the command):

1. **decide**: the attempt's V1RestorePoint (control database) and its files are checked (every dump
   present, byte-equal to its SHA-256, complete), then the RestoreAttempt wins
   ``CutoverDecision rollback_open -> restoring_v1`` (:func:`cutover.decision.begin_restore`): from
   then on activation can never commit for the attempt. A decision activation already won refuses the
   restore (``cutover_decision_lost``); an epoch that ever became active anywhere in the deployment, or
   a gate serving V2, refuses it too (``restore_forward_only``): the restore rewrites the whole main
   database, and after a first activation only V2 halt and forward recovery remain (S003-RP-50);
2. **isolate**: a publication barrier set a crashed ``cutover activate`` left open for the attempt is
   released (``restore_won``); every gate of the org is offline for both runtimes (``v1_drained`` or ``v2_validating``;
   V1 was stopped, its egress denied, its generations terminated by ``cutover stop``, and a V2 process
   writes only under a ``v2_serving`` gate of an ``active`` epoch), and nothing served since the
   V1ShutdownCertificate: no V2 Receipt, Event, Execution or RemoteEffect, no activated epoch
   (``restore_v2_served`` otherwise). The proof is the RestoreAttempt's ``evidence.isolation``
   (state ``isolated``, control database);
3. **load** (``loading``): the main database is rewritten from the point's main dump with the
   ``mariadb`` client: tables the dump does not hold (a candidate's schema) are dropped first, then the
   dump recreates and refills every table. The control database is never loaded: it holds the decision
   and this journal. A rerun in ``loading`` loads again from the start;
4. **verify** (``verified``): every table's row count and content digest, the applied migrations and
   the org's V1 facts (stream cursors, transport idempotency keys, events, provider calls, egress
   denials...) are recomputed from the live database and compared with the point's manifest, and the
   restored gates must be ``v1_drained`` under the point's V1ShutdownCertificate (``restore_verification_failed``);
5. **v1_restored**: :func:`cutover.decision.complete_restore` on the control database;
6. **serve V1** (``completed``): the V1 maintenance barriers reopen and every gate moves
   ``v1_drained -> v1_serving`` with a new fence (evidence ``v1_restored``, binding the point and the
   decision). A new process generation of the exact V1 release may now start (``run_workers --role v1``);
   the terminated generations stay denied (their V1EgressDenial is part of the restored point).

Concurrency: the whole restore runs under one server named lock on the control database (a second
coordinator is refused ``restore_in_progress`` while one runs; a killed one releases it with its
connection), and every journal write compares the coordinator's ``holder_fence``.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connections, transaction
from django_mysql.exceptions import TimeoutError as LockTimeout
from django_mysql.locks import Lock

from connectors.models import AccountServingGate, ServingEpoch
from connectors.serving.gates import gate_transition
from connectors.store import AccountServingGateStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.errors import FenceRejected, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from . import reasons, selectors
from .activate import activation_release_after_restore
from .decision import DecisionLost, begin_restore, complete_restore, decision_of
from .halt import _barriers_move
from .models import CutoverDecision, CutoverEvidence, RestoreAttempt, V1RestorePoint, V1ShutdownCertificate
from .restore_point import (
    Capture,
    _client_args,
    _compare,
    _connect,
    _databases,
    _digest,
    _facts,
    _file_blockers,
)
from .services import _evidence
from .store import RestoreAttemptStore, drop_tables_except
from .v1_shutdown import ShutdownBlocked, blocker, record_blocked

PHASE = "restore"
FP_AFTER_DECISION = failpoints.declare("cutover.restore.after_decision")
FP_AFTER_ISOLATION = failpoints.declare("cutover.restore.after_isolation")
FP_MID_LOAD = failpoints.declare("cutover.restore.mid_load")
FP_AFTER_LOAD = failpoints.declare("cutover.restore.after_load")
FP_AFTER_VERIFY = failpoints.declare("cutover.restore.after_verify")
FP_AFTER_V1_RESTORED = failpoints.declare("cutover.restore.after_v1_restored")
#: Every boundary a killed coordinator can leave behind (proof S003-RP-44, the restore half).
BOUNDARIES = (FP_AFTER_DECISION, FP_AFTER_ISOLATION, FP_MID_LOAD, FP_AFTER_LOAD, FP_AFTER_VERIFY,
              FP_AFTER_V1_RESTORED)
#: Gate states in which neither runtime serves and a restore may run.
OFFLINE_STATES = frozenset({"v1_drained", "v2_validating"})
#: The deployment-wide restore lock (a full restore rewrites the whole main database).
LOCK_NAME = "nexusflow.cutover.restore"


class RestoreRefused(ShutdownBlocked):
    """The restore was refused or could not finish; ``blockers`` say why (exit 3). Nothing V1 was served."""

    code = "restore_refused"


class RestoreInProgress(NexusError):
    """Another coordinator is running a restore of this deployment now (retry once it ends)."""

    code = "restore_in_progress"


@dataclass
class RestoreReport:
    """The completed restore: ``gates`` back in ``v1_serving``; ``seconds`` per phase; ``digests`` verified."""

    attempt_key: str
    restore_attempt_id: int
    restore_point_id: int
    decision: str
    gates: list[str]
    holder_fence: int
    seconds: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)
    already: bool = False


def coordinator_name() -> str:
    """``host:pid`` of this process: the RestoreAttempt's holder (for operators; the fence decides)."""
    return f"{socket.gethostname()}:{os.getpid()}"


# --- the journal (control database) ---------------------------------------------------------------------
def _take_over(org: OrgScope, attempt_key: str, point: V1RestorePoint) -> tuple[RestoreAttempt, int]:
    """Create the attempt's RestoreAttempt (``isolated`` is written later) or take it over: ``(row, fence)``."""
    with transaction.atomic(using="control", durable=True):
        try:
            row = RestoreAttemptStore.lock_where(org.org_id, attempt_key=attempt_key)
        except RestoreAttempt.DoesNotExist:
            row = None
        if row is None:
            row = RestoreAttemptStore.create(org_id=org.org_id, attempt_key=attempt_key, restore_point_id=point.pk,
                                             manifest_digest=point.manifest_digest, state="isolated",
                                             holder=coordinator_name(), holder_fence=1,
                                             evidence={"isolation": None})
            return row, 1
        fence = row.holder_fence + 1
        RestoreAttemptStore.touch(org_id=org.org_id, pk=row.pk, state=row.state, version=row.version,
                                  fences={"holder_fence": row.holder_fence},
                                  set_fields={"holder_fence": fence, "holder": coordinator_name()})
    return RestoreAttempt.objects.get(org_id=org.org_id, pk=row.pk), fence


def _journal(row: RestoreAttempt, fence: int, *, dst: str | None = None, **evidence) -> RestoreAttempt:
    """Move the attempt to ``dst`` (or keep its state) and merge ``evidence``, under ``fence``.

    Raises:
        FenceRejected: a newer coordinator took the attempt over.
    """
    with transaction.atomic(using="control", durable=True):
        locked = RestoreAttemptStore.lock(row.org_id, row.pk)
        if locked.holder_fence != fence:
            raise FenceRejected(f"restore attempt {row.pk} is held under fence {locked.holder_fence}, not {fence}: "
                                "a newer coordinator took it over")
        merged = canonical_json.dumps({**(locked.evidence or {}), **evidence}).decode()
        if dst is None or dst == locked.state:
            RestoreAttemptStore.touch(org_id=row.org_id, pk=row.pk, state=locked.state, version=locked.version,
                                      fences={"holder_fence": fence}, set_fields={"evidence": merged})
        else:
            RestoreAttemptStore.transition(org_id=row.org_id, pk=row.pk, src=locked.state, dst=dst,
                                           version=locked.version, fences={"holder_fence": fence},
                                           set_fields={"evidence": merged})
    return RestoreAttempt.objects.get(org_id=row.org_id, pk=row.pk)


def _refuse(org: OrgScope, blockers: list[dict], row: RestoreAttempt | None = None, fence: int = 0):
    """Raise :class:`RestoreRefused`; the blockers go into the journal (never into the main database)."""
    if row is not None:
        try:
            _journal(row, fence, refusal=blockers)
        except FenceRejected:
            pass
    raise RestoreRefused(PHASE, blockers)


# --- 1. decide -------------------------------------------------------------------------------------------
def _point(org: OrgScope, attempt_key: str) -> tuple[V1RestorePoint, Capture]:
    point = V1RestorePoint.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if point is None:
        _refuse(org, [blocker(reasons.RESTORE_POINT_MISSING, f"attempt.{attempt_key}",
                              "the attempt has no V1RestorePoint (run cutover restore-point after cutover certify)")])
    manifest = json.loads(bytes(point.manifest))
    if _digest("cutover.restore-manifest", manifest) != point.manifest_digest:
        _refuse(org, [blocker(reasons.RESTORE_POINT_BACKUP_INVALID, "manifest",
                              "the recorded manifest does not match its digest")])
    capture = Capture(Path(point.backup_path), manifest)
    if not (capture.path / "manifest.json").is_file() or \
            json.loads((capture.path / "manifest.json").read_bytes()) != manifest:
        _refuse(org, [blocker(reasons.RESTORE_POINT_BACKUP_INVALID, "manifest.json",
                              f"{capture.path} does not hold the recorded manifest")])
    blockers = _file_blockers(capture)
    if blockers:
        _refuse(org, blockers)
    return point, capture


def forward_only_blockers(*, exclude: tuple[str, str] | None = None) -> list[dict]:
    """Why a restored V1 snapshot may no longer replace the main database, deployment-wide (``[]``: it may).

    ``exclude``: the ``(org_id, attempt_key)`` whose own decision the caller checks itself (a restore's
    :func:`cutover.decision.begin_restore` reports an activation that won it as ``cutover_decision_lost``).

    Read from the control database (a CutoverDecision that ever chose ``activating_v2``; it survives any
    restore of the main database) and from the live main database (an epoch ever activated, a gate serving
    or halting V2). Seed 003 "Offline V1 shutdown ..." (after first activation, forward only); S003-RP-50.
    """
    out = []
    for decision in CutoverDecision.objects.filter(state__in=("activating_v2", "v2_committed")).order_by("id"):
        if (decision.org_id, decision.attempt_key) == exclude:
            continue
        out.append(blocker(reasons.RESTORE_FORWARD_ONLY, f"decision.{decision.org_id}.{decision.attempt_key}",
                           f"a ServingEpoch became active ({decision.mode}, {decision.state}): only V2 halt and "
                           "forward recovery remain"))
    activated = selectors.epochs_ever_activated()
    if activated:
        out.append(blocker(reasons.RESTORE_FORWARD_ONLY, "serving_epochs",
                           f"{activated} ServingEpoch(s) of this deployment were activated"))
    serving = AccountServingGate.objects.filter(state__in=("v2_serving", "halting_v2", "v2_halted")).count()
    if serving:
        out.append(blocker(reasons.RESTORE_FORWARD_ONLY, "gates", f"{serving} gate(s) serve or halted V2"))
    return out


def v1_start_refusals() -> list[str]:
    """Why no V1 process generation may start now (``[]``: it may); the V1 runtime's start check.

    - a V1 -> V2 attempt whose activation won its CutoverDecision, read from the ``control`` database so a
      restored or older main database cannot hide it: V1 never runs again (S003-RP-50);
    - an org of the V1 runtime (one with V1 maintenance barriers) with a gate past ``halting_v1``: ``cutover
      stop`` terminated V1, and only ``cutover cold-abort`` or ``cutover restore`` returns its gates to
      ``v1_serving`` and so authorizes a new generation of the exact release (S003-RP-45);
    - an org whose V1 egress is denied while its gates still halt (the stop is under way).

    Registered into :func:`connectors.v1.generations.register_v1_start_check` by ``CutoverConfig.ready()``.
    """
    from connectors.models import V1EgressDenial, V1MaintenanceBarrier

    out = [f"org {d.org_id} attempt {d.attempt_key} activated V2 ({d.state}, control database): V1 never runs "
           "again; only V2 halt and forward recovery remain"
           for d in CutoverDecision.objects.filter(mode="v1_upgrade", state__in=("activating_v2", "v2_committed"))
           .order_by("id")]
    v1_orgs = sorted(set(V1MaintenanceBarrier.objects.values_list("org_id", flat=True)))
    states: dict[str, set[str]] = {}
    for org_id, state in AccountServingGate.objects.filter(org_id__in=v1_orgs).values_list("org_id", "state"):
        states.setdefault(org_id, set()).add(state)
    denied = set(V1EgressDenial.objects.filter(org_id__in=v1_orgs).values_list("org_id", flat=True))
    for org_id in v1_orgs:
        past = sorted(states.get(org_id, set()) - {"v1_serving", "halting_v1"})
        if past:
            out.append(f"org {org_id} has gates {', '.join(past)}: V1 was stopped for a cutover; only cutover "
                       "cold-abort or cutover restore brings it back")
        elif org_id in denied and "halting_v1" in states.get(org_id, set()):
            out.append(f"org {org_id}: cutover stop denied V1 egress; its generations are being terminated")
    return out


# --- 2. isolate ------------------------------------------------------------------------------------------
def _isolation(org: OrgScope, point: V1RestorePoint) -> tuple[dict, list[dict]]:
    """The proof that neither runtime serves the org and nothing was served since the certificate."""
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    out = [blocker(reasons.RESTORE_V2_SERVED, f"gate.{g.account_key}",
                   f"the gate is {g.state}: a restore needs every gate offline (v1_drained or v2_validating)")
           for g in gates if g.state not in OFFLINE_STATES]
    if not gates:
        out.append(blocker(reasons.RESTORE_V2_SERVED, "gates", "the org has no AccountServingGate"))
    certificate = V1ShutdownCertificate.objects.filter(org_id=org.org_id, pk=point.certificate_id).first()
    served = {}
    if certificate is not None:
        served = {fact: n for fact, n in selectors.v2_mutations_since(org_id=org.org_id,
                                                                      since=certificate.created_at).items()
                  if fact != "gates_past_v1_drained"}
    for fact, count in sorted(served.items()):
        out.append(blocker(reasons.RESTORE_V2_SERVED, f"v2.{fact}",
                           f"{count} V2 fact(s) after the V1ShutdownCertificate: V2 served, restoring would lose them"))
    proof = {"gates": {g.account_key: {"state": g.state, "fence": g.fence_token} for g in gates},
             "epochs": {str(e.pk): e.state for e in ServingEpoch.objects.filter(org_id=org.org_id).order_by("id")},
             "served_since_certificate": served, "certificate_digest": point.certificate_digest}
    return proof, out


# --- 3. load ---------------------------------------------------------------------------------------------
def _main() -> dict:
    return next(db for db in _databases() if db["alias"] == "default")


def _load(capture: Capture) -> float:
    """Rewrite the live main database from the capture's main dump; returns the seconds it took."""
    began = time.monotonic()
    entry = next(e for e in capture.manifest["databases"] if e["alias"] == "default")
    db = _main()
    connections["default"].close()  # the load replaces every table under this process's connection
    conn = _connect(db)
    try:
        drop_tables_except(conn.cursor(), schema=db["name"], keep=set(entry["tables"]))
    finally:
        conn.close()
    failpoints.hit(FP_MID_LOAD)
    args, env = _client_args(db)
    with (capture.path / entry["file"]).open("rb") as dump:
        loaded = subprocess.run(["mariadb", "--no-defaults", *args, "--default-character-set=utf8mb4", db["name"]],
                                stdin=dump, capture_output=True, env=env, timeout=None)
    if loaded.returncode != 0:
        raise OSError(f"mariadb exited {loaded.returncode} loading {entry['file']}: "
                      f"{loaded.stderr.decode('utf-8', 'replace')[:500]}")
    return round(time.monotonic() - began, 3)


# --- 4. verify -------------------------------------------------------------------------------------------
def _verify(org: OrgScope, capture: Capture, point: V1RestorePoint) -> tuple[dict, list[dict]]:
    manifest = capture.manifest
    main_manifest = {**manifest, "databases": [e for e in manifest["databases"] if e["alias"] == "default"]}
    facts = _facts(_main(), org_id=org.org_id)
    out = [{**b, "reason_code": reasons.RESTORE_VERIFICATION_FAILED} for b in _compare(main_manifest,
                                                                                         {"default": facts})]
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id))
    if {g.state for g in gates} != {"v1_drained"}:
        out.append(blocker(reasons.RESTORE_VERIFICATION_FAILED, "gates",
                           f"the restored gates are {sorted({g.state for g in gates})}, not v1_drained"))
    if not V1ShutdownCertificate.objects.filter(org_id=org.org_id, pk=point.certificate_id,
                                                digest=point.certificate_digest).exists():
        out.append(blocker(reasons.RESTORE_VERIFICATION_FAILED, "certificate",
                           "the restored database does not hold the point's V1ShutdownCertificate"))
    digests = {"tables": _digest("cutover.restored-tables", facts["tables"]),
               "v1_facts": _digest("cutover.v1-facts", facts["v1_facts"])}
    return digests, out


# --- 6. serve V1 again -----------------------------------------------------------------------------------
def return_to_v1_serving(org: OrgScope, attempt_key: str, *, kind: str, payload: dict) -> list[str]:
    """Reopen the V1 maintenance barriers, then move every ``v1_drained`` gate to ``v1_serving`` (new fence).

    One ``kind`` CutoverEvidence row (``v1_restored`` or ``cold_abort``) binds ``payload`` and the
    barrier fences. Idempotent: gates already ``v1_serving`` stay as they are.

    Returns:
        The org's account keys.
    """
    fences = _barriers_move(org, attempt_key, close=False)
    with transaction.atomic(durable=True):
        gates = AccountServingGateStore.lock_all(org.org_id)
        moving = [g for g in gates if g.state == "v1_drained"]
        if moving:
            proof = _evidence(org, attempt_key, kind, "", {**payload, "barrier_fences": fences})
            for gate in moving:
                gate_transition(gate=gate, dst="v1_serving", evidence=proof)
    return [g.account_key for g in gates]


# --- the procedure ---------------------------------------------------------------------------------------
def cutover_restore(*, org: OrgScope, attempt_key: str) -> RestoreReport:
    """Restore the attempt's V1RestorePoint and return every gate of the org to ``v1_serving`` (resumable).

    Args:
        attempt_key: the attempt whose V1RestorePoint to restore (``cutover restore-point`` recorded it).

    Returns:
        :class:`RestoreReport`; ``already`` when the attempt's restore had completed before.

    Raises:
        InvalidIdentity: ``attempt_key`` is not a canonical key.
        RestoreRefused (exit 3): no restore point (``restore_point_missing``), its files are missing, corrupt
            or partial (``restore_point_backup_invalid``), an epoch was ever activated or a gate serves V2
            (``restore_forward_only``), a gate is not offline or V2 served since the certificate
            (``restore_v2_served``), the restored content differs from the manifest
            (``restore_verification_failed``; a rerun loads again).
        DecisionLost (exit 3): activation won the attempt's CutoverDecision; nothing was restored.
        RestoreInProgress (exit 3): another coordinator is restoring now.
        FenceRejected: a newer coordinator took this attempt over while it ran.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (full restore); proofs S003-RP-44, S003-RP-45.
    """
    attempt_key = validate_key(attempt_key, field="attempt_key", max_length=80)
    try:
        with Lock(LOCK_NAME, acquire_timeout=0, using="control"):
            return _restore(org, attempt_key)
    except LockTimeout:
        raise RestoreInProgress("another cutover restore of this deployment is running; rerun once it ends") from None


def _restore(org: OrgScope, attempt_key: str) -> RestoreReport:
    point, capture = _point(org, attempt_key)
    row = RestoreAttempt.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if row is not None and row.state == "completed":
        gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
        return RestoreReport(attempt_key, int(row.pk), int(point.pk), "v1_restored",
                             [g.account_key for g in gates], row.holder_fence, row.evidence.get("seconds", {}),
                             row.evidence.get("digests", {}), already=True)
    own = decision_of(org.org_id, attempt_key)
    if own is not None and own.state in ("activating_v2", "v2_committed"):
        raise DecisionLost(f"attempt {attempt_key}: activation won the cutover decision ({own.state}); only V2 halt "
                           "and forward recovery remain", state=own.state)
    if row is None or row.state == "isolated":  # nothing loaded yet: the live database must still be restorable
        blockers = forward_only_blockers(exclude=(org.org_id, attempt_key))
        if blockers:
            _refuse(org, blockers, row, row.holder_fence if row is not None else 0)
    decision = begin_restore(org.org_id, attempt_key)  # DecisionLost: activation won; nothing is restored
    failpoints.hit(FP_AFTER_DECISION)
    row, fence = _take_over(org, attempt_key, point)
    seconds = dict(row.evidence.get("seconds") or {})
    if row.state == "isolated":
        began = time.monotonic()
        released = activation_release_after_restore(org=org, attempt_key=attempt_key)  # a crashed activation's set
        proof, blockers = _isolation(org, point)
        if blockers:
            _refuse(org, blockers, row, fence)
        seconds["isolate"] = round(time.monotonic() - began, 3)
        row = _journal(row, fence, isolation={**proof, "decision": decision.state,
                                              "publication_barriers_released": released}, seconds=seconds)
        failpoints.hit(FP_AFTER_ISOLATION)
        row = _journal(row, fence, dst="loading")
    if row.state == "loading":
        try:
            seconds["load"] = _load(capture)
        except (OSError, subprocess.SubprocessError) as exc:
            _refuse(org, [blocker(reasons.RESTORE_VERIFICATION_FAILED, "load", str(exc)[:500])], row, fence)
        failpoints.hit(FP_AFTER_LOAD)
        began = time.monotonic()
        digests, blockers = _verify(org, capture, point)
        if blockers:
            _refuse(org, blockers, row, fence)
        seconds["verify"] = round(time.monotonic() - began, 3)
        row = _journal(row, fence, dst="verified", digests=digests, seconds=seconds)
        failpoints.hit(FP_AFTER_VERIFY)
    decision = complete_restore(org.org_id, attempt_key)
    failpoints.hit(FP_AFTER_V1_RESTORED)
    began = time.monotonic()
    gates = return_to_v1_serving(org, attempt_key, kind="v1_restored", payload={
        "restore_attempt_id": int(row.pk), "restore_point_id": int(point.pk),
        "manifest_digest": point.manifest_digest, "certificate_digest": point.certificate_digest,
        "decision": decision.state, "digests": row.evidence.get("digests", {})})
    seconds["serve_v1"] = round(time.monotonic() - began, 3)
    row = _journal(row, fence, dst="completed", seconds=seconds)
    return RestoreReport(attempt_key, int(row.pk), int(point.pk), decision.state, gates, fence, seconds,
                         row.evidence.get("digests", {}))



# --- the cold abort --------------------------------------------------------------------------------------
@dataclass
class ColdAbortReport:
    """``gates``: the account keys back in ``v1_serving``; ``already`` when the attempt was cold-aborted before."""

    attempt_key: str
    certificate_digest: str
    gates: list[str]
    already: bool = False


def cutover_cold_abort(*, org: OrgScope, attempt_key: str) -> ColdAbortReport:
    """Return a drained, certified V1 service to ``v1_serving`` before any V2 mutation (resumable, idempotent).

    After ``cutover certify`` (every gate ``v1_drained`` under the attempt's V1ShutdownCertificate) and
    before ``cutover validate`` mutates anything for V2, V1's data is exactly what the certificate
    describes, so no restore is needed: the V1 maintenance barriers reopen and every gate moves
    ``v1_drained -> v1_serving`` with a new fence (evidence ``cold_abort``). A new process generation of
    the exact V1 release may then start; the terminated ones stay denied. The attempt is spent.

    Raises:
        InvalidIdentity: ``attempt_key`` is not a canonical key.
        RestoreRefused (exit 3; the blockers are also one ``shutdown_blocked`` evidence row, phase
            ``cold_abort``): the attempt has no V1ShutdownCertificate or a gate is not ``v1_drained``
            (``cold_abort_not_drained``); validation opened the attempt's CutoverDecision or a V2 fact exists
            after the certificate (``cold_abort_v2_mutated``: use ``cutover restore``); a V1 -> V2 activation
            won anywhere (``restore_forward_only``).

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" ("From v1_drained, a cold abort ...");
    proof S003-RP-45.
    """
    attempt_key = validate_key(attempt_key, field="attempt_key", max_length=80)
    certificate = V1ShutdownCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    keys = [g.account_key for g in gates]
    if certificate is None:
        blockers = [blocker(reasons.COLD_ABORT_NOT_DRAINED, f"attempt.{attempt_key}",
                            "the attempt has no V1ShutdownCertificate (run cutover certify)")]
        record_blocked(org, attempt_key, "cold_abort", blockers)
        raise RestoreRefused("cold_abort", blockers)
    if CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key, kind="cold_abort").exists() \
            and {g.state for g in gates} == {"v1_serving"}:
        return ColdAbortReport(attempt_key, certificate.digest, keys, already=True)
    blockers = [blocker(reasons.RESTORE_FORWARD_ONLY, "v1", reason) for reason in v1_start_refusals()
                if "control database" in reason]
    decision = decision_of(org.org_id, attempt_key)
    if decision is not None:
        blockers.append(blocker(reasons.COLD_ABORT_V2_MUTATED, "decision",
                                f"the attempt's cutover decision is {decision.state}: validation or a restore began; "
                                "V1 comes back only through cutover restore"))
    past = sorted({g.state for g in gates} - {"v1_drained"})
    if not gates or past:
        code = reasons.COLD_ABORT_V2_MUTATED if any(s.startswith("v2") for s in past) else \
            reasons.COLD_ABORT_NOT_DRAINED
        blockers.append(blocker(code, "gates", f"every gate must be v1_drained; gates are {past or 'none'}"))
    for fact, count in sorted(selectors.v2_mutations_since(org_id=org.org_id, since=certificate.created_at).items()):
        if fact != "gates_past_v1_drained":
            blockers.append(blocker(reasons.COLD_ABORT_V2_MUTATED, f"v2.{fact}",
                                    f"{count} V2 fact(s) after the V1ShutdownCertificate: use cutover restore"))
    if blockers:
        record_blocked(org, attempt_key, "cold_abort", blockers)
        raise RestoreRefused("cold_abort", blockers)
    return_to_v1_serving(org, attempt_key, kind="cold_abort", payload={"certificate_digest": certificate.digest})
    return ColdAbortReport(attempt_key, certificate.digest, keys)
