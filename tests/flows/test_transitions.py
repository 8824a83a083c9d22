"""The Flow state machines are the seed 004 section 11 tables; stores guard them.

Every (src, dst) pair of every machine, Flow machines included, is checked
against its store in tests/kernel/test_transition_pairs.py.
"""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.kernel.errors import IllegalTransition, ImmutableRow

from .rows import ROW_FACTORY

pytestmark = pytest.mark.django_db


def test_the_machines_are_the_seed_tables():
    assert t.FLOW_RUN.transitions[t.RUN_RUNNING] == {"Runnable", "Waiting", "Succeeded", "TerminalFailed",
                                                     "Quarantined", "CancelRequested"}
    assert t.FLOW_RUN.terminal == {"Succeeded", "TerminalFailed", "Quarantined", "Cancelled"}
    assert t.FLOW_STEP_EXECUTION.transitions[t.STEP_WAITING] == {"CancelRequested", "Pending", "Failed",
                                                                 "Quarantined"}
    assert t.FLOW_STEP_ATTEMPT.transitions[t.ATTEMPT_STARTED] == {
        "Committed", "RolledBack", "CommitUnknown", "RollbackUnknown", "PreTransactionFailed", "Fenced",
        "Cancelled", "Abandoned"}
    assert t.FLOW_DEPENDENCY.transitions[t.DEP_WAITING] == {"satisfied", "expired", "rejected", "cancelled",
                                                            "quarantined"}


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
