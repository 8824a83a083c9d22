"""The V1 -> V2 cutover journeys (``manage.py journeys run cutover-...``), on the demo service.

Each stages the demo service (``packs/demo/service.json``: the HubSpot webhook account and the billing
push account, the billing sandbox as a process) as a **V1** install (``cutover v1-install``), starts the web
server, the V2 workers and one V1 worker (``run_workers --role v1``), and drives the cutover with the real
``manage.py cutover`` commands while webhook deliveries arrive over HTTP:

``cutover-v1-to-v2``
    V1 accepts and applies the first third of the deliveries (and PATCHes an existing billing customer
    through ``v1_push``: its provenance marker makes the link adoptable). Then preflight, halt-v1 (the
    next third arrives at V1 and is answered 503 with Retry-After: retryable, nothing accepted), drain,
    stop (the V1 worker is terminated), certify (tombstones, ordering baselines, the V1 link adopted),
    restore-point (a real rehearsal on its own ``mariadbd``), validate and activate. The provider then
    re-sends everything it holds to the V2 route: the V1-accepted batches are answered from their
    tombstones and create no V2 work, the refused third and the rest are admitted; V2 continues in source
    order, the demo Flow pushes customers, one remote customer per contact. ``--events FILE`` takes any
    deliveries file in the demo's format; the report's ``provider`` holds the demo's summary fields and
    the seconds of every phase.
``cutover-restore``
    As far as validate; the candidate then fails on purpose (a scratch table beside it) and ``cutover
    restore`` brings the complete V1 point back; a new V1 generation serves again with unchanged cursors,
    transport idempotency (a V1-accepted batch is answered ``redelivered``) and ordering.
``cutover-abort``
    A certificate whose drain budget the halted service cannot meet: halt-v1's remeasure breaches it and
    aborts to ``v1_serving`` (exit 3, barriers reopened, new fences); V1 keeps serving.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx

from packs.demo.run import (
    ROOT,
    SERVICE_FILE,
    _inbound_field_map,
    _local_state,
    _summary,
    service_activate,
    service_secrets_env,
    start_billing_sandbox,
)
from packs.journeys import Harness, Journey, JourneyError, register

ATTEMPT = "journey-cutover-1"
PUSH_ACCOUNT = "billing-main"


# --- set-up ------------------------------------------------------------------------------------------------
def stage(h: Harness) -> None:
    """The billing sandbox, the demo service installed as V1, and a V1 worker beside the V2 ones."""
    service = json.loads(SERVICE_FILE.read_text(encoding="utf-8"))
    service["push"]["inbound_field_map"] = _inbound_field_map(service)
    h.env.update(service_secrets_env(h.run_dir))
    # V1's SchedulerLease outlives its last claim by this much; the drain waits it out (default 30 s).
    h.env["NEXUS_V1_LEASE_SECONDS"] = "5"
    billing_url = start_billing_sandbox(h.procs, env=h.env, run_dir=h.run_dir)
    service_activate(service, env=h.env, run_dir=h.run_dir, billing_url=billing_url, v1=True,
                     say=lambda m: h.say(f"journey: {m}"))
    h.values.update(service=service, billing_url=billing_url, extra_roles=("v1",), phases={})


@contextmanager
def phase(h: Harness, name: str):
    """Time one phase (wall clock, seconds) into ``values["phases"]``."""
    began = time.monotonic()
    yield
    h.values["phases"][name] = round(time.monotonic() - began, 3)
    h.say(f"journey: {name} took {h.values['phases'][name]:.1f} s")


def cutover(h: Harness, step: str, *extra: str, expect: int = 0, retry_on: int | None = None,
            timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run ``manage.py cutover STEP --org ORG --attempt ATTEMPT EXTRA...``; rerun while it exits ``retry_on``.

    Raises:
        JourneyError: it exited other than ``expect`` (after the retries).
    """
    org = h.values["service"]["org_id"]
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run([sys.executable, "manage.py", "cutover", step, "--org", org, "--attempt", ATTEMPT,
                               *extra], cwd=ROOT, env=h.env, capture_output=True, text=True)
        if done.returncode == retry_on and time.monotonic() < deadline:
            time.sleep(0.5)
            continue
        if done.returncode != expect:
            raise JourneyError(f"cutover {step} exited {done.returncode} (expected {expect}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        h.say(f"journey: cutover {step}: {(done.stdout or done.stderr).strip().splitlines()[0][:160]}")
        return done


def plan_document(*, drain_budget: int = 3600) -> dict:
    """The L2 cutover plan of the demo service (one pushed, order-dependent webhook route)."""
    from cutover.preflight import PHASES, cutover_reason_codes

    route = "crm-webhooks/contacts.webhook"
    budgets = {name: 3600 for name in PHASES}
    budgets["drain"] = drain_budget
    return {
        "plan_version": 1, "budgets_seconds": budgets,
        "throughput": {"barrier_close_seconds_per_barrier": 2, "drain_events_per_second": 1,
                       "provider_calls_per_second": 1, "baseline_partitions_per_second": 100,
                       "backup_bytes_per_second": 64 * 1024 * 1024, "restore_bytes_per_second": 32 * 1024 * 1024,
                       "validation_seconds_per_account": 30, "readback_seconds_per_gate": 1},
        "safety_percent": 200,
        "routes": {route: {"disposition": "v1_high_water"}},
        "halt_contracts": {"ingress": {route: "unacknowledged_retry"},
                           "root_outbound": {"owner": "crm-app-owners", "contract": "retryable_reject"},
                           "configuration": {"owner": "integration-admins", "contract": "frozen_generation"}},
        "alert_owners": {code: {"alert_owner": "integrations-oncall", "remediation_owner": "integrations-team"}
                         for code in cutover_reason_codes()},
    }


def _urls(h: Harness) -> tuple[str, str]:
    ingress = h.values["service"]["ingress"]
    path = f"ingress/{ingress['account_key']}/{ingress['channel']}/"
    return f"{h.web_base}/api/v1/{path}", f"{h.web_base}/api/v2/{path}"


def _send(h: Harness, deliveries, url: str, *, retry: bool = True) -> list:
    from packs.hubspot.sender import deliver_all

    try:
        return deliver_all(deliveries, url=url, secret=h.env["NEXUS_DEMO_WEBHOOK_SECRET"].encode(),
                           **({} if retry else {"sleep": lambda _seconds: None}))
    except httpx.HTTPError as exc:
        raise JourneyError(f"webhook to {url} failed: {exc}") from None


def _v1_idle() -> bool:
    from connectors.models import V1Event

    return not V1Event.objects.exclude(state__in=("completed", "failed", "quarantined")).exists()


def _stop_v1_worker(h: Harness) -> None:
    """``cutover stop`` terminated the V1 worker: drop it from the processes the harness watches."""
    h.procs.procs = [(name, proc) for name, proc in h.procs.procs
                     if not (name.startswith("worker-v1-") and proc.poll() is not None)]


def _to_v2_validating(h: Harness, *, while_halted=None) -> None:
    """The procedure from ``halt-v1`` to ``validate``: halt (then ``while_halted()``, e.g. deliveries that keep
    arriving), drain (V1 finishes its accepted work), stop, certify, restore-point, validate."""
    with phase(h, "halt_v1"):
        cutover(h, "halt-v1")
    if while_halted is not None:
        while_halted()
    with phase(h, "drain"):
        cutover(h, "drain", retry_on=3)
    with phase(h, "stop"):
        cutover(h, "stop", "--wait-seconds", "30")
        _stop_v1_worker(h)
    with phase(h, "certify"):
        cutover(h, "certify")
    with phase(h, "restore_point"):
        cutover(h, "restore-point", "--backup-dir", str(h.run_dir / "restore_points"))
    with phase(h, "validate"):
        cutover(h, "validate")


def _seed_v1_link(h: Harness, record_key: str, email: str) -> str:
    """The legacy state V1 pushes from: a billing customer whose id the record's mirror holds (written as the
    legacy system did), then one real V1 PATCH through ``v1_push``, which writes the provenance marker."""
    from django.db import transaction

    from nexusflow.kernel.scope import OrgScope
    from nexusflow.records.services import record_lock, record_write_mirror

    customer = httpx.post(h.values["billing_url"] + "/v1/customers", data={"email": email}, timeout=10,
                          headers={"Authorization": f"Bearer {h.env['NEXUS_DEMO_BILLING_API_KEY']}"}).json()["id"]
    org = OrgScope(h.values["service"]["org_id"])
    with transaction.atomic():
        locked = record_lock(org=org, object_name="Contact", record_key=record_key)
        record_write_mirror(org=org, record=locked, field=h.values["service"]["push"]["mirror_field"], value=customer)
    h.manage("v1_push", "--org", org.org_id, "--contract", "billing.customer", "--record", record_key)
    return customer


# --- cutover-v1-to-v2 --------------------------------------------------------------------------------------
def story_v1_to_v2(h: Harness) -> None:
    from connectors.models import Receipt, RemoteLink
    from nexusflow.flows.models import FlowRun
    from nexusflow.kernel import workers
    from nexusflow.records.models import Record
    from packs.hubspot.fixtures.make_demo_webhooks import expected_final_state
    from packs.hubspot.sender import load_deliveries

    service = h.values["service"]
    org = service["org_id"]
    events = h.values["options"].get("events") or str(ROOT / service["events"])
    try:
        deliveries = load_deliveries(events)
    except (OSError, ValueError) as exc:
        raise JourneyError(f"cannot read events file {events}: {exc}") from None
    third = max(1, len(deliveries) // 3)
    first, middle, last = deliveries[:third], deliveries[third:2 * third], deliveries[2 * third:]
    v1_url, v2_url = _urls(h)

    with phase(h, "v1_serving"):
        served = _send(h, first, v1_url)
        h.check("V1 accepted the first third (202, or 200 for a redelivery)",
                all(r.status in (200, 202) or 400 <= r.status < 500 for r in served),
                f"statuses {sorted({r.status for r in served})}")
        h.wait_until("V1 applied every accepted event", _v1_idle, timeout=120)
    seeded = None
    contact = Record.objects.filter(org_id=org, object_name="Contact", is_deleted=False).order_by("record_key").first()
    if contact is not None:
        seeded = (contact.record_key, _seed_v1_link(h, contact.record_key, "legacy@example.test"))
    with phase(h, "preflight"):  # with a representative restore rehearsal of the live database
        cutover(h, "preflight", "--plan", str(h.write_file("cutover_plan.json", plan_document())), "--rehearse")
    during: list = []

    def arriving() -> None:  # deliveries keep arriving while the cutover runs
        during.extend(_send(h, middle, v1_url, retry=False))
        # Bad input stays a definite 4xx (a bad signature, a malformed body) and a batch V1 accepted before is
        # answered 200 'redelivered'; everything else is refused retryably: nothing new is accepted while halted.
        fresh = [r for r in during if r.status != 200 and not 400 <= r.status < 500]
        h.check("deliveries during the cutover are answered 503 with Retry-After (retryable, nothing accepted)",
                bool(fresh) and all(r.status == 503 and r.retry_after for r in fresh)
                and not any(r.status == 202 for r in during), f"statuses {sorted({r.status for r in during})}")

    _to_v2_validating(h, while_halted=arriving)
    with phase(h, "activate"):
        cutover(h, "activate")
    h.manage("flow_deploy", "--org", org, *[str(ROOT / f) for f in service["flows"]])

    receipts = Receipt.objects.filter(org_id=org).count()
    with phase(h, "v2_redeliveries"):
        again = _send(h, first, v2_url)  # the provider re-sends what V1 accepted
    h.check("redeliveries of V1-accepted batches are answered from their tombstones",
            all(r.status in (200, 202) or 400 <= r.status < 500 for r in again)
            and Receipt.objects.filter(org_id=org).count() == receipts,
            f"statuses {sorted({r.status for r in again})}, V2 receipts {receipts} -> "
            f"{Receipt.objects.filter(org_id=org).count()}")
    with phase(h, "v2_serving"):
        rest = _send(h, middle + last, v2_url)
        counts = h.wait_idle()
    remote = httpx.get(h.values["billing_url"] + "/_sandbox/state", timeout=5).json()
    summary, failures, _dump = _summary(service, served + rest, remote, expected_final_state(deliveries), counts)
    # A contact V1 applied and V2 never changed again was never pushed (V1 pushes existing links only, and the
    # Flow runs from activation on): only contacts a Flow run saw must have their one remote customer.
    run_records = set(FlowRun.objects.filter(org_id=org).values_list("record_key", flat=True))
    object_of = {str(object_id): row["_record_key"] for object_id, row in _local_state(service).items()}
    failures = [f for f in failures if not (f.endswith("0 remote customers, expected 1")
                                            and object_of.get(_contact_of(f)) not in run_records)]
    # V1 applied in arrival order (the defect V2 retires): a partition whose newest event V1 applied keeps what
    # V1 left, and V2 never reorders below V1's high-water. Every other partition must end in source order.
    v1_newest = _partitions_newest_in(first, deliveries, service["push"]["inbound_field_map"])
    failures = [f for f in failures if _field_failure(f) not in v1_newest]
    h.check("the demo invariants hold (source order, one remote customer per pushed contact, no duplicate "
            "creates, nothing left open)", not failures, "; ".join(failures[:5]))
    h.check_equal("duplicate remote creates", summary["duplicate_remote_creates"], 0)
    links = {link.source_record_key: link.remote_id for link in RemoteLink.objects.filter(
        org_id=org, action_type="PushToConnector", state="active")}
    per_contact: dict[str, int] = {}
    for record_key in links:
        per_contact[record_key] = per_contact.get(record_key, 0) + 1
    h.check("at most one remote customer per contact", all(n == 1 for n in per_contact.values()))
    if seeded is not None:
        key, customer = seeded
        h.check_equal("the V1 push link was adopted at certify (V2 PATCHes the same customer)", links.get(key),
                      customer)
    h.check_equal("open work after the journey", sum(workers.open_work().values()), 0)
    h.values["summary"] = {**summary, "tombstone_answers": len(again), "answered_retryably": len(during)}


def _events(deliveries) -> list[dict]:
    return [e for d in deliveries if d.sign == "valid" and isinstance(d.body, list) for e in d.body
            if isinstance(e, dict) and e.get("propertyName")]


def _partitions_newest_in(part, deliveries, field_map: dict) -> set[tuple[str, str]]:
    """``(contact id, local field)`` of each partition whose newest event (occurredAt, eventId) is in ``part``."""
    def key(event):
        return event.get("occurredAt", 0), event.get("eventId", 0)

    newest: dict[tuple, dict] = {}
    for event in _events(deliveries):
        partition = (str(event.get("objectId")), event["propertyName"])
        if partition not in newest or key(event) > key(newest[partition]):
            newest[partition] = event
    mine = {(str(e.get("objectId")), e["propertyName"], e.get("eventId")) for e in _events(part)}
    return {(object_id, field_map.get(prop, prop)) for (object_id, prop), event in newest.items()
            if (object_id, prop, event.get("eventId")) in mine}


def _field_failure(failure: str) -> tuple[str, str] | None:
    """``(contact id, field)`` of a ``"contact <id>: <field>=..., latest event says ..."`` failure, else ``None``."""
    head, _, rest = failure.partition(": ")
    if "latest event says" not in rest or "=" not in rest:
        return None
    return head.removeprefix("contact ").strip(), rest.split("=", 1)[0].strip()


def _contact_of(failure: str) -> str:
    """The contact id a demo summary failure names (``"contact <id>: ..."``)."""
    return failure.split(":", 1)[0].removeprefix("contact ").strip()


def provider_report(h: Harness) -> dict:
    remote = httpx.get(h.values["billing_url"] + "/_sandbox/state", timeout=5).json()
    customers = remote.get("customers", [])
    return {"customers": len(customers),
            "creates": sum(c.get("create_requests", 0) for c in customers),
            "updates": sum(c.get("update_requests", 0) for c in customers),
            "summary": h.values.get("summary", {}), "phase_seconds": h.values.get("phases", {})}


# --- cutover-restore ---------------------------------------------------------------------------------------
def story_restore(h: Harness) -> None:
    from django.db import connection

    from connectors.models import AccountServingGate, V1Event, V1StreamCursor, V1TransportKey
    from cutover.models import RestoreAttempt
    from packs.hubspot.sender import load_deliveries

    service = h.values["service"]
    org = service["org_id"]
    everything = load_deliveries(ROOT / service["events"])
    deliveries, later = everything[:4], everything[4:8]
    v1_url, _ = _urls(h)
    with phase(h, "v1_serving"):
        accepted = _send(h, deliveries, v1_url)
        h.wait_until("V1 applied every accepted event", _v1_idle, timeout=120)
    with phase(h, "preflight"):
        cutover(h, "preflight", "--plan", str(h.write_file("cutover_plan.json", plan_document())))
    _to_v2_validating(h)

    def facts() -> dict:
        return {model.__name__: sorted(model.objects.filter(org_id=org).values_list("pk", flat=True))
                for model in (V1Event, V1StreamCursor, V1TransportKey)}

    before = facts()
    with connection.cursor() as cursor:  # the candidate fails: it leaves a table of its own behind
        cursor.execute("CREATE TABLE journey_failed_candidate (id INT PRIMARY KEY)")
    with phase(h, "full_restore"):
        cutover(h, "restore")
    h.check_equal("every gate serves V1 again", set(AccountServingGate.objects.filter(org_id=org)
                                                    .values_list("state", flat=True)), {"v1_serving"})
    h.check_equal("the RestoreAttempt completed", RestoreAttempt.objects.get(org_id=org, attempt_key=ATTEMPT).state,
                  "completed")
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND "
                       "table_name = 'journey_failed_candidate'")
        h.check_equal("the candidate's table is gone", cursor.fetchone()[0], 0)
    h.check_equal("V1 events, cursors and transport keys are the point's", facts(), before)
    h.procs.start("worker-v1-restored", [sys.executable, "manage.py", "run_workers", "--role", "v1"], h.env,
                  h.run_dir)
    again = _send(h, deliveries, v1_url)
    h.check("a V1-accepted batch is answered from V1 idempotency ('redelivered')",
            all(r.status == 200 and (r.response or {}).get("status") == "redelivered"
                for r, first in zip(again, accepted, strict=True) if first.status == 202))
    fresh = _send(h, later, v1_url)
    h.check("new deliveries are accepted by the new V1 generation", any(r.status == 202 for r in fresh),
            f"statuses {sorted({r.status for r in fresh})}")
    h.wait_until("the new V1 generation applied them", _v1_idle, timeout=120)
    h.check_equal("every V1 event completed or was refused for good",
                  set(V1Event.objects.filter(org_id=org).values_list("state", flat=True)) - {"failed", "quarantined"},
                  {"completed"})
    h.values["summary"] = {"v1_deliveries": len(deliveries) + len(later),
                           "accepted": sum(r.status == 202 for r in accepted + fresh)}


# --- cutover-abort -----------------------------------------------------------------------------------------
def story_abort(h: Harness) -> None:
    from connectors.models import AccountServingGate, V1MaintenanceBarrier
    from packs.hubspot.sender import load_deliveries

    service = h.values["service"]
    org = service["org_id"]
    deliveries = load_deliveries(ROOT / service["events"])
    v1_url, _ = _urls(h)
    with phase(h, "v1_serving"):
        _send(h, deliveries[:2], v1_url)
        h.wait_until("V1 applied every accepted event", _v1_idle, timeout=120)
    with phase(h, "preflight"):
        # A drain budget the accepted work fits now (nothing open); it will not once more arrives before the halt.
        cutover(h, "preflight", "--plan", str(h.write_file("cutover_plan.json", plan_document(drain_budget=2))))
    # V1 is stopped from claiming (its worker is paused) while more work is accepted: the halted service's
    # remeasured drain exceeds the certified budget.
    for name, proc in h.procs.procs:
        if name.startswith("worker-v1-"):
            proc.send_signal(signal.SIGSTOP)
    _send(h, deliveries[2:], v1_url)
    fences = {g.account_key: g.fence_token for g in AccountServingGate.objects.filter(org_id=org)}
    with phase(h, "halt_v1_abort"):
        refused = cutover(h, "halt-v1", expect=3)
    for name, proc in h.procs.procs:
        if name.startswith("worker-v1-"):
            proc.send_signal(signal.SIGCONT)
    h.check("halt-v1 reports the budget breach", "cutover_budget_exceeded" in refused.stderr, refused.stderr[-500:])
    gates = list(AccountServingGate.objects.filter(org_id=org))
    h.check_equal("every gate is back in v1_serving", {g.state for g in gates}, {"v1_serving"})
    h.check("every gate has a new fence", all(g.fence_token > fences[g.account_key] for g in gates))
    h.check_equal("the V1 maintenance barriers are open", set(V1MaintenanceBarrier.objects.filter(org_id=org)
                                                              .values_list("state", flat=True)), {"open"})
    h.wait_until("V1 applied every accepted event", _v1_idle, timeout=120)
    h.values["summary"] = {"deliveries": len(deliveries)}


register(Journey("cutover-v1-to-v2", "the demo service moves from V1 to V2 while webhooks keep arriving: retryable "
                 "answers during the cutover, tombstones after, one remote customer per contact",
                 stage, story_v1_to_v2, provider_report))
register(Journey("cutover-restore", "validation fails on purpose; cutover restore brings the V1 point back and V1 "
                 "serves again with unchanged cursors, idempotency and ordering", stage, story_restore,
                 provider_report))
register(Journey("cutover-abort", "a drain budget breach at halt-v1's remeasure aborts to v1_serving", stage,
                 story_abort, provider_report))

