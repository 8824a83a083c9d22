"""Claim: a worker leases one due step (seed 004 section 12.1).

:func:`flow_step_claim_one` discovers due steps without locks, then
:func:`_claim` locks root -> step, re-verifies everything and writes the
lease, the ``Claimed`` step, the ``Running`` root and a ``Started`` attempt
with its admitted business lock plan. The :class:`StepClaim` it returns is
the fence every later transaction of that attempt checks.
"""
from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass

from django.db import transaction
from django_mysql.exceptions import TimeoutError as LockTimeout
from django_mysql.locks import Lock

from nexusflow.kernel.clock import db_now, db_now_sql
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.pressure import PressureBounds, cached_judgement
from runtime_outbox.policy import AdmissionBudget, runtime_policy

from .. import policy
from .. import transitions as t
from ..compiler import KIND_MUTATION
from ..models import FlowExecutionPlan, FlowRun, FlowStepAttempt, FlowStepExecution
from ..selectors import (
    flow_due_run_candidates,
    flow_expired_leases,
    flow_plan_of,
    flow_plans_described,
    flow_plans_with_due_runs,
    flow_retries_started_since,
    flow_running_by_plan,
)
from ..store import FlowAttemptStore, FlowRunStore, FlowStepStore
from .admission import START_OBJECT

log = logging.getLogger("nexusflow.flows")

#: Reason code of a claim round paused by expired, unrecovered step leases (:func:`flow_lease_admission`).
PRESSURE_EXPIRED_LEASES = "flow_pressure_expired_leases"


@dataclass(frozen=True)
class StepClaim:
    """What a worker holds after a confirmed claim. ``lease_token`` never leaves memory."""

    org_id: str
    run_id: FlowRun.Id
    step_id: FlowStepExecution.Id
    step_key: str
    step_kind: str
    attempt_id: FlowStepAttempt.Id
    attempt_number: int
    lease_owner: str
    lease_token: str
    lease_token_digest: str
    ownership_epoch: int
    root_version: int
    step_version: int
    attempt_version: int
    lease_expires_at: dt.datetime
    #: The attempt's admitted business lock plan: sorted ``(object_name, record_key)`` pairs.
    lock_plan: tuple[tuple[str, str], ...] = ()
    #: The run's recursive-save level (``FlowRun.save_depth``), read with the root by :func:`.execute._start`.
    save_depth: int = 0
    #: The run's immutable plan (id and digest, checked against the root at the claim).
    plan_id: int = 0
    plan_digest: str = ""
    #: The step's input checkpoint (``None`` only for a step inserted without one).
    input_checkpoint_id: int | None = None
    #: When the run started (``$Flow.InterviewStartTime``): its first claim.
    interview_start: dt.datetime | None = None
    #: The run's trace id (``FlowRun.trace_id``; ``""``: none).
    trace_id: str = ""
    #: The run's ``(trigger_object_name, record_key)`` (fixed at insert), read with the root at the claim;
    #: ``None``: not read.
    trigger: tuple[str, str] | None = None
    #: ``(trigger snapshot, input context)`` read once after the claim (:func:`.step_txn.claims_with_inputs`;
    #: immutable checkpoints); ``None``: the step reads them.
    inputs: tuple[dict, dict] | None = None
    #: The run's highest checkpoint sequence, read with :attr:`inputs` after the claim committed. Only the
    #: fenced commit of this claim inserts the run's next checkpoint while the fence holds, so it stays the
    #: highest until then (the unique ``(org, run, sequence)`` key refuses a stale one); ``None``: the step
    #: reads it.
    checkpoint_sequence: int | None = None


def _lease_digest(token: str) -> str:
    return digest_v2("flows.lease-token", [("token", token)]).hexdigest


def flow_step_claim_one(*, worker_id: str) -> StepClaim | None:
    """Claim one due step: lease, Claimed step, Running root and a Started attempt.

    Discovery is a non-locking read; the claim transaction then locks root ->
    step and re-verifies everything (seed 004 section 12.1).

    Returns:
        The confirmed claim, or ``None`` when no step is due or another
        worker won every candidate.
    """
    claims = flow_step_claim_batch(worker_id=worker_id, limit=1)
    return claims[0] if claims else None


