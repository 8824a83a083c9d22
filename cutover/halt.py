"""``cutover halt-v1``: close the V1 maintenance barriers, freeze the gate set, remeasure.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 1, and
"Operational liveness and maintenance admission"; proofs S003-RP-35 and
S003-RP-38.

1. Close the ``configuration``, ``ingress`` and ``root_outbound`` barriers of the
   org (:mod:`connectors.v1.barriers`), each in its own transaction: the
   ``FOR UPDATE`` waits for every admission holding the barrier's shared lock,
   so in-flight roots return (and commit) before the close does.
2. One transaction: lock every AccountServingGate, then the exact
   CutoverReadinessCertificate; byte-compare it (digest of its stored bytes,
   the latest configuration generation, the exhaustive gate set) and move every
   gate ``v1_serving -> halting_v1`` (``cutover_in_progress``), each referencing
   one ``maintenance_barrier`` evidence row carrying the certificate digest,
   the barrier fences and the V1 stream cursor positions.
3. Remeasure the V1 workload (no new roots now) and project it with the
   certificate's own plan. A breach (a projection over its budget, an
   ambiguous V1 call, an order-dependent route that lost its typed positions)
   records ``halt_remeasure`` evidence, reopens the barriers and takes every
   gate ``halting_v1 -> v1_serving`` with a new fence (``halt_abort``
   evidence). The attempt is then spent: a new preflight attempt is needed.

V1 work accepted before the close keeps running: the barriers stop new roots
only, and V1 never reads a gate.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from django.db import transaction

from connectors.models import (
    AccountServingGate,
    ConnectorServiceConfigurationGeneration,
    ServingEpoch,
    V1Account,
    V1MaintenanceBarrier,
    V1StreamCursor,
)
from connectors.serving.gates import gate_transition
from connectors.store import AccountServingGateStore
from connectors.v1.barriers import KINDS
from connectors.v1.store import V1MaintenanceBarrierStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from . import reasons
from .models import CutoverEvidence, CutoverReadinessCertificate
from .preflight import _enabled_routes, certificate_digest, measure_v1_workload, project
from .services import CutoverRefused, _evidence
from .store import certificate_lock

FP_AFTER_BARRIERS = failpoints.declare("cutover.halt_v1.after_barriers")


class CertificateMissing(NexusError):
    """No readiness certificate for this attempt: run ``cutover preflight`` first (exit 3)."""

    code = "certificate_missing"


class CertificateMismatch(NexusError):
    """The certificate no longer matches the service (bytes, configuration or gate set): exit 3."""

    code = "certificate_mismatch"


class HaltAborted(NexusError):
    """The remeasure breached the certificate: barriers reopened, gates back to ``v1_serving`` (exit 3).

    ``blockers`` is a list of ``{"reason_code", "subject", "detail"}``.
    """

    code = "halt_aborted"

    def __init__(self, message: str, blockers: list[dict]):
        self.blockers = blockers
        super().__init__(message)


@dataclass
class HaltReport:
    """``gates``: account keys now ``halting_v1``; ``barriers``: kind -> fence token; ``remeasured``: phase ->
    ``{"budget_seconds", "projected_seconds"}``; ``already``: the attempt had already halted."""

    attempt_key: str
    certificate_digest: str
    gates: list[str]
    barriers: dict[str, int]
    remeasured: dict[str, dict] = field(default_factory=dict)
    already: bool = False


def _barriers_move(org: OrgScope, attempt_key: str, *, close: bool) -> dict[str, int]:
    """Close (or reopen) every barrier of ``org``; each in its own transaction. Returns kind -> fence."""
    fences = {}
    src, dst = ("open", "closed") if close else ("closed", "open")
    for kind in sorted(KINDS):
        with transaction.atomic(durable=True):
            barrier = V1MaintenanceBarrierStore.lock_where(org.org_id, kind=kind)
            if barrier.state == dst:
                if close and barrier.attempt_key != attempt_key:
                    raise CutoverRefused(f"the {kind} barrier is closed by attempt {barrier.attempt_key}")
                fences[kind] = barrier.fence_token
                continue
            V1MaintenanceBarrierStore.transition(
                org_id=org.org_id, pk=barrier.pk, src=src, dst=dst, version=barrier.version,
                set_fields={"fence_token": barrier.fence_token + 1, "attempt_key": attempt_key})
            fences[kind] = barrier.fence_token + 1
    return fences


def _breaches(org: OrgScope, document: dict) -> tuple[dict, dict, list[dict]]:
    """Remeasure against the certificate's plan; return ``(measured, projections, blockers)``."""
    configuration = ConnectorServiceConfigurationGeneration.objects.get(org_id=org.org_id,
                                                                        pk=document["configuration"]["id"])
    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=document["epoch"]["id"])
    routes = _enabled_routes(configuration, epoch.document)
    measured = measure_v1_workload(org=org, routes=routes)
    projections = project(plan=document["plan"], measured=measured, gates=len(document["gate_set"]))
    blockers = []
    for phase, p in projections.items():
        if p["projected_seconds"] is None or p["projected_seconds"] > p["budget_seconds"]:
            blockers.append({"reason_code": reasons.CUTOVER_BUDGET_EXCEEDED, "subject": phase,
                             "detail": f"remeasured {p['projected_seconds']}s exceeds the certified budget of "
                                       f"{p['budget_seconds']}s ({p['basis']})"})
    if measured["ambiguous_provider_calls"]:
        blockers.append({"reason_code": reasons.V1_EFFECT_UNRESOLVED, "subject": "v1_provider_calls",
                         "detail": f"{measured['ambiguous_provider_calls']} ambiguous V1 call(s)"})
    for route in document["routes"]:
        name = f"{route['account_key']}/{route['route_key']}"
        if route["disposition"] == "v1_high_water" and measured["unpositioned_events"].get(name, 0):
            blockers.append({"reason_code": reasons.ROUTE_MIGRATION_UNSUPPORTED, "subject": name,
                             "detail": "V1 events without a typed source position arrived after preflight"})
    return measured, projections, blockers


