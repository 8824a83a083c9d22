"""Hypothesis stateful test: random FlowRun transition sequences against the real database."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun
from nexusflow.flows.reasons import STEP_RETRY_EXHAUSTED
from nexusflow.flows.selectors import flow_runs_nonterminal_count
from nexusflow.flows.store import FlowRunStore
from nexusflow.kernel.errors import IllegalTransition, StaleVersion

pytestmark = pytest.mark.django_db

STATES = sorted(t.FLOW_RUN.states)


def _reason(dst: str) -> dict[str, str]:
    return {"reason_code": STEP_RETRY_EXHAUSTED} if dst in t.FLOW_RUN.reason_required else {}


def test_flow_run_random_sequences_follow_the_table(rows):
    class FlowRunMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.run = rows.run(t.RUN_ACCEPTED)
            self.state, self.version = t.RUN_ACCEPTED, 1

        @rule(data=st.data())
        def legal_move(self, data):
            targets = sorted(t.FLOW_RUN.transitions[self.state])
            if not targets:
                return
            dst = data.draw(st.sampled_from(targets))
            self.version = FlowRunStore.transition(org_id=self.run.org_id, pk=self.run.pk, src=self.state, dst=dst,
                                                   version=self.version, set_fields=_reason(dst))
            self.state = dst

        @rule(dst=st.sampled_from(STATES))
        def any_move(self, dst):
            if t.FLOW_RUN.allows(self.state, dst):
                self.version = FlowRunStore.transition(org_id=self.run.org_id, pk=self.run.pk, src=self.state,
                                                       dst=dst, version=self.version, set_fields=_reason(dst))
                self.state = dst
            else:
                with pytest.raises(IllegalTransition):
                    FlowRunStore.transition(org_id=self.run.org_id, pk=self.run.pk, src=self.state, dst=dst,
                                            version=self.version)

        @rule(stale_by=st.integers(min_value=1, max_value=3))
        def stale_writer_is_fenced(self, stale_by):
            targets = sorted(t.FLOW_RUN.transitions[self.state])
            if not targets:
                return
            with pytest.raises(StaleVersion):
                FlowRunStore.transition(org_id=self.run.org_id, pk=self.run.pk, src=self.state, dst=targets[0],
                                        version=self.version + stale_by, set_fields=_reason(targets[0]))

        @rule()
        def other_org_is_fenced(self):
            targets = sorted(t.FLOW_RUN.transitions[self.state])
            if not targets:
                return
            with pytest.raises(StaleVersion):
                FlowRunStore.transition(org_id="flows-other-org", pk=self.run.pk, src=self.state, dst=targets[0],
                                        version=self.version, set_fields=_reason(targets[0]))

        @invariant()
        def row_matches_the_model(self):
            row = FlowRun.objects.get(pk=self.run.pk)
            assert (row.state, row.version) == (self.state, self.version)
            counted = FlowRun.objects.exclude(state__in=t.FLOW_RUN.settled).filter(pk=self.run.pk).exists()
            assert counted == (self.state not in t.FLOW_RUN.settled)

    run_state_machine_as_test(
        FlowRunMachine,
        settings=settings(max_examples=30, stateful_step_count=12, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]),
    )
    nonterminal = FlowRun.objects.exclude(state__in=t.FLOW_RUN.settled).count()
    assert flow_runs_nonterminal_count(org_id=rows.org.org_id) == nonterminal
