"""Metrics, alert rules and the dashboard (seed 004 section 19; seed 003 alert deadlines; issue 22 items 5-6).

- the checked-in ``ops/prometheus/alerts.yml`` is exactly what
  ``manage.py prometheus_alerts`` generates from the reason-code registry,
  and ``promtool check rules`` accepts it;
- a quarantined effect past its code's alert deadline fires that code's rule
  (``promtool test rules`` over the very sample ``GET /metrics`` exported
  from the row), and the same effect before its deadline fires nothing;
- every panel of ``ops/grafana/nexusflow.json`` reads an exported family.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.contrib.auth.models import User
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from connectors.models import RemoteEffect
from connectors.reasons import OPERATOR_QUARANTINE
from nexusflow.kernel.metrics import REASON_OLDEST_AGE, alert_rules_text, expression_families, sample_names
from nexusflow.kernel.reasons import load_all_reasons
from tests.conftest import ROOT, run_manage, subprocess_env
from tests.kernel import rows

ALERTS = ROOT / "ops" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "nexusflow.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: `make test` installs Debian's prometheus")


def scrape_metrics() -> dict[tuple[str, tuple], float]:
    """``GET /metrics`` as an operator: ``{(sample name, sorted labels): value}``."""
    client = APIClient()
    user, _ = User.objects.get_or_create(username="scraper", defaults={"is_staff": True})
    client.force_login(user)
    response = client.get("/metrics")
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def promtool_test(tmp_path: Path, series: dict[str, float], alert: str, expected: list[dict]) -> subprocess.CompletedProcess:
    """Run ``promtool test rules`` on alerts.yml: ``series`` held for 5 minutes, ``alert`` evaluated at 1m."""
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    test = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": name, "values": f"{value}+0x5"} for name, value in series.items()],
            "alert_rule_test": [{"eval_time": "1m", "alertname": alert, "exp_alerts": expected}],
        }],
    }
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def _series(name: str, labels: tuple) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def test_the_checked_in_alert_rules_are_the_generated_ones():
    assert ALERTS.read_text() == alert_rules_text(), "run `manage.py prometheus_alerts` and commit the file"
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    attention = {code: r for code, r in load_all_reasons().items() if r.severity_class == "attention"}
    assert {rule["labels"]["reason_code"] for rule in rules} == set(attention)
    for rule in rules:
        code = rule["labels"]["reason_code"]
        assert REASON_OLDEST_AGE in rule["expr"] and rule["expr"].endswith(f"> {attention[code].alert_after_seconds}")


def test_prometheus_alerts_check_reports_a_stale_file(tmp_path):
    stale = tmp_path / "alerts.yml"
    stale.write_text(alert_rules_text() + "# edited by hand\n")
    env = subprocess_env()
    result = run_manage(["prometheus_alerts", "--check", "--output", str(stale)], env)
    assert result.returncode == 1 and "differs" in result.stderr
    assert run_manage(["prometheus_alerts", "--output", str(stale)], env).returncode == 0
    assert stale.read_text() == alert_rules_text()
    assert run_manage(["prometheus_alerts", "--check", "--output", str(stale)], env).returncode == 0
    missing = run_manage(["prometheus_alerts", "--output", str(tmp_path / "no" / "alerts.yml")], env)
    assert missing.returncode == 2 and "is not a folder" in missing.stderr


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(group["rules"]) for group in yaml.safe_load(ALERTS.read_text())["groups"])
    assert f"SUCCESS: {rules} rules found" in result.stdout


@needs_promtool
@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_a_quarantined_effect_past_its_alert_deadline_fires_its_rule(tmp_path, db_clock_advance):
    deadline = load_all_reasons()[OPERATOR_QUARANTINE].alert_after_seconds
    rows.make(RemoteEffect, org_id="metrics-org", state="quarantined", version=1, reason_code=OPERATOR_QUARANTINE)
    labels = (("machine", "connectors.RemoteEffect"), ("reason_code", OPERATOR_QUARANTINE),
              ("severity", "attention"), ("state", "quarantined"))
    alert = "NexusflowOperatorQuarantine"
    rule = next(rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
                if rule["alert"] == alert)
    annotations = {key: value.replace("{{ $labels.machine }}", "connectors.RemoteEffect")
                   .replace("{{ $labels.state }}", "quarantined") for key, value in rule["annotations"].items()}
    fired = [{"exp_labels": {"machine": "connectors.RemoteEffect", "state": "quarantined",
                             "reason_code": OPERATOR_QUARANTINE, "severity": "attention", "owner": "connectors"},
              "exp_annotations": annotations}]

    before = scrape_metrics()
    assert before[("nexusflow_reason_rows", labels)] == 1
    young = before[(REASON_OLDEST_AGE, labels)]
    assert young < deadline
    quiet = promtool_test(tmp_path, {_series(REASON_OLDEST_AGE, labels): young}, alert, [])
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert promtool_test(tmp_path, {_series(REASON_OLDEST_AGE, labels): young}, alert, fired).returncode == 1

    db_clock_advance(deadline + 60)
    after = scrape_metrics()
    old = after[(REASON_OLDEST_AGE, labels)]
    assert old >= deadline + 60
    firing = promtool_test(tmp_path, {_series(REASON_OLDEST_AGE, labels): old}, alert, fired)
    assert firing.returncode == 0, firing.stdout + firing.stderr


@pytest.mark.django_db(databases=["default", "control"])
def test_every_dashboard_panel_reads_an_exported_family():
    exported = sample_names()
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    assert panels
    for panel in panels:
        targets = panel.get("targets") or []
        assert targets, f"panel {panel['title']!r} has no query"
        for target in targets:
            names = expression_families(target["expr"])
            assert names, f"panel {panel['title']!r}: {target['expr']!r} reads no nexusflow family"
            unknown = names - exported
            assert not unknown, f"panel {panel['title']!r} reads {sorted(unknown)}, which /metrics does not export"
