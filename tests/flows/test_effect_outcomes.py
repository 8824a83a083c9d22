"""What the effect owner's outcomes do to the Flow that submitted the effect (seed 004 sections 15.2-15.3).

The demo Flow pushes a customer Contact to the billing sandbox through the
real Runtime outbox and the Connector's egress; faults are the sandbox's own
(a dropped response after the provider committed, an unclassified status),
and crashes kill a real egress worker process at a named failpoint. Each
test asserts what the provider holds (one customer) and where the run ends.
"""
from __future__ import annotations

import signal

import pytest
from django.core.management import call_command
from django.db import transaction

from connectors.models import RemoteEffect
from connectors.outbound.egress import effect_try_dispatch_one, effect_try_reconcile_one
from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun, FlowWakeSignal
from nexusflow.flows.services import flow_try_wake_one
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import intent_result_record, outbox_try_deliver_one
from tests.conftest import ORG, drain, make_serving_org, run_manage, subprocess_env
from tests.kits.outbound import zero_backoff

from .conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CUSTOMER = {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee", "lifecyclestage": "customer"}


@pytest.fixture
def pushed(billing_sandbox) -> FlowRun:
    """The demo Flow submitted its push and waits for the owner's receipt; the owner accepted the handoff."""
    make_serving_org(billing_sandbox.base_url)
    save_record(OrgScope(ORG), dict(CUSTOMER))
    run_until_idle()
    assert outbox_try_deliver_one() is True
    run = FlowRun.objects.get(org_id=ORG)
    assert run.state == t.RUN_WAITING and RemoteEffect.objects.count() == 1
    return run


def _customers(billing_sandbox) -> list[dict]:
    return billing_sandbox.state()["customers"]


@pytest.mark.parametrize("failpoint", ["permit.sending_before_commit", "permit.after_response"])
def test_an_egress_worker_killed_before_or_after_the_remote_call_leaves_one_customer(pushed, billing_sandbox,
                                                                                    failpoint):
    """Seed 004 22.5-07: the owner's dispatcher dies before the request left (nothing sent) or right after
    the provider answered (sent, answer not recorded); the restarted dispatcher converges on one customer,
    the same idempotency key reused, and the Flow run succeeds on the one receipt."""
    crashed = run_manage(["run_workers", "--role", "egress"], subprocess_env(NEXUS_FAILPOINTS=failpoint), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert len(_customers(billing_sandbox)) == (0 if failpoint == "permit.sending_before_commit" else 1)
    assert FlowRun.objects.get(pk=pushed.pk).state == t.RUN_WAITING
    drain()
    run = FlowRun.objects.get(pk=pushed.pk)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    assert len(_customers(billing_sandbox)) == 1  # a repeat under the same key is replayed, never a second create
    assert IntentResultReceipt.objects.get().outcome == "finalized"
    assert FlowWakeSignal.objects.count() == 1 and OutboundCommand.objects.count() == 1


def test_a_response_lost_after_the_provider_committed_is_replayed_under_the_same_key(pushed, billing_sandbox):
    """Seed 004 22.5-08: the provider created the customer but its answer was lost; the owner repeats the
    exact request under the same idempotency key (the profile is replay-safe), the provider replays its
    answer, and the Flow sees one finalized receipt: one customer, never a second create."""
    billing_sandbox.set_faults(drop_response_after_commit=1)
    assert effect_try_dispatch_one(worker_id="egress-1")
    assert RemoteEffect.objects.get().state == "uncertain"
    assert FlowRun.objects.get(pk=pushed.pk).state == t.RUN_WAITING  # ambiguity is never success
    zero_backoff()
    drain()
    run = FlowRun.objects.get(pk=pushed.pk)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    assert len(_customers(billing_sandbox)) == 1  # the repeat was answered from the provider's replay
    assert billing_sandbox.state()["requests"] == 2
    assert RemoteEffect.objects.get().state == "finalized"


def test_a_duplicate_receipt_wakes_the_run_once(pushed, billing_sandbox):
    """Seed 004 22.5-09: the owner records the same completed result twice (a replayed finalize): the same
    receipt comes back, no second wake signal exists, the completion runs once."""
    drain()
    command = OutboundCommand.objects.get()
    first = IntentResultReceipt.objects.get(command=command)
    with transaction.atomic():
        again = intent_result_record(command=command, outcome=first.outcome, remote_id=first.remote_id,
                                     evidence=first.evidence)
    assert again.pk == first.pk and IntentResultReceipt.objects.count() == 1
    assert FlowWakeSignal.objects.count() == 1 and flow_try_wake_one() is False
    run_until_idle()
    run = FlowRun.objects.get(pk=pushed.pk)
    assert run.state == t.RUN_SUCCEEDED


def test_an_outcome_the_owner_cannot_classify_parks_and_quarantines_the_run_only_by_its_decision(
        pushed, billing_sandbox):
    """Seed 004 22.5-12 and 15.3: a status the pack's profile does not classify parks the effect
    (``uncertain``); it is not success and not retried: the run keeps waiting and the provider got one
    request. Only the owner's quarantine decision (an operator's ``effects quarantine``) completes the
    intent, and the run ends Quarantined (``flow_effect_quarantined``), never Succeeded."""
    billing_sandbox.set_faults(fail_before_commit={"status": 418, "count": 1})
    assert effect_try_dispatch_one(worker_id="egress-1")
    effect = RemoteEffect.objects.get()
    assert (effect.state, effect.reason_code) == ("uncertain", "unclassified_response")
    zero_backoff()
    assert not effect_try_reconcile_one()
    run_until_idle()
    assert FlowRun.objects.get(pk=pushed.pk).state == t.RUN_WAITING
    assert billing_sandbox.state()["requests"] == 1
    call_command("effects", "quarantine", str(effect.pk), "--org", ORG, "--actor", "ops",
                 "--note", "provider answered 418")
    assert flow_try_wake_one() is True
    run_until_idle()
    run = FlowRun.objects.get(pk=pushed.pk)
    assert (run.state, run.reason_code) == (t.RUN_QUARANTINED, "flow_effect_quarantined")
    assert billing_sandbox.state()["requests"] == 1
