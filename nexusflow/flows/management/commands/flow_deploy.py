"""``manage.py flow_deploy --org ORG PATH...``: compile, persist and activate Flows.

Deploying the same file twice is a no-op. Exits 1 if any file fails to compile.
"""
from __future__ import annotations

from django.core.management.base import CommandError

from nexusflow.flows.compiler import CompileError
from nexusflow.flows.services import flow_deploy
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope

from ._flowfiles import read_flow_files


class Command(OperatorCommand):
    help = "Compile Flow metadata files, persist their plans and activate them for one org."

    def add_arguments(self, parser):
        parser.add_argument("--org", required=True, help="Trusted org id the plans are bound to.")
        parser.add_argument("--run-atomically", action="store_true",
                            help="Request Bounded Atomic; the deploy fails with diagnostics when it cannot be proven.")
        parser.add_argument("paths", nargs="+", help="*.flow-meta.xml files or directories holding them.")

    def handle(self, *args, org: str, paths: list[str], run_atomically: bool = False, **options):
        try:
            scope = OrgScope(org)
        except NexusError as exc:
            raise CommandError(f"invalid --org: {exc}", returncode=2) from exc
        files, failed = read_flow_files(paths, self.stderr)
        subflows = {name: source for _path, name, source in files}  # subflow elements resolve among these files
        for path, name, source in files:
            try:
                result = flow_deploy(org=scope, source=source, flow_api_name=name, subflows=subflows,
                                     requested_profile="bounded_atomic" if run_atomically else None)
            except CompileError as exc:
                failed += 1
                self.stderr.write(f"{path}: compile failed ({len(exc.diagnostics)} diagnostic(s))")
                for diag in exc.diagnostics:
                    self.stderr.write(f"  {diag}")
                continue
            except NexusError as exc:
                failed += 1
                self.stderr.write(f"{path}: {exc.code}: {exc}")
                continue
            plan = result.plan
            status = "activated" if result.activated else "unchanged"
            self.stdout.write(f"{name}: {status} plan_id={plan.plan_id} plan_digest={plan.plan_digest} "
                              f"profile={plan.execution_profile} org={plan.org_id}")
        if failed:
            raise CommandError(f"{failed} flow file(s) failed to deploy; nothing was activated for them",
                               returncode=1)
