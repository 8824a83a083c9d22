"""Running a cutover journey through ``manage.py journeys run NAME --json`` and reading its report."""
import json

from tests.conftest import run_manage, subprocess_env


def run_cutover_journey(name: str, *extra: str) -> dict:
    result = run_manage(["journeys", "run", name, "--json", *extra], subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["journey"] == name and report["ok"] is True
    assert report["checks"] and all(check["ok"] for check in report["checks"]), report["checks"]
    return report


