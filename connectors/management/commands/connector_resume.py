"""``manage.py connector_resume --org ORG``: return halted gates to the predecessor (before any handoff)."""

from connectors.management.commands._handoff_common import command_error
from connectors.serving.handoff import HandoffRefused, predecessor_resume
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("Abort a successor switch: every v2_halted gate returns to v2_serving on the predecessor epoch, only "
            "while no OrderingHandoff exists (seed 003 'Generation and replay'). Exit codes: 0 serving; "
            "1 bad input; 3 refused (resume_refused after a handoff, or gates not all v2_halted).")

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Org id.")

    def handle(self, *args, org, **options):
        try:
            report = predecessor_resume(org=OrgScope(org))
        except (HandoffRefused, InvalidIdentity) as exc:
            raise command_error(exc) from exc
        self.stdout.write(f"epoch {report.epoch_id} serving again; accounts: {', '.join(report.accounts)}")
