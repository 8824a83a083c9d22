"""``manage.py capacity_plan --plan FILE [--json]``: the hot-account capacity test (``make bench``).

See :mod:`packs.bench.hot_account` and ``docs/scaling.md``. Prints a table of
every operation class and budget on stderr, writes
``<run dir>/capacity_report.json`` (``NEXUS_BENCH_DIR`` or ``var/bench``)
and, with ``--json``, prints the report as one JSON object on the last
stdout line. Exit codes: 0 the run finished (a missed budget is reported
with its gap, not enforced); 2 it could not run (a bad plan file, every
problem listed; a set-up step or process failed).
"""
import sys

from django.core.management.base import BaseCommand

from packs.bench.hot_account import run_capacity_plan

#: The plan ``make bench`` runs.
DEFAULT_PLAN = "packs/bench/plans/hot_account.json"


class Command(BaseCommand):
    help = ("Run the hot-account capacity plan (seed 003 S003-RP-08) on this MariaDB and judge its budgets "
            "(<run dir>/capacity_report.json). Exit 0 ran, 2 could not run.")

    def add_arguments(self, parser):
        parser.add_argument("--plan", default=DEFAULT_PLAN,
                            help=f"The plan file (JSON, format nexusflow.capacity-plan.v1; default {DEFAULT_PLAN}).")
        parser.add_argument("--json", action="store_true", help="Print the report as one JSON object.")

    def handle(self, *args, plan=DEFAULT_PLAN, json=False, **options):
        code = run_capacity_plan(plan, as_json=json)
        sys.stdout.flush()
        if code:
            sys.exit(code)
