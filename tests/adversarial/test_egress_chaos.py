"""Parallel egress workers, sandbox faults and kills in the middle of the HTTP call."""
import time

import pytest

from connectors.models import DispatchPermit, RemoteEffect
from tests.adversarial.helpers import check_end_state, pending_work, run_parallel, spawn
from tests.conftest import hubspot_event, post_signed, run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _contacts(client, n_contacts=6, n_updates=3):
    expected = {}
    eid = 1
    for c in range(n_contacts):
        oid = 5000 + c
        batch = [hubspot_event(eid, oid, 1000), hubspot_event(eid + 1, oid, 1100, "lifecyclestage", "customer"),
                 hubspot_event(eid + 2, oid, 1200, "email", f"c{c}u0@x.io")]
        eid += 3
        assert post_signed(client, batch).status_code == 202
        expected[str(oid)] = {"lifecyclestage": "customer", "email": f"c{c}u0@x.io"}
    return expected, eid


@pytest.mark.chaos
def test_parallel_egress_with_faults_and_interleaved_updates(client, serving_org):
    sandbox = serving_org.sandbox
    expected, eid = _contacts(client)
    env = subprocess_env()
    sandbox.set_faults(drop_response_after_commit=4, fail_before_commit={"status": 503, "count": 3})
    run_parallel(env, {"connector": 2, "runtime": 2, "flow": 2, "egress": 3}, rounds=2)
    for u in range(1, 4):
        for c in range(6):
            oid = 5000 + c
            assert post_signed(client, [hubspot_event(eid, oid, 2000 + u, "email", f"c{c}u{u}@x.io"),
                                        hubspot_event(eid + 1, oid, 2000 + u, "firstname", f"N{c}{u}")]).status_code == 202
            eid += 2
            expected[str(oid)].update({"email": f"c{c}u{u}@x.io", "firstname": f"N{c}{u}"})
        sandbox.set_faults(drop_response_after_commit=2)
        run_parallel(env, {"connector": 2, "runtime": 2, "flow": 2, "egress": 3}, rounds=1)
    run_parallel(env, {"connector": 2, "runtime": 2, "flow": 2, "egress": 3}, rounds=20, timeout=400)
    assert not any(pending_work().values()), pending_work()
    problems = check_end_state(expected, sandbox)
    assert not problems, (problems, list(RemoteEffect.objects.values_list("id", "state", "reason_code")))
    assert len(sandbox.state()["customers"]) == 6


@pytest.mark.chaos
def test_worker_killed_during_slow_http_call(client, serving_org, tmp_path):
    sandbox = serving_org.sandbox
    expected, _ = _contacts(client, n_contacts=1)
    env = subprocess_env()
    for role in ("connector", "flow", "runtime"):
        assert run_manage(["run_workers", "--role", role, "--until-idle"], env).returncode == 0
    sandbox.set_faults(delay_seconds=3)
    requests_before = sandbox.state()["requests"]
    worker = spawn("egress", env, until_idle=False)
    deadline = time.time() + 30
    while time.time() < deadline and not DispatchPermit.objects.filter(state="sending").exists():
        time.sleep(0.05)
    while time.time() < deadline and sandbox.state()["requests"] == requests_before:  # the call reached the provider
        time.sleep(0.05)
    worker.kill()
    worker.communicate()
    assert DispatchPermit.objects.filter(state="sending").exists()
    run_parallel(env, {"connector": 1, "runtime": 1, "flow": 1, "egress": 2}, rounds=20)
    sandbox.set_faults(delay_seconds=0)
    run_parallel(env, {"connector": 1, "runtime": 1, "flow": 1, "egress": 2}, rounds=20)
    assert not any(pending_work().values()), (pending_work(), list(RemoteEffect.objects.values_list("state", "reason_code")))
    assert len(sandbox.state()["customers"]) == 1
    assert not check_end_state(expected, sandbox)
