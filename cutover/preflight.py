"""``cutover preflight``: certify that a V1 -> V2 cutover attempt may enter maintenance.

Seed 003 "Operational liveness and maintenance admission" and "Compressed
durable model" (``CutoverReadinessCertificate``); proofs S003-RP-14,
S003-RP-36, S003-RP-37.

Inputs, all read fresh and frozen into one canonical document:

- the org's latest ``ConnectorServiceConfigurationGeneration`` and its
  ServingEpoch candidate, prepared and verified offline (V2 stays disabled:
  every gate must still be ``v1_serving``);
- the operator-authored L2 cutover plan (a JSON document, :func:`validate_plan`):
  per-route migration disposition, halt contracts, budgets per phase,
  deployment throughput, safety margin, and alert/remediation owners;
- the measured V1 workload of the org (accepted backlog, leases, provider
  calls, source partitions, transport identities, retry deadlines) and the
  database size.

Every problem is collected as a blocker with a registered reason code
(``cutover/reasons.py``); any blocker refuses the attempt, records one
``preflight_refusal`` evidence row and writes no certificate. Otherwise one
immutable :class:`~cutover.models.CutoverReadinessCertificate` is inserted.
The document carries no clock reading, so the same inputs give the same
bytes; a changed input under the same attempt key is refused
(``certificate_input_changed``) and needs a new attempt, whose certificate
differs at least by its attempt key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from django.db import IntegrityError, transaction

from connectors.models import (
    ConnectorServiceConfigurationGeneration,
    PackGeneration,
    ServingEpoch,
)
from connectors.serving.gates import epoch_prepare, epoch_verify
from connectors.v1.generations import v1_release
from nexusflow.kernel import canonical_json
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.reasons import REASONS, REMEDIATIONS, load_all_reasons
from nexusflow.kernel.scope import OrgScope

from . import reasons, selectors
from .models import CutoverReadinessCertificate
from .services import CutoverRefused, _evidence, v1_serving_configuration
from .store import certificate_insert

CERTIFICATE_FORMAT = "nexusflow.cutover-readiness.v1"
PLAN_VERSION = 1

#: The L2 budget plan's phases, in procedure order (seed 003 "Operational liveness ...").
PHASES = ("owner_barrier_closure", "drain", "baseline_capture", "recovery_point", "restore_rehearsal",
          "validation", "activation_readback", "full_restore")
#: Declared deployment throughput, each a positive integer in the unit its name gives.
THROUGHPUT = ("barrier_close_seconds_per_barrier", "drain_events_per_second", "provider_calls_per_second",
              "baseline_partitions_per_second", "backup_bytes_per_second", "restore_bytes_per_second",
              "validation_seconds_per_account", "readback_seconds_per_gate")
#: The closed ordering-migration dispositions (``unsupported`` is accepted as input and always blocks).
DISPOSITIONS = ("order_independent", "v1_high_water", "provider_snapshot_barrier")
#: The lossless root-halt contract each delivery mode needs (seed 003 "Offline V1 shutdown ...").
INGRESS_HALT = {"push": "unacknowledged_retry", "pull": "cursor_hold"}
ROOT_OUTBOUND_HALT = "retryable_reject"
CONFIGURATION_HALT = "frozen_generation"
#: Database size is certified in whole buckets, rounded up (statistics drift between reads).
SIZE_BUCKET_BYTES = 64 * 1024 * 1024
#: Reason codes whose evidence is a cutover or V1 selector: the codes that can hold this procedure.
CUTOVER_EVIDENCE_PREFIXES = ("cutover.selectors.", "connectors.selectors.v1_")
#: Open V1 event and provider-call states (the drain has to move them).
OPEN_EVENT_STATES = ("pending", "running", "handed_off")
OPEN_CALL_STATES = ("prepared", "sending")


class CutoverPlanInvalid(NexusError):
    """The plan file is not a well-formed L2 cutover plan (exit 2, HTTP 400)."""

    code = "cutover_plan_invalid"
    http_status = 400


class CertificateInputChanged(NexusError):
    """The attempt already holds a certificate and the inputs changed: use a new attempt key (exit 3)."""

    code = "certificate_input_changed"


class ReadinessRefused(NexusError):
    """Preflight found blockers; nothing entered maintenance (exit 3).

    ``blockers`` is a list of ``{"reason_code", "subject", "detail"}``.
    """

    code = "readiness_refused"

    def __init__(self, blockers: list[dict]):
        self.blockers = blockers
        codes = sorted({b["reason_code"] for b in blockers})
        super().__init__(f"{len(blockers)} blocker(s): {', '.join(codes)}")


@dataclass
class PreflightReport:
    """``certificate_id``/``digest`` of the (new or existing) certificate; ``projections``: phase ->
    ``{"budget_seconds", "projected_seconds"}``; ``created``: False on an identical rerun."""

    certificate_id: CutoverReadinessCertificate.Id
    digest: str
    attempt_key: str
    epoch_id: int
    routes: list[dict]
    projections: dict[str, dict]
    created: bool
    blockers: list[dict] = field(default_factory=list)


# --- the plan (pure) ----------------------------------------------------------------------------------
def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _owner(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        validate_key(value, field="owner", max_length=80)
    except NexusError:
        return False
    return True


def validate_plan(plan: Any) -> dict:
    """Check the shape of an L2 cutover plan and return it.

    Shape (every number a positive integer)::

        {"plan_version": 1,
         "budgets_seconds": {<phase>: int, ...},            # phases: PHASES
         "throughput": {<name>: int, ...},                  # names: THROUGHPUT
         "safety_percent": int >= 100,                      # projections are multiplied by it / 100
         "routes": {"<account>/<route>": {"disposition": DISPOSITIONS | "unsupported"}},
         "halt_contracts": {"ingress": {"<account>/<route>": "unacknowledged_retry" | "cursor_hold"},
                            "root_outbound": {"owner": str, "contract": "retryable_reject"},
                            "configuration": {"owner": str, "contract": "frozen_generation"}},
         "alert_owners": {<reason code>: {"alert_owner": str, "remediation_owner": str}}}

    Only the shape is checked here; missing entries (a phase, a route, a
    reason code) are blockers of :func:`cutover_preflight`, not shape errors.

    Raises:
        CutoverPlanInvalid: not an object, unknown or mistyped keys, or a wrong ``plan_version``.
    """
    problems = []
    if not isinstance(plan, dict):
        raise CutoverPlanInvalid("the plan must be a JSON object")
    allowed = {"plan_version", "budgets_seconds", "throughput", "safety_percent", "routes", "halt_contracts",
               "alert_owners"}
    problems += [f"unknown key {k!r}" for k in sorted(set(plan) - allowed)]
    if plan.get("plan_version") != PLAN_VERSION:
        problems.append(f"plan_version must be {PLAN_VERSION}")
    for section, names in (("budgets_seconds", PHASES), ("throughput", THROUGHPUT)):
        value = plan.get(section, {})
        if not isinstance(value, dict):
            problems.append(f"{section} must be an object")
            continue
        problems += [f"{section}: unknown key {k!r}" for k in sorted(set(value) - set(names))]
        problems += [f"{section}.{k} must be a positive integer" for k, v in sorted(value.items())
                     if not _positive_int(v)]
    safety = plan.get("safety_percent")
    if safety is not None and not (_positive_int(safety) and safety >= 100):
        problems.append("safety_percent must be an integer >= 100")
    routes = plan.get("routes", {})
    if not isinstance(routes, dict) or not all(
            isinstance(v, dict) and set(v) == {"disposition"} and isinstance(v["disposition"], str)
            for v in routes.values()):
        problems.append('routes must map "<account>/<route>" to {"disposition": NAME}')
    halts = plan.get("halt_contracts", {})
    if not isinstance(halts, dict) or set(halts) - {"ingress", "root_outbound", "configuration"}:
        problems.append("halt_contracts holds only ingress, root_outbound and configuration")
    elif not isinstance(halts.get("ingress", {}), dict) or not all(
            isinstance(v, str) for v in halts.get("ingress", {}).values()):
        problems.append('halt_contracts.ingress must map "<account>/<route>" to a contract name')
    else:
        for name in ("root_outbound", "configuration"):
            value = halts.get(name, {})
            if not isinstance(value, dict) or set(value) - {"owner", "contract"}:
                problems.append(f"halt_contracts.{name} must be {{\"owner\", \"contract\"}}")
    owners = plan.get("alert_owners", {})
    if not isinstance(owners, dict) or not all(isinstance(v, dict) and set(v) <= {"alert_owner", "remediation_owner"}
                                               for v in owners.values()):
        problems.append('alert_owners must map a reason code to {"alert_owner", "remediation_owner"}')
    if problems:
        raise CutoverPlanInvalid("; ".join(problems))
    return plan


def cutover_reason_codes() -> list[str]:
    """The registered reason codes that can hold a V1 -> V2 cutover (cutover and V1 evidence), sorted."""
    return sorted(code for code, reason in load_all_reasons().items()
                  if reason.evidence.startswith(CUTOVER_EVIDENCE_PREFIXES))


def _ceil(value: Fraction) -> int:
    return math.ceil(value)


# --- the inputs -------------------------------------------------------------------------------------
def _blocker(code: str, subject: str, detail: str) -> dict:
    return {"reason_code": code, "subject": subject, "detail": detail}


def _enabled_routes(configuration: ConnectorServiceConfigurationGeneration, epoch_document: dict) -> list[dict]:
    """Every enabled ``(account, route)`` with its delivery mode and the ordering contract the epoch froze."""
    packs: dict[int, dict] = {}
    out = []
    frozen = {a["account_key"]: a for a in epoch_document["accounts"]}
    for account in configuration.document["accounts"]:
        pack_id = account["pack_generation_id"]
        if pack_id not in packs:
            packs[pack_id] = PackGeneration.objects.get(pk=pack_id).document
        definitions = {r["route_key"]: r for r in packs[pack_id].get("inbound_routes", [])}
        for route_key in account["routes"]:
            route = frozen[account["account_key"]]["routes"][route_key]
            out.append({"account_key": account["account_key"], "route_key": route_key,
                        "delivery": definitions[route_key].get("delivery", "push"),
                        "ordering": route["ordering"], "ordering_digest": route["ordering_digest"]})
    return out


def _route_partitions(org: OrgScope, route: dict) -> tuple[int, int]:
    """``(distinct partitions, events without a complete typed position)`` of one order-dependent V1 route."""
    ordering = route["ordering"]
    partitions: set[bytes] = set()
    unpositioned = 0
    for payload in selectors.v1_event_payloads(org_id=org.org_id, account_key=route["account_key"],
                                               route_key=route["route_key"]):
        if not isinstance(payload, dict):
            unpositioned += 1
            continue
        position = [payload.get(f) for f in ordering["position"]]
        if any(not isinstance(p, int) or isinstance(p, bool) for p in position) \
                or payload.get(ordering["tie_breaker"]) in (None, ""):
            unpositioned += 1
        partitions.add(canonical_json.dumps([payload.get(f) for f in ordering["partition"]]))
    return len(partitions), unpositioned


def measure_v1_workload(*, org: OrgScope, routes: list[dict]) -> dict:
    """Measure the V1 workload of ``org`` that the cutover must drain, baseline and back up.

    Returns:
        ``{"accepted_backlog": {"open_events": int, "by_account": {account: {state: int}}},
        "leases": {"scheduler_held": int, "events_leased": int},
        "provider_calls": {state: int}, "open_provider_calls": int, "ambiguous_provider_calls": int,
        "partitions": {"<account>/<route>": int}, "unpositioned_events": {"<account>/<route>": int},
        "transport_keys": int, "stream_cursors": int, "dependency_deadline_seconds": int,
        "database_size_bytes": int (rounded up to 64 MiB), "accounts": int, "routes": int}``.
        No clock reading is stored; the retry horizon is stored as seconds from now (0 when none).

    Raises:
        django.db.Error: a measurement could not be read.

    Seed 003 "Operational liveness and maintenance admission" (measured workload).
    """
    states = selectors.v1_event_states(org_id=org.org_id)
    calls = selectors.v1_provider_call_states(org_id=org.org_id)
    partitions, unpositioned = {}, {}
    for route in routes:
        if route["ordering"].get("contract") == "order_independent":
            continue
        name = f"{route['account_key']}/{route['route_key']}"
        partitions[name], unpositioned[name] = _route_partitions(org, route)
    horizon = selectors.v1_retry_horizon(org_id=org.org_id)
    deadline = max(0, math.ceil((horizon - db_now()).total_seconds())) if horizon is not None else 0
    size = selectors.database_bytes()
    return {
        "accepted_backlog": {"open_events": sum(n for by in states.values() for s, n in by.items()
                                                if s in OPEN_EVENT_STATES),
                             "by_account": states},
        "leases": selectors.v1_leases(org_id=org.org_id),
        "provider_calls": calls,
        "open_provider_calls": sum(n for s, n in calls.items() if s in OPEN_CALL_STATES),
        "ambiguous_provider_calls": calls.get("ambiguous", 0),
        "partitions": partitions, "unpositioned_events": unpositioned,
        **selectors.v1_identity_counts(org_id=org.org_id),
        "dependency_deadline_seconds": deadline,
        "database_size_bytes": max(1, math.ceil(size / SIZE_BUCKET_BYTES)) * SIZE_BUCKET_BYTES,
        "accounts": len({r["account_key"] for r in routes}), "routes": len(routes),
    }


def project(*, plan: dict, measured: dict, gates: int) -> dict[str, dict]:
    """Conservative projection of every phase from the measured workload and the declared throughput.

    Each projection is ``ceil(work / rate * safety_percent / 100)`` seconds (the drain adds the latest
    retry deadline unscaled). Returns ``{phase: {"budget_seconds": int | None, "projected_seconds": int,
    "basis": {...}}}``; a phase whose throughput is missing projects ``None``.

    Seed 003 "Operational liveness and maintenance admission"; proof S003-RP-36.
    """
    rate = plan.get("throughput", {})
    budget = plan.get("budgets_seconds", {})
    safety = Fraction(plan.get("safety_percent", 100), 100)
    barriers = measured["routes"] + 2  # one ingress barrier per route, root outbound, configuration
    partitions = sum(measured["partitions"].values())
    size = measured["database_size_bytes"]
    backlog = measured["accepted_backlog"]["open_events"]
    calls = measured["open_provider_calls"]

    def scaled(work: int, name: str, per_second: bool = True) -> int | None:
        if name not in rate:
            return None
        value = Fraction(work, rate[name]) if per_second else Fraction(work * rate[name])
        return _ceil(value * safety)

    drain_events, drain_calls = scaled(backlog, "drain_events_per_second"), scaled(calls, "provider_calls_per_second")
    plans = {
        "owner_barrier_closure": (scaled(barriers, "barrier_close_seconds_per_barrier", False), {"barriers": barriers}),
        "drain": (None if drain_events is None or drain_calls is None
                  else drain_events + drain_calls + measured["dependency_deadline_seconds"],
                  {"open_events": backlog, "open_provider_calls": calls,
                   "dependency_deadline_seconds": measured["dependency_deadline_seconds"]}),
        "baseline_capture": (scaled(partitions, "baseline_partitions_per_second"), {"partitions": partitions}),
        "recovery_point": (scaled(size, "backup_bytes_per_second"), {"database_size_bytes": size}),
        "restore_rehearsal": (scaled(size, "restore_bytes_per_second"), {"database_size_bytes": size}),
        "validation": (scaled(measured["accounts"], "validation_seconds_per_account", False),
                       {"accounts": measured["accounts"]}),
        "activation_readback": (scaled(gates, "readback_seconds_per_gate", False), {"gates": gates}),
        "full_restore": (scaled(size, "restore_bytes_per_second"), {"database_size_bytes": size}),
    }
    return {phase: {"budget_seconds": budget.get(phase), "projected_seconds": plans[phase][0],
                    "basis": plans[phase][1]} for phase in PHASES}


def _disposition_blockers(route: dict, disposition: str | None, measured: dict) -> tuple[list[dict], dict]:
    """Check one route's declared disposition against its frozen ordering contract; return blockers and proof."""
    name = f"{route['account_key']}/{route['route_key']}"
    ordering = route["ordering"]
    contract = ordering.get("contract")
    code = reasons.ROUTE_MIGRATION_UNSUPPORTED
    if disposition is None:
        return [_blocker(code, name, "the route has no migration disposition in the plan")], {}
    if disposition not in DISPOSITIONS:
        return [_blocker(code, name, f"disposition {disposition!r} is not one of {', '.join(DISPOSITIONS)}")], {}
    proof = {"contract": contract, "ordering_digest": route["ordering_digest"]}
    if disposition == "order_independent":
        if contract != "order_independent":
            return [_blocker(code, name, f"order_independent needs an order_independent contract with its "
                                         f"conformance proof; the route freezes {contract}")], {}
        return [], {**proof, "conformance": ordering.get("conformance", "")}
    if contract == "order_independent":
        return [_blocker(code, name, f"{disposition} is for order-dependent routes; use order_independent")], {}
    complete = all(ordering.get(k) for k in ("partition", "position", "tie_breaker", "comparator_version"))
    if not complete:
        return [_blocker(code, name, "the ordering contract lacks partition, position, tie-breaker or "
                                     "comparator")], {}
    proof.update({"partition": ordering["partition"], "position": ordering["position"],
                  "tie_breaker": ordering["tie_breaker"], "comparator_version": ordering["comparator_version"]})
    if disposition == "v1_high_water":
        missing = measured["unpositioned_events"].get(name, 0)
        if missing:
            return [_blocker(code, name, f"{missing} V1 event(s) carry no typed source position and tie-breaker; "
                                         "arrival order is not a high-water proof")], {}
        return [], {**proof, "partitions": measured["partitions"].get(name, 0)}
    if route["delivery"] != "pull":
        return [_blocker(code, name, "provider_snapshot_barrier needs a pulled route whose cursor can be "
                                     "fenced losslessly")], {}
    return [], {**proof, "delivery": "pull"}


