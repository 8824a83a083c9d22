"""``manage.py connector_stream_poll --account A [--route R] [--once] [--max-batches N] [--until-idle]``.

Polls the pulled routes of one serving account: fetch a batch after the
durable cursor, admit every envelope, then advance the cursor (seed 003
"Inbound facts"; ``connectors/inbound/stream_poll.py``). ``--stop`` / ``--resume`` pause
or resume the route's poller without moving its cursor; ``--status`` prints
the cursors. SIGTERM or Ctrl-C ends the loop after the batch in hand; its
cursor advances only if its Receipts committed.

Exit status: 0 done; 1 with ``<error code>: <message>`` for an unknown
account or route, a source that cannot be read, an unusable response or an
admission conflict (the cursor stays where it was in every case).
"""
from __future__ import annotations

import json
import math
import random
import signal
import time

from django.core.management.base import CommandError
from django.db import close_old_connections

from connectors.inbound.stream_poll import (
    POLL_ERRORS,
    UnknownStream,
    pull_targets,
    stream_cursor_for,
    stream_cursor_set_state,
    stream_poll_once,
)
from connectors.serving.gates import NotServing
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity


def _cursor_text(cursor) -> str | None:
    return None if cursor is None else bytes(cursor).decode("utf-8", "replace")


class Command(OperatorCommand):
    help = "Poll the pulled routes of one account into Receipts, advancing each durable cursor after commit."

    def add_arguments(self, parser):
        parser.add_argument("--account", required=True, help="The account key of a v2_serving account.")
        parser.add_argument("--route", help="Only this route key (default: every pulled route of the account).")
        parser.add_argument("--once", action="store_true", help="Poll one batch per route and exit.")
        parser.add_argument("--max-batches", type=int, default=0, help="Exit after N non-empty batches (0: no limit).")
        parser.add_argument("--until-idle", action="store_true", help="Exit once a fetch returns no envelope.")
        parser.add_argument("--idle-sleep", type=float, default=1.0, help="Seconds to sleep when idle (jittered).")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--stop", action="store_true", help="Stop the poller; the cursor is not moved.")
        action.add_argument("--resume", action="store_true", help="Resume a stopped poller at its cursor.")
        action.add_argument("--status", action="store_true", help="Print each route's cursor and exit.")

    def handle(self, *args, account, route, once, max_batches, until_idle, idle_sleep, stop, resume, status,
               **options):
        if max_batches < 0:
            raise CommandError("--max-batches must be 0 or more")
        if not math.isfinite(idle_sleep) or idle_sleep < 0:
            raise CommandError("--idle-sleep must be a finite number of seconds, 0 or more")
        try:
            targets = pull_targets(account_key=account, route_key=route)
        except (UnknownStream, NotServing, InvalidIdentity) as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        if stop or resume or status:
            for target in targets:
                cursor = (stream_cursor_set_state(target, state="stopped" if stop else "active")
                          if not status else stream_cursor_for(target))
                self.stdout.write(json.dumps({"account": target.account_key, "route": target.route_key,
                                              "state": cursor.state, "cursor": _cursor_text(cursor.cursor),
                                              "batches": cursor.batches}))
            return
        stopping = {"flag": False}

        def request_stop(signum, frame):
            stopping["flag"] = True

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        batches = 0
        while not stopping["flag"]:
            fetched_any = False
            for target in targets:
                close_old_connections()
                try:
                    result = stream_poll_once(target)
                except POLL_ERRORS as exc:
                    raise CommandError(f"{exc.code}: {exc}") from exc
                self.stderr.write(json.dumps({
                    "event": "stream.poll", "account": target.account_key, "route": target.route_key,
                    "fetched": result.fetched, "receipts_created": result.receipts_created,
                    "receipts_resolved": result.receipts_resolved, "events_created": result.events_created,
                    "quarantined": result.quarantined, "advanced": result.advanced, "stopped": result.stopped,
                    "cursor": _cursor_text(result.cursor)}))
                if result.fetched:
                    fetched_any = True
                    batches += 1
            if once or (max_batches and batches >= max_batches) or (until_idle and not fetched_any):
                break
            if not fetched_any:
                time.sleep(idle_sleep * (0.5 + random.random()))
