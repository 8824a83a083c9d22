"""``manage.py demo [--events FILE] [--json] [--dump PATH] [--chaos SEED] [--run-dir DIR]``: the main job end to end.

``--run-dir DIR`` (default ``var/demo``) holds the run's logs, applied
configuration and secret backend.

``--chaos SEED`` (a non-negative integer) runs the chaos demo of
``packs/demo/chaos.py``: worker processes are SIGKILLed at the seed's named
failpoints and restarted; the summary adds ``kills`` and exits 1 when fewer
than 10 kills happened or an invariant failed. A bad seed is a usage error
(exit 2).
"""
import argparse
import sys

from django.core.management.base import BaseCommand

from packs.demo.run import run_demo


def _seed(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"SEED must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"SEED must be a non-negative integer, got {text!r}")
    return value


class Command(BaseCommand):
    help = "Run the end-to-end demo on real provider input and check its invariants."

    def add_arguments(self, parser):
        parser.add_argument("--events", help="JSON Lines webhook file (default: the bundled demo file).")
        parser.add_argument("--json", action="store_true", help="Print one JSON summary object as the last line.")
        parser.add_argument("--dump", help="Write local and remote end state as JSON to this path.")
        parser.add_argument("--chaos", type=_seed, metavar="SEED",
                            help="Kill worker processes with SIGKILL at failpoints chosen by SEED, restart them, "
                                 "and report the kills.")
        parser.add_argument("--run-dir", help="Directory of the run's logs, configuration and secret backend "
                                              "(default: var/demo).")

    def handle(self, *args, events=None, json=False, dump=None, chaos=None, run_dir=None, **options):
        code = run_demo(events=events, as_json=json, dump_path=dump, chaos_seed=chaos, run_dir=run_dir)
        sys.stdout.flush()
        if code:
            sys.exit(code)