def cutover_halt_v1(*, org: OrgScope, attempt_key: str) -> HaltReport:
    """Close the V1 maintenance barriers of ``org`` and move every gate to ``halting_v1`` under one certificate.

    Resumable: a rerun after a crash closes what is still open (a barrier closed by
    this attempt is kept), halts what is still ``v1_serving`` and remeasures.

    Args:
        attempt_key: the attempt whose CutoverReadinessCertificate ``cutover preflight`` wrote.

    Returns:
        :class:`HaltReport`; ``already`` when every gate was already ``halting_v1`` and remeasured.

    Raises:
        InvalidIdentity: ``attempt_key`` is not a canonical key.
        CertificateMissing: no certificate for the attempt.
        CutoverRefused: the org has no V1 barriers (rerun ``cutover v1-install``), a barrier is closed by
            another attempt, the attempt was aborted before, or a gate is past ``halting_v1``.
        CertificateMismatch: the certificate's bytes, configuration generation or gate set differ from
            the service now (checked before any barrier closes, and again under the gate locks; while no
            gate halted, the barriers are reopened). Certify a new attempt.
        HaltAborted: the remeasure breached the certificate; barriers reopened, gates ``v1_serving``.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (step 1); proofs S003-RP-35, S003-RP-38.
    """
    attempt_key = validate_key(attempt_key, field="attempt_key", max_length=80)
    certificate = CutoverReadinessCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if certificate is None:
        raise CertificateMissing(f"attempt {attempt_key} has no readiness certificate; run cutover preflight")
    spent = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                           kind__in=tuple(SPENT_KINDS)).values_list("kind", flat=True).first()
    if spent is not None:
        raise CutoverRefused(f"attempt {attempt_key} is spent: it {SPENT_KINDS[spent]} and V1 serves again; "
                             "certify a new attempt with cutover preflight")
    if V1MaintenanceBarrier.objects.filter(org_id=org.org_id).count() != len(KINDS):
        raise CutoverRefused(f"org {org.org_id} has no V1 maintenance barriers; run cutover v1-install again")
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    past = [f"{g.account_key}={g.state}" for g in gates if g.state not in ("v1_serving", "halting_v1")]
    if past:
        raise CutoverRefused(f"halt-v1 needs gates v1_serving or halting_v1; found {', '.join(past)}")

    _check_certificate(org, certificate)  # before any barrier closes: a stale certificate changes nothing
    closing_started = db_now()
    fences = _barriers_move(org, attempt_key, close=True)
    closure_seconds = max(0, math.ceil((db_now() - closing_started).total_seconds()))
    failpoints.hit(FP_AFTER_BARRIERS)
    try:
        document = _freeze_gates(org, attempt_key, fences)
    except CertificateMismatch:
        if not AccountServingGate.objects.filter(org_id=org.org_id, state="halting_v1").exists():
            _barriers_move(org, attempt_key, close=False)  # nothing halted: give V1 its roots back
        raise

    remeasure = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                               kind="halt_remeasure").first()
    if remeasure is not None and not remeasure.payload["blockers"]:
        return HaltReport(attempt_key, certificate.digest, document["gate_set"], fences,
                          remeasure.payload["projections"], already=True)
    if remeasure is not None:  # a recorded breach is final: finish its abort, never remeasure it away
        _abort(org, attempt_key, certificate.digest, remeasure.payload["blockers"])
        raise HaltAborted(f"attempt {attempt_key} breached its certificate at remeasure; barriers reopened and "
                          "every gate is v1_serving again", remeasure.payload["blockers"])
    measured, projections, blockers = _breaches(org, document)
    summary = {phase: {"budget_seconds": p["budget_seconds"], "projected_seconds": p["projected_seconds"]}
               for phase, p in projections.items()}
    _evidence(org, attempt_key, "halt_remeasure", "", {"certificate_digest": certificate.digest,
                                                       "halted_at": closing_started.isoformat(),
                                                       "measurements": measured, "projections": summary,
                                                       "used_seconds": {"owner_barrier_closure": closure_seconds},
                                                       "blockers": blockers})
    if blockers:
        _abort(org, attempt_key, certificate.digest, blockers)
        raise HaltAborted(f"attempt {attempt_key} breached its certificate at remeasure; barriers reopened and "
                          "every gate is v1_serving again", blockers)
    return HaltReport(attempt_key, certificate.digest, document["gate_set"], fences, summary)


