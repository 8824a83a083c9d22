"""``manage.py prometheus_alerts``: (re)write ``ops/prometheus/alerts.yml`` from the reason-code registry.

Seed 003, "Operational liveness and maintenance admission": every
``attention`` reason code's alert deadline becomes one rule on
``nexusflow_reason_oldest_age_seconds`` (:func:`nexusflow.kernel.metrics.alert_rules`).
``--check`` writes nothing and exits 1 when the file differs from the
registry (a stale file), 0 when it matches; ``--output FILE`` writes elsewhere.
Exit code 2: the output's folder does not exist.
"""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.metrics import alert_rules_text

#: The checked-in rule file.
DEFAULT_OUTPUT = Path(settings.BASE_DIR) / "ops" / "prometheus" / "alerts.yml"


class Command(OperatorCommand):
    help = "Write ops/prometheus/alerts.yml from the reason codes' alert deadlines (or --check it)."

    def add_arguments(self, parser):
        parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the rule file to write")
        parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")

    def handle(self, *args, output: Path, check: bool, **options):
        text = alert_rules_text()
        if check:
            current = output.read_text() if output.exists() else ""
            if current != text:
                self.stderr.write(f"{output} differs from the reason-code registry: run manage.py prometheus_alerts")
                raise SystemExit(1)
            self.stdout.write(f"{output} matches the reason-code registry")
            return
        if not output.parent.is_dir():
            raise CommandError(f"{output.parent} is not a folder", returncode=2)
        output.write_text(text)
        self.stdout.write(f"wrote {output}")
