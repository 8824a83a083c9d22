"""Fixtures for the Flow Runtime tests: flows, plans and rows in any state."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.reasons import STEP_RETRY_EXHAUSTED
from nexusflow.flows.models import (
    FlowActivation,
    FlowDependency,
    FlowRun,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)
from nexusflow.flows.services import flow_plan_compile
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

ROOT = Path(settings.BASE_DIR)
DEMO_FLOW = ROOT / "metadata" / "flows" / "Contact_Push_Customer_To_Billing.flow-meta.xml"
CORPUS = Path("/work/shared/corpus/flows")
FLOW_ORG = "flows-test-org"
OBJECT = "Contact"  # the demo metadata object (tests may name it; L0 code may not)


def decision_flow_xml(*, filter_value: str = "customer", record_trigger_type: str = "CreateAndUpdate",
                      extra_elements: str = "", start_target: str = "Has_Email") -> bytes:
    """A record-triggered flow with one decision and no effect: decide -> end."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Flow xmlns="http://soap.sforce.com/2006/04/metadata">
    <apiVersion>62.0</apiVersion>
    <decisions>
        <name>Has_Email</name>
        <label>Has Email</label>
        <locationX>176</locationX>
        <locationY>287</locationY>
        <defaultConnectorLabel>Default Outcome</defaultConnectorLabel>
        <rules>
            <name>Yes</name>
            <conditionLogic>and</conditionLogic>
            <conditions>
                <leftValueReference>$Record.email</leftValueReference>
                <operator>IsNull</operator>
                <rightValue>
                    <booleanValue>false</booleanValue>
                </rightValue>
            </conditions>
            <label>Yes</label>
        </rules>
    </decisions>{extra_elements}
    <label>Decide Only</label>
    <processType>AutoLaunchedFlow</processType>
    <start>
        <locationX>50</locationX>
        <locationY>0</locationY>
        <connector>
            <targetReference>{start_target}</targetReference>
        </connector>
        <filterLogic>and</filterLogic>
        <filters>
            <field>lifecyclestage</field>
            <operator>EqualTo</operator>
            <value>
                <stringValue>{filter_value}</stringValue>
            </value>
        </filters>
        <object>{OBJECT}</object>
        <recordTriggerType>{record_trigger_type}</recordTriggerType>
        <triggerType>RecordAfterSave</triggerType>
    </start>
    <status>Active</status>
</Flow>
""".encode()


@pytest.fixture
def org() -> OrgScope:
    return OrgScope(FLOW_ORG)


@pytest.fixture
def demo_source() -> bytes:
    return DEMO_FLOW.read_bytes()


@pytest.fixture
def short_lease(monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")


def save_record(org: OrgScope, values: dict, *, object_name: str = OBJECT):
    from nexusflow.records.services import record_create

    with transaction.atomic():
        return record_create(org=org, object_name=object_name, values=values)


def update_record(org: OrgScope, record, changes: dict):
    from nexusflow.records.services import record_lock, record_update

    with transaction.atomic():
        locked = record_lock(org=org, object_name=record.object_name, record_key=record.record_key)
        record_update(org=org, record=locked, changes=changes)
        return locked


def run_until_idle(*, worker_id: str = "test-worker", max_rounds: int = 50) -> int:
    """Run the Flow worker units in-process until none has work."""
    from nexusflow.flows.services import flow_try_recover_expired_one, flow_try_run_step_one, flow_try_wake_one

    done = 0
    for _ in range(max_rounds):
        worked = [flow_try_wake_one(), flow_try_run_step_one(worker_id=worker_id), flow_try_recover_expired_one()]
        done += sum(worked)
        if not any(worked):
            return done
    raise AssertionError("flow work did not drain")


def wait_for_recovery(timeout: float = 10.0) -> None:
    """Poll expired-lease recovery until it fences one attempt."""
    from nexusflow.flows.services import flow_try_recover_expired_one

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if flow_try_recover_expired_one():
            return
        time.sleep(0.1)
    raise AssertionError("no expired lease was recovered")


# --- rows in arbitrary states (for transition-table tests) --------------------
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
            self._plan, _ = flow_plan_compile(org=self.org, source=decision_flow_xml(), flow_api_name="Decide_Only")
        return self._plan

    def run(self, state: str = t.RUN_RUNNABLE) -> FlowRun:
        now = db_now()
        plan = self.plan
        return insert(
            FlowRun, org_id=self.org.org_id, app_installation_id=plan.app_installation_id,
            runtime_capability_id=plan.runtime_capability_id, binding_digest=plan.runtime_work_binding_digest,
            plan=plan, plan_digest=plan.plan_digest, execution_profile=plan.execution_profile,
            execution_owner="flow_runtime_v2", state=state, version=1, trigger_object_name=OBJECT,
            record_key=f"rk{FlowRun.objects.count() + 1}", record_version=1, created_at=now, updated_at=now,
            reason_code=_reason(t.FLOW_RUN, state),
        )

    def step(self, state: str = t.STEP_PENDING, run: FlowRun | None = None) -> FlowStepExecution:
        now = db_now()
        run = run or self.run()
        return insert(FlowStepExecution, org_id=self.org.org_id, run=run, plan_step_key="decide:Has_Email",
                      step_kind="PureCompute", state=state, version=1, created_at=now, updated_at=now,
                      reason_code=_reason(t.FLOW_STEP_EXECUTION, state))

    def attempt(self, state: str = t.ATTEMPT_STARTED) -> FlowStepAttempt:
        now = db_now()
        return insert(FlowStepAttempt, org_id=self.org.org_id, step=self.step(t.STEP_RUNNING), attempt_number=1,
                      state=state, version=1, lease_owner="w", lease_token_digest="a" * 64, ownership_epoch=1,
                      root_state_version_at_claim=1, retry_policy_digest="b" * 64, recovery_backoff_floor_ms=0,
                      plan_digest=self.plan.plan_digest, started_at=now)

    def dependency(self, state: str = t.DEP_WAITING) -> FlowDependency:
        now = db_now()
        step = self.step(t.STEP_WAITING)
        run = step.run
        return insert(FlowDependency, org_id=self.org.org_id, app_installation_id=run.app_installation_id,
                      runtime_capability_id=run.runtime_capability_id, binding_digest=run.binding_digest, run=run,
                      step=step, producer_kind="runtime.intent_result", dependency_key="42",
                      condition_digest="c" * 64, expiry_policy="quarantine", state=state, version=1, deadline=now,
                      created_at=now, reason_code=_reason(t.FLOW_DEPENDENCY, state))

    def signal(self, state: str = t.SIGNAL_UNMATCHED) -> FlowWakeSignal:
        run = self.run(t.RUN_WAITING)
        return insert(FlowWakeSignal, org_id=self.org.org_id, app_installation_id=run.app_installation_id,
                      runtime_capability_id=run.runtime_capability_id, binding_digest=run.binding_digest,
                      flow_run_id=run.pk, producer_kind="runtime.intent_result", dependency_key="42", receipt_id=7,
                      evidence_digest="d" * 64, state=state, version=1, received_at=db_now())

    def activation(self, state: str = t.ACTIVATION_ACTIVE) -> FlowActivation:
        return insert(FlowActivation, org_id=self.org.org_id, flow_api_name=self.plan.flow_api_name, plan=self.plan,
                      state=state, version=1,
                      active_slot=self.plan.flow_api_name if state == t.ACTIVATION_ACTIVE else None,
                      created_at=db_now())


@pytest.fixture
def rows(org) -> Rows:
    return Rows(org)
