"""Connector reads (no locks), org-scoped (ARCHITECTURE.md section 2, "selectors.py").

Worker scans are non-locking and cross-org: they return ``(org_id, id)``
pairs so the caller loads and locks each row under its own org scope
(ARCHITECTURE.md section 6, "Trusted scope").

The ``*_with_reason`` / ``*_for_reason`` selectors are the evidence queries of
the connector reason codes (``connectors/reasons.py``; seed 003 "Operational
liveness and maintenance admission"). Each takes the trusted ``org_id`` and an
optional ``reason_code`` filter and returns the rows an operator reads.
"""
from __future__ import annotations

import datetime as dt
import functools

from django.db import connection, connections
from django.db.models import QuerySet

from connectors import reasons, transitions
from connectors.models import (
    AccountServingGate,
    CredentialGenerationDispatchGate,
    DispatchPermit,
    Execution,
    ExecutionAttempt,
    ExecutionDependency,
    OrderingDecision,
    OrderingLane,
    PackGeneration,
    ProjectionWindow,
    Receipt,
    ReceiptComponent,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteEffectEvidence,
    RemoteLink,
    ServingEpoch,
)
from nexusflow.kernel.rows import fetch_where, row_shape

#: Worker scans list only work whose account gate serves the work's own epoch
#: (``row`` names the SQL alias carrying ``org_id``, ``account_key``, ``epoch_id``):
#: the locking unit would refuse anything else, and refused rows must never fill
#: a scan's page ahead of work that can move (one halted org starving the rest).
_SERVING_GATE_JOIN = ("JOIN connectors_accountservinggate g ON g.org_id = {row}.org_id"
                      " AND g.account_key = {row}.account_key AND g.state = 'v2_serving'"
                      " AND g.epoch_id = {row}.epoch_id ")


@functools.lru_cache(maxsize=256)
def frozen_row(model, *, pk: int, digest: str, org_id: str | None = None):
    """The ``model`` row ``pk`` whose ``digest`` is ``digest`` (and of ``org_id`` when given), read once per process.

    For rows whose digested document never changes after insert (a PackGeneration, a ServingEpoch): the key
    holds the digest the caller froze, so a held row can only be that document, and a row id reused by a
    recreated database never serves another. A miss is not kept. Only the digested columns may be used from
    it (a ServingEpoch's state is not: read that from its row). Callers do not change the returned row.

    Raises:
        model.DoesNotExist: no such row with that digest.
    """
    filters = {"pk": pk, "digest": digest} if org_id is None else {"org_id": org_id, "pk": pk, "digest": digest}
    return model.objects.get(**filters)


def push_rows_of_record(*, org_id: str, source_object: str, source_record_key: str, action_type: str,
                        link_key: str) -> tuple[list[RemoteLink], list[RemoteEffect]]:
    """The record's push rows under another link key, ascending id (read committed, no lock): its links of
    ``action_type`` that are not ``retired``, and its effects holding a create slot that are not ``finalized``.

    One statement per table built once per model (:mod:`nexusflow.kernel.rows`): what
    ``RemoteLink.objects.filter(...).exclude(state="retired").exclude(link_key=link_key)`` and the effects'
    ``filter(create_slot__isnull=False)`` read.

    Raises:
        InvalidIdentity: a key that is not canonical (before SQL).
    """
    link_shape, effect_shape = row_shape(RemoteLink), row_shape(RemoteEffect)
    source = {"org_id": org_id, "source_object": source_object, "source_record_key": source_record_key}
    key = RemoteLink._meta.get_field("link_key").get_db_prep_value(link_key, connection, prepared=False)
    where, params = link_shape.where({**source, "action_type": action_type})
    links = link_shape.fetch(link_shape.select_sql(f"{where} AND `state` <> %s AND `link_key` <> %s",
                                                   suffix=" ORDER BY `id`"), [*params, "retired", key])
    where, params = effect_shape.where(source)
    effects = effect_shape.fetch(effect_shape.select_sql(
        f"{where} AND `create_slot` IS NOT NULL AND `link_key` <> %s AND `state` <> %s", suffix=" ORDER BY `id`"),
        [*params, key, "finalized"])
    return links, effects


