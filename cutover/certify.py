"""``cutover certify``: the second V1 inventory under the ``v1_stopped`` gate locks, then ``v1_drained``.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", steps 4-5;
proofs S003-RP-41 and S003-RP-42. One transaction:

1. locks every AccountServingGate of the org (all ``v1_stopped``), then the
   exact CutoverReadinessCertificate, and byte-compares it with the service
   (configuration generation, exhaustive gate set);
2. takes the second, authoritative V1 inventory. It blocks (exit 3, nothing
   written but one ``shutdown_blocked`` evidence row) on any nonterminal V1
   event, unresolved V1 provider call (``prepared``, ``sending``, ``ambiguous``:
   a call interrupted before or after I/O stays blocking until ``cutover
   reconcile`` appended its exact evidence), live claim or SchedulerLease, V1
   process generation without recorded termination proof, generation not
   covered by the attempt's egress denial, egress-manifest problem or a call
   site outside the current-tree manifest, transport identity that conflicts
   with an existing ReceiptAdmissionKey, or order-dependent route partition
   without a baseline;
3. exports every V1 transport identity as an immutable ReceiptAdmissionKey
   tombstone (byte-compared when present) and one
   :class:`~cutover.models.OrderingBaseline` per order-dependent partition;
4. inserts the one :class:`~cutover.models.V1ShutdownCertificate` and moves
   every gate ``v1_stopped -> v1_drained`` referencing it.

``cutover reconcile`` locks the same gate rows first, so a reconciliation
commits before this inventory or finds ``v1_drained`` and writes nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import transaction

from connectors.models import (
    AccountServingGate,
    ReceiptAdmissionKey,
    ServingEpoch,
    V1EgressDenial,
    V1StreamCursor,
)
from connectors.serving.gates import gate_transition
from connectors.store import AccountServingGateStore
from connectors.v1 import egress_manifest
from connectors.v1.generations import v1_release
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

from . import reasons, selectors
from .adoption import adopt_links, adoption_plan
from .halt import _check_certificate
from .models import CutoverEvidence, OrderingBaseline, V1ShutdownCertificate
from .preflight import revalidate_routes
from .services import CutoverRefused, _evidence
from .store import certificate_lock
from .v1_shutdown import (
    ShutdownBlocked,
    attempt_certificate,
    blocker,
    inventory_blockers,
    inventory_digest,
    record_blocked,
    v1_inventory,
)

CERTIFICATE_FORMAT = "nexusflow.v1-shutdown.v1"


@dataclass
class CertifyReport:
    """``certificate_id``/``digest``: the V1ShutdownCertificate; ``tombstones``/``baselines``: rows it covers."""

    attempt_key: str
    certificate_id: int
    digest: str
    gates: list[str]
    tombstones: int
    baselines: int
    already: bool = False


def _digest(domain: str, value) -> str:
    return digest_v2(domain, [("value", canonical_json.dumps(value))]).hexdigest


def _generation_blockers(org: OrgScope, attempt_key: str) -> tuple[list[dict], list[dict], V1EgressDenial | None]:
    generations = selectors.v1_generations()
    denial = V1EgressDenial.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    out = []
    for g in generations:
        if not g["terminated"]:
            out.append(blocker(reasons.V1_GENERATION_LIVE, f"v1_process_generation.{g['id']}",
                               f"{g['worker_id']} has no recorded termination proof"))
        if denial is None or g["id"] > denial.through_generation:
            out.append(blocker(reasons.V1_EGRESS_NOT_ISOLATED, f"v1_process_generation.{g['id']}",
                               f"{g['worker_id']} is not covered by the attempt's V1 egress denial"))
    if denial is None:
        out.append(blocker(reasons.V1_EGRESS_NOT_ISOLATED, "v1_egress", "the attempt has no V1 egress denial"))
    return out, generations, denial


def _release_blockers(certified: str, generations: list[dict]) -> list[dict]:
    """One blocker per V1 release (current tree, each process generation) other than the certified one."""
    out = []
    if v1_release() != certified:
        out.append(blocker(reasons.V1_RELEASE_MISMATCH, "v1_release.current_tree",
                           f"the current tree's V1 release {v1_release()[:16]} is not the certified {certified[:16]}"))
    for g in generations:
        if g["release"] != certified:
            out.append(blocker(reasons.V1_RELEASE_MISMATCH, f"v1_process_generation.{g['id']}",
                               f"{g['worker_id']} ran V1 release {g['release'][:16]}, not the certified "
                               f"{certified[:16]}"))
    return out


def _manifest_blockers(org: OrgScope) -> tuple[list[dict], dict]:
    manifest, problems = egress_manifest.generate()
    problems = problems + [p for p in egress_manifest.manifest_problems() if p not in problems]
    out = [blocker(reasons.V1_EGRESS_MANIFEST_INCOMPLETE, "connectors/v1", p) for p in problems]
    covered = {row["call_site"] for row in manifest["effect_rows"]}
    for site in selectors.v1_call_sites(org_id=org.org_id):
        if site not in covered:
            out.append(blocker(reasons.V1_EGRESS_MANIFEST_INCOMPLETE, f"call_site.{site}",
                               "V1 provider calls of this call site are not in the current-tree egress manifest"))
    return out, manifest


def _tombstones(org: OrgScope) -> tuple[list[dict], list[dict]]:
    """``(rows to insert, blockers)``: one tombstone per V1 transport identity; existing keys byte-compared."""
    rows, out = [], []
    for key in selectors.v1_transport_keys(org_id=org.org_id):
        tombstone = {"predecessor": {"protocol": "v1", "transport_id": int(key.pk), "body_digest": key.body_digest,
                                     "event_count": key.event_count},
                     "route_key": key.route_key}
        values = {"org_id": org.org_id, "account_key": key.account_key, "channel": key.channel,
                  "transport_key": key.transport_key, "identity_digest": key.identity_digest,
                  "profile_id": PROFILE_V2, "v1_tombstone": tombstone}
        existing = ReceiptAdmissionKey.objects.filter(org_id=org.org_id, account_key=key.account_key,
                                                      channel=key.channel, transport_key=key.transport_key).first()
        if existing is None:
            rows.append(values)
        elif existing.receipt_id is not None or existing.identity_digest != key.identity_digest \
                or existing.v1_tombstone != tombstone:
            out.append(blocker(reasons.V1_IDENTITY_CONFLICT, f"v1_transport_key.{key.pk}",
                               "a ReceiptAdmissionKey with this transport key holds other facts"))
    return rows, out


def _position(payload, route: dict):
    """``(partition values, [*typed position, SourceEventKey])`` of one V1 event payload, or ``(None, None)``.

    Derived by the V2 admission's own classification (:func:`connectors.inbound.admission.classify_items`)
    of the same pack route, so the baseline's partition and position are exactly the ones V2 computes for
    the same event: its partition values as canonical locators, its position closed by its SourceEventKey.
    """
    from connectors.inbound.admission import classify_items

    if not isinstance(payload, dict):
        return None, None
    [item] = classify_items(route, [payload])
    if item.reason or item.position is None:
        return None, None
    typed = [payload[f] for f in route["ordering"].get("position", [])]
    return item.partition, [*typed, item.source_event_key]


def _order_key(position: list) -> tuple:
    """Compare typed positions numerically, then the tie-breaker (integers before texts, each in its own order)."""
    *typed, tie = position
    return (*typed, (0, tie, "") if isinstance(tie, int) else (1, 0, tie))


def _pack_route(org: OrgScope, document: dict, account_key: str, route_key: str) -> dict:
    """The pack route document the certified candidate epoch serves ``account_key``/``route_key`` with."""
    from connectors.models import PackGeneration

    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=document["epoch"]["id"])
    account = next(a for a in epoch.document["accounts"] if a["account_key"] == account_key)
    pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
    return next(r for r in pack.document["inbound_routes"] if r["route_key"] == route_key)


def _baselines(org: OrgScope, document: dict) -> tuple[list[dict], list[dict]]:
    """``(rows to insert, blockers)``: the drained V1 high-water per partition, or the frozen stream cursor."""
    rows, out = [], []
    for route in document["routes"]:
        name = f"{route['account_key']}/{route['route_key']}"
        base = {"org_id": org.org_id, "account_key": route["account_key"], "route_key": route["route_key"],
                "ordering_digest": route["proof"].get("ordering_digest", "")}
        if route["disposition"] == "v1_high_water":
            pack_route = _pack_route(org, document, route["account_key"], route["route_key"])
            highs: dict[bytes, tuple[list, list]] = {}
            missing = 0
            for payload in selectors.v1_event_payloads(org_id=org.org_id, account_key=route["account_key"],
                                                       route_key=route["route_key"]):
                partition, position = _position(payload, pack_route)
                if position is None:
                    missing += 1
                    continue
                key = canonical_json.dumps(partition)
                if key not in highs or _order_key(position) > _order_key(highs[key][1]):
                    highs[key] = (partition, position)
            if missing:
                out.append(blocker(reasons.V1_BASELINE_MISSING, name,
                                   f"{missing} V1 event(s) carry no typed position: no high-water baseline"))
            for _key, (partition, position) in sorted(highs.items()):
                rows.append({**base, "partition_key": _digest("cutover.ordering-partition", partition),
                             "partition": partition, "origin": "v1_high_water",
                             "position": canonical_json.dumps(position)})
        elif route["disposition"] == "provider_snapshot_barrier":
            cursor = V1StreamCursor.objects.filter(org_id=org.org_id, account_key=route["account_key"],
                                                   route_key=route["route_key"]).first()
            if cursor is None:
                out.append(blocker(reasons.V1_BASELINE_MISSING, name, "the pulled route has no V1 stream cursor"))
                continue
            rows.append({**base, "partition_key": _digest("cutover.ordering-partition", []), "partition": [],
                         "origin": "provider_snapshot_barrier",
                         "position": None if cursor.cursor is None else bytes(cursor.cursor)})
    return rows, out


def _existing(org: OrgScope, attempt_key: str, gates: list[AccountServingGate]) -> CertifyReport | None:
    certificate = V1ShutdownCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if certificate is None or {g.state for g in gates} - {"v1_drained", "v2_validating", "v2_serving"}:
        return None
    document = json.loads(bytes(certificate.document))
    return CertifyReport(attempt_key, int(certificate.pk), certificate.digest, [g.account_key for g in gates],
                         document["coverage"]["tombstones"], document["coverage"]["baselines"], already=True)


def cutover_certify(*, org: OrgScope, attempt_key: str) -> CertifyReport:
    """Certify the V1 shutdown of ``org`` and move every gate ``v1_stopped -> v1_drained``.

    Args:
        attempt_key: the attempt ``cutover stop`` stopped.

    Returns:
        :class:`CertifyReport`; ``already`` when the attempt's certificate exists and the gates moved on.

    Raises:
        InvalidIdentity / CertificateMissing: see :func:`cutover.v1_shutdown.attempt_certificate`.
        CutoverRefused: a gate is not ``v1_stopped``.
        CertificateMismatch: the readiness certificate no longer matches the service.
        ShutdownBlocked: the second inventory found blockers (exit 3); nothing was written but the report row.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (steps 4-5); proofs S003-RP-41, S003-RP-42.
    """
    attempt_key, _ = attempt_certificate(org, attempt_key)
    done = _existing(org, attempt_key, list(AccountServingGate.objects.filter(org_id=org.org_id)
                                            .order_by("account_key")))
    if done is not None:
        return done
    blockers: list[dict] = []
    try:
        report = _certify(org, attempt_key, blockers)
    except ShutdownBlocked:
        record_blocked(org, attempt_key, "certify", blockers)
        raise
    return report


def _certify(org: OrgScope, attempt_key: str, blockers: list[dict]) -> CertifyReport:
    with transaction.atomic(durable=True):
        gates = AccountServingGateStore.lock_all(org.org_id)
        states = {g.state for g in gates}
        if not gates or states != {"v1_stopped"}:
            done = _existing(org, attempt_key, gates)
            if done is not None:
                return done
            raise CutoverRefused(f"certify needs every gate v1_stopped (run cutover stop); gates are "
                                 f"{', '.join(sorted(states)) or 'none'}")
        readiness = certificate_lock(org.org_id, attempt_key)
        document = _check_certificate(org, readiness, gates)
        evidence = {row.kind: row for row in CutoverEvidence.objects.filter(
            org_id=org.org_id, attempt_key=attempt_key,
            kind__in=("v1_drain_inventory", "process_termination", "egress_isolation"))}

        # The second, authoritative inventory: read after every gate is locked.
        inventory = v1_inventory(org)
        blockers += inventory_blockers(inventory)
        found, generations, denial = _generation_blockers(org, attempt_key)
        blockers += found
        found, manifest = _manifest_blockers(org)
        blockers += found
        tombstones, found = _tombstones(org)
        blockers += found
        blockers += revalidate_routes(org=org, document=document)  # the proved plan, never a new one
        baselines, found = _baselines(org, document)
        blockers += found
        blockers += _release_blockers(document["v1_release"], generations)
        if blockers:
            raise ShutdownBlocked("certify", blockers)
        # V1 push links: adopted only where provable, in this transaction (seed 002 "Migration Contract").
        adoption = adoption_plan(org=org, epoch=ServingEpoch.objects.get(org_id=org.org_id,
                                                                         pk=document["epoch"]["id"]))
        adopt_links(adoption)
        by_record: dict[str, list[dict]] = {}
        for refusal in adoption.refused:
            by_record.setdefault(refusal["record"], []).append(refusal)
        for record_key, refusals in sorted(by_record.items()):
            _evidence(org, attempt_key, "link_adoption_refused", record_key,
                      {**refusals[0], "refusals": refusals})

        for values in tombstones:
            insert(ReceiptAdmissionKey, **values)
        for values in baselines:
            if not OrderingBaseline.objects.filter(org_id=org.org_id, attempt_key=attempt_key,
                                                   account_key=values["account_key"], route_key=values["route_key"],
                                                   partition_key=values["partition_key"]).exists():
                insert(OrderingBaseline, attempt_key=attempt_key, **values)
        exported = ReceiptAdmissionKey.objects.filter(org_id=org.org_id, v1_tombstone__isnull=False).count()
        barrier_receipts = sorted([row.account_key, row.digest] for row in CutoverEvidence.objects.filter(
            org_id=org.org_id, attempt_key=attempt_key, kind="maintenance_barrier"))
        reconciliations = sorted([row.account_key, row.digest] for row in CutoverEvidence.objects.filter(
            org_id=org.org_id, attempt_key=attempt_key, kind="v1_reconciliation"))
        certificate_document = {
            "format": CERTIFICATE_FORMAT, "org_id": org.org_id, "attempt_key": attempt_key,
            "v1_release": {"certified": document["v1_release"], "current_tree": v1_release(),
                           "generations": sorted({g["release"] for g in generations})},
            "schema_digest": selectors.applied_migrations_digest(),
            "configuration": document["configuration"],
            "readiness_certificate": {"id": int(readiness.pk), "digest": readiness.digest},
            "gate_set": document["gate_set"], "gate_set_digest": _digest("cutover.gate-set", document["gate_set"]),
            "egress_manifest_digest": _digest("cutover.egress-manifest", manifest),
            "maintenance_barrier_receipts": barrier_receipts,
            "drain_inventory_digest": evidence["v1_drain_inventory"].digest if "v1_drain_inventory" in evidence else "",
            "inventory": inventory, "inventory_digest": inventory_digest(inventory),
            "process_termination": evidence["process_termination"].digest,
            "egress_isolation": {"digest": evidence["egress_isolation"].digest, "denial_id": int(denial.pk),
                                 "through_generation": denial.through_generation},
            "reconciliations": reconciliations,
            "link_adoption": adoption.document(),
            "coverage": {"transport_keys": selectors.v1_identity_counts(org_id=org.org_id)["transport_keys"],
                         "tombstones": exported,
                         "baselines": OrderingBaseline.objects.filter(org_id=org.org_id,
                                                                     attempt_key=attempt_key).count(),
                         "baseline_digest": _digest("cutover.baselines", sorted(
                             [b["account_key"], b["route_key"], b["partition_key"], b["origin"]]
                             for b in baselines))},
        }
        data = canonical_json.dumps(certificate_document)
        digest = digest_v2("cutover.v1-shutdown-certificate", [("document", data)]).hexdigest
        certificate = insert(V1ShutdownCertificate, org_id=org.org_id, attempt_key=attempt_key,
                             readiness_digest=readiness.digest, document=data, digest=digest)
        for gate in gates:
            gate_transition(gate=gate, dst="v1_drained", reason_code=reasons.CUTOVER_IN_PROGRESS, evidence={
                "attempt_key": attempt_key, "v1_shutdown_certificate": int(certificate.pk), "digest": digest})
    return CertifyReport(attempt_key, int(certificate.pk), digest, sorted(g.account_key for g in gates),
                         certificate_document["coverage"]["tombstones"], certificate_document["coverage"]["baselines"])
