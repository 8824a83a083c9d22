"""Capacity of the Flow executor on the real MariaDB (seed 004 section 22.7; run with ``make bench``).

Each case measures one 22.7 property and asserts a bound that fails when the
property breaks. Bounds are structural where the server can count
(statements, commits, rows examined, row locks, rows held from another
session); where a time bound is needed, the measured path and a reference
transaction run interleaved in the same test and only their ratio is
bounded, so a busy machine slows both alike.
"""
from __future__ import annotations

import json
import re
import time

import MySQLdb
import pytest
from django.db import connection, transaction

from nexusflow.flows import policy
from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import ATOMIC_MAX_WRITES
from nexusflow.flows.models import FlowCheckpoint, FlowRun, FlowStepAttempt, FlowStepExecution
from nexusflow.flows.services import flow_deploy, flow_run_start, flow_try_run_step_one, step_txn
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from tests.flows.conftest import run_until_idle, save_record, update_record

from . import capacity_flows as cf
from . import capacity_support as cs

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True)]

# --- workload sizes -------------------------------------------------------------------------------------
#: 22.7-01: saves per org (creates and updates alternate), interleaved between the two orgs.
BEFORE_SAVE_SAVES = 120
#: 22.7-02: timed Bounded Atomic step transactions per population, and the populations of other records.
ATOMIC_TIMED_RUNS = 12
ATOMIC_POPULATIONS = (20, 400)
#: 22.7-03: one-step durable runs the in-process worker drains.
THROUGHPUT_RUNS = 96
#: 22.7-07: durable chains of these lengths (steps), and runs of each.
CHECKPOINT_CHAINS = (4, 16)
CHECKPOINT_RUNS = 6

# --- bounds ---------------------------------------------------------------------------------------------
#: 22.7-01: p95 of a save with an active before-save flow over p95 of the same save without one.
BEFORE_SAVE_P95_FACTOR = 1.5
#: 22.7-01: statements a before-save flow may add to a save (the database clock read of its interview).
BEFORE_SAVE_EXTRA_STATEMENTS = 1
#: 22.7-02: row locks of the lifecycle sub-order (root, step, attempt, and the entries the root and step
#: compare-and-swap updates lock) and row locks per admitted business row (its identity key entry, its
#: clustered row, its update).
LIFECYCLE_ROW_LOCKS = 5
ROW_LOCKS_PER_BUSINESS_ROW = 3
#: 22.7-02: statements in one Bounded Atomic step transaction (one business row, one write).
ATOMIC_STEP_STATEMENTS = 24
#: 22.7-02: p95 time per statement of the Bounded Atomic step transaction over that of a lifecycle-only durable
#: step transaction run interleaved with it.
ATOMIC_PER_STATEMENT_FACTOR = 2.5
#: 22.7-03: commits per one-step run beyond its share of the claim (start and step transactions).
COMMITS_PER_STEP = 2
#: 22.7-03: statements per one-step run, claim share included.
STATEMENTS_PER_STEP = 32
#: 22.7-03: time per durable step over time per floor transaction, interleaved (this machine: about 9 when busy,
#: up to 18 when idle, as the floor speeds up more than Python-side work).
STEP_OVER_FLOOR = 30.0
#: 22.7-07: rows a checkpoint read or sequence lookup may examine, whatever the run's length or table size.
CHECKPOINT_ROWS_EXAMINED = 2
#: 22.7-07: bytes a checkpoint may grow by from a 4-step to a 16-step chain (the counter's digits).
CHECKPOINT_BYTES_SLACK = 16


