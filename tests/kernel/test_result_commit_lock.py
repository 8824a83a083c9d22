"""The one sanctioned lock-order reversal: result commit locks its intent before the record (seed 000;
ARCHITECTURE.md section 6). ``locks.result_commit`` excuses exactly one following business-record lock;
every other reversal still raises."""
from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from nexusflow.kernel import locks
from nexusflow.kernel.errors import LockOrderViolation

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("_raise_mode")]

C = locks.LockClass


@pytest.fixture
def _raise_mode():
    with override_settings(NEXUS_LOCK_ORDER="raise"):
        yield


def _intent():
    locks.note(C.RUNTIME, label="OutboundCommand")
    return "intent"


def test_a_record_lock_after_the_intent_passes_inside_result_commit_then_the_usual_order_holds():
    with transaction.atomic():
        with locks.result_commit(_intent) as intent:
            assert intent == "intent"
            locks.note(C.BUSINESS_RECORD, label="Record")
        locks.note(C.CONNECTOR_WORK, label="RemoteEffect")
        locks.note(C.RUNTIME, label="IntentResultReceipt")
        with pytest.raises(LockOrderViolation):
            locks.note(C.BUSINESS_RECORD, label="Record")  # a second reversal is not excused


def test_without_result_commit_a_record_after_an_intent_is_refused():
    with transaction.atomic():
        _intent()
        with pytest.raises(LockOrderViolation):
            locks.note(C.BUSINESS_RECORD, label="Record")


def test_only_a_business_record_lock_is_excused():
    with transaction.atomic():
        with locks.result_commit(_intent):
            with pytest.raises(LockOrderViolation):
                locks.note(C.CONNECTOR_WORK, label="RemoteEffect")


def test_the_allowance_ends_with_the_block_and_is_used_once():
    with transaction.atomic():
        with locks.result_commit(_intent):
            pass
        with pytest.raises(LockOrderViolation):
            locks.note(C.BUSINESS_RECORD, label="Record")
    with transaction.atomic():
        with locks.result_commit(_intent):
            locks.note(C.BUSINESS_RECORD, label="Record")
            locks.note(C.FLOW_LIFECYCLE, label="FlowRun")
            with pytest.raises(LockOrderViolation):
                locks.note(C.BUSINESS_RECORD, label="Record")


def test_the_intent_must_be_the_first_lock_of_the_transaction():
    with transaction.atomic():
        locks.note(C.BUSINESS_RECORD, label="Record")
        with pytest.raises(LockOrderViolation, match="first lock"):
            with locks.result_commit(_intent):
                pass


def test_a_nowait_read_may_follow_the_owner_check_and_leaves_the_position_as_it_was():
    """The deletion hook: the owner check holds intents (Runtime class), then its links are read ``NOWAIT``."""
    with transaction.atomic():
        locks.note(C.BUSINESS_RECORD, label="Record")
        _intent()
        locks.note(C.CONNECTOR_WORK, label="RemoteLink", key=("org", 2), nowait=True)
        locks.note(C.CONNECTOR_WORK, label="RemoteLink", key=("org", 1), nowait=True)
        with pytest.raises(LockOrderViolation):  # a waiting read in the same place is still a reversal
            locks.note(C.CONNECTOR_WORK, label="RemoteLink", key=("org", 3))
