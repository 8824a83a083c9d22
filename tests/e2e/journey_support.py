"""Running a journey through ``manage.py journeys run NAME --json`` and reading its report."""
import json

from tests.conftest import run_manage, subprocess_env

#: The CRM objects sandbox's contacts route (the HubSpot journeys' provider).
CONTACTS = "/crm/v3/objects/contacts"


def run_journey(name: str, *extra: str, timeout: float = 240) -> dict:
    """Run journey ``name`` (with the command's ``extra`` options); assert it ran and every check passed.

    Returns the journey's JSON report (``journey``, ``ok``, ``checks``, ``provider``).
    """
    result = run_manage(["journeys", "run", name, "--json", *extra], subprocess_env(), timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["journey"] == name and report["ok"] is True
    assert report["checks"] and all(check["ok"] for check in report["checks"]), report["checks"]
    return report
