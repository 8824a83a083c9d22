"""``manage.py records <subcommand>``: operator view and deletion of CRM records (seed 000).

- ``show --org ORG OBJECT KEY [--json]``: the record's owner, fields and mirrors, its
  remote links, and its outbound intents with their Runtime states
  (``pending`` / ``accepted`` / ``terminal`` / ``unknown``);
- ``delete --org ORG OBJECT KEY``: delete through the installed lifecycle
  (Runtime owner check, then the record's active push links are suspended
  ``source_deleted``).

- ``access publish FILE --org ORG --actor A --reason R``: publish the JSON access
  policy in FILE (``-``: standard input) as the org's next generation; prints
  ``{"org", "generation", "digest", "created"}`` (the latest document again:
  ``created`` false, nothing written);
- ``access show --org ORG [--json]``: the org's access policy in force and its
  generation chain (none: the org is unrestricted);
- ``access check --org ORG --user U --object O [--record KEY] [--op read]
  [--fields F1,F2]``: one decision (object, record or field access) as JSON;
- ``access share --org ORG OBJECT KEY --user U --access read|edit|none --actor A
  --reason R``: share a record with a user, or revoke the share.
- ``access draft --org ORG``: print, as JSON, the org's policy in force, or
  without one a policy equal to what the org may do today (the metadata view's
  users and ``read_access`` lists), to edit and publish.

Exit codes: 0 done (``check``: allowed); 75 (EX_TEMPFAIL) retryable conflict (``owner_outbound_pending``,
``owner_contended``: retry later); 1 refused or not found (``record_not_found``;
``check``: ``access_denied``); 2 bad usage, a malformed org/object/key/user
(``invalid_identity``), an unreadable file or an invalid access policy
(``access_policy_invalid``; nothing is published). The message on stderr starts
with the stable code. Access policies: docs/operations.md, "Who may do what".
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record, RecordFieldHistory
from nexusflow.records.owner import OwnerConflict, owner_intents_read
from nexusflow.records.remote_links import remote_links
from nexusflow.records.services import RecordNotFound, record_delete_by_key

EX_TEMPFAIL = 75


def _identity(options) -> tuple[str, str, str]:
    try:
        return (validate_key(options["org"], field="org"),
                validate_key(options["object_name"], field="object", max_length=80),
                validate_key(options["record_key"], field="record_key", max_length=64))
    except InvalidIdentity as exc:
        raise CommandError(f"{exc.code}: {exc}", returncode=2) from exc


def record_report(*, org_id: str, object_name: str, record_key: str) -> dict:
    """The support view of one record (live or deleted): fields, mirrors, remote links, owner intents.

    Raises:
        RecordNotFound: no record with this identity ever existed in ``org_id``.
    """
    record = Record.objects.filter(org_id=org_id, object_name=object_name, record_key=record_key).first()
    if record is None:
        raise RecordNotFound(f"no {object_name} record {record_key!r}")
    return {
        "record": f"{object_name}/{record_key}", "org": org_id, "version": int(record.version),
        "deleted": bool(record.is_deleted), "owner": record.owner_id, "fields": record.fields,
        "mirrors": record.mirrors,
        "remote_links": remote_links().describe(org_id=org_id, object_name=object_name, record_key=record_key),
        "intents": [{"command": intent.command_id, "contract_key": intent.contract_key,
                     "link_key": intent.link_key, "state": intent.state}
                    for intent in owner_intents_read(org_id=org_id, object_name=object_name,
                                                     record_key=record_key)],
        # Newest first, at most 50 field changes (objects with track_history only).
        "history": [{"sequence": h.sequence, "field": h.field, "change": h.change, "old": h.old_value,
                     "new": h.new_value, "record_version": h.record_version, "at": h.created_at.isoformat()}
                    for h in RecordFieldHistory.objects.filter(org_id=org_id, object_name=object_name,
                                                               record_key=record_key)
                    .order_by("-sequence", "field")[:50]],
    }


class Command(OperatorCommand):
    help = "CRM record operator commands: show, delete."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{show,delete,access}")
        for name, text in (("show", "Fields, mirrors, remote links and outbound intents of one record."),
                           ("delete", "Delete one record through the installed deletion lifecycle.")):
            op = sub.add_parser(name, help=text)
            op.add_argument("--org", required=True)
            op.add_argument("object_name", metavar="OBJECT")
            op.add_argument("record_key", metavar="KEY")
            if name == "show":
                op.add_argument("--json", action="store_true")
        access = sub.add_parser("access", help="Who may do what: access policy generations, decisions, shares.")
        verbs = access.add_subparsers(dest="access_command", required=True,
                                      metavar="{publish,show,check,share,draft}")
        publish = verbs.add_parser("publish", help="Publish an access policy document as the org's next generation.")
        publish.add_argument("file", metavar="FILE", help="The JSON document (- for standard input).")
        show = verbs.add_parser("show", help="The org's access policy in force and its generations.")
        show.add_argument("--json", action="store_true")
        check = verbs.add_parser("check", help="Decide whether a user may do an operation.")
        check.add_argument("--user", required=True)
        check.add_argument("--object", required=True, dest="object_name")
        check.add_argument("--record", dest="record_key", help="A record key: decide record access.")
        check.add_argument("--op", default="read", help="create | read | edit | delete (default read).")
        check.add_argument("--fields", help="Comma-separated fields: decide field access (op read or edit).")
        share = verbs.add_parser("share", help="Share a record with a user (read, edit) or revoke (none).")
        share.add_argument("object_name", metavar="OBJECT")
        share.add_argument("record_key", metavar="KEY")
        share.add_argument("--user", required=True)
        share.add_argument("--access", required=True, choices=["read", "edit", "none"])
        draft = verbs.add_parser("draft", help="Print a policy equal to what the org may do today (to edit, then "
                                                "publish).")
        for verb in (publish, show, check, share, draft):
            verb.add_argument("--org", required=True)
        for verb in (publish, share):
            verb.add_argument("--actor", required=True, help="Who makes the change.")
            verb.add_argument("--reason", required=True, help="Why (kept on the row).")

    def handle(self, *args, subcommand: str, **options):
        if subcommand == "access":
            from ._access import handle_access

            handle_access(self, **options)
            return
        org_id, object_name, record_key = _identity(options)
        try:
            if subcommand == "show":
                report = record_report(org_id=org_id, object_name=object_name, record_key=record_key)
                self._show(report, as_json=options["json"])
                return
            record = record_delete_by_key(org=OrgScope(org_id), object_name=object_name, record_key=record_key)
        except OwnerConflict as exc:
            raise CommandError(f"{exc.code}: {exc} (retry after {exc.retry_after} s)",
                               returncode=EX_TEMPFAIL) from exc
        except (RecordNotFound, NexusError) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=1) from exc
        self.stdout.write(f"deleted {record.object_name}/{record.record_key} (version {record.version})")

    def _show(self, report: dict, *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True, default=str))
            return
        out = self.stdout.write
        out(f"{report['record']} org {report['org']} version {report['version']}"
            f"{' DELETED' if report['deleted'] else ''} owner {report['owner'] or '-'}")
        for name, value in sorted(report["fields"].items()):
            out(f"  field {name} = {value!r}")
        for name, value in sorted(report["mirrors"].items()):
            out(f"  mirror {name} = {value!r}")
        for link in report["remote_links"]:
            out(f"  link {link['link']} {link['action_type']} {link['state']}"
                f"{' (' + link['reason_code'] + ')' if link['reason_code'] else ''} remote {link['remote_id']}")
        for intent in report["intents"]:
            out(f"  intent {intent['command']} {intent['contract_key']} {intent['state']}")
