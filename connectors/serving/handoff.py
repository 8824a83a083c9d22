"""Halt, OrderingHandoff, successor activation and predecessor resume.

Seed 003 "State machines" (AccountServingGate ``v2_serving -> halting_v2 ->
v2_halted``, ``v2_halted -> v2_serving``), "Durable source ordering" (the
OrderingHandoff paragraphs) and "Generation and replay" (successor activation,
resume before the first handoff, forward-only recovery after it).

The only supported successor protocol is the planned offline
``requires_drain`` transition:

1. :func:`halt_begin` moves the org's exhaustive gate set
   ``v2_serving -> halting_v2`` in one transaction, once the continuation work
   that needs a serving gate has drained; :func:`halt_try_complete` moves each
   gate ``halting_v2 -> v2_halted`` only when its open DispatchPermit set is
   empty and the account's predecessor work is terminal, and otherwise keeps
   it halting with the reason code saying why.
2. :func:`handoff_stage` runs one OrderingHandoff transaction per predecessor
   lane: it locks the lane, proves no active or nonterminal execution,
   freezes the lane (``open -> handed_off``) with its final high-water,
   comparator and partition contract, and stages the successor lane with that
   exact high-water as its immutable baseline.
3. :func:`successor_activate` is one transaction: every gate, the predecessor
   and successor epochs, every lane of both and every required handoff are
   locked and byte-compared; the predecessor goes ``active -> draining``, the
   successor ``verified -> active``, the handoffs ``frozen -> activated`` and
   every gate ``v2_halted -> v2_serving`` on the successor with a new fence.
4. :func:`predecessor_resume` returns every gate ``v2_halted -> v2_serving``
   on the predecessor only while no OrderingHandoff of that predecessor exists.

Every transaction that reads or changes the gate set locks every gate of the
org first (ascending id), so halting, Permit acquisition, handoff, activation
and resume serialize on the same rows (ARCHITECTURE.md section 6 lock order:
gates -> epochs -> lanes -> handoffs).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.apps import apps
from django.db import transaction

from connectors import reasons
from connectors.models import (
    AccountServingGate,
    DispatchPermit,
    Execution,
    OrderingHandoff,
    OrderingLane,
    PackGeneration,
    RemoteEffect,
    ServingEpoch,
)
from connectors.serving.gates import gate_transition
from connectors.store import AccountServingGateStore, OrderingHandoffStore, OrderingLaneStore, ServingEpochStore
from nexusflow.kernel import canonical_json, failpoints, locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.scope import OrgScope

SEED = 'Seed 003, "Generation and replay" and "Durable source ordering"'

#: The one successor transition class seed 003 supports (proof S003-RP-52).
REQUIRES_DRAIN = "requires_drain"
SUPPORTED_TRANSITION_CLASSES = frozenset({REQUIRES_DRAIN})

FP_HANDOFF_BEFORE_COMMIT = failpoints.declare("handoff.before_commit")
FP_ACTIVATION_BEFORE_COMMIT = failpoints.declare("successor.activation_before_commit")
FP_ACTIVATION_AFTER_COMMIT = failpoints.declare("successor.activation_after_commit")

OPEN_PERMIT_STATES = ("granted", "sending")
NONTERMINAL_EXECUTION_STATES = ("ready", "waiting_dependency")
#: RemoteEffect states that need a serving gate to move on (a new grant or a reconciliation repeat).
EFFECTS_NEEDING_SERVING = ("prepared", "uncertain")
#: RemoteEffect states that finish through Permit settlement or finalization, which need no serving gate.
EFFECTS_IN_FLIGHT = ("dispatching", "remote_confirmed")


class HandoffRefused(NexusError):
    """The gate set, epochs or lanes are not in a state the requested step needs."""

    code = "handoff_refused"


class HaltRefused(HandoffRefused):
    code = "halt_refused"


class TransitionClassUnsupported(HandoffRefused):
    code = "transition_class_unsupported"


class OrderingContractChanged(HandoffRefused):
    code = "ordering_contract_changed"


class ResumeRefused(HandoffRefused):
    code = "resume_refused"


class UnknownEpoch(HandoffRefused):
    code = "unknown_epoch"


class UnknownOrg(HandoffRefused):
    code = "unknown_org"


# --- the cutover coordinator's hook ----------------------------------------------
def coordinator_barriers(*, org: OrgScope, stage: str, successor: ServingEpoch | None = None) -> list[str]:
    """Return what blocks ``stage`` on the cutover coordinator's side (empty: nothing blocks).

    The one place where later issues add the whole-service owner barriers
    (live ingress, replay, root outbound authoring) and the
    ServingPublicationBarrierSet of seed 003 "Generation and replay". It runs
    inside the transaction of each step, after the gates are locked.

    Args:
        stage: ``"halt"``, ``"handoff"``, ``"activate"`` or ``"resume"``.
        successor: the successor epoch of ``handoff`` / ``activate``.

    Returns:
        Human-readable problems; any problem refuses the step with
        :class:`HandoffRefused`. No barrier owner exists yet, so nothing blocks.
    """
    return []


def require_transition_class(transition_class: str, compatibility_evidence: object = None) -> None:
    """Refuse every successor transition class other than ``requires_drain``.

    The supplied compatibility evidence is never read: no evidence makes
    another class acceptable (seed 003 "Required proof", S003-RP-52).

    Raises:
        TransitionClassUnsupported: ``transition_class`` is not ``requires_drain``.
    """
    if transition_class not in SUPPORTED_TRANSITION_CLASSES:
        raise TransitionClassUnsupported(
            f"successor transition class {transition_class!r} is not supported; only {REQUIRES_DRAIN!r} is "
            "(enabling another class needs its own state machine, gate/fence, schema and crash proofs)")


# --- inventory -------------------------------------------------------------------
@dataclass(frozen=True)
class PredecessorInventory:
    """Counts of one account's predecessor work that is not terminal yet.

    Attributes:
        executions: Executions of the account under the gate's epoch in
            ``ready`` / ``waiting_dependency``.
        windows: open ProjectionWindows of the account's epoch.
        outbox_messages: undelivered Runtime outbox messages of commands for the account.
        effects_needing_serving: RemoteEffects of the account in ``prepared`` / ``uncertain``.
        effects_in_flight: RemoteEffects of the account in ``dispatching`` / ``remote_confirmed``.
        open_permits: DispatchPermits of the gate in ``granted`` / ``sending``.
        receipts: transport Receipts of the account's epoch still lacking children
            (a crash between the two admission steps); only a serving gate
            materializes them, so they must finish before the epoch stops serving.
    """

    executions: int
    windows: int
    outbox_messages: int
    effects_needing_serving: int
    effects_in_flight: int
    open_permits: int
    receipts: int = 0

    @property
    def needs_serving(self) -> int:
        """Work that can only drain while the gate still serves (it blocks :func:`halt_begin`)."""
        return self.executions + self.windows + self.outbox_messages + self.effects_needing_serving + self.receipts

    @property
    def drained(self) -> bool:
        return self.needs_serving == 0 and self.effects_in_flight == 0 and self.open_permits == 0

    def as_evidence(self) -> dict:
        return {"executions": self.executions, "windows": self.windows, "outbox_messages": self.outbox_messages,
                "effects_needing_serving": self.effects_needing_serving,
                "effects_in_flight": self.effects_in_flight, "open_permits": self.open_permits,
                "receipts": self.receipts}


def _open_windows(org_id: str, account_key: str, epoch_id) -> int:
    """Open ProjectionWindows of the account's epoch; 0 while the window model does not exist."""
    try:
        model = apps.get_model("connectors", "ProjectionWindow")
    except LookupError:
        return 0
    names = {f.name for f in model._meta.get_fields()}
    qs = model.objects.filter(org_id=org_id, state="open")
    if "epoch" in names:
        qs = qs.filter(epoch_id=epoch_id)
    if "account_key" in names:
        qs = qs.filter(account_key=account_key)
    return qs.count()