def serving_accounts(org_id: str):
    """Each ``v2_serving`` account of ``org_id`` with its document in the epoch its gate serves, as
    ``(account key, account document)``, in gate order (read committed, no lock; the epoch's document from
    :func:`frozen_row`, by the digest the gate froze). A gate without an epoch, or whose epoch digest does
    not match it, serves nothing (``serving_lock`` refuses it) and is left out."""
    for gate in fetch_where(AccountServingGate, {"org_id": org_id, "state": "v2_serving"}, order="`id`"):
        if gate.epoch_id is None:
            continue
        try:
            epoch = frozen_row(ServingEpoch, org_id=org_id, pk=gate.epoch_id, digest=gate.epoch_digest)
        except ServingEpoch.DoesNotExist:
            continue
        account = next((a for a in epoch.document["accounts"] if a["account_key"] == gate.account_key), None)
        if account is not None:
            yield gate.account_key, account


def served_push_contracts(org_id: str):
    """Every push contract a ``v2_serving`` account of ``org_id`` offers, as ``(pack generation, account
    document, contract document)``, in gate order (:func:`serving_accounts`; each pack generation's document
    from :func:`frozen_row`, by the digest the epoch froze)."""
    for _account_key, account in serving_accounts(org_id):
        if not account.get("push_contracts"):
            continue
        frozen = account["pack_generation"]
        pack = frozen_row(PackGeneration, pk=frozen["id"], digest=frozen["digest"])
        for contract in pack.document.get("push_contracts", []):
            if contract["contract_key"] in account["push_contracts"]:
                yield pack, account, contract


def _with_reason(qs: QuerySet, reason_code: str | None, field: str = "reason_code") -> QuerySet:
    return qs.filter(**{field: reason_code}) if reason_code else qs.exclude(**{field: ""})


def receipt_components_quarantined(*, org_id: str, reason_code: str | None = None,
                                   receipt_id: int | None = None) -> QuerySet[ReceiptComponent]:
    """Quarantined receipt items of ``org_id`` with their raw item, newest receipt first.

    Args:
        reason_code: only items with this code (default: every quarantined item).
        receipt_id: only items of this receipt.
    """
    qs = ReceiptComponent.objects.filter(receipt__org_id=org_id, disposition="quarantined").select_related("receipt")
    if receipt_id is not None:
        qs = qs.filter(receipt_id=receipt_id)
    return _with_reason(qs, reason_code).order_by("-receipt_id", "ordinal")


def ordering_decisions_superseded(*, org_id: str, reason_code: str | None = None,
                                  lane_id: int | None = None) -> QuerySet[OrderingDecision]:
    """Superseded-ordering decisions with their execution and the winning position.

    Args:
        reason_code: only decisions whose execution carries this code.
        lane_id: only decisions of this OrderingLane.
    """
    qs = OrderingDecision.objects.filter(org_id=org_id).select_related("execution", "lane")
    if lane_id is not None:
        qs = qs.filter(lane_id=lane_id)
    return _with_reason(qs, reason_code, "execution__reason_code").order_by("-id")


def serving_epochs_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[ServingEpoch]:
    """Serving epochs carrying a reason (rejected candidates), newest first."""
    return _with_reason(ServingEpoch.objects.filter(org_id=org_id), reason_code).order_by("-id")


def remote_effect_attempts_for_reason(*, org_id: str, reason_code: str | None = None,
                                      effect_id: int | None = None) -> QuerySet[RemoteEffectAttempt]:
    """Request/response evidence of the effects carrying a reason code.

    Rows carry ``response_status``, ``response_body``, ``error`` and the exact
    request, ordered by effect then attempt number.
    """
    qs = RemoteEffectAttempt.objects.filter(org_id=org_id).select_related("effect")
    if effect_id is not None:
        qs = qs.filter(effect_id=effect_id)
    return _with_reason(qs, reason_code, "effect__reason_code").order_by("effect_id", "attempt_number")


