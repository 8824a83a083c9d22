"""``manage.py cutover greenfield|v1-install --org ORG``: activate the first ServingEpoch, or set up a fresh V1 install."""
from django.core.management.base import BaseCommand, CommandError

from cutover.services import cutover_greenfield
from cutover.v1_install import cutover_v1_install
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope


class Command(BaseCommand):
    help = ("Run a cutover procedure: 'greenfield' (a fresh install with no V1 activates V2) or 'v1-install' "
            "(a fresh V1 install: every gate v1_serving, served by run_workers --role v1).")

    def add_arguments(self, parser):
        parser.add_argument("procedure", choices=["greenfield", "v1-install"])
        parser.add_argument("--org", required=True, help="Org id whose accounts to activate or install.")

    def handle(self, *args, procedure, org, **options):
        try:
            if procedure == "v1-install":
                report = cutover_v1_install(org=OrgScope(org))
                self.stdout.write(f"V1 installed for {org}: configuration generation {report.configuration_generation}, "
                                  f"release {report.release[:16]}; accounts: {', '.join(report.accounts)}; "
                                  f"stream cursors: {', '.join(report.cursors) or 'none'}; new rows: {report.created}")
                return
            report = cutover_greenfield(org=OrgScope(org))
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        state = "already active" if report.already_active else "activated"
        self.stdout.write(f"epoch {report.epoch_id} {state} ({report.epoch_digest[:16]}); "
                          f"accounts: {', '.join(report.accounts)}; decision: {report.decision}")
