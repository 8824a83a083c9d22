"""``manage.py flow_compile PATH... [--org ORG]``: compile check only.

Writes nothing; with ``--org`` the shipped capability catalog generation of
that org is sealed (the only row a compile may need). Exits 1 if any file
fails.
"""
from __future__ import annotations

from django.core.management.base import CommandError
from django.db import transaction

from nexusflow.flows.binding import flow_runtime_binding
from nexusflow.flows.catalog import catalog_current, catalog_seal
from nexusflow.flows.compiler import CompileError
from nexusflow.flows.services import flow_compile_check
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import current_view

from ._flowfiles import read_flow_files

# Compile-only checks need some trusted org for the binding; this one is
# never persisted and names no tenant.
CHECK_ORG = "compile-check"


class Command(OperatorCommand):
    help = "Compile Flow metadata files and print plans or stable diagnostics (no plan is written)."

    def add_arguments(self, parser):
        parser.add_argument("--org", default=None, help="Bind the check to this org and seal its catalog.")
        parser.add_argument("paths", nargs="+", help="*.flow-meta.xml files or directories holding them.")

    def handle(self, *args, org: str | None, paths: list[str], **options):
        try:
            scope = OrgScope(org or CHECK_ORG)
        except NexusError as exc:
            raise CommandError(f"invalid --org: {exc}", returncode=2) from exc
        if org is not None:
            binding = flow_runtime_binding(org_id=scope.org_id, metadata_view_digest=current_view().digest)
            with transaction.atomic():
                row = catalog_seal(snapshot=catalog_current(binding=binding))
            self.stdout.write(f"catalog {row.generation_id} digest={row.digest}")
        files, failed = read_flow_files(paths, self.stderr)
        subflows = {name: source for _path, name, source in files}  # subflow elements resolve among these files
        for _path, name, source in files:
            try:
                plan = flow_compile_check(source=source, flow_api_name=name, org=scope, subflows=subflows)
            except CompileError as exc:
                failed += 1
                self.stdout.write(f"{name}: FAILED")
                for diag in exc.diagnostics:
                    self.stdout.write(f"  {diag}")
                continue
            steps = " -> ".join(f"{s['key']}({s['kind']})" for s in plan.steps)
            digest = f" plan_digest={plan.plan_digest}" if org is not None else ""
            self.stdout.write(f"{name}: ok {plan.execution_profile}{digest}\n  {steps}")
        if failed:
            raise CommandError(f"{failed} flow file(s) failed to compile", returncode=1)
