"""``manage.py connector_credential_reenable --org ORG --generation ID --actor A``: explicitly re-enable a revoked CredentialGeneration.

Seed 003 "State machines" (CredentialGenerationDispatchGate); see :mod:`connectors.serving.credential_gates`.
Exit 0 done (also when already enabled), 1 refused.
"""
from django.core.management.base import CommandError

from connectors.serving.credential_gates import credential_reenable
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError


class Command(OperatorCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True)
        parser.add_argument("--generation", type=int, required=True, help="CredentialGeneration id.")
        parser.add_argument("--actor", required=True, help="Who authorizes it.")

    def handle(self, *args, org, generation, actor, **options):
        try:
            change = credential_reenable(org_id=org, credential_generation_id=generation, actor=actor)
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        self.stdout.write(f"credential generation {generation}: {'enabled' if change.changed else 'already enabled'} "
                          f"(fence {change.fence_token})")