def _route_name(route: dict) -> str:
    return f"{route['account_key']}/{route['route_key']}"


def revalidate_routes(*, org: OrgScope, document: dict) -> list[dict]:
    """Recheck a certificate's per-route migration plan against the service now, before baselines are taken.

    The final baseline capture executes the plan preflight proved; it never discovers one. This
    rereads the certified configuration generation and candidate epoch, recomputes every enabled
    route's ordering-contract digest from the epoch's frozen contract, and checks each route again
    with :func:`_disposition_blockers` against freshly measured V1 positions. A V1 event without a
    typed source position and tie-breaker stays a blocker: its insertion order (the V1 queue's
    ``EnqueueOrdinal``) or arrival order is never used as a high-water.

    Args:
        document: the parsed CutoverReadinessCertificate document.

    Returns:
        Blockers ``{"reason_code": "route_migration_unsupported", "subject", "detail"}``; empty when every
        enabled route still holds exactly its certified disposition and proof.

    Seed 003 "Durable source ordering" (ordering-migration disposition); proof S003-RP-14.
    """
    code = reasons.ROUTE_MIGRATION_UNSUPPORTED
    configuration = ConnectorServiceConfigurationGeneration.objects.filter(
        org_id=org.org_id, pk=document["configuration"]["id"]).first()
    epoch = ServingEpoch.objects.filter(org_id=org.org_id, pk=document["epoch"]["id"]).first()
    if configuration is None or configuration.digest != document["configuration"]["digest"]:
        return [_blocker(code, "configuration", "the certified configuration generation is gone or changed")]
    if epoch is None or epoch.digest != document["epoch"]["digest"]:
        return [_blocker(code, "epoch", "the certified candidate epoch is gone or changed")]
    routes = _enabled_routes(configuration, epoch.document)
    certified = {_route_name(r): r for r in document["routes"]}
    measured: dict = {"partitions": {}, "unpositioned_events": {}}
    for route in routes:
        if route["ordering"].get("contract") != "order_independent":
            name = _route_name(route)
            measured["partitions"][name], measured["unpositioned_events"][name] = _route_partitions(org, route)
    out = []
    for route in routes:
        name = _route_name(route)
        entry = certified.get(name)
        if entry is None:
            out.append(_blocker(code, name, "the route is enabled but the certificate gives it no disposition"))
            continue
        recomputed = digest_v2("connectors.ordering-contract",
                               [("ordering", canonical_json.dumps(route["ordering"]))]).hexdigest
        if recomputed != route["ordering_digest"] or recomputed != entry["proof"].get("ordering_digest"):
            out.append(_blocker(code, name, "the route's frozen ordering contract is not the one preflight proved"))
            continue
        found, proof = _disposition_blockers(route, entry["disposition"], measured)
        out += found
        if not found and {k: v for k, v in proof.items() if k != "partitions"} != \
                {k: v for k, v in entry["proof"].items() if k != "partitions"}:
            out.append(_blocker(code, name, "the route's disposition proof differs from the certified one"))
    for name in sorted(set(certified) - {_route_name(r) for r in routes}):
        out.append(_blocker(code, name, "the certificate names a route the frozen configuration does not enable"))
    return out


