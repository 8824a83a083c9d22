"""``manage.py v1_push --org ORG --contract KEY --record RECORD_KEY``: one synchronous V1 PATCH of an existing link.

Seed 002 "Scope" (the V1 runtime is synchronous PATCH-existing only). Prints
the settled V1ProviderCall; exits 1 with ``<code>: <detail>`` when refused
before I/O (``v1_no_linked_remote``, ``v1_contract_unknown``, ``credential_unavailable``)
and 3 when the provider refused or the outcome is ambiguous.
"""
from django.core.management.base import CommandError

from connectors.v1.push import v1_push_record
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = "Push one record to its existing remote object through the V1 runtime (PATCH only, never create)."

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True)
        parser.add_argument("--contract", required=True, help="A push contract a live account offers.")
        parser.add_argument("--record", required=True, help="The local record key.")

    def handle(self, *args, org, contract, record, **options):
        try:
            report = v1_push_record(org=OrgScope(org), contract_key=contract, record_key=record)
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        line = f"V1 call {report.call_id}: {report.state} ({report.status}) remote {report.remote_id}"
        if report.state != "confirmed":
            raise CommandError(line, returncode=3)
        self.stdout.write(line)
