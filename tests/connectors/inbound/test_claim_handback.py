"""A claim never waits on another lane, and a worker whose unit failed hands its claim back at once.

The ~30 s stall once seen in ``make bench`` (``events_applied``): a lane
claim's locking read of its ready Executions went through the org-wide
``(org_id, state)`` index and so locked ready rows of other lanes; a
completion of one of those (``ready -> completed``) then deadlocked with it.
The victim was the completion, after the Runtime result had committed, so
its live worker kept the claim and the lane waited for the lease (30 s).
Now the claim locks only its own lane's rows, a completion the server rolled
back runs again, and a unit that fails after its claim shortens its own
lease to the database clock so the next claim round takes the Execution
over (a new attempt, the same Runtime result).
"""
from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection

from connectors.inbound import executions
from connectors.inbound.executions import _claim_in_lane, execution_try_run_one
from connectors.models import AccountServingGate, Execution, ExecutionAttempt, OrderingLane, ServingEpoch
from nexusflow.kernel.clock import db_now
from runtime_outbox.models import ApplicationResult
from tests.concurrency import Worker
from tests.conftest import hubspot_event, post_signed
from tests.kernel import rows

ORG = "handback-org"
ORDERING = {"contract": "latest_source_position", "partition": [], "position": ["n"], "tie_breaker": "n",
            "comparator_version": "1"}


def _lanes(count: int, *, history: int = 0) -> list[tuple[OrderingLane, Execution]]:
    """``count`` open lanes with one ready Execution each, after ``history`` lanes of one completed Execution.

    The history is what a serving account looks like (``make bench`` had about 3,000 such rows): to the
    optimizer the lane's foreign-key index then finds one row, and the org's few ``ready`` rows in the
    ``(org_id, state)`` index make a cheap rowid filter for it.
    """
    epoch = rows.make(ServingEpoch, org_id=ORG, state="active", version=1, document={"accounts": [
        {"account_key": "acct", "routes": {"r1": {"ordering": ORDERING}}}]})
    rows.make(AccountServingGate, org_id=ORG, account_key="acct", state="v2_serving", version=1, epoch=epoch,
              epoch_digest=epoch.digest)
    first_lane = rows.make(OrderingLane, org_id=ORG, epoch=epoch, state="open", version=1, route_key="r1")
    template = rows.make(Execution, org_id=ORG, lane=first_lane, state="completed", version=2, position=b"\x01")
    lane_columns = [f"`{f.column}`" for f in OrderingLane._meta.concrete_fields if f.column not in ("id", "partition_key")]
    execution_columns = [f"`{f.column}`" for f in Execution._meta.concrete_fields
                         if f.column not in ("id", "generation", "lane_id", "command_id", "window_id")]
    with connection.cursor() as cursor:
        for i in range(history):  # one lane a statement: the history is set up once, not timed
            cursor.execute(
                f"INSERT INTO connectors_orderinglane ({', '.join(lane_columns)}, partition_key)"
                f" SELECT {', '.join(lane_columns)}, SHA2(CONCAT(partition_key, %s), 256)"
                " FROM connectors_orderinglane WHERE id = %s", [f"-h{i}", first_lane.pk])
        cursor.execute(
            f"INSERT INTO connectors_execution ({', '.join(execution_columns)}, generation, lane_id, command_id)"
            f" SELECT {', '.join('e.' + c for c in execution_columns)}, 1 + l.id, l.id,"
            " SHA2(CONCAT(e.command_id, '-', l.id), 256)"
            " FROM connectors_execution e JOIN connectors_orderinglane l ON l.org_id = e.org_id AND l.id <> %s"
            " WHERE e.id = %s", [first_lane.pk, template.pk])
    made = []
    for i in range(count):
        lane = rows.make(OrderingLane, org_id=ORG, epoch=epoch, state="open", version=1, route_key="r1")
        made.append((lane, rows.make(Execution, org_id=ORG, lane=lane, state="ready", version=1,
                                     position=bytes([1, i % 256]))))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE connectors_execution, connectors_orderinglane")
        cursor.fetchall()
    return made


