"""Capacity of the Flow claim queue on the real MariaDB (seed 004 section 22.7; run with ``make bench``).

A large waiting population and a storm of failing steps against the claim
queries of section 12.1. Bounds are structural (rows the server examined,
the access path ``EXPLAIN`` shows, attempts counted per step, claims per
round); the one timing bound compares the claim query with a primary-key
read timed interleaved with it, before and after the population arrives.
"""
from __future__ import annotations

import datetime as dt
import logging
import re
import time
from itertools import pairwise

import pytest
from django.db import connection, transaction

from nexusflow.flows import policy
from nexusflow.flows import transitions as t
from nexusflow.flows.binding import scope_of
from nexusflow.flows.compiler import KIND_PURE_COMPUTE
from nexusflow.flows.models import FlowRun, FlowStepAttempt, FlowStepExecution
from nexusflow.flows.reasons import STEP_RETRY_EXHAUSTED
from nexusflow.flows.selectors import flow_due_run_candidates, flow_plans_with_due_runs
from nexusflow.flows.services import (
    execute,
    flow_deploy,
    flow_run_start,
    flow_step_claim_batch,
    flow_try_resume_due_one,
    flow_try_run_step_one,
    flow_try_wake_one,
    flow_wake_signal_accept,
)
from nexusflow.kernel.clock import db_now_sql
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope
from tests.flows.conftest import run_until_idle

from . import capacity_flows as cf
from . import capacity_support as cs

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True)]

# --- workload sizes -------------------------------------------------------------------------------------
#: 22.7-08: waiting (paused) runs beside the claim queue, finished runs present in both measurements (so
#: the optimizer plans for real tables), runnable runs in the queue, and timed claim queries.
WAITING_POPULATION = 20_000
FINISHED_RUNS = 2_000
EARLY_SIGNALS = 3
#: 22.7-08: the tables the waiting population fills.
POPULATION_TABLES = ("flows_flowrun", "flows_flowstepexecution", "flows_flowdependency")
#: Words that may follow a table name and are no alias.
SQL_WORDS = {"FORCE", "USE", "IGNORE", "JOIN", "INNER", "LEFT", "ON", "WHERE", "ORDER", "GROUP", "LIMIT", "SET"}
#: 22.7-08: the primary-key read the claim query's time is compared with.
REFERENCE_READ = "SELECT id, state FROM flows_flowrun WHERE id = %s"
RUNNABLE_RUNS = 6
CLAIM_ROUNDS = 5
CLAIM_SAMPLES = 60
CLAIM_REPEATS = 3
#: 22.7-04: the hot tenant's due backlog, and the claim rounds another tenant's run may wait: one per busy org.
HOT_BACKLOG = 100_000
#: 22.7-09: runs whose step always fails, and runs admitted while their retries are pending.
STORM_RUNS = 40
CALM_RUNS = 24

# --- bounds ---------------------------------------------------------------------------------------------
#: 22.7-08: rows a discovery query examines beside the population, at most this many times its rows without
#: it (plus the due candidates).
CLAIM_ROWS_FACTOR = 2
#: 22.7-08: the claim query's p99 (median of the rounds' p99; a sample is the fastest of CLAIM_REPEATS runs)
#: over the p50 of a primary-key read timed the same way interleaved with it, beside the population, at most
#: this many times the same ratio without it.
CLAIM_P99_FACTOR = 3.0
#: 22.7-09: the retry base the storm runs under (seconds): long enough that real time never reaches a retry
#: during the test, so only the moved database clock does.
STORM_RETRY_BASE_SECONDS = 60
#: 22.7-09: spread of the first retry's jittered floor across the storm, as a share of the base backoff.
JITTER_SPREAD = 0.05


def _rows_read(sql: str) -> int:
    """Handler row reads of one execution of a read-only statement on this session."""
    with cs.counted() as counters:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            cursor.fetchall()
    return counters.rows_read


