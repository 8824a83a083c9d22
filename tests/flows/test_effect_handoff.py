"""Handoff dead-letter convergence of ``flow.effect.submit`` (seed 004 sections 10.7, 15.1 and 15.4).

The org is configured like an operator would and the demo Flow's EffectSubmit
authors the real intent and its canonical message. The effect owner is made
unavailable by replacing the family's consumer in this process (its inbox
refuses every delivery); the owner's real ``RejectIfUnaccepted`` fence
answers the reconciliation. Budgets are the runtime policy's settings; time
moves with the database clock, never a sleep.
"""
from __future__ import annotations

import signal

import pytest
from django.db import OperationalError, transaction

from connectors.models import RemoteEffect
from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowAuditEvent, FlowDependency, FlowRun, FlowStepExecution
from nexusflow.flows.services import flow_try_run_step_one, flow_try_wake_one
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope
from runtime_outbox import handoff, messages
from runtime_outbox.models import InboxAcceptance, OutboundCommand, OutboxMessage
from runtime_outbox.services import intent_result_record, outbox_try_deliver_one
from tests.conftest import ORG, make_serving_org, run_manage, subprocess_env

from .conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

COMPLETE = "complete:Push_Customer_To_Billing"
ORG_SCOPE = OrgScope(ORG)
HOUR = 3600


class OwnerUnavailable(NexusError):
    code = "owner_unavailable"


@pytest.fixture
def budgets(settings):
    settings.NEXUS_HANDOFF_DELIVERY_MAX_ATTEMPTS = 3
    settings.NEXUS_HANDOFF_DELIVERY_MIN_AGE_SECONDS = HOUR
    settings.NEXUS_HANDOFF_RECONCILE_MAX_ATTEMPTS = 2


