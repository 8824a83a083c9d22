"""The cutover-abort journey (issue 21 item 7): a drain budget breach at halt-v1's remeasure returns
every gate to v1_serving (packs/demo/cutover_journeys.py); the test reads the journey's JSON report."""
import pytest

from tests.e2e.cutover_journey_support import run_cutover_journey

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def test_cutover_abort_a_budget_breach_at_remeasure_returns_to_v1_serving():
    report = run_cutover_journey("cutover-abort")
    checks = {check["check"] for check in report["checks"]}
    assert {"halt-v1 reports the budget breach", "every gate is back in v1_serving",
            "every gate has a new fence"} <= checks
