"""``manage.py records_transfer <subcommand>``: identity transfer (merge, conversion) and its facts (seed 000).

- ``merge --org ORG --object OBJECT --source KEY --target KEY --transfer-id ID --actor A``:
  merge the source record into the target record of the same object;
- ``convert --org ORG --object OBJECT --source KEY --target-object OBJECT [--target KEY] --transfer-id ID
  --actor A``: convert the source into a new (or the given existing) record of the declared target object;
- ``show --org ORG --transfer-id ID``: the stored transfer fact (read only).

Running ``merge``/``convert`` again with the same transfer id and inputs
validates the recorded target authority and prints the stored result.

Exit codes: 0 done (JSON on stdout), 75 retryable conflict (``owner_outbound_pending`` /
``owner_contended`` on stderr: retry later), 1 refused (the message starts with a stable code),
2 bad usage, a malformed key, or an unknown transfer/record.
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import UnknownObject
from nexusflow.records.transfer import (
    OwnerContended,
    OwnerWorkPending,
    TransferError,
    record_convert,
    record_merge,
    transfer_get,
)

EXIT_REFUSED, EXIT_USAGE, EXIT_RETRY = 1, 2, 75


class Command(OperatorCommand):
    help = "Identity transfer: merge, convert, show."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{merge,convert,show}")
        merge = sub.add_parser("merge", help="Merge a record into another record of the same object.")
        convert = sub.add_parser("convert", help="Convert a record into a record of its declared target object.")
        for p in (merge, convert):
            p.add_argument("--org", required=True)
            p.add_argument("--object", required=True, help="The source record's object.")
            p.add_argument("--source", required=True, help="The source record key.")
            p.add_argument("--transfer-id", required=True)
            p.add_argument("--actor", required=True)
        merge.add_argument("--target", required=True, help="The target record key.")
        convert.add_argument("--target-object", required=True)
        convert.add_argument("--target", default=None, help="An existing target record key (default: a new one).")
        show = sub.add_parser("show", help="The stored transfer fact.")
        show.add_argument("--org", required=True)
        show.add_argument("--transfer-id", required=True)

    def handle(self, *args, **options):
        try:
            org = OrgScope(validate_key(options["org"], field="org", max_length=64))
            if options["subcommand"] == "show":
                result = transfer_get(org=org, transfer_id=validate_key(options["transfer_id"], field="transfer_id",
                                                                        max_length=120))
                if result is None:
                    raise CommandError(f"transfer_not_found: no transfer {options['transfer_id']!r}",
                                       returncode=EXIT_USAGE)
            elif options["subcommand"] == "merge":
                result = record_merge(org=org, transfer_id=options["transfer_id"], object_name=options["object"],
                                      source_key=options["source"], target_key=options["target"],
                                      actor=options["actor"])
            else:
                result = record_convert(org=org, transfer_id=options["transfer_id"], source_object=options["object"],
                                        source_key=options["source"], target_object=options["target_object"],
                                        target_key=options["target"], actor=options["actor"])
        except (OwnerWorkPending, OwnerContended) as exc:
            raise CommandError(f"{exc.code}: {exc} (retry after {exc.retry_after}s)",
                               returncode=EXIT_RETRY) from exc
        except (InvalidIdentity, UnknownObject) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_USAGE) from exc
        except TransferError as exc:
            code = EXIT_USAGE if exc.http_status in (400, 404) else EXIT_REFUSED
            raise CommandError(f"{exc.code}: {exc}", returncode=code) from exc
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_REFUSED) from exc
        self.stdout.write(json.dumps(result.as_dict(), indent=2, sort_keys=True))