@pytest.fixture
def submitted(billing_sandbox, budgets) -> FlowRun:
    """A run whose EffectSubmit committed: completion step and root Waiting, its message pending."""
    org = make_serving_org(billing_sandbox.base_url)
    save_record(org, {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee", "lifecyclestage": "customer"})
    assert flow_try_run_step_one(worker_id="w")
    run = FlowRun.objects.get(org_id=ORG)
    assert run.state == t.RUN_WAITING
    return run


@pytest.fixture
def owner_down(monkeypatch):
    """The effect owner's inbox refuses every delivery; ``owner_down.calls`` counts them."""
    calls = []

    def refuse(envelope):
        calls.append(envelope.outbox_message_id)
        raise OwnerUnavailable("the effect owner is down")

    monkeypatch.setitem(messages.REGISTRY._consumers, messages.FLOW_EFFECT_SUBMIT, refuse)
    refuse.calls = calls
    return refuse


def _message(run) -> OutboxMessage:
    return OutboxMessage.objects.get(family=messages.FLOW_EFFECT_SUBMIT, payload__flow_run_id=int(run.pk))


def _spend_delivery_budget(run, db_clock_advance, *, tries: int | None = None) -> OutboxMessage:
    """Deliver ``tries`` times (default: the budget; each try backs off, the clock moves past it), then once
    the message is old enough the relay moves it to reconciling."""
    for _ in range(tries or handoff.delivery_max_attempts()):
        assert outbox_try_deliver_one() is True
        assert _message(run).state == "pending"
        db_clock_advance(61)
    assert _message(run).state == "pending"  # tries spent, but younger than the minimum age: it keeps trying
    db_clock_advance(HOUR)
    assert outbox_try_deliver_one() is True
    message = _message(run)
    assert message.state == "reconciling"
    return message


def _flow_rows(run):
    run = FlowRun.objects.get(pk=run.pk)
    completion = FlowStepExecution.objects.get(run=run, plan_step_key=COMPLETE)
    dependency = FlowDependency.objects.get(run=run)
    return run, completion, dependency


def _no_terminal_non_delivery_beside_a_waiting_flow():
    """Seed 004 22.5-20: a handoff_rejected / dead_lettered message never coexists with its waiting Flow."""
    for message in OutboxMessage.objects.filter(state__in=("handoff_rejected", "dead_lettered")):
        dependency = FlowDependency.objects.get(run_id=message.payload["flow_run_id"],
                                                dependency_key=str(message.payload["command_id"]))
        assert dependency.state != t.DEP_WAITING
        assert FlowRun.objects.get(pk=message.payload["flow_run_id"]).state != t.RUN_WAITING


def test_a_handoff_the_owner_never_accepted_is_rejected_and_takes_the_no_effect_route(
        submitted, owner_down, db_clock_advance):
    """Seed 004 22.5-13: delivery budget spent -> reconciling (never a silent dead letter) -> the owner's fence
    records a rejected tombstone -> one root-first transaction fails the completion step and the run along
    its compiled no-effect route, and only then the message becomes handoff_rejected. A late delivery of the
    same message can never create the effect."""
    message = _spend_delivery_budget(submitted, db_clock_advance)
    assert len(owner_down.calls) == handoff.delivery_max_attempts()
    run, completion, dependency = _flow_rows(submitted)
    assert (run.state, completion.state, dependency.state) == (t.RUN_WAITING, t.STEP_WAITING, t.DEP_WAITING)
    assert handoff.outbox_try_reconcile_one() is True
    run, completion, dependency = _flow_rows(submitted)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_effect_handoff_rejected")
    assert (completion.state, dependency.state, dependency.reason_code) == (
        t.STEP_FAILED, t.DEP_REJECTED, "flow_effect_handoff_rejected")
    fence = InboxAcceptance.objects.get(message_key=message.message_key)
    assert (fence.state, fence.outbox_message_id, fence.payload_digest) == (
        "rejected", message.pk, message.payload_digest)
    assert _message(submitted).state == "handoff_rejected"
    audit = FlowAuditEvent.objects.get(run=run, event="effect_handoff_finalized")
    assert (audit.detail["verdict"], audit.detail["outcome"]) == ("rejected", "terminal_failure")
    _no_terminal_non_delivery_beside_a_waiting_flow()
    assert handoff.outbox_try_reconcile_one() is False  # nothing left to reconcile
    # The owner comes back and the same envelope arrives late: the tombstone refuses it; no effect exists.
    with pytest.raises(messages.InboxRejected):
        messages.REGISTRY._consumers.pop(messages.FLOW_EFFECT_SUBMIT)
        from connectors.outbound.inbox import outbound_message_accept

        outbound_message_accept(messages.envelope_of(_message(submitted)))
    assert not RemoteEffect.objects.exists()
    assert OutboundCommand.objects.count() == 1


def test_a_lost_acknowledgement_is_repaired_as_delivered_and_the_flow_keeps_waiting(
        submitted, monkeypatch, db_clock_advance):
    """Seed 004 15.4 ``Accepted`` and 22.5-20: the owner accepted (its effect exists) but every acknowledgement
    was lost; reconciliation finds the acceptance, marks the message delivered, and the run keeps waiting for
    the separate completion receipt (DELIVERED beside a Waiting root)."""
    from connectors.outbound.inbox import outbound_message_accept

    def accept_then_lose_the_answer(envelope):
        outbound_message_accept(envelope)
        raise OwnerUnavailable("the acknowledgement was lost")

    monkeypatch.setitem(messages.REGISTRY._consumers, messages.FLOW_EFFECT_SUBMIT, accept_then_lose_the_answer)
    _spend_delivery_budget(submitted, db_clock_advance)
    assert RemoteEffect.objects.count() == 1
    assert handoff.outbox_try_reconcile_one() is True
    assert _message(submitted).state == "delivered"
    run, completion, dependency = _flow_rows(submitted)
    assert (run.state, completion.state, dependency.state) == (t.RUN_WAITING, t.STEP_WAITING, t.DEP_WAITING)
    assert InboxAcceptance.objects.get().state == "accepted" and RemoteEffect.objects.count() == 1
    with transaction.atomic():  # the owner's completion receipt still resumes the run
        intent_result_record(command=OutboundCommand.objects.get(), outcome="finalized", remote_id="cus_1",
                             evidence={})
    assert flow_try_wake_one() is True
    run_until_idle()
    assert FlowRun.objects.get(pk=submitted.pk).state == t.RUN_SUCCEEDED


@pytest.mark.parametrize("fence_error", ["unavailable", "conflict"])
def test_acceptance_unknown_quarantines_dependency_step_and_root_together(
        submitted, owner_down, monkeypatch, db_clock_advance, fence_error):
    """Seed 004 22.5-14 and 22.5-19: a fence that stays unavailable past the reconciliation budget, or fails
    closed on a conflicting key, is AcceptanceUnknown, never proof of rejection: the dependency, the
    completion step and the run are quarantined in one transaction, the message dead-lettered with them, and
    no tombstone is written (the owner may still hold the command)."""
    _spend_delivery_budget(submitted, db_clock_advance)
    asked = []

    def fence(**kwargs):
        asked.append(kwargs)
        if fence_error == "unavailable":
            raise OperationalError(2013, "Lost connection to MySQL server during query")
        raise messages.InboxConflict("fenced with other validation attributes", code="inbox_digest_conflict")

    monkeypatch.setattr(messages, "inbox_reject_if_unaccepted", fence)
    assert handoff.outbox_try_reconcile_one() is True
    if fence_error == "unavailable":  # a lost answer is asked again, after a backoff
        assert _message(submitted).state == "reconciling"
        assert _flow_rows(submitted)[0].state == t.RUN_WAITING
        assert handoff.outbox_try_reconcile_one() is False  # not due yet
        db_clock_advance(61)
        assert handoff.outbox_try_reconcile_one() is True
    assert len(asked) == (handoff.reconcile_max_attempts() if fence_error == "unavailable" else 1)
    run, completion, dependency = _flow_rows(submitted)
    assert (run.state, run.reason_code) == (t.RUN_QUARANTINED, "flow_effect_acceptance_unknown")
    assert (completion.state, dependency.state) == (t.STEP_QUARANTINED, t.DEP_QUARANTINED)
    assert _message(submitted).state == "dead_lettered"
    assert not InboxAcceptance.objects.exists()
    _no_terminal_non_delivery_beside_a_waiting_flow()


def test_reconciliation_asks_the_fence_with_the_persisted_message_values(submitted, owner_down, monkeypatch,
                                                                         db_clock_advance):
    """Seed 004 22.5-17: the four values handed to RejectIfUnaccepted are the persisted message's own."""
    message = _spend_delivery_budget(submitted, db_clock_advance)
    real, asked = messages.inbox_reject_if_unaccepted, []

    def spy(**kwargs):
        asked.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(messages, "inbox_reject_if_unaccepted", spy)
    assert handoff.outbox_try_reconcile_one() is True
    [values] = asked
    assert (values["scope"], values["family"], values["message_key"], values["payload_digest"],
            values["outbox_message_id"]) == (messages.scope_of(message), message.family, message.message_key,
                                             message.payload_digest, message.pk)
    assert (message.org_id, message.binding_digest) == (submitted.org_id, submitted.binding_digest)


def test_a_receipt_that_won_before_the_reconciliation_is_left_alone(submitted, owner_down, monkeypatch,
                                                                   db_clock_advance):
    """The owner's completion came (through another path) before the reconciliation finalized: the Flow's
    finalizer finds the dependency satisfied and changes nothing; the message still ends terminal."""
    _spend_delivery_budget(submitted, db_clock_advance)
    with transaction.atomic():
        intent_result_record(command=OutboundCommand.objects.get(), outcome="finalized", remote_id="cus_1",
                             evidence={})
    assert flow_try_wake_one() is True
    assert handoff.outbox_try_reconcile_one() is True
    assert _message(submitted).state == "handoff_rejected"
    run_until_idle()
    assert FlowRun.objects.get(pk=submitted.pk).state == t.RUN_SUCCEEDED
    assert not FlowAuditEvent.objects.filter(event="effect_handoff_finalized").exists()


@pytest.mark.parametrize("failpoint", ["outbox.reconcile.after_fence", "outbox.reconcile.finalize_before_commit"])
def test_a_runtime_worker_killed_while_reconciling_converges_once(submitted, owner_down, db_clock_advance,
                                                                  failpoint):
    """Killed after the tombstone committed (before the Flow finalized), or inside the finalizing transaction:
    the message stays reconciling beside the waiting run; the next sweep reads the same tombstone and
    finalizes exactly once."""
    _spend_delivery_budget(submitted, db_clock_advance)
    crashed = run_manage(["run_workers", "--role", "runtime", "--until-idle"],
                         subprocess_env(NEXUS_FAILPOINTS=failpoint, NEXUS_HANDOFF_DELIVERY_MAX_ATTEMPTS="3",
                                        NEXUS_HANDOFF_DELIVERY_MIN_AGE_SECONDS=str(HOUR)), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert _message(submitted).state == "reconciling"
    assert _flow_rows(submitted)[0].state == t.RUN_WAITING
    assert InboxAcceptance.objects.get().state == "rejected"  # the fence's answer is durable
    db_clock_advance(61)
    assert handoff.outbox_try_reconcile_one() is True
    assert _message(submitted).state == "handoff_rejected"
    assert _flow_rows(submitted)[0].state == t.RUN_TERMINAL_FAILED
    assert FlowAuditEvent.objects.filter(event="effect_handoff_finalized").count() == 1
    assert InboxAcceptance.objects.count() == 1
    _no_terminal_non_delivery_beside_a_waiting_flow()


def test_no_owner_command_exists_and_no_remote_call_happens_before_the_submit_commits(billing_sandbox, budgets,
                                                                                      holds):
    """Seed 004 22.5-04 and 22.5-23: while the EffectSubmit transaction is held open right before its commit,
    the relay sees no message, the owner holds no command (RemoteEffect) and the provider got no request; the
    remote call happens only after the owner accepted the committed message."""
    from connectors.outbound.egress import effect_try_dispatch_one
    from tests.concurrency import Worker

    org = make_serving_org(billing_sandbox.base_url)
    save_record(org, {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee", "lifecyclestage": "customer"})
    holds.arm("flow.step.before_commit")
    submit = Worker(lambda: flow_try_run_step_one(worker_id="w"), "submit")
    submit.start()
    marker = holds.wait_held("flow.step.before_commit")
    assert outbox_try_deliver_one() is False  # the message is not visible before the commit
    assert not RemoteEffect.objects.exists() and not OutboxMessage.objects.exists()
    assert billing_sandbox._state.requests.count == 0
    holds.release(marker)
    submit.join(60)
    assert (submit.error, submit.result) == (None, True)
    assert billing_sandbox._state.requests.count == 0  # the submit itself called nobody
    assert outbox_try_deliver_one() is True
    assert RemoteEffect.objects.count() == 1 and billing_sandbox._state.requests.count == 0
    while effect_try_dispatch_one(worker_id="egress-1"):
        pass
    assert billing_sandbox._state.requests.count >= 1  # the owner's egress, after acceptance, outside Flow


def test_no_flow_specific_outbox_claimer_or_state_machine_exists():
    """Seed 004 22.5-03: the Flow app has no outbox table, claimer or delivery state machine of its own; the
    one Runtime outbox delivers and reconciles ``flow.effect.submit`` (its worker units are the Runtime's)."""
    from django.apps import apps

    from nexusflow.kernel.transitions import load_all_machines
    from nexusflow.kernel.workers import units_for

    flow_models = {m.__name__ for m in apps.get_app_config("flows").get_models()}
    assert not {name for name in flow_models if "Outbox" in name or "Dispatch" in name}
    assert not [name for name in load_all_machines() if name.startswith("flows.") and "Outbox" in name]
    flow_units = {name for name, _ in units_for("flow", "w-1")}
    assert not {name for name in flow_units if name.startswith("outbox") or "deliver" in name}
    assert {"outbox.deliver", "outbox.reconcile"} <= {name for name, _ in units_for("runtime", "w-1")}
    assert messages.REGISTRY.consumer(messages.FLOW_EFFECT_SUBMIT).__module__ == "connectors.outbound.inbox"


# --- explicit compensation and cancellation after the effect (seed 004 22.5-21, 22.5-22) -----------------------
def _compensating_flow(billing_sandbox):
    """Push the customer; the push's fault connector leads to an explicit compensation step (Compensate)."""
    from nexusflow.flows.services import flow_deploy

    from . import flowxml as fx

    org = make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    push = fx.push("Push", "Done", fault="Compensate").replace("crm.sync", "billing.customer")
    source = fx.flow(fx.variable("outcome"), push,
                     fx.assignment("Done", None, [("outcome", "Assign", "<stringValue>pushed</stringValue>")]),
                     fx.assignment("Compensate", None, [("outcome", "Assign", "<stringValue>compensated</stringValue>")]),
                     start=fx.start("Push", trigger="RecordAfterSave"))
    assert flow_deploy(org=org, source=source, flow_api_name="Push_Or_Compensate").activated
    save_record(org, {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee", "lifecyclestage": "customer"})
    assert flow_try_run_step_one(worker_id="w")  # EffectSubmit
    return FlowRun.objects.get(org_id=ORG)


def _outcome_var(run):
    from nexusflow.flows.models import FlowCheckpoint

    payloads = FlowCheckpoint.objects.filter(run=run).order_by("-sequence").values_list("context_payload", flat=True)
    return next(p["context"].get("vars", {}).get("outcome") for p in payloads if "context" in p)


@pytest.mark.parametrize("how", ["no_effect_receipt", "handoff_rejected"])
def test_an_effect_proven_not_to_happen_takes_the_explicit_compensation_path(billing_sandbox, budgets, monkeypatch,
                                                                             db_clock_advance, how):
    """Seed 004 22.5-22: the push element's fault connector is an explicit compensation path. A ``no_effect``
    receipt, or a handoff the owner's fence rejected, fails the completion step and runs that path (never the
    success path); nothing is retried or resubmitted."""
    run = _compensating_flow(billing_sandbox)
    command = OutboundCommand.objects.get(origin_flow_run_id=run.pk)
    if how == "no_effect_receipt":
        with transaction.atomic():
            intent_result_record(command=command, outcome="no_effect", remote_id="",
                                 evidence={"reason": "definite_refusal"})
        assert flow_try_wake_one() is True
    else:
        monkeypatch.setitem(messages.REGISTRY._consumers, messages.FLOW_EFFECT_SUBMIT,
                            lambda envelope: (_ for _ in ()).throw(OwnerUnavailable("down")))
        _spend_delivery_budget(run, db_clock_advance)
        assert handoff.outbox_try_reconcile_one() is True
    run_until_idle()
    run = FlowRun.objects.get(pk=run.pk)
    assert run.state == t.RUN_SUCCEEDED and _outcome_var(run) == "compensated"
    completion = FlowStepExecution.objects.get(run=run, plan_step_key="complete:Push")
    assert completion.state == t.STEP_FAILED
    assert completion.reason_code == ("flow_effect_no_effect" if how == "no_effect_receipt"
                                      else "flow_effect_handoff_rejected")
    assert not FlowStepExecution.objects.filter(run=run, plan_step_key="assign:Done").exists()
    assert OutboundCommand.objects.count() == 1 and FlowStepExecution.objects.filter(
        run=run, plan_step_key="submit:Push").count() == 1


def test_cancelling_a_run_after_its_effect_reached_the_provider_rolls_nothing_back(billing_sandbox, budgets):
    """Seed 004 22.5-21 (section 11.1): a run cancelled while it waits on an effect the provider already
    performed ends Cancelled with its dependency cancelled; the remote effect stays (cancellation claims no
    rollback), the owner's late receipt is kept unmatched and wakes nothing, and no compensation runs unless
    the Flow has one."""
    from connectors.outbound.egress import effect_try_dispatch_one, effect_try_finalize_one
    from nexusflow.flows.models import FlowWakeSignal
    from nexusflow.flows.services import flow_run_delete, flow_try_cancel_cleanup_one

    run = _compensating_flow(billing_sandbox)
    assert outbox_try_deliver_one() is True
    while effect_try_dispatch_one(worker_id="egress-1"):
        pass
    assert len(billing_sandbox.state()["customers"]) == 1  # the provider performed it
    assert RemoteEffect.objects.get().state in ("remote_confirmed", "finalized")
    flow_run_delete(org=ORG_SCOPE, run_id=run.pk)
    while flow_try_cancel_cleanup_one():
        pass
    while effect_try_finalize_one():
        pass
    assert flow_try_wake_one() is False
    run_until_idle()
    run = FlowRun.objects.get(pk=run.pk)
    assert run.state == t.RUN_CANCELLED
    assert FlowDependency.objects.get(run=run).state == t.DEP_CANCELLED
    assert RemoteEffect.objects.get().state == "finalized" and len(billing_sandbox.state()["customers"]) == 1
    assert FlowWakeSignal.objects.get().state == t.SIGNAL_UNMATCHED  # kept, never consumed
    assert _outcome_var(run) is None  # neither the success nor the compensation path ran
    assert not FlowStepExecution.objects.filter(run=run, plan_step_key__in=("assign:Done", "assign:Compensate"))
    assert OutboundCommand.objects.count() == 1


def test_a_fence_that_fails_once_after_many_delivery_tries_is_asked_again(submitted, owner_down, monkeypatch,
                                                                        db_clock_advance):
    """The relay kept trying far past the attempt budget while the message was younger than the minimum age;
    those delivery tries are not fence questions: one lost answer from the fence is asked again (the message
    stays reconciling, the run waiting) and the next answer decides."""
    _spend_delivery_budget(submitted, db_clock_advance, tries=4 * handoff.delivery_max_attempts())
    real, calls = messages.inbox_reject_if_unaccepted, []

    def once_lost(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise OperationalError(2013, "Lost connection to MySQL server during query")
        return real(**kwargs)

    monkeypatch.setattr(messages, "inbox_reject_if_unaccepted", once_lost)
    assert handoff.outbox_try_reconcile_one() is True
    assert (_message(submitted).state, _message(submitted).reconcile_attempts) == ("reconciling", 1)
    assert _flow_rows(submitted)[0].state == t.RUN_WAITING
    db_clock_advance(2)
    assert handoff.outbox_try_reconcile_one() is True
    assert _message(submitted).state == "handoff_rejected" and len(calls) == 2
    assert _flow_rows(submitted)[0].reason_code == "flow_effect_handoff_rejected"


# --- manage.py outbox -----------------------------------------------------------------------------------------
def test_an_operator_reconciles_a_pending_handoff_by_hand(submitted, owner_down):
    """``outbox reconcile``: the operator stops waiting on a delivery the owner keeps refusing, long before its
    budget is spent; the fence writes the tombstone and the run takes its no-effect route, with the operator in
    the Flow's audit. A second call is refused (already settled); ``outbox list`` shows it."""
    import json
    from io import StringIO

    from django.core.management import CommandError, call_command

    assert outbox_try_deliver_one() is True  # one refused try: nowhere near the budget
    message = _message(submitted)
    out = StringIO()
    call_command("outbox", "reconcile", str(message.pk), "--org", ORG, "--actor", "ops-ann",
                 "--reason", "owner decommissioned", stdout=out)
    assert json.loads(out.getvalue()) == {"message_id": message.pk, "family": messages.FLOW_EFFECT_SUBMIT,
                                          "state": "handoff_rejected", "reconcile_attempts": 1}
    run = FlowRun.objects.get(pk=submitted.pk)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_effect_handoff_rejected")
    audit = FlowAuditEvent.objects.get(run=run, event="effect_handoff_finalized")
    assert audit.detail["operator"] == {"actor": "ops-ann", "reason": "owner decommissioned"}
    with pytest.raises(CommandError) as again:
        call_command("outbox", "reconcile", str(message.pk), "--org", ORG, "--actor", "ops-ann", "--reason", "x")
    assert again.value.returncode == 2 and "outbox_reconcile_refused" in str(again.value)
    listed = StringIO()
    call_command("outbox", "list", "--org", ORG, "--state", "handoff_rejected", stdout=listed)
    [row] = json.loads(listed.getvalue())
    assert (row["message_id"], row["flow_run_id"], row["reconcile_attempts"]) == (message.pk, submitted.pk, 1)


@pytest.mark.parametrize("argv,code,returncode", [
    (["reconcile", "0", "--org", ORG, "--actor", "a", "--reason", "r"], "invalid_identity", 2),
    (["reconcile", "²", "--org", ORG, "--actor", "a", "--reason", "r"], "invalid_identity", 2),
    (["reconcile", "1", "--org", ORG, "--actor", "a", "--reason", "bell \x07"], "invalid_identity", 2),
    (["reconcile", "999999", "--org", ORG, "--actor", "a", "--reason", "r"], "outbox_message_not_found", 3),
    (["reconcile", "1", "--org", " x", "--actor", "a", "--reason", "r"], "invalid_identity", 2),
    (["list", "--org", ORG, "--state", "lost"], "invalid_argument", 2),
    (["list", "--org", ORG, "--family", "no.such"], "invalid_argument", 2),
    (["list", "--org", ORG, "--limit", "0"], "invalid_argument", 2),
])
def test_the_outbox_command_refuses_bad_input_with_a_stable_code(submitted, argv, code, returncode):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError) as refused:
        call_command("outbox", *argv)
    assert refused.value.returncode == returncode and code in str(refused.value)
    assert _message(submitted).state == "pending"


def test_an_outbound_command_message_is_not_reconciled_by_hand(submitted):
    """Only flow.effect.submit handoffs are reconciled: a record push (``outbound.command``) must never be
    rejected for being late; it keeps its delivery state."""
    from django.core.management import CommandError, call_command

    from nexusflow.records.models import Record
    from tests.kits.outbound import author

    contact = Record.objects.get(org_id=ORG, object_name="Contact")
    command = author(contact, lastname="Lee-Smith")
    push = OutboxMessage.objects.get(command=command)
    assert push.family == messages.OUTBOUND_COMMAND
    with pytest.raises(CommandError) as refused:
        call_command("outbox", "reconcile", str(push.pk), "--org", ORG, "--actor", "a", "--reason", "r")
    assert refused.value.returncode == 2 and "outbox_reconcile_refused" in str(refused.value)
    assert OutboxMessage.objects.get(pk=push.pk).state == "pending"
    assert not InboxAcceptance.objects.filter(message_key=push.message_key).exists()


@pytest.mark.parametrize("held", ["finalizer", "cancel"])
def test_the_handoff_finalizer_takes_the_flow_root_before_the_outbox_row(submitted, owner_down, holds,
                                                                        db_clock_advance, held):
    """Seed 004 22.5-02 and 15.4: the finalizer discovers its message without a lock and locks the Flow root
    before the outbox row. Held inside its transaction, a cancel of the run queues on the run's row; a held
    cancel makes the finalizer queue on the run's row too (it holds no outbox row while it waits), so the two
    never wait on each other in reverse; whichever commits first wins and the other finds it."""
    from nexusflow.flows.services import flow_run_delete
    from tests.concurrency import race_behind_hold

    _spend_delivery_budget(submitted, db_clock_advance)
    reconcile = handoff.outbox_try_reconcile_one

    def cancel():
        return flow_run_delete(org=ORG_SCOPE, run_id=submitted.pk)

    if held == "finalizer":
        first, second = race_behind_hold(holds, "outbox.reconcile.finalize_before_commit", reconcile, cancel,
                                         "flows_flowrun")
    else:
        first, second = race_behind_hold(holds, "flow.cancel.before_commit", cancel, reconcile, "flows_flowrun")
    assert (first.error, second.error) == (None, None)
    run, _completion, dependency = _flow_rows(submitted)
    assert _message(submitted).state == "handoff_rejected"
    if held == "finalizer":  # the rejection committed first: the cancel found a terminal run
        assert (run.state, dependency.state) == (t.RUN_TERMINAL_FAILED, t.DEP_REJECTED)
    else:  # the cancel committed first: the finalizer found the dependency cancelled and changed no Flow row
        assert dependency.state == t.DEP_CANCELLED and run.state in (t.RUN_CANCEL_REQUESTED, t.RUN_CANCELLED)
        assert not FlowAuditEvent.objects.filter(run=run, event="effect_handoff_finalized").exists()
    _no_terminal_non_delivery_beside_a_waiting_flow()
