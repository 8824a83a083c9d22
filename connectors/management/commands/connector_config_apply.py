"""``manage.py connector_config_apply --org ORG FILE``: author an L2 configuration generation."""
import json

from django.core.management.base import BaseCommand, CommandError

from connectors.serving import ConfigurationError, service_configuration_apply
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope


class Command(BaseCommand):
    help = ("Author the next immutable ConnectorServiceConfigurationGeneration from a JSON file: "
            '{"accounts": [{"account_key", "pack", "routes": [...], "push_contracts": [...], "base_url", '
            '"credentials": {"<ref>": "env:NAME" | "file:PATH"}}]}. Applying the latest document again is a no-op.')

    def add_arguments(self, parser):
        parser.add_argument("file", help="Path to the configuration JSON document.")
        parser.add_argument("--org", required=True, help="Org id the configuration belongs to.")

    def handle(self, *args, file, org, **options):
        try:
            with open(file, encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, json.JSONDecodeError) as exc:
            raise CommandError(f"cannot read {file}: {exc}") from exc
        try:
            generation = service_configuration_apply(org=OrgScope(org), document=document)
        except (ConfigurationError, InvalidIdentity) as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        self.stdout.write(f"configuration generation {generation.generation} ({generation.digest[:16]}) for {org}")