def _certificate_document(*, org: OrgScope, attempt_key: str, plan: dict) -> tuple[dict, list[dict], dict]:
    """Read every input and return ``(document, blockers, projections)``."""
    configuration, gates = v1_serving_configuration(
        org=org, purpose="preflight runs before maintenance, with every gate v1_serving")
    accounts = [a["account_key"] for a in configuration.document["accounts"]]
    if sorted(accounts) != [g.account_key for g in gates]:
        raise CutoverRefused("the gate set is not one-to-one with the configuration's account set")
    epoch = epoch_verify(org=org, epoch_id=epoch_prepare(org=org).pk)
    routes = _enabled_routes(configuration, epoch.document)
    measured = measure_v1_workload(org=org, routes=routes)
    blockers: list[dict] = []

    declared = plan.get("routes", {})
    route_entries = []
    for route in routes:
        name = f"{route['account_key']}/{route['route_key']}"
        disposition = declared.get(name, {}).get("disposition")
        found, proof = _disposition_blockers(route, disposition, measured)
        blockers += found
        ingress = plan.get("halt_contracts", {}).get("ingress", {}).get(name)
        if ingress != INGRESS_HALT[route["delivery"]]:
            blockers.append(_blocker(reasons.ROUTE_HALT_CONTRACT_MISSING, name,
                                     f"a {route['delivery']} route needs the ingress halt contract "
                                     f"{INGRESS_HALT[route['delivery']]!r}, the plan declares {ingress!r}"))
        route_entries.append({"account_key": route["account_key"], "route_key": route["route_key"],
                              "delivery": route["delivery"], "disposition": disposition, "proof": proof,
                              "ingress_halt": ingress})
    for name in sorted(set(declared) - {f"{r['account_key']}/{r['route_key']}" for r in routes}):
        blockers.append(_blocker(reasons.READINESS_INPUT_INCOMPLETE, name,
                                 "the plan names a route that is not enabled in the configuration generation"))
    halts = plan.get("halt_contracts", {})
    for name, contract in (("root_outbound", ROOT_OUTBOUND_HALT), ("configuration", CONFIGURATION_HALT)):
        entry = halts.get(name, {})
        if entry.get("contract") != contract or not _owner(entry.get("owner")):
            blockers.append(_blocker(reasons.READINESS_INPUT_INCOMPLETE, f"halt_contracts.{name}",
                                     f"needs {{\"owner\": NAME, \"contract\": {contract!r}}}"))

    projections = project(plan=plan, measured=measured, gates=len(gates))
    for phase, p in projections.items():
        if p["budget_seconds"] is None:
            blockers.append(_blocker(reasons.READINESS_INPUT_INCOMPLETE, f"budgets_seconds.{phase}",
                                     "the plan declares no budget for this phase"))
        elif p["projected_seconds"] is None:
            blockers.append(_blocker(reasons.READINESS_INPUT_INCOMPLETE, f"throughput.{phase}",
                                     "the plan declares no throughput to project this phase"))
        elif p["projected_seconds"] > p["budget_seconds"]:
            blockers.append(_blocker(reasons.CUTOVER_BUDGET_EXCEEDED, phase,
                                     f"projected {p['projected_seconds']}s exceeds the budget of "
                                     f"{p['budget_seconds']}s ({p['basis']})"))
    if measured["ambiguous_provider_calls"]:
        blockers.append(_blocker(reasons.V1_EFFECT_UNRESOLVED, "v1_provider_calls",
                                 f"{measured['ambiguous_provider_calls']} ambiguous V1 call(s) have no finite "
                                 "safety timeout; reconcile them first"))

    alert_map = []
    owners = plan.get("alert_owners", {})
    for code in cutover_reason_codes():
        reason = REASONS[code]
        entry = owners.get(code, {})
        if not _owner(entry.get("alert_owner")) or not _owner(entry.get("remediation_owner")):
            blockers.append(_blocker(reasons.READINESS_INPUT_INCOMPLETE, f"alert_owners.{code}",
                                     "needs an alert_owner and a remediation_owner"))
        if not reason.remediations or any(r not in REMEDIATIONS for r in reason.remediations):
            blockers.append(_blocker(reasons.READINESS_INPUT_INCOMPLETE, f"remediations.{code}",
                                     "the code has no mapped remediation"))
        alert_map.append({"code": code, "owner": reason.owner, "evidence": reason.evidence,
                          "alert_after_seconds": reason.alert_after_seconds,
                          "remediations": list(reason.remediations), **entry})
    for code in sorted(set(owners) - set(cutover_reason_codes())):
        blockers.append(_blocker(reasons.READINESS_INPUT_INCOMPLETE, f"alert_owners.{code}",
                                 "not a reason code this cutover can raise"))

    document = {
        "format": CERTIFICATE_FORMAT, "org_id": org.org_id, "attempt_key": attempt_key,
        "configuration": {"id": int(configuration.pk), "generation": configuration.generation,
                          "digest": configuration.digest},
        "epoch": {"id": int(epoch.pk), "digest": epoch.digest},
        "v1_release": v1_release(),
        "gate_set": [g.account_key for g in gates],
        "plan_digest": plan_digest(plan), "plan": plan,
        "routes": route_entries, "halt_contracts": halts,
        "measurements": measured, "projections": projections, "reasons": alert_map,
    }
    return document, blockers, projections


