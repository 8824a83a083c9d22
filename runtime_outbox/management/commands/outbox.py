"""``manage.py outbox <subcommand>``: the Runtime outbox as an operator sees it (seed 004 sections 10.7, 15.4).

Subcommands:

- ``list --org ORG [--state S] [--family F] [--limit N]``: the org's outbox
  messages as a JSON array, newest first: id, family, message key, state,
  delivery and reconciliation attempts, next attempt, created and delivered
  times, and the Flow run a ``flow.effect.submit`` message belongs to. Exit 2
  on a malformed org, an unknown state or family, or a limit out of 1..500.
- ``reconcile MESSAGE_ID --org ORG --actor A --reason R``: stop waiting on
  one ``flow.effect.submit`` delivery now: the message enters reconciliation
  whatever its delivery budget, the owner's ``RejectIfUnaccepted`` fence is
  asked once and its answer finalized as the ``outbox.reconcile`` worker
  would (docs/operations.md "A Flow's effect handoff, and when its owner
  never takes it"). Prints ``{"message_id", "family", "state",
  "reconcile_attempts"}``; state ``reconciling`` means the fence gave no
  answer and the worker asks again. Exit 2 on bad input or a message that
  cannot be reconciled (``outbox_reconcile_refused``: another family, or
  already delivered or settled), 3 when the message is not in that org.
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.ids import id_from_text

LIST_MAX = 500


class Command(OperatorCommand):
    help = "Runtime outbox: list messages; reconcile a flow.effect.submit handoff by hand."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{list,reconcile}")
        listing = sub.add_parser("list", help="The org's outbox messages (JSON), newest first.")
        listing.add_argument("--org", required=True, help="The trusted org.")
        listing.add_argument("--state", help="Only messages in this state.")
        listing.add_argument("--family", help="Only messages of this family.")
        listing.add_argument("--limit", type=int, default=100, help=f"At most N rows (1..{LIST_MAX}, default 100).")
        reconcile = sub.add_parser("reconcile", help="Reconcile one flow.effect.submit handoff now.")
        reconcile.add_argument("message_id", metavar="MESSAGE_ID")
        reconcile.add_argument("--org", required=True, help="The trusted org the message belongs to.")
        reconcile.add_argument("--actor", required=True, help="Who decides (kept in the Flow's audit).")
        reconcile.add_argument("--reason", required=True, help="Why (kept in the Flow's audit).")

    def handle(self, *args, subcommand, **options):
        if subcommand == "list":
            self._list(**options)
        else:
            self._reconcile(**options)

    def _list(self, *, org, state, family, limit, **_options):
        from runtime_outbox.messages import REGISTRY
        from runtime_outbox.models import OutboxMessage
        from runtime_outbox.transitions import OUTBOX_MESSAGE

        try:
            validate_key(org, field="org", max_length=64)
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        if state is not None and state not in OUTBOX_MESSAGE.states:
            raise CommandError(f"invalid_argument: unknown state {state!r}; one of "
                               f"{', '.join(sorted(OUTBOX_MESSAGE.states))}", returncode=2)
        families = sorted(f.name for f in REGISTRY.families())
        if family is not None and family not in families:
            raise CommandError(f"invalid_argument: unknown family {family!r}; one of {', '.join(families)}",
                               returncode=2)
        if not 1 <= limit <= LIST_MAX:
            raise CommandError(f"invalid_argument: --limit must be within 1..{LIST_MAX}", returncode=2)
        qs = OutboxMessage.objects.filter(org_id=org)
        if state is not None:
            qs = qs.filter(state=state)
        if family is not None:
            qs = qs.filter(family=family)
        rows = [{
            "message_id": int(m.pk), "family": m.family, "message_key": m.message_key, "state": m.state,
            "delivery_attempts": m.delivery_attempts, "reconcile_attempts": m.reconcile_attempts,
            "next_attempt_at": _ts(m.next_attempt_at), "created_at": _ts(m.created_at),
            "delivered_at": _ts(m.delivered_at), "flow_run_id": (m.payload or {}).get("flow_run_id"),
        } for m in qs.order_by("-id")[:limit]]
        self.stdout.write(json.dumps(rows, sort_keys=True))

    def _reconcile(self, *, message_id, org, actor, reason, **_options):
        from runtime_outbox.handoff import HandoffReconcileRefused, OutboxMessageNotFound, handoff_reconcile_now

        try:
            validate_key(org, field="org", max_length=64)
            from runtime_outbox.models import OutboxMessage

            result = handoff_reconcile_now(org_id=org, actor=actor, reason=reason,
                                           message_id=id_from_text(message_id, OutboxMessage, field="message id"))
        except (InvalidIdentity, HandoffReconcileRefused) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        except OutboxMessageNotFound as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=3) from None
        self.stdout.write(json.dumps(result, sort_keys=True))


def _ts(value):
    return value.isoformat() if value is not None else None
