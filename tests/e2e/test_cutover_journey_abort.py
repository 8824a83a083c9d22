"""The V1 -> V2 cutover journeys end to end (issue 21 item 7): ``manage.py journeys run cutover-...``.

Each runs through the command itself: its own databases, the billing sandbox process, gunicorn, the V2
``run_workers`` processes and a V1 worker (``run_workers --role v1``), signed webhooks over HTTP and the real
``manage.py cutover`` phases. The journeys' checks read the databases and the provider (see
``packs/demo/cutover_journeys.py``); the tests read the JSON report: every check, the demo's summary fields
and the seconds of each phase.
"""
import pytest

from tests.e2e.cutover_journey_support import run_cutover_journey

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def test_cutover_abort_a_budget_breach_at_remeasure_returns_to_v1_serving():
    report = run_cutover_journey("cutover-abort")
    checks = {check["check"] for check in report["checks"]}
    assert {"halt-v1 reports the budget breach", "every gate is back in v1_serving",
            "every gate has a new fence"} <= checks
