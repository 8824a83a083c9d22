"""The cutover-restore journey (issue 21 item 7): a failed candidate, cutover restore, V1 serves again
(packs/demo/cutover_journeys.py); the test reads the journey's JSON report."""
import pytest

from tests.e2e.cutover_journey_support import run_cutover_journey

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def test_cutover_restore_brings_the_v1_point_back_and_v1_serves_again():
    report = run_cutover_journey("cutover-restore")
    assert "full_restore" in report["provider"]["phase_seconds"]
    checks = {check["check"] for check in report["checks"]}
    assert {"the candidate's table is gone", "V1 events, cursors and transport keys are the point's",
            "a V1-accepted batch is answered from V1 idempotency ('redelivered')",
            "new deliveries are accepted by the new V1 generation"} <= checks
