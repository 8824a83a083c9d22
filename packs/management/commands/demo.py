"""``manage.py demo [--events FILE] [--json] [--dump PATH]``: the main job end to end."""
import sys

from django.core.management.base import BaseCommand

from packs.demo.run import run_demo


class Command(BaseCommand):
    help = "Run the end-to-end demo on real provider input and check its invariants."

    def add_arguments(self, parser):
        parser.add_argument("--events", help="JSON Lines webhook file (default: the bundled demo file).")
        parser.add_argument("--json", action="store_true", help="Print one JSON summary object as the last line.")
        parser.add_argument("--dump", help="Write local and remote end state as JSON to this path.")

    def handle(self, *args, events=None, json=False, dump=None, **options):
        code = run_demo(events=events, as_json=json, dump_path=dump)
        sys.stdout.flush()
        if code:
            sys.exit(code)
