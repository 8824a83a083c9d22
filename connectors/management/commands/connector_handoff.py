"""``manage.py connector_handoff --org ORG --successor EPOCH``: freeze predecessor lanes into OrderingHandoffs."""

from connectors.management.commands._handoff_common import add_successor_arguments, command_error, read_evidence
from connectors.serving.handoff import HandoffRefused, handoff_stage
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("Freeze every predecessor OrderingLane (high-water, comparator, partition contract) and stage the "
            "successor lane from it, one OrderingHandoff per lane (seed 003 'Durable source ordering'). Needs every "
            "gate v2_halted and the successor verified. After the first handoff the predecessor cannot resume. "
            "Exit codes: 0 done (repeatable); 1 bad input; 3 refused.")

    def add_arguments(self, parser):
        add_successor_arguments(parser)

    def handle(self, *args, org, successor, transition_class, compatibility_evidence, **options):
        evidence = read_evidence(compatibility_evidence)
        try:
            report = handoff_stage(org=OrgScope(org), successor_id=successor, transition_class=transition_class,
                                   compatibility_evidence=evidence)
        except (HandoffRefused, InvalidIdentity) as exc:
            raise command_error(exc) from exc
        self.stdout.write(f"epoch {report.predecessor_epoch_id} -> {report.successor_epoch_id}: "
                          f"{len(report.handed_off)} lane(s) handed off, {len(report.already)} already")
