"""The hot-account capacity test: one account's whole transaction mix, offered as a plan declares, on MariaDB.

:func:`run_capacity_plan` (``manage.py capacity_plan --plan FILE``) reads a
plan (:mod:`packs.bench.plan`), makes the demo webhook service serve in
databases of its own (``<main>_hot`` and ``<main>_hot_control``, recreated
each run) as ``make bench`` does (:func:`packs.bench.inbound.inbound_start`),
starts ``run_workers`` processes of every role, warms up the contacts the
pushes need, then offers the plan's workload for its window: signed webhook
deliveries and redeliveries over HTTP from a pool of senders on a fixed
schedule, customer events whose after-save Flow authors pushes, credential
revocations and account halts through the real services. It drains, reads
each class's latency and throughput from the rows, samples gate-lock waits
from InnoDB's lock-wait tables beside a probe of the gate lock, counts
deadlocks and retries, and judges every budget (``report["budgets"]``).
Method and figures: ``docs/scaling.md``.
Seed 003, "State machines" (AccountServingGate capacity test), proof S003-RP-08.
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import MySQLdb
from django.conf import settings
from django.db import DatabaseError

from packs.bench.inbound import Inbound, inbound_start
from packs.bench.measure import RUN_DIR, BenchError, connect, latency_ms, wait_for, workers
from packs.bench.plan import (
    DRIVEN_CLASSES,
    OPERATION_CLASSES,
    PlanError,
    budget_verdicts,
    load_plan,
    offered_per_second,
    offered_units,
    window_units,
)
from packs.demo.common import DemoError
from packs.demo.run import ROOT, TimedPoster, db_url, recreate_databases, service_secrets_env, use_database

#: The worker roles the whole chain needs (inbound apply, Runtime, Flow, egress).
ROLES = ("connector", "runtime", "flow", "egress")
#: Log files of this test in the run directory start with this (the bench's own logs are left alone).
LOG_PREFIX = "capacity"
#: The report file in the run directory.
REPORT_FILE = "capacity_report.json"
#: Events per delivery of the warm-up (as ``make bench`` batches them).
WARM_BATCH = 20
#: The gate rows of seed 003's serialization point, and the credential gate Permit acquisition also locks.
GATE_TABLES = ("connectors_accountservinggate", "connectors_servingepoch",
               "connectors_credentialgenerationdispatchgate")
#: Server counters read before and after the window (SHOW GLOBAL STATUS).
STATUS_COUNTERS = ("Innodb_deadlocks", "Innodb_row_lock_time", "Innodb_row_lock_waits", "Com_commit", "Questions")
#: Worker log lines of work run again: a whole transaction the server rolled back and that its function runs
#: again at once (``kernel.retry``), and a unit that failed and that the worker loop claims again later.
RETRY_LOG_MARKERS = {"deadlock_victim_rerun": "was a deadlock victim", "worker_unit_failed": "worker.unit_error",
                     # the web server's answers the provider retries (its sender resends a 503 or 429)
                     "http_503_answered": "Service Unavailable: /api/v2/ingress/",
                     "http_429_answered": "Too Many Requests: /api/v2/ingress/"}
#: A failed unit's log line: ``worker.unit_error <ErrorClass>: (<server error code>, ...``.
UNIT_ERROR = re.compile(r"worker\.unit_error (\w+): \((\d+)")


# --------------------------------------------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------------------------------------------

def schedule(plan: dict[str, Any]) -> list[tuple[float, str, int]]:
    """The driven arrivals of ``plan``'s window: ``[(seconds after the start, class, index in class), ...]``, by time.

    A ``rate_per_second`` class arrives every ``1 / rate`` s from 0 (``floor(rate x duration)`` units); a
    ``count`` class arrives at ``(i + 0.5) x duration / count``, so its units are spread over the window.
    """
    duration = plan["workload"]["duration_seconds"]
    out = []
    for name in DRIVEN_CLASSES:
        spec, units = plan["workload"]["classes"][name], window_units(plan, name)
        for i in range(units):
            at = i / spec["rate_per_second"] if "rate_per_second" in spec else (i + 0.5) * duration / units
            out.append((at, name, i))
    out.sort(key=lambda item: (item[0], OPERATION_CLASSES.index(item[1]), item[2]))
    return out


# --------------------------------------------------------------------------------------------------------------
# Gate-lock waits from InnoDB's lock-wait tables
# --------------------------------------------------------------------------------------------------------------

class GateLockSampler(threading.Thread):
    """Sample ``information_schema.INNODB_LOCK_WAITS`` for the row-lock waits of one database.

    Every ``interval`` seconds one query lists the transactions waiting for a
    lock on a table of ``database``. InnoDB refreshes these tables from its
    lock system only when nobody read them for 0.1 s, so the interval must be
    longer than that (the plan's ``gate_lock_sample_ms`` is at least 110). A wait (one
    requesting transaction and requested lock) seen in ``k`` consecutive
    samples lasted at least ``(k - 1) x interval`` and less than
    ``(k + 1) x interval``; a wait shorter than the interval is seen with a
    probability of its length over the interval. :meth:`waits_ms` gives the
    proven lower bounds (ms) when the thread has stopped, for the gate rows
    (:data:`GATE_TABLES`) or any tables.
    """

    def __init__(self, cfg: dict, database: str, interval: float):
        super().__init__(name="gate-lock-sampler", daemon=True)
        self.cfg, self.interval = cfg, interval
        self.prefix = f"`{database}`.%"
        self.samples = 0
        self._seen: dict[tuple, list] = {}
        self._stop_event = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        sql = ("SELECT w.requesting_trx_id, w.requested_lock_id, l.lock_table FROM information_schema.INNODB_LOCK_WAITS w "
               "JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id WHERE l.lock_table LIKE %s")
        conn = None
        try:
            conn = connect(self.cfg, None)
            conn.autocommit(True)
            cursor = conn.cursor()
            while True:  # at least one sample, however soon the run stops it
                now = time.monotonic()
                cursor.execute(sql, [self.prefix])
                for trx, lock, table in cursor.fetchall():
                    table = table.split(".")[-1].strip("`")
                    entry = self._seen.setdefault((trx, lock), [now, now, table])
                    entry[1] = now
                self.samples += 1
                if self._stop_event.wait(self.interval):
                    break
        except Exception as exc:  # reported in the run's figures (sampler_error), never lost
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            if conn is not None:
                conn.close()

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._stop_event.set()
        self.join(10)

    def waits_ms(self, tables: tuple[str, ...] | None = GATE_TABLES) -> list[float]:
        """Each observed wait's proven duration (lower bound, ms) on ``tables`` (``None``: every table)."""
        return [(last - first) * 1000 for first, last, table in self._seen.values()
                if tables is None or table in tables]

    def by_table(self) -> dict[str, dict[str, float]]:
        """Observed waits per table: ``{table: {"waits": n, "at_least_ms": summed lower bounds,
        "below_ms": summed upper bounds}}``, most waited first."""
        out: dict[str, dict[str, float]] = {}
        for first, last, table in self._seen.values():
            entry = out.setdefault(table, {"waits": 0, "at_least_ms": 0.0, "below_ms": 0.0})
            entry["waits"] += 1
            entry["at_least_ms"] += (last - first) * 1000
            entry["below_ms"] += (last - first + 2 * self.interval) * 1000
        return dict(sorted(out.items(), key=lambda item: (-item[1]["waits"], item[0])))


