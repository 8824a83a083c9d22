"""``manage.py run_workers --role connector|runtime|flow|egress|egress-deferred|stream|all [--until-idle] [--once]``.

A thin loop over the role's ``try_<verb>_one()`` units: run every unit until
none has work (while others are busy, a unit that found nothing polls again
only every few rounds), sleep with jitter when idle, exit cleanly on SIGTERM or
Ctrl-C, log one structured line per unit of work. With ``NEXUS_WORKER_PROFILE_DIR`` set, the
process profiles itself (cProfile) and writes ``<dir>/<roles>-<pid>.prof`` when it stops (``make bench``
summarises them per role). The roles are the ones the
apps registered (:func:`nexusflow.kernel.workers.register_role`); ``all`` runs
every role registered ``in_all``.
"""
from __future__ import annotations

import cProfile
import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path

from django.core.management.base import CommandError
from django.db import DatabaseError, close_old_connections, connections

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.workers import roles as registered_roles
from nexusflow.kernel.workers import units_for, worker_process_register

log = logging.getLogger("nexusflow.workers")

#: Busy rounds a unit that found no work sits out before it polls again (0: every unit polls every round).
IDLE_UNIT_BACKOFF = 8


#: Seconds a worker keeps its database connections between units (``NEXUS_WORKER_CONN_MAX_AGE``; 0 reconnects
#: for every unit, as a web request does).
WORKER_CONN_MAX_AGE = 300


def _keep_connections() -> None:
    """Keep this process's connections across units instead of reconnecting for each one.

    ``close_old_connections()`` before every unit closes a connection older than its ``CONN_MAX_AGE`` (0 in
    the settings, right for web requests): a worker would connect, authenticate and set up its session for
    every unit. A kept connection is checked (``CONN_HEALTH_CHECKS``: one ping) before its first use in each
    unit, so a unit never starts a transaction on a connection the server already closed.
    """
    age = float(os.environ.get("NEXUS_WORKER_CONN_MAX_AGE", WORKER_CONN_MAX_AGE))
    for alias in connections:
        settings_dict = connections[alias].settings_dict
        settings_dict["CONN_MAX_AGE"] = age
        settings_dict["CONN_HEALTH_CHECKS"] = age > 0
        connections[alias].close()  # reopened with the new settings at first use


class UnitStatements:
    """Statements each unit issued, split by whether the unit found work: ``{unit: [worked, idle, units]}``.

    A ``connection.execute_wrapper`` on the default connection adds one per statement; the
    ``worker.stop`` line reports the totals, so a role's idle polling and the statements of one unit of
    work are read off a real run, not guessed (docs/performance.md).
    """

    def __init__(self) -> None:
        self.current = 0
        self.by_unit: dict[str, list[int]] = {}

    def __call__(self, execute, sql, params, many, context):
        self.current += 1
        return execute(sql, params, many, context)

    def record(self, name: str, worked: bool) -> None:
        row = self.by_unit.setdefault(name, [0, 0, 0])
        row[0 if worked else 1] += self.current
        row[2] += 1 if worked else 0
        self.current = 0

    def summary(self) -> dict[str, dict[str, int]]:
        return {name: {"worked_statements": w, "idle_statements": i, "units": n}
                for name, (w, i, n) in sorted(self.by_unit.items())}


