"""Flow Runtime reads (no locks). Every read that names a row is scoped by org."""
from __future__ import annotations

from typing import Any

from django.db import connection, connections
from django.db.models import Count, QuerySet

from nexusflow.kernel.ids import require_id
from nexusflow.kernel.rows import fetch_where, row_shape
from nexusflow.kernel.scope import OrgScope

from . import transitions as t
from .models import (
    FlowActivation,
    FlowCheckpoint,
    FlowDependency,
    FlowEffectLink,
    FlowExecutionPlan,
    FlowRun,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)


def flow_runs_nonterminal_count(*, org_id: str | None = None) -> int:
    """Count runs not in a terminal or intentionally parked state.

    A run ``Waiting`` on an effect completion counts as nonterminal.
    """
    qs = FlowRun.objects.exclude(state__in=t.FLOW_RUN.settled)
    if org_id is not None:
        qs = qs.filter(org_id=org_id)
    return qs.count()


def _clock_sql(now) -> tuple[str, list]:
    """``now`` (a query expression such as :func:`nexusflow.kernel.clock.db_now_sql`, or a datetime) as SQL text
    and parameters."""
    if hasattr(now, "sql") and hasattr(now, "params"):
        return f"({now.sql})", list(now.params)
    return "%s", [connection.ops.adapt_datetimefield_value(now)]


def flow_plans_with_due_runs(*, now) -> list[tuple[str, int]]:
    """The ``(org id, plan id)`` pairs with a due ``Runnable`` root, in org then plan order (seed 004 sections
    12.1 and 16.2: per-org and per-plan fair share).

    ``now`` is the database clock (:func:`nexusflow.kernel.clock.db_now_sql`, or a datetime). The pairs come
    from the execution plans (every run names one; a few rows per deployed Flow version), and each is checked
    with one dive into ``flow_run_plan_claim_idx`` for its oldest ``Runnable`` root, so the cost grows with
    the deployed plans and never with a backlog, whatever the optimizer's statistics say. A root with no
    ``run_after`` is due.
    """
    clock, clock_params = _clock_sql(now)
    run, plan = FlowRun._meta.db_table, FlowExecutionPlan._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT plans.org_id, plans.id FROM {plan} plans WHERE ("
            f"SELECT due.run_after IS NULL OR due.run_after <= {clock} FROM {run} due "
            "FORCE INDEX (flow_run_plan_claim_idx) WHERE due.org_id = plans.org_id AND due.plan_id = plans.id "
            "AND due.state = %s ORDER BY due.run_after LIMIT 1) = 1 ORDER BY plans.org_id, plans.id",
            [*clock_params, t.RUN_RUNNABLE])
        return [(org_id, int(plan_id)) for org_id, plan_id in cursor.fetchall()]


def flow_oldest_due(org_id: str, now):
    """When the org's oldest due ``Runnable`` root became eligible (its ``run_after``, or its last change
    without one), or ``None`` when none is due at ``now`` (one dive into ``flow_run_claim_idx``)."""
    row = (FlowRun.objects.filter(org_id=org_id, state=t.RUN_RUNNABLE).order_by("run_after")
           .values_list("run_after", "updated_at").first())
    if row is None:
        return None
    eligible = row[0] or row[1]
    return eligible if eligible <= now else None


def flow_running_by_plan(*, org_id: str) -> dict[int, int]:
    """The org's ``Running`` roots (a step claimed and executing) per plan id (``flow_run_claim_idx``: the
    executing runs are bounded by the workers' claims, never by a backlog)."""
    rows = (FlowRun.objects.filter(org_id=org_id, state=t.RUN_RUNNING).values("plan_id")
            .annotate(n=Count("pk")).order_by())
    return {int(r["plan_id"]): int(r["n"]) for r in rows}


def flow_retries_started_since(*, org_id: str, since, limit: int) -> int:
    """The org's attempts after a step's first started at or after ``since``, counted up to ``limit``
    (``flow_attempt_org_started_idx``: the read stops at the budget)."""
    return len(FlowStepAttempt.objects.filter(org_id=org_id, started_at__gte=since, attempt_number__gt=1)
               .values_list("pk", flat=True)[:limit])