class GateProbe(threading.Thread):
    """Time the gate lock every V2 write takes, as one more writer would see it, ``rate`` times a second.

    Each probe opens a transaction, times :func:`connectors.serving.gates.serving_lock` of the next account
    of ``accounts`` (the gate row and its exact epoch, in the mode the product takes them) and rolls back,
    so it writes nothing; a gate that is not serving (a halt) still counts the time to its answer.
    :attr:`waits_ms` holds each probe's milliseconds (two locking reads: about a millisecond when nobody
    holds the gate).
    """

    def __init__(self, org_id: str, accounts: list[str], rate: float):
        super().__init__(name="gate-probe", daemon=True)
        self.org_id, self.accounts, self.period = org_id, accounts, 1.0 / rate
        self.waits_ms: list[float] = []
        self.not_serving = 0
        self.error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        from django.db import connections, transaction

        from connectors.serving.gates import NotServing, serving_lock

        i = 0
        try:
            while not self._stop_event.is_set():
                with transaction.atomic():
                    began = time.perf_counter()
                    try:
                        serving_lock(org_id=self.org_id, account_key=self.accounts[i % len(self.accounts)])
                    except NotServing:
                        self.not_serving += 1
                    self.waits_ms.append((time.perf_counter() - began) * 1000)
                    transaction.set_rollback(True)
                i += 1
                self._stop_event.wait(self.period)
        except DatabaseError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            connections.close_all()

    def stop(self) -> None:
        """Stop probing and wait for the thread."""
        self._stop_event.set()
        self.join(10)