@pytest.mark.django_db(transaction=True)
def test_a_lane_claim_locks_no_row_of_another_lane_while_one_completes():
    made = _lanes(3, history=3000)
    (_busy_lane, busy), (lane, mine) = made[0], made[2]
    holding, done = threading.Event(), threading.Event()

    def complete_and_hold():
        # What execution_complete's CAS does to another lane's Execution, held open.
        from django.db import transaction

        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("UPDATE connectors_execution SET state = 'completed', version = version + 1 "
                               "WHERE id = %s AND org_id = %s AND state = 'ready'", [busy.pk, ORG])
            holding.set()
            assert done.wait(60)

    holder = Worker(complete_and_hold, "completion")
    holder.start()
    assert holding.wait(60)

    def claim():
        with connection.cursor() as cursor:  # a wait on the holder's rows fails in 1 s instead of queueing
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        return _claim_in_lane(ORG, "acct", lane.pk, "worker-1")

    claimer = Worker(claim, "claim")
    claimer.start()
    claimer.join(60)
    done.set()
    holder.join(60)
    assert holder.error is None
    assert claimer.error is None, f"the claim of lane {lane.pk} waited on another lane's row: {claimer.error!r}"
    assert claimer.result is not None and claimer.result.execution_id == mine.pk
    assert OrderingLane.objects.get(org_id=ORG, pk=lane.pk).active_execution_id == mine.pk
    assert Execution.objects.get(org_id=ORG, pk=busy.pk).state == "completed"


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_a_unit_that_fails_after_its_claim_hands_the_claim_back_and_the_next_round_takes_it(
        client, serving_org, monkeypatch):
    assert post_signed(client, [hubspot_event(9101, 7101, 1000, "email", "a@example.com")]).status_code == 202
    execution = Execution.objects.get(state="ready")
    real = executions.execution_complete
    failures = []

    def complete_then_lose(claim, *, result_id, result=None):
        failures.append(claim.attempt_id)
        raise OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(executions, "execution_complete", complete_then_lose)
    with pytest.raises(OperationalError):
        execution_try_run_one(worker_id="worker-a")
    first = ExecutionAttempt.objects.get(execution_id=execution.pk)
    assert failures == [first.pk] and first.state == "started"
    assert first.lease_expires_at <= db_now(), "the failed unit kept its lease"
    assert OrderingLane.objects.get(pk=execution.lane_id).active_execution_id == execution.pk

    # No clock moves: the very next round (another worker) takes the Execution over and completes it.
    monkeypatch.setattr(executions, "execution_complete", real)
    assert execution_try_run_one(worker_id="worker-b")
    attempts = list(ExecutionAttempt.objects.filter(execution_id=execution.pk).order_by("attempt_number")
                    .values_list("worker_id", "state"))
    assert attempts == [("worker-a", "expired"), ("worker-b", "completed")]
    done = Execution.objects.get(pk=execution.pk)
    assert done.state == "completed"
    # Runtime applied the command once: the takeover's submit returned the first result.
    assert ApplicationResult.objects.filter(command_id=done.command_id).count() == 1
    assert done.runtime_receipt_id == ApplicationResult.objects.get(command_id=done.command_id).pk


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_a_completion_the_server_rolled_back_as_a_deadlock_victim_runs_again(client, serving_org, monkeypatch):
    assert post_signed(client, [hubspot_event(9102, 7102, 1000, "email", "b@example.com")]).status_code == 202
    execution = Execution.objects.get(state="ready")
    from connectors.store import ExecutionStore

    real_transition, victims = ExecutionStore.transition.__func__, []

    def deadlock_once(cls, **kwargs):
        if kwargs.get("dst") == "completed" and not victims:
            victims.append(kwargs["pk"])
            raise OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction")
        return real_transition(cls, **kwargs)

    monkeypatch.setattr(ExecutionStore, "transition", classmethod(deadlock_once))
    assert execution_try_run_one(worker_id="worker-a")
    assert victims == [execution.pk]
    assert Execution.objects.get(pk=execution.pk).state == "completed"
    assert list(ExecutionAttempt.objects.filter(execution_id=execution.pk).values_list("state", flat=True)) == [
        "completed"]
