"""CAS store, guarded models, lock order and failpoints against the real database."""
import signal
import subprocess
import sys

import pytest
from django.db import transaction

from connectors.models import AccountServingGate
from connectors.store import AccountServingGateStore
from cutover.reasons import CUTOVER_IN_PROGRESS
from nexusflow.kernel import failpoints, locks
from nexusflow.kernel.errors import FenceRejected, ImmutableRow, LockOrderViolation

pytestmark = pytest.mark.django_db(transaction=True)


def _gate():
    gate = AccountServingGateStore.create(org_id="o1", account_key="acct", pack_key="p", state="v1_serving")
    return AccountServingGate.objects.get(org_id="o1", pk=gate.pk)


HALT = CUTOVER_IN_PROGRESS


def test_stale_version_and_wrong_org_are_fenced():
    gate = _gate()
    halt = {"reason_code": HALT}
    AccountServingGateStore.transition(org_id="o1", pk=gate.pk, src="v1_serving", dst="halting_v1", version=gate.version,
                                       set_fields=halt)
    with pytest.raises(FenceRejected):
        AccountServingGateStore.transition(org_id="o1", pk=gate.pk, src="halting_v1", dst="v1_stopped",
                                           version=gate.version, set_fields=halt)
    with pytest.raises(FenceRejected):
        AccountServingGateStore.transition(org_id="other", pk=gate.pk, src="halting_v1", dst="v1_stopped",
                                           version=gate.version + 1, set_fields=halt)
    assert AccountServingGate.objects.get(pk=gate.pk).state == "halting_v1"


def test_guarded_rows_refuse_orm_writes():
    gate = _gate()
    with pytest.raises(ImmutableRow):
        gate.save()
    with pytest.raises(ImmutableRow):
        gate.delete()
    with pytest.raises(ImmutableRow):
        AccountServingGate.objects.filter(pk=gate.pk).update(state="v2_serving")
    with pytest.raises(ImmutableRow):
        AccountServingGate(org_id="o", account_key="k", pack_key="p", state="v1_serving").save()
    assert AccountServingGate.objects.get(pk=gate.pk).state == "v1_serving"


def test_lock_order_reversal_is_refused():
    with transaction.atomic():
        locks.note(locks.LockClass.BUSINESS_RECORD)
        locks.note(locks.LockClass.SERVING_GATE)
        locks.note(locks.LockClass.CONNECTOR_WORK)
        with pytest.raises(LockOrderViolation):
            locks.note(locks.LockClass.SERVING_GATE)
    with transaction.atomic():
        locks.note(locks.LockClass.BUSINESS_RECORD)  # a new transaction starts from the bottom again
        locks.note(locks.LockClass.FLOW_LIFECYCLE, rank=3, label="attempt")
        with pytest.raises(LockOrderViolation, match="attempt"):
            locks.note(locks.LockClass.FLOW_LIFECYCLE, rank=1, label="root")
        locks.note(locks.LockClass.SERVING_GATE)  # a later class follows any rank of an earlier one


def test_failpoints_are_declared_and_kill_a_real_process():
    with pytest.raises(KeyError):
        failpoints.hit("no.such.failpoint")
    import connectors.outbound.egress  # noqa: F401  (declares its failpoints)

    failpoints.hit("permit.after_sending")  # inert when not armed
    code = ("import nexusflow.kernel.failpoints as f; f.declare('test.point'); f.hit('test.point'); print('survived')")
    proc = subprocess.run([sys.executable, "-c", code], env={"NEXUS_FAILPOINTS": "test.point", "PATH": "/usr/bin"},
                          capture_output=True, text=True, cwd=str(__import__("django.conf").conf.settings.BASE_DIR))
    assert proc.returncode == -signal.SIGKILL
    assert "survived" not in proc.stdout