def _check_certificate(org: OrgScope, certificate: CutoverReadinessCertificate,
                       gates: list[AccountServingGate] | None = None) -> dict:
    """Byte-compare ``certificate`` with its digest, the latest configuration generation and the gate set.

    ``gates`` (locked by the caller, or read here) must be exactly the certificate's frozen exhaustive
    set, and every current account (the latest configuration's and the V1 registry's) must be in it.
    Halt, stop and certify call it; activation rereads the same set under its locks.

    Raises:
        CertificateMismatch: any of them differs.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (step 5); proof S003-RP-40.
    """
    data = bytes(certificate.document)
    document = json.loads(data)
    if certificate_digest(data) != certificate.digest or canonical_json.dumps(document) != data:
        raise CertificateMismatch(f"certificate {certificate.digest[:16]} does not match its stored bytes")
    latest = (ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id)
              .order_by("-generation").first())
    if latest is None or int(latest.pk) != document["configuration"]["id"] \
            or latest.digest != document["configuration"]["digest"]:
        raise CertificateMismatch("the configuration generation changed after preflight; certify a new attempt")
    if gates is None:
        gates = list(AccountServingGate.objects.filter(org_id=org.org_id))
    if sorted(g.account_key for g in gates) != document["gate_set"]:
        raise CertificateMismatch("the gate set is not the certified one-to-one account set")
    current = {a["account_key"] for a in latest.document["accounts"]} | set(
        V1Account.objects.filter(org_id=org.org_id).values_list("account_key", flat=True))
    outside = sorted(current - set(document["gate_set"]))
    if outside:
        raise CertificateMismatch(f"current account(s) {', '.join(outside)} are outside the certified gate set")
    return document


