"""``cutover validate``: the V2 candidate validated with every production path disabled.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 7, and proof S003-RP-44 (the
``v2_validating`` half). After the V1RestorePoint of the attempt is durable (control database):

1. exact-generation verification of the certified candidate ServingEpoch: ``prepared -> verified`` by
   fresh owner reads (``connectors.serving.epoch.epoch_verify``), or, when already ``verified``, the same
   fresh reread (``epoch_recheck_for_activation``); the epoch must be the certificate's exact epoch
   (id and digest) and cover exactly the frozen gate set;
2. conformance: every certified OrderingBaseline's ordering contract digest equals the candidate's
   contract for that route, and every route the readiness certificate froze is still in the candidate;
3. one transaction under every gate lock: each frozen gate ``v1_drained -> v2_validating`` (new fence,
   evidence naming the epoch, the restore point and the shutdown certificate) and the first OrderingLanes
   of the candidate from the certified baselines (``baseline_origin`` = the baseline's origin);
4. the attempt's CutoverDecision opens ``rollback_open`` with the candidate epoch (control database).

Gates in ``v2_validating`` serve nothing: every production V2 write takes
``connectors.serving.gates.serving_lock``, which requires ``v2_serving`` and an ``active`` epoch, and V1
reads its own barriers and egress denial. The epoch stays ``verified``; no gate points at it.
Resumable and idempotent: a rerun finds gates ``v2_validating`` and lanes already present.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import transaction

from connectors.contracts.ordering import encode_position
from connectors.models import AccountServingGate, OrderingLane, ServingEpoch
from connectors.serving.epoch import epoch_recheck_for_activation, epoch_verify
from connectors.serving.gates import gate_transition
from connectors.store import AccountServingGateStore, OrderingLaneStore, ServingEpochStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.scope import OrgScope

from . import reasons
from .decision import decision_open
from .models import OrderingBaseline, V1RestorePoint, V1ShutdownCertificate
from .services import CutoverRefused, _evidence
from .v1_shutdown import attempt_certificate

FP_AFTER_GATES = failpoints.declare("cutover.validate.after_gates")


@dataclass
class ValidateReport:
    """``epoch_id``/``epoch_digest``: the verified candidate; ``gates``: accounts now ``v2_validating``;
    ``lanes``: OrderingLanes of the candidate initialized from baselines; ``decision``: its state."""

    attempt_key: str
    epoch_id: int
    epoch_digest: str
    gates: list[str]
    lanes: int
    decision: str
    already: bool


def lane_values(baseline: OrderingBaseline) -> dict:
    """The OrderingLane columns a certified baseline starts: partition key as V2 admission computes it,
    ``high_water_position`` the V1 high-water in SourcePosition bytes (``v1_high_water``) or none
    (``provider_snapshot_barrier``: the frozen cursor bytes stay the lane's ``baseline_position``)."""
    position = None if baseline.position is None else bytes(baseline.position)
    if baseline.origin == "v1_high_water":
        *typed, tie = json.loads(position)
        high_water = encode_position(list(typed), str(tie))
        baseline_position = high_water
    else:
        high_water, baseline_position = None, position
    partition_key = digest_v2("connectors.ordering-partition", [
        ("route_key", baseline.route_key), ("partition", canonical_json.dumps(baseline.partition))]).hexdigest
    return {"account_key": baseline.account_key, "route_key": baseline.route_key, "partition_key": partition_key,
            "partition": baseline.partition, "high_water_position": high_water,
            "baseline_position": baseline_position, "baseline_origin": baseline.origin}


def _preconditions(org: OrgScope, attempt_key: str) -> tuple:
    attempt_key, certificate = attempt_certificate(org, attempt_key)
    shutdown = V1ShutdownCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    point = V1RestorePoint.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if shutdown is None or point is None:
        missing = "V1ShutdownCertificate" if shutdown is None else "V1RestorePoint"
        raise CutoverRefused(f"attempt {attempt_key} has no {missing}: run cutover certify and cutover restore-point "
                             "first")
    if point.certificate_digest != shutdown.digest:
        raise CutoverRefused(f"the V1RestorePoint of {attempt_key} binds another shutdown certificate")
    return attempt_key, certificate, shutdown, point


def _conformance(org: OrgScope, attempt_key: str, certificate, epoch: ServingEpoch,
                 gates: list[AccountServingGate]) -> list[str]:
    problems = []
    if int(epoch.pk) != int(certificate.epoch_id) or epoch.digest != certificate.epoch_digest:
        problems.append(f"epoch {epoch.pk} is not the certified epoch {certificate.epoch_id}")
    accounts = {a["account_key"]: a for a in epoch.document["accounts"]}
    if set(accounts) != {g.account_key for g in gates}:
        problems.append("the candidate's account set differs from the frozen gate set")
    document = json.loads(bytes(certificate.document))
    for route in document.get("routes", []):
        if route["route_key"] not in accounts.get(route["account_key"], {}).get("routes", {}):
            problems.append(f"route {route['account_key']}/{route['route_key']} is not in the candidate")
    for baseline in OrderingBaseline.objects.filter(org_id=org.org_id, attempt_key=attempt_key):
        route = accounts.get(baseline.account_key, {}).get("routes", {}).get(baseline.route_key)
        if route is None:
            problems.append(f"baseline route {baseline.account_key}/{baseline.route_key} is not in the candidate")
        elif baseline.ordering_digest and route["ordering_digest"] != baseline.ordering_digest:
            problems.append(f"route {baseline.account_key}/{baseline.route_key}: the candidate's ordering contract "
                            "differs from the certified baseline's")
    return problems


def cutover_validate(*, org: OrgScope, attempt_key: str) -> ValidateReport:
    """Validate the certified V2 candidate of ``attempt_key`` and move every frozen gate to ``v2_validating``.

    Returns:
        The :class:`ValidateReport`; ``already`` when every gate was ``v2_validating`` before.

    Raises:
        InvalidIdentity: ``attempt_key`` is not canonical (before SQL).
        CertificateMissing: no readiness certificate for the attempt.
        CutoverRefused: no V1ShutdownCertificate or V1RestorePoint, a gate outside ``v1_drained`` /
            ``v2_validating``, or a conformance problem (the gates stay where they were).
        EpochVerificationFailed: an owner of the candidate is absent or changed (the epoch is rejected;
            the service stays offline: restore it).
        EpochVerificationDeferred: an owner could not be read now (run it again).

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 7; proof S003-RP-44.
    """
    attempt_key, certificate, shutdown, point = _preconditions(org, attempt_key)
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    wrong = [f"{g.account_key}={g.state}" for g in gates if g.state not in ("v1_drained", "v2_validating")]
    if not gates or wrong:
        raise CutoverRefused(f"validate needs every gate v1_drained (or v2_validating on a rerun); found "
                             f"{', '.join(wrong) or 'no gates'}")
    already = all(g.state == "v2_validating" for g in gates)
    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=certificate.epoch_id)
    if epoch.state == "prepared":
        epoch = epoch_verify(org=org, epoch_id=epoch.pk)
    elif epoch.state == "verified":
        epoch_recheck_for_activation(org=org, epoch=epoch)
    else:
        raise CutoverRefused(f"the certified candidate epoch {epoch.pk} is {epoch.state}, not prepared or verified")
    problems = _conformance(org, attempt_key, certificate, epoch, gates)
    if problems:
        raise CutoverRefused("candidate conformance failed: " + "; ".join(problems))

    baselines = list(OrderingBaseline.objects.filter(org_id=org.org_id, attempt_key=attempt_key).order_by("id"))
    proof_payload = {"epoch_id": int(epoch.pk), "epoch_digest": epoch.digest, "restore_point_id": int(point.pk),
                     "restore_manifest_digest": point.manifest_digest, "shutdown_certificate": shutdown.digest}
    lanes = 0
    with transaction.atomic(durable=True):
        locked_gates = AccountServingGateStore.lock_all(org.org_id)
        locked_epoch = ServingEpochStore.lock(org.org_id, epoch.pk)
        if locked_epoch.state != "verified" or locked_epoch.digest != epoch.digest:
            raise CutoverRefused(f"epoch {epoch.pk} moved to {locked_epoch.state} during validation; run it again")
        for gate in locked_gates:
            if gate.state == "v1_drained":
                proof = _evidence(org, attempt_key, "v2_validation", gate.account_key, proof_payload)
                gate_transition(gate=gate, dst="v2_validating", evidence=proof, reason_code=reasons.CUTOVER_IN_PROGRESS)
            elif gate.state != "v2_validating":
                raise CutoverRefused(f"gate {gate.account_key} is {gate.state}")
        for baseline in baselines:
            values = lane_values(baseline)
            if OrderingLane.objects.filter(epoch=epoch, route_key=values["route_key"],
                                           partition_key=values["partition_key"]).exists():
                continue
            OrderingLaneStore.create(org_id=org.org_id, epoch=locked_epoch, state="open", **values)
            lanes += 1
    failpoints.hit(FP_AFTER_GATES)
    decision = decision_open(org_id=org.org_id, attempt_key=attempt_key, epoch_id=epoch.pk, epoch_digest=epoch.digest)
    if decision.epoch_id is not None and int(decision.epoch_id) != int(epoch.pk):
        raise CutoverRefused(f"the cutover decision of {attempt_key} names epoch {decision.epoch_id}, not {epoch.pk}")
    total = OrderingLane.objects.filter(org_id=org.org_id, epoch=epoch).count()
    return ValidateReport(attempt_key, int(epoch.pk), epoch.digest, [g.account_key for g in gates], total,
                          decision.state, already and lanes == 0)