def dispatch_permits_abandoned(*, org_id: str, reason_code: str | None = None,
                               effect_id: int | None = None) -> QuerySet[DispatchPermit]:
    """Abandoned Permits (``closed_evidence`` holds the holder-termination proof) of effects with a reason."""
    qs = DispatchPermit.objects.filter(org_id=org_id, state="abandoned").select_related("attempt__effect")
    if effect_id is not None:
        qs = qs.filter(attempt__effect_id=effect_id)
    return _with_reason(qs, reason_code, "attempt__effect__reason_code").order_by("id")


def remote_effect_evidence_for_reason(*, org_id: str, reason_code: str | None = None,
                                      effect_id: int | None = None) -> QuerySet[RemoteEffectEvidence]:
    """Appended reconciliation evidence of the effects carrying a reason code, oldest first."""
    qs = RemoteEffectEvidence.objects.filter(org_id=org_id).select_related("effect")
    if effect_id is not None:
        qs = qs.filter(effect_id=effect_id)
    return _with_reason(qs, reason_code, "effect__reason_code").order_by("effect_id", "id")


def credential_gates_with_reason(*, org_id: str, reason_code: str | None = None
                                 ) -> QuerySet[CredentialGenerationDispatchGate]:
    """Credential dispatch gates of ``org_id`` carrying a reason code (revoked ones), by generation."""
    qs = CredentialGenerationDispatchGate.objects.filter(org_id=org_id).select_related("credential_generation")
    return _with_reason(qs, reason_code).order_by("credential_generation_id")


def credential_lane_pauses(*, org_id: str, now) -> dict[int, CredentialGenerationDispatchGate]:
    """Credential dispatch gates of ``org_id`` whose lane a provider rate limit pauses past ``now``.

    Returns ``{credential_generation_id: gate}``; each gate carries
    ``paused_until`` (database clock), ``pause_kind`` (``rate_limited`` or
    ``daily_limit``) and ``pause_status``. Seed 004 section 16.
    """
    qs = CredentialGenerationDispatchGate.objects.filter(org_id=org_id, paused_until__gt=now)
    return {int(gate.credential_generation_id): gate for gate in qs}


def remote_links_with_reason(*, org_id: str, reason_code: str | None = None,
                             link_key: str | None = None) -> QuerySet[RemoteLink]:
    """Remote links carrying a reason code (e.g. ``suspended_drift``)."""
    qs = RemoteLink.objects.filter(org_id=org_id)
    if link_key is not None:
        qs = qs.filter(link_key=link_key)
    return _with_reason(qs, reason_code).order_by("id")


def remote_links_of_effects_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[RemoteLink]:
    """The links (by ``link_key``) of effects quarantined with ``reason_code``: why PATCH was refused."""
    slots = _with_reason(RemoteEffect.objects.filter(org_id=org_id), reason_code).values("link_key")
    return RemoteLink.objects.filter(org_id=org_id, link_key__in=slots).order_by("id")


def remote_effects_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[RemoteEffect]:
    """Effects carrying ``reason_code`` (why a push was refused, parked or superseded), oldest first."""
    return _with_reason(RemoteEffect.objects.filter(org_id=org_id), reason_code).order_by("id")


def remote_link_evidence_for_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet:
    """The evidence rows of links carrying ``reason_code``: which drift surface, conflict or deletion, and when."""
    from connectors.models import RemoteLinkEvidence

    links = _with_reason(RemoteLink.objects.filter(org_id=org_id), reason_code).values("pk")
    return RemoteLinkEvidence.objects.filter(org_id=org_id, link__in=links).order_by("link_id", "id")


def remote_links_of_record_lineage(*, org_id: str, reason_code: str | None = None) -> QuerySet[RemoteLink]:
    """Links of the source records whose effects or links carry ``reason_code``: the old slot lineage to resolve."""
    from django.db.models import Q

    effects = _with_reason(RemoteEffect.objects.filter(org_id=org_id), reason_code)
    links = _with_reason(RemoteLink.objects.filter(org_id=org_id), reason_code)
    return (RemoteLink.objects.filter(org_id=org_id)
            .filter(Q(source_record_key__in=effects.values("source_record_key"))
                    | Q(source_record_key__in=links.values("source_record_key"))).order_by("id"))


