"""``manage.py connector_replay``: authorize a replay of one terminal Event, or look one up.

Seed 003 "Replay identity and predecessor" and "Replay and external effects".
"""
import json

from django.core.management.base import CommandError

from connectors.inbound.replay import ReplayError, replay_lookup, replay_submit
from connectors.serving.gates import NotServing
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.replay_guard import SUPPRESS_EXTERNAL_EFFECTS, ReplayModeUnsupported

#: Exit codes: 2 bad input (mode, identity, reason); 3 not serving (retry later);
#: 4 refused (mismatch, predecessor not terminal, route not served); 5 not found.
EXIT_BAD_INPUT, EXIT_NOT_SERVING, EXIT_REFUSED, EXIT_NOT_FOUND = 2, 3, 4, 5


class Command(OperatorCommand):
    help = ("Authorize a replay of one terminal Event under the account's active ServingEpoch "
            "(--event, --reason and --principal), or read an existing one with --lookup (works while halted, "
            "writes nothing). Only --mode suppress_external_effects is accepted. Prints the request and its "
            "descendants as JSON. Exit codes: 2 bad input, 3 not serving, 4 refused, 5 not found.")

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Org id of the account.")
        parser.add_argument("--account", required=True, help="The connector account key.")
        parser.add_argument("--replay-id", required=True, help="Stable ReplayRequest ID (the replay EventGeneration).")
        parser.add_argument("--event", type=int, help="Id of the terminal predecessor Event.")
        parser.add_argument("--reason", help="Why the replay is authorized.")
        parser.add_argument("--principal", help="The authorizing operator.")
        parser.add_argument("--mode", default=SUPPRESS_EXTERNAL_EFFECTS,
                            help="External-effect mode; only suppress_external_effects is accepted.")
        parser.add_argument("--lookup", action="store_true", help="Read the request; create or repair nothing.")

    def handle(self, *args, org, account, replay_id, event, reason, principal, mode, lookup, **options):
        try:
            scope = OrgScope(org)
            if lookup:
                result = replay_lookup(org=scope, account_key=account, replay_id=replay_id)
            else:
                missing = [name for name, value in (("--event", event), ("--reason", reason),
                                                    ("--principal", principal)) if value is None]
                if missing:
                    raise CommandError(f"replay_invalid: {', '.join(missing)} required", returncode=EXIT_BAD_INPUT)
                result = replay_submit(org=scope, account_key=account, replay_id=replay_id,
                                       predecessor_event_id=event, reason=reason, principal=principal,
                                       external_effects=mode)
        except (ReplayModeUnsupported, InvalidIdentity) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT) from exc
        except NotServing as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_NOT_SERVING) from exc
        except ReplayError as exc:
            code = EXIT_NOT_FOUND if exc.http_status == 404 else (EXIT_BAD_INPUT if exc.http_status == 400
                                                                   else EXIT_REFUSED)
            raise CommandError(f"{exc.code}: {exc}", returncode=code) from exc
        self.stdout.write(json.dumps(result.as_dict(), sort_keys=True))
        if not lookup and not result.materialized:
            self.stderr.write("replay admitted; materialization waits for v2_serving: run the same command again")
