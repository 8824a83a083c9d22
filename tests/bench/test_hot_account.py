"""The hot-account capacity test end to end on a tiny plan (run by ``make bench``; never part of ``make test``).

It asserts what the run did (every class served, every customer event pushed and finalized, the revocation
and the halt through the real services) and that every budget got a verdict; it never asserts a budget is
met or a wall-clock bound: those depend on the machine and are the report's business.
"""
import json

import pytest

from packs.bench.plan import OPERATION_CLASSES
from tests.conftest import run_manage, subprocess_env

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True, databases=["default", "control"])]

_LOOSE = {"p95_ms_at_most": 60000, "p99_ms_at_most": 60000, "starvation_ms_at_most": 120000}
TINY = {
    "format": "nexusflow.capacity-plan.v1", "name": "tiny", "service": "packs/demo/service.json",
    "accounts": {"inbound": "crm-webhooks", "outbound": "billing-main"},
    "workload": {
        "duration_seconds": 4, "workers_per_role": 1, "senders": 2, "warm_contacts": 3, "drain_timeout_seconds": 30,
        "classes": {
            "admission": {"rate_per_second": 2}, "replay_admission": {"count": 2}, "outbound_authoring": {"count": 3},
            "credential_revocation": {"count": 1, "hold_seconds": 0.5}, "halt": {"count": 1, "after_drain": 1},
            "materialization": {"follows": ["admission", "outbound_authoring"]},
            "execution_claim": {"follows": ["admission", "outbound_authoring"]},
            "flow_step_claim": {"follows": ["outbound_authoring"]},
            "permit_acquisition": {"follows": ["outbound_authoring"]},
            "settlement": {"follows": ["outbound_authoring"]},
        },
    },
    "budgets": {
        "classes": {name: {"completed_at_least": 1, **_LOOSE} for name in OPERATION_CLASSES},
        "gate_lock_wait": {"p95_ms_at_most": 1000, "p99_ms_at_most": 1000},
        "deadlocks_at_most": 10, "retries_at_most": 100,
    },
}


def test_a_tiny_plan_runs_every_class_on_real_workers_and_judges_every_budget(tmp_path):
    plan = tmp_path / "tiny.json"
    plan.write_text(json.dumps(TINY), encoding="utf-8")
    result = run_manage(["capacity_plan", "--plan", str(plan), "--json"],
                        subprocess_env(NEXUS_BENCH_DIR=str(tmp_path)), timeout=540)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "capacity_report.json").read_text(encoding="utf-8"))
    assert json.loads(result.stdout.strip().splitlines()[-1])["budgets"] == report["budgets"]
    classes = report["classes"]
    # A delivery answered 503 after its receipt committed is admitted by the provider's resend (200).
    assert set(classes["admission"]["outcomes"]) <= {"admitted", "admitted_on_retry"}
    assert classes["admission"]["completed"] == 8
    assert classes["replay_admission"]["outcomes"] == {"redelivered": 2}
    # Every customer event authored one command, got a Permit and was settled at the billing sandbox.
    for name in ("outbound_authoring", "permit_acquisition", "settlement"):
        assert classes[name]["completed"] == 3 and classes[name]["pending"] == 0, (name, classes[name])
    assert classes["materialization"]["completed"] == classes["execution_claim"]["completed"] == 11
    assert classes["flow_step_claim"]["completed"] >= 3
    assert classes["credential_revocation"]["outcomes"] == {"revoked_and_reenabled": 1}
    halts = classes["halt"]["outcomes"]
    assert sum(halts.values()) == 2 and halts.get("halted_and_resumed", 0) >= 1  # the one after the drain
    assert report["server"]["drained"] is True
    assert report["gate_lock_wait"]["samples"] > 0 and "sampler_error" not in report["gate_lock_wait"]
    assert isinstance(report["deadlocks"], int) and isinstance(report["retries"]["total"], int)
    expected = {f"{name}.{budget}" for name in OPERATION_CLASSES for budget in TINY["budgets"]["classes"][name]}
    expected |= {"gate_lock_wait.p95_ms_at_most", "gate_lock_wait.p99_ms_at_most", "deadlocks_at_most",
                 "retries_at_most"}
    assert set(report["budgets"]) == expected
    assert all(v["verdict"] in ("met", "missed") for v in report["budgets"].values())
