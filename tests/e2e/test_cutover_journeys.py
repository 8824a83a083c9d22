"""The V1 -> V2 cutover journeys end to end (issue 21 item 7): ``manage.py journeys run cutover-...``.

Each runs through the command itself: its own databases, the billing sandbox process, gunicorn, the V2
``run_workers`` processes and a V1 worker (``run_workers --role v1``), signed webhooks over HTTP and the real
``manage.py cutover`` phases. The journeys' checks read the databases and the provider (see
``packs/demo/cutover_journeys.py``); the tests read the JSON report: every check, the demo's summary fields
and the seconds of each phase.
"""
import json

import pytest

from tests.conftest import ROOT, run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _run(name: str, *extra: str) -> dict:
    result = run_manage(["journeys", "run", name, "--json", *extra], subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["journey"] == name and report["ok"] is True
    assert report["checks"] and all(check["ok"] for check in report["checks"]), report["checks"]
    return report


def test_cutover_v1_to_v2_keeps_source_order_answers_retryably_and_creates_one_remote_record_per_contact(tmp_path):
    # A deliveries file of our own (the demo's format): the first 45 deliveries of the demo's file.
    lines = (ROOT / "packs" / "hubspot" / "fixtures" / "demo_webhooks.jsonl").read_text().splitlines()
    events = tmp_path / "deliveries.jsonl"
    events.write_text("\n".join(lines[:45]) + "\n")
    report = _run("cutover-v1-to-v2", "--events", str(events))
    summary, phases = report["provider"]["summary"], report["provider"]["phase_seconds"]
    assert summary["deliveries"] > 0 and summary["duplicate_remote_creates"] == 0 and summary["nonterminal"] == 0
    assert summary["answered_retryably"] > 0 and summary["tombstone_answers"] > 0
    assert {"v1_serving", "preflight", "halt_v1", "drain", "stop", "certify", "restore_point", "validate",
            "activate", "v2_serving"} <= set(phases)
    checks = {check["check"] for check in report["checks"]}
    assert {"deliveries during the cutover are answered 503 with Retry-After (retryable, nothing accepted)",
            "redeliveries of V1-accepted batches are answered from their tombstones",
            "the V1 push link was adopted at certify (V2 PATCHes the same customer)",
            "at most one remote customer per contact"} <= checks


def test_cutover_restore_brings_the_v1_point_back_and_v1_serves_again():
    report = _run("cutover-restore")
    assert "full_restore" in report["provider"]["phase_seconds"]
    checks = {check["check"] for check in report["checks"]}
    assert {"the candidate's table is gone", "V1 events, cursors and transport keys are the point's",
            "a V1-accepted batch is answered from V1 idempotency ('redelivered')",
            "new deliveries are accepted by the new V1 generation"} <= checks


def test_cutover_abort_a_budget_breach_at_remeasure_returns_to_v1_serving():
    report = _run("cutover-abort")
    checks = {check["check"] for check in report["checks"]}
    assert {"halt-v1 reports the budget breach", "every gate is back in v1_serving",
            "every gate has a new fence"} <= checks
