"""Execution claim, Runtime hand-off and fenced completion (seed 003 "Durable source ordering").

A worker calls :func:`execution_try_run_one`:

1. claim (one transaction): lock AccountServingGate -> ServingEpoch ->
   OrderingLane -> Executions; under ``latest_source_position`` pick the
   greatest ready position, record every lower or late one as superseded
   without calling Runtime, append an ExecutionAttempt with a lease;
2. submit the command to Runtime (its own transaction; idempotent by
   command id + ExecutionRef digest);
3. complete (one transaction): lock lane -> execution -> attempt, verify the
   fence, read the Runtime result receipt, mark ``completed`` and advance the
   lane high-water.

No transaction spans the Runtime call.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError, transaction

from connectors import reasons
from connectors.contracts.ordering import expected_successor, sequence_floor, sequence_of
from connectors.inbound.admission import frozen_route
from connectors.inbound.replay import replay_command_facts
from connectors.inbound.windows import window_members
from connectors.models import Event, Execution, ExecutionAttempt, ExecutionDependency, OrderingDecision, OrderingLane
from connectors.selectors import candidate_lanes, dependencies_due, unlaned_executions_ready
from connectors.serving.gates import NotServing, serving_lock
from connectors.store import ExecutionAttemptStore, ExecutionDependencyStore, ExecutionStore, OrderingLaneStore
from connectors.workers import holder_termination_proof
from nexusflow.kernel import failpoints, locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import FenceRejected, StaleVersion
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.logs import log_context
from nexusflow.kernel.models import insert
from nexusflow.kernel.pressure import mutation_admission
from nexusflow.kernel.retry import retry_deadlock_victim
from nexusflow.kernel.rows import fetch_joined, fetch_where, first_row, get_joined, get_row
from runtime_outbox.policy import runtime_policy

log = logging.getLogger(__name__)

FP_AFTER_CLAIM = failpoints.declare("execution.after_claim")
FP_AFTER_RESULT = failpoints.declare("execution.after_runtime_result")


def lease_seconds() -> float:
    return float(os.environ.get("NEXUS_EXECUTION_LEASE_SECONDS", "30"))


@dataclass(frozen=True)
class Claim:
    org_id: str
    execution_id: Execution.Id
    attempt_id: ExecutionAttempt.Id
    lease_token: str
    lane_id: OrderingLane.Id | None
    #: The execution's trace id (``Execution.trace_id``; ``""``: none).
    trace_id: str = ""


def _lease_expired(org_id: str, execution_id: int, now: dt.datetime) -> ExecutionAttempt | None:
    """The active claim's attempt when it can be taken over, else ``None``.

    A claim can be taken over when its lease expired or its holder process is
    proven terminated (it can no longer commit anything).
    """
    started = fetch_where(ExecutionAttempt, {"org_id": org_id, "execution_id": execution_id, "state": "started"},
                          order="`attempt_number` DESC", limit=1)
    attempt = started[0] if started else None
    if attempt is None:
        return ExecutionAttempt(pk=None)
    if attempt.lease_expires_at <= now or holder_termination_proof(attempt.worker_id) is not None:
        return attempt
    return None


def execution_try_claim_one(*, worker_id: str) -> Claim | None:
    """Claim the next claimable Execution of any lane, or an ``order_independent`` one, or return ``None``.

    Raises nothing for contention: a lane another worker holds is skipped.
    """
    now = db_now()
    for org_id, lane_id in candidate_lanes(now):
        lane = first_row(OrderingLane, org_id=org_id, pk=lane_id)
        if lane is None:
            continue
        try:
            claim = _claim_in_lane(lane.org_id, lane.account_key, lane.pk, worker_id)
        except (NotServing, StaleVersion) as exc:
            log.info("claim skipped lane %s: %s", lane_id, exc,
                     extra={"org_id": org_id, "code": getattr(exc, "code", None)})
            continue
        if claim is not None:
            failpoints.hit(FP_AFTER_CLAIM)
            return claim
    for org_id, execution_id in unlaned_executions_ready(now):
        try:
            claim = _claim_unlaned(org_id, execution_id, worker_id)
        except (NotServing, StaleVersion) as exc:
            log.info("claim skipped execution %s: %s", execution_id, exc,
                     extra={"org_id": org_id, "execution_id": int(execution_id), "code": getattr(exc, "code", None)})
            continue
        if claim is not None:
            failpoints.hit(FP_AFTER_CLAIM)
            return claim
    return None


def _claim_unlaned(org_id: str, execution_id: int, worker_id: str) -> Claim | None:
    """``order_independent`` bypasses the lane: the Execution row itself is the claim guard."""
    account_key = Event.objects.filter(org_id=org_id, projection__execution__pk=execution_id) \
        .values_list("account_key", flat=True).first()
    if account_key is None:
        return None
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=org_id, account_key=account_key)
        execution = ExecutionStore.lock(org_id, execution_id)
        if execution.state != "ready" or execution.lane_id is not None:
            return None
        if execution.projection.event.epoch_id != ctx.epoch.pk:
            return None
        now = db_now()
        stale = _lease_expired(org_id, execution.pk, now)
        if stale is None:
            return None
        if stale.pk is not None:
            ExecutionAttemptStore.transition(org_id=org_id, pk=stale.pk, src="started", dst="expired",
                                             version=stale.version)
        return _start_attempt(None, execution, worker_id, now, keep_active=True)


def _supersede(lane: OrderingLane, execution: Execution, high_water: bytes | None, winner: Execution | None,
               src: str = "ready") -> None:
    ExecutionStore.transition(org_id=lane.org_id, pk=execution.pk, src=src, dst="superseded",
                              version=execution.version,
                              set_fields={"reason_code": reasons.SUPERSEDED_BY_NEWER_POSITION})
    insert(OrderingDecision, org_id=lane.org_id, lane=lane, execution=execution, decision="superseded",
           high_water_position=high_water, winning_position=bytes(winner.position) if winner else None)


def _claim_in_lane(org_id: str, account_key: str, lane_id: int, worker_id: str) -> Claim | None:
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=org_id, account_key=account_key)
        lane = OrderingLaneStore.lock(org_id, lane_id)
        if lane.epoch_id != ctx.epoch.pk or lane.state != "open":
            return None
        ordering = ctx.account["routes"][lane.route_key]["ordering"]
        now = db_now()
        if lane.active_execution_id is not None:
            stale = _lease_expired(org_id, lane.active_execution_id, now)
            if stale is None:
                return None  # the active claim still holds its lease
            active = ExecutionStore.lock(org_id, lane.active_execution_id)
            if stale.pk is not None:
                ExecutionAttemptStore.transition(org_id=org_id, pk=stale.pk, src="started", dst="expired",
                                                 version=stale.version)
            if active.state == "ready":
                # Same immutable identity is reacquired; a new attempt carries a new lease.
                return _start_attempt(lane, active, worker_id, now, keep_active=True)
            # The lane is still locked by this transaction: keep the row in step
            # instead of locking it again after the Execution (lane ranks first).
            lane.version = OrderingLaneStore.touch(org_id=org_id, pk=lane.pk, state=lane.state,
                                                   version=lane.version, set_fields={"active_execution_id": None})
            lane.active_execution_id = None
        if ordering["contract"] == "strict_source_sequence":
            return _claim_strict(ctx, lane, ordering, worker_id, now)
        ready = ExecutionStore.lock_lane_members(org_id, lane.pk, ("ready",))
        if not ready:
            return None
        settle = ordering.get("settle_seconds", 0)
        if settle and max(e.created_at for e in ready) + dt.timedelta(seconds=settle) > now:
            return None  # the settle window is still open: later positions may arrive
        high_water = bytes(lane.high_water_position) if lane.high_water_position is not None else None
        live = [e for e in ready if high_water is None or bytes(e.position) > high_water]
        winner = max(live, key=lambda e: (bytes(e.position), e.pk)) if live else None
        for execution in ready:
            if execution is not winner:
                _supersede(lane, execution, high_water, winner)
        if winner is None:
            return None
        return _start_attempt(lane, winner, worker_id, now, keep_active=False)


def _claim_strict(ctx, lane: OrderingLane, ordering: dict, worker_id: str, now: dt.datetime) -> Claim | None:
    """``strict_source_sequence``: claim only the exact successor; a gap waits without a lease.

    Positions at or below the high-water (byte order: sequence, then
    tie-breaker) are superseded; the items of one source operation share a
    sequence number and run one after another in tie-breaker order. When the exact
    successor is missing, the lowest waiting Execution gets one
    ExecutionDependency with the frozen gap deadline and moves to
    ``waiting_dependency``; it holds no attempt and no lease. A dependency
    whose requirement the lane now meets is satisfied here, under the lane
    lock, so it and its deadline expiry have one result.
    """
    org_id = lane.org_id
    rows = ExecutionStore.lock_lane_members(org_id, lane.pk, ("ready", "waiting_dependency"))
    if not rows:
        return None
    deps = {d.execution_id: d for d in ExecutionDependencyStore.lock_all(
        org_id, lane_id=lane.pk, execution_id__in=[e.pk for e in rows])}
    high_water = bytes(lane.high_water_position) if lane.high_water_position is not None else None
    hw_seq = sequence_of(high_water)
    expected = expected_successor(ordering, high_water)
    live: list[Execution] = []
    for execution in rows:
        if high_water is not None and bytes(execution.position) <= high_water:
            dep = deps.get(execution.pk)
            if dep is not None and dep.state == "waiting":
                ExecutionDependencyStore.transition(org_id=org_id, pk=dep.pk, src="waiting", dst="rejected",
                                                    version=dep.version)
            if execution.state == "waiting_dependency":
                ExecutionStore.transition(org_id=org_id, pk=execution.pk, src="waiting_dependency", dst="ready",
                                          version=execution.version)
                execution.version += 1
            _supersede(lane, execution, high_water, None)
        else:
            live.append(execution)
    if not live:
        return None
    live.sort(key=lambda e: (bytes(e.position), e.pk))
    lowest = live[0]
    dep = deps.get(lowest.pk)
    released = dep is not None and dep.state == "expired" and dep.disposition == "skip"
    # Items of one source operation share a sequence number and differ by tie-breaker: a sibling of
    # the last completed position (same sequence, higher bytes) is claimable like the exact successor.
    seq = sequence_of(lowest.position)
    if seq == expected or (hw_seq is not None and seq == hw_seq) or released:
        if lowest.state == "waiting_dependency":
            if dep.state == "waiting":
                ExecutionDependencyStore.transition(org_id=org_id, pk=dep.pk, src="waiting", dst="satisfied",
                                                    version=dep.version)
            ExecutionStore.transition(org_id=org_id, pk=lowest.pk, src="waiting_dependency", dst="ready",
                                      version=lowest.version)
            lowest.version += 1
        return _start_attempt(lane, lowest, worker_id, now, keep_active=False)
    # A gap: every item of the waiting source operation (same sequence) waits on one frozen deadline.
    gap = ordering["gap"]
    deadline = next((deps[e.pk].deadline_at for e in live if sequence_of(e.position) == seq and e.pk in deps),
                    now + dt.timedelta(seconds=gap["deadline_seconds"]))
    for execution in live:
        if sequence_of(execution.position) != seq or execution.state != "ready" or execution.pk in deps:
            continue
        ExecutionDependencyStore.create(
            org_id=org_id, execution=execution, lane=lane, requirement="source_predecessor",
            required_position=sequence_floor(seq - ordering["successor"]["step"]),
            disposition=gap["disposition"], deadline_at=deadline, state="waiting")
        ExecutionStore.transition(org_id=org_id, pk=execution.pk, src="ready", dst="waiting_dependency",
                                  version=execution.version)
    return None


def dependency_try_expire_one() -> bool:
    """Apply the frozen deadline disposition of one due ExecutionDependency.

    One transaction locks gate -> epoch -> lane -> Execution -> dependency;
    if the lane already reached the requirement the dependency is satisfied
    instead, so satisfy and expire never both happen. ``quarantine`` parks the
    Execution with ``source_sequence_gap``; ``skip`` releases it past the gap
    (the claim then takes it as the lane's next Execution).

    Returns:
        ``True`` if a dependency was resolved.
    """
    for org_id, dep_id in dependencies_due(db_now()):
        dep = ExecutionDependency.objects.filter(org_id=org_id, pk=dep_id).select_related("lane").first()
        if dep is None or dep.lane is None:
            continue
        try:
            with transaction.atomic(durable=True):
                ctx = serving_lock(org_id=org_id, account_key=dep.lane.account_key)
                lane = OrderingLaneStore.lock(org_id, dep.lane_id)
                execution = ExecutionStore.lock(org_id, dep.execution_id)
                locked = ExecutionDependencyStore.lock(org_id, dep.pk)
                if locked.state != "waiting" or locked.deadline_at > db_now():
                    continue
                ordering = ctx.account["routes"][lane.route_key]["ordering"]
                high_water = bytes(lane.high_water_position) if lane.high_water_position is not None else None
                if sequence_of(execution.position) == expected_successor(ordering, high_water):
                    ExecutionDependencyStore.transition(org_id=org_id, pk=locked.pk, src="waiting", dst="satisfied",
                                                        version=locked.version)
                    ExecutionStore.transition(org_id=org_id, pk=execution.pk, src="waiting_dependency", dst="ready",
                                              version=execution.version)
                    return True
                ExecutionDependencyStore.transition(org_id=org_id, pk=locked.pk, src="waiting", dst="expired",
                                                    version=locked.version)
                if locked.disposition == "quarantine":
                    ExecutionStore.transition(org_id=org_id, pk=execution.pk, src="waiting_dependency",
                                              dst="quarantined", version=execution.version,
                                              set_fields={"reason_code": reasons.SOURCE_SEQUENCE_GAP})
                else:
                    ExecutionStore.transition(org_id=org_id, pk=execution.pk, src="waiting_dependency", dst="ready",
                                              version=execution.version)
                    insert(OrderingDecision, org_id=org_id, lane=lane, execution=execution, decision="gap_skipped",
                           high_water_position=high_water, winning_position=bytes(execution.position))
                return True
        except (NotServing, StaleVersion) as exc:
            log.info("dependency %s not resolved: %s", dep_id, exc, extra={"code": getattr(exc, "code", None)})
    return False


def _start_attempt(lane: OrderingLane | None, execution: Execution, worker_id: str, now: dt.datetime,
                   *, keep_active: bool) -> Claim:
    number = ExecutionAttempt.objects.filter(execution=execution).count() + 1
    token = secrets.token_hex(16)
    attempt = ExecutionAttemptStore.create(
        org_id=execution.org_id, execution=execution, attempt_number=number, worker_id=worker_id,
        lease_token=token, lease_expires_at=now + dt.timedelta(seconds=lease_seconds()), state="started")
    if lane is not None and not keep_active:
        OrderingLaneStore.touch(org_id=lane.org_id, pk=lane.pk, state=lane.state, version=lane.version,
                                set_fields={"active_execution_id": execution.pk})
    return Claim(execution.org_id, execution.pk, attempt.pk, token, lane.pk if lane is not None else None,
                 execution.trace_id)


def _event_facts(event: Event) -> dict:
    return {"canonical_kind": event.canonical_kind, "source_locator": event.source_locator,
            "source_event_key": event.source_event_key, "payload": event.payload}


def build_runtime_command(execution: Execution) -> dict:
    """The V2 Runtime command for one Execution: route application block + event facts.

    A window Execution of a ``settle``, ``batch`` or ``grouped`` window also
    carries ``events``: every member's facts in SourcePosition order, which
    Runtime applies in that order in one transaction.
    """
    event: Event = execution.projection.event
    account, route = frozen_route(event.epoch, event.account_key, event.route_key)
    command = {
        "application": route["application"],
        "owner_key": account["owner_key"],
        "account_key": event.account_key,
        "route_key": event.route_key,
        **({"remote_scope": account["remote_scope"]} if account.get("remote_scope") else {}),
        **_event_facts(event),
    }
    # A replay Execution carries its frozen external-effect mode (seed 003 "Replay and external effects").
    command.update(replay_command_facts(event))
    if execution.window_id is not None and execution.window.policy != "latest":
        command["events"] = [_event_facts(member) for member in window_members(execution)]
    return command


def execution_run(claim: Claim) -> bool:
    """Submit the claimed Execution to Runtime and record its completion.

    Returns:
        ``True`` when this claim completed the Execution; ``False`` when its
        fence was lost (another worker owns the Execution now).
    """
    with log_context(org_id=claim.org_id, execution_id=int(claim.execution_id), trace_id=claim.trace_id or None,
                     unit="connector.execution"):
        return _execution_run(claim)


def _execution_run(claim: Claim) -> bool:
    from runtime_outbox.services import application_command_submit

    execution = get_joined(Execution, ("projection__event__epoch",), org_id=claim.org_id, pk=claim.execution_id)
    result = application_command_submit(
        org_id=claim.org_id, command_id=execution.command_id, execution_ref_digest=execution.execution_ref_digest,
        command=build_runtime_command(execution))
    failpoints.hit(FP_AFTER_RESULT)
    try:
        execution_complete(claim, result_id=result.pk, result=result)
    except StaleVersion as exc:
        log.info("completion fenced for execution %s: %s", claim.execution_id, exc,
                 extra={"execution_id": int(claim.execution_id), "code": getattr(exc, "code", None)})
        return False
    return True


@retry_deadlock_victim
def execution_complete(claim: Claim, *, result_id: int, result=None) -> None:
    """Mark the Execution ``completed`` from the Runtime receipt and advance the lane.

    A completion the server rolled back whole (deadlock victim, lock wait timeout) runs again with the
    same claim: every fence is checked again, and the Runtime result is already committed.

    Args:
        result_id: the Runtime ``ApplicationResult`` id (or a plain positive int).
        result: that ApplicationResult as the submission returned it (immutable once committed), so it is
            not read again; without it (or for another id or org) the row is read.

    Raises:
        InvalidIdentity: ``result_id`` is an id of another model (before SQL).
        StaleVersion/FenceRejected: the attempt lost its lease, the lane moved or
            the lane was handed off to a successor epoch (frozen).
        ValueError: the Runtime receipt does not match the Execution.
    """
    from runtime_outbox.models import ApplicationResult

    result_id = require_id(result_id, ApplicationResult, field="result_id")

    with transaction.atomic(durable=True):
        declared = [locks.store_resource(ExecutionStore, claim.org_id, claim.execution_id),
                    locks.store_resource(ExecutionAttemptStore, claim.org_id, claim.attempt_id)]
        if claim.lane_id:
            declared.append(locks.store_resource(OrderingLaneStore, claim.org_id, claim.lane_id))
        execution, attempt, *lane_rows = locks.acquire(declared)
        lane = lane_rows[0] if lane_rows else None
        if attempt.lease_token != claim.lease_token or attempt.state != "started":
            raise StaleVersion(f"attempt {attempt.pk} is no longer the live claim")
        if lane is not None and lane.active_execution_id != execution.pk:
            raise StaleVersion(f"lane {lane.pk} no longer points at execution {execution.pk}")
        if lane is not None and lane.state != "open":
            # Seed 003 "Durable source ordering": no predecessor high-water advances after its OrderingHandoff.
            raise FenceRejected(f"lane {lane.pk} is {lane.state}; its high-water is frozen")
        if result is None or result.pk != result_id or result.org_id != claim.org_id:
            result = get_row(ApplicationResult, {"pk": result_id, "org_id": claim.org_id})
        if result.command_id != execution.command_id or result.execution_ref_digest != execution.execution_ref_digest:
            raise ValueError("Runtime result does not match this execution")
        ExecutionStore.transition(org_id=claim.org_id, pk=execution.pk, src="ready", dst="completed",
                                  version=execution.version,
                                  set_fields={"result_digest": result.result_digest, "runtime_receipt_id": result.pk})
        ExecutionAttemptStore.transition(org_id=claim.org_id, pk=attempt.pk, src="started", dst="completed",
                                         version=attempt.version, fences={"lease_token": claim.lease_token})
        if lane is not None:
            position = bytes(execution.position)
            current = bytes(lane.high_water_position) if lane.high_water_position is not None else None
            OrderingLaneStore.touch(org_id=claim.org_id, pk=lane.pk, state=lane.state, version=lane.version,
                                    set_fields={"active_execution_id": None,
                                                "high_water_position": max(position, current or position)})


def execution_try_run_one(*, worker_id: str) -> bool:
    """Claim and run one Execution. Returns ``True`` if work was done.

    Applying an inbound event is new mutation work: under database pressure (the runtime policy's
    ``pressure`` bounds, :func:`nexusflow.kernel.pressure.mutation_admission`; seed 004 section 16.2) the
    round claims nothing and returns ``False``, so the worker backs off. Recovery of expired claims
    (:func:`execution_try_recover_one`) never asks: work already started finishes.
    """
    if mutation_admission(runtime_policy().pressure):
        return False
    claim = execution_try_claim_one(worker_id=worker_id)
    if claim is None:
        return False
    try:
        execution_run(claim)
    except (OperationalError, InterfaceError):
        # A database failure another worker can be expected to get past (a connection lost, a deadlock
        # retried out): hand the claim back at once. Any other error keeps the lease, which then paces the
        # retries of a command that keeps failing.
        claim_hand_back(claim)
        raise
    return True


def claim_hand_back(claim: Claim) -> bool:
    """End ``claim``'s lease now (the database clock), so the next claim round takes the Execution over.

    Called by the claim's own holder when its unit failed after the claim with a database error: the attempt stays ``started`` with ``lease_expires_at`` set to now, exactly what an expired
    lease looks like, and the takeover path (:func:`_claim_in_lane`, :func:`_lease_expired`) expires it
    and starts a new attempt under the same lane lock; the Runtime result, if one committed, is returned
    again by command id. Without this the lane waited out the whole lease (30 s) while its live holder
    went on with other work. Best effort: when the hand-back itself fails the lease still expires.

    Returns:
        ``True`` when the lease was shortened; ``False`` when the attempt is no longer this live claim or
        the hand-back could not run.

    Seed 003 "Durable source ordering" (ExecutionAttempt lease).
    """
    try:
        with transaction.atomic(durable=True):
            attempt, now = ExecutionAttemptStore.lock_at_clock(claim.org_id, claim.attempt_id)
            if attempt.state != "started" or attempt.lease_token != claim.lease_token:
                return False
            ExecutionAttemptStore.touch(org_id=claim.org_id, pk=attempt.pk, state="started", version=attempt.version,
                                        fences={"lease_token": claim.lease_token},
                                        set_fields={"lease_expires_at": min(now, attempt.lease_expires_at)})
    except Exception as exc:  # the unit's own error is what the caller re-raises
        log.warning("claim hand-back failed for execution %s: %s", claim.execution_id, type(exc).__name__,
                    extra={"org_id": claim.org_id, "execution_id": int(claim.execution_id)})
        return False
    log.info("claim handed back for execution %s", claim.execution_id,
             extra={"org_id": claim.org_id, "execution_id": int(claim.execution_id)})
    return True


def execution_try_recover_one(*, worker_id: str) -> bool:
    """Re-run one Execution whose claim expired or whose holder process is proven gone."""
    now = db_now()
    started = fetch_joined(ExecutionAttempt, ("execution__lane",), {"state": "started", "execution__state": "ready"},
                           order="T0.`lease_expires_at`", limit=50)
    for stale in started:
        if stale.lease_expires_at > now and holder_termination_proof(stale.worker_id) is None:
            continue
        execution = stale.execution
        if execution.lane_id is None:
            continue
        try:
            claim = _claim_in_lane(execution.org_id, execution.lane.account_key, execution.lane_id, worker_id)
        except (NotServing, StaleVersion):
            continue
        if claim is None:
            continue
        execution_run(claim)
        return True
    return False