def predecessor_inventory(gate: AccountServingGate) -> PredecessorInventory:
    """Count the nonterminal predecessor work of ``gate``'s account (non-locking reads).

    Called inside a transaction that holds the gate lock: admission, claims,
    outbound authoring and Permit acquisition of the account lock the same
    gate, so none of them can add work while the count is taken.
    """
    from connectors.selectors import partial_receipts_count
    from runtime_outbox.messages import COMMAND_FAMILIES
    from runtime_outbox.models import OutboxMessage

    org_id, account_key = gate.org_id, gate.account_key
    effects = RemoteEffect.objects.filter(org_id=org_id, account_key=account_key)
    return PredecessorInventory(
        executions=Execution.objects.filter(
            org_id=org_id, projection__event__account_key=account_key, projection__event__epoch_id=gate.epoch_id,
            state__in=NONTERMINAL_EXECUTION_STATES).count(),
        windows=_open_windows(org_id, account_key, gate.epoch_id),
        outbox_messages=OutboxMessage.objects.filter(org_id=org_id, state="pending", family__in=COMMAND_FAMILIES,
                                                     command__account_key=account_key).count(),
        effects_needing_serving=effects.filter(state__in=EFFECTS_NEEDING_SERVING).count(),
        effects_in_flight=effects.filter(state__in=EFFECTS_IN_FLIGHT).count(),
        open_permits=DispatchPermit.objects.filter(org_id=org_id, gate_id=gate.pk,
                                                   state__in=OPEN_PERMIT_STATES).count(),
        receipts=partial_receipts_count(org_id=org_id, account_key=account_key, epoch_id=gate.epoch_id)
        if gate.epoch_id is not None else 0,
    )


