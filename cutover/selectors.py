"""Cutover reads (no locks), org-scoped.

``gates_halted_for_cutover`` is the evidence query of ``cutover_in_progress``
(``cutover/reasons.py``; seed 003 "Operational liveness and maintenance
admission").
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from django.db import connections
from django.db.models import Count, Max, QuerySet

from connectors.models import GateTransitionEvidence
from connectors.v1.models import V1Event, V1ProviderCall, V1SchedulerLease, V1StreamCursor, V1TransportKey

from .models import CutoverEvidence, CutoverReadinessCertificate


def gates_halted_for_cutover(*, org_id: str, reason_code: str | None = None,
                             account_key: str | None = None) -> QuerySet[GateTransitionEvidence]:
    """Gate transition evidence of the gates that are not serving, newest first.

    Each row names the gate (with its current state and ``reason_code``), the
    step it took and the CutoverEvidence id/digest proving it; the attempt's
    CutoverDecision lives in the ``control`` database under the same org.

    Args:
        reason_code: only gates carrying this code (default: any code).
        account_key: only this account's gate.
    """
    qs = GateTransitionEvidence.objects.filter(org_id=org_id, gate__org_id=org_id).select_related("gate")
    qs = qs.filter(gate__reason_code=reason_code) if reason_code else qs.exclude(gate__reason_code="")
    if account_key is not None:
        qs = qs.filter(gate__account_key=account_key)
    return qs.order_by("-id")


def preflight_refusals(*, org_id: str, reason_code: str | None = None) -> QuerySet[CutoverEvidence]:
    """``preflight_refusal`` evidence rows of ``org_id``, newest first; the evidence query of every preflight code.

    Each row's ``payload`` is ``{"attempt_key", "input_digest", "blockers": [{"reason_code", "subject",
    "detail"}]}`` (seed 003 "Operational liveness and maintenance admission").

    Args:
        reason_code: only refusals with at least one blocker carrying this code.
    """
    qs = CutoverEvidence.objects.filter(org_id=org_id, kind="preflight_refusal").order_by("-id")
    if reason_code is None:
        return qs
    return qs.filter(payload__contains={"blockers": [{"reason_code": reason_code}]})


def readiness_certificates(*, org_id: str) -> QuerySet[CutoverReadinessCertificate]:
    """The readiness certificates of ``org_id``, newest first."""
    return CutoverReadinessCertificate.objects.filter(org_id=org_id).order_by("-id")


# --- measured V1 workload (seed 003 "Operational liveness and maintenance admission") ----------
def v1_event_states(*, org_id: str) -> dict[str, dict[str, int]]:
    """``{account_key: {state: count}}`` of the V1 events of ``org_id`` (every state, accounts in key order)."""
    out: dict[str, dict[str, int]] = {}
    rows = (V1Event.objects.filter(org_id=org_id).values("account_key", "state").annotate(n=Count("id"))
            .order_by("account_key", "state"))
    for row in rows:
        out.setdefault(row["account_key"], {})[row["state"]] = row["n"]
    return out


def v1_event_payloads(*, org_id: str, account_key: str, route_key: str) -> Iterator[dict | None]:
    """The payload of every V1 event of one account route that is not ``quarantined``, in id order.

    A quarantined item never ran and never moves a high-water, so it is left out.
    """
    return (V1Event.objects.filter(org_id=org_id, account_key=account_key, route_key=route_key)
            .exclude(state="quarantined")
            .order_by("id").values_list("payload", flat=True).iterator(chunk_size=2000))


def v1_provider_call_states(*, org_id: str) -> dict[str, int]:
    """``{state: count}`` of the V1 provider calls of ``org_id``."""
    rows = V1ProviderCall.objects.filter(org_id=org_id).values("state").annotate(n=Count("id")).order_by("state")
    return {row["state"]: row["n"] for row in rows}


def v1_leases(*, org_id: str) -> dict[str, int]:
    """``{"scheduler_held": n, "events_leased": n}``: held V1 SchedulerLeases and V1 events carrying a lease owner."""
    return {"scheduler_held": V1SchedulerLease.objects.filter(org_id=org_id, state="held").count(),
            "events_leased": V1Event.objects.filter(org_id=org_id).exclude(lease_owner="").count()}


def v1_identity_counts(*, org_id: str) -> dict[str, int]:
    """``{"transport_keys": n, "stream_cursors": n}``: V1 transport identities to export and pulled-route cursors."""
    return {"transport_keys": V1TransportKey.objects.filter(org_id=org_id).count(),
            "stream_cursors": V1StreamCursor.objects.filter(org_id=org_id).count()}


def v1_retry_horizon(*, org_id: str) -> dt.datetime | None:
    """The latest ``next_attempt_at`` of a ``pending`` V1 event of ``org_id`` (a dependency deadline), or ``None``."""
    return V1Event.objects.filter(org_id=org_id, state="pending").aggregate(m=Max("next_attempt_at"))["m"]


def database_bytes(*, using: str = "default") -> int:
    """Data plus index bytes of every table of the ``using`` database (``information_schema``; an estimate).

    Raises:
        django.db.Error: the statistics cannot be read.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
                       "WHERE table_schema = DATABASE()")
        return int(cursor.fetchone()[0])