def flow_expired_leases(*, now, limit: int) -> int:
    """Step leases (every org) expired before ``now`` and not yet recovered, counted up to ``limit``
    (``flow_step_lease_idx``)."""
    return len(FlowStepExecution.objects.filter(state__in=(t.STEP_CLAIMED, t.STEP_RUNNING),
                                                lease_expires_at__lt=now).values_list("pk", flat=True)[:limit])


def flow_plans_described(*, org_id: str, plan_ids: list[int]) -> dict[int, tuple[str, str]]:
    """``plan id -> (Flow API name, trigger object)`` of the org's plans ``plan_ids``."""
    rows = FlowExecutionPlan.objects.filter(org_id=org_id, pk__in=plan_ids).values_list(
        "pk", "flow_api_name", "trigger_object_name")
    return {int(pk): (flow, obj) for pk, flow, obj in rows}


def flow_due_run_candidates(*, org_id: str, now, limit: int, plan_id: int | None = None,
                            retries: bool = True) -> list[tuple[int, int]]:
    """Up to ``limit`` due runs of one org (of one of its plans when ``plan_id`` is given) as ``(run id,
    current step id)``, oldest due first.

    Seed 004 section 12.1 discovery: a non-locking read of ``Runnable`` roots due on the database clock
    ``now`` whose current step is ``Pending`` or ``RetryScheduled``, in (``run_after``, ``queue_class``, id)
    order straight off ``flow_run_claim_idx`` (of one plan: (``run_after``, id) off
    ``flow_run_plan_claim_idx``; no sort: the limit stops the read however large the backlog), each step
    reached by its primary key. The claim re-verifies every candidate under its locks. ``retries`` False:
    first attempts only (``Pending`` steps; the org's retry budget is spent).
    """
    clock, clock_params = _clock_sql(now)
    run, step = FlowRun._meta.db_table, FlowStepExecution._meta.db_table
    states = [t.STEP_PENDING, t.STEP_RETRY_SCHEDULED if retries else t.STEP_PENDING]
    if plan_id is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT STRAIGHT_JOIN {run}.id, {run}.current_step_id FROM {run} FORCE INDEX (flow_run_plan_claim_idx) "
                f"JOIN {step} ON {step}.id = {run}.current_step_id WHERE {run}.org_id = %s AND {run}.plan_id = %s "
                f"AND {run}.state = %s AND ({run}.run_after IS NULL OR {run}.run_after <= {clock}) "
                f"AND {run}.is_deleted = 0 AND {run}.delete_requested_at IS NULL AND {step}.state IN (%s, %s) "
                f"ORDER BY {run}.run_after, {run}.id LIMIT %s",
                [org_id, int(plan_id), t.RUN_RUNNABLE, *clock_params, *states, int(limit)])
            return [(int(run_id), int(step_id)) for run_id, step_id in cursor.fetchall()]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT STRAIGHT_JOIN {run}.id, {run}.current_step_id FROM {run} FORCE INDEX (flow_run_claim_idx) "
            f"JOIN {step} ON {step}.id = {run}.current_step_id WHERE {run}.org_id = %s AND {run}.state = %s "
            f"AND ({run}.run_after IS NULL OR {run}.run_after <= {clock}) AND {run}.is_deleted = 0 "
            f"AND {run}.delete_requested_at IS NULL AND {step}.state IN (%s, %s) "
            f"ORDER BY {run}.run_after, {run}.queue_class, {run}.id LIMIT %s",
            [org_id, t.RUN_RUNNABLE, *clock_params, *states, int(limit)])
        return [(int(run_id), int(step_id)) for run_id, step_id in cursor.fetchall()]


def flow_run_trigger(*, org_id: str, flow_run_id: int) -> tuple[str, str, int] | None:
    """``(trigger object name, record key, record version)`` of the org's FlowRun, or ``None`` if there is none.

    The Runtime's replay guard asks it (``runtime_outbox.replay_guard.register_flow_trigger_lookup``).
    """
    rows = fetch_where(FlowRun, {"org_id": org_id, "pk": flow_run_id}, limit=1)
    return (rows[0].trigger_object_name, rows[0].record_key, rows[0].record_version) if rows else None