def remote_effects_blocking_lane(*, org_id: str, reason_code: str | None = None) -> QuerySet[RemoteEffect]:
    """Quarantined effects that block the lane of effects carrying ``reason_code``.

    For ``prior_create_unresolved``: the earlier quarantined creates of the same
    link key, which must be resolved first.
    """
    held = _with_reason(RemoteEffect.objects.filter(org_id=org_id), reason_code)
    blocked = held.values("link_key")
    return (RemoteEffect.objects.filter(org_id=org_id, state="quarantined", link_key__in=blocked)
            .exclude(pk__in=held.values("pk")).order_by("link_key", "lane_sequence", "id"))


def candidate_lanes(now: dt.datetime, limit: int = 20) -> list[tuple[str, OrderingLane.Id]]:
    """Lanes with ready work that no live lease holds, oldest work first (non-locking).

    Ready work includes a waiting Execution whose dependency the lane's
    high-water now meets (the claim satisfies it under the lane lock).

    Args:
        now: the database clock; a lease whose ``lease_expires_at`` is not after it is dead.
        limit: most lanes returned.

    Only lanes whose account gate serves the lane's own epoch are listed: the
    claim would refuse any other lane, and such lanes must not fill the page
    ahead of lanes that can move.

    Returns:
        ``[(org_id, lane_id), ...]`` ordered by the lane's oldest ready Execution id.

    Seed 003, "Durable source ordering".
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.org_id, e.lane_id FROM connectors_execution e JOIN connectors_orderinglane l ON l.id = e.lane_id "
            f"{_SERVING_GATE_JOIN.format(row='l')}"
            "WHERE l.state = 'open' AND (e.state = 'ready' OR (e.state = 'waiting_dependency' AND EXISTS ("
            " SELECT 1 FROM connectors_executiondependency d WHERE d.execution_id = e.id AND d.state = 'waiting'"
            " AND l.high_water_position >= d.required_position)))"
            " AND (l.active_execution_id IS NULL OR NOT EXISTS ("
            " SELECT 1 FROM connectors_executionattempt a WHERE a.execution_id = l.active_execution_id"
            " AND a.state = 'started' AND a.lease_expires_at > %s)) "
            "GROUP BY l.org_id, e.lane_id ORDER BY MIN(e.id) LIMIT %s",
            [now, limit],
        )
        return [(row[0], OrderingLane.Id(row[1])) for row in cursor.fetchall()]


def head_of_lane_prepared(now: dt.datetime, nonterminal: tuple[str, ...], lanes: tuple[str, ...],
                          limit: int = 10) -> list[tuple[str, RemoteEffect.Id]]:
    """Prepared RemoteEffects of the claimable ``lanes`` that are due and first for their link_key (non-locking).

    An effect of the link_key already past ``prepared`` occupies the slot whatever its
    lane_sequence (outbox delivery order can differ from record version order).

    Args:
        now: the database clock; an effect whose ``next_attempt_at`` is after it is not due.
        nonterminal: the RemoteEffect states that still occupy a slot.
        lanes: the DispatchLane values this claimant may take (the lane is
            applied in the SQL claim: a row of any other lane is never selected).
        limit: most effects returned.

    Returns:
        ``[(org_id, effect_id), ...]`` in id order.

    Seed 002, "Deferred Association Dispatch Lane"; seed 003, "Outbound facts".
    """
    if not lanes:
        return []
    placeholders = ", ".join(["%s"] * len(nonterminal))
    lane_list = ", ".join(["%s"] * len(lanes))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.org_id, e.id FROM connectors_remoteeffect e WHERE e.state = 'prepared' "
            f"AND e.dispatch_lane IN ({lane_list}) "
            f"AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %s) AND NOT EXISTS ("
            f" SELECT 1 FROM connectors_remoteeffect p WHERE p.org_id = e.org_id AND p.link_key = e.link_key"
            f" AND p.state IN ({placeholders}) AND (p.state <> 'prepared' OR p.lane_sequence < e.lane_sequence"
            f" OR (p.lane_sequence = e.lane_sequence AND p.id < e.id))) ORDER BY e.id LIMIT %s",
            [*lanes, now, *nonterminal, limit],
        )
        return [(row[0], RemoteEffect.Id(row[1])) for row in cursor.fetchall()]


def database_answers(using: str = "default") -> None:
    """Run a trivial query on ``using`` (the readiness probe).

    Raises:
        django.db.DatabaseError: the database does not answer.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT 1")


