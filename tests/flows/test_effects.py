"""EffectSubmit -> EffectCompletion against the real Runtime outbox (seed 004 sections 14 and 15).

The org is configured like an operator would (connector configuration,
greenfield cutover, ``flow_deploy`` of the demo Flow); the effect is authored
by the real ``runtime_outbox.services.outbound_command_author`` and completed
by the real ``intent_result_record`` producer.
"""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from django.db import connection, transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.models import (
    FlowCheckpoint,
    FlowDependency,
    FlowEffectLink,
    FlowRun,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)
from nexusflow.flows.selectors import flow_runs_nonterminal_count
from nexusflow.flows.services import effect_root_id_for, flow_try_run_step_one, flow_try_wake_one
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import intent_result_record
from tests.conftest import ORG, ROOT, drain, make_serving_org, subprocess_env

from .conftest import run_until_idle, save_record, wait_for_recovery

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SUBMIT = "submit:Push_Customer_To_Billing"
COMPLETE = "complete:Push_Customer_To_Billing"


@pytest.fixture
def serving(billing_sandbox):
    return make_serving_org(billing_sandbox.base_url)


def _customer(org, **fields):
    return save_record(org, {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee",
                             "lifecyclestage": "customer", **fields})


def _complete(command: OutboundCommand, outcome: str = "finalized") -> IntentResultReceipt:
    with transaction.atomic():
        # A no_effect result needs a declared definite refusal (seed 000); this intent never had an Attempt.
        return intent_result_record(command=command, outcome=outcome, remote_id="cus_test" if outcome == "finalized"
                                    else "", evidence={"test": outcome, "reason": "definite_refusal"})


def _step(run, key):
    return FlowStepExecution.objects.get(run=run, plan_step_key=key)


def test_effect_end_to_end_with_the_real_runtime(serving, billing_sandbox):
    record = _customer(serving)
    save_record(serving, {"email": "bob@example.com", "lifecyclestage": "lead"})
    run = FlowRun.objects.get(org_id=ORG)
    drain()
    run.refresh_from_db()
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    command = OutboundCommand.objects.get()
    assert command.origin_flow_run_id == run.pk and command.effect_slot_id == SUBMIT
    assert command.effect_root_id == effect_root_id_for(org_id=ORG, plan_id=run.plan.plan_id, run_id=run.pk)
    assert (command.app_installation_id, command.runtime_capability_id, command.binding_digest) == (
        run.app_installation_id, run.runtime_capability_id, run.binding_digest)
    link = FlowEffectLink.objects.get()
    assert (link.outbound_command_id, link.effect_handoff_key, link.step_id) == (
        command.pk, command.idempotency_key, _step(run, SUBMIT).pk)
    assert [c["email"] for c in billing_sandbox.state()["customers"]] == [record.fields["email"]]
    completion = _step(run, COMPLETE)
    assert completion.output_checkpoint.context_payload["output"]["outcome"] == "finalized"
    assert [s.state for s in FlowStepExecution.objects.filter(run=run).order_by("id")] == [t.STEP_SUCCEEDED] * 3
    assert flow_runs_nonterminal_count(org_id=ORG) == 0


def test_the_submit_commits_intent_message_link_wait_and_root_together(serving):
    """Seed 004 15.1 (22.5-01): one EffectSubmit transaction commits the canonical Runtime outbox message, the
    effect link, the completion dependency bound to the EffectCompletion step (never to the submit), the
    checkpoint, the submit attempt Committed and step Succeeded, the completion step Waiting, and the root
    Waiting on it."""
    from runtime_outbox.messages import FLOW_EFFECT_SUBMIT
    from runtime_outbox.models import OutboxMessage

    _customer(serving)
    assert flow_try_run_step_one(worker_id="w")  # EffectSubmit
    run = FlowRun.objects.get(org_id=ORG)
    submit, completion = _step(run, SUBMIT), _step(run, COMPLETE)
    command = OutboundCommand.objects.get(origin_flow_run_id=run.pk)
    message = OutboxMessage.objects.get(command=command)
    link = FlowEffectLink.objects.get(run=run)
    dependency = FlowDependency.objects.get(run=run)
    assert (message.family, message.message_key, message.state) == (FLOW_EFFECT_SUBMIT, command.idempotency_key,
                                                                    "pending")
    assert (link.step_id, link.outbound_command_id, link.effect_handoff_key) == (
        submit.pk, command.pk, command.idempotency_key)
    assert (dependency.step_id, dependency.dependency_key, dependency.state) == (
        completion.pk, str(command.pk), t.DEP_WAITING)
    assert [a.state for a in FlowStepAttempt.objects.filter(step=submit)] == [t.ATTEMPT_COMMITTED]
    assert (submit.state, completion.state) == (t.STEP_SUCCEEDED, t.STEP_WAITING)
    assert not FlowStepAttempt.objects.filter(step=completion).exists()  # nothing ran the completion yet
    assert submit.output_checkpoint.context_payload["output"]["outbound_command_id"] == command.pk
    assert (run.state, run.current_step_id, run.current_checkpoint_id) == (
        t.RUN_WAITING, completion.pk, submit.output_checkpoint_id)
    assert flow_try_run_step_one(worker_id="w") is False  # a waiting completion is not claimable