def _freeze_gates(org: OrgScope, attempt_key: str, fences: dict[str, int]) -> dict:
    """The halt transaction: lock gates then the certificate, byte-compare, ``v1_serving -> halting_v1``."""
    with transaction.atomic(durable=True):
        gates = AccountServingGateStore.lock_all(org.org_id)
        certificate = certificate_lock(org.org_id, attempt_key)
        document = _check_certificate(org, certificate, gates)
        cursors = [[c.account_key, c.route_key, None if c.cursor is None else bytes(c.cursor).decode("utf-8")]
                   for c in V1StreamCursor.objects.filter(org_id=org.org_id).order_by("account_key", "route_key")]
        for gate in gates:
            if gate.state == "halting_v1":
                continue
            proof = _evidence(org, attempt_key, "maintenance_barrier", gate.account_key, {
                "certificate_digest": certificate.digest, "configuration_digest": document["configuration"]["digest"],
                "gate_set": document["gate_set"], "barrier_fences": fences, "v1_stream_cursors": cursors})
            gate_transition(gate=gate, dst="halting_v1", evidence=proof, reason_code=reasons.CUTOVER_IN_PROGRESS)
    return document


def _abort(org: OrgScope, attempt_key: str, digest: str, blockers: list[dict]) -> None:
    """Reopen the barriers, then take every gate ``halting_v1 -> v1_serving`` with a new fence."""
    fences = _barriers_move(org, attempt_key, close=False)
    with transaction.atomic(durable=True):
        gates = AccountServingGateStore.lock_all(org.org_id)
        proof = _evidence(org, attempt_key, "halt_abort", "", {"certificate_digest": digest, "blockers": blockers,
                                                               "barrier_fences": fences})
        for gate in gates:
            if gate.state == "halting_v1":
                gate_transition(gate=gate, dst="v1_serving", evidence=proof)


#: Evidence after which an attempt is spent: V1 serves again and a new cutover needs a new attempt key.
SPENT_KINDS = {"halt_abort": "was aborted at remeasure", "v1_restored": "was restored to V1 (cutover restore)",
               "cold_abort": "was cold-aborted (cutover cold-abort)"}


# --- the budget of the halted service, and its fenced abort (seed 003 "Operational liveness ...") ---------
#: The phases a service in ``halting_v1`` spends before process termination and egress isolation.
HALTED_PHASES = ("owner_barrier_closure", "drain")
#: Evidence after which the fenced abort back to ``v1_serving`` is closed (V1 was isolated or terminated).
ISOLATION_KINDS = ("egress_isolation", "process_termination")


@dataclass
class HaltAbortReport:
    """``gates``: account keys back in ``v1_serving``; ``budget``: :func:`halt_budget` at the abort."""

    attempt_key: str
    gates: list[str]
    budget: dict
    already: bool = False


def halt_budget(*, org: OrgScope, attempt_key: str) -> dict | None:
    """How much of the certified barrier-closure and drain budget the halted attempt has used.

    Time is the database clock's, from the moment the barriers started closing.

    Returns:
        ``{"budget_seconds": int, "used_seconds": int, "breached": bool, "halted_at": ISO-8601}``, or
        ``None`` while the attempt has not halted V1 (no successful remeasure).

    A breach is a go/no-go threshold for the operator, never evidence that V1 work or a V1 provider
    call is finished: the drain inventory still decides that. Seed 003 "Operational liveness and
    maintenance admission"; proof S003-RP-36.
    """
    import datetime as dt

    remeasure = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                               kind="halt_remeasure").first()
    certificate = CutoverReadinessCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if remeasure is None or remeasure.payload["blockers"] or certificate is None:
        return None
    budgets = json.loads(bytes(certificate.document))["plan"]["budgets_seconds"]
    budget = sum(budgets[phase] for phase in HALTED_PHASES)
    halted_at = remeasure.payload.get("halted_at")
    since = dt.datetime.fromisoformat(halted_at) if halted_at else remeasure.created_at
    used = max(0, math.ceil((db_now() - since).total_seconds()))
    return {"budget_seconds": budget, "used_seconds": used, "breached": used > budget,
            "halted_at": since.isoformat()}