def flow_step_claim_batch(*, worker_id: str, limit: int | None = None) -> list[StepClaim]:
    """Claim up to ``limit`` due steps of one org in one transaction (bounded multi-row claim).

    Seed 004 sections 12.1 and 16.2: discovery is two non-locking reads on the database clock: the
    ``(org, plan)`` pairs with due runs (:func:`..selectors.flow_plans_with_due_runs`), of which this worker
    serves the next org in round robin (:func:`_next_org`: per-org fair share, a hot tenant's backlog never
    queues another tenant's run behind it) and, within it, the next plan in round robin (:func:`_next_plan`:
    per-plan fair share, likewise between the Flows of one org), then that plan's oldest due runs in stable
    order (``run_after``, id; at most :data:`policy.CLAIM_BATCH`, :func:`..selectors.flow_due_run_candidates`).
    When the org's runtime policy sets admission budgets (``queues``, ``plans.<flow>.max_active``,
    ``resource_classes``, ``retries.max_per_minute``; seed 004 section 16.2), the round holds the org's claim
    lock (a server named lock, taken without waiting: an org another worker is claiming passes the round to
    the next org) while it counts the org's ``Running`` roots and recent retries and claims at most the
    remaining budget of the plan it serves (retries only within the retry budget, :func:`_claim_budgeted`);
    an org or plan at its budget passes the round on. The claim transaction then
    locks the candidates' roots (one org, ascending id, ``FOR UPDATE SKIP LOCKED``: a root another worker is claiming or
    running is left to it, never waited for), then their steps (ascending id), re-verifies each pair
    exactly as a single claim does and writes each lease, ``Claimed`` step, ``Running`` root and
    ``Started`` attempt. Every claim is its own fence; executing one never depends on another.

    Args:
        worker_id: the claiming worker (lease owner).
        limit: at most this many claims (default :func:`policy.claim_batch`, at least 1).

    Returns:
        The confirmed claims in discovery order; empty when nothing is due or other workers hold every
        candidate.

    Raises:
        InvalidIdentity: a bad ``worker_id`` (before SQL).
        ValueError: ``limit`` below 1.
    """
    validate_key(worker_id, field="worker_id", max_length=128)
    limit = policy.claim_batch() if limit is None else limit
    if limit < 1:
        raise ValueError("limit must be at least 1")
    now = db_now_sql()  # the database clock, read by each discovery query itself
    due = flow_plans_with_due_runs(now=now)
    orgs = sorted({org for org, _plan in due})
    for _ in orgs:  # one pass at most: an org at its admission budget passes the round to the next
        org_id = _next_org(worker_id, orgs)
        plans = [plan for org, plan in due if org == org_id]
        org_policy = runtime_policy(org_id)
        budget, per_minute = org_policy.admission_budget(), org_policy.retries_per_minute
        if budget is None and per_minute is None:
            return _claim_from(worker_id, org_id, plans, now, limit)
        try:
            with Lock(_budget_lock_name(org_id), acquire_timeout=0):  # counts and claims of one org, one at a time
                claims = _claim_budgeted(worker_id, org_id, plans, now, limit, budget, per_minute)
        except LockTimeout:
            continue  # another worker is claiming this org's work now: serve the next org
        if claims:
            return claims
    return []


def _claim_budgeted(worker_id: str, org_id: str, plans: list[int], now, limit: int,
                    budget: AdmissionBudget | None, per_minute: int | None) -> list[StepClaim]:
    """One claim round of an org with budgets, under its claim lock: the plans with headroom only, and
    retries only within the retry budget (at most the retries left in its window)."""
    headroom = _headroom(org_id, plans, budget) if budget is not None else None
    if headroom is not None:
        plans = [plan for plan in plans if headroom[plan] > 0]
    if not plans:
        return []
    retries_left = None
    if per_minute is not None:
        since = db_now() - dt.timedelta(seconds=RETRY_WINDOW_SECONDS)
        retries_left = per_minute - flow_retries_started_since(org_id=org_id, since=since, limit=per_minute)
    return _claim_from(worker_id, org_id, plans, now, limit, headroom, retries_left=retries_left)