def plan_digest(plan: dict) -> str:
    """The v2 digest of the plan's canonical JSON bytes."""
    return digest_v2("cutover.readiness-plan", [("plan", canonical_json.dumps(plan))]).hexdigest


def certificate_digest(document_bytes: bytes) -> str:
    """The v2 digest of a certificate's canonical document bytes."""
    return digest_v2("cutover.readiness-certificate", [("document", document_bytes)]).hexdigest


def _rehearsal_blockers(org: OrgScope, attempt_key: str, digest: str, projections: dict, result: dict) -> list[dict]:
    _evidence(org, attempt_key, "preflight_rehearsal", digest, {"attempt_key": attempt_key, **result})
    if not result["ok"]:
        return [{"reason_code": reasons.RESTORE_POINT_REHEARSAL_FAILED, "subject": "restore_rehearsal",
                 "detail": f"the representative restore rehearsal failed: {result['detail']}"}]
    budget = projections["restore_rehearsal"]["budget_seconds"]
    if result["seconds"]["total"] > budget:
        return [{"reason_code": reasons.CUTOVER_BUDGET_EXCEEDED, "subject": "restore_rehearsal",
                 "detail": f"the representative restore rehearsal took {result['seconds']['total']}s, over the "
                           f"plan's {budget}s"}]
    return []