def halt_budget_blockers(*, org: OrgScope, attempt_key: str) -> list[dict]:
    """``[cutover_budget_exceeded blocker]`` when :func:`halt_budget` is breached, else ``[]``."""
    budget = halt_budget(org=org, attempt_key=attempt_key)
    if budget is None or not budget["breached"]:
        return []
    return [{"reason_code": reasons.CUTOVER_BUDGET_EXCEEDED, "subject": "drain",
             "detail": f"halted for {budget['used_seconds']}s, over the certified barrier-closure and drain budget "
                       f"of {budget['budget_seconds']}s; abort to v1_serving with cutover abort-halt"}]


def cutover_halt_abort(*, org: OrgScope, attempt_key: str) -> HaltAbortReport:
    """Take the fenced abort ``halting_v1 -> v1_serving``: reopen the barriers, then every gate with a new fence.

    The phase-appropriate path of a budget breach (or an operator's decision) while V1 is halted but
    neither isolated nor terminated. V2 stayed disabled throughout (every gate is ``halting_v1``, no
    epoch of the org is active). V1 work and V1 provider calls are not touched: a call whose I/O may
    have started stays exactly as it is, owned by V1. The attempt is spent afterwards.

    Args:
        attempt_key: the attempt ``cutover halt-v1`` halted.

    Returns:
        :class:`HaltAbortReport`; ``already`` when the attempt was aborted before.

    Raises:
        InvalidIdentity / CertificateMissing: see :func:`cutover_halt_v1`.
        CutoverRefused: the attempt did not halt V1, V1 was already isolated or terminated (``cutover stop``
            ran: after ``v1_drained`` the path is ``cold-abort``, during ``v2_validating`` ``restore``), or a
            gate is not ``halting_v1``.

    Seed 003 "Operational liveness and maintenance admission" and "Offline V1 shutdown, cold rollback,
    and V2 cutover" (the fenced abort); proof S003-RP-36.
    """
    attempt_key = validate_key(attempt_key, field="attempt_key", max_length=80)
    certificate = CutoverReadinessCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if certificate is None:
        raise CertificateMissing(f"attempt {attempt_key} has no readiness certificate; run cutover preflight")
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    if CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key, kind="halt_abort").exists() \
            and {g.state for g in gates} == {"v1_serving"}:
        return HaltAbortReport(attempt_key, [g.account_key for g in gates], {}, already=True)
    isolated = sorted(CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                                     kind__in=ISOLATION_KINDS).values_list("kind", flat=True))
    if isolated:
        raise CutoverRefused(f"attempt {attempt_key} already recorded {', '.join(isolated)}: the fenced abort is "
                             "closed; after v1_drained use cutover cold-abort, during v2_validating cutover restore")
    budget = halt_budget(org=org, attempt_key=attempt_key)
    states = sorted({g.state for g in gates})
    if budget is None or states != ["halting_v1"]:
        raise CutoverRefused(f"abort-halt needs every gate halting_v1 under attempt {attempt_key}; gates are "
                             f"{', '.join(states) or 'none'}")
    if ServingEpoch.objects.filter(org_id=org.org_id, state="active").exists():
        raise CutoverRefused("an epoch of the org is active: V2 is not proven stopped")
    _abort(org, attempt_key, certificate.digest, halt_budget_blockers(org=org, attempt_key=attempt_key)
           or [{"reason_code": reasons.CUTOVER_IN_PROGRESS, "subject": "operator", "detail": "operator abort"}])
    return HaltAbortReport(attempt_key, [g.account_key for g in gates], budget)