def flow_run_summary() -> dict[str, int]:
    """Return ``{state: count}`` over all runs, with every FlowRun state present."""
    summary = {state: 0 for state in sorted(t.FLOW_RUN.states)}
    for row in FlowRun.objects.values("state").annotate(n=Count("id")).order_by():
        summary[row["state"]] = row["n"]
    return summary


def flow_runs_visible(*, org: OrgScope, include_deleted: bool = False) -> QuerySet[FlowRun]:
    """The org's runs through the one ``IsDeleted`` visibility filter (seed 004 section 10.1 step 6).

    Every normal read path below starts here; only an authorized
    include-deleted (retention/recycle-bin) read passes ``include_deleted``.
    """
    qs = FlowRun.objects.filter(org_id=org.org_id)
    return qs if include_deleted else qs.filter(is_deleted=False)


def flow_run_get(*, org: OrgScope, run_id: FlowRun.Id | int, include_deleted: bool = False) -> FlowRun | None:
    """Return the org's visible run ``run_id``, or None.

    Raises:
        InvalidIdentity: ``run_id`` is not a FlowRun id (or a positive int).
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    return flow_runs_visible(org=org, include_deleted=include_deleted).filter(org_id=org.org_id, pk=run_id).first()


def flow_runs_for_record(*, org: OrgScope, object_name: str, record_key: str,
                         include_deleted: bool = False) -> list[FlowRun]:
    """The visible runs a record triggered (a relationship read), in id order."""
    return list(flow_runs_visible(org=org, include_deleted=include_deleted)
                .filter(trigger_object_name=object_name, record_key=record_key).order_by("id"))


#: Seed 004 sections 11.1-11.2: the current step states each root state may point at.
ROOT_STEP_STATES = {
    t.RUN_ACCEPTED: {None},
    t.RUN_RUNNABLE: {t.STEP_PENDING, t.STEP_RETRY_SCHEDULED},
    t.RUN_RUNNING: {t.STEP_CLAIMED, t.STEP_RUNNING},
    t.RUN_WAITING: {t.STEP_WAITING},
    t.RUN_SUCCEEDED: {t.STEP_SUCCEEDED},
    t.RUN_TERMINAL_FAILED: {t.STEP_FAILED},
    t.RUN_QUARANTINED: {t.STEP_QUARANTINED},
    t.RUN_CANCEL_REQUESTED: {t.STEP_CANCEL_REQUESTED, t.STEP_CANCELLED},
    t.RUN_CANCELLED: {t.STEP_CANCELLED},
}


def flow_runs_projection_divergent(*, org_id: str) -> list[dict]:
    """Runs whose projections disagree with their canonical state (seed 004 sections 18.2 and 22.2).

    A run diverges when its legacy status is not the section 18.2 projection
    of its state, or its current step is in a state the root state cannot
    point at. The expected answer is always the empty list.
    """
    out = []
    rows = (FlowRun.objects.filter(org_id=org_id).select_related("current_step")
            .only("id", "state", "legacy_status", "current_step__state").order_by("id"))
    for run in rows:
        step_state = run.current_step.state if run.current_step_id else None
        if run.legacy_status != t.legacy_status_of(run.state) or step_state not in ROOT_STEP_STATES[run.state]:
            out.append({"run_id": int(run.pk), "state": run.state, "legacy_status": run.legacy_status,
                        "current_step_state": step_state})
    return out


def flow_steps_of_run(*, org: OrgScope, run_id: FlowRun.Id | int) -> list[FlowStepExecution]:
    """Return the run's steps in id order; ``InvalidIdentity`` as :func:`flow_run_get`."""
    run_id = require_id(run_id, FlowRun, field="run_id")
    return list(FlowStepExecution.objects.filter(org_id=org.org_id, run_id=run_id).order_by("id"))


