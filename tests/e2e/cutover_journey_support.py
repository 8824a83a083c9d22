"""Running a cutover journey through ``manage.py journeys run NAME --json`` and reading its report."""
from tests.e2e.journey_support import run_journey


def run_cutover_journey(name: str, *extra: str) -> dict:
    """:func:`run_journey` with the cutover journeys' longer timeout (their phases run real commands)."""
    return run_journey(name, *extra, timeout=300)
