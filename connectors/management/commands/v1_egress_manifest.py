"""``manage.py v1_egress_manifest [--write | --check]``: print, write or check the V1 egress manifest.

Generated from the code (:mod:`connectors.v1.egress_manifest`). ``--check``
exits 1 with one line per problem (an untracked provider call site, a call
without its pre-I/O marker, a stale committed file).
"""
from django.core.management.base import CommandError

from connectors.v1.egress_manifest import MANIFEST_PATH, generate, manifest_problems, render
from nexusflow.kernel.commands import OperatorCommand


class Command(OperatorCommand):
    help = "Print (default), --write or --check the V1 egress manifest generated from connectors/v1."

    def add_arguments(self, parser):
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--write", action="store_true", help="Write connectors/v1/egress_manifest.json.")
        group.add_argument("--check", action="store_true", help="Exit 1 when the code or the file has a problem.")

    def handle(self, *args, write, check, **options):
        manifest, problems = generate()
        if check:
            problems = manifest_problems()
            if problems:
                raise CommandError("v1_egress_manifest_invalid:\n" + "\n".join(problems))
            self.stdout.write(f"V1 egress manifest ok: {len(manifest['provider_io_sites'])} provider-I/O site(s), "
                              f"{len(manifest['effect_rows'])} effect row(s)")
            return
        if problems:
            raise CommandError("v1_egress_manifest_invalid:\n" + "\n".join(problems))
        if write:
            MANIFEST_PATH.write_text(render(manifest), encoding="utf-8")
            self.stdout.write(f"wrote {MANIFEST_PATH}")
            return
        self.stdout.write(render(manifest))
