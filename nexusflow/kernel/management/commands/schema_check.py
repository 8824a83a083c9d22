"""``manage.py schema_check [--database ALIAS]``: report index drift between the models and the live database.

Seed 000 ("rejecting index drift"). Exit 0 when every declared index and
unique constraint exists with its columns in order; exit 1 with one line per
finding (``kind<TAB>table<TAB>index<TAB>detail``) otherwise.
"""
from __future__ import annotations

from django.core.management.base import CommandError
from django.db import connections

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.schema import schema_drift


class Command(OperatorCommand):
    help = "Compare declared model indexes and unique constraints with information_schema.STATISTICS."

    def add_arguments(self, parser):
        parser.add_argument("--database", default=None,
                            help="Only models routed to this alias (default: every alias).")

    def handle(self, *args, database: str | None, **options):
        if database is not None and database not in connections:
            raise CommandError(f"unknown database alias {database!r}", returncode=2)
        findings = schema_drift(using=database)
        if findings:
            for finding in findings:
                self.stdout.write(finding.line())
            raise CommandError(f"schema drift: {len(findings)} finding(s)", returncode=1)
        self.stdout.write("schema matches the declared indexes and unique constraints")