def _claim_from(worker_id: str, org_id: str, plans: list[int], now, limit: int,
                headroom: dict[int, int] | None = None, *, retries_left: int | None = None) -> list[StepClaim]:
    """Claim up to ``limit`` (and the chosen plan's ``headroom``) due runs of the next of ``plans`` in round
    robin, of which at most ``retries_left`` retries (``None``: any)."""
    plan_id = _next_plan(worker_id, org_id, plans)
    if headroom is not None:
        limit = min(limit, headroom[plan_id])
    ours = flow_due_run_candidates(org_id=org_id, now=now, limit=max(policy.CLAIM_BATCH, DISCOVERY_CHUNKS * limit),
                                   plan_id=plan_id, retries=retries_left is None or retries_left > 0)
    for first in range(0, len(ours), limit):
        claims = _claim_chunk(org_id, ours[first:first + limit], worker_id, retries_left)
        if claims:
            return claims
    return []


#: Claim chunks one discovery reads candidates for: when other workers claim the first chunk's runs at the
#: same moment, the next chunk is tried in the same round instead of the worker going idle.
DISCOVERY_CHUNKS = 3

#: The window of the retry budget (runtime policy ``retries.max_per_minute``), seconds of the database clock.
RETRY_WINDOW_SECONDS = 60

def flow_lease_reading(bounds: PressureBounds) -> tuple[int, str]:
    """``(expired, reason)`` now: the step leases expired and not yet recovered (every org, counted up to
    ``bounds.expired_leases``) and ``flow_pressure_expired_leases`` when they reach it, else ``""``."""
    expired = flow_expired_leases(now=db_now(), limit=bounds.expired_leases)
    return expired, PRESSURE_EXPIRED_LEASES if expired >= bounds.expired_leases else ""


def flow_lease_admission(bounds: PressureBounds) -> str:
    """``""`` when new Flow steps may be claimed, else ``flow_pressure_expired_leases``: at least
    ``bounds.expired_leases`` step leases expired and are not yet recovered (workers dying or overrun;
    recovery never asks and catches up first). Read at most every ``bounds.read_seconds`` per process."""

    def judge() -> tuple[str, dict]:
        expired, reason = flow_lease_reading(bounds)
        return reason, {"expired_leases": expired}

    return cached_judgement("flow.expired_leases", bound=bounds.expired_leases, read_seconds=bounds.read_seconds,
                            judge=judge, purpose="flow step")


def _budget_lock_name(org_id: str) -> str:
    return "flowclaim." + digest_v2("flows.claim-budget", [("org", org_id)]).hexdigest[:24]


def _headroom(org_id: str, plans: list[int], budget: AdmissionBudget) -> dict[int, int]:
    """Runs each of ``plans`` may still start now under ``budget`` (runtime policy ``queues``, ``plans``,
    ``resource_classes``): the least of the org's, the plan's Flow's and its trigger object's remaining
    budgets, counted from the org's ``Running`` roots (read under the org's claim lock)."""
    running = flow_running_by_plan(org_id=org_id)
    described = flow_plans_described(org_id=org_id, plan_ids=sorted(set(plans) | set(running)))
    unbounded = 10**9
    org_left = unbounded if budget.org is None else budget.org - sum(running.values())
    by_flow: dict[str, int] = {}
    by_object: dict[str, int] = {}
    for plan_id, n in running.items():
        flow, obj = described.get(plan_id, ("", ""))
        by_flow[flow] = by_flow.get(flow, 0) + n
        by_object[obj] = by_object.get(obj, 0) + n
    headroom = {}
    for plan_id in plans:
        flow, obj = described.get(plan_id, ("", ""))
        flow_left = budget.plans[flow] - by_flow.get(flow, 0) if flow in budget.plans else unbounded
        object_left = budget.objects[obj] - by_object.get(obj, 0) if obj in budget.objects else unbounded
        headroom[plan_id] = min(org_left, flow_left, object_left)
    return headroom


#: What each worker served last, by round-robin key: ``worker id`` -> org, ``(worker id, org)`` -> plan.
_last_served: dict = {}