def receipts_missing_children(limit: int = 20) -> list[tuple[str, Receipt.Id]]:
    """Transport Receipts with fewer Components than items whose gate serves their epoch (non-locking).

    A crash fell between Receipt and children. Children commit in ascending
    ordinal chunks, so a Receipt is complete exactly when its last ordinal
    exists. Receipts whose gate does not serve their own epoch cannot be
    materialized now and are left out, so they never fill the page ahead of
    Receipts that can; replay Receipts materialize through their
    ReplayRequest (``connectors/inbound/replay.py``), never here.

    Returns:
        ``[(org_id, receipt_id), ...]`` oldest first. Seed 003 "Inbound facts".
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.org_id, r.id FROM connectors_receipt r "
            f"{_SERVING_GATE_JOIN.format(row='r')}"
            "WHERE r.kind <> 'replay' AND r.component_count > 0 AND NOT EXISTS ("
            " SELECT 1 FROM connectors_receiptcomponent c WHERE c.receipt_id = r.id"
            " AND c.ordinal = r.component_count - 1) ORDER BY r.id LIMIT %s", [limit])
        return [(row[0], Receipt.Id(row[1])) for row in cursor.fetchall()]


def partial_receipts_count(*, org_id: str, account_key: str, epoch_id) -> int:
    """Transport Receipts of one account and epoch that still lack children (a crash between the two steps)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM connectors_receipt r WHERE r.org_id = %s AND r.account_key = %s"
            " AND r.epoch_id = %s AND r.kind <> 'replay' AND r.component_count > 0 AND NOT EXISTS ("
            " SELECT 1 FROM connectors_receiptcomponent c WHERE c.receipt_id = r.id"
            " AND c.ordinal = r.component_count - 1)", [org_id, account_key, int(epoch_id)])
        return int(cursor.fetchone()[0])


def windows_due(now: dt.datetime, limit: int = 20) -> list[tuple[str, ProjectionWindow.Id]]:
    """Open ProjectionWindows whose ``close_at`` is not after ``now`` (the DB clock), oldest first.

    Only windows whose account gate serves the window's epoch are listed (only those can seal).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT w.org_id, w.id FROM connectors_projectionwindow w "
            f"{_SERVING_GATE_JOIN.format(row='w')}"
            "WHERE w.state = 'open' AND w.close_at <= %s ORDER BY w.close_at, w.id LIMIT %s",
            [connection.ops.adapt_datetimefield_value(now), int(limit)])
        return [(row[0], ProjectionWindow.Id(row[1])) for row in cursor.fetchall()]


def dependencies_due(now: dt.datetime, limit: int = 20) -> list[tuple[str, ExecutionDependency.Id]]:
    """Waiting ExecutionDependencies whose immutable deadline passed (non-locking), oldest first.

    Only dependencies whose lane's account gate serves the lane's epoch are listed.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT d.org_id, d.id FROM connectors_executiondependency d"
            " JOIN connectors_orderinglane l ON l.id = d.lane_id AND l.org_id = d.org_id "
            f"{_SERVING_GATE_JOIN.format(row='l')}"
            "WHERE d.state = 'waiting' AND d.deadline_at <= %s ORDER BY d.deadline_at, d.id LIMIT %s",
            [connection.ops.adapt_datetimefield_value(now), int(limit)])
        return [(row[0], ExecutionDependency.Id(row[1])) for row in cursor.fetchall()]