def flow_attempts_of_step(*, org: OrgScope, step_id: FlowStepExecution.Id | int) -> list[FlowStepAttempt]:
    """Return the step's attempts by number; ``InvalidIdentity`` unless a step id."""
    step_id = require_id(step_id, FlowStepExecution, field="step_id")
    return list(FlowStepAttempt.objects.filter(org_id=org.org_id, step_id=step_id).order_by("attempt_number"))


def flow_checkpoints_of_run(*, org: OrgScope, run_id: FlowRun.Id | int) -> list[FlowCheckpoint]:
    """Return the run's checkpoints by sequence; ``InvalidIdentity`` unless a run id."""
    run_id = require_id(run_id, FlowRun, field="run_id")
    return list(FlowCheckpoint.objects.filter(org_id=org.org_id, run_id=run_id).order_by("sequence"))


def flow_activation_active(*, org: OrgScope, flow_api_name: str) -> FlowActivation | None:
    return (FlowActivation.objects.filter(org_id=org.org_id, active_slot=flow_api_name)
            .select_related("plan").first())


# --- reason-code evidence (nexusflow/flows/reasons.py) ---------------------------
# Seed 003 "Operational liveness and maintenance admission": each takes the
# trusted ``org_id`` and an optional ``reason_code`` and returns the rows an
# operator reads as evidence.
def _with_reason(qs: QuerySet, reason_code: str | None, field: str) -> QuerySet:
    return qs.filter(**{field: reason_code}) if reason_code else qs.exclude(**{field: ""})


def flow_runs_with_reason(*, org_id: str, reason_code: str | None = None,
                          state: str | None = None) -> QuerySet[FlowRun]:
    """Runs carrying a reason code, with their plan, newest first.

    Args:
        reason_code: only runs with this code (default: every run with one).
        state: only runs in this state (``TerminalFailed`` or ``Quarantined``).
    """
    qs = FlowRun.objects.filter(org_id=org_id).select_related("plan")
    if state is not None:
        qs = qs.filter(state=state)
    return _with_reason(qs, reason_code, "reason_code").order_by("-id")


def flow_attempts_for_reason(*, org_id: str, reason_code: str | None = None,
                             run_id: int | None = None) -> QuerySet[FlowStepAttempt]:
    """Attempts of the steps carrying a reason code: ``safe_error_code``, ``failure_class``, outcome state."""
    qs = FlowStepAttempt.objects.filter(org_id=org_id).select_related("step")
    if run_id is not None:
        qs = qs.filter(step__run_id=run_id)
    return _with_reason(qs, reason_code, "step__reason_code").order_by("step_id", "attempt_number")


def flow_effect_links_for_reason(*, org_id: str, reason_code: str | None = None,
                                 run_id: int | None = None) -> QuerySet[FlowEffectLink]:
    """Effect links of runs carrying a reason code; ``outbound_command_id`` names the Runtime intent and receipt."""
    qs = FlowEffectLink.objects.filter(org_id=org_id).select_related("run")
    if run_id is not None:
        qs = qs.filter(run_id=run_id)
    return _with_reason(qs, reason_code, "run__reason_code").order_by("-run_id", "id")


def flow_checkpoints_for_reason(*, org_id: str, reason_code: str | None = None,
                                run_id: int | None = None) -> QuerySet[FlowCheckpoint]:
    """Checkpoints committed by steps carrying a reason code (commit evidence under an expired lease)."""
    qs = FlowCheckpoint.objects.filter(org_id=org_id, step__isnull=False).select_related("step")
    if run_id is not None:
        qs = qs.filter(run_id=run_id)
    return _with_reason(qs, reason_code, "step__reason_code").order_by("-run_id", "sequence")


#: Plans held by :func:`flow_plan_of` per process (a plan is immutable, so a held one never goes stale).
PLAN_CACHE_SIZE = 256
_plans: dict[tuple[str, int, str], FlowExecutionPlan] = {}