# --- halt ------------------------------------------------------------------------
@dataclass
class HaltReport:
    """``gates``: ``{account_key: (state, reason_code)}`` after the step."""

    gates: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def all_halted(self) -> bool:
        return bool(self.gates) and all(state == "v2_halted" for state, _ in self.gates.values())


def _lock_gate_set(org: OrgScope) -> list[AccountServingGate]:
    gates = AccountServingGateStore.lock_all(org.org_id)
    if not gates:
        raise UnknownOrg(f"org {org.org_id} has no accounts")
    return gates


def _single_epoch(gates: list[AccountServingGate]) -> ServingEpoch.Id:
    epochs = {g.epoch_id for g in gates}
    if len(epochs) != 1 or None in epochs:
        raise HandoffRefused("the gate set does not name one serving epoch: "
                             + ", ".join(f"{g.account_key}->{g.epoch_id}" for g in gates))
    return next(iter(epochs))


def _refuse_if_blocked(org: OrgScope, stage: str, successor: ServingEpoch | None = None) -> None:
    problems = coordinator_barriers(org=org, stage=stage, successor=successor)
    if problems:
        raise HandoffRefused(f"{stage} is blocked: " + "; ".join(problems))


def halt_begin(*, org: OrgScope, force: bool = False) -> HaltReport:
    """Move every ``v2_serving`` gate of ``org`` to ``halting_v2`` in one transaction.

    Seed 003: a planned successor switch first drains continuation work under
    the serving predecessor; only then may the gate set enter ``halting_v2``.
    Work that needs a serving gate to finish (ready Executions, open windows,
    undelivered outbox messages, ``prepared`` / ``uncertain`` effects) refuses
    the halt unless ``force``; in-flight effects and open Permits may finish
    while halting. Gates already halting or halted are left as they are.

    Args:
        force: halt even though serving-only work is pending. That work can
            no longer drain (it needs a serving gate), so the gate stays
            ``halting_v2`` until it reaches a terminal decision by other
            means; the machine has no way back from ``halting_v2``.

    Returns:
        The gate states after the transaction.

    Raises:
        HandoffRefused: no accounts, gates on different epochs, a gate in a V1
            or validating state, or a coordinator barrier blocks.
        HaltRefused (``halt_refused``): serving-only work is pending and not ``force``.
    """
    with transaction.atomic(durable=True):
        gates = _lock_gate_set(org)
        bad = [f"{g.account_key}={g.state}" for g in gates if g.state not in ("v2_serving", "halting_v2", "v2_halted")]
        if bad:
            raise HandoffRefused(f"gates not serving V2: {', '.join(bad)}")
        epoch = ServingEpochStore.lock(org.org_id, _single_epoch(gates))
        if epoch.state != "active":
            raise HandoffRefused(f"epoch {epoch.pk} is {epoch.state}, not active")
        _refuse_if_blocked(org, "halt")
        serving = [g for g in gates if g.state == "v2_serving"]
        inventories = {g.account_key: predecessor_inventory(g) for g in serving}
        pending = {k: inv.as_evidence() for k, inv in inventories.items() if inv.needs_serving}
        if pending and not force:
            raise HaltRefused(f"predecessor work still needs serving gates; drain it first: {pending}")
        report = HaltReport()
        for gate in gates:
            if gate.state == "v2_serving":
                evidence = {"step": "halt_begin", "epoch_id": int(epoch.pk), "epoch_digest": epoch.digest,
                            "inventory": inventories[gate.account_key].as_evidence(), "forced": bool(force)}
                gate = gate_transition(gate=gate, dst="halting_v2", evidence=evidence,
                                       reason_code=reasons.HALTED_FOR_SUCCESSOR)
            report.gates[gate.account_key] = (gate.state, gate.reason_code)
        return report


def halt_try_complete(*, org: OrgScope) -> HaltReport:
    """Move each ``halting_v2`` gate of ``org`` to ``v2_halted`` when its account is drained.

    ``halting_v2 -> v2_halted`` locks the same gate row Permit acquisition
    locks and succeeds only when the gate's open DispatchPermit set is empty
    and the account's predecessor work is terminal (seed 003 "State
    machines"); a gate that cannot halt yet keeps ``halting_v2`` with reason
    ``halt_waiting_open_permits`` or ``halt_waiting_predecessor_work``.

    Raises:
        HandoffRefused: no accounts.
    """
    with transaction.atomic(durable=True):
        gates = _lock_gate_set(org)
        report = HaltReport()
        for gate in gates:
            if gate.state == "halting_v2":
                inventory = predecessor_inventory(gate)
                if inventory.drained:
                    evidence = {"step": "halt_complete", "epoch_id": int(gate.epoch_id),
                                "epoch_digest": gate.epoch_digest, "inventory": inventory.as_evidence()}
                    gate = gate_transition(gate=gate, dst="v2_halted", evidence=evidence,
                                           reason_code=reasons.HALTED_FOR_SUCCESSOR)
                else:
                    reason = (reasons.HALT_WAITING_OPEN_PERMITS if inventory.open_permits
                              else reasons.HALT_WAITING_PREDECESSOR_WORK)
                    if gate.reason_code != reason:
                        AccountServingGateStore.touch(org_id=org.org_id, pk=gate.pk, state=gate.state,
                                                      version=gate.version, set_fields={"reason_code": reason})
                        gate = AccountServingGate.objects.get(org_id=org.org_id, pk=gate.pk)
            report.gates[gate.account_key] = (gate.state, gate.reason_code)
        return report


