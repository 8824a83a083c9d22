"""``manage.py connector_halt --org ORG [--force]``: halt the org's gate set for a successor switch."""
from django.core.management.base import CommandError

from connectors.management.commands._handoff_common import EXIT_PENDING, command_error
from connectors.serving.handoff import HandoffRefused, halt_begin, halt_try_complete
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("Move every v2_serving gate of the org to halting_v2 (seed 003 'State machines'), then every drained "
            "halting_v2 gate to v2_halted. Run it again until it exits 0. Exit codes: 0 every gate v2_halted; "
            "1 bad input; 3 refused (serving-only work pending, gates on several epochs, V1 states); "
            "4 some gate still halting (open DispatchPermits or predecessor work; the reason code says which).")

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Org id whose exhaustive gate set to halt.")
        parser.add_argument("--force", action="store_true",
                            help="Halt even though work that needs a serving gate is still pending; the gate then "
                                 "stays halting_v2 until that work is terminal (there is no way back from halting_v2).")

    def handle(self, *args, org, force, **options):
        try:
            scope = OrgScope(org)
            halt_begin(org=scope, force=force)
            report = halt_try_complete(org=scope)
        except (HandoffRefused, InvalidIdentity) as exc:
            raise command_error(exc) from exc
        for account, (state, reason) in sorted(report.gates.items()):
            self.stdout.write(f"{account}\t{state}\t{reason}")
        if not report.all_halted:
            raise CommandError("halt_pending: some gates are still halting_v2", returncode=EXIT_PENDING)