def test_a_receipt_before_the_scheduler_sees_the_wait_resumes_the_bound_completion_once(serving):
    """Seed 004 22.5-10 and 22.4-05: the owner's receipt commits right after the submit, before any Flow
    worker looked at the run; its signal stays unmatched until the periodic match resolves the dependency,
    which wakes only the bound EffectCompletion step; a duplicate wake changes nothing."""
    _customer(serving)
    assert flow_try_run_step_one(worker_id="w")
    run = FlowRun.objects.get(org_id=ORG)
    command = OutboundCommand.objects.get(origin_flow_run_id=run.pk)
    receipt = _complete(command)
    wake = FlowWakeSignal.objects.get()
    assert (wake.dependency_key, wake.receipt_id, wake.state) == (str(command.pk), receipt.pk, t.SIGNAL_UNMATCHED)
    assert flow_try_wake_one() is True
    dependency = FlowDependency.objects.get()
    wake.refresh_from_db()
    assert (dependency.state, dependency.resolution_receipt_id) == (t.DEP_SATISFIED, receipt.pk)
    assert (wake.state, wake.dependency_id) == (t.SIGNAL_CONSUMED, dependency.pk)
    run.refresh_from_db()
    assert (run.state, run.current_step_id, _step(run, COMPLETE).state) == (
        t.RUN_RUNNABLE, _step(run, COMPLETE).pk, t.STEP_PENDING)
    assert flow_try_wake_one() is False  # a duplicate wake is a no-op
    run_until_idle()
    run.refresh_from_db()
    assert run.state == t.RUN_SUCCEEDED
    assert [a.state for a in FlowStepAttempt.objects.filter(step=_step(run, COMPLETE))] == [t.ATTEMPT_COMMITTED]
    assert [a.state for a in FlowStepAttempt.objects.filter(step=_step(run, SUBMIT))] == [t.ATTEMPT_COMMITTED]
    assert OutboundCommand.objects.count() == 1  # completion never resubmits
    assert FlowCheckpoint.objects.filter(step=_step(run, COMPLETE)).count() == 1


def test_no_effect_outcome_fails_the_run(serving):
    _customer(serving)
    assert flow_try_run_step_one(worker_id="w")
    _complete(OutboundCommand.objects.get(), outcome="no_effect")
    run_until_idle()
    run = FlowRun.objects.get(org_id=ORG)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_effect_no_effect")
    assert _step(run, COMPLETE).state == t.STEP_FAILED


def test_deleted_trigger_record_fails_the_submit_step(serving):
    record = _customer(serving)
    with connection.cursor() as cursor:  # the record is deleted before the step runs
        cursor.execute("UPDATE records_record SET is_deleted = 1 WHERE id = %s", [record.pk])
    run_until_idle()
    run = FlowRun.objects.get(org_id=ORG)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_trigger_record_deleted")
    assert _step(run, SUBMIT).state == t.STEP_FAILED
    assert not OutboundCommand.objects.exists() and not FlowEffectLink.objects.exists()


def test_a_push_with_nothing_to_send_ends_benign_while_other_definite_refusals_stay_attention(serving):
    from nexusflow.kernel.reasons import ATTENTION, BENIGN, severity_class_of

    save_record(serving, {"lifecyclestage": "customer"})  # no field the billing mapping sends
    run_until_idle()
    run = FlowRun.objects.get(org_id=ORG)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_step_expected_refusal")
    attempt = FlowStepAttempt.objects.get(step=_step(run, SUBMIT))
    assert attempt.safe_error_code == "mapping_produced_no_body"
    assert not OutboundCommand.objects.exists()
    assert severity_class_of("flow_step_expected_refusal") == BENIGN
    # Any other definite refusal (e.g. a checkpoint holding credential material, see test_fencing) is attention.
    assert severity_class_of("flow_step_definite_refusal") == ATTENTION


