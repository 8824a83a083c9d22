"""``manage.py push_link_revalidation draft|validate|apply``: finalized-link mapping revalidation.

Seed 002 "2026-07-22 Finalized Mapping Revalidation CARVE_DOWN" (see :mod:`connectors.links.mapping_revalidation`).

- ``draft --org ORG (--contract KEY | --link-key KEY ...) [--pack-generation ID] --approved-by A --reason R
  [--approval-ref REF] [--operation-id ID]``: print the sealed manifest (JSON) of the current drift for
  the semantic owner to approve; writes nothing;
- ``validate --org ORG --manifest FILE|- [--json]``: the same locks and checks as apply; prints the
  projected receipts; writes nothing;
- ``apply --org ORG --manifest FILE|- [--json]``: one transaction: receipts plus fingerprint moves.

Exit codes: 0 done (validated, applied, or already applied: the output says which), 1 bad input
(the message starts with a stable code: ``manifest_*``, ``draft_*``; a manifest that is not bounded,
non-empty UTF-8 JSON is ``manifest_unreadable`` or ``manifest_too_large``), 2 bad usage or a malformed org
(``invalid_identity``), 3 refused by the database state (``revalidation_occupied``,
``revalidation_mixed_state``, ``revalidation_divergent``, ``revalidation_member_conflict``,
``revalidation_not_serving``, ...; nothing was written). No provider call and no record write is
reachable from this command.
"""
from __future__ import annotations

import json
import sys

from django.core.management.base import CommandError

from connectors.links.mapping_revalidation import (
    MAX_MANIFEST_BYTES,
    AlreadyApplied,
    ManifestInvalid,
    RevalidationRefused,
    revalidation_apply,
    revalidation_draft,
    revalidation_validate,
)
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

EXIT_BAD_INPUT, EXIT_REFUSED = 1, 3


def _no_duplicate_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} in one JSON object")
        seen[key] = value
    return seen


class Command(OperatorCommand):
    help = ("Finalized push-link mapping revalidation (seed 002 CARVE_DOWN): draft a manifest, validate it "
            "with zero writes, apply it atomically. Exit 0 done, 1 bad input, 3 refused.")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{draft,validate,apply}")
        draft = sub.add_parser("draft", help="Print the manifest of the current drift (JSON); writes nothing.")
        draft.add_argument("--org", required=True)
        draft.add_argument("--contract", help="Push contract key whose mapping is now authoritative.")
        draft.add_argument("--link-key", action="append", default=[], help="Restrict to this link; repeat.")
        draft.add_argument("--pack-generation", type=int,
                           help="Take the contract from this pack generation (default: the serving one).")
        draft.add_argument("--approved-by", required=True, help="The semantic owner approving the manifest.")
        draft.add_argument("--reason", required=True)
        draft.add_argument("--approval-ref", default="", help="Reference of the approval (ticket, decision).")
        draft.add_argument("--operation-id")
        for name, text in (("validate", "Check a manifest under the apply locks; writes nothing."),
                           ("apply", "Apply a manifest in one transaction.")):
            cmd = sub.add_parser(name, help=text)
            cmd.add_argument("--org", required=True)
            cmd.add_argument("--manifest", required=True, help="Manifest JSON file, or - for standard input.")
            cmd.add_argument("--json", action="store_true")

    def handle(self, *args, subcommand: str, **options):
        try:
            validate_key(options["org"], field="org")
            scope = OrgScope(options["org"])
            if subcommand == "draft":
                return self._draft(scope, **options)
            return self._run(scope, subcommand, **options)
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from exc
        except ManifestInvalid as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT) from exc
        except RevalidationRefused as exc:
            detail = f" {json.dumps(exc.detail, sort_keys=True)}" if exc.detail else ""
            raise CommandError(f"{exc.code}: {exc}{detail}; nothing was written", returncode=EXIT_REFUSED) from exc

    def _draft(self, scope: OrgScope, *, contract, link_key, pack_generation, approved_by, reason, approval_ref,
               operation_id, **_):
        manifest = revalidation_draft(org=scope, contract_key=contract, link_keys=link_key,
                                      pack_generation_id=pack_generation, approved_by=approved_by, reason=reason,
                                      approval_ref=approval_ref, operation_id=operation_id)
        self.stdout.write(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False))
        self.stderr.write(f"drafted operation {manifest['operation_id']}: {len(manifest['members'])} member(s); "
                          "validate, then apply it once approved")

    def _run(self, scope: OrgScope, subcommand: str, *, manifest, json: bool, **_):
        document = _read_manifest(manifest, sys.stdin)
        entry = revalidation_validate if subcommand == "validate" else revalidation_apply
        result = entry(org=scope, manifest=document)
        if json:
            self.stdout.write(_dumps({"status": result.status, "operation_id": result.operation_id,
                                      "manifest_digest": result.manifest_digest, "receipts": list(result.receipts)}))
            return
        count = len(result.receipts)
        if isinstance(result, AlreadyApplied):
            self.stdout.write(f"already applied: operation {result.operation_id} (manifest "
                              f"{result.manifest_digest[:16]}): {count} receipt(s) and link(s) match; nothing was "
                              "written")
        elif result.status == "validated":
            self.stdout.write(f"validated: operation {result.operation_id} (manifest {result.manifest_digest[:16]}) "
                              f"would revalidate {count} link(s); nothing was written")
        else:
            self.stdout.write(f"applied: operation {result.operation_id} (manifest {result.manifest_digest[:16]}): "
                              f"{count} receipt(s) written")
        for r in result.receipts:
            receipt = f"receipt {r['receipt_id']}" if r["receipt_id"] else "projected"
            self.stdout.write(f"  link {r['link_id']} {r['link_key'][:16]}  {receipt}  mapping "
                              f"{r['old_mapping_fingerprint'][:12]} -> {r['new_mapping_fingerprint'][:12]}  body "
                              f"{r['old_body_fingerprint'][:12]} -> {r['new_body_fingerprint'][:12]}  install "
                              f"{r['old_install_id']} -> {r['new_install_id']}")


def _read_manifest(path: str, stdin) -> object:
    """The decoded manifest document of ``path`` (``-``: standard input), read as bounded UTF-8 JSON.

    Raises:
        ManifestInvalid: ``manifest_unreadable`` (cannot be opened, not UTF-8, not
            JSON, duplicate keys, non-finite numbers, nested past the parser's
            depth) or ``manifest_too_large`` (more than
            :data:`connectors.links.mapping_revalidation.MAX_MANIFEST_BYTES` bytes; never read further).
    """
    try:
        if path == "-":
            source = getattr(stdin, "buffer", stdin)
            raw = source.read(MAX_MANIFEST_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestInvalid(f"cannot read {path}: {exc.strerror}", code="manifest_unreadable") from None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestInvalid(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes", code="manifest_too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestInvalid(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}",
                              code="manifest_unreadable") from None
    if not text.strip():
        raise ManifestInvalid(f"{path} is empty", code="manifest_unreadable")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except RecursionError:
        raise ManifestInvalid(f"{path} nests deeper than a manifest can", code="manifest_unreadable") from None
    except ValueError as exc:
        raise ManifestInvalid(f"{path} is not valid JSON: {exc}", code="manifest_unreadable") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