def flow_subflow_payloads(*, org_id: str, payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The deployed plan payloads of every subflow ``payload`` calls, transitively, by plan digest.

    A subflow resolves against the org's deployed plans by the exact plan digest it was compiled against
    (never by flow name: a redeployed child does not change a parent's plan). A digest with no deployed
    plan is simply absent; the activation gate names it (``engine_unsupported:subflow_missing``) and the
    executor refuses it (``flow_subflow_missing``).
    """
    from .handlers import subflow_digests_of

    out: dict[str, dict[str, Any]] = {}
    pending = subflow_digests_of(payload)
    while pending:
        wanted = sorted(set(pending) - set(out))
        pending = []
        for digest, found in (FlowExecutionPlan.objects.filter(org_id=org_id, plan_digest__in=wanted)
                              .values_list("plan_digest", "plan_payload")):
            out[digest] = found
            pending.extend(subflow_digests_of(found))
    return out


def flow_plan_of(*, org_id: str, plan_id: int, plan_digest: str) -> FlowExecutionPlan:
    """The immutable plan ``plan_id`` of ``org_id`` whose digest is ``plan_digest``, read once per process.

    Seed 004 section 7.4: a plan never changes after its insert, so workers keep the ones they ran (up to
    :data:`PLAN_CACHE_SIZE`, oldest dropped first) instead of reading it for every claim and step. The key
    holds the digest the caller's run is bound to, so a row id reused by a recreated database can never
    serve another plan. Callers must not mutate the returned row or its payload.

    Raises:
        FlowExecutionPlan.DoesNotExist: no plan ``plan_id`` of ``org_id`` with that digest.
    """
    key = (org_id, int(plan_id), plan_digest)
    plan = _plans.get(key)
    if plan is None:
        plan = FlowExecutionPlan.objects.get(org_id=org_id, pk=plan_id, plan_digest=plan_digest)
        if len(_plans) >= PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))
        _plans[key] = plan
    return plan


# --- metrics (nexusflow/flows/metrics.py; seed 004 section 19) ---------------------------------------------
def flow_queue_by_class(now) -> list[tuple[str, int, Any]]:
    """Due ``Runnable`` roots (all orgs) by queue class: ``(queue_class, runs, oldest eligible time)``.

    A root is eligible from its ``run_after`` (or, without one, its last change, ``updated_at``); ``now`` is
    the database clock as a datetime.
    """
    from django.db.models import Min, Q
    from django.db.models.functions import Coalesce

    rows = (FlowRun.objects.filter(state=t.RUN_RUNNABLE, is_deleted=False)
            .filter(Q(run_after__isnull=True) | Q(run_after__lte=now))
            .values("queue_class").annotate(n=Count("pk"), oldest=Min(Coalesce("run_after", "updated_at")))
            .order_by("queue_class"))
    return [(r["queue_class"], int(r["n"]), r["oldest"]) for r in rows]


def flow_attempt_outcomes() -> list[tuple[str, str, int]]:
    """Every FlowStepAttempt (all orgs) by state and failure class: ``(state, failure_class, attempts)``."""
    rows = (FlowStepAttempt.objects.values("state", "failure_class").annotate(n=Count("pk"))
            .order_by("state", "failure_class"))
    return [(r["state"], r["failure_class"], int(r["n"])) for r in rows]


def flow_attempt_retries() -> int:
    """FlowStepAttempts after a step's first (``attempt_number > 1``), all orgs."""
    return FlowStepAttempt.objects.filter(attempt_number__gt=1).count()


def flow_attempt_durations() -> list[tuple[str, str, int, float, float]]:
    """Finished attempts by step kind and plan step key: ``(kind, plan_step_key, attempts, sum s, max s)``.

    Duration is ``finished_at - started_at`` of the attempt (claim to outcome; the database records no
    separate transaction duration).
    """
    step = FlowStepExecution._meta.db_table
    attempt = FlowStepAttempt._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.step_kind, s.plan_step_key, COUNT(*), "
            f"COALESCE(SUM(TIMESTAMPDIFF(MICROSECOND, a.started_at, a.finished_at)), 0), "
            f"COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, a.started_at, a.finished_at)), 0) "
            f"FROM {attempt} a JOIN {step} s ON s.id = a.step_id WHERE a.finished_at IS NOT NULL "
            f"GROUP BY s.step_kind, s.plan_step_key ORDER BY s.step_kind, s.plan_step_key")
        return [(kind, key, int(n), int(total) / 1e6, int(top) / 1e6) for kind, key, n, total, top in cursor.fetchall()]


def flow_checkpoint_sizes() -> tuple[int, int, int]:
    """``(checkpoints, total bytes, largest bytes)`` of every FlowCheckpoint's stored context payload."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(*), COALESCE(SUM(LENGTH(context_payload)), 0), COALESCE(MAX(LENGTH(context_payload)), 0) "
            f"FROM {FlowCheckpoint._meta.db_table}")
        n, total, top = cursor.fetchone()
        return int(n), int(total), int(top)


def flow_dependencies_waiting() -> list[tuple[str, int, Any]]:
    """``waiting`` FlowDependencies (all orgs) by producer kind: ``(producer_kind, rows, oldest created_at)``."""
    from django.db.models import Min

    from .models import FlowDependency

    rows = (FlowDependency.objects.filter(state="waiting").values("producer_kind")
            .annotate(n=Count("pk"), oldest=Min("created_at")).order_by("producer_kind"))
    return [(r["producer_kind"], int(r["n"]), r["oldest"]) for r in rows]


def flow_wake_signals() -> list[tuple[str, int, float]]:
    """FlowWakeSignals by state: ``(state, signals, sum of consumed_at - received_at in seconds)``.

    ``unmatched`` signals name no waiting dependency (a producer signalled nothing that waits); only consumed
    signals have a latency.
    """
    from .models import FlowWakeSignal

    table = FlowWakeSignal._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT state, COUNT(*), COALESCE(SUM(TIMESTAMPDIFF(MICROSECOND, received_at, consumed_at)), 0) "
            f"FROM {table} GROUP BY state ORDER BY state")
        return [(state, int(n), int(total) / 1e6) for state, n, total in cursor.fetchall()]


def flow_missing_producers() -> dict[str, int]:
    """Waits whose producer is gone, all orgs: ``{"missing_at_wait": steps, "deleted_while_waiting": runs}``.

    ``missing_at_wait``: steps with an attempt that failed ``flow_wait_producer_missing`` (the watched record
    did not exist when the wait began); ``deleted_while_waiting``: runs ended ``flow_wait_producer_deleted``.
    """
    from . import reasons

    missing = (FlowStepAttempt.objects.filter(safe_error_code="flow_wait_producer_missing")
               .values("step_id").distinct().count())
    deleted = FlowRun.objects.filter(reason_code=reasons.WAIT_PRODUCER_DELETED).count()
    return {"missing_at_wait": missing, "deleted_while_waiting": deleted}


def flow_steps_by_reason(codes) -> dict[str, int]:
    """FlowStepExecutions (all orgs) carrying each of ``codes``: ``{code: steps}``, every code present."""
    out = {code: 0 for code in codes}
    for row in (FlowStepExecution.objects.filter(reason_code__in=list(codes)).values("reason_code")
                .annotate(n=Count("pk")).order_by()):
        out[row["reason_code"]] = int(row["n"])
    return out


def flow_activations_on(*, org_id: str, object_name: str) -> list[FlowActivation]:
    """The org's ``Active`` activations whose plan triggers on ``object_name``, in id order, each carrying its
    immutable plan (:func:`flow_plan_of`, by the digest read with the activation).

    A record save's before-save hook and its after-save admission each ask it (seed 004 sections 7.4 and 9):
    which activations are active is read every time, in one statement; a plan is decoded once per process.

    Raises:
        InvalidIdentity: ``org_id`` or ``object_name`` is not canonical (before SQL).
    """
    activation, plan = row_shape(FlowActivation), row_shape(FlowExecutionPlan)
    on_activation = activation.where({"org_id": org_id, "state": t.ACTIVATION_ACTIVE}, prefix="a.")
    on_plan = plan.where({"trigger_object_name": object_name}, prefix="p.")
    sql = (f"SELECT {activation.columns_as('a')}, p.`plan_digest` FROM `{activation.table}` a "
           f"INNER JOIN `{plan.table}` p ON (a.`plan_id` = p.`id`) "
           f"WHERE {on_activation[0]} AND {on_plan[0]} ORDER BY a.`id`")
    out = []
    for row, (plan_digest,) in activation.fetch(sql, [*on_activation[1], *on_plan[1]], extra_columns=1):
        row.plan = flow_plan_of(org_id=org_id, plan_id=row.plan_id, plan_digest=plan_digest)
        out.append(row)
    return out


def flow_wake_candidates(*, limit: int) -> list[FlowWakeSignal]:
    """Unmatched wake signals (all orgs) whose run still waits on their dependency key, oldest first (non-locking).

    A signal names a ``Waiting`` FlowDependency of its run with the same complete work scope (org,
    installation, capability, binding) and key; the wake worker then locks root -> step -> dependency ->
    signal and decides (section 14.2 step 6). Built once per process: it runs on every wake round.
    """
    signals, dependencies = row_shape(FlowWakeSignal), row_shape(FlowDependency)
    where, params = signals.where({"state": t.SIGNAL_UNMATCHED})
    waiting, waiting_params = dependencies.where({"state": t.DEP_WAITING}, prefix="d.")
    same = " AND ".join(f"d.`{column}` = `{signals.table}`.`{column}`" for column in
                        ("org_id", "app_installation_id", "runtime_capability_id", "binding_digest", "dependency_key"))
    sql = signals.select_sql(
        f"{where} AND EXISTS (SELECT 1 FROM `{dependencies.table}` d WHERE {same} "
        f"AND d.`run_id` = `{signals.table}`.`flow_run_id` AND {waiting})", suffix=f" ORDER BY `id` LIMIT {int(limit)}")
    return signals.fetch(sql, [*params, *waiting_params])


def flow_path_runs_waiting(*, org_id: str, object_name: str, record_key: str, version_below: int,
                           immediate_path: str) -> list[FlowRun]:
    """The record's ``Waiting`` scheduled-path runs admitted by a save older than ``version_below``, by id.

    ``FlowRun.objects.filter(org_id, trigger_object_name, record_key, state=Waiting,
    record_version__lt=version_below).exclude(entry_path=immediate_path).order_by("id")``, by SQL built once
    (every record save asks it).

    Raises:
        InvalidIdentity: a key that is not canonical (before SQL).
    """
    shape = row_shape(FlowRun)
    where, params = shape.where({"org_id": org_id, "trigger_object_name": object_name, "record_key": record_key,
                                 "state": t.RUN_WAITING})
    path = shape.by_name["entry_path"]
    sql = shape.select_sql(f"{where} AND `record_version` < %s AND NOT (`entry_path` = %s)", suffix=" ORDER BY `id`")
    return shape.fetch(sql, [*params, int(version_below),
                             path.get_db_prep_value(immediate_path, connections[shape.alias], prepared=False)])


def flow_checkpoints_with_top(*, org_id: str, runs: list[int], sequence: int | None = None,
                              ids: list[int] | None = None) -> list[tuple[int, int, int, Any, int]]:
    """The org's checkpoints of ``runs`` with sequence ``sequence`` or (given ``ids``) with those ids.

    One statement built once, what ``FlowCheckpoint.objects.filter(org_id=..., run_id__in=runs)
    .annotate(top=Subquery(<highest sequence of the run>)).filter(sequence=... | pk__in=...)`` reads.

    Returns:
        ``[(run id, id, sequence, context payload, the run's highest sequence), ...]``.
    """
    table = f"`{row_shape(FlowCheckpoint).table}`"
    top = (f", (SELECT t.`sequence` FROM {table} t WHERE t.`org_id` = {table}.`org_id` "
           f"AND t.`run_id` = {table}.`run_id` ORDER BY t.`sequence` DESC LIMIT 1) AS `top`")
    which = {"pk__in": list(ids)} if ids is not None else {"sequence": sequence}
    rows = fetch_where(FlowCheckpoint, {"org_id": org_id, "run_id__in": list(runs), **which}, extra=top)
    return [(int(row.run_id), int(row.pk), row.sequence, row.context_payload, highest)
            for row, (highest,) in rows]
