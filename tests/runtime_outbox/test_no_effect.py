"""Seed 000 "A validated NO_EFFECT resource result" (S000-T-05) on the real MariaDB.

A ``no_effect`` Runtime result settles only a definite refusal: its evidence
reason comes from the closed set the connector declares, it carries no remote
id, and no Attempt that may have reached the provider ended without a
definite refusal. It settles without reading or projecting the source record
(so a record row locked by another open transaction, or a deleted record,
never holds it up) and never proves a remote identity (no link, no mirror).
"""
from __future__ import annotations

import threading

import pytest
from django.db import transaction

from connectors import reasons
from connectors.models import RemoteEffectAttempt, RemoteLink
from connectors.outbound.effect_decisions import effect_reconcile
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock
from nexusflow.records.store import RecordStore
from runtime_outbox.models import IntentResultReceipt
from runtime_outbox.services import (
    NO_EFFECT_NEVER,
    NoEffectUnproven,
    intent_result_record,
    no_effect_reasons,
    no_effect_reasons_declare,
)
from tests.concurrency import Worker
from tests.conftest import ORG
from tests.connectors.push_helpers import BILLING, contact, dispatch_one, effect_of, push_env, save, zero_backoff

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    return push_env(billing_sandbox, hubspot_crm_sandbox)


def _record(org_id: str, record_key: str) -> Record:
    return Record.objects.get(org_id=org_id, record_key=record_key)


def _no_effect(command, *, reason: str = reasons.DEFINITE_REFUSAL, remote_id: str = "") -> IntentResultReceipt:
    with transaction.atomic():
        return intent_result_record(command=command, outcome="no_effect", remote_id=remote_id,
                                    evidence={"reason": reason})


def test_the_connector_declares_only_definite_refusals():
    assert no_effect_reasons() >= {reasons.DEFINITE_REFUSAL, reasons.RETRY_EXHAUSTED}
    assert not no_effect_reasons() & NO_EFFECT_NEVER
    assert reasons.OPERATOR_PROVED_NO_EFFECT not in no_effect_reasons()
    with pytest.raises(ValueError):
        no_effect_reasons_declare(owner="test", reasons={"timeout"})


def test_a_definite_refusal_settles_no_effect_while_the_record_row_is_locked_by_another_transaction(env):
    record = contact()
    command = save(record, contract=BILLING)
    env.billing.set_faults(fail_before_commit={"status": 400, "count": 1})
    held, release = threading.Event(), threading.Event()

    def hold_record():
        with transaction.atomic():
            record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
            held.set()
            release.wait(120)

    holder = Worker(hold_record, "record-holder")
    holder.start()
    assert held.wait(60)
    try:
        # The settlement (Permit returned, effect no_effect, Runtime receipt) commits while the record row
        # stays locked: it neither reads it for update nor projects onto it.
        dispatch_one()
        assert holder.is_alive()
        receipt = IntentResultReceipt.objects.get(command=command)
    finally:
        release.set()
        holder.join(60)
    assert holder.error is None
    assert (receipt.outcome, receipt.remote_id, receipt.evidence["reason"]) == ("no_effect", "",
                                                                               reasons.DEFINITE_REFUSAL)
    # It never proves a remote identity: no link, no mirror.
    assert effect_of(command).state == "no_effect"
    assert not RemoteLink.objects.filter(org_id=ORG, link_key=command.link_key).exists()
    assert _record(ORG, record.record_key).mirrors == {}


def test_a_no_effect_result_settles_for_a_deleted_source_record(env):
    record = contact()
    command = save(record, contract=BILLING)
    with transaction.atomic():  # a deletion that bypassed the owner check (a legacy row)
        RecordStore.soft_delete(record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key))
    receipt = _no_effect(command)  # no Attempt ever started: a definite pre-dispatch refusal
    assert (receipt.outcome, receipt.remote_id) == ("no_effect", "")
    assert _record(ORG, record.record_key).is_deleted and _record(ORG, record.record_key).mirrors == {}
    assert not RemoteLink.objects.filter(org_id=ORG).exists()


@pytest.mark.parametrize("reason,remote_id,code", [
    ("timeout", "", "no_effect_unproven"),
    ("lease_expired", "", "no_effect_unproven"),
    ("response_ambiguous", "", "no_effect_unproven"),
    ("partial_success", "", "no_effect_unproven"),
    ("holder_abandoned", "", "no_effect_unproven"),
    ("something_else", "", "no_effect_reason_unknown"),
    (None, "", "no_effect_reason_unknown"),
    (reasons.DEFINITE_REFUSAL, "cus_1", "no_effect_remote_id"),
])
def test_a_no_effect_result_without_a_definite_refusal_is_refused(env, reason, remote_id, code):
    command = save(contact(), contract=BILLING)
    with pytest.raises(NoEffectUnproven) as refused:
        _no_effect(command, reason=reason, remote_id=remote_id)
    assert refused.value.code == code
    assert not IntentResultReceipt.objects.filter(command=command).exists()


def test_an_attempt_that_may_have_reached_the_provider_refuses_no_effect(env):
    command = save(contact(), contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    dispatch_one()  # sent; the response was lost: io may have had an effect
    effect = effect_of(command)
    assert effect.state == "uncertain"
    attempt = RemoteEffectAttempt.objects.get(effect=effect)
    assert attempt.state == "uncertain" and attempt.dispatchpermit.io_may_have_started_at is not None
    with pytest.raises(NoEffectUnproven) as refused:
        _no_effect(command, reason=reasons.DEFINITE_REFUSAL)
    assert refused.value.code == "no_effect_unproven"
    assert not IntentResultReceipt.objects.filter(command=command).exists()

    # An operator's proof after that ambiguous Attempt ends the effect (a successor may follow) but is no
    # definite pre-dispatch refusal: Runtime's result is quarantined, never no_effect.
    effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="no_effect", actor="ops", note="dashboard shows none")
    assert effect_of(command).state == "no_effect"
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.evidence["reason"]) == ("quarantined", reasons.OPERATOR_PROVED_NO_EFFECT)
    assert len(env.billing.state()["customers"]) == 1  # the lost-response create did land


def test_exhausted_not_performed_attempts_settle_no_effect(env):
    """Every Attempt reached the provider, and every answer was a definite 'not performed' (409: not a rate
    limit, which never counts)."""
    command = save(contact(), contract=BILLING)
    env.billing.set_faults(fail_before_commit={"status": 409, "count": 1000})
    while effect_of(command).state != "no_effect":
        zero_backoff()
        dispatch_one()
    receipt = IntentResultReceipt.objects.get(command=command)
    assert (receipt.outcome, receipt.evidence["reason"]) == ("no_effect", reasons.RETRY_EXHAUSTED)
    assert set(RemoteEffectAttempt.objects.filter(effect__command=command).values_list("state", flat=True)) == {
        "no_effect"}
