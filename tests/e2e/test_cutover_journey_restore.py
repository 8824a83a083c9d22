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


def test_cutover_restore_brings_the_v1_point_back_and_v1_serves_again():
    report = run_cutover_journey("cutover-restore")
    assert "full_restore" in report["provider"]["phase_seconds"]
    checks = {check["check"] for check in report["checks"]}
    assert {"the candidate's table is gone", "V1 events, cursors and transport keys are the point's",
            "a V1-accepted batch is answered from V1 idempotency ('redelivered')",
            "new deliveries are accepted by the new V1 generation"} <= checks
