"""Every (src, dst) pair of every Flow state machine against real rows (seed 004 section 11)."""
from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nexusflow.flows import transitions as t
from nexusflow.flows.reasons import STEP_RETRY_EXHAUSTED
from nexusflow.flows.store import STORES
from nexusflow.kernel.errors import IllegalTransition, ImmutableRow

pytestmark = pytest.mark.django_db

ROW_FACTORY = {
    "flows.FlowRun": "run",
    "flows.FlowStepExecution": "step",
    "flows.FlowStepAttempt": "attempt",
    "flows.FlowDependency": "dependency",
    "flows.FlowWakeSignal": "signal",
    "flows.FlowActivation": "activation",
}
CASES = [
    (machine.name, src, dst)
    for machine in t.MACHINES
    for src, dst in itertools.product(sorted(machine.states), repeat=2)
]


def test_the_machines_are_the_seed_tables():
    assert t.FLOW_RUN.transitions[t.RUN_RUNNING] == {"Runnable", "Waiting", "Succeeded", "TerminalFailed",
                                                     "Quarantined", "CancelRequested"}
    assert t.FLOW_RUN.terminal == {"Succeeded", "TerminalFailed", "Quarantined", "Cancelled"}
    assert t.FLOW_STEP_EXECUTION.transitions[t.STEP_WAITING] == {"CancelRequested", "Pending", "Failed",
                                                                 "Quarantined"}
    assert t.FLOW_STEP_ATTEMPT.transitions[t.ATTEMPT_STARTED] == {
        "Committed", "RolledBack", "CommitUnknown", "RollbackUnknown", "PreTransactionFailed", "Fenced",
        "Cancelled", "Abandoned"}
    assert t.FLOW_DEPENDENCY.transitions[t.DEP_WAITING] == {"satisfied", "expired", "rejected"}
    for machine in t.MACHINES:
        reachable, frontier = set(machine.initial), list(machine.initial)
        while frontier:
            for nxt in machine.transitions[frontier.pop()]:
                if nxt not in reachable:
                    reachable.add(nxt)
                    frontier.append(nxt)
        assert reachable == set(machine.states), machine.name


@pytest.mark.parametrize("name,src,dst", CASES, ids=[f"{n.split('.')[1]}:{s}->{d}" for n, s, d in CASES])
def test_pair_is_accepted_only_if_listed(rows, name, src, dst):
    store = STORES[name]
    row = getattr(rows, ROW_FACTORY[name])(src)
    if store.machine.allows(src, dst):
        reason = {"reason_code": STEP_RETRY_EXHAUSTED} if dst in store.machine.reason_required else None
        new_version = store.transition(org_id=row.org_id, pk=row.pk, src=src, dst=dst, version=row.version,
                                       set_fields=reason)
        fresh = type(row).objects.get(pk=row.pk)
        assert (fresh.state, fresh.version) == (dst, row.version + 1) == (dst, new_version)
    else:
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(IllegalTransition):
                store.transition(org_id=row.org_id, pk=row.pk, src=src, dst=dst, version=row.version)
        assert len(queries) == 0
        fresh = type(row).objects.get(pk=row.pk)
        assert (fresh.state, fresh.version) == (src, row.version)


@pytest.mark.parametrize("name", sorted(ROW_FACTORY))
def test_stateful_rows_cannot_be_saved_or_deleted_directly(rows, name):
    row = getattr(rows, ROW_FACTORY[name])()
    row.state = "Hacked"
    with pytest.raises(ImmutableRow):
        row.save()
    with pytest.raises(ImmutableRow):
        row.delete()
    with pytest.raises(ImmutableRow):
        type(row).objects.filter(pk=row.pk).update(state="Hacked")
    assert type(row).objects.get(pk=row.pk).state != "Hacked"


def test_rows_are_only_inserted_in_an_initial_state(rows):
    from nexusflow.flows.store import FlowRunStore

    with pytest.raises(IllegalTransition):
        FlowRunStore.create(state=t.RUN_RUNNING)


def test_a_wrong_org_or_version_moves_nothing(rows):
    from nexusflow.flows.store import FlowRunStore
    from nexusflow.kernel.errors import StaleVersion

    run = rows.run(t.RUN_RUNNABLE)
    with pytest.raises(StaleVersion):
        FlowRunStore.transition(org_id="other-org", pk=run.pk, src=t.RUN_RUNNABLE, dst=t.RUN_RUNNING, version=1)
    with pytest.raises(StaleVersion):
        FlowRunStore.transition(org_id=run.org_id, pk=run.pk, src=t.RUN_RUNNABLE, dst=t.RUN_RUNNING, version=2)
    run.refresh_from_db()
    assert (run.state, run.version) == (t.RUN_RUNNABLE, 1)