# --- V1 shutdown inventory (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", steps 2-5) ------
def shutdown_blocks(*, org_id: str, reason_code: str | None = None) -> QuerySet[CutoverEvidence]:
    """``shutdown_blocked`` evidence rows of ``org_id``, newest first; the evidence query of every V1 shutdown code.

    Each row's ``payload`` is ``{"attempt_key", "phase", "blockers": [{"reason_code", "subject", "detail"}]}``.

    Args:
        reason_code: only rows with at least one blocker carrying this code.
    """
    qs = CutoverEvidence.objects.filter(org_id=org_id, kind="shutdown_blocked").order_by("-id")
    if reason_code is None:
        return qs
    return qs.filter(payload__contains={"blockers": [{"reason_code": reason_code}]})


def restore_attempts(*, org_id: str, reason_code: str | None = None) -> QuerySet:
    """RestoreAttempts of ``org_id`` (control database), newest first; the evidence query of every restore code.

    Each row's ``evidence["refusal"]`` holds the last refusal's ``[{"reason_code", "subject", "detail"}]``.

    Args:
        reason_code: only attempts whose last refusal carries this code.
    """
    from .models import RestoreAttempt

    qs = RestoreAttempt.objects.filter(org_id=org_id).order_by("-id")
    if reason_code is None:
        return qs
    return qs.filter(evidence__contains={"refusal": [{"reason_code": reason_code}]})


def link_adoption_refusals(*, org_id: str, reason_code: str | None = None) -> QuerySet[CutoverEvidence]:
    """``link_adoption_refused`` evidence rows of ``org_id`` (one per refused V1 record at certify), newest first.

    Each row's ``account_key`` is the record key and its ``payload`` ``{"contract", "record", "reason_code",
    "detail"}``; ``reason_code`` filters on it.
    """
    qs = CutoverEvidence.objects.filter(org_id=org_id, kind="link_adoption_refused").order_by("-id")
    return qs if reason_code is None else qs.filter(payload__reason_code=reason_code)


def v1_open_events(*, org_id: str, states: tuple[str, ...]) -> dict[str, list[int]]:
    """``{state: [event id, ...]}`` of the V1 events of ``org_id`` in ``states`` (ids ascending)."""
    out: dict[str, list[int]] = {}
    for pk, state in V1Event.objects.filter(org_id=org_id, state__in=states).order_by("id").values_list("id", "state"):
        out.setdefault(state, []).append(int(pk))
    return out


def v1_unresolved_calls(*, org_id: str, states: tuple[str, ...]) -> list[dict]:
    """``[{"id", "state", "call_site", "kind", "subject"}]`` of the V1 provider calls of ``org_id`` in ``states``."""
    return [{"id": int(c["id"]), "state": c["state"], "call_site": c["call_site"], "kind": c["kind"],
             "subject": c["subject"]}
            for c in V1ProviderCall.objects.filter(org_id=org_id, state__in=states).order_by("id")
            .values("id", "state", "call_site", "kind", "subject")]


def v1_call_sites(*, org_id: str) -> list[str]:
    """The distinct ``call_site`` of every V1 provider call of ``org_id``, sorted."""
    return sorted(set(V1ProviderCall.objects.filter(org_id=org_id).values_list("call_site", flat=True)))


