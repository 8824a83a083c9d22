"""Seed 000 "Runtime outbound owner protection" on the real MariaDB with real concurrent transactions.

The owner record's row lock is the owner fence: resource enqueue
(``outbound_command_author``) runs under it and refuses new work once a
deletion committed (``owner_deleted``); a deletion runs under it and reads the
owner's intents ``FOR UPDATE NOWAIT`` (``owner_work_check``) before any remote
link. Result commit locks its intent before the record (``locks.result_commit``),
so a deletion racing a held result commit is refused at once (``owner_contended``).

The deletion here is the real records use case (``record_delete_by_key``):
lock the record, run the installed before-delete hooks (Runtime's owner work
check, then the Connector's link suspension), soft-delete, in one transaction.
"""
from __future__ import annotations

import itertools

import pytest
from django.db import transaction

from connectors.models import RemoteLink
from connectors.outbound.egress import effect_try_finalize_one
from nexusflow.kernel import failpoints
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import (
    FP_DELETE_BEFORE_COMMIT,
    record_delete,
    record_delete_by_key,
    record_lock,
    record_lock_owner,
)
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.owner import OwnerContended, OwnerDeleted, OwnerFenceMissing, OwnerWorkPending
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.concurrency import Worker, race_behind_hold
from tests.conftest import ORG
from tests.connectors.push_helpers import HUBSPOT, ORIGIN, SCOPE, contact, dispatch_one, effect_of, push_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

RECORD_TABLE = "records_record"
FP_DELETE_HELD = FP_DELETE_BEFORE_COMMIT
FP_ENQUEUE_HELD = failpoints.declare("test.owner.enqueue_before_commit")
_slots = itertools.count(1)


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    return push_env(billing_sandbox, hubspot_crm_sandbox)


def _delete(record_key: str, *, fail_after: bool = False) -> Record:
    """Delete a Contact through the installed deletion lifecycle (``record_delete_by_key``)."""
    if not fail_after:
        return record_delete_by_key(org=OrgScope(ORG), object_name="Contact", record_key=record_key)
    with transaction.atomic(durable=True):
        record_delete(org=OrgScope(ORG), record=record_lock(org=OrgScope(ORG), object_name="Contact",
                                                             record_key=record_key))
        raise RuntimeError("deletion rolled back")


def _enqueue(record_key: str, slot: str | None = None, *, fail_after: bool = False) -> OutboundCommand:
    """Author one resource intent under the owner fence (the record row, live or deleted)."""
    with transaction.atomic(durable=True):
        record = record_lock_owner(org=OrgScope(ORG), object_name="Contact", record_key=record_key)
        command = outbound_command_author(
            scope=SCOPE, effect_root_id=f"root-{record_key}", effect_slot_id=slot or f"push-{next(_slots)}",
            effect_generation_id="1", contract_key=HUBSPOT, record=record, origin_flow_run_id=None,
            origin=dict(ORIGIN))
        failpoints.hit(FP_ENQUEUE_HELD)
        if fail_after:
            raise RuntimeError("enqueue rolled back")
        return command


def _deliver() -> None:
    while outbox_try_deliver_one():
        pass


def _live(record_key: str) -> bool:
    return Record.objects.filter(org_id=ORG, record_key=record_key, is_deleted=False).exists()


# --- S000-T-01 first-link absence ---------------------------------------------------------------------
def test_a_pending_first_create_blocks_deletion_before_any_link_exists(env):
    record = contact()
    command = _enqueue(record.record_key)
    assert not RemoteLink.objects.filter(org_id=ORG).exists()

    with pytest.raises(OwnerWorkPending) as refused:
        _delete(record.record_key)
    assert refused.value.code == "owner_outbound_pending" and refused.value.retryable
    assert [(i.command_id, i.state) for i in refused.value.intents] == [(command.pk, "pending")]

    _deliver()  # accepted by Connector: still no link, still unfinished
    assert not RemoteLink.objects.filter(org_id=ORG).exists()
    with pytest.raises(OwnerWorkPending) as refused:
        _delete(record.record_key)
    assert [i.state for i in refused.value.intents] == ["accepted"]
    assert _live(record.record_key) and env.posts() == 0


# --- S000-T-02 deletion racing enqueue, deletion first ------------------------------------------------
def test_deletion_first_then_a_queued_enqueue_is_refused_owner_deleted(env, holds):
    record = contact()
    deletion, enqueue = race_behind_hold(
        holds, FP_DELETE_HELD, lambda: _delete(record.record_key), lambda: _enqueue(record.record_key),
        RECORD_TABLE, names=("delete", "enqueue"))

    assert deletion.error is None
    assert isinstance(enqueue.error, OwnerDeleted), enqueue.error
    assert enqueue.error.code == "owner_deleted" and not enqueue.error.retryable
    assert not OutboundCommand.objects.filter(org_id=ORG).exists()
    assert not _live(record.record_key)


