"""``manage.py effects <subcommand>``: operator view and remediation of RemoteEffects.

Seed 003 "Outbound facts", "State machines", "Replay and external effects".

- ``list --org ORG [--state S ...] [--class benign|attention] [--account A] [--json]``: effects,
  newest first, each with its reason code and that code's severity class (``benign``: an expected,
  recorded outcome such as an older version superseded by a newer one; ``attention``: an operator must
  look); ``--class`` keeps the effects whose code is of that class (the state is shown as stored);
  a ``prepared`` effect whose credential lane a provider rate limit pauses shows ``lane_paused``
  (``{"kind": "rate_limited"|"daily_limit", "until": ISO time, "status": HTTP status}``, else null);
- ``show EFFECT --org ORG [--json]``: the effect (state, reason code and class), its frozen binding summary,
  Attempts, Permits and reconciliation evidence (never secret bytes);
- ``reconcile EFFECT --org ORG (--confirmed REMOTE_ID | --no-effect [--retry]) --actor A --note N``:
  append operator evidence and resolve an ``uncertain`` effect;
- ``quarantine EFFECT --org ORG --actor A --note N``: park a prepared/uncertain effect for good;
- ``successor COMMAND --org ORG --actor A --reason R``: author the next
  EffectGeneration of a command whose effect is proven terminal ``no_effect``.

Exit codes: 0 done, 1 refused (the message starts with a stable code), 2 bad usage or a malformed id/org.
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from connectors.models import DispatchPermit, RemoteEffect
from connectors.selectors import credential_lane_pauses
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.reasons import SEVERITY_CLASSES, codes_of_class, load_all_reasons, severity_class_of

STATES = ("prepared", "dispatching", "uncertain", "remote_confirmed", "finalized", "no_effect", "quarantined")


def _lane_pause(effect: RemoteEffect, pauses: dict) -> dict | None:
    """The rate-limit pause on a not-yet-sent effect's credential lane (``None``: not paused)."""
    if effect.state != "prepared":
        return None
    gate = pauses.get(int((effect.command.frozen_binding.get("credential_generation") or {}).get("id") or 0))
    if gate is None:
        return None
    return {"kind": gate.pause_kind, "until": gate.paused_until.isoformat(), "status": gate.pause_status}


def _effect_row(effect: RemoteEffect, pauses: dict | None = None) -> dict:
    command = effect.command
    return {"lane_paused": _lane_pause(effect, pauses or {}),"effect": int(effect.pk), "command": int(command.pk), "state": effect.state,
            "reason_code": effect.reason_code, "reason_class": severity_class_of(effect.reason_code),
            "account": effect.account_key, "contract": effect.contract_key,
            "record": f"{command.source_object}/{command.source_record_key}@{command.source_record_version}",
            "dispatch_lane": effect.dispatch_lane, "attempts": effect.attempt_count, "remote_id": effect.remote_id,
            "effect_generation": command.effect_generation_id, "attempt_ordinal": effect.attempt_ordinal,
            "holds_create_slot": effect.create_slot is not None,
            "created_at": effect.created_at.isoformat(), "updated_at": effect.updated_at.isoformat()}