# =============================================================================================================
# 22.7-04 Queue fairness under one hot tenant
# =============================================================================================================
def test_a_hot_tenants_backlog_of_a_hundred_thousand_runs_delays_another_tenants_run_by_one_claim_round():
    """Seed 004 22.7 "queue fairness under one hot plan/tenant" (sections 12.1, 16.2).

    One org has ``HOT_BACKLOG`` due runs, all older than a single run another
    org starts afterwards. Claim rounds serve the orgs with due work in turn
    (per-org fair share), so the other org's run is claimed within as many
    rounds as there are busy orgs, after at most one batch of the hot org's
    runs, and the hot org's claims take its oldest due runs first. Discovery
    reads one index entry per deployed plan, not the backlog: its handler row reads
    beside the backlog stay within twice those beside a backlog of one run.
    An oldest-due-first queue over all orgs would claim the whole backlog
    first.
    """
    hot, cold = OrgScope("bench-a-hot"), OrgScope("bench-b-cold")  # the hot org comes first in org order
    for org in (hot, cold):
        flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain_One")
    template = flow_run_start(org=hot, flow_api_name="Chain_One", inputs={"counter": 0}).run

    def discovery_reads() -> int:
        # The two discovery reads a claim round sends (captured from the selectors it calls), rows read.
        sent = []
        plan_id = FlowRun.objects.filter(org_id=hot.org_id).values_list("plan_id", flat=True).first()
        for call in (lambda: flow_plans_with_due_runs(now=db_now_sql()),
                     lambda: flow_due_run_candidates(org_id=hot.org_id, now=db_now_sql(), limit=policy.CLAIM_BATCH,
                                                     plan_id=plan_id)):
            sent += cs.captured_statements(call)[1]
        return sum(_rows_read(sql) for sql in sent)

    reads_alone = discovery_reads()
    cs.clone_run(template.pk, HOT_BACKLOG)
    cold_run = flow_run_start(org=cold, flow_api_name="Chain_One", inputs={"counter": 0}).run
    assert FlowRun.objects.filter(org_id=hot.org_id, state=t.RUN_RUNNABLE).count() == HOT_BACKLOG + 1
    reads_beside = discovery_reads()
    busy_orgs, batch = 2, policy.claim_batch()

    hot_claimed, rounds = [], 0
    while rounds < busy_orgs:
        rounds += 1
        claims = flow_step_claim_batch(worker_id="bench-fair")
        assert claims and len({c.org_id for c in claims}) == 1, rounds
        if claims[0].org_id == cold.org_id:
            assert [c.run_id for c in claims] == [cold_run.pk]
            break
        hot_claimed += [int(c.run_id) for c in claims]
    else:
        raise AssertionError(f"the cold org's run was not claimed within {busy_orgs} rounds")
    oldest = list(FlowRun.objects.filter(org_id=hot.org_id).order_by("run_after", "queue_class", "id")
                  .values_list("pk", flat=True)[: len(hot_claimed)])
    assert len(hot_claimed) <= batch and hot_claimed == oldest
    assert reads_beside <= 2 * reads_alone + busy_orgs + batch, (reads_alone, reads_beside)
    print(f"\n22.7-04 fairness: another org's run claimed in round {rounds} after {len(hot_claimed)} of "
          f"{HOT_BACKLOG + 1} older due runs of the hot org; discovery handler reads {reads_alone} alone, "
          f"{reads_beside} beside the backlog")