# --- ordering derivation -----------------------------------------------------------
def _epoch_account(epoch: ServingEpoch, account_key: str) -> dict | None:
    return next((a for a in epoch.document.get("accounts", []) if a.get("account_key") == account_key), None)


def route_ordering_derivation(epoch: ServingEpoch, account_key: str, route_key: str) -> dict | None:
    """The frozen comparator and partition derivation of one route in ``epoch``.

    Returns ``None`` when ``epoch`` does not enable the route for the account.
    The derivation is everything that decides a lane's partition key and the
    order of its position bytes: the ordering contract's kind, partition,
    position and tie-breaker fields, comparator version and successor rule,
    the per-kind partition overrides, and the SourceEventKey fields that
    close the position order (``connectors/inbound/admission.py``).
    """
    account = _epoch_account(epoch, account_key)
    if account is None or route_key not in account.get("routes", {}):
        return None
    pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
    route = next((r for r in pack.document.get("inbound_routes", []) if r.get("route_key") == route_key), None)
    if route is None:
        return None
    ordering = route.get("ordering", {})
    return {
        "contract": ordering.get("contract"),
        "comparator_version": ordering.get("comparator_version"),
        "partition": ordering.get("partition"),
        "position": ordering.get("position"),
        "tie_breaker": ordering.get("tie_breaker"),
        "successor": ordering.get("successor"),
        "kind_partitions": {kind: spec.get("partition") for kind, spec in sorted(route.get("kinds", {}).items())},
        "source_event_key": route.get("source_event_key"),
    }


def derivation_digest(derivation: dict) -> str:
    return digest_v2("connectors.ordering-derivation", [("derivation", canonical_json.dumps(derivation))]).hexdigest


def ordering_transformation(predecessor: dict, successor: dict) -> dict | None:
    """The declared total L1 transformation plus snapshot barrier between two derivations, if any.

    Seed 003: a changed comparator or partition derivation needs a total,
    deterministic L1 transformation and a provider snapshot barrier covering
    every successor partition. No pack declares one yet, so this returns
    ``None`` and a changed derivation is refused.
    """
    return None


def handoff_digest(*, org_id: str, predecessor: ServingEpoch, successor: ServingEpoch, account_key: str,
                   route_key: str, partition_key: str, high_water: bytes | None, ordering_digest: str,
                   transition_class: str, successor_lane_id) -> str:
    """Digest of every frozen column of one OrderingHandoff (profile v2)."""
    return digest_v2("connectors.ordering-handoff", [
        ("org_id", org_id), ("predecessor_epoch_id", int(predecessor.pk)),
        ("predecessor_epoch_digest", predecessor.digest), ("successor_epoch_id", int(successor.pk)),
        ("successor_epoch_digest", successor.digest), ("account_key", account_key), ("route_key", route_key),
        ("partition_key", partition_key), ("high_water", high_water), ("ordering_digest", ordering_digest),
        ("transition_class", transition_class),
        ("successor_lane_id", None if successor_lane_id is None else int(successor_lane_id)),
    ]).hexdigest


def _bytes(value) -> bytes | None:
    return None if value is None else bytes(value)


# --- handoff -----------------------------------------------------------------------
@dataclass
class HandoffReport:
    predecessor_epoch_id: int
    successor_epoch_id: int
    handed_off: list[int] = field(default_factory=list)
    already: list[int] = field(default_factory=list)


def _halted_set(org: OrgScope, gates: list[AccountServingGate],
                error: type[HandoffRefused] = HandoffRefused) -> ServingEpoch.Id:
    not_halted = [f"{g.account_key}={g.state}" for g in gates if g.state != "v2_halted"]
    if not_halted:
        raise error(f"every gate must be v2_halted first: {', '.join(not_halted)}")
    return _single_epoch(gates)


def _lock_epochs(org: OrgScope, predecessor_id, successor_id) -> tuple[ServingEpoch, ServingEpoch]:
    if int(predecessor_id) == int(successor_id):
        raise HandoffRefused(f"epoch {successor_id} is the predecessor itself")
    predecessor, successor = locks.acquire([locks.store_resource(ServingEpochStore, org.org_id, predecessor_id),
                                            locks.store_resource(ServingEpochStore, org.org_id, successor_id)])
    return predecessor, successor