class Command(OperatorCommand):
    help = "RemoteEffect operator commands: list, show, reconcile, quarantine, successor."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True,
                                    metavar="{list,show,reconcile,quarantine,successor}")
        ls = sub.add_parser("list", help="List effects, newest first.")
        ls.add_argument("--org", required=True)
        ls.add_argument("--state", action="append", choices=STATES, help="Repeat to list several states.")
        ls.add_argument("--class", dest="severity_class", choices=SEVERITY_CLASSES,
                        help="Only effects whose reason code is of this class (attention: an operator must look).")
        ls.add_argument("--account")
        ls.add_argument("--limit", type=int, default=50)
        ls.add_argument("--json", action="store_true")
        show = sub.add_parser("show", help="One effect with its attempts, permits and evidence.")
        show.add_argument("effect", type=int)
        show.add_argument("--org", required=True)
        show.add_argument("--json", action="store_true")
        rec = sub.add_parser("reconcile", help="Resolve an uncertain effect with operator evidence.")
        rec.add_argument("effect", type=int)
        rec.add_argument("--org", required=True)
        how = rec.add_mutually_exclusive_group(required=True)
        how.add_argument("--confirmed", metavar="REMOTE_ID", help="The provider performed it; its remote id.")
        how.add_argument("--no-effect", action="store_true", help="The provider performed nothing.")
        rec.add_argument("--retry", action="store_true",
                         help="With --no-effect: another Attempt (if the frozen policy has Attempts left).")
        rec.add_argument("--actor", required=True)
        rec.add_argument("--note", required=True, help="How it was proven (kept as evidence).")
        qua = sub.add_parser("quarantine", help="Park a prepared or uncertain effect for good.")
        qua.add_argument("effect", type=int)
        qua.add_argument("--org", required=True)
        qua.add_argument("--actor", required=True)
        qua.add_argument("--note", required=True)
        suc = sub.add_parser("successor", help="New EffectGeneration after a proven terminal no_effect.")
        suc.add_argument("command", type=int, help="OutboundCommand id of the predecessor.")
        suc.add_argument("--org", required=True)
        suc.add_argument("--actor", required=True)
        suc.add_argument("--reason", required=True)

    def handle(self, *args, subcommand: str, **options):
        load_all_reasons()
        for name in ("effect", "command"):
            if name in options and options[name] is not None and options[name] < 1:
                raise CommandError(f"invalid_identity: {name} id must be a positive integer", returncode=2)
        try:
            validate_key(options["org"], field="org")
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from exc
        try:
            return getattr(self, "_" + subcommand)(**options)
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from exc
        except NexusError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc

    def _list(self, *, org, state, account, limit, json: bool, severity_class=None, **_):
        if limit < 1:
            raise CommandError("invalid_limit: --limit must be at least 1", returncode=2)
        qs = RemoteEffect.objects.filter(org_id=org).select_related("command")
        if state:
            qs = qs.filter(state__in=state)
        if severity_class:
            qs = qs.filter(reason_code__in=sorted(codes_of_class(severity_class)))
        if account:
            qs = qs.filter(account_key=account)
        pauses = credential_lane_pauses(org_id=org, now=db_now())
        rows = [_effect_row(e, pauses) for e in qs.order_by("-id")[:limit]]
        if json:
            self.stdout.write(_dumps(rows))
            return
        for r in rows:
            reason = f" ({r['reason_code']})  class={r['reason_class']}" if r["reason_code"] else ""
            paused = (f"  lane paused ({r['lane_paused']['kind']}, HTTP {r['lane_paused']['status']}) "
                      f"until {r['lane_paused']['until']}" if r["lane_paused"] else "")
            self.stdout.write(f"effect {r['effect']:>6}  {r['state']}{reason}  {r['account']}/{r['contract']}  "
                              f"{r['record']}  attempts={r['attempts']}  remote_id={r['remote_id'] or '-'}{paused}")
        self.stdout.write(f"{len(rows)} effect(s)")

    def _show(self, *, effect, org, json: bool, **_):
        row = RemoteEffect.objects.filter(org_id=org, pk=effect).select_related("command").first()
        if row is None:
            raise CommandError(f"effect_unknown: no remote effect {effect} in org {org}")
        binding = row.command.frozen_binding
        doc = _effect_row(row, credential_lane_pauses(org_id=org, now=db_now()))
        doc["binding"] = {k: binding.get(k) for k in (
            "account_key", "epoch", "pack_generation", "contract_key", "configuration", "credential_generation",
            "policy_digest", "request_digest", "link_key", "provider_idempotency_key", "effect_generation_predecessor",
            "slot", "authority", "writeback")}
        doc["attempts"] = [
            {"number": a.attempt_number, "operation": a.operation, "method": a.method, "path": a.path,
             "state": a.state, "request_digest": a.request_digest, "idempotency_key": a.idempotency_key,
             "response_status": a.response_status, "error": a.error, "remote_id": a.remote_id,
             "created_at": a.created_at.isoformat()}
            for a in row.attempts.order_by("attempt_number")]
        doc["permits"] = [
            {"permit": int(p.pk), "attempt": int(p.attempt_id), "state": p.state, "holder": p.holder_id,
             "io_may_have_started_at": p.io_may_have_started_at.isoformat() if p.io_may_have_started_at else None,
             "closed_evidence": p.closed_evidence}
            for p in DispatchPermit.objects.filter(org_id=org, attempt__effect_id=row.pk).order_by("id")]
        doc["evidence"] = [
            {"id": int(e.pk), "kind": e.kind, "actor": e.actor, "from": e.from_state, "to": e.to_state,
             "detail": e.detail, "created_at": e.created_at.isoformat()}
            for e in row.evidence.order_by("id")]
        if json:
            self.stdout.write(_dumps(doc))
            return
        reason = f" ({doc['reason_code']})  class={doc['reason_class']}" if doc["reason_code"] else ""
        self.stdout.write(f"effect {doc['effect']}: {doc['state']}{reason}  command {doc['command']} "
                          f"generation {doc['effect_generation']}  lane {doc['dispatch_lane']}")
        self.stdout.write(f"  {doc['account']}/{doc['contract']}  record {doc['record']}  "
                          f"remote_id={doc['remote_id'] or '-'}")
        b = doc["binding"]
        if b.get("slot"):
            self.stdout.write(f"  slot {b['slot']['owner_key']} / {b['slot']['action_slot_id']} / "
                              f"{b['slot']['destination_slot_id']}  link {b['link_key']}  ordinal "
                              f"{doc['attempt_ordinal']}{'  holds the create slot' if doc['holds_create_slot'] else ''}")
        self.stdout.write(f"  binding: epoch {b['epoch']['id']}  pack {b['pack_generation']['id']}  "
                          f"credential {(b['credential_generation'] or {}).get('id')}  "
                          f"provider key {b['provider_idempotency_key'] or 'none'}")
        for a in doc["attempts"]:
            self.stdout.write(f"  attempt {a['number']}: {a['operation']} {a['method']} {a['path']} -> {a['state']} "
                              f"status={a['response_status']} {a['error']}".rstrip())
        for p in doc["permits"]:
            self.stdout.write(f"  permit {p['permit']}: {p['state']} holder={p['holder']}")
        for e in doc["evidence"]:
            self.stdout.write(f"  evidence {e['id']}: {e['kind']} by {e['actor']} {e['from']} -> {e['to']}")

    def _reconcile(self, *, effect, org, confirmed, no_effect, retry, actor, note, **_):
        from connectors.outbound.effect_decisions import effect_reconcile

        if retry and not no_effect:
            raise CommandError("invalid_arguments: --retry goes with --no-effect", returncode=2)
        # ``--confirmed ''`` is a confirmation without its evidence: refused below, never read as "no effect".
        change = effect_reconcile(org_id=org, effect_id=effect,
                                  outcome="confirmed" if confirmed is not None else "no_effect",
                                  remote_id=confirmed, retry=retry, actor=actor, note=note)
        self.stdout.write(f"effect {change.effect_id}: {change.from_state} -> {change.to_state} "
                          f"(evidence {change.evidence_id})")

    def _quarantine(self, *, effect, org, actor, note, **_):
        from connectors.outbound.effect_decisions import effect_quarantine

        change = effect_quarantine(org_id=org, effect_id=effect, actor=actor, note=note)
        self.stdout.write(f"effect {change.effect_id}: {change.from_state} -> {change.to_state} "
                          f"(evidence {change.evidence_id})")

    def _successor(self, *, command, org, actor, reason, **_):
        from runtime_outbox.models import OutboundCommand
        from runtime_outbox.services import outbound_command_author_successor

        try:
            successor, created = outbound_command_author_successor(org_id=org, predecessor_command_id=command,
                                                                   actor=actor, reason=reason)
        except OutboundCommand.DoesNotExist:
            raise CommandError(f"command_unknown: no outbound command {command} in org {org}") from None
        self.stdout.write(f"command {successor.pk}: generation {successor.effect_generation_id} of "
                          f"command {command} {'authored' if created else 'already authored'}")


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