def cutover_preflight(*, org: OrgScope, attempt_key: str, plan: Any, rehearse=None) -> PreflightReport:
    """Measure, project and certify one cutover attempt of ``org`` before maintenance.

    Args:
        attempt_key: the service cutover attempt (canonical key, at most 80 characters).
        plan: the parsed L2 plan (:func:`validate_plan` gives its shape).
        rehearse: ``None``, or the representative restore rehearsal to run before a new certificate is written
            (``cutover preflight --rehearse`` passes :func:`cutover.restore_point.representative_rehearsal`,
            a restore of the live main database on its own server, returning its result dict); a
            failed rehearsal (``restore_point_rehearsal_failed``) or one slower than the plan's
            ``restore_rehearsal`` budget (``cutover_budget_exceeded``) refuses it. The measurement is one
            ``preflight_rehearsal`` evidence row (not in the certificate, whose bytes stay a function of the
            inputs).

    Returns:
        :class:`PreflightReport` of the certificate; ``created`` is False when the same
        attempt already holds a byte-identical certificate.

    Raises:
        InvalidIdentity: ``attempt_key`` is not a canonical key.
        CutoverPlanInvalid: the plan is malformed.
        CutoverRefused: no configuration, a gate not ``v1_serving``, or a gate set that is
            not one-to-one with the configuration's accounts.
        EpochVerificationFailed / EpochVerificationDeferred: the V2 candidate failed or
            could not be verified offline.
        ReadinessRefused: any blocker (its ``blockers`` list each with a reason code); a
            ``preflight_refusal`` CutoverEvidence row records them; no certificate is written.
        CertificateInputChanged: the attempt already holds a certificate of other bytes.

    Seed 003 "Operational liveness and maintenance admission" and "Compressed durable
    model" (CutoverReadinessCertificate); proofs S003-RP-14, S003-RP-36, S003-RP-37.
    """
    attempt_key = validate_key(attempt_key, field="attempt_key", max_length=80)
    plan = validate_plan(plan)
    document, blockers, projections = _certificate_document(org=org, attempt_key=attempt_key, plan=plan)
    data = canonical_json.dumps(document)
    digest = certificate_digest(data)
    existing = CutoverReadinessCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if rehearse is not None and not blockers and existing is None:
        blockers = _rehearsal_blockers(org, attempt_key, digest, projections, rehearse())
    if blockers:
        _evidence(org, attempt_key, "preflight_refusal", digest,
                  {"attempt_key": attempt_key, "input_digest": digest, "blockers": blockers})
        raise ReadinessRefused(blockers)
    created = False
    if existing is None:
        try:
            with transaction.atomic(durable=True):
                existing = certificate_insert(
                    org_id=org.org_id, attempt_key=attempt_key, configuration_id=document["configuration"]["id"],
                    configuration_digest=document["configuration"]["digest"], epoch_id=document["epoch"]["id"],
                    epoch_digest=document["epoch"]["digest"], plan_digest=document["plan_digest"],
                    document=data, digest=digest)
            created = True
        except IntegrityError:
            existing = CutoverReadinessCertificate.objects.get(org_id=org.org_id, attempt_key=attempt_key)
    if bytes(existing.document) != data or existing.digest != digest:
        raise CertificateInputChanged(f"attempt {attempt_key} already holds certificate {existing.digest[:16]}; "
                                      "an input changed, so start a new attempt key")
    return PreflightReport(existing.pk, existing.digest, attempt_key, document["epoch"]["id"], document["routes"],
                           {k: {"budget_seconds": v["budget_seconds"], "projected_seconds": v["projected_seconds"]}
                            for k, v in projections.items()}, created)
