"""``manage.py journeys list`` and ``manage.py journeys run NAME [--json]``: end-to-end provider journeys.

``list`` prints each registered journey's name and summary. ``run`` runs one
journey (see :mod:`packs.journeys`) and prints what the provider saw (its
requests by method and path, its final records) and every check; ``--json``
prints the report as one JSON object on the last line. Exit codes: 0 every
check passed, 1 a check failed, 2 the journey could not run (unknown name, a
process or set-up step failed).
"""
import sys

from django.core.management.base import BaseCommand

from packs.journeys import registry, run_journey


class Command(BaseCommand):
    help = "List or run the end-to-end provider journeys (real web, workers and provider sandbox)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="List the registered journeys.")
        run = sub.add_parser("run", help="Run one journey end to end.")
        run.add_argument("name", help="The journey name (see `journeys list`).")
        run.add_argument("--json", action="store_true", help="Print the report as one JSON object.")
        run.add_argument("--events", help="A webhook deliveries file in the demo's format (journeys that take one, "
                                          "e.g. cutover-v1-to-v2; default: the demo's).")

    def handle(self, *args, action, name=None, json=False, events=None, **options):
        if action == "list":
            for journey in registry().values():
                self.stdout.write(f"{journey.name}\t{journey.summary}")
            return
        code = run_journey(name, as_json=json, options={"events": events} if events else None)
        sys.stdout.flush()
        if code:
            sys.exit(code)