def v1_held_scheduler_leases(*, org_id: str) -> list[V1SchedulerLease]:
    """The ``held`` V1 SchedulerLeases of ``org_id``, by name."""
    return list(V1SchedulerLease.objects.filter(org_id=org_id, state="held").order_by("name"))


def v1_generations() -> list[dict]:
    """Every V1 process generation (deployment-wide) with its worker registry facts, by id.

    Returns:
        ``[{"id", "worker_id", "release", "host", "pid", "terminated": bool, "termination_proof"}]``.
    """
    from connectors.models import V1ProcessGeneration, WorkerProcess

    generations = list(V1ProcessGeneration.objects.order_by("id"))
    workers = {w.worker_id: w for w in WorkerProcess.objects.filter(worker_id__in=[g.worker_id for g in generations])}
    out = []
    for g in generations:
        worker = workers.get(g.worker_id)
        out.append({"id": int(g.pk), "worker_id": g.worker_id, "release": g.release, "host": g.host, "pid": g.pid,
                    "registered": worker is not None,
                    "terminated": worker is not None and worker.terminated_at is not None,
                    "termination_proof": None if worker is None else worker.termination_proof})
    return out


def v1_transport_keys(*, org_id: str) -> Iterator[V1TransportKey]:
    """Every V1 transport identity of ``org_id`` in id order (without its body)."""
    return V1TransportKey.objects.filter(org_id=org_id).defer("body").order_by("id").iterator(chunk_size=2000)


def applied_migrations_digest() -> str:
    """The v2 digest of the applied migrations of the ``default`` database (the schema the V1 release runs on)."""
    from nexusflow.kernel import canonical_json
    from nexusflow.kernel.digests import digest_v2

    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT app, name FROM django_migrations ORDER BY app, name")
        rows = [list(r) for r in cursor.fetchall()]
    return digest_v2("cutover.schema", [("migrations", canonical_json.dumps(rows))]).hexdigest


# --- V1 restore point (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6) ----------------
#: The V1 facts a restore point binds by content (``{name: (table, org column)}``): stream cursors, transport and
#: idempotency keys (with the exported tombstones), provider-call/effect rows, account and gate bindings, the
#: certified ordering baselines. A restored copy and the live database must give the same digest for each.
V1_FACT_TABLES = {
    "v1_accounts": "connectors_v1account",
    "v1_stream_cursors": "connectors_v1streamcursor",
    "v1_transport_keys": "connectors_v1transportkey",
    "v1_provider_calls": "connectors_v1providercall",
    "receipt_admission_keys": "connectors_receiptadmissionkey",
    "account_serving_gates": "connectors_accountservinggate",
    "ordering_baselines": "cutover_orderingbaseline",
}


def _canonical_cell(value) -> object:
    """One column value as a JSON-stable value: bytes as ``{"hex"}``, dates/decimals as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"hex": bytes(value).hex()}
    if isinstance(value, float):
        return {"float": repr(value)}
    return {type(value).__name__: str(value)}


def _rows_digest(cursor, sql: str, params: tuple = ()) -> tuple[int, str]:
    """``(rows, sha256 hex)`` over the canonical JSON of every row ``sql`` returns, in its order."""
    import hashlib

    from nexusflow.kernel import canonical_json

    digest = hashlib.sha256(b"nexusflow.table-content\x00")
    count = 0
    cursor.execute(sql, params)
    while True:
        batch = cursor.fetchmany(2000)
        if not batch:
            break
        for row in batch:
            encoded = canonical_json.dumps([_canonical_cell(v) for v in row])
            digest.update(len(encoded).to_bytes(8, "big") + encoded)
            count += 1
    return count, digest.hexdigest()


def _order_by(cursor, schema: str, table: str) -> str:
    cursor.execute("SELECT column_name FROM information_schema.statistics WHERE table_schema = %s AND "
                   "table_name = %s AND index_name = 'PRIMARY' ORDER BY seq_in_index", (schema, table))
    columns = [r[0] for r in cursor.fetchall()]
    if not columns:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
                       "table_name = %s ORDER BY ordinal_position", (schema, table))
        columns = [r[0] for r in cursor.fetchall()]
    return ", ".join(f"`{c}`" for c in columns)


def open_consistent_snapshot(cursor) -> None:
    """Start a read-only ``REPEATABLE READ`` transaction with a consistent snapshot on ``cursor``'s connection."""
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")