class Command(OperatorCommand):
    help = "Run NexusFlow workers of one or more roles."

    def add_arguments(self, parser):
        parser.add_argument("--role", action="append", choices=[*registered_roles(), "all"], required=True,
                            help="Role to run; repeat for several, or 'all'.")
        parser.add_argument("--until-idle", action="store_true", help="Exit once no work is claimable.")
        parser.add_argument("--idle-rounds", type=int, default=3,
                            help="Consecutive empty rounds that count as idle (default 3).")
        parser.add_argument("--once", action="store_true", help="Run one round and exit.")
        parser.add_argument("--idle-sleep", type=float, default=0.2, help="Seconds to sleep when idle (jittered).")

    def handle(self, *args, role, until_idle, idle_rounds, once, idle_sleep, **options):
        if idle_rounds < 1:
            raise CommandError("invalid_arguments: --idle-rounds must be at least 1", returncode=2)
        if not 0 <= idle_sleep <= 3600:
            raise CommandError("invalid_arguments: --idle-sleep is a number of seconds from 0 to 3600", returncode=2)
        _keep_connections()
        roles = list(registered_roles(all_only=True)) if "all" in role else list(dict.fromkeys(role))
        worker_id = worker_process_register("+".join(roles))
        try:
            units = [u for r in roles for u in units_for(r, worker_id)]
        except NexusError as exc:  # a role refused to start (e.g. v1_generation_refused): serve nothing
            raise CommandError(f"{exc.code}: {exc}", returncode=3) from exc
        stopping = {"flag": False}

        def stop(signum, frame):
            stopping["flag"] = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stderr.write(json.dumps({"event": "worker.start", "worker_id": worker_id, "roles": roles}))
        profile_dir = os.environ.get("NEXUS_WORKER_PROFILE_DIR")
        profiler = cProfile.Profile() if profile_dir else None
        if profiler is not None:
            profiler.enable()
        counter = UnitStatements()
        try:
            with connections["default"].execute_wrapper(counter):
                done = self._loop(units, stopping, until_idle=until_idle, idle_rounds=idle_rounds, once=once,
                                  idle_sleep=idle_sleep, counter=counter)
        finally:
            if profiler is not None:
                profiler.disable()
                path = Path(profile_dir) / f"{'+'.join(roles)}-{os.getpid()}.prof"
                path.parent.mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(path)
        self.stderr.write(json.dumps({"event": "worker.stop", "worker_id": worker_id, "units_done": done,
                                      "statements": counter.summary()}))
        sys.stderr.flush()
        if not units:
            raise CommandError("no work units for the selected roles")

    def _loop(self, units, stopping, *, until_idle: bool, idle_rounds: int, once: bool, idle_sleep: float,
              counter: UnitStatements | None = None) -> int:
        """Run the units round after round until stopped (or idle / once); return the units that worked.

        ``counter`` (default: one of its own, not reported) counts each unit's statements."""
        counter = counter if counter is not None else UnitStatements()
        empty_rounds = 0
        done = 0
        # While the worker is busy, a unit that just found nothing sits out the next IDLE_UNIT_BACKOFF busy rounds
        # (its poll costs every round's work a few statements); after a round in which nothing worked every unit
        # runs, so --until-idle still stops only after a full round found no work anywhere.
        resting = {name: 0 for name, _unit in units}
        busy = False
        while not stopping["flag"]:
            did_work = False
            for name, unit in units:
                if stopping["flag"]:
                    break
                if busy and resting[name] > 0:
                    resting[name] -= 1
                    continue
                close_old_connections()
                try:
                    worked = unit()
                except (NexusError, DatabaseError) as exc:
                    # The exception text is an argument, never the message: it may carry record values or
                    # provider text, which a JSON line drops (nexusflow/kernel/logs.py); the code stays.
                    log.warning("worker.unit_error %s: %s", type(exc).__name__, str(exc)[:300],
                                extra={"unit": name, "code": getattr(exc, "code", None)})
                    worked = False
                except Exception:  # a bug in one unit must not stop the others; it is logged loudly
                    log.exception(json.dumps({"event": "worker.unit_crash", "unit": name}), extra={"unit": name})
                    worked = False
                counter.record(name, bool(worked))
                if worked:
                    did_work = True
                    done += 1
                resting[name] = 0 if worked else IDLE_UNIT_BACKOFF
            busy = did_work
            if once:
                break
            if did_work:
                empty_rounds = 0
                continue
            empty_rounds += 1
            if until_idle and empty_rounds >= idle_rounds:
                break
            time.sleep(idle_sleep * (0.5 + random.random()))
        return done
