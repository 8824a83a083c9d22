"""Flow rows inserted directly in a chosen state, for transition-table tests."""
from __future__ import annotations

from nexusflow.flows import transitions as t
from nexusflow.flows.models import (
    FlowActivation,
    FlowDependency,
    FlowRun,
    FlowScheduleOccurrence,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)
from nexusflow.flows.reasons import STEP_RETRY_EXHAUSTED
from nexusflow.flows.services import flow_plan_compile
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

ROW_FACTORY = {
    "flows.FlowRun": "run",
    "flows.FlowStepExecution": "step",
    "flows.FlowStepAttempt": "attempt",
    "flows.FlowDependency": "dependency",
    "flows.FlowWakeSignal": "signal",
    "flows.FlowActivation": "activation",
    "flows.FlowScheduleOccurrence": "schedule_occurrence",
}


def _reason(machine, state: str) -> str:
    """A registered code for a state that needs one (the CHECK constraint refuses an empty one)."""
    return STEP_RETRY_EXHAUSTED if state in machine.reason_required else ""


class Rows:
    """Insert Flow rows directly in a chosen state (bypassing the initial-state rule)."""

    def __init__(self, org: OrgScope):
        self.org = org
        self._plan = None

    @property
    def plan(self):
        if self._plan is None:
            from .conftest import decision_flow_xml

            self._plan, _ = flow_plan_compile(org=self.org, source=decision_flow_xml(), flow_api_name="Decide_Only")
        return self._plan

    def run(self, state: str = t.RUN_RUNNABLE) -> FlowRun:
        from .conftest import OBJECT

        now = db_now()
        plan = self.plan
        return insert(
            FlowRun, allow_any_state=True, org_id=self.org.org_id, app_installation_id=plan.app_installation_id,
            runtime_capability_id=plan.runtime_capability_id, binding_digest=plan.runtime_work_binding_digest,
            plan=plan, plan_digest=plan.plan_digest, execution_profile=plan.execution_profile,
            execution_owner="flow_runtime_v2", state=state, version=1, trigger_object_name=OBJECT,
            record_key=f"rk{FlowRun.objects.count() + 1}", record_version=1, created_at=now, updated_at=now,
            reason_code=_reason(t.FLOW_RUN, state), legacy_status=t.legacy_status_of(state),
        )

    def step(self, state: str = t.STEP_PENDING, run: FlowRun | None = None) -> FlowStepExecution:
        now = db_now()
        run = run or self.run()
        return insert(FlowStepExecution, allow_any_state=True, org_id=self.org.org_id, run=run, plan_step_key="decide:Has_Email",
                      step_kind="PureCompute", state=state, version=1, created_at=now, updated_at=now,
                      reason_code=_reason(t.FLOW_STEP_EXECUTION, state))

    def attempt(self, state: str = t.ATTEMPT_STARTED) -> FlowStepAttempt:
        now = db_now()
        return insert(FlowStepAttempt, allow_any_state=True, org_id=self.org.org_id, step=self.step(t.STEP_RUNNING), attempt_number=1,
                      state=state, version=1, lease_owner="w", lease_token_digest="a" * 64, ownership_epoch=1,
                      root_state_version_at_claim=1, retry_policy_digest="b" * 64, recovery_backoff_floor_ms=0,
                      plan_digest=self.plan.plan_digest, started_at=now)

    def dependency(self, state: str = t.DEP_WAITING) -> FlowDependency:
        now = db_now()
        step = self.step(t.STEP_WAITING)
        run = step.run
        return insert(FlowDependency, allow_any_state=True, org_id=self.org.org_id, app_installation_id=run.app_installation_id,
                      runtime_capability_id=run.runtime_capability_id, binding_digest=run.binding_digest, run=run,
                      step=step, producer_kind="runtime.intent_result", dependency_key="42",
                      condition_digest="c" * 64, expiry_policy="quarantine", state=state, version=1, deadline=now,
                      created_at=now, reason_code=_reason(t.FLOW_DEPENDENCY, state))

    def signal(self, state: str = t.SIGNAL_UNMATCHED) -> FlowWakeSignal:
        run = self.run(t.RUN_WAITING)
        return insert(FlowWakeSignal, allow_any_state=True, org_id=self.org.org_id, app_installation_id=run.app_installation_id,
                      runtime_capability_id=run.runtime_capability_id, binding_digest=run.binding_digest,
                      flow_run_id=run.pk, producer_kind="runtime.intent_result", dependency_key="42", receipt_id=7,
                      evidence_digest="d" * 64, state=state, version=1, received_at=db_now())

    def schedule_occurrence(self, state: str = t.OCCURRENCE_ADMITTING) -> FlowScheduleOccurrence:
        now = db_now()
        return insert(FlowScheduleOccurrence, allow_any_state=True, org_id=self.org.org_id,
                      flow_api_name=self.plan.flow_api_name, plan=self.plan, occurrence_at=now, state=state,
                      version=1, created_at=now)

    def activation(self, state: str = t.ACTIVATION_ACTIVE) -> FlowActivation:
        return insert(FlowActivation, allow_any_state=True, org_id=self.org.org_id, flow_api_name=self.plan.flow_api_name, plan=self.plan,
                      state=state, version=1,
                      active_slot=self.plan.flow_api_name if state == t.ACTIVATION_ACTIVE else None,
                      created_at=db_now())


