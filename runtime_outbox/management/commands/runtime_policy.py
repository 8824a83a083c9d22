"""``manage.py runtime_policy <subcommand>``: author and read the versioned runtime policy (seed 004 section
16.3; :mod:`runtime_outbox.policy`, docs/operations.md "The runtime policy").

Subcommands:

- ``publish FILE --scope SCOPE --actor A --reason R``: publish the JSON document in FILE (``-``: standard
  input) as the next generation of SCOPE (``*``: the environment; else an org id). Prints ``{"scope",
  "generation", "policy_version", "digest", "created", "effects"}`` (``effects``: each active Flow
  recompiled because its plan bounds changed, or why it could not be); a document equal to the scope's
  latest generation is not published again (``created`` false). Exit 2 on an unreadable file, invalid JSON or an invalid
  document (``runtime_policy_invalid`` with the key at fault); nothing is published then.
- ``show [--org ORG] [--json]``: the policy in force for ORG (default: the environment's), with the
  generations it is built from, and every published generation of its scopes.
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from nexusflow.kernel.command_input import json_document_argument
from nexusflow.kernel.commands import OperatorCommand


class Command(OperatorCommand):
    help = "The versioned runtime policy: publish a generation; show the policy in force."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{publish,show}")
        publish = sub.add_parser("publish", help="Publish a policy document as the next generation of a scope.")
        publish.add_argument("file", metavar="FILE", help="The JSON document (- for standard input).")
        publish.add_argument("--scope", required=True, help="'*' for the environment, else an org id.")
        publish.add_argument("--actor", required=True, help="Who authors the generation.")
        publish.add_argument("--reason", required=True, help="Why (kept on the generation).")
        show = sub.add_parser("show", help="The policy in force for an org (default: the environment).")
        show.add_argument("--org", help="The org (default: the environment's policy).")
        show.add_argument("--json", action="store_true", dest="as_json", help="One JSON object.")

    def handle(self, *args, subcommand, **options):
        if subcommand == "publish":
            self._publish(**options)
        else:
            self._show(**options)

    def _publish(self, *, file, scope, actor, reason, **_options):
        from runtime_outbox.policy import RuntimePolicyInvalid, runtime_policy_publish

        document = json_document_argument(file, invalid_code="runtime_policy_invalid")
        try:
            row, created, effects = runtime_policy_publish(scope=scope, document=document, authored_by=actor,
                                                           reason=reason)
        except RuntimePolicyInvalid as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        self.stdout.write(json.dumps({"scope": row.scope, "generation": row.generation,
                                      "policy_version": row.policy_version, "digest": row.digest,
                                      "created": created, "effects": effects}))

    def _show(self, *, org, as_json, **_options):
        from nexusflow.kernel.errors import InvalidIdentity
        from nexusflow.kernel.identity import validate_key
        from runtime_outbox.models import RuntimePolicyGeneration
        from runtime_outbox.policy import ENVIRONMENT, runtime_policy

        if org is not None:
            try:
                validate_key(org, field="org", max_length=64)
            except InvalidIdentity as exc:
                raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        policy = runtime_policy(org)
        scopes = [ENVIRONMENT] + ([org] if org else [])
        generations = [{"scope": g.scope, "generation": g.generation, "policy_version": g.policy_version,
                        "authored_by": g.authored_by, "reason": g.reason, "created_at": g.created_at.isoformat()}
                       for g in RuntimePolicyGeneration.objects.filter(scope__in=scopes).order_by("scope", "generation")]
        if as_json:
            self.stdout.write(json.dumps({**policy.as_json(), "generations": generations}, indent=2))
            return
        self.stdout.write(f"runtime policy {policy.version} for {org or 'the environment'}")
        for section, body in policy.as_json().items():
            if section != "version":
                self.stdout.write(f"  {section}: {json.dumps(body, sort_keys=True)}")
        for g in generations:
            self.stdout.write(f"  {g['scope']} generation {g['generation']} ({g['policy_version']}) by "
                              f"{g['authored_by']} at {g['created_at']}: {g['reason']}")