def _successor_id(org: OrgScope, successor_id) -> ServingEpoch.Id:
    successor_id = require_id(successor_id, ServingEpoch, field="successor")
    if not ServingEpoch.objects.filter(org_id=org.org_id, pk=successor_id).exists():
        raise UnknownEpoch(f"org {org.org_id} has no epoch {successor_id}")
    return successor_id


def handoff_stage(*, org: OrgScope, successor_id, transition_class: str = REQUIRES_DRAIN,
                  compatibility_evidence: object = None) -> HandoffReport:
    """Freeze every predecessor lane and stage its successor lane, one OrderingHandoff each.

    One transaction per predecessor lane locks every gate (all ``v2_halted``
    on the predecessor), the predecessor (``active``) and successor
    (``verified``) epochs and the lane; proves the lane has no active or
    nonterminal Execution; moves it ``open -> handed_off`` (fenced on its
    version and ``active_execution_id IS NULL``, so a completion that
    committed first is included and one that did not yet commit can no longer
    advance it); creates the successor lane with ``high_water_position =
    baseline_position =`` the frozen high-water and ``baseline_origin =
    "handoff"``; and inserts the ``frozen`` OrderingHandoff. A lane already
    frozen for an earlier successor keeps its immutable high-water: the
    earlier successor's frozen handoff becomes ``abandoned`` and the new one
    cites it. Repeating the call is a no-op for lanes already handed off to
    this successor.

    Args:
        successor_id: the verified successor ``ServingEpoch.Id``.
        transition_class: must be ``requires_drain``.
        compatibility_evidence: ignored; no evidence enables another class.

    Raises:
        TransitionClassUnsupported: any other transition class (before any read).
        InvalidIdentity: ``successor_id`` is an id of another model.
        UnknownEpoch: the org has no such epoch.
        HandoffRefused: gates not all ``v2_halted`` on one
            active predecessor, successor not ``verified``, nonterminal work on
            a lane, or a coordinator barrier blocks.
        OrderingContractChanged: the successor changes a route's comparator or
            partition derivation without a declared transformation and barrier.

    Seed 003 "Durable source ordering" (OrderingHandoff) and "Generation and replay".
    """
    require_transition_class(transition_class, compatibility_evidence)
    successor_id = _successor_id(org, successor_id)
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id))
    predecessor_id = _halted_set(org, gates) if gates else None
    if predecessor_id is None:
        raise UnknownOrg(f"org {org.org_id} has no accounts")
    report = HandoffReport(int(predecessor_id), int(successor_id))
    lane_ids = list(OrderingLane.objects.filter(org_id=org.org_id, epoch_id=predecessor_id)
                    .order_by("id").values_list("id", flat=True))
    for lane_id in lane_ids:
        created = _handoff_one(org, predecessor_id, successor_id, lane_id, transition_class)
        (report.handed_off if created else report.already).append(int(lane_id))
    return report


