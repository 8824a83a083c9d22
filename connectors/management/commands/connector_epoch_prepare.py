"""``manage.py connector_epoch_prepare --org ORG``: prepare and verify the next ServingEpoch candidate."""
from django.core.management.base import CommandError

from connectors.serving.epoch import EpochVerificationDeferred, EpochVerificationFailed, epoch_prepare, epoch_verify
from connectors.serving.generations import ConfigurationError, OwnerUnavailable
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope

EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_DEFERRED = 1, 3, 4


class Command(OperatorCommand):
    help = ("Build the ServingEpoch candidate of the org's latest configuration generation from fresh owner reads "
            "(prepared) and verify it by re-reading and byte-comparing every owner (verified | rejected), seed 003 "
            "'State machines'. Prints the epoch id to pass to connector_handoff / connector_activate_successor. "
            "A verified candidate never serves until an activation. Exit codes: 0 verified; 1 bad input (no "
            "configuration); 3 rejected; 4 an owner is unavailable now (the candidate stays prepared; run again).")

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Org id.")

    def handle(self, *args, org, **options):
        scope = OrgScope(org)
        try:
            candidate = epoch_prepare(org=scope)
            epoch = epoch_verify(org=scope, epoch_id=candidate.pk)
        except (ConfigurationError, InvalidIdentity) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT) from exc
        except EpochVerificationFailed as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_REJECTED) from exc
        except (EpochVerificationDeferred, OwnerUnavailable) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_DEFERRED) from exc
        self.stdout.write(f"epoch {epoch.pk} {epoch.state} ({epoch.digest[:16]}) for configuration generation "
                          f"{epoch.configuration.generation} of {org}")
