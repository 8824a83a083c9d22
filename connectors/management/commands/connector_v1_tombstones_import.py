"""``manage.py connector_v1_tombstones_import --org ORG FILE``: import V1 acceptance tombstones."""
from django.core.management.base import CommandError

from connectors.inbound.admission import MalformedBody, parse_body
from connectors.inbound.v1_tombstones import (
    TombstoneConflict,
    TombstoneGateState,
    TombstoneImportError,
    v1_tombstones_import,
)
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("Import V1 acceptance tombstones (seed 003 'Inbound facts') from a JSON file "
            '{"tombstones": [{"account_key", "channel", "body": [...], "predecessor": {...}}]}. '
            "Allowed only while the account gate is v1_drained or v2_validating; importing again is a no-op. "
            "Exit codes: 0 done; 1 bad input; 3 refused (tombstone_gate_state, tombstone_conflict).")

    def add_arguments(self, parser):
        parser.add_argument("file", help="Path to the tombstone JSON document.")
        parser.add_argument("--org", required=True, help="Org id the tombstones belong to.")

    def handle(self, *args, file, org, **options):
        try:
            with open(file, "rb") as handle:
                document = parse_body(handle.read())
        except OSError as exc:
            raise CommandError(f"document_unreadable: cannot read {file}: {exc}") from exc
        except MalformedBody as exc:
            raise CommandError(f"tombstone_import_invalid: {file} is not strict UTF-8 JSON") from exc
        try:
            report = v1_tombstones_import(org=OrgScope(org), document=document)
        except (TombstoneImportError, InvalidIdentity) as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        except (TombstoneGateState, TombstoneConflict) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=3) from exc
        self.stdout.write(f"tombstones for {org}: {report.created} imported, {report.existing} already present")
