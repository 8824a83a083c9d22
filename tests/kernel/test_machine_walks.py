"""Hypothesis stateful tests: random legal and illegal walks of every stored machine.

For each machine with a store, a rule-based state machine keeps one real row
and its expected ``(state, version)``. Rules draw a listed move (the store must
accept it), an unlisted move (rejected before SQL, row unchanged), a move with
a stale version or from another org (fenced, row unchanged); the invariant
re-reads the row from MariaDB after every step.
"""
from __future__ import annotations

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from nexusflow.kernel.errors import IllegalTransition, StaleVersion

from . import rows
from .test_transition_pairs import MACHINES, STORED, STORES, UNKNOWN_STATE, reason_fields

ORG = "walk-org"
WALK_SETTINGS = settings(max_examples=12, stateful_step_count=12, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def walk_class(name: str) -> type[RuleBasedStateMachine]:
    machine, store = MACHINES[name], STORES[name]
    states = sorted(machine.states)

    class Walk(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            # Each example runs in its own savepoint, so examples never see each other's rows.
            self._example = transaction.atomic(using=store.db())
            self._example.__enter__()
            self.builder = rows.RowBuilder(ORG)
            initial = sorted(machine.initial)[0]
            self.row = self.builder.row(store, initial)
            self.state, self.version = initial, 1
            self.moves = 0

        def _move(self, dst, *, version=None, org_id=ORG):
            return store.transition(org_id=org_id, pk=self.row.pk, src=self.state, dst=dst,
                                    version=self.version if version is None else version,
                                    set_fields=reason_fields(machine, dst))

        @precondition(lambda self: bool(machine.transitions[self.state]))
        @rule(data=st.data())
        def listed_move(self, data):
            dst = data.draw(st.sampled_from(sorted(machine.transitions[self.state])))
            self.version = self._move(dst)
            self.state = dst
            self.moves += 1

        @rule(data=st.data())
        def unlisted_move(self, data):
            illegal = [s for s in states if not machine.allows(self.state, s)] + [UNKNOWN_STATE]
            dst = data.draw(st.sampled_from(illegal))
            with CaptureQueriesContext(connections[store.db()]) as queries:
                with pytest.raises(IllegalTransition):
                    self._move(dst)
            assert len(queries) == 0

        @precondition(lambda self: bool(machine.transitions[self.state]))
        @rule(data=st.data(), skew=st.sampled_from([-1, 1, 7]))
        def stale_version_move(self, data, skew):
            dst = data.draw(st.sampled_from(sorted(machine.transitions[self.state])))
            with pytest.raises(StaleVersion):
                self._move(dst, version=self.version + skew)

        @precondition(lambda self: bool(machine.transitions[self.state]))
        @rule(data=st.data())
        def other_org_move(self, data):
            dst = data.draw(st.sampled_from(sorted(machine.transitions[self.state])))
            with pytest.raises(StaleVersion):
                self._move(dst, org_id="another-org")

        def teardown(self):
            transaction.set_rollback(True, using=store.db())
            self._example.__exit__(None, None, None)

        @invariant()
        def row_matches_the_model(self):
            stored = store.model.objects.get(org_id=ORG, pk=self.row.pk)
            assert (stored.state, stored.version) == (self.state, self.version)
            assert self.version == 1 + self.moves

    Walk.__name__ = f"Walk_{name.replace('.', '_')}"
    return Walk


@pytest.mark.django_db(databases=["default", "control"])
@pytest.mark.parametrize("name", STORED)
def test_random_walks_follow_the_table(name):
    run_state_machine_as_test(walk_class(name), settings=WALK_SETTINGS)
