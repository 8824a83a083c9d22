"""``manage.py bench [--scale S] [--json] [--profile]``: NexusFlow beside the database floor and django-q2 (``make bench``).

See :mod:`packs.bench.run`. Prints the table of figures and ratios on
stderr, writes ``var/bench/report.json`` and, with ``--json``, prints the
report as one JSON object on the last stdout line. Exit codes: 0 the run
finished (missed targets are reported with their gap), 2 it could not run
(bad scale, a process or set-up step failed, a series did not finish).
"""
import sys

from django.core.management.base import BaseCommand

from packs.bench.run import run_bench


class Command(BaseCommand):
    help = "Benchmark NexusFlow beside the database floor and django-q2 on this MariaDB (var/bench/report.json)."

    def add_arguments(self, parser):
        parser.add_argument("--scale", type=float, default=1.0,
                            help="Multiply every series' unit count and the floor's duration (0 < S <= 20).")
        parser.add_argument("--json", action="store_true", help="Print the report as one JSON object.")
        parser.add_argument("--profile", action="store_true",
                            help="Profile every worker process and add per-role profiles to the report "
                                 "(slower rates: compare with profiled runs only).")

    def handle(self, *args, scale=1.0, json=False, profile=False, **options):
        code = run_bench(scale=scale, as_json=json, profile=profile)
        sys.stdout.flush()
        if code:
            sys.exit(code)