def gate_lock_figures(waits_ms: list[float], *, samples: int, interval: float, by_table: dict[str, Any],
                      status_delta: dict[str, int], probe_ms: list[float] | None = None) -> dict[str, Any]:
    """The gate-lock wait figures of a run: sampled gate waits' p50/p95/p99/max (ms) beside the server's totals.

    ``waits_ms`` are the proven lengths of the waits on the gate rows (:data:`GATE_TABLES`, lower bounds:
    :meth:`GateLockSampler.waits_ms`), ``by_table`` every table's waits of the
    run's database (:meth:`GateLockSampler.by_table`), ``status_delta`` the ``SHOW GLOBAL STATUS`` delta over
    the window (server-wide: every database's row-lock waits, this run's and anyone else's), ``probe_ms``
    the :class:`GateProbe` timings (ms). ``p95_ms``/``p99_ms`` (what the budgets judge) are the larger of the
    sampled waits' and the probe's percentiles: the probe sees short waits to the millisecond, the samples
    prove long ones the probe may not have met; ``sampled`` and ``probe`` keep each source's own. With
    nothing observed the percentiles are 0.0.
    """
    waits = status_delta.get("Innodb_row_lock_waits", 0)
    sampled = {**latency_ms(waits_ms), "max_ms": max(waits_ms, default=0.0)}
    probe = {"probes": len(probe_ms or []), **latency_ms(probe_ms or []), "max_ms": max(probe_ms or [], default=0.0)}
    return {"source": "information_schema.INNODB_LOCK_WAITS + INNODB_LOCKS (sampled) and the gate probe",
            "tables": list(GATE_TABLES), "sample_interval_ms": interval * 1000, "samples": samples,
            "waits_observed": len(waits_ms), "all_waits_by_table": by_table,
            **{key: max(sampled[key], probe[key]) for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms")},
            "sampled": sampled, "probe": probe,
            "server_row_lock_waits": waits, "server_row_lock_time_ms": status_delta.get("Innodb_row_lock_time", 0),
            "server_row_lock_avg_ms": (status_delta.get("Innodb_row_lock_time", 0) / waits) if waits else 0.0}


# --------------------------------------------------------------------------------------------------------------
# Offering the driven classes
# --------------------------------------------------------------------------------------------------------------

@dataclass
class Offered:
    """What the driver did: one record per unit (``class``, ``index``, ``scheduled``/``start``/``end`` in monotonic
    seconds, ``outcome``, ``latency_ms`` from the scheduled time, ``service_ms`` from the start)."""

    units: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.units.append(record)

    def of(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [u for u in self.units if u["class"] == name]


class Driver:
    """Offers the plan's driven classes against a serving :class:`Inbound` service.

    Deliveries go through a pool of ``senders`` threads (each with its own
    keep-alive client), each operator class (revocation, halt) through an
    operator thread of its own calling the real services in this process. A unit's
    latency runs from its scheduled time to its answer, so a unit that waited
    for a free sender is charged for it.
    """

    def __init__(self, plan: dict[str, Any], inbound: Inbound, warm: list[int],
                 admitted: list[list[dict[str, Any]]] = ()):
        self.plan, self.inbound = plan, inbound
        self.warm = list(warm)
        self.offered = Offered()
        #: Events of deliveries answered 202 (the warm-up's first), which ``replay_admission`` redelivers.
        self.admitted: list[list[dict[str, Any]]] = list(admitted)
        self._posters = ExitStack()  # one keep-alive poster per sender thread, closed after the window
        self._local = threading.local()
        self._rng = random.Random(8)
        self._ids = threading.Lock()

    # --- deliveries -------------------------------------------------------------------------------------------
    def _poster(self) -> TimedPoster:
        poster = getattr(self._local, "poster", None)
        if poster is None:
            with self._ids:
                poster = self._posters.enter_context(TimedPoster(url=self.inbound.url, secret=self.inbound.secret))
            self._local.poster = poster
        return poster

    def _events_for(self, name: str, index: int) -> list[dict[str, Any]] | None:
        with self._ids:
            if name == "admission":
                (contact,) = self.inbound.new_contacts(1)
                return [self.inbound.event(contact, "email", f"hot{contact}@example.com")]
            if name == "outbound_authoring":
                contact = self.warm[index]
                return [self.inbound.event(contact, "lifecyclestage", "customer")]
            if not self.admitted:
                return None
            earlier = self._rng.choice(self.admitted)
            return [{**event, "attemptNumber": event.get("attemptNumber", 0) + 1} for event in earlier]

    def deliver(self, name: str, index: int, due: float) -> None:
        """POST the unit ``index`` of delivery class ``name`` scheduled at ``due`` (monotonic seconds).

        The sender resends a delivery answered 503 or 429 after its ``Retry-After`` (the provider's way); the
        time of those resends is the unit's, and the web server's log counts them (:func:`count_retries`).
        """
        from packs.hubspot.sender import Delivery

        events = self._events_for(name, index)
        record: dict[str, Any] = {"class": name, "index": index, "scheduled": due}
        if events is None:
            self.offered.add({**record, "outcome": "nothing_to_redeliver", "latency_ms": None})
            return
        began = time.monotonic()
        try:
            status, _seconds = self._poster().post(Delivery(body=events))
        except DemoError as exc:  # a request failed below HTTP
            self.offered.add({**record, "outcome": f"transport_error: {exc}", "latency_ms": None})
            return
        answered = time.monotonic()
        outcome = {202: "admitted", 200: "redelivered"}.get(status, f"http_{status}")
        if status == 200 and name != "replay_admission":
            outcome = "admitted_on_retry"  # an earlier request of this delivery admitted it, then answered 503
        if status == 202 and name != "replay_admission":
            with self._ids:
                self.admitted.append(events)
        self.offered.add({**record, "outcome": outcome, "start": began, "end": answered,
                          "latency_ms": (answered - due) * 1000, "service_ms": (answered - began) * 1000})

    # --- operator classes --------------------------------------------------------------------------------------
    def operate(self, name: str, index: int, due: float) -> None:
        """Run unit ``index`` of operator class ``name`` (``credential_revocation`` or ``halt``) due at ``due``."""
        from django.db import connections

        began = time.monotonic()
        try:
            record = self._revoke() if name == "credential_revocation" else self._halt()
        except Exception as exc:  # an operator step that failed is reported as the unit's outcome
            record = {"outcome": f"error: {type(exc).__name__}: {exc}"}
        finally:
            connections.close_all()
        answered = time.monotonic()
        self.offered.add({"class": name, "index": index, "scheduled": due, "start": began, "end": answered,
                          "latency_ms": (answered - due) * 1000, "service_ms": (answered - began) * 1000,
                          **record})

    def _revoke(self) -> dict[str, Any]:
        from connectors.models import CredentialGeneration
        from connectors.serving.credential_gates import credential_reenable, credential_revoke

        org = self.inbound.org_id
        account = self.plan["accounts"]["outbound"]
        generation = (CredentialGeneration.objects.filter(org_id=org, account_key=account)
                      .order_by("-id").values_list("id", flat=True).first())
        if generation is None:
            return {"outcome": f"error: no credential generation of account {account}"}
        began = time.monotonic()
        revoked = credential_revoke(org_id=org, credential_generation_id=generation, actor="capacity-plan",
                                    note="hot-account capacity test")
        revoke_ms = (time.monotonic() - began) * 1000
        time.sleep(self.plan["workload"]["classes"]["credential_revocation"]["hold_seconds"])
        began = time.monotonic()
        credential_reenable(org_id=org, credential_generation_id=generation, actor="capacity-plan")
        return {"outcome": "revoked_and_reenabled", "revoke_ms": revoke_ms,
                "reenable_ms": (time.monotonic() - began) * 1000, "closed_permits": len(revoked.closed_permits)}

    def _halt(self) -> dict[str, Any]:
        from connectors.serving.handoff import HaltRefused, halt_begin, halt_try_complete, predecessor_resume
        from nexusflow.kernel.scope import OrgScope

        org = OrgScope(self.inbound.org_id)
        try:
            halt_begin(org=org)
        except HaltRefused as exc:
            return {"outcome": "refused_work_pending", "reason": exc.code}
        deadline = time.monotonic() + 30
        while not halt_try_complete(org=org).all_halted:
            if time.monotonic() > deadline:
                return {"outcome": "still_halting_after_30_s"}
            time.sleep(0.05)
        predecessor_resume(org=org)
        return {"outcome": "halted_and_resumed"}

    # --- the window ----------------------------------------------------------------------------------------------
    def run(self) -> float:
        """Offer the whole schedule; return the window's start (monotonic). Waits for every unit to answer."""
        arrivals = schedule(self.plan)
        senders = ThreadPoolExecutor(self.plan["workload"]["senders"], thread_name_prefix="sender")
        operators = {name: ThreadPoolExecutor(1, thread_name_prefix=name) for name in ("credential_revocation", "halt")}
        start = time.monotonic()
        futures = []
        for at, name, index in arrivals:
            pause = start + at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            pool, act = (operators[name], self.operate) if name in operators else (senders, self.deliver)
            futures.append(pool.submit(act, name, index, start + at))
        for future in futures:
            future.result()
        senders.shutdown()
        for pool in operators.values():
            pool.shutdown()
        self._posters.close()
        return start


# --------------------------------------------------------------------------------------------------------------
# Reading the classes from the rows
# --------------------------------------------------------------------------------------------------------------

def _rows(sql: str, params: list) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def marks() -> dict[str, int]:
    """The highest id of each table a class is read from (the window's rows come after)."""
    tables = {"receipt": "connectors_receipt", "event": "connectors_event", "execution": "connectors_execution",
              "step": "flows_flowstepexecution", "run": "flows_flowrun", "command": "runtime_outbox_outboundcommand",
              "effect": "connectors_remoteeffect", "outbox": "runtime_outbox_outboxmessage"}
    return {key: int(_rows(f"SELECT COALESCE(MAX(id), 0) FROM {table}", [])[0][0]) for key, table in tables.items()}


_US = "TIMESTAMPDIFF(MICROSECOND, {0}, {1}) / 1000.0"

#: Per derived class: SQL giving one row per unit, ``(offered_at, served_at or NULL, wait_ms or NULL,
#: age_ms of a unit still pending)``, over the window's rows, and the id marks it reads (each ``%s`` pair:
#: the org, then the next mark). A Receipt whose last component is missing (its materialization did not
#: finish) is a pending ``materialization`` unit.
CLASS_SQL = {
    "materialization": (
        "SELECT r.received_at, e.created_at, " + _US.format("r.received_at", "e.created_at") + ", NULL "
        "FROM connectors_event e JOIN connectors_receipt r ON r.id = e.receipt_id "
        "WHERE e.org_id = %s AND e.id > %s "
        "UNION ALL SELECT r.received_at, NULL, NULL, " + _US.format("r.received_at", "UTC_TIMESTAMP(6)") + " "
        "FROM connectors_receipt r WHERE r.org_id = %s AND r.id > %s AND r.kind <> 'replay' "
        "AND r.component_count > 0 AND NOT EXISTS (SELECT 1 FROM connectors_receiptcomponent c "
        "WHERE c.receipt_id = r.id AND c.ordinal = r.component_count - 1)", ("event", "receipt")),
    "execution_claim": (
        "SELECT ev.created_at, a.first_at, " + _US.format("ev.created_at", "a.first_at") + ", "
        "CASE WHEN a.first_at IS NULL THEN " + _US.format("ev.created_at", "UTC_TIMESTAMP(6)") + " END "
        "FROM connectors_execution x JOIN connectors_projection p ON p.id = x.projection_id "
        "JOIN connectors_event ev ON ev.id = p.event_id "
        "LEFT JOIN (SELECT execution_id, MIN(created_at) AS first_at FROM connectors_executionattempt "
        "GROUP BY execution_id) a ON a.execution_id = x.id WHERE x.org_id = %s AND x.id > %s", ("execution",)),
    "flow_step_claim": (
        "SELECT GREATEST(s.created_at, COALESCE(s.run_after, s.created_at)), a.first_at, "
        + _US.format("GREATEST(s.created_at, COALESCE(s.run_after, s.created_at))", "a.first_at") + ", "
        "CASE WHEN a.first_at IS NULL AND s.state IN ('Pending', 'RetryScheduled') THEN "
        + _US.format("GREATEST(s.created_at, COALESCE(s.run_after, s.created_at))", "UTC_TIMESTAMP(6)") + " END "
        "FROM flows_flowstepexecution s LEFT JOIN (SELECT step_id, MIN(started_at) AS first_at "
        "FROM flows_flowstepattempt GROUP BY step_id) a ON a.step_id = s.id "
        "WHERE s.org_id = %s AND s.id > %s AND (a.first_at IS NOT NULL OR s.state IN ('Pending', 'RetryScheduled'))",
        ("step",)),
    "outbound_authoring": (
        "SELECT r.created_at, c.created_at, " + _US.format("r.created_at", "c.created_at") + ", "
        "CASE WHEN c.id IS NULL AND r.state NOT IN ('Succeeded', 'TerminalFailed', 'Quarantined', 'Cancelled') "
        "THEN " + _US.format("r.created_at", "UTC_TIMESTAMP(6)") + " END "
        "FROM flows_flowrun r LEFT JOIN runtime_outbox_outboundcommand c ON c.origin_flow_run_id = r.id "
        "WHERE r.org_id = %s AND r.id > %s AND r.trigger_object_name <> ''", ("run",)),
    "permit_acquisition": (
        "SELECT f.created_at, p.first_at, " + _US.format("f.created_at", "p.first_at") + ", "
        "CASE WHEN p.first_at IS NULL AND f.state NOT IN ('finalized', 'no_effect', 'quarantined') THEN "
        + _US.format("f.created_at", "UTC_TIMESTAMP(6)") + " END "
        "FROM connectors_remoteeffect f LEFT JOIN (SELECT t.effect_id, MIN(d.created_at) AS first_at "
        "FROM connectors_remoteeffectattempt t JOIN connectors_dispatchpermit d ON d.attempt_id = t.id "
        "GROUP BY t.effect_id) p ON p.effect_id = f.id WHERE f.org_id = %s AND f.id > %s", ("effect",)),
    "settlement": (
        "SELECT p.sent_at, CASE WHEN f.state = 'finalized' THEN f.updated_at END, "
        "CASE WHEN f.state = 'finalized' THEN " + _US.format("p.sent_at", "f.updated_at") + " END, "
        "CASE WHEN f.state NOT IN ('finalized', 'no_effect', 'quarantined') THEN "
        + _US.format("p.sent_at", "UTC_TIMESTAMP(6)") + " END "
        "FROM connectors_remoteeffect f JOIN (SELECT t.effect_id, MAX(d.io_may_have_started_at) AS sent_at "
        "FROM connectors_remoteeffectattempt t JOIN connectors_dispatchpermit d ON d.attempt_id = t.id "
        "WHERE d.io_may_have_started_at IS NOT NULL GROUP BY t.effect_id) p ON p.effect_id = f.id "
        "WHERE f.org_id = %s AND f.id > %s", ("effect",)),
}


def class_figures(units: list[tuple], *, offered: int, offered_per_second: float) -> dict[str, Any]:
    """One class's figures from its units ``(offered_at, served_at, wait_ms, pending_age_ms)``.

    ``offered_at``/``served_at`` are datetimes or monotonic seconds (``None``: not served). Returns
    ``{"offered", "offered_per_second", "completed", "pending", "per_second", "p50_ms", "p95_ms", "p99_ms",
    "starvation_ms"}``: the rate is the served units over the span from the first unit offered to the last
    served; the starvation figure is the longest any unit waited, served or (at the end) still pending.
    With no served unit the rate and percentiles are ``None``.
    """
    served = [u for u in units if u[1] is not None and u[2] is not None]
    pending = [u for u in units if u[1] is None and u[3] is not None]
    waits = [float(u[2]) for u in served]
    starvation = max([*waits, *[float(u[3]) for u in pending]], default=None)
    out: dict[str, Any] = {"offered": offered, "offered_per_second": offered_per_second, "completed": len(served),
                           "pending": len(pending), "starvation_ms": starvation}
    if not served:
        return {**out, "per_second": None, "p50_ms": None, "p95_ms": None, "p99_ms": None,
                "reason": "no unit of this class was served in the window"}
    first = min(u[0] for u in units if u[0] is not None)
    delta = max(u[1] for u in served) - first
    span = delta.total_seconds() if hasattr(delta, "total_seconds") else float(delta)
    return {**out, "per_second": len(served) / span if span > 0 else None, **latency_ms(waits)}


def _driven_figures(plan: dict[str, Any], offered: Offered, name: str) -> dict[str, Any]:
    units = offered.of(name)
    good = {"admission": ("admitted", "admitted_on_retry"), "replay_admission": ("redelivered", "admitted"),
            "outbound_authoring": ("admitted", "admitted_on_retry"), "credential_revocation": ("revoked_and_reenabled",),
            "halt": ("halted_and_resumed", "refused_work_pending")}[name]
    rows = [(u["scheduled"], u["end"] if u["outcome"] in good else None,
             u["latency_ms"] if u["outcome"] in good else None, None) for u in units]
    figures = class_figures(rows, offered=offered_units(plan, name), offered_per_second=offered_per_second(plan, name))
    figures["outcomes"] = dict(Counter(u["outcome"] for u in units))
    if name == "credential_revocation" and units:
        figures["revoke_ms"] = latency_ms([u["revoke_ms"] for u in units if "revoke_ms" in u])
    return figures


def measure_classes(plan: dict[str, Any], offered: Offered, org_id: str, before: dict[str, int]
                    ) -> dict[str, dict[str, Any]]:
    """Every class's figures (:func:`class_figures`): driven ones from the driver, derived ones from the rows.

    For ``outbound_authoring`` both are read: the class's figures are the rows' (record change's Flow run ->
    OutboundCommand), and ``"delivery"`` holds the customer events' POST figures.
    """
    out: dict[str, dict[str, Any]] = {}
    for name in OPERATION_CLASSES:
        if name in CLASS_SQL:
            sql, ids = CLASS_SQL[name]
            params = [value for mark in ids for value in (org_id, before[mark])]
            figures = class_figures(_rows(sql, params), offered=offered_units(plan, name),
                                    offered_per_second=offered_per_second(plan, name))
            if name == "outbound_authoring":
                figures["delivery"] = _driven_figures(plan, offered, name)
            out[name] = figures
        else:
            out[name] = _driven_figures(plan, offered, name)
    return out


def count_retries(org_id: str, before: dict[str, int], logs: dict[str, str]) -> dict[str, Any]:
    """Retries of the window, counted by correlation: rows of the window's units and this run's log lines.

    Returns ``{"execution_attempts", "flow_step_attempts", "effect_attempts", "outbox_redeliveries",
    <each RETRY_LOG_MARKERS key>, "total", "unit_errors_by_code"}``: attempts beyond each unit's first
    (ExecutionAttempt, FlowStepAttempt, RemoteEffectAttempt numbers above 1, OutboxMessage deliveries above
    1), and the log lines of work run again: the workers' re-run transactions and failed units, the web
    server's 503/429 answers that the provider resends (``logs``: file name -> the text this run's
    processes wrote);
    ``unit_errors_by_code`` counts the failed units by ``"<error class> <server code>"`` (not in the total).
    """
    def extra(sql: str, mark: str) -> int:
        return int(_rows(sql, [org_id, before[mark]])[0][0] or 0)

    out = {
        "execution_attempts": extra("SELECT COUNT(*) FROM connectors_executionattempt a JOIN connectors_execution x "
                                    "ON x.id = a.execution_id WHERE x.org_id = %s AND x.id > %s "
                                    "AND a.attempt_number > 1", "execution"),
        "flow_step_attempts": extra("SELECT COUNT(*) FROM flows_flowstepattempt a JOIN flows_flowstepexecution s "
                                    "ON s.id = a.step_id WHERE s.org_id = %s AND s.id > %s "
                                    "AND a.attempt_number > 1", "step"),
        "effect_attempts": extra("SELECT COUNT(*) FROM connectors_remoteeffectattempt a JOIN connectors_remoteeffect f "
                                 "ON f.id = a.effect_id WHERE f.org_id = %s AND f.id > %s "
                                 "AND a.attempt_number > 1", "effect"),
        "outbox_redeliveries": extra("SELECT COALESCE(SUM(CASE WHEN delivery_attempts > 1 THEN delivery_attempts - 1 ELSE 0 END), 0) "
                                     "FROM runtime_outbox_outboxmessage WHERE org_id = %s AND id > %s", "outbox"),
    }
    for key, marker in RETRY_LOG_MARKERS.items():
        out[key] = sum(text.count(marker) for text in logs.values())
    out["total"] = sum(out.values())
    codes = Counter(f"{error} {code}" for text in logs.values() for error, code in UNIT_ERROR.findall(text))
    out["unit_errors_by_code"] = dict(codes.most_common())
    return out


# --------------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------------

def _status(cfg: dict) -> dict[str, int]:
    conn = connect(cfg, None)
    try:
        cursor = conn.cursor()
        marks_ = ", ".join(["%s"] * len(STATUS_COUNTERS))
        cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({marks_})", STATUS_COUNTERS)
        return {name: int(value) for name, value in cursor.fetchall()}
    finally:
        conn.close()


def _migrate_both(env: dict) -> None:
    """Migrate the run's main and control databases side by side.

    Raises:
        DemoError: a migration exited non-zero (its output is in the message).
    """
    procs = [subprocess.Popen([sys.executable, "manage.py", "migrate", "--noinput", "-v0", *extra], cwd=ROOT, env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for extra in ([], ["--database", "control"])]
    failed = [output for output, code in ((p.communicate()[0], p.returncode) for p in procs) if code]
    if failed:
        raise DemoError("manage.py migrate failed:\n" + "\n".join(failed))


def _log_sizes(run_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in run_dir.glob("*.log")}


def _logs_since(run_dir: Path, sizes: dict[str, int]) -> dict[str, str]:
    out = {}
    for path in run_dir.glob("*.log"):
        if path.name.startswith(LOG_PREFIX) or path.name == "web.log":
            with open(path, "rb") as handle:
                handle.seek(sizes.get(path.name, 0))
                out[path.name] = handle.read().decode("utf-8", "replace")
    return out


def _warm_up(inbound: Inbound, count: int, procs, say) -> tuple[list[int], list[list[dict[str, Any]]]]:
    """Admit an e-mail and a first name for ``count`` new contacts and wait until every one is applied.

    Returns the contacts and the deliveries (event lists) that admitted them.
    """
    from connectors.models import Execution
    from connectors.transitions import EXECUTION

    contacts = inbound.new_contacts(count)
    if not contacts:
        return [], []
    last = int(Execution.objects.order_by("-id").values_list("id", flat=True).first() or 0)
    events = ([inbound.event(c, "email", f"warm{c}@example.com") for c in contacts]
              + [inbound.event(c, "firstname", f"Warm{c}") for c in contacts])
    inbound.admit(events, batch=WARM_BATCH)
    say(f"capacity: warm-up, {len(events)} events for {count} contacts admitted; applying")
    wait_for(f"{len(events)} warm-up events applied", lambda: not Execution.objects.filter(
        org_id=inbound.org_id, pk__gt=last).exclude(state__in=EXECUTION.settled).exists(), procs)
    return contacts, [events[i:i + WARM_BATCH] for i in range(0, len(events), WARM_BATCH)]


def _drained() -> bool:
    from nexusflow.kernel.workers import open_work

    return not sum(open_work().values())


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stderr, width=140)
    table = Table(title=f"capacity plan {report['plan']['name']} ({report['plan']['path']})")
    for column in ("class", "offered", "done", "/s", "p95 ms", "p99 ms", "starved ms", "budgets"):
        table.add_column(column, justify="left" if column in ("class", "budgets") else "right")

    def num(value, digits=0):
        return "-" if value is None else f"{value:.{digits}f}"

    for name, figures in report["classes"].items():
        verdicts = [f"{key.split('.', 1)[1].replace('_at_most', '').replace('_at_least', '')} "
                    + ("met" if v["met"] else ("not measured" if v["met"] is None else f"missed by {v['gap']:.1f}"))
                    for key, v in report["budgets"].items() if key.startswith(name + ".")]
        table.add_row(name, str(figures["offered"]), str(figures["completed"]), num(figures["per_second"], 2),
                      num(figures["p95_ms"]), num(figures["p99_ms"]), num(figures["starvation_ms"]),
                      "; ".join(verdicts))
    console.print(table)
    gate = report["gate_lock_wait"]
    sampled, probe = gate["sampled"], gate["probe"]
    console.print(f"gate-lock wait: p95 {gate['p95_ms']:.1f} ms, p99 {gate['p99_ms']:.1f} ms (INNODB_LOCK_WAITS every "
                  f"{gate['sample_interval_ms']:.0f} ms: {gate['waits_observed']} waits on the gate rows, the longest at "
                  f"least {sampled['max_ms']:.0f} ms; probe: {probe['probes']} serving "
                  f"locks, p50 {probe['p50_ms']:.1f} ms, p99 {probe['p99_ms']:.1f} ms, max {probe['max_ms']:.1f} ms); "
                  f"server-wide row-lock waits {gate['server_row_lock_waits']}, {gate['server_row_lock_time_ms']} ms")
    waited = ", ".join(f"{t} {w['waits']}" for t, w in list(gate["all_waits_by_table"].items())[:6])
    console.print(f"row-lock waits seen in the run's database, by table: {waited or 'none'}")
    retries = {k: v for k, v in report["retries"].items() if v}
    console.print(f"deadlocks (Innodb_deadlocks delta): {report['deadlocks']}; retries: {retries or 'none'}")
    for key in ("gate_lock_wait.p95_ms_at_most", "gate_lock_wait.p99_ms_at_most", "deadlocks_at_most",
                "retries_at_most"):
        v = report["budgets"][key]
        console.print(f"{key}: {v['value']} vs {v.get('at_most')}: {v['verdict']}"
                      + (f" by {v['gap']:.1f}" if v["verdict"] == "missed" else ""))
    missed = [k for k, v in report["budgets"].items() if v["verdict"] != "met"]
    console.print(f"budgets met: {len(report['budgets']) - len(missed)} of {len(report['budgets'])}"
                  + (f"; not met: {', '.join(missed)}" if missed else ""))


def run_capacity_plan(plan_path: str | Path, *, as_json: bool = False) -> int:
    """Run the capacity plan at ``plan_path``; write ``<run dir>/capacity_report.json``; return the exit code.

    Returns 0 when the run finished (every budget is reported ``met``, ``missed`` with its gap, or ``not
    measured``; none is enforced) and 2 when it could not run: a bad plan (:class:`PlanError`, every
    problem printed), a set-up step or worker process that failed, or a database error. The run directory is
    ``NEXUS_BENCH_DIR`` or ``var/bench``; the databases are ``<main>_hot`` and ``<main>_hot_control``.

    Seed 003, "State machines" (the AccountServingGate hot-account capacity test), proof S003-RP-08.
    """
    try:
        plan = load_plan(plan_path, base=Path(settings.BASE_DIR))
    except PlanError as exc:
        print(f"capacity_plan: {exc}", file=sys.stderr)
        return 2
    cfg = settings.DATABASES["default"]
    main, control = f"{cfg['NAME']}_hot", f"{cfg['NAME']}_hot_control"
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    for old in RUN_DIR.glob(f"{LOG_PREFIX}-*.log"):
        old.unlink()
    env = {**os.environ, "NEXUS_DB_URL": db_url(cfg, main), "NEXUS_CONTROL_DB_URL": db_url(cfg, control),
           **service_secrets_env(RUN_DIR), "PYTHONUNBUFFERED": "1", "NEXUS_LOCK_ORDER": "log",
           "NEXUS_LOG_LEVEL": "INFO"}
    for name in ("NEXUS_FAILPOINTS", "NEXUS_WORKER_PROFILE_DIR"):
        env.pop(name, None)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {message}", file=sys.stderr)

    workload = plan["workload"]
    report: dict[str, Any] = {
        "plan": {"path": str(plan_path), "name": plan["name"], "accounts": plan["accounts"],
                 "forecast": plan.get("forecast"), "workload": workload},
        "machine": {"cpus": os.cpu_count()}, "databases": [main, control]}
    try:
        say(f"capacity: recreating databases {main}, {control}")
        recreate_databases(cfg, [main, control])
        _migrate_both(env)
        use_database(main, control)
        say("capacity: the demo webhook service (billing sandbox, packs, credentials, configuration, "
            "greenfield cutover, flows, web server)")
        inbound = inbound_start(env, say)
        try:
            with workers(ROLES, workload["workers_per_role"], LOG_PREFIX, env) as procs:
                warm, deliveries = _warm_up(inbound, workload["warm_contacts"], procs, say)
                report.update(_window(plan, cfg, main, Driver(plan, inbound, warm, deliveries), procs, say))
        finally:
            inbound.procs.stop_all()
    except (BenchError, DemoError, MySQLdb.Error, DatabaseError) as exc:
        print(f"capacity_plan: could not run: {exc}", file=sys.stderr)
        return 2
    report["budgets"] = budget_verdicts(plan, report)
    report["wall_seconds"] = time.monotonic() - started
    (RUN_DIR / REPORT_FILE).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    _print_table(report)
    say(f"capacity: report in {RUN_DIR / REPORT_FILE}")
    if as_json:
        print(json.dumps(report, default=str))
    return 0


def _progress() -> tuple:
    from django.db.models import Count

    from connectors.models import Execution, RemoteEffect
    from nexusflow.flows.models import FlowStepExecution

    return tuple(tuple(sorted(qs.values_list("state").annotate(n=Count("id")))) for qs in (
        Execution.objects.all(), RemoteEffect.objects.all(), FlowStepExecution.objects.all()))


def _window(plan: dict[str, Any], cfg: dict, main: str, driver: Driver, procs, say) -> dict[str, Any]:
    """Offer the plan's window, drain, and read every figure (classes, gate-lock wait, deadlocks, retries)."""
    workload = plan["workload"]
    inbound = driver.inbound
    before, status_before, sizes = marks(), _status(cfg), _log_sizes(RUN_DIR)
    sampler = GateLockSampler(cfg, main, workload["gate_lock_sample_ms"] / 1000)
    sampler.start()
    probe = GateProbe(inbound.org_id, [plan["accounts"]["inbound"], plan["accounts"]["outbound"]],
                      workload["gate_probe_per_second"])
    probe.start()
    say(f"capacity: offering the workload for {workload['duration_seconds']:g} s ("
        + ", ".join(f"{n} {window_units(plan, n)}" for n in DRIVEN_CLASSES) + ")")
    driver.run()
    say("capacity: offered; draining")
    drained = True
    try:
        drained = wait_for("the offered work drained", _drained, procs, progress=_progress,
                           stall_seconds=workload["drain_timeout_seconds"])
    except BenchError as exc:
        if "did not happen within" not in str(exc):
            raise
        drained = False
    for index in range(plan["workload"]["classes"]["halt"]["after_drain"]):
        unit = window_units(plan, "halt") + index
        driver.operate("halt", unit, time.monotonic())
        say(f"capacity: halt {unit} after the drain: {driver.offered.of('halt')[-1]['outcome']}")
    sampler.stop()
    probe.stop()
    status_after = _status(cfg)
    delta = {k: status_after.get(k, 0) - status_before.get(k, 0) for k in STATUS_COUNTERS}
    offered = driver.offered
    return {
        "classes": measure_classes(plan, offered, inbound.org_id, before),
        "gate_lock_wait": {**gate_lock_figures(sampler.waits_ms(), samples=sampler.samples, interval=sampler.interval,
                                               by_table=sampler.by_table(), status_delta=delta,
                                               probe_ms=probe.waits_ms),
                           "probe_not_serving": probe.not_serving,
                           **({"sampler_error": sampler.error} if sampler.error else {}),
                           **({"probe_error": probe.error} if probe.error else {})},
        "deadlocks": delta["Innodb_deadlocks"],
        "retries": count_retries(inbound.org_id, before, _logs_since(RUN_DIR, sizes)),
        "server": {"commits": delta["Com_commit"], "statements": delta["Questions"], "drained": drained},
    }


__all__ = ["CLASS_SQL", "Driver", "GateLockSampler", "class_figures", "count_retries", "gate_lock_figures",
           "marks", "measure_classes", "run_capacity_plan", "schedule"]