def unlaned_executions_ready(now: dt.datetime, limit: int = 20) -> list[tuple[str, Execution.Id]]:
    """Ready ``order_independent`` Executions (no lane) that no live lease holds, oldest first.

    Only Executions whose Event's account gate serves the Event's epoch are listed.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.org_id, e.id FROM connectors_execution e JOIN connectors_projection p ON p.id = e.projection_id"
            " JOIN connectors_event ev ON ev.id = p.event_id "
            f"{_SERVING_GATE_JOIN.format(row='ev')}"
            "WHERE e.state = 'ready' AND e.lane_id IS NULL"
            " AND NOT EXISTS (SELECT 1 FROM connectors_executionattempt a WHERE a.execution_id = e.id"
            " AND a.state = 'started' AND a.lease_expires_at > %s) ORDER BY e.id LIMIT %s", [now, limit])
        return [(row[0], Execution.Id(row[1])) for row in cursor.fetchall()]


def executions_with_reason(*, org_id: str, reason_code: str | None = None,
                           lane_id: int | None = None) -> QuerySet[Execution]:
    """Executions carrying a reason code, with their dependencies' frozen deadlines, newest first."""
    qs = Execution.objects.filter(org_id=org_id).prefetch_related("dependencies")
    if lane_id is not None:
        qs = qs.filter(lane_id=lane_id)
    return _with_reason(qs, reason_code).order_by("-id")
def gates_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[AccountServingGate]:
    """AccountServingGates of ``org_id`` that carry a reason code (or ``reason_code``), by account key."""
    return _with_reason(AccountServingGate.objects.filter(org_id=org_id), reason_code).order_by("account_key")


def open_permits_of_halting_gates(*, org_id: str, reason_code: str | None = None) -> QuerySet[DispatchPermit]:
    """Open (``granted`` / ``sending``) DispatchPermits that keep a gate of ``org_id`` in ``halting_v2``.

    Args:
        reason_code: only permits of gates carrying this code.
    """
    qs = DispatchPermit.objects.filter(org_id=org_id, state__in=("granted", "sending"), gate__state="halting_v2")
    return _with_reason(qs, reason_code, "gate__reason_code").select_related("gate").order_by("id")



# --- open work (registered with nexusflow.kernel.workers.register_open_work) -----------------
def executions_open_count() -> int:
    """Executions not settled (``ready`` or ``waiting_dependency``), all orgs."""
    return Execution.objects.exclude(state__in=transitions.EXECUTION.settled).count()


def effects_open_count() -> int:
    """RemoteEffects not settled (``prepared``, ``dispatching``, ``remote_confirmed``), all orgs."""
    return RemoteEffect.objects.exclude(state__in=transitions.REMOTE_EFFECT.settled).count()


def permits_open_count() -> int:
    """DispatchPermits not terminal (``granted`` or ``sending``), all orgs."""
    return DispatchPermit.objects.exclude(state__in=transitions.DISPATCH_PERMIT.settled).count()


def effects_uncertain_count() -> int:
    """RemoteEffects parked ``uncertain`` (whoever resolves them: reconciler or operator), all orgs."""
    return RemoteEffect.objects.filter(state="uncertain").count()


def effects_create_conflict_count() -> int:
    """Effects parked ``uncertain`` with ``create_conflict_existing``, which the reconciler resolves on its own.

    The egress reconciler settles them by the contract's verify read; other
    ``uncertain`` effects may wait for an operator.
    """
    return RemoteEffect.objects.filter(state="uncertain", reason_code=reasons.CREATE_CONFLICT_EXISTING).count()


# The V1 runtime's evidence selectors (connectors/v1/selectors.py), named by connectors/reasons.py.
from connectors.v1.selectors import v1_events_with_reason, v1_provider_calls_with_reason  # noqa: F401 - re-exported for connectors/reasons.py


# --- metrics (connectors/metrics.py; seed 004 section 19) -------------------------------------------------------
def _by(qs: QuerySet, *fields: str, oldest: str | None = None) -> list[tuple]:
    """``qs`` grouped by ``fields``: ``(*values, rows[, min(oldest)])`` per group, in field order."""
    from django.db.models import Count, Min

    aggregates = {"n": Count("pk")}
    if oldest is not None:
        aggregates["oldest"] = Min(oldest)
    rows = qs.values(*fields).annotate(**aggregates).order_by(*fields)
    return [tuple(r[f] for f in fields) + (int(r["n"]),) + ((r["oldest"],) if oldest else ()) for r in rows]


def executions_ready_queue() -> tuple[int, dt.datetime | None]:
    """``ready`` Executions (all orgs): ``(rows, oldest updated_at)``, the time the oldest became ready."""
    rows = _by(Execution.objects.filter(state="ready"), "state", oldest="updated_at")
    return (rows[0][1], rows[0][2]) if rows else (0, None)