def _handoff_one(org: OrgScope, predecessor_id, successor_id, lane_id, transition_class: str) -> bool:
    org_id = org.org_id
    with transaction.atomic(durable=True):
        gates = _lock_gate_set(org)
        if _halted_set(org, gates) != predecessor_id:
            raise HandoffRefused("the gate set moved to another epoch")
        predecessor, successor = _lock_epochs(org, predecessor_id, successor_id)
        if predecessor.state != "active":
            raise HandoffRefused(f"predecessor epoch {predecessor.pk} is {predecessor.state}, not active")
        if successor.state != "verified":
            raise HandoffRefused(f"successor epoch {successor.pk} is {successor.state}, not verified")
        _refuse_if_blocked(org, "handoff", successor)
        lane = OrderingLaneStore.lock(org_id, lane_id)
        mine = OrderingHandoff.objects.filter(org_id=org_id, predecessor_epoch_id=predecessor.pk,
                                              successor_epoch_id=successor.pk, predecessor_lane_id=lane.pk).first()
        if mine is not None and mine.state == "abandoned":
            raise HandoffRefused(f"the handoff of lane {lane.pk} to epoch {successor.pk} was abandoned for a later "
                                 "successor; verify a new successor instead")
        if mine is not None:
            return False
        if lane.active_execution_id is not None or Execution.objects.filter(
                org_id=org_id, lane_id=lane.pk, state__in=NONTERMINAL_EXECUTION_STATES).exists():
            raise HandoffRefused(f"lane {lane.pk} still has an active or nonterminal execution")
        frozen = route_ordering_derivation(predecessor, lane.account_key, lane.route_key)
        if frozen is None:
            raise HandoffRefused(f"lane {lane.pk}: route {lane.route_key} is not in its own epoch")
        ahead = route_ordering_derivation(successor, lane.account_key, lane.route_key)
        ordering_digest = derivation_digest(frozen)
        if ahead is not None and derivation_digest(ahead) != ordering_digest \
                and ordering_transformation(frozen, ahead) is None:
            raise OrderingContractChanged(
                f"route {lane.account_key}/{lane.route_key}: the successor changes the comparator or partition "
                "derivation and no total L1 transformation with a snapshot barrier is declared")
        high_water = _bytes(lane.high_water_position)
        cites = None
        if lane.state == "open":
            OrderingLaneStore.transition(org_id=org_id, pk=lane.pk, src="open", dst="handed_off",
                                         version=lane.version, fences={"active_execution_id": None})
        else:
            # Frozen by an earlier successor attempt: its high-water is immutable; that attempt is abandoned.
            earlier = OrderingHandoffStore.lock_all(org_id, predecessor_lane_id=lane.pk)
            if any(_bytes(h.high_water_position) != high_water for h in earlier):
                raise HandoffRefused(f"lane {lane.pk}: frozen high-water differs from its earlier handoff")
            for handoff in earlier:
                if handoff.state == "frozen":
                    OrderingHandoffStore.transition(org_id=org_id, pk=handoff.pk, src="frozen", dst="abandoned",
                                                    version=handoff.version)
            cites = earlier[-1].pk if earlier else None
        successor_lane = None
        if ahead is not None:
            successor_lane = OrderingLane.objects.filter(org_id=org_id, epoch_id=successor.pk,
                                                         route_key=lane.route_key,
                                                         partition_key=lane.partition_key).first()
            if successor_lane is None:
                successor_lane = OrderingLaneStore.create(
                    org_id=org_id, epoch=successor, account_key=lane.account_key, route_key=lane.route_key,
                    partition_key=lane.partition_key, partition=lane.partition, state="open",
                    high_water_position=high_water, baseline_position=high_water, baseline_origin="handoff")
            elif (_bytes(successor_lane.baseline_position) != high_water or successor_lane.baseline_origin != "handoff"
                  or _bytes(successor_lane.high_water_position) != high_water):
                raise HandoffRefused(f"successor lane {successor_lane.pk} differs from the frozen high-water")
        OrderingHandoffStore.create(
            org_id=org_id, predecessor_epoch=predecessor, successor_epoch=successor, account_key=lane.account_key,
            route_key=lane.route_key, partition_key=lane.partition_key, partition=lane.partition,
            predecessor_lane=lane, successor_lane=successor_lane, high_water_position=high_water, ordering=frozen,
            ordering_digest=ordering_digest, transition_class=transition_class, cites_handoff_id=cites,
            digest=handoff_digest(org_id=org_id, predecessor=predecessor, successor=successor,
                                  account_key=lane.account_key, route_key=lane.route_key,
                                  partition_key=lane.partition_key, high_water=high_water,
                                  ordering_digest=ordering_digest, transition_class=transition_class,
                                  successor_lane_id=successor_lane.pk if successor_lane else None),
            profile_id=PROFILE_V2, state="frozen")
        failpoints.hit(FP_HANDOFF_BEFORE_COMMIT)
        return True


# --- successor activation ----------------------------------------------------------------
@dataclass
class ActivationReport:
    predecessor_epoch_id: int | None
    successor_epoch_id: int
    successor_digest: str
    accounts: list[str]
    handoffs: int
    already_active: bool


