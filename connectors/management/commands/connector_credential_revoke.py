"""``manage.py connector_credential_revoke --org ORG --generation ID --actor A [--urgent]``: revoke a CredentialGeneration for dispatch.

``--urgent`` aborts an open first-activation attempt that holds the publication barriers (while its
CutoverDecision is ``rollback_open``) and then revokes; once activation won it is refused
``publication_barrier_held`` (run it again after the activation's release).

Seed 003 "State machines" (CredentialGenerationDispatchGate); see :mod:`connectors.serving.credential_gates`.
Exit 0 done (also when already revoked), 1 refused.
"""
from django.core.management.base import CommandError

from connectors.serving.credential_gates import credential_revoke, credential_revoke_urgent
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError


class Command(OperatorCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True)
        parser.add_argument("--generation", type=int, required=True, help="CredentialGeneration id.")
        parser.add_argument("--actor", required=True, help="Who authorizes it.")
        parser.add_argument("--note", default="", help="Why (kept with the closed Permits' evidence).")
        parser.add_argument("--urgent", action="store_true",
                            help="Abort an open activation attempt holding the publication barriers first.")

    def handle(self, *args, org, generation, actor, note, urgent=False, **options):
        revoke = credential_revoke_urgent if urgent else credential_revoke
        try:
            change = revoke(org_id=org, credential_generation_id=generation, actor=actor, note=note)
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        self.stdout.write(f"credential generation {generation}: {'revoked' if change.changed else 'already revoked'} "
                          f"(fence {change.fence_token}); closed granted permits: {list(change.closed_permits)}; "
                          f"sending permits that will settle: {list(change.open_sending_permits)}")
