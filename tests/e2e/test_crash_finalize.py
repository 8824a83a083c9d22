"""Lost-response replay (seed 000, S000-T-08): kill a real egress worker right after the finalize commit.

Integration persists its result before acknowledging it through Runtime: the
finalize transaction writes the link's mirror status, the effect's
``finalized`` state, the Runtime IntentResultReceipt and the Flow wake signal
together. A worker killed right after that commit (``effect.after_finalize``)
lost only its acknowledgement; the restarted worker writes no second or
different receipt, wakes the Flow no second time and makes no second provider
request, also when the link was retired or the record deleted in between.
"""
from __future__ import annotations

import signal

import pytest
from django.core.management import call_command
from django.db import transaction

from connectors.models import RemoteEffect, RemoteEffectEvidence, RemoteLink
from connectors.outbound.egress import effect_try_dispatch_one, effect_try_finalize_one
from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun, FlowWakeSignal
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_delete_by_key
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import intent_result_record, outbox_try_deliver_one
from tests.conftest import ORG, make_serving_org, run_manage, subprocess_env
from tests.flows.conftest import run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CUSTOMER = {"email": "ann@example.com", "firstname": "Ann", "lastname": "Lee", "lifecyclestage": "customer"}


def _flow_push(billing_sandbox) -> Record:
    """A record-triggered Flow authors one push and waits for its result; Runtime delivers it."""
    make_serving_org(billing_sandbox.base_url)
    record = save_record(OrgScope(ORG), dict(CUSTOMER))
    run_until_idle()
    while outbox_try_deliver_one():
        pass
    assert OutboundCommand.objects.filter(org_id=ORG).count() == 1
    return record


def _receipt_facts() -> list[tuple]:
    return list(IntentResultReceipt.objects.filter(org_id=ORG).values_list("pk", "outcome", "remote_id", "digest"))


@pytest.mark.parametrize("meanwhile", ["nothing", "link_retired", "record_deleted"])
def test_a_worker_killed_after_the_finalize_commit_replays_without_a_second_receipt_wake_or_request(
        billing_sandbox, meanwhile):
    record = _flow_push(billing_sandbox)

    crashed = run_manage(["run_workers", "--role", "egress"],
                         subprocess_env(NEXUS_FAILPOINTS="effect.after_finalize"), timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    # Everything the finalize transaction wrote is committed: only the acknowledgement was lost.
    effect = RemoteEffect.objects.get(org_id=ORG)
    assert effect.state == "finalized"
    receipts = _receipt_facts()
    assert [(outcome, remote_id) for _pk, outcome, remote_id, _d in receipts] == [("finalized", effect.remote_id)]
    run = FlowRun.objects.get(org_id=ORG)
    # Seed 004 22.4-03: the producer's wake signal committed and the producer died before any matching; the
    # run still waits, and only the periodic match (the flow worker below) resolves it.
    assert [s.state for s in FlowWakeSignal.objects.filter(org_id=ORG)] == [t.SIGNAL_UNMATCHED]
    assert run.state == t.RUN_WAITING
    assert billing_sandbox.state()["requests"] == 1
    link = RemoteLink.objects.get(org_id=ORG, link_key=effect.link_key)

    if meanwhile == "link_retired":
        call_command("push_links", "retire", link.link_key, "--org", ORG, "--actor", "ops", "--reason", "moved")
        assert RemoteLink.objects.get(pk=link.pk).state == "retired"
    elif meanwhile == "record_deleted":
        # Runtime completed the intent, so the installed deletion lifecycle lets the deletion through.
        record_delete_by_key(org=OrgScope(ORG), object_name=record.object_name, record_key=record.record_key)
        assert RemoteLink.objects.get(pk=link.pk).state == "suspended_drift"

    restarted = run_manage(["run_workers", "--role", "egress", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    run_until_idle()

    assert _receipt_facts() == receipts  # the same receipt, not a second or different one
    assert FlowWakeSignal.objects.filter(org_id=ORG).count() == 1
    run.refresh_from_db()
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    assert billing_sandbox.state()["requests"] == 1 and len(billing_sandbox.state()["customers"]) == 1
    assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
    assert RemoteLink.objects.get(pk=link.pk).remote_id == effect.remote_id


def test_finalize_after_runtime_completion_finishes_from_that_exact_receipt_even_with_the_record_deleted(
        billing_sandbox):
    """The acknowledgement committed but Connector's own bookkeeping did not: it is finished from the receipt."""
    _flow_push(billing_sandbox)
    assert effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.select_related("command").get(org_id=ORG)
    assert effect.state == "remote_confirmed"
    with transaction.atomic():  # Runtime's completion of this exact intent is already committed
        receipt = intent_result_record(command=effect.command, outcome="finalized", remote_id=effect.remote_id,
                                       evidence={"mirror": "written"})
    link = RemoteLink.objects.get(org_id=ORG, link_key=effect.link_key)
    # With the receipt committed the record's owner work is finished: the deletion goes through and
    # suspends the link (``source_deleted``).
    record_delete_by_key(org=OrgScope(ORG), object_name=effect.command.source_object,
                         record_key=effect.command.source_record_key)
    mirrors_before = Record.objects.get(org_id=ORG, record_key=effect.command.source_record_key).mirrors

    assert effect_try_finalize_one()
    assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
    assert _receipt_facts() == [(receipt.pk, "finalized", effect.remote_id, receipt.digest)]
    assert FlowWakeSignal.objects.filter(org_id=ORG).count() == 1
    evidence = RemoteEffectEvidence.objects.get(effect=effect, kind="finalized_from_receipt")
    assert evidence.detail["receipt"] == receipt.pk and evidence.detail["link_state"] == "suspended_drift"
    # Nothing was projected onto the record, and the suspended link stays suspended.
    assert Record.objects.get(org_id=ORG, record_key=effect.command.source_record_key).mirrors == mirrors_before
    assert RemoteLink.objects.get(pk=link.pk).state == "suspended_drift"
    assert billing_sandbox.state()["requests"] == 1
    assert effect_try_finalize_one() is False
