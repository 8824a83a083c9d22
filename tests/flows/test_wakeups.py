"""Wake hints between flow workers (nexusflow/flows/wakeups.py) and the ``flow.step`` unit that listens for them.

A hint is only a reason to look again: these tests prove that a committed start hints a listener, a
rolled-back one does not, an idle unit claims a run committed while it listens, and the run still goes
through the ordinary claim (its attempt, lease and checkpoints). Real commits (``transaction=True``).
"""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from django.db import connection, transaction

from nexusflow.flows import transitions as t
from nexusflow.flows import wakeups
from nexusflow.flows.models import FlowRun, FlowStepAttempt
from nexusflow.flows.services import flow_deploy, flow_run_start, flow_try_run_step_or_wait_one
from tests.bench import capacity_flows as cf

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def chain(org):
    return flow_deploy(org=org, source=cf.durable_chain(1), flow_api_name="Chain_One").plan


@pytest.fixture
def peer():
    """A second listener, as another worker process of the same database would bind."""
    folder = wakeups.directory()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"peer-{os.getpid()}-{time.monotonic_ns()}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield wakeups.Listener(path, sock)
    wakeups.Listener(path, sock).close()


def test_a_commit_hints_a_listener_and_a_rollback_does_not(org, chain, peer):
    peer.drain()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            wakeups.hint_after_commit(wakeups.SIGNAL)
            raise RuntimeError("roll back")
    assert peer.drain() == frozenset()
    flow_run_start(org=org, flow_api_name="Chain_One", inputs={"counter": 0})  # Accepted -> Runnable, committed
    assert peer.wait(5.0) == {wakeups.RUNNABLE}


def test_an_idle_step_unit_claims_a_run_committed_while_it_listens(org, chain, monkeypatch):
    own = wakeups.listener()
    own.drain()
    listening = threading.Event()
    real_wait = wakeups.Listener.wait

    def wait(self, seconds):
        listening.set()
        return real_wait(self, seconds)

    monkeypatch.setattr(wakeups.Listener, "wait", wait)
    started: dict = {}

    def start_then_hint():
        assert listening.wait(10)  # the unit found nothing due and listens now
        try:
            started["run"] = flow_run_start(org=org, flow_api_name="Chain_One", inputs={"counter": 0}).run.pk
        finally:
            connection.close()
        # A worker never hints itself; another process's commit would hint this listener like this.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(wakeups.RUNNABLE, own.path)

    thread = threading.Thread(target=start_then_hint)
    thread.start()
    assert flow_try_run_step_or_wait_one(worker_id="listening", seconds=30.0) is True
    thread.join(10)
    run = FlowRun.objects.get(pk=started["run"])
    # Claimed through the ordinary claim: one attempt under this worker's lease, the step committed.
    attempt = FlowStepAttempt.objects.get(step__run=run)
    assert (attempt.lease_owner, attempt.state) == ("listening", t.ATTEMPT_COMMITTED)


def test_an_idle_step_unit_without_a_hint_reports_no_work_after_its_window(org, chain):
    wakeups.listener().drain()
    began = time.monotonic()
    assert flow_try_run_step_or_wait_one(worker_id="idle", seconds=0.2) is False
    assert time.monotonic() - began >= 0.2


def test_a_listener_whose_process_ended_is_removed_by_the_next_hints(org):
    folder = wakeups.directory()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "gone-0.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.close()  # bound once, nobody reads it any more: the file stays behind
    for _ in range(len(os.listdir(folder)) + 1):  # one listener per hint, in turn
        wakeups.hint_after_commit(wakeups.RUNNABLE)  # outside a transaction: sent now
    assert not os.path.exists(path)