def database_content_facts(cursor, *, schema: str, org_id: str | None = None,
                           include_tables: bool = True) -> dict:
    """Recompute the restore-point facts of one database through a DB-API ``cursor`` (no Django connection).

    The same function reads the live database (inside a consistent snapshot the caller opened) and the
    copy restored into an isolated server, so both sides are computed by the exact same code.

    Args:
        cursor: a MySQLdb cursor on the server holding ``schema``.
        schema: the database name.
        org_id: when given, also compute :data:`V1_FACT_TABLES` restricted to this org.
        include_tables: ``False`` leaves out the per-table rows and digests (``{}``).

    Returns:
        ``{"tables": {table: {"rows": int, "digest": sha256 hex}}, "migrations": [[app, name], ...],
        "v1_facts": {name: {"rows", "digest"}}}`` (``v1_facts`` only for tables present in ``schema``).

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6.
    """
    cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND "
                   "table_type = 'BASE TABLE' ORDER BY table_name", (schema,))
    tables = [r[0] for r in cursor.fetchall()]
    out: dict = {"tables": {}, "migrations": [], "v1_facts": {}}
    for table in tables if include_tables else ():
        order = _order_by(cursor, schema, table)
        rows, digest = _rows_digest(cursor, f"SELECT * FROM `{schema}`.`{table}` ORDER BY {order}")
        out["tables"][table] = {"rows": rows, "digest": digest}
    if "django_migrations" in tables:
        cursor.execute(f"SELECT app, name FROM `{schema}`.`django_migrations` ORDER BY app, name")
        out["migrations"] = [list(r) for r in cursor.fetchall()]
    if org_id is not None:
        for name, table in sorted(V1_FACT_TABLES.items()):
            if table in tables:
                order = _order_by(cursor, schema, table)
                rows, digest = _rows_digest(cursor, f"SELECT * FROM `{schema}`.`{table}` WHERE org_id = %s "
                                                    f"ORDER BY {order}", (org_id,))
                out["v1_facts"][name] = {"rows": rows, "digest": digest}
    return out


def v2_mutations_since(*, org_id: str, since: dt.datetime) -> dict[str, int]:
    """``{fact: count}`` of the V2 facts of ``org_id`` that show a V2 mutation after ``since`` (empty when none).

    Counted: ServingEpochs ever activated (``activated_at`` set or state ``active``/``draining``/``retired``),
    gates past ``v1_drained``, and Receipts, Events, Executions, RemoteEffects, ReceiptAdmissionKeys that
    point at a V2 Receipt, created at or after ``since`` (the V1ShutdownCertificate's ``created_at``).
    """
    from django.db.models import Q

    from connectors.models import (
        AccountServingGate,
        Event,
        Execution,
        Receipt,
        ReceiptAdmissionKey,
        RemoteEffect,
        ServingEpoch,
    )

    found = {
        "serving_epochs_activated": ServingEpoch.objects.filter(org_id=org_id).filter(
            Q(activated_at__isnull=False) | Q(state__in=("active", "draining", "retired"))).count(),
        "gates_past_v1_drained": AccountServingGate.objects.filter(
            org_id=org_id, state__in=("v2_validating", "v2_serving", "halting_v2", "v2_halted")).count(),
        "receipts": Receipt.objects.filter(org_id=org_id, received_at__gte=since).count(),
        "events": Event.objects.filter(org_id=org_id, created_at__gte=since).count(),
        "executions": Execution.objects.filter(org_id=org_id, created_at__gte=since).count(),
        "remote_effects": RemoteEffect.objects.filter(org_id=org_id, created_at__gte=since).count(),
        "admission_keys_with_receipt": ReceiptAdmissionKey.objects.filter(org_id=org_id,
                                                                          receipt__isnull=False).count(),
    }
    return {k: v for k, v in found.items() if v}


def epochs_ever_activated() -> int:
    """How many ServingEpochs of the deployment (every org) were ever activated (``activated_at`` set or
    state ``active``/``draining``/``retired``): after the first one, no V1 snapshot may be restored (S003-RP-50)."""
    from django.db.models import Q

    from connectors.models import ServingEpoch

    return ServingEpoch.objects.filter(Q(activated_at__isnull=False)
                                       | Q(state__in=("active", "draining", "retired"))).count()
