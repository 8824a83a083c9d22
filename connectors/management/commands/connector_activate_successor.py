"""``manage.py connector_activate_successor --org ORG --successor EPOCH``: atomic successor activation."""

from connectors.management.commands._handoff_common import add_successor_arguments, command_error, read_evidence
from connectors.serving.handoff import HandoffRefused, successor_activate
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("In one transaction: byte-compare every OrderingHandoff with its lanes, predecessor active -> "
            "draining, successor verified -> active, every gate v2_halted -> v2_serving on the successor "
            "(seed 003 'Generation and replay'). Repeatable. Exit codes: 0 active; 1 bad input; 3 refused.")

    def add_arguments(self, parser):
        add_successor_arguments(parser)

    def handle(self, *args, org, successor, transition_class, compatibility_evidence, **options):
        evidence = read_evidence(compatibility_evidence)
        try:
            report = successor_activate(org=OrgScope(org), successor_id=successor, transition_class=transition_class,
                                        compatibility_evidence=evidence)
        except (HandoffRefused, InvalidIdentity) as exc:
            raise command_error(exc) from exc
        state = "already active" if report.already_active else f"activated after epoch {report.predecessor_epoch_id}"
        self.stdout.write(f"epoch {report.successor_epoch_id} {state} ({report.successor_digest[:16]}); "
                          f"accounts: {', '.join(report.accounts)}; handoffs: {report.handoffs}")
