"""``manage.py connector_handoff --org ORG --successor EPOCH``: freeze predecessor lanes into OrderingHandoffs."""
import json

from django.core.management.base import BaseCommand, CommandError

from connectors.handoff import REQUIRES_DRAIN, HandoffRefused, handoff_stage
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope

from ._handoff_common import EXIT_BAD_INPUT, command_error


def read_evidence(path: str | None):
    """Read an optional compatibility-evidence JSON file (it never enables another transition class)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise CommandError(f"cannot read {path}: {exc}", returncode=EXIT_BAD_INPUT) from exc


class Command(BaseCommand):
    help = ("Freeze every predecessor OrderingLane (high-water, comparator, partition contract) and stage the "
            "successor lane from it, one OrderingHandoff per lane (seed 003 'Durable source ordering'). Needs every "
            "gate v2_halted and the successor verified. After the first handoff the predecessor cannot resume. "
            "Exit codes: 0 done (repeatable); 1 bad input; 3 refused.")

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Org id.")
        parser.add_argument("--successor", required=True, type=int, help="Id of the verified successor ServingEpoch.")
        parser.add_argument("--transition-class", default=REQUIRES_DRAIN,
                            help="Successor transition class; only requires_drain is supported.")
        parser.add_argument("--compatibility-evidence", help="JSON file; recorded nowhere, enables nothing.")

    def handle(self, *args, org, successor, transition_class, compatibility_evidence, **options):
        evidence = read_evidence(compatibility_evidence)
        try:
            report = handoff_stage(org=OrgScope(org), successor_id=successor, transition_class=transition_class,
                                   compatibility_evidence=evidence)
        except (HandoffRefused, InvalidIdentity) as exc:
            raise command_error(exc) from exc
        self.stdout.write(f"epoch {report.predecessor_epoch_id} -> {report.successor_epoch_id}: "
                          f"{len(report.handed_off)} lane(s) handed off, {len(report.already)} already")