@pytest.fixture
def floor():
    """The database floor transaction: one locking read and one compare-and-swap update of one row.

    Returns a callable that runs one floor transaction and returns its seconds.
    """
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_floor (id INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB")
        cursor.execute("INSERT IGNORE INTO bench_floor VALUES (1, 0)")

    def run() -> float:
        began = time.perf_counter()
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT v FROM bench_floor WHERE id = 1 FOR UPDATE")
                value = cursor.fetchone()[0]
                cursor.execute("UPDATE bench_floor SET v = %s WHERE id = 1 AND v = %s", [value + 1, value])
        return time.perf_counter() - began

    return run


def _fill(org: OrgScope, count: int, tag: str) -> None:
    """Save ``count`` Contact records no flow's trigger matches (the population beside the measured rows)."""
    for i in range(count):
        save_record(org, {cf.STAGE: "lead", "email": f"{tag}-{i}@example.com"})


# =============================================================================================================
# 22.7-01 Embedded Before-Save latency against the same save without flows
# =============================================================================================================
def test_a_before_save_flow_keeps_the_save_within_its_plain_baseline():
    """Seed 004 22.7 "before-save latency compared with current baseline" (section 9.1).

    The same Contact saves run in an org with an active Embedded Before-Save
    flow and in one with no flow, interleaved. The flow adds at most the one
    database clock read of its interview, no commit and no durable Flow row,
    and the p95 save time stays within ``BEFORE_SAVE_P95_FACTOR`` of the
    plain save's p95.
    """
    flowed, plain = OrgScope("bench-before-save"), OrgScope("bench-plain-save")
    flow_deploy(org=flowed, source=cf.before_save_stamp(), flow_api_name="Before_Save_Stamp")
    records = {org.org_id: save_record(org, {cf.STAGE: cf.CUSTOMER, "email": "warm@example.com"})
               for org in (flowed, plain)}  # warm the plan and metadata caches of both paths
    seconds: dict[str, list[float]] = {flowed.org_id: [], plain.org_id: []}
    statements: dict[tuple[str, str], set[int]] = {}
    commits: dict[tuple[str, str], set[int]] = {}
    for i in range(BEFORE_SAVE_SAVES):
        for org in ((flowed, plain) if i % 2 == 0 else (plain, flowed)):
            op = "create" if i % 2 == 0 else "update"
            with cs.counted() as counters:
                began = time.perf_counter()
                if op == "create":
                    records[org.org_id] = save_record(org, {cf.STAGE: cf.CUSTOMER, "email": f"s{i}@example.com"})
                else:
                    update_record(org, records[org.org_id], {"firstname": f"n{i}"})
                seconds[org.org_id].append(time.perf_counter() - began)
            statements.setdefault((org.org_id, op), set()).add(counters.statements)
            commits.setdefault((org.org_id, op), set()).add(counters.commits)

    stamped = Record.objects.filter(org_id=flowed.org_id).values_list("fields", flat=True)
    assert stamped and all(f.get("lastname") == "Stamped" for f in stamped)  # the flow ran on every save
    assert not any("lastname" in f for f in Record.objects.filter(org_id=plain.org_id).values_list("fields", flat=True))
    for model in (FlowRun, FlowStepExecution, FlowCheckpoint):  # no durable root on the hot path
        assert not model.objects.filter(org_id=flowed.org_id).exists(), model
    for op in ("create", "update"):
        assert max(statements[(flowed.org_id, op)]) <= min(statements[(plain.org_id, op)]) \
            + BEFORE_SAVE_EXTRA_STATEMENTS, (op, statements)
        assert commits[(flowed.org_id, op)] == commits[(plain.org_id, op)], (op, commits)
    p95 = {org: cs.percentile(values, 95) for org, values in seconds.items()}
    factor = p95[flowed.org_id] / p95[plain.org_id]
    print(f"\n22.7-01 before-save: p95 {p95[flowed.org_id] * 1e3:.2f} ms with the flow, "
          f"{p95[plain.org_id] * 1e3:.2f} ms without ({factor:.2f}x); statements {sorted(statements.items())}")
    assert factor <= BEFORE_SAVE_P95_FACTOR


# =============================================================================================================
# 22.7-02 Bounded Atomic transaction duration and lock footprint
# =============================================================================================================
class _HeldRows:
    """While a step transaction is open, find from another session which committed rows it holds.

    Every table of the database with an ``id`` column is probed: its committed rows (a plain read sees no
    uncommitted insert) are locked ``FOR UPDATE NOWAIT`` by primary key (point lookups, so no row beside
    them is read); a refusal means the open transaction holds the row. Needs no server privilege.
    """

    def __init__(self):
        self.session = cs.raw_session()
        cursor = self.session.cursor()
        cursor.execute("SELECT table_name FROM information_schema.columns WHERE table_schema = DATABASE() "
                       "AND column_name = 'id' ORDER BY table_name")
        self.tables = [name for (name,) in cursor.fetchall()]
        self.session.rollback()

    def close(self) -> None:
        self.session.close()

    def _locked(self, cursor, table: str, ids: list[int]) -> bool:
        """Does any row of ``ids`` refuse a ``NOWAIT`` lock?"""
        try:
            for first in range(0, len(ids), 500):
                chunk = ids[first:first + 500]
                cursor.execute(f"SELECT id FROM `{table}` WHERE id IN ({', '.join(['%s'] * len(chunk))}) "
                               "FOR UPDATE NOWAIT", chunk)
                cursor.fetchall()
            return False
        except MySQLdb.OperationalError:
            return True

    def declared(self) -> dict[str, set[int]]:
        """The open attempt's declared rows, read as committed: its lock plan's records, root, step, attempt."""
        cursor = self.session.cursor()
        cursor.execute("SELECT a.id, a.step_id, s.run_id, a.lock_plan, a.org_id FROM flows_flowstepattempt a "
                       "JOIN flows_flowstepexecution s ON s.id = a.step_id WHERE a.state = %s", [t.ATTEMPT_STARTED])
        (attempt_id, step_id, run_id, lock_plan, org_id), = cursor.fetchall()
        records = set()
        for object_name, record_key in json.loads(lock_plan):
            cursor.execute("SELECT id FROM records_record WHERE org_id = %s AND object_name = %s AND record_key = %s",
                           [org_id, object_name, record_key])
            records.add(cursor.fetchone()[0])
        self.session.rollback()
        return {"records_record": records, "flows_flowrun": {run_id}, "flows_flowstepexecution": {step_id},
                "flows_flowstepattempt": {attempt_id}}

    def check(self, declared: dict[str, set[int]]) -> dict[str, tuple[int, list[int]]]:
        """``{table: (declared rows held, committed rows outside the declared set that are held)}`` for every
        table with rows."""
        cursor = self.session.cursor()
        found = {}
        for table in self.tables:
            own = declared.get(table, set())
            cursor.execute(f"SELECT id FROM `{table}`")
            others = [int(pk) for (pk,) in cursor.fetchall() if int(pk) not in own]
            if not others and not own:
                continue
            held = sum(self._locked(cursor, table, [pk]) for pk in sorted(own))
            outside = [pk for pk in others if self._locked(cursor, table, [pk])] if self._locked(
                cursor, table, others) else []
            found[table] = (held, outside)
            self.session.rollback()
        return found


def _innodb_view_readable() -> bool:
    """May this account read InnoDB's transaction view (``information_schema.INNODB_TRX`` needs ``PROCESS``)?"""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX")
        return True
    except Exception:  # 1227 access denied: the project's application account lacks PROCESS
        return False


def test_a_bounded_atomic_step_holds_its_declared_rows_only_for_a_short_transaction(monkeypatch):
    """Seed 004 22.7 "bounded atomic transaction duration and lock footprint" (sections 9.2, 12.2, 13.1).

    A Bounded Atomic after-save flow (one write of the trigger record) runs
    beside ``ATOMIC_POPULATIONS`` other records. While its step transaction
    is open, another session can lock every other committed row of every
    table (``NOWAIT``) and none of the declared ones: the step holds exactly
    its admitted lock plan and its run's root, step and attempt, beside 20
    as beside 400 other records. The lock plan stays within the plan's
    declared write bound, and where the account may read InnoDB's view
    (``PROCESS``) its row locks stay within ``LIFECYCLE_ROW_LOCKS +
    ROW_LOCKS_PER_BUSINESS_ROW * len(lock plan)``. The transaction's
    statements (``ATOMIC_STEP_STATEMENTS`` at most) do not grow with the
    population, and its p95 time per statement stays within
    ``ATOMIC_PER_STATEMENT_FACTOR`` of a lifecycle-only durable step
    transaction's, run interleaved with it: no wait, scan or call inside
    the transaction.
    """
    org = OrgScope("bench-atomic")
    plan = flow_deploy(org=org, source=cf.atomic_promote(), flow_api_name="Atomic_Promote").plan
    assert plan.execution_profile == "bounded_atomic"
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain_One")
    declared_writes = plan.bound_summary["writes"]
    assert isinstance(declared_writes, int) and declared_writes <= ATOMIC_MAX_WRITES
    held_rows = _HeldRows()
    innodb_readable = _innodb_view_readable()
    footprints, blocks = [], []
    try:
        with cs.transaction_log() as log:
            filled = 0
            for population in ATOMIC_POPULATIONS:
                _fill(org, population - filled, f"p{population}")
                filled = population
                # Timed pass: Bounded Atomic runs and lifecycle-only runs, one of each in every claim round.
                monkeypatch.setattr(step_txn, "before_step_commit", lambda *a, p=population: log.mark_commit(population=p))
                log.closed.clear()
                for i in range(ATOMIC_TIMED_RUNS):
                    save_record(org, {cf.STAGE: cf.CUSTOMER, "email": f"t{population}-{i}@example.com"})
                    flow_run_start(org=org, flow_api_name="Chain_One", inputs={"counter": 0})
                run_until_idle(max_rounds=4 * ATOMIC_TIMED_RUNS)
                assert len(log.closed) == 2 * ATOMIC_TIMED_RUNS
                blocks += log.closed
                # Footprint pass: InnoDB's counters (fresh: its lock view refreshes after 0.1 s), then the probe.

                def probe(*_, population=population):
                    trx = None
                    if innodb_readable:
                        time.sleep(0.11)  # InnoDB refreshes its transaction view at most every 0.1 s
                        trx = cs.own_transaction()
                    declared = held_rows.declared()
                    footprints.append({"population": population, "trx": trx, "declared": declared,
                                       "held": held_rows.check(declared)})

                monkeypatch.setattr(step_txn, "before_step_commit", probe)
                save_record(org, {cf.STAGE: cf.CUSTOMER, "email": f"f{population}@example.com"})
                run_until_idle()
    finally:
        held_rows.close()

    assert not FlowRun.objects.filter(org_id=org.org_id).exclude(state=t.RUN_SUCCEEDED).exists()
    stages = list(Record.objects.filter(org_id=org.org_id).values_list("fields", flat=True))
    assert sum(f[cf.STAGE] == cf.PROMOTED for f in stages) == len(ATOMIC_POPULATIONS) * (ATOMIC_TIMED_RUNS + 1)
    lock_plans = [len(p) for p in FlowStepAttempt.objects.filter(org_id=org.org_id, step__step_kind="BoundedMutation")
                  .values_list("lock_plan", flat=True)]
    assert set(lock_plans) == {1} and max(lock_plans) <= declared_writes + 1  # the trigger record, within the bound
    assert [f["population"] for f in footprints] == list(ATOMIC_POPULATIONS)
    for footprint in footprints:
        declared, held = footprint["declared"], footprint["held"]
        assert len(held) > 10 and all(table in held for table in declared), sorted(held)  # every table with rows
        for table, (own_held, outside) in held.items():
            assert own_held == len(declared.get(table, ())), (footprint["population"], table, held[table])
            assert outside == [], (footprint["population"], table, held[table])
    bound = LIFECYCLE_ROW_LOCKS + ROW_LOCKS_PER_BUSINESS_ROW * max(lock_plans)
    # InnoDB's own count, where the account may read it: the same constant bound beside 20 and 400 other
    # records (a page split of a table the step inserts into may copy one lock, so the counts themselves are
    # not compared between the two).
    locks = [(f["trx"]["rows_locked"], f["trx"]["lock_structs"]) for f in footprints if f["trx"]]
    assert len(locks) == (len(footprints) if innodb_readable else 0)
    assert all(rows <= bound for rows, _structs in locks), (locks, bound)
    atomic = [b for b in blocks if any("records_record" in sql for sql in b["sql"])]
    lifecycle = [b for b in blocks if b not in atomic]
    assert len(atomic) == len(lifecycle) == len(ATOMIC_POPULATIONS) * ATOMIC_TIMED_RUNS
    statements = {p: {b["statements"] for b in atomic if b["population"] == p} for p in ATOMIC_POPULATIONS}
    assert statements[ATOMIC_POPULATIONS[0]] == statements[ATOMIC_POPULATIONS[-1]], statements
    assert max(max(s) for s in statements.values()) <= ATOMIC_STEP_STATEMENTS, statements
    per_statement = {name: cs.percentile([b["seconds"] / b["statements"] for b in group], 95)
                     for name, group in (("atomic", atomic), ("lifecycle", lifecycle))}
    ratio = per_statement["atomic"] / per_statement["lifecycle"]
    print(f"\n22.7-02 bounded atomic: held rows {[len(f['declared']['records_record']) + 3 for f in footprints]} "
          f"(lock plan + root, step, attempt; nothing else in {len(footprints[0]['held'])} tables); InnoDB rows "
          f"locked and lock structs {locks or 'not readable by this account'} (bound {bound} rows), "
          f"statements {sorted(statements.items())}; p95 "
          f"{cs.percentile([b['seconds'] for b in atomic], 95) * 1e3:.2f} ms, "
          f"{per_statement['atomic'] * 1e3:.2f} ms per statement against "
          f"{per_statement['lifecycle'] * 1e3:.2f} ms lifecycle-only ({ratio:.2f}x)")
    assert ratio <= ATOMIC_PER_STATEMENT_FACTOR


# =============================================================================================================
# 22.7-03 Durable step throughput at the configured admission
# =============================================================================================================
def test_durable_steps_run_at_the_configured_claim_admission_within_a_bound_of_the_database_floor(floor):
    """Seed 004 22.7 "durable step throughput at configured admission" (sections 12.1, 12.2, 16).

    ``THROUGHPUT_RUNS`` one-step durable runs, started through the public
    start path, are drained by an in-process worker at the configured claim
    admission (``NEXUS_FLOW_CLAIM_BATCH``): every claim takes at most that
    many steps and takes that many while the backlog lasts; each step costs
    at most ``COMMITS_PER_STEP`` commits plus its share of the claim and at
    most ``STATEMENTS_PER_STEP`` statements; and a step takes at most
    ``STEP_OVER_FLOOR`` times a floor transaction run right after each claim
    round (as many floor transactions as steps).
    """
    org = OrgScope("bench-throughput")
    flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain_One")
    for _ in range(THROUGHPUT_RUNS):
        flow_run_start(org=org, flow_api_name="Chain_One", inputs={"counter": 0})
    admission = policy.claim_batch()
    per_round, worker_seconds, floor_seconds, statements, commits = [], 0.0, 0.0, 0, 0
    attempts = 0
    while True:
        with cs.counted() as counters:
            began = time.perf_counter()
            worked = flow_try_run_step_one(worker_id="bench-worker")
            worker_seconds += time.perf_counter() - began
        if not worked:
            break
        statements += counters.statements
        commits += counters.commits
        now = FlowStepAttempt.objects.filter(org_id=org.org_id).count()
        per_round.append(now - attempts)
        attempts = now
        floor_seconds += sum(floor() for _ in range(per_round[-1]))
    steps = sum(per_round)
    assert steps == THROUGHPUT_RUNS
    assert FlowRun.objects.filter(org_id=org.org_id, state=t.RUN_SUCCEEDED).count() == THROUGHPUT_RUNS
    full = THROUGHPUT_RUNS // admission
    assert per_round[:full] == [admission] * full and max(per_round) <= admission, per_round
    ratio = worker_seconds / floor_seconds
    print(f"\n22.7-03 durable steps: {steps / worker_seconds:.1f} steps/s at claim admission {admission}, floor "
          f"{steps / floor_seconds:.0f} transactions/s ({ratio:.1f}x a floor transaction per step); "
          f"{statements / steps:.1f} statements and {commits / steps:.2f} commits per step")
    assert commits <= steps * COMMITS_PER_STEP + len(per_round)
    assert statements <= steps * STATEMENTS_PER_STEP
    assert ratio <= STEP_OVER_FLOOR


# =============================================================================================================
# 22.7-07 Checkpoint payload and index growth
# =============================================================================================================
def test_checkpoints_grow_one_bounded_row_per_step_through_the_same_indexes():
    """Seed 004 22.7 "checkpoint payload and index growth" (sections 10.4, 12.2).

    Durable chains of ``CHECKPOINT_CHAINS`` steps write exactly one
    checkpoint per step plus the trigger snapshot; a checkpoint's payload
    does not carry earlier steps (its size is the same in a 4-step and a
    16-step chain, within ``CHECKPOINT_BYTES_SLACK``), so a run's checkpoint
    bytes grow linearly with its steps. Every checkpoint statement a step
    sends reads through an index (never a table or full index scan), the
    same indexes for both chain lengths, examining at most
    ``CHECKPOINT_ROWS_EXAMINED`` rows per run it reads (a claim batch reads
    its runs' checkpoints in one statement) however long the run and however
    many checkpoints the table holds.
    """
    org = OrgScope("bench-checkpoints")
    for steps in CHECKPOINT_CHAINS:
        flow_deploy(org=org, source=cf.durable_chain(steps), flow_api_name=f"Chain_{steps}")
    shapes: dict[int, dict[str, tuple[set, float]]] = {}
    sizes: dict[int, list[tuple[int, int]]] = {}
    for steps in CHECKPOINT_CHAINS:
        runs = [flow_run_start(org=org, flow_api_name=f"Chain_{steps}", inputs={"counter": 0}).run
                for _ in range(CHECKPOINT_RUNS)]
        _, sent = cs.captured_statements(lambda s=steps: run_until_idle(max_rounds=4 * s * CHECKPOINT_RUNS))
        assert FlowRun.objects.filter(pk__in=[r.pk for r in runs], state=t.RUN_SUCCEEDED).count() == CHECKPOINT_RUNS
        with connection.cursor() as cursor:
            for run in runs:
                cursor.execute("SELECT COUNT(*), MAX(LENGTH(context_payload)), SUM(LENGTH(context_payload)) "
                               "FROM flows_flowcheckpoint WHERE org_id = %s AND run_id = %s", [org.org_id, int(run.pk)])
                count, largest, total = cursor.fetchone()
                assert count == steps + 2, (steps, count)  # trigger snapshot + one per step + the Terminal step
                sizes.setdefault(steps, []).append((int(largest), int(total)))
        shapes[steps] = {}
        for sql in sent:
            if not re.match(r"\s*SELECT", sql) or "`flows_flowcheckpoint`" not in sql:
                continue
            shape = re.sub(r"\b\d+\b", "N", sql)
            if shape in shapes[steps]:
                continue
            access = cs.explain(sql)
            for row in access:
                assert row["type"] not in ("ALL", "index"), (shape, access)  # no table or full index scan
            keys = {row["key"] for row in access if row["table"] == "flows_flowcheckpoint"}
            # A claim batch's read covers each of its runs once (``run_id IN (...)``): its bound is per run read.
            listed = re.search(r"`run_id` IN \(([^)]*)\)", sql)
            runs_read = len(listed.group(1).split(",")) if listed else 1
            shapes[steps][shape] = (keys, cs.rows_examined(cs.analyze(sql)) / runs_read)
    short, long = CHECKPOINT_CHAINS
    assert shapes[short] and set(shapes[short]) == set(shapes[long])
    for shape, (keys, examined) in shapes[long].items():
        assert keys == shapes[short][shape][0], (shape, keys, shapes[short][shape])  # the same indexes
        assert examined <= CHECKPOINT_ROWS_EXAMINED and shapes[short][shape][1] <= CHECKPOINT_ROWS_EXAMINED, shape
    largest = {steps: max(s[0] for s in sizes[steps]) for steps in CHECKPOINT_CHAINS}
    assert largest[long] <= largest[short] + CHECKPOINT_BYTES_SLACK, largest
    total = {steps: max(s[1] for s in sizes[steps]) for steps in CHECKPOINT_CHAINS}
    per_step = (total[long] - total[short]) / (long - short)
    assert per_step <= largest[short] + CHECKPOINT_BYTES_SLACK, total  # linear: each added step adds one bounded row
    print(f"\n22.7-07 checkpoints: largest payload {largest} bytes, run totals {total} bytes ({per_step:.0f} per added "
          f"step); "
          f"statements {[(sorted(k), e) for k, e in shapes[long].values()]}")
