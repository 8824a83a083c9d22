"""``make bench``: webhook events through the inbound chain and on to the billing sandbox.

The service is the demo's (``packs/demo/service.json``: the CRM's webhooks
into ``Contact`` records, ``Contact_Push_Customer_To_Billing`` pushing a
contact that becomes a customer to the billing sandbox), set up as the demo
does it (:func:`packs.demo.run.service_activate`) in the bench's databases,
with a real web server; every event is posted over HTTP to its ingress,
signed as the provider signs.

- **events_applied**: per point, ``2 x contacts`` events (an ``email``
  change for each of ``contacts`` new contacts, then a ``firstname`` change
  for each) are admitted first; then ``n`` ``connector`` and ``n``
  ``runtime`` workers apply them. The unit is one applied record change
  (an ``applied`` ApplicationResult: the record created or updated in the
  Runtime transaction). No event makes a contact a customer, so no push.
- **effects_confirmed**: per point, one ``lifecyclestage = customer`` event
  for each of the first contacts of the same point of ``events_applied``
  (they have an e-mail and a first name); then ``n`` workers of each role the chain needs
  (``connector``, ``runtime``, ``flow``, ``egress``) apply it, run the
  after-save Flow and push the customer to the billing sandbox. The unit is
  one RemoteEffect ``finalized`` (the provider confirmed the create and the
  link and mirror writeback committed); the point waits until every effect
  is finalized and every Flow run it started ended, until no work is left,
  or until no effect was confirmed for :data:`STALL_SECONDS`.
- **latency**: admission (the signed POST's time at the client) and event ->
  applied (an Event's ``created_at`` to its ApplicationResult's
  ``created_at``) while single-event deliveries arrive on a fixed schedule and
  two workers per role of ``events_applied`` run; admission -> confirmed
  effect (:func:`effect_latency`) the same way with two workers per role of
  ``effects_confirmed``.

A point's span runs from its first ExecutionAttempt (the first unit started)
to its last completed Execution (``events_applied``) or finalized
RemoteEffect (``effects_confirmed``), read from the rows.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from nexusflow.kernel.net import free_local_port
from packs.bench.measure import (
    RUN_DIR,
    WORKER_COUNTS,
    BenchError,
    latency_ms,
    open_loop,
    point,
    server_counters,
    wait_for,
    workers,
    workers_started,
)
from packs.demo.common import web_server_argv
from packs.demo.run import (
    SERVICE_FILE,
    Processes,
    TimedPoster,
    _wait_http,
    ingress_url,
    service_activate,
    start_billing_sandbox,
)
from packs.hubspot.fixtures.make_demo_webhooks import (
    APP_ID,
    BASE_OCCURRED_AT_MS,
    PORTAL_ID,
    PROPERTY_CHANGE,
    SUBSCRIPTION_IDS,
)
from packs.hubspot.sender import Delivery

#: Contacts per point at scale 1: ``events_applied`` posts two events for each (600 events, the django-q2
#: series' 600 tasks), ``effects_confirmed`` one for each of the first ``EFFECT_CONTACTS`` of them (the DBOS
#: push series pushes as many). A point is long enough that starting its worker processes (about 0.7 s of
#: CPU each, four roles times the worker count, on two cores) is not most of it.
CONTACTS, EFFECT_CONTACTS = 300, 200
#: Events per POST in the throughput series (the provider batches up to 100).
BATCH = 20
#: Single-event deliveries of the latency measurement at scale 1.
LATENCY_EVENTS = 150
#: Customer events (one per new contact, one per delivery) of the admission -> confirmed effect latency at scale 1.
LATENCY_EFFECTS = 100
#: An ``effects_confirmed`` point stops waiting when no effect was confirmed for this long (seconds).
STALL_SECONDS = 15.0
APPLY_ROLES = ("connector", "runtime")
EFFECT_ROLES = ("connector", "runtime", "flow", "egress")
#: Contacts get object ids from here up, one range per point, so no two points share a record or a lane.
FIRST_OBJECT_ID = 5_000_000


@dataclass
class Inbound:
    """The demo service serving in the bench's databases: its ingress URL, signing secret and processes.

    ``procs`` holds the billing sandbox and the web server; ``objects`` and
    ``events`` count the object ids and event ids handed out so far, so every
    contact and event of the run is new.
    """

    service: dict
    url: str
    secret: bytes
    procs: Processes
    objects: int = FIRST_OBJECT_ID
    events: int = 0

    @property
    def org_id(self) -> str:
        return self.service["org_id"]

    def new_contacts(self, count: int) -> list[int]:
        """``count`` object ids never used before in this run."""
        first, self.objects = self.objects, self.objects + count
        return list(range(first, first + count))

    def event(self, object_id: int, prop: str, value: str) -> dict[str, Any]:
        """One ``contact.propertyChange`` event as the provider sends it, with a new ``eventId``.

        ``occurredAt`` grows with the event id, so a later event of a
        contact's property is also later in its source order.
        """
        self.events += 1
        return {"eventId": self.events, "subscriptionId": SUBSCRIPTION_IDS[prop], "portalId": PORTAL_ID,
                "appId": APP_ID, "occurredAt": BASE_OCCURRED_AT_MS + self.events, "subscriptionType": PROPERTY_CHANGE,
                "attemptNumber": 0, "objectId": object_id, "propertyName": prop, "propertyValue": value,
                "changeSource": "API"}

    def admit(self, events: list[dict[str, Any]], *, batch: int = BATCH) -> list[float]:
        """POST ``events`` in deliveries of ``batch``, in order; return each request's seconds.

        Raises:
            BenchError: a delivery was not admitted (any answer but 202).
            DemoError: a request failed below HTTP.
        """
        times = []
        with TimedPoster(url=self.url, secret=self.secret) as poster:
            for i in range(0, len(events), batch):
                times.append(self.post(poster, events[i:i + batch]))
        return times

    def post(self, poster: TimedPoster, events: list[dict[str, Any]]) -> float:
        """POST ``events`` as one delivery through ``poster``; return the request's seconds.

        Raises:
            BenchError: the answer was not 202 (admitted).
        """
        status, seconds = poster.post(Delivery(body=events))
        if status != 202:
            raise BenchError(f"a delivery of {len(events)} events was answered {status}, not 202 "
                             f"(var/bench/web.log)")
        return seconds


def inbound_start(env: dict, say) -> Inbound:
    """Start the billing sandbox, make the demo service serve and start its web server; return the handle.

    ``env`` is the bench's environment including
    :func:`packs.demo.run.service_secrets_env`. The caller stops
    ``Inbound.procs`` (``stop_all``) when done.

    Raises:
        DemoError: a set-up step failed or the web server did not answer.
    """
    service = json.loads(SERVICE_FILE.read_text(encoding="utf-8"))
    procs = Processes()
    try:
        billing_url = start_billing_sandbox(procs, env=env, run_dir=RUN_DIR)
        service_activate(service, env=env, run_dir=RUN_DIR, billing_url=billing_url, say=lambda m: say(f"bench: {m}"))
        port = free_local_port()
        procs.start("web", web_server_argv(port, workers=2), env, RUN_DIR)
        base = f"http://127.0.0.1:{port}"
        _wait_http(base + "/api/v2/health/")
    except BaseException:
        procs.stop_all()
        raise
    return Inbound(service=service, url=ingress_url(service, base),
                   secret=env["NEXUS_DEMO_WEBHOOK_SECRET"].encode(), procs=procs)


# --------------------------------------------------------------------------------------------------------------
# Reading a point from the rows
# --------------------------------------------------------------------------------------------------------------

def _max_id(model) -> int:
    return int(model.objects.order_by("-id").values_list("id", flat=True).first() or 0)


def _executions_after(org_id: str, execution_id: int):
    from connectors.models import Execution

    return Execution.objects.filter(org_id=org_id, pk__gt=execution_id)


def _settled(org_id: str, execution_id: int) -> bool:
    from connectors.transitions import EXECUTION

    return not _executions_after(org_id, execution_id).exclude(state__in=EXECUTION.settled).exists()


def _first_claim(org_id: str, execution_id: int):
    from connectors.models import ExecutionAttempt

    return (ExecutionAttempt.objects.filter(org_id=org_id, execution_id__gt=execution_id)
            .order_by("created_at").values_list("created_at", flat=True).first())


def _applied(org_id: str, execution_id: int) -> tuple[int, Any]:
    """``(applied ApplicationResults, last completion time)`` of the Executions after ``execution_id``."""
    from django.db.models import Max

    from runtime_outbox.models import ApplicationResult

    done = _executions_after(org_id, execution_id).filter(state="completed")
    results = list(done.values_list("runtime_receipt_id", flat=True))
    applied = ApplicationResult.objects.filter(org_id=org_id, pk__in=results, outcome="applied").count()
    return applied, done.aggregate(last=Max("updated_at"))["last"]


# --------------------------------------------------------------------------------------------------------------
# The series
# --------------------------------------------------------------------------------------------------------------

def events_applied_series(cfg: dict, env: dict, inbound: Inbound, contacts: int, say
                          ) -> tuple[list[dict[str, Any]], dict[int, list[int]]]:
    """Webhook events -> applied record changes per second with 1, 2 and 4 workers per role of :data:`APPLY_ROLES`.

    Per point ``2 x contacts`` events are admitted over HTTP first (their
    admission rate is the point's ``admitted_per_second``), then the workers
    apply them. Returns the points (:func:`packs.bench.measure.point`, plus
    ``admitted_per_second``) and the contacts of each point by worker count,
    for :func:`effects_confirmed_series`.

    Raises:
        BenchError: a delivery was refused, a worker died, or the point did not settle in time.
    """
    from connectors.models import Execution

    points, made = [], {}
    for n in WORKER_COUNTS:
        objects = made[n] = inbound.new_contacts(contacts)
        events = ([inbound.event(o, "email", f"bench{o}@example.com") for o in objects]
                  + [inbound.event(o, "firstname", f"Bench{o}") for o in objects])
        last = _max_id(Execution)
        began = time.perf_counter()
        inbound.admit(events)
        admitted = len(events) / (time.perf_counter() - began)
        say(f"bench: events -> applied, {n} worker(s) per role {'/'.join(APPLY_ROLES)}: {len(events)} events "
            f"({admitted:.0f}/s admitted)")
        before = server_counters(cfg)
        try:
            with workers(APPLY_ROLES, n, f"apply-{n}", env) as procs:
                wait_for(f"{len(events)} events applied", lambda last=last: _settled(inbound.org_id, last), procs)
        finally:
            after = server_counters(cfg)
        applied, finished = _applied(inbound.org_id, last)
        span = (finished - _first_claim(inbound.org_id, last)).total_seconds()
        points.append(point(n, applied, span, before, after, admitted_per_second=admitted))
        if applied != len(events):
            say(f"bench: {len(events) - applied} of {len(events)} events were not applied as record changes")
    return points, made


def _effects(org_id: str, effect_id: int):
    from connectors.models import RemoteEffect

    return RemoteEffect.objects.filter(org_id=org_id, pk__gt=effect_id)


def _chain_done(org_id: str, effect_id: int, run_id: int, expected: int) -> bool:
    """Every expected effect finalized and every Flow run since ``run_id`` ended, or no work left anywhere."""
    from nexusflow.flows.models import FlowRun
    from nexusflow.flows.transitions import FLOW_RUN
    from nexusflow.kernel.workers import open_work

    if not sum(open_work().values()):
        return True
    finalized = _effects(org_id, effect_id).filter(state="finalized").count()
    return finalized >= expected and not FlowRun.objects.filter(org_id=org_id, pk__gt=run_id).exclude(
        state__in=FLOW_RUN.terminal).exists()


def effects_confirmed_series(cfg: dict, env: dict, inbound: Inbound, contacts: dict[int, list[int]], say
                             ) -> list[dict[str, Any]]:
    """Webhook events -> confirmed remote effects per second with 1, 2 and 4 workers per role of :data:`EFFECT_ROLES`.

    ``contacts`` maps each worker count to the contacts :func:`events_applied_series`
    made for it; each gets one ``lifecyclestage = customer`` event. Returns one
    :func:`packs.bench.measure.point` per worker count (``units``: the
    finalized effects), plus ``events`` (posted), ``unconfirmed`` (events
    without a finalized effect) and ``stalled`` (the point stopped waiting
    after :data:`STALL_SECONDS` without a confirmation; the workers' logs say why).

    Raises:
        BenchError: a delivery was refused, a worker died, or the chain did not settle in time.
    """
    from django.db.models import Max

    from connectors.models import Execution, RemoteEffect
    from nexusflow.flows.models import FlowRun

    points = []
    for n in WORKER_COUNTS:
        events = [inbound.event(o, "lifecyclestage", "customer") for o in contacts[n]]
        last_execution, last_effect, last_run = _max_id(Execution), _max_id(RemoteEffect), _max_id(FlowRun)
        inbound.admit(events)
        say(f"bench: events -> confirmed effects, {n} worker(s) per role {'/'.join(EFFECT_ROLES)}: "
            f"{len(events)} events")
        finalized = _effects(inbound.org_id, last_effect).filter(state="finalized")
        before = server_counters(cfg)
        try:
            with workers(EFFECT_ROLES, n, f"effect-{n}", env) as procs:
                expected = len(events)
                settled = wait_for(f"{expected} confirmed effects",
                                   lambda e=last_effect, r=last_run, n=expected: _chain_done(inbound.org_id, e, r, n),
                                   procs,
                                   progress=finalized.count, stall_seconds=STALL_SECONDS)
        finally:
            after = server_counters(cfg)
        units = finalized.count()
        finished = finalized.aggregate(last=Max("updated_at"))["last"]
        span = (finished - _first_claim(inbound.org_id, last_execution)).total_seconds() if units else 0.0
        points.append(point(n, units, span, before, after, events=len(events), unconfirmed=len(events) - units,
                            stalled=not settled))
        if units != len(events):
            say(f"bench: {len(events) - units} of {len(events)} events ended without a confirmed effect"
                + ("" if settled else f" (no effect confirmed for {STALL_SECONDS:.0f} s: stopped waiting)"))
    return points


#: Events applied (not measured) once the latency point's workers run, before its open loop starts.
LATENCY_WARM_UP_EVENTS = 4


def inbound_latency(inbound: Inbound, env: dict, *, rate: float, events: int, say) -> dict[str, dict[str, Any]]:
    """Admission and event -> applied latency (ms) under an open-loop arrival of ``rate`` events/s.

    Each event (an ``email`` change of a new contact, one per delivery) is
    posted on a fixed schedule while two workers per role of
    :data:`APPLY_ROLES` run, from when they all started and applied
    :data:`LATENCY_WARM_UP_EVENTS` unmeasured events. Admission is the POST's time at the client;
    event -> applied is the Event's ``created_at`` (admission) to its
    ApplicationResult's ``created_at`` (the Runtime transaction that changed
    the record). Returns ``{"admission": {...}, "event_to_applied": {...}}``,
    each ``{"arrival_per_second", "units", "workers", "p50_ms", "p95_ms", "p99_ms"}``.

    Raises:
        BenchError: a delivery was refused, a worker died, or the events did not settle in time.
    """
    from connectors.models import Execution
    from runtime_outbox.models import ApplicationResult

    say(f"bench: admission and event -> applied latency, {events} events at {rate:.0f}/s, 2 workers per role")
    objects = inbound.new_contacts(events)
    admission: list[float] = []
    with workers(APPLY_ROLES, 2, "apply-latency", env) as procs, \
            TimedPoster(url=inbound.url, secret=inbound.secret) as poster:
        # The latency of running workers: the open loop starts once every worker logged its start and a few
        # warm-up events were applied (not measured), as the Flow latency point does; before, the first
        # events also waited for the worker processes to start.
        warm = _max_id(Execution)
        for o in inbound.new_contacts(LATENCY_WARM_UP_EVENTS):
            inbound.post(poster, [inbound.event(o, "email", f"warm{o}@example.com")])
        wait_for("the apply workers' start and the warm-up events", lambda: workers_started(procs)
                 and _settled(inbound.org_id, warm), procs)
        last = _max_id(Execution)
        open_loop(events, rate, lambda i: admission.append(
            inbound.post(poster, [inbound.event(objects[i], "email", f"late{objects[i]}@example.com")])))
        wait_for(f"{events} events applied", lambda: _settled(inbound.org_id, last), procs)
    rows = list(_executions_after(inbound.org_id, last).filter(state="completed")
                .values_list("projection__event__created_at", "runtime_receipt_id"))
    results = dict(ApplicationResult.objects.filter(org_id=inbound.org_id, pk__in=[r for _, r in rows])
                   .values_list("id", "created_at"))
    applied = [(results[r] - created).total_seconds() * 1000 for created, r in rows if r in results]
    common = {"arrival_per_second": rate, "workers": 2}
    return {"admission": {**common, "units": len(admission), **latency_ms([s * 1000 for s in admission])},
            "event_to_applied": {**common, "units": len(applied), **latency_ms(applied)}}


# --------------------------------------------------------------------------------------------------------------
# Admission -> confirmed effect
# --------------------------------------------------------------------------------------------------------------

def confirmed_effect_latencies(*, org_id: str, execution_id: int, object_name: str) -> dict[int, float | None]:
    """Admission -> confirmed effect (ms) of the Event of each Execution after ``execution_id``: Event id -> ms.

    The chain is read by ids and keys from the rows, never by a time window:
    the Execution's Projection's Event; the Execution's ApplicationResult
    (``applied``) and its ``result["record_key"]``; that record's first Flow
    run (``trigger_object_name`` ``object_name``, lowest ``record_version``:
    the save that admitted it); the OutboundCommands the run authored
    (``origin_flow_run_id``) and their RemoteEffects. The latency is the
    first ``finalized`` effect's ``updated_at`` (the finalization
    transaction) minus the Event's ``created_at`` (the admission
    transaction), in milliseconds; ``None`` when the chain has no finalized
    effect (not applied, no run, no effect, or not finalized). Meant for
    events of records never pushed before, so that the record's first run
    is the event's. Raises nothing.
    """
    from connectors.models import Execution, RemoteEffect
    from nexusflow.flows.models import FlowRun
    from runtime_outbox.models import ApplicationResult, OutboundCommand

    units = list(Execution.objects.filter(org_id=org_id, pk__gt=execution_id).order_by("id")
                 .values_list("projection__event_id", "projection__event__created_at", "runtime_receipt_id"))
    record_of = {result_id: result.get("record_key") for result_id, result in ApplicationResult.objects.filter(
        org_id=org_id, pk__in=[r for _, _, r in units if r is not None], outcome="applied").values_list("id", "result")}
    first_run: dict[str, int] = {}
    for run_id, record_key in (FlowRun.objects.filter(org_id=org_id, trigger_object_name=object_name,
                                                      record_key__in=set(record_of.values()))
                               .order_by("record_version", "id").values_list("id", "record_key")):
        first_run.setdefault(record_key, run_id)
    run_of_command = dict(OutboundCommand.objects.filter(org_id=org_id, origin_flow_run_id__in=list(first_run.values()))
                          .values_list("id", "origin_flow_run_id"))
    confirmed_at: dict[int, Any] = {}
    for command_id, finalized_at in (RemoteEffect.objects.filter(org_id=org_id, command_id__in=list(run_of_command),
                                                                 state="finalized")
                                     .order_by("updated_at").values_list("command_id", "updated_at")):
        confirmed_at.setdefault(run_of_command[command_id], finalized_at)
    latencies: dict[int, float | None] = {}
    for event_id, admitted_at, result_id in units:
        finalized_at = confirmed_at.get(first_run.get(record_of.get(result_id)))
        latencies[event_id] = None if finalized_at is None else (finalized_at - admitted_at).total_seconds() * 1000
    return latencies


def effect_latency_figures(latencies: dict[int, float | None], *, rate: float, workers: int) -> dict[str, Any]:
    """The report entry of :func:`confirmed_effect_latencies` (Event id -> ms or ``None``).

    Returns ``{"arrival_per_second", "workers", "units", "unconfirmed", "p50_ms", "p95_ms", "p99_ms"}``:
    ``units`` counts the events with a confirmed effect, ``unconfirmed`` the others; the percentiles
    (:func:`packs.bench.measure.latency_ms`, nearest rank, ms) are of the confirmed ones (zeros when none).
    """
    confirmed = [ms for ms in latencies.values() if ms is not None]
    return {"arrival_per_second": rate, "workers": workers, "units": len(confirmed),
            "unconfirmed": len(latencies) - len(confirmed), **latency_ms(confirmed)}


def effect_latency(inbound: Inbound, env: dict, *, rate: float, events: int, say) -> dict[str, dict[str, Any]]:
    """Admission -> confirmed effect latency (ms) under an open-loop arrival of ``rate`` customer events/s.

    Two workers of each role of :data:`EFFECT_ROLES` run throughout. First
    ``events`` new contacts are made (an ``email`` and a ``firstname`` event
    each, admitted in deliveries of :data:`BATCH`) and applied, and every
    worker has started; then one ``lifecyclestage = customer`` event per
    contact, one per delivery, is posted on a fixed schedule, and the chain
    runs on as in :func:`effects_confirmed_series` (every effect finalized
    and every Flow run ended, no work left, or nothing confirmed for
    :data:`STALL_SECONDS`). Each event's latency is
    :func:`confirmed_effect_latencies`'. Returns
    ``{"admission_to_confirmed_effect": {**effect_latency_figures(...), "stalled": bool}}``,
    or ``{}`` (the figure not measured; ``say`` tells why) when no event got a confirmed effect.

    Raises:
        BenchError: a delivery was refused, a worker died, or the contacts or the chain did not settle in time.
        DemoError: a request failed below HTTP.
    """
    from connectors.models import Execution, RemoteEffect
    from nexusflow.flows.models import FlowRun

    say(f"bench: admission -> confirmed effect latency, {events} customer events at {rate:.1f}/s, 2 workers per "
        f"role {'/'.join(EFFECT_ROLES)}")
    objects = inbound.new_contacts(events)
    contacts = ([inbound.event(o, "email", f"effect{o}@example.com") for o in objects]
                + [inbound.event(o, "firstname", f"Effect{o}") for o in objects])
    with workers(EFFECT_ROLES, 2, "effect-latency", env) as procs:
        last = _max_id(Execution)
        inbound.admit(contacts)
        wait_for(f"{len(contacts)} contact events applied and {len(procs.procs)} workers started",
                 lambda: _settled(inbound.org_id, last) and workers_started(procs), procs)
        last_execution, last_effect, last_run = _max_id(Execution), _max_id(RemoteEffect), _max_id(FlowRun)
        with TimedPoster(url=inbound.url, secret=inbound.secret) as poster:
            open_loop(events, rate, lambda i: inbound.post(
                poster, [inbound.event(objects[i], "lifecyclestage", "customer")]))
        finalized = _effects(inbound.org_id, last_effect).filter(state="finalized")
        settled = wait_for(f"{events} confirmed effects",
                           lambda: _chain_done(inbound.org_id, last_effect, last_run, events), procs,
                           progress=finalized.count, stall_seconds=STALL_SECONDS)
    latencies = confirmed_effect_latencies(org_id=inbound.org_id, execution_id=last_execution,
                                           object_name=inbound.service["push"]["object"])
    figures = effect_latency_figures(latencies, rate=rate, workers=2)
    if figures["unconfirmed"]:
        say(f"bench: {figures['unconfirmed']} of {len(latencies)} customer events ended without a confirmed effect"
            + ("" if settled else f" (no effect confirmed for {STALL_SECONDS:.0f} s: stopped waiting)"))
    if not figures["units"]:
        say("bench: admission -> confirmed effect not measured: no event got a confirmed effect")
        return {}
    return {"admission_to_confirmed_effect": {**figures, "stalled": not settled}}