def effects_due_queue(now: dt.datetime) -> tuple[int, dt.datetime | None]:
    """``prepared`` RemoteEffects due for dispatch on the database clock ``now`` (all orgs): ``(rows, oldest)``.

    An effect is eligible from its ``next_attempt_at`` or, without one, its last change (``updated_at``).
    """
    from django.db.models import Count, Min, Q
    from django.db.models.functions import Coalesce

    row = (RemoteEffect.objects.filter(state="prepared")
           .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
           .aggregate(n=Count("pk"), oldest=Min(Coalesce("next_attempt_at", "updated_at"))))
    return int(row["n"]), row["oldest"]


def execution_attempts_by_state() -> list[tuple[str, int]]:
    """ExecutionAttempts (all orgs) by state (``expired``: the lease ran out and recovery fenced it)."""
    return _by(ExecutionAttempt.objects.all(), "state")


def effect_attempt_retries() -> int:
    """RemoteEffectAttempts after an effect's first (``attempt_number > 1``), all orgs."""
    return RemoteEffectAttempt.objects.filter(attempt_number__gt=1).count()


def effects_by_state_and_reason() -> list[tuple[str, str, int]]:
    """RemoteEffects (all orgs) by state and reason code (``""`` where the state carries none)."""
    return _by(RemoteEffect.objects.all(), "state", "reason_code")


def effect_latencies() -> dict[str, tuple[int, float]]:
    """Effect latencies over all orgs, ``{name: (effects, sum of seconds)}``.

    ``submit``: from the effect's row (the intent's arrival) to its first Attempt (the first request);
    ``finalized`` / ``no_effect``: from the effect's row to its last change in that terminal state.
    """
    effect, attempt = RemoteEffect._meta.db_table, RemoteEffectAttempt._meta.db_table
    out = {"submit": (0, 0.0), "finalized": (0, 0.0), "no_effect": (0, 0.0)}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(*), COALESCE(SUM(TIMESTAMPDIFF(MICROSECOND, e.created_at, a.created_at)), 0) "
            f"FROM {effect} e JOIN {attempt} a ON a.effect_id = e.id AND a.attempt_number = 1")
        n, total = cursor.fetchone()
        out["submit"] = (int(n), int(total) / 1e6)
        cursor.execute(
            f"SELECT state, COUNT(*), COALESCE(SUM(TIMESTAMPDIFF(MICROSECOND, created_at, updated_at)), 0) "
            f"FROM {effect} WHERE state IN ('finalized', 'no_effect') GROUP BY state")
        for state, n, total in cursor.fetchall():
            out[state] = (int(n), int(total) / 1e6)
    return out


def permits_open_by_state() -> list[tuple[str, int, dt.datetime | None]]:
    """Open DispatchPermits (all orgs) by state: ``(state, permits, oldest created_at)``."""
    return _by(DispatchPermit.objects.exclude(state__in=transitions.DISPATCH_PERMIT.settled), "state",
               oldest="created_at")


def gates_by_state() -> list[tuple[str, str, int]]:
    """Serving and credential dispatch gates (all orgs): ``(gate kind, state, gates)``."""
    return ([("account_serving", state, n) for state, n in _by(AccountServingGate.objects.all(), "state")]
            + [("credential_dispatch", state, n)
               for state, n in _by(CredentialGenerationDispatchGate.objects.all(), "state")])


def execution_dependencies_waiting() -> tuple[int, dt.datetime | None]:
    """``waiting`` ExecutionDependencies (all orgs): ``(rows, oldest created_at)``."""
    rows = _by(ExecutionDependency.objects.filter(state="waiting"), "state", oldest="created_at")
    return (rows[0][1], rows[0][2]) if rows else (0, None)


def execution_oldest_ready(org_id: str, now):
    """When the org's oldest ``ready`` inbound Execution was created, or ``None`` when it has none
    (``execution_org_state_idx``; ``now`` is unused: a ready execution is due at once)."""
    return (Execution.objects.filter(org_id=org_id, state="ready").order_by("pk")
            .values_list("created_at", flat=True).first())