def _check_handoffs(org: OrgScope, predecessor: ServingEpoch, successor: ServingEpoch, lanes: list[OrderingLane],
                    handoffs: list[OrderingHandoff]) -> list[str]:
    """Byte-compare every predecessor lane, handoff and staged successor lane; return the mismatches."""
    problems: list[str] = []
    by_lane = {}
    for handoff in handoffs:
        if handoff.predecessor_lane_id in by_lane:
            problems.append(f"lane {handoff.predecessor_lane_id} has two frozen handoffs")
        by_lane[handoff.predecessor_lane_id] = handoff
    rows = {lane.pk: lane for lane in lanes}
    for lane in lanes:
        if lane.epoch_id != predecessor.pk:
            continue
        handoff = by_lane.get(lane.pk)
        if handoff is None:
            problems.append(f"predecessor lane {lane.pk} has no frozen handoff to epoch {successor.pk}")
            continue
        if lane.state != "handed_off" or lane.active_execution_id is not None:
            problems.append(f"predecessor lane {lane.pk} is {lane.state} with active {lane.active_execution_id}")
        high_water = _bytes(handoff.high_water_position)
        if _bytes(lane.high_water_position) != high_water:
            problems.append(f"predecessor lane {lane.pk} high-water moved after its handoff")
        expected = handoff_digest(org_id=org.org_id, predecessor=predecessor, successor=successor,
                                  account_key=handoff.account_key, route_key=handoff.route_key,
                                  partition_key=handoff.partition_key, high_water=high_water,
                                  ordering_digest=handoff.ordering_digest, transition_class=handoff.transition_class,
                                  successor_lane_id=handoff.successor_lane_id)
        if expected != handoff.digest or handoff.transition_class != REQUIRES_DRAIN:
            problems.append(f"handoff {handoff.pk} does not match its digest")
        if (handoff.account_key, handoff.route_key, handoff.partition_key) != \
                (lane.account_key, lane.route_key, lane.partition_key):
            problems.append(f"handoff {handoff.pk} names another lane lineage")
        ahead = route_ordering_derivation(successor, handoff.account_key, handoff.route_key)
        if ahead is None:
            if handoff.successor_lane_id is not None:
                problems.append(f"handoff {handoff.pk} stages a lane for a route the successor does not enable")
            continue
        if derivation_digest(ahead) != handoff.ordering_digest and ordering_transformation(handoff.ordering,
                                                                                           ahead) is None:
            problems.append(f"route {handoff.account_key}/{handoff.route_key}: comparator or partition derivation "
                            "changed without a declared transformation and snapshot barrier")
        staged = rows.get(handoff.successor_lane_id)
        if staged is None or staged.epoch_id != successor.pk:
            problems.append(f"handoff {handoff.pk} has no staged successor lane")
            continue
        if (_bytes(staged.baseline_position) != high_water or _bytes(staged.high_water_position) != high_water
                or staged.baseline_origin != "handoff" or staged.state != "open"
                or staged.active_execution_id is not None
                or (staged.route_key, staged.partition_key) != (handoff.route_key, handoff.partition_key)):
            problems.append(f"successor lane {staged.pk} differs from handoff {handoff.pk}")
    stray = [h.pk for h in handoffs if rows.get(h.predecessor_lane_id) is None]
    if stray:
        problems.append(f"handoffs {stray} name lanes outside the predecessor epoch")
    return problems


def successor_activate(*, org: OrgScope, successor_id, transition_class: str = REQUIRES_DRAIN,
                       compatibility_evidence: object = None) -> ActivationReport:
    """Atomically make the verified successor the serving epoch of every gate.

    One transaction locks every gate (all ``v2_halted`` on the active
    predecessor), both epochs, every lane of both epochs and every frozen
    OrderingHandoff between them; byte-compares each handoff with its frozen
    predecessor lane and staged successor lane; rechecks that no predecessor
    work or Permit is open; then moves the predecessor ``active ->
    draining``, the successor ``verified -> active``, every handoff ``frozen
    -> activated`` and every gate ``v2_halted -> v2_serving`` with the
    successor id, digest and a new fence. After commit the gate set is read
    back. Repeating the call after success reports ``already_active``.

    Args:
        successor_id: the verified successor ``ServingEpoch.Id``.
        transition_class: must be ``requires_drain``.
        compatibility_evidence: ignored; no evidence enables another class.

    Raises:
        TransitionClassUnsupported: any other transition class (before any read).
        InvalidIdentity: ``successor_id`` is an id of another model.
        UnknownEpoch: the org has no such epoch.
        HandoffRefused: gates not all ``v2_halted`` on one active predecessor,
            successor not ``verified``, account set differs from the gate set,
            a missing or mismatching handoff, open predecessor work, or a
            coordinator barrier blocks.

    Seed 003 "State machines" and "Generation and replay" (successor activation).
    """
    require_transition_class(transition_class, compatibility_evidence)
    successor_id = _successor_id(org, successor_id)
    with transaction.atomic(durable=True):
        gates = _lock_gate_set(org)
        if all(g.state == "v2_serving" and g.epoch_id == successor_id for g in gates):
            epoch = ServingEpochStore.lock(org.org_id, successor_id)
            if epoch.state == "active" and all(g.epoch_digest == epoch.digest for g in gates):
                return ActivationReport(None, int(epoch.pk), epoch.digest, [g.account_key for g in gates],
                                        0, True)
        predecessor_id = _halted_set(org, gates)
        predecessor, successor = _lock_epochs(org, predecessor_id, successor_id)
        if predecessor.state != "active":
            raise HandoffRefused(f"predecessor epoch {predecessor.pk} is {predecessor.state}, not active")
        if successor.state != "verified":
            raise HandoffRefused(f"successor epoch {successor.pk} is {successor.state}, not verified")
        accounts = {a["account_key"] for a in successor.document.get("accounts", [])}
        if accounts != {g.account_key for g in gates}:
            raise HandoffRefused("the successor's account set differs from the exhaustive gate set")
        _refuse_if_blocked(org, "activate", successor)
        inventories = {g.account_key: predecessor_inventory(g) for g in gates}
        busy = {key: inv.as_evidence() for key, inv in inventories.items() if not inv.drained}
        if busy:
            raise HandoffRefused(f"predecessor work or Permits are not terminal: {busy}")
        lanes = OrderingLaneStore.lock_all(org.org_id, epoch_id__in=[predecessor.pk, successor.pk])
        handoffs = OrderingHandoffStore.lock_all(org.org_id, predecessor_epoch_id=predecessor.pk,
                                                 successor_epoch_id=successor.pk, state="frozen")
        problems = _check_handoffs(org, predecessor, successor, lanes, handoffs)
        if problems:
            raise HandoffRefused("; ".join(problems))
        ServingEpochStore.transition(org_id=org.org_id, pk=predecessor.pk, src="active", dst="draining",
                                     version=predecessor.version)
        ServingEpochStore.transition(org_id=org.org_id, pk=successor.pk, src="verified", dst="active",
                                     version=successor.version, set_fields={"activated_at": db_now()})
        for handoff in handoffs:
            OrderingHandoffStore.transition(org_id=org.org_id, pk=handoff.pk, src="frozen", dst="activated",
                                            version=handoff.version)
        successor = ServingEpoch.objects.get(org_id=org.org_id, pk=successor.pk)
        evidence = {"step": "successor_activation", "transition_class": transition_class,
                    "predecessor_epoch_id": int(predecessor.pk), "predecessor_epoch_digest": predecessor.digest,
                    "successor_epoch_id": int(successor.pk), "successor_epoch_digest": successor.digest,
                    "handoffs": sorted(int(h.pk) for h in handoffs)}
        for gate in gates:
            gate_transition(gate=gate, dst="v2_serving", evidence=evidence, epoch=successor)
        failpoints.hit(FP_ACTIVATION_BEFORE_COMMIT)
    failpoints.hit(FP_ACTIVATION_AFTER_COMMIT)
    readback = list(AccountServingGate.objects.filter(org_id=org.org_id))
    if any(g.state != "v2_serving" or g.epoch_id != successor.pk or g.epoch_digest != successor.digest
           for g in readback):
        raise HandoffRefused("activation readback does not show every gate serving the successor")
    return ActivationReport(int(predecessor.pk), int(successor.pk), successor.digest,
                            sorted(g.account_key for g in readback), len(handoffs), False)


