"""The cutover walk as fixtures, one step on the last: ``certified`` -> ``halted`` -> ``stopped`` -> ``drained``
-> ``restorable`` -> ``validated`` (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover").

Each leaves ``ORG`` at that step of attempt ``ATTEMPT``, reached through the same services an operator's
commands call.
"""
from __future__ import annotations

import pytest

from connectors.models import AccountServingGate, V1StreamCursor
from cutover.certify import cutover_certify
from cutover.drain import cutover_drain
from cutover.halt import cutover_halt_v1
from cutover.preflight import cutover_preflight
from cutover.restore_point import restore_point_capture, restore_point_record
from cutover.stop import cutover_stop
from cutover.validate import cutover_validate
from nexusflow.kernel.models import insert
from tests.conftest import ORG, hubspot_event, run_manage, subprocess_env
from tests.connectors.v1.support import install_v1, post_v1
from tests.cutover.test_preflight import full_plan

ATTEMPT = "attempt-1"


def run_v1_worker() -> None:
    """One real V1 process generation that finishes the accepted work and exits."""
    done = run_manage(["run_workers", "--role", "v1", "--until-idle", "--idle-sleep", "0"], subprocess_env())
    assert done.returncode == 0, done.stderr


def gate_states() -> set[str]:
    return set(AccountServingGate.objects.filter(org_id=ORG).values_list("state", flat=True))


@pytest.fixture
def certified(client, billing_sandbox):
    """A V1 install with two accepted events (one Contact) and a certificate for ``attempt-1``."""
    org = install_v1(billing_sandbox.base_url)
    assert post_v1(client, [hubspot_event(1, 501, 1000), hubspot_event(2, 501, 1001, "email", "a@example.test")]) \
        .status_code == 202
    plan = full_plan()
    plan["budgets_seconds"]["drain"] = 4  # exactly the 2 open events at 1/s with the 200 % margin
    cutover_preflight(org=org, attempt_key="attempt-1", plan=plan)
    return org


@pytest.fixture
def halted(certified):
    cutover_halt_v1(org=certified, attempt_key=ATTEMPT)
    return certified


@pytest.fixture
def stopped(halted):
    """Every gate ``v1_stopped``: the accepted work finished in one real V1 generation, which is proven gone."""
    run_v1_worker()
    cutover_drain(org=halted, attempt_key=ATTEMPT)
    cutover_stop(org=halted, attempt_key=ATTEMPT, wait_seconds=0)
    assert gate_states() == {"v1_stopped"}
    return halted


@pytest.fixture
def drained(stopped):
    """Every gate ``v1_drained`` under the attempt's V1ShutdownCertificate, with one frozen V1 stream cursor."""
    gate = AccountServingGate.objects.filter(org_id=ORG).order_by("account_key").first()
    insert(V1StreamCursor, org_id=ORG, account_key=gate.account_key, route_key="pulled-route", state="polling",
           cursor=b'{"after":"frozen-at-stop"}')
    cutover_certify(org=stopped, attempt_key=ATTEMPT)
    assert set(AccountServingGate.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"v1_drained"}
    return stopped


@pytest.fixture
def restorable(drained, tmp_path):
    """Every gate ``v1_drained`` and the attempt's V1RestorePoint recorded (control database)."""
    capture = restore_point_capture(org=drained, attempt_key=ATTEMPT, backup_dir=tmp_path)
    restore_point_record(org=drained, capture=capture, rehearsal={"proven_by": "tests/cutover/test_restore_point.py"})
    return drained


@pytest.fixture
def validated(restorable):
    cutover_validate(org=restorable, attempt_key=ATTEMPT)
    return restorable
