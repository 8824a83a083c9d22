"""``manage.py push_links <subcommand>``: operator view and decisions on push RemoteLinks (seed 002).

- ``list --org ORG [--state S ...] [--record OBJECT/KEY] [--json]``: push links, newest first;
- ``show LINK_KEY --org ORG [--json]``: the link, its snapshot summary, its
  lifecycle evidence and the effects of its link key;
- ``revalidate LINK_KEY --org ORG --actor A --reason R``: validate against the
  slot's current action config; a suspended link returns to service;
- ``retire LINK_KEY --org ORG --actor A --reason R``: end the link (never sent again);
- ``rebind LINK_KEY --org ORG --contract KEY --actor A --reason R``: move the
  remote id to the slot that replaced a removed one.

Exit codes: 0 done, 1 refused (the message starts with a stable code), 2 bad usage or a malformed key/org.
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from connectors.models import RemoteLink
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key

STATES = ("active", "suspended_drift", "retired")


def _row(link: RemoteLink) -> dict:
    return {"link": int(link.pk), "link_key": link.link_key, "state": link.state, "reason_code": link.reason_code,
            "record": f"{link.source_object}/{link.source_record_key}", "owner_key": link.owner_key,
            "action_slot_id": link.action_slot_id, "destination_slot_id": link.destination_slot_id,
            "remote_scope": link.remote_scope, "remote_id": link.remote_id,
            "created_install_id": link.created_install_id,
            "last_validated_install_id": link.last_validated_install_id,
            "mapping_fingerprint": link.mapping_fingerprint, "body_fingerprint": link.body_fingerprint,
            "last_mapping_revalidation": int(link.last_mapping_revalidation_id)
            if link.last_mapping_revalidation_id else None,
            "last_pushed_version": link.last_pushed_version, "mirror_status": link.mirror_status,
            "created_at": link.created_at.isoformat()}


def _link_key(value: str) -> str:
    if len(value) != 64 or any(ch not in "0123456789abcdef" for ch in value):
        raise CommandError("invalid_identity: a link key is 64 lower-case hex characters", returncode=2)
    return value


class Command(OperatorCommand):
    help = "Push RemoteLink operator commands: list, show, revalidate, retire, rebind."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True,
                                    metavar="{list,show,revalidate,retire,rebind}")
        ls = sub.add_parser("list", help="List push links, newest first.")
        ls.add_argument("--org", required=True)
        ls.add_argument("--state", action="append", choices=STATES, help="Repeat to list several states.")
        ls.add_argument("--record", metavar="OBJECT/KEY", help="Only the links of one source record.")
        ls.add_argument("--limit", type=int, default=50)
        ls.add_argument("--json", action="store_true")
        show = sub.add_parser("show", help="One link with its evidence and the effects of its link key.")
        show.add_argument("link_key")
        show.add_argument("--org", required=True)
        show.add_argument("--json", action="store_true")
        for name, text in (("revalidate", "Validate against the current action config; resume a suspended link."),
                           ("retire", "End the link for good."),
                           ("rebind", "Move the remote id to the slot that replaced a removed one.")):
            op = sub.add_parser(name, help=text)
            op.add_argument("link_key")
            op.add_argument("--org", required=True)
            if name == "rebind":
                op.add_argument("--contract", required=True, help="The serving push contract of the new slot.")
            op.add_argument("--actor", required=True)
            op.add_argument("--reason", required=True)

        adopt = sub.add_parser("adopt", help="Bind a record's slot to a remote id an operator proved (a record the "
                                             "V1 link adoption refused).")
        adopt.add_argument("--org", required=True)
        adopt.add_argument("--contract", required=True, help="The serving push contract of the slot.")
        adopt.add_argument("--record", required=True, help="The local record key.")
        adopt.add_argument("--remote-id", required=True, help="The remote record's id, as the operator proved it.")
        adopt.add_argument("--actor", required=True)
        adopt.add_argument("--reason", required=True)

    def handle(self, *args, subcommand: str, **options):
        try:
            validate_key(options["org"], field="org")
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from exc
        if options.get("link_key") is not None:
            options["link_key"] = _link_key(options["link_key"])
        try:
            return getattr(self, "_" + subcommand)(**options)
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from exc
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc

    def _list(self, *, org, state, record, limit, json: bool, **_):
        from connectors.links.link_keys import PUSH_ACTION_TYPE

        if limit < 1:
            raise CommandError("invalid_limit: --limit must be at least 1", returncode=2)
        qs = RemoteLink.objects.filter(org_id=org, action_type=PUSH_ACTION_TYPE)
        if state:
            qs = qs.filter(state__in=state)
        if record:
            source_object, _, key = record.partition("/")
            if not source_object or not key:
                raise CommandError("invalid_record: --record is OBJECT/KEY", returncode=2)
            qs = qs.filter(source_object=source_object, source_record_key=key)
        rows = [_row(link) for link in qs.order_by("-id")[:limit]]
        if json:
            self.stdout.write(_dumps(rows))
            return
        for r in rows:
            reason = f" ({r['reason_code']})" if r["reason_code"] else ""
            self.stdout.write(f"link {r['link']:>6}  {r['state']}{reason}  {r['record']}  {r['destination_slot_id']}  "
                              f"remote_id={r['remote_id']}  key={r['link_key']}")
        self.stdout.write(f"{len(rows)} link(s)")

    def _show(self, *, link_key, org, json: bool, **_):
        from connectors.links.link_decisions import effects_of_link

        link = RemoteLink.objects.filter(org_id=org, link_key=link_key).first()
        if link is None:
            raise CommandError(f"link_unknown: no remote link {link_key} in org {org}")
        doc = _row(link)
        snapshot = link.snapshot or {}
        doc["snapshot"] = {k: snapshot.get(k) for k in (
            "connector_namespace", "contract_key", "target_object", "profile_name", "flow", "install_id",
            "update", "create", "response_id_path", "credential_ref", "endpoint", "mirror_tuple")}
        doc["evidence"] = [{"id": int(e.pk), "kind": e.kind, "actor": e.actor, "from": e.from_state,
                            "to": e.to_state, "detail": e.detail, "created_at": e.created_at.isoformat()}
                           for e in link.evidence.order_by("id")]
        doc["effects"] = [{"effect": int(e.pk), "state": e.state, "reason_code": e.reason_code,
                           "lane_sequence": e.lane_sequence, "create_slot": bool(e.create_slot),
                           "attempt_ordinal": e.attempt_ordinal} for e in effects_of_link(org, link_key)]
        if json:
            self.stdout.write(_dumps(doc))
            return
        reason = f" ({doc['reason_code']})" if doc["reason_code"] else ""
        self.stdout.write(f"link {doc['link']}: {doc['state']}{reason}  {doc['record']}  remote_id={doc['remote_id']}")
        self.stdout.write(f"  slot {doc['owner_key']} / {doc['action_slot_id']} / {doc['destination_slot_id']}  "
                          f"scope {doc['remote_scope']}")
        self.stdout.write(f"  installs: created {doc['created_install_id']}  validated {doc['last_validated_install_id']}"
                          f"  mirror {doc['mirror_status'] or '-'}  last pushed version {doc['last_pushed_version']}")
        for e in doc["evidence"]:
            self.stdout.write(f"  evidence {e['id']}: {e['kind']} by {e['actor']} {e['from']} -> {e['to']}  "
                              f"{e['detail'].get('reason', '')}".rstrip())
        for e in doc["effects"]:
            reason = f" ({e['reason_code']})" if e["reason_code"] else ""
            self.stdout.write(f"  effect {e['effect']}: {e['state']}{reason}  version {e['lane_sequence']}"
                              f"{'  holds the create slot' if e['create_slot'] else ''}")

    def _revalidate(self, *, link_key, org, actor, reason, **_):
        from connectors.links.link_decisions import link_revalidate

        self._report(link_revalidate(org_id=org, link_key=link_key, actor=actor, reason=reason))

    def _retire(self, *, link_key, org, actor, reason, **_):
        from connectors.links.link_decisions import link_retire

        self._report(link_retire(org_id=org, link_key=link_key, actor=actor, reason=reason))

    def _rebind(self, *, link_key, org, contract, actor, reason, **_):
        from connectors.links.link_decisions import link_rebind

        self._report(link_rebind(org_id=org, link_key=link_key, contract_key=contract, actor=actor, reason=reason))

    def _adopt(self, *, org, contract, record, remote_id, actor, reason, **_):
        from connectors.links.link_decisions import link_adopt

        self._report(link_adopt(org_id=org, contract_key=contract, record_key=record, remote_id=remote_id,
                                actor=actor, reason=reason))

    def _report(self, change) -> None:
        line = f"link {change.link_id}: {change.from_state} -> {change.to_state} (evidence {change.evidence_id})"
        if change.new_link_key:
            line += f"; remote id now held by link {change.new_link_id} key {change.new_link_key}"
        self.stdout.write(line)


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