def _kill_one_step_before_commit() -> None:
    """Run one step in a worker process that is killed right before its step transaction commits."""
    env = subprocess_env(NEXUS_FAILPOINTS="flow.step.before_commit", NEXUS_FLOW_LEASE_SECONDS="1",
                         NEXUS_FLOW_RETRY_BASE_SECONDS="0")
    code = "from nexusflow.flows.services import flow_try_run_step_one; flow_try_run_step_one(worker_id='doomed')"
    proc = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_submit_killed_before_commit_authors_exactly_one_intent(serving, short_lease):
    _customer(serving)
    _kill_one_step_before_commit()
    run = FlowRun.objects.get(org_id=ORG)
    submit = _step(run, SUBMIT)
    assert submit.state == t.STEP_RUNNING and not OutboundCommand.objects.exists()
    wait_for_recovery()
    assert flow_try_run_step_one(worker_id="w")
    command = OutboundCommand.objects.get()
    _complete(command)
    run_until_idle()
    run.refresh_from_db()
    assert run.state == t.RUN_SUCCEEDED
    assert OutboundCommand.objects.count() == 1 and FlowEffectLink.objects.count() == 1
    assert FlowCheckpoint.objects.filter(step=submit).count() == 1
    assert [a.state for a in FlowStepAttempt.objects.filter(step=submit).order_by("attempt_number")] == [
        t.ATTEMPT_FENCED, t.ATTEMPT_COMMITTED]


def test_variables_set_before_an_effect_are_read_after_it(billing_sandbox):
    """The submit and completion checkpoints carry the run's variables on to the steps after the effect."""
    from nexusflow.flows.services import flow_deploy

    from . import flowxml as fx

    org = make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    push = fx.push("Push", "Echo").replace("crm.sync", "billing.customer")
    source = fx.flow(fx.variable("tag"), fx.variable("echo"),
                     fx.assignment("Tag", "Push", [("tag", "Assign", "<stringValue>set-before</stringValue>")]),
                     push, fx.assignment("Echo", None, [("echo", "Assign", "<elementReference>tag</elementReference>")]),
                     start=fx.start("Tag", trigger="RecordAfterSave"))
    assert flow_deploy(org=org, source=source, flow_api_name="Tag_Push_Echo").activated
    _customer(org)
    drain()
    run = FlowRun.objects.get(org_id=ORG)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    last = FlowCheckpoint.objects.filter(run=run, step=_step(run, "assign:Echo")).get().context_payload
    assert last["context"]["vars"] == {"tag": "set-before", "echo": "set-before"}


def test_a_completion_killed_and_recovered_never_resubmits_the_effect(serving, short_lease):
    """Seed 004 22.5-11: the receipt wakes only the bound EffectCompletion step; a worker killed inside that
    step's transaction, the lease recovery and the retry of the step, and a duplicate wake never run the
    EffectSubmit again nor enqueue another flow.effect.submit message."""
    from runtime_outbox.messages import FLOW_EFFECT_SUBMIT
    from runtime_outbox.models import OutboxMessage

    _customer(serving)
    assert flow_try_run_step_one(worker_id="w")  # EffectSubmit
    run = FlowRun.objects.get(org_id=ORG)
    _complete(OutboundCommand.objects.get(origin_flow_run_id=run.pk))
    assert flow_try_wake_one() is True
    _kill_one_step_before_commit()
    assert _step(run, COMPLETE).state == t.STEP_RUNNING
    wait_for_recovery()
    assert flow_try_wake_one() is False  # the consumed signal does not wake it twice
    run_until_idle()
    run.refresh_from_db()
    assert run.state == t.RUN_SUCCEEDED
    assert [a.state for a in FlowStepAttempt.objects.filter(step=_step(run, COMPLETE)).order_by("attempt_number")] == [
        t.ATTEMPT_FENCED, t.ATTEMPT_COMMITTED]
    assert FlowStepAttempt.objects.filter(step=_step(run, SUBMIT)).count() == 1
    assert OutboundCommand.objects.count() == 1 and FlowEffectLink.objects.count() == 1
    assert OutboxMessage.objects.filter(family=FLOW_EFFECT_SUBMIT).count() == 1