def _round_robin(key, items: list):
    """The first of ``items`` (sorted) after the one served last under ``key``, wrapping around; ``None``
    when there is none."""
    if not items:
        return None
    last = _last_served.get(key)
    chosen = next((item for item in items if last is None or item > last), items[0])
    _last_served[key] = chosen
    return chosen


def _next_org(worker_id: str, orgs: list[str]) -> str | None:
    """Round robin over the orgs with due work (``orgs``, sorted): the first after the one ``worker_id`` served
    last, wrapping around. Each org with due runs gets one claim round in turn, so a tenant's backlog of any
    size delays another tenant's run by at most one round per other busy org (seed 004 section 16.2)."""
    return _round_robin(worker_id, orgs)


def _next_plan(worker_id: str, org_id: str, plans: list[int]) -> int | None:
    """Round robin over the org's plans with due work (``plans``, ascending), like :func:`_next_org`: a Flow
    with a backlog of any size delays another Flow of the same org by at most one round per other busy plan
    (seed 004 section 16.2, "per plan" fair share)."""
    return _round_robin((worker_id, org_id), plans)


def _claim_chunk(org_id: str, chunk: list[tuple[int, int]], worker_id: str,
                 retries_left: int | None = None) -> list[StepClaim]:
    """One claim transaction over ``chunk`` (``(run_id, step_id)`` pairs of one org, discovery order), taking
    at most ``retries_left`` retries (``None``: any)."""
    if len(chunk) == 1 and retries_left is None:
        claim = _claim(org_id=org_id, run_id=chunk[0][0], step_id=chunk[0][1], worker_id=worker_id)
        return [] if claim is None else [claim]
    steps_of = dict(chunk)
    with transaction.atomic(durable=True):
        locked, now = FlowRunStore.lock_many_at_clock(org_id, list(steps_of), skip_locked=True)
        runs = [run for run in locked if _claimable_root(run, steps_of[int(run.pk)])]
        steps = {int(step.pk): step for step in FlowStepStore.lock_many(
            org_id, [run.current_step_id for run in runs])}
        claims = {}
        memo: dict = {}
        for run in runs:
            step = steps.get(int(run.current_step_id))
            retry = step is not None and step.state == t.STEP_RETRY_SCHEDULED
            if retry and retries_left is not None and retries_left <= 0:
                continue  # the org's retry budget is spent: first attempts only
            claim = _claim_locked(run, step, now, worker_id, memo)
            if claim is not None:
                claims[int(run.pk)] = claim
                retries_left = retries_left - 1 if retry and retries_left is not None else retries_left
    return [claims[run_id] for run_id, _step in chunk if run_id in claims]


def _claimable_root(run: FlowRun, step_id: int) -> bool:
    return (run.state == t.RUN_RUNNABLE and run.current_step_id == step_id and not run.is_deleted
            and run.delete_requested_at is None)


def _claim(*, org_id: str, run_id: int, step_id: int, worker_id: str) -> StepClaim | None:
    """Claim the step ``step_id`` of one run (``flows run`` drives one run this way)."""
    with transaction.atomic(durable=True):
        run, now = FlowRunStore.lock_at_clock(org_id, run_id)
        if not _claimable_root(run, step_id):
            return None
        return _claim_locked(run, FlowStepStore.lock(org_id, step_id), now, worker_id)


