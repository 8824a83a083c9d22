"""A runtime policy generation that changes a plan-eligibility bound recompiles the Flows it covers (seed 004
section 16.3; docs/operations.md "The runtime policy").

A record-triggered flow creating three Accounts is Bounded Atomic under the compiler's own bounds (10
writes). The org's policy lowers ``atomic_max_writes`` to 2: the flow is deployed again from its kept
source, now Durable Orchestration under ``flows.policy.v2+r10w2``, and the next save runs the new plan. A
flow that requests RunAtomically cannot be proven under the new bound: it keeps its plan and the report
says which bound applied.
"""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import POLICY_VERSION
from nexusflow.flows.errors import CompileError
from nexusflow.flows.models import FlowActivation, FlowRun
from nexusflow.flows.services import flow_compile_check, flow_deploy
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.policy import runtime_policy_publish

from . import flowxml as fx
from .conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True)

ORG = OrgScope("policy-recompile-org")
BOUND = {"plan_bounds": {"atomic_max_writes": 2}}


def _three_accounts(profile: str | None = None) -> bytes:
    creates = [("<recordCreates><name>Make_{i}</name><label>Make {i}</label><locationX>1</locationX>"
                "<locationY>{i}</locationY>{conn}<inputAssignments><field>name</field><value>"
                "<elementReference>$Record.lastname</elementReference></value></inputAssignments>"
                "<object>Account</object></recordCreates>").format(i=i, conn=fx.conn(f"Make_{i + 1}" if i < 3 else None))
               for i in (1, 2, 3)]
    return fx.flow(*creates, start=fx.start("Make_1", trigger="RecordAfterSave", rtt="Create"), profile=profile)


def _active(name: str):
    return FlowActivation.objects.get(org_id=ORG.org_id, flow_api_name=name, state=t.ACTIVATION_ACTIVE).plan


def test_lowering_the_write_bound_recompiles_the_flow_and_the_next_save_runs_the_new_plan():
    first = flow_deploy(org=ORG, source=_three_accounts(), flow_api_name="Three_Accounts").plan
    assert (first.execution_profile, first.policy_version) == ("bounded_atomic", POLICY_VERSION)
    save_record(ORG, {"lastname": "Before"})
    run_until_idle()
    assert FlowRun.objects.get(org_id=ORG.org_id).plan_id == first.pk

    published = runtime_policy_publish(scope=ORG.org_id, document=BOUND, authored_by="ops", reason="smaller")
    [effect] = published.effects
    assert effect["status"] == "recompiled" and effect["policy_version"] == "flows.policy.v2+r10w2"
    assert (effect["from_profile"], effect["to_profile"]) == ("bounded_atomic", "durable_orchestration")
    second = _active("Three_Accounts")
    assert (second.plan_id, second.execution_profile, second.policy_version) == (
        effect["to_plan"], "durable_orchestration", "flows.policy.v2+r10w2")
    assert second.plan_digest != first.plan_digest

    record = save_record(ORG, {"lastname": "After"})
    run_until_idle()
    run = FlowRun.objects.get(org_id=ORG.org_id, record_key=record.record_key)
    assert (run.plan_id, run.state) == (second.pk, t.RUN_SUCCEEDED)
    # The same document again is no new generation and recompiles nothing.
    again = runtime_policy_publish(scope=ORG.org_id, document=BOUND, authored_by="ops", reason="smaller")
    assert (again.created, again.effects) == (False, [])
    # Another org keeps the compiler's own bounds.
    other = flow_deploy(org=OrgScope("other-org"), source=_three_accounts(), flow_api_name="Three_Accounts").plan
    assert (other.execution_profile, other.policy_version) == ("bounded_atomic", POLICY_VERSION)


def test_a_flow_the_new_bound_refuses_keeps_its_plan_and_the_report_names_the_bound():
    kept = flow_deploy(org=ORG, source=_three_accounts("RunAtomically"), flow_api_name="Atomic_Accounts").plan
    assert kept.execution_profile == "bounded_atomic"
    [effect] = runtime_policy_publish(scope=ORG.org_id, document=BOUND, authored_by="ops", reason="smaller").effects
    assert (effect["status"], effect["code"]) == ("refused", "flow_compile_failed")
    assert {d["code"] for d in effect["diagnostics"]} == {"unsafe_atomic_request"}
    assert any("3 writes exceed the policy bound 2 (flows.policy.v2+r10w2)" in d["detail"]
               for d in effect["diagnostics"])
    assert _active("Atomic_Accounts").pk == kept.pk
    with pytest.raises(CompileError) as caught:
        flow_compile_check(source=_three_accounts("RunAtomically"), flow_api_name="Atomic_Accounts", org=ORG)
    assert "exceed the policy bound 2 (flows.policy.v2+r10w2)" in str(caught.value)
