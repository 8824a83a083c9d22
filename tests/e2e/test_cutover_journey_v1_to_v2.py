"""The V1 -> V2 cutover journeys end to end (issue 21 item 7): ``manage.py journeys run cutover-...``.

Each runs through the command itself: its own databases, the billing sandbox process, gunicorn, the V2
``run_workers`` processes and a V1 worker (``run_workers --role v1``), signed webhooks over HTTP and the real
``manage.py cutover`` phases. The journeys' checks read the databases and the provider (see
``packs/demo/cutover_journeys.py``); the tests read the JSON report: every check, the demo's summary fields
and the seconds of each phase.
"""
import pytest

from tests.conftest import ROOT
from tests.e2e.cutover_journey_support import run_cutover_journey

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def test_cutover_v1_to_v2_keeps_source_order_answers_retryably_and_creates_one_remote_record_per_contact(tmp_path):
    # A deliveries file of our own (the demo's format): the first 45 deliveries of the demo's file.
    lines = (ROOT / "packs" / "hubspot" / "fixtures" / "demo_webhooks.jsonl").read_text().splitlines()
    events = tmp_path / "deliveries.jsonl"
    events.write_text("\n".join(lines[:45]) + "\n")
    report = run_cutover_journey("cutover-v1-to-v2", "--events", str(events))
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