def _claim_locked(run: FlowRun, step: FlowStepExecution | None, now: dt.datetime,
                  worker_id: str, memo: dict | None = None) -> StepClaim | None:
    """Verify a locked claimable root and its locked current step, then write the claim (seed 004 section 12.1
    steps 3-5); ``None`` when the step is not due or the run's plan binding does not hold. ``memo`` keeps the
    policy numbers read for a plan across the claims of one transaction."""
    org_id = run.org_id
    if (step is None or step.run_id != run.pk or step.state not in (t.STEP_PENDING, t.STEP_RETRY_SCHEDULED)
            or (step.run_after is not None and step.run_after > now)):
        return None
    try:
        plan = flow_plan_of(org_id=run.org_id, plan_id=run.plan_id, plan_digest=run.plan_digest)
    except FlowExecutionPlan.DoesNotExist:
        plan = None
    if plan is None or plan.runtime_work_binding_digest != run.binding_digest:
        log.error("flow claim refused: run and plan bindings differ", extra={"org_id": org_id, "run_id": run.pk})
        return None
    token = secrets.token_urlsafe(32)
    token_digest = _lease_digest(token)
    memo = {} if memo is None else memo
    if (org_id, run.plan_id) not in memo:  # the policy numbers of one claim transaction, read once per plan
        memo[(org_id, run.plan_id)] = (policy.lease_seconds(), policy.retry_policy_digest(org_id, run.plan_id),
                                       policy.retry_base_seconds(org_id))
    lease, retry_digest, retry_base = memo[(org_id, run.plan_id)]
    expires = now + dt.timedelta(seconds=lease)
    attempt_number = step.attempt_count + 1
    lock_plan = _lock_plan_for(run, step)
    step_version = FlowStepStore.transition(
        org_id=org_id, pk=step.pk, src=step.state, dst=t.STEP_CLAIMED, version=step.version,
        set_fields={"lease_owner": worker_id, "lease_token_digest": token_digest, "lease_expires_at": expires,
                    "attempt_count": attempt_number, "updated_at": now},
    )
    started_at = run.started_at or now
    root_version = FlowRunStore.transition(
        org_id=org_id, pk=run.pk, src=t.RUN_RUNNABLE, dst=t.RUN_RUNNING, version=run.version,
        fences={"current_step_id": step.pk, "is_deleted": False, "delete_requested_at": None},
        set_fields={"started_at": started_at, "updated_at": now},
    )
    attempt = FlowAttemptStore.create(
        org_id=org_id, step=step, attempt_number=attempt_number, state=t.ATTEMPT_STARTED,
        lease_owner=worker_id, lease_token_digest=token_digest, ownership_epoch=step.ownership_epoch,
        root_state_version_at_claim=root_version, retry_policy_digest=retry_digest,
        recovery_backoff_floor_ms=policy.recovery_backoff_floor_ms(step_id=step.pk, attempt_number=attempt_number,
                                                                   org_id=org_id, base_seconds=retry_base),
        plan_digest=run.plan_digest, started_at=now, lock_plan=[list(r) for r in lock_plan],
        lock_plan_digest=_lock_plan_digest(lock_plan),
    )
    return StepClaim(
        org_id=org_id, run_id=run.pk, step_id=step.pk, step_key=step.plan_step_key, step_kind=step.step_kind,
        attempt_id=attempt.pk, attempt_number=attempt_number, lease_owner=worker_id, lease_token=token,
        lease_token_digest=token_digest, ownership_epoch=step.ownership_epoch, root_version=root_version,
        step_version=step_version, attempt_version=attempt.version, lease_expires_at=expires, lock_plan=lock_plan,
        plan_id=int(run.plan_id), plan_digest=run.plan_digest, input_checkpoint_id=step.input_checkpoint_id,
        interview_start=started_at, trace_id=run.trace_id, trigger=(run.trigger_object_name, run.record_key),
    )


#: Step kinds whose transaction starts by locking the trigger record (seed 004 section 13.1 step 2).
LOCKING_KINDS = frozenset({KIND_MUTATION})


def _lock_plan_for(run: FlowRun, step: FlowStepExecution) -> tuple[tuple[str, str], ...]:
    """The declared resource plan of the next attempt: trigger record plus earlier late discoveries.

    Seed 004 section 13.3 step 4: a retry after a late discovery admits the
    expanded plan, read from the rolled-back attempts' evidence.
    """
    resources: set[tuple[str, str]] = set()
    if step.step_kind in LOCKING_KINDS and run.trigger_object_name != START_OBJECT:
        resources.add((run.trigger_object_name, run.record_key))
    earlier = () if step.attempt_count == 0 else FlowStepAttempt.objects.filter(
        org_id=run.org_id, step_id=step.pk).values_list("metrics_summary", flat=True)
    for summary in earlier:
        for obj, key in (summary or {}).get("discovered", []):
            resources.add((obj, key))
    return tuple(sorted(resources, key=lambda r: (r[0].encode(), r[1].encode())))


def _lock_plan_digest(lock_plan) -> str:
    return digest_v2("flows.lock-plan", [("resource", f"{o}\x00{k}") for o, k in lock_plan]).hexdigest
