"""``manage.py connector_credential_publish --org ORG FILE``: publish an immutable credential generation."""
from django.core.management.base import CommandError

from connectors.serving.generations import credential_generation_read, credential_publish, load_json_document
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("Publish immutable CredentialGenerations from a JSON file: one object or a list of "
            '{"account_key", "credential_ref", "version", "secret"?: {"from_env": NAME} | {"from_file": PATH}, '
            '"transport"?: {...}}. The secret is written once to NEXUS_SECRETS_DIR/<org>/<account>/<ref>/<version> '
            "(never to the database); without \"secret\" that file must exist. Exit 1 on bad input.")

    def add_arguments(self, parser):
        parser.add_argument("file", help="Path to the credential JSON document.")
        parser.add_argument("--org", required=True, help="Org id the credentials belong to.")

    def handle(self, *args, file, org, **options):
        try:
            scope = OrgScope(org)
            document = load_json_document(file)
            for item in document if isinstance(document, list) else [document]:
                generation, created = credential_publish(org=scope, document=item)
                receipt = credential_generation_read(org=scope, credential_generation_id=generation.pk).receipt
                self.stdout.write(
                    f"credential {generation.account_key}/{generation.credential_ref} version "
                    f"{generation.secret_version}: generation {generation.pk} "
                    f"{'published' if created else 'already published'} (receipt {receipt.owner_digest[:16]})")
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