# --- S000-T-03 deletion racing enqueue, enqueue first -------------------------------------------------
def test_enqueue_first_then_a_queued_deletion_sees_the_pending_intent(env, holds):
    record = contact()
    enqueue, deletion = race_behind_hold(
        holds, FP_ENQUEUE_HELD, lambda: _enqueue(record.record_key), lambda: _delete(record.record_key),
        RECORD_TABLE, names=("enqueue", "delete"))

    assert enqueue.error is None
    assert isinstance(deletion.error, OwnerWorkPending), deletion.error
    assert [(i.command_id, i.state) for i in deletion.error.intents] == [(enqueue.result.pk, "pending")]
    assert _live(record.record_key)


# --- S000-T-04 result completion ----------------------------------------------------------------------
def test_deletion_is_refused_until_the_result_receipt_then_succeeds(env):
    record = contact()
    command = _enqueue(record.record_key)
    _deliver()
    dispatch_one()
    assert effect_of(command).state == "remote_confirmed"
    with pytest.raises(OwnerWorkPending):
        _delete(record.record_key)  # the remote create happened, but Runtime has no receipt yet

    assert effect_try_finalize_one()
    assert IntentResultReceipt.objects.get(command=command).outcome == "finalized"
    _delete(record.record_key)
    assert not _live(record.record_key)


def test_a_committed_deletion_refuses_new_work_but_returns_an_exact_terminal_retry(env):
    record = contact()
    command = _enqueue(record.record_key, slot="push-exact")
    _deliver()
    dispatch_one()
    assert effect_try_finalize_one()
    _delete(record.record_key)

    assert _enqueue(record.record_key, slot="push-exact").pk == command.pk  # idempotent duplicate
    with pytest.raises(OwnerDeleted):
        _enqueue(record.record_key, slot="push-new")
    assert list(OutboundCommand.objects.filter(org_id=ORG).values_list("pk", flat=True)) == [command.pk]


def test_enqueue_without_the_owner_fence_is_refused(env):
    record = contact()
    with pytest.raises(OwnerFenceMissing), transaction.atomic():
        outbound_command_author(scope=SCOPE, effect_root_id="r", effect_slot_id="s", effect_generation_id="1",
                                contract_key=HUBSPOT, record=record, origin_flow_run_id=None, origin=dict(ORIGIN))
    assert not OutboundCommand.objects.filter(org_id=ORG).exists()


# --- result commit locks its intent first: owner checks never wait in reverse ---------------------------
def test_deletion_racing_a_held_result_commit_is_contended_at_once_and_succeeds_on_retry(env, holds):
    record = contact()
    command = _enqueue(record.record_key)
    _deliver()
    dispatch_one()

    holds.arm("effect.finalize_intent_locked")
    finalize = Worker(effect_try_finalize_one, "finalize")
    finalize.start()
    marker = holds.wait_held("effect.finalize_intent_locked")
    # The result commit holds the intent and is parked before the record: the deletion takes the record
    # and is refused on the intent without waiting (the finalize is still held while it returns).
    with pytest.raises(OwnerContended) as contended:
        _delete(record.record_key)
    assert contended.value.code == "owner_contended" and contended.value.retryable
    assert finalize.is_alive() and _live(record.record_key)

    holds.release(marker)
    finalize.join(60)
    assert finalize.error is None and finalize.result is True
    receipt = IntentResultReceipt.objects.get(command=command)
    assert receipt.outcome == "finalized" and receipt.evidence["mirror"] != "source_deleted"  # record was live
    _delete(record.record_key)
    assert not _live(record.record_key)


# --- S000-T-07 rollback -------------------------------------------------------------------------------
def test_a_rolled_back_enqueue_does_not_block_deletion(env):
    record = contact()
    with pytest.raises(RuntimeError, match="enqueue rolled back"):
        _enqueue(record.record_key, fail_after=True)
    assert not OutboundCommand.objects.filter(org_id=ORG).exists()
    _delete(record.record_key)
    assert not _live(record.record_key)


def test_a_rolled_back_deletion_does_not_refuse_enqueue(env):
    record = contact()
    with pytest.raises(RuntimeError, match="deletion rolled back"):
        _delete(record.record_key, fail_after=True)
    assert _live(record.record_key)
    command = _enqueue(record.record_key)
    assert OutboundCommand.objects.get(org_id=ORG).pk == command.pk