# =============================================================================================================
# 22.7-08 Claim queries beside a large paused (waiting) population
# =============================================================================================================
def test_claim_queries_read_the_same_rows_beside_twenty_thousand_waiting_runs():
    """Seed 004 22.7 "paused/waiting population claim-query behavior" (sections 12.1, 14, 18.2).

    ``WAITING_POPULATION`` runs paused on a time wait (legacy status
    ``Paused``) are added beside ``RUNNABLE_RUNS`` due runs, early wake
    signals and finished runs. The step claim query, the due-wait
    discovery and the wake-signal discovery examine at most
    ``CLAIM_ROWS_FACTOR`` times the rows they examine without the
    population, plus the due candidates (``ANALYZE``, handler row reads; a
    plan may switch indexes with table sizes), reach the
    tables the population fills only through an index, never a table or
    full index scan (``EXPLAIN``); the claim query's p99, relative to a
    primary-key read timed interleaved with it, stays within
    ``CLAIM_P99_FACTOR`` of the same ratio without the population; and the
    next claim takes only due runnable steps.
    """
    org = OrgScope("bench-waiting")
    flow_deploy(org=org, source=cf.wait_days(3), flow_api_name="Wait_Days")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain_One")
    template = flow_run_start(org=org, flow_api_name="Wait_Days", inputs={}).run
    run_until_idle()
    template = FlowRun.objects.get(pk=template.pk)
    assert (template.state, template.legacy_status) == (t.RUN_WAITING, t.LEGACY_PAUSED)
    # The statements of each claim path, captured while nothing is due (so capturing claims nothing).
    statements = {}
    for name, call, table in (("step claim orgs", lambda: flow_step_claim_batch(worker_id="bench"), "flowrun"),
                              ("step claim", lambda: flow_due_run_candidates(
                                  org_id=org.org_id, now=db_now_sql(), limit=policy.CLAIM_BATCH,
                                  plan_id=template.plan_id), "flowrun"),
                              ("due waits", flow_try_resume_due_one, "flowdependency"),
                              ("wake signals", flow_try_wake_one, "flowwakesignal")):
        result, sent = cs.captured_statements(call)
        assert not result
        statements[name] = cs.first_statement(sent, rf"^\s*SELECT .* FROM `?flows_{table}\b")
    finished = flow_run_start(org=org, flow_api_name="Chain_One", inputs={"counter": 0}).run
    run_until_idle()
    assert FlowRun.objects.get(pk=finished.pk).state == t.RUN_SUCCEEDED
    cs.clone_run(finished.pk, FINISHED_RUNS)
    for _ in range(RUNNABLE_RUNS):
        flow_run_start(org=org, flow_api_name="Chain_One", inputs={"counter": 0})
    for i in range(EARLY_SIGNALS):  # wakes that arrived before their dependency: candidates of every wake claim
        with transaction.atomic():
            flow_wake_signal_accept(scope=scope_of(template), flow_run_id=template.pk, dependency_key=f"early-{i}",
                                    receipt_id=i + 1)

    def measure() -> dict:
        found = {}
        for name, sql in statements.items():
            aliases = {alias: table for table, alias in re.findall(r"`?(flows_\w+)`? (?:AS )?`?(\w+)", sql)
                       if alias.upper() not in SQL_WORDS}
            access = [(aliases.get(row["table"], row["table"]), row["type"], row["key"]) for row in cs.explain(sql)]
            found[name] = {"examined": cs.rows_examined(cs.analyze(sql)), "reads": _rows_read(sql), "access": access}
        rounds, reference = [], []
        with connection.cursor() as cursor:

            def fastest(sql: str, params) -> float:
                # One sample: the fastest of a few back-to-back runs (an OS preemption does not hit them all).
                best = float("inf")
                for _ in range(CLAIM_REPEATS):
                    began = time.perf_counter()
                    cursor.execute(sql, params)
                    cursor.fetchall()
                    best = min(best, time.perf_counter() - began)
                return best

            for _ in range(CLAIM_ROUNDS):
                claim = []
                for _ in range(CLAIM_SAMPLES):
                    claim.append(fastest(statements["step claim"], None))
                    reference.append(fastest(REFERENCE_READ, [template.pk]))
                rounds.append(cs.percentile(claim, 99))
        found["p99"] = sorted(rounds)[len(rounds) // 2]
        found["reference"] = cs.percentile(reference, 50)
        return found

    without = measure()
    cs.clone_run(template.pk, WAITING_POPULATION)
    assert FlowRun.objects.filter(org_id=org.org_id, state=t.RUN_WAITING).count() == WAITING_POPULATION + 1
    beside = measure()
    print("\n22.7-08 claim queries without / beside the waiting population: " + "; ".join(
        f"{name}: examined {without[name]['examined']:.0f} / {beside[name]['examined']:.0f}, handler reads "
        f"{without[name]['reads']} / {beside[name]['reads']}, access {beside[name]['access']}" for name in statements)
        + f"; claim p99 {without['p99'] * 1e3:.2f} / {beside['p99'] * 1e3:.2f} ms (primary-key read p50 "
        f"{without['reference'] * 1e3:.2f} / {beside['reference'] * 1e3:.2f} ms)")
    # The optimizer may switch between two indexes as table sizes change (rows read differ by a few candidates);
    # what never happens is a read proportional to the population.
    slack = RUNNABLE_RUNS + EARLY_SIGNALS
    for name in statements:
        for measure in ("examined", "reads"):
            assert beside[name][measure] <= CLAIM_ROWS_FACTOR * without[name][measure] + slack, (
                name, without[name], beside[name])
        for table, kind, key in beside[name]["access"]:
            if table in POPULATION_TABLES:  # reached through an index, never a table or full index scan
                assert kind not in ("ALL", "index") and key, (name, beside[name]["access"])
    assert beside["p99"] / beside["reference"] <= CLAIM_P99_FACTOR * without["p99"] / without["reference"]
    claims = flow_step_claim_batch(worker_id="bench")
    assert len(claims) == min(policy.claim_batch(), RUNNABLE_RUNS)
    assert {FlowRun.objects.get(pk=c.run_id).plan.flow_api_name for c in claims} == {"Chain_One"}


# =============================================================================================================
# 22.7-09 Retry storm containment
# =============================================================================================================
class _StormFailure(NexusError):
    """The storm step's failure: retryable (not definite), raised before any write, so a proven rollback."""

    code = "bench_storm_failure"


def test_a_retry_storm_backs_off_stops_at_its_attempt_bound_and_never_delays_other_runs(
        monkeypatch, caplog, settings, db_clock_advance):
    """Seed 004 22.7 "retry storm containment" (sections 12.1 step 5, 12.2, 13.4).

    ``STORM_RUNS`` runs whose step always fails (a retryable error, proven
    rollback) are retried only from durable ``RetryScheduled`` rows: none is
    retried before its backoff, so ``CALM_RUNS`` runs admitted meanwhile are
    each claimed in the first claim round after their admission and finish
    with no storm attempt in between. The database clock then moves through
    the schedule (never a sleep; the base backoff is
    ``STORM_RETRY_BASE_SECONDS``, beyond the test's real duration, so only
    the moved clock makes a retry due): each storm step gets exactly one
    attempt per backoff period, no attempt starts before the previous one's
    finish plus its exponential jittered floor, the floors are spread by
    their jitter, and after ``max_attempts`` attempts every storm run fails
    terminally (``flow_step_retry_exhausted``): at most ``STORM_RUNS *
    max_attempts`` attempts in all.
    """
    settings.NEXUS_FLOW_RETRY_BASE_SECONDS = STORM_RETRY_BASE_SECONDS
    base, attempts_allowed, batch = policy.retry_base_seconds(), policy.max_attempts(), policy.claim_batch()
    assert base == STORM_RETRY_BASE_SECONDS and attempts_allowed > 1  # the configured retry budget
    org = OrgScope("bench-storm")
    storm = flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Storm_Step").plan
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Calm_Step")
    real = execute.EXECUTORS[KIND_PURE_COMPUTE]

    def failing(claim, plan, step_def):
        if claim.plan_id == storm.pk:
            raise _StormFailure()
        return real(claim, plan, step_def)

    monkeypatch.setitem(execute.EXECUTORS, KIND_PURE_COMPUTE, failing)
    caplog.set_level(logging.ERROR, logger="nexusflow.flows")  # one rolled-back warning per storm attempt
    storm_runs = [flow_run_start(org=org, flow_api_name="Storm_Step", inputs={"counter": 0}).run
                  for _ in range(STORM_RUNS)]
    storm_ids = [r.pk for r in storm_runs]

    def storm_attempts() -> int:
        return FlowStepAttempt.objects.filter(org_id=org.org_id, step__run_id__in=storm_ids).count()

    run_until_idle(max_rounds=4 * STORM_RUNS)
    assert storm_attempts() == STORM_RUNS  # one attempt each; no retry before its backoff
    assert FlowStepExecution.objects.filter(run_id__in=storm_ids, state=t.STEP_RETRY_SCHEDULED).count() == STORM_RUNS

    # Calm runs arrive while every storm step waits out its backoff: each wave is claimed by the next round.
    calm_ids, claim_reads = [], []
    for wave in range(CALM_RUNS // batch):
        wave_ids = [flow_run_start(org=org, flow_api_name="Calm_Step", inputs={"counter": 0}).run.pk
                    for _ in range(batch)]
        calm_ids += wave_ids
        with cs.counted() as counters:
            assert flow_try_run_step_one(worker_id="bench-calm")
        claim_reads.append(counters.rows_read)
        assert FlowRun.objects.filter(pk__in=wave_ids, state=t.RUN_SUCCEEDED).count() == batch, wave
    assert storm_attempts() == STORM_RUNS
    assert list(FlowStepAttempt.objects.filter(step__run_id__in=calm_ids).values_list("state", flat=True)) == \
        [t.ATTEMPT_COMMITTED] * len(calm_ids)

    # The database clock moves through the schedule: one more attempt per storm step per backoff period.
    for attempt in range(1, attempts_allowed):
        floor = min(base * 2 ** (attempt - 1), policy.RETRY_CAP_SECONDS) * (1 + policy.JITTER_FRACTION)
        db_clock_advance(floor + 1)
        run_until_idle(max_rounds=4 * STORM_RUNS)
        assert storm_attempts() == STORM_RUNS * (attempt + 1), attempt
    assert run_until_idle() == 0

    runs = FlowRun.objects.filter(pk__in=storm_ids)
    assert {(r.state, r.reason_code) for r in runs} == {(t.RUN_TERMINAL_FAILED, STEP_RETRY_EXHAUSTED)}
    first_floors = []
    for run_id in storm_ids:
        attempts = list(FlowStepAttempt.objects.filter(org_id=org.org_id, step__run_id=run_id)
                        .order_by("attempt_number"))
        assert [a.attempt_number for a in attempts] == list(range(1, attempts_allowed + 1)), run_id
        assert {(a.state, a.safe_error_code) for a in attempts} == {(t.ATTEMPT_ROLLED_BACK, _StormFailure.code)}
        first_floors.append(attempts[0].recovery_backoff_floor_ms)
        for earlier, later in pairwise(attempts):
            nominal = min(base * 2 ** (earlier.attempt_number - 1), policy.RETRY_CAP_SECONDS) * 1000
            assert nominal <= earlier.recovery_backoff_floor_ms <= nominal * (1 + policy.JITTER_FRACTION)
            floor = dt.timedelta(milliseconds=earlier.recovery_backoff_floor_ms)
            assert later.started_at >= earlier.finished_at + floor, (run_id, earlier.attempt_number)
    assert max(first_floors) - min(first_floors) >= JITTER_SPREAD * base * 1000, first_floors
    print(f"\n22.7-09 retry storm: {STORM_RUNS} runs x {attempts_allowed} attempts, none before its floor; "
          f"{len(calm_ids)} runs admitted meanwhile each claimed in its first round; first floors "
          f"{min(first_floors)}-{max(first_floors)} ms; handler rows read per claim round while the storm waits "
          f"out its backoff: {min(claim_reads)}-{max(claim_reads)}")
