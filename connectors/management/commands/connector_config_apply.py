"""``manage.py connector_config_apply --org ORG FILE``: author an L2 configuration generation."""
from django.core.management.base import CommandError

from connectors.serving.generations import load_json_document, service_configuration_apply, service_configuration_read
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("Author the next immutable ConnectorServiceConfigurationGeneration from a JSON file: "
            '{"org_id"?, "accounts": [{"account_key", "pack", "pack_version"?, "routes": [...], '
            '"push_contracts": [...], "mappings"?: [...], "base_url"?, '
            '"credentials": {"<credential_ref>": "<published secret version>"}}]}. '
            "Packs must be published (connector_pack_publish) and credential versions published "
            "(connector_credential_publish) first. Applying the latest document again is a no-op. "
            "Exit 1 with 'CommandError: <code>: <message>' on bad input; nothing is written then.")

    def add_arguments(self, parser):
        parser.add_argument("file", help="Path to the configuration JSON document.")
        parser.add_argument("--org", required=True, help="Org id the configuration belongs to.")

    def handle(self, *args, file, org, **options):
        try:
            scope = OrgScope(org)
            generation = service_configuration_apply(org=scope, document=load_json_document(file))
            receipt = service_configuration_read(org=scope, generation_id=generation.pk).receipt
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        self.stdout.write(f"configuration generation {generation.generation} (id {generation.pk}, digest "
                          f"{generation.digest[:16]}, receipt {receipt.owner_digest[:16]}) for {org}")
