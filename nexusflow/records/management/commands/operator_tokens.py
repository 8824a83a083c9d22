"""``manage.py operator_tokens``: operator API tokens (REST ``Authorization: Bearer <token>``).

- ``issue --user LOGIN --name TEXT --by WHO``: print a new token once (only its SHA-256 is stored);
- ``list [--user LOGIN]``: id, user, name, issued, revoked;
- ``revoke ID --by WHO --reason TEXT``: end a token for good.

Exit codes: 0 done; 1 refused (``operator_token_refused``: unknown or inactive operator, unknown or already
revoked token, missing who/why); 2 bad usage.
"""
from django.core.management.base import CommandError

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.records.models import OperatorToken
from nexusflow.records.tokens import TokenRefused, operator_token_issue, operator_token_revoke


class Command(OperatorCommand):
    help = "Issue, list or revoke operator API tokens (Authorization: Bearer <token>)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        issue = sub.add_parser("issue", help="Print a new token for an operator, once.")
        issue.add_argument("--user", required=True, help="The operator's login name (an active staff user).")
        issue.add_argument("--name", required=True, help="What the token is for.")
        issue.add_argument("--by", required=True, help="Who issues it.")
        listing = sub.add_parser("list", help="List tokens (never their value).")
        listing.add_argument("--user")
        revoke = sub.add_parser("revoke", help="End a token for good.")
        revoke.add_argument("token_id", type=int)
        revoke.add_argument("--by", required=True)
        revoke.add_argument("--reason", required=True)

    def handle(self, *args, action, **options):
        try:
            if action == "issue":
                row, token = operator_token_issue(username=options["user"], name=options["name"],
                                                  issued_by=options["by"])
                self.stderr.write(f"token {row.pk} for {options['user']} ({row.name}); shown once, store it now:")
                self.stdout.write(token)
            elif action == "revoke":
                revocation = operator_token_revoke(token_id=options["token_id"], revoked_by=options["by"],
                                                   reason=options["reason"])
                self.stdout.write(f"token {options['token_id']} revoked ({revocation.created_at.isoformat()})")
            else:
                rows = OperatorToken.objects.select_related("user").order_by("id")
                if options.get("user"):
                    rows = rows.filter(user__username=options["user"])
                for row in rows:
                    ended = getattr(row, "revocation", None) if hasattr(row, "revocation") else None
                    self.stdout.write(f"{row.pk}\t{row.user.username}\t{row.name}\t{row.created_at.isoformat()}\t"
                                      f"{'revoked ' + ended.created_at.isoformat() if ended else 'active'}")
        except TokenRefused as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=1) from exc
