"""``manage.py cutover greenfield --org ORG``: activate the first ServingEpoch."""
from django.core.management.base import BaseCommand, CommandError

from cutover.services import cutover_greenfield
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope


class Command(BaseCommand):
    help = "Run a cutover procedure. Only 'greenfield' (a fresh install with no V1) exists yet."

    def add_arguments(self, parser):
        parser.add_argument("procedure", choices=["greenfield"])
        parser.add_argument("--org", required=True, help="Org id whose accounts to activate.")

    def handle(self, *args, procedure, org, **options):
        try:
            report = cutover_greenfield(org=OrgScope(org))
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        state = "already active" if report.already_active else "activated"
        self.stdout.write(f"epoch {report.epoch_id} {state} ({report.epoch_digest[:16]}); "
                          f"accounts: {', '.join(report.accounts)}; decision: {report.decision}")
