"""``manage.py flows <subcommand>``: Flow operator commands (seed 004 section 20.4).

Subcommands:

- ``inventory DIR [--json] [--detail] [--schema open|strict]``: compile every
  ``*.flow-meta.xml`` file in ``DIR`` without executing anything and print,
  per flow, the selected profile or the rejection reasons, unknown
  capabilities, loop/fan-out proof, step count and migration cohort. Writes
  nothing. Exit 0 when every file was inventoried (rejections are results),
  2 when ``DIR`` is not a folder.
"""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from nexusflow.flows.inventory import flow_inventory


class Command(BaseCommand):
    help = "Flow operator commands: inventory (compile-only report of a folder of Flow metadata files)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{inventory}")
        inv = sub.add_parser("inventory", help="Compile every *.flow-meta.xml in DIR; execute nothing.")
        inv.add_argument("directory", metavar="DIR")
        inv.add_argument("--json", action="store_true", help="One JSON array, one object per file.")
        inv.add_argument("--detail", action="store_true",
                         help="With --json: add loops, fan_out, warnings and plan_digest to each object.")
        inv.add_argument("--schema", choices=("open", "strict"), default="open",
                         help="strict: check objects and fields against this deployment's metadata view.")

    def handle(self, *args, subcommand: str, **options):
        if subcommand == "inventory":
            return self._inventory(**options)
        raise CommandError(f"unknown subcommand {subcommand!r}", returncode=2)

    def _inventory(self, *, directory: str, json: bool, detail: bool, schema: str, **_options):
        if detail and not json:
            raise CommandError("--detail adds fields to the --json objects; use it with --json", returncode=2)
        try:
            rows = flow_inventory(directory, schema=schema)
        except NotADirectoryError:
            raise CommandError(f"{directory}: not a directory", returncode=2) from None
        if json:
            self.stdout.write(_dumps([r.as_json(detail=detail) for r in rows]))
            return
        for r in rows:
            status = r.profile if r.profile else "REJECTED"
            loops = ", ".join(f"{lp['element']}={lp['bound']}" for lp in r.loops) or "none"
            self.stdout.write(f"{r.flow}: {status}  cohort={r.cohort}  steps={r.steps}  fan-out={r.fan_out}  "
                              f"loops: {loops}")
            if r.unknown_capabilities:
                self.stdout.write(f"  unknown capabilities: {', '.join(r.unknown_capabilities)}")
            for reason in r.reasons:
                where = f" [{reason['element']}]" if reason["element"] else ""
                self.stdout.write(f"  {reason['code']}{where}: {reason['detail']}")
        rejected = sum(1 for r in rows if r.rejected)
        self.stdout.write(f"{len(rows)} flow file(s): {len(rows) - rejected} compiled, {rejected} rejected")


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