# --- predecessor resume -------------------------------------------------------------------
@dataclass
class ResumeReport:
    epoch_id: int
    accounts: list[str]


def predecessor_resume(*, org: OrgScope) -> ResumeReport:
    """Return every ``v2_halted`` gate to ``v2_serving`` on the predecessor, only before any handoff.

    One transaction locks every gate (all ``v2_halted`` on one epoch), the
    epoch (``active``) and proves that no OrderingHandoff names it as
    predecessor and none of its lanes is frozen; every gate then serves the
    same epoch again with a new fence. Handoff locks the same gates first, so
    a racing handoff either commits before (and resume fails) or sees the
    gates serving (and fails).

    Raises:
        HandoffRefused: gates not all ``v2_halted`` on one active epoch, or a
            coordinator barrier blocks.
        ResumeRefused (``resume_refused``): an OrderingHandoff of the
            predecessor exists; recovery must activate a successor.

    Seed 003 "Generation and replay" (resume before the first handoff) and
    "State machines" (``v2_halted --no OrderingHandoff committed, abort-->
    v2_serving``).
    """
    with transaction.atomic(durable=True):
        gates = _lock_gate_set(org)
        epoch = ServingEpochStore.lock(org.org_id, _halted_set(org, gates, ResumeRefused))
        if epoch.state != "active":
            raise HandoffRefused(f"epoch {epoch.pk} is {epoch.state}, not active")
        _refuse_if_blocked(org, "resume")
        handoffs = OrderingHandoff.objects.filter(org_id=org.org_id, predecessor_epoch_id=epoch.pk).count()
        frozen = OrderingLane.objects.filter(org_id=org.org_id, epoch_id=epoch.pk).exclude(state="open").count()
        if handoffs or frozen:
            raise ResumeRefused(f"epoch {epoch.pk} has {handoffs} OrderingHandoff(s) and {frozen} frozen lane(s); "
                                "after the first handoff only a successor can be activated")
        evidence = {"step": "predecessor_resume", "epoch_id": int(epoch.pk), "epoch_digest": epoch.digest,
                    "handoffs": 0}
        for gate in gates:
            gate_transition(gate=gate, dst="v2_serving", evidence=evidence, epoch=epoch)
        return ResumeReport(int(epoch.pk), sorted(g.account_key for g in gates))


__all__ = [
    "ActivationReport", "HaltRefused", "HaltReport", "HandoffRefused", "HandoffReport", "OrderingContractChanged",
    "PredecessorInventory", "REQUIRES_DRAIN", "ResumeRefused", "UnknownOrg", "ResumeReport", "TransitionClassUnsupported",
    "UnknownEpoch", "coordinator_barriers", "halt_begin", "halt_try_complete", "handoff_stage", "predecessor_inventory",
    "predecessor_resume", "require_transition_class", "route_ordering_derivation", "successor_activate",
]
