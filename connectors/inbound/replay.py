"""Operator-authorized replay (seed 003 "Replay identity and predecessor", "Replay and external effects").

Three entry points:

- :func:`replay_submit`: admit a ReplayRequest and its replay Receipt (one
  transaction), then materialize its descendants (another transaction).
  Submitting the same ReplayRequest ID again byte-compares and converges on
  the same descendants; a different ID is a separate EventGeneration.
- :func:`replay_materialize`: derive the replay Component, Event, Projection
  and Execution from an admitted request; only missing children are created.
- :func:`replay_lookup`: read-only view of a request and its descendants;
  works while the gate is halted and never creates or repairs anything.

Every writing transaction locks AccountServingGate and its exact
ServingEpoch first (:func:`connectors.serving.gates.serving_lock`: ``v2_serving``,
exact gate-to-epoch id and digest, epoch ``active``), so a gate or epoch
transition and a replay write serialize on the gate row. Materialization
also requires the request's stored target epoch to be that serving epoch.

The replay Event keeps the predecessor's SourceEventKey, partition and
position and enters the same OrderingLane, so a replayed position at or below
the lane high-water is superseded by the claim without calling Runtime. The
replay Execution freezes ``suppress_external_effects`` into its ExecutionRef
digest and its Runtime command; Runtime refuses OutboundCommand authoring
from it (:mod:`runtime_outbox.replay_guard`). The predecessor rows are only
read, never locked or written.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from connectors.models import (
    AccountServingGate,
    Event,
    Execution,
    OrderingLane,
    Projection,
    ProjectionWindow,
    Receipt,
    ReceiptComponent,
    ReplayRequest,
)
from connectors.serving.gates import NotServing, ServingContext, serving_lock
from connectors.store import ExecutionStore, OrderingLaneStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.replay_guard import SUPPRESS_EXTERNAL_EFFECTS, ReplayModeUnsupported, require_replay_mode

FP_AFTER_ADMISSION = failpoints.declare("replay.after_admission_commit")

#: The live EventGeneration; a ReplayRequest ID may not take it.
LIVE_GENERATION = "live"
PREDECESSOR_PROTOCOL = "v2"
#: Execution states after which the predecessor is terminal and stays byte-identical.
TERMINAL_EXECUTION_STATES = frozenset({"completed", "quarantined", "superseded"})
MAX_REASON_LENGTH = 500


class ReplayError(NexusError):
    """A replay request that cannot be admitted or materialized; ``http_status`` says how to answer."""

    http_status = 409


class ReplayInvalid(ReplayError):
    code = "replay_invalid"
    http_status = 400


class ReplayUnknownAccount(ReplayError):
    code = "unknown_account"
    http_status = 404


class ReplayUnknownPredecessor(ReplayError):
    code = "unknown_predecessor"
    http_status = 404


class ReplayNotFound(ReplayError):
    code = "replay_not_found"
    http_status = 404


class ReplayMismatch(ReplayError):
    """The ReplayRequest ID exists with other bytes, or a descendant disagrees with it: fail closed."""

    code = "replay_mismatch"


class ReplayPredecessorNotTerminal(ReplayError):
    """The predecessor still has nonterminal work; replaying it now could change it."""

    code = "replay_predecessor_not_terminal"


class ReplayRouteNotServed(ReplayError):
    """The target epoch does not serve the predecessor's route, or freezes another ordering contract."""

    code = "replay_route_not_served"


class ReplayTargetNotServing(NotServing):
    """The request's stored target epoch is not the account's current serving epoch."""

    code = "replay_target_not_serving"


@dataclass
class ReplayResult:
    """What a replay submission or lookup found: the request and its descendants (ids)."""

    request: ReplayRequest
    created: bool = False
    materialized: bool = False
    event_ids: list = field(default_factory=list)
    execution_ids: list = field(default_factory=list)
    executions: list = field(default_factory=list)

    def as_dict(self) -> dict:
        request = self.request
        return {
            "replay_id": request.replay_id,
            "account_key": request.account_key,
            "request_digest": request.request_digest,
            "target_epoch_id": int(request.target_epoch_id),
            "target_epoch_digest": request.target_epoch_digest,
            "external_effects": request.external_effects,
            "receipt_id": int(request.receipt_id),
            "predecessor": predecessor_ref(request),
            "reason": request.reason,
            "principal": request.principal,
            "created": self.created,
            "materialized": self.materialized,
            "event_ids": [int(i) for i in self.event_ids],
            "executions": self.executions,
        }


def predecessor_ref(request: ReplayRequest) -> dict:
    """The disclosure-safe predecessor ref a request binds (ids and digests only, no payload)."""
    return {
        "protocol": request.predecessor_protocol,
        "receipt_id": int(request.predecessor_receipt_id),
        "event_id": int(request.predecessor_event_id),
        "epoch_id": int(request.predecessor_epoch_id),
        "epoch_digest": request.predecessor_epoch_digest,
        "payload_digest": request.predecessor_payload_digest,
        "result_digest": request.predecessor_result_digest,
        "route_key": request.route_key,
        "source_event_key": request.source_event_key,
    }


def _request_digest(values: dict) -> str:
    return digest_v2("connectors.replay-request", [
        ("org_id", values["org_id"]), ("account_key", values["account_key"]), ("replay_id", values["replay_id"]),
        ("target_epoch_id", int(values["target_epoch"].pk)), ("target_epoch_digest", values["target_epoch_digest"]),
        ("predecessor_protocol", values["predecessor_protocol"]),
        ("predecessor_receipt_id", int(values["predecessor_receipt_id"])),
        ("predecessor_event_id", int(values["predecessor_event_id"])),
        ("predecessor_epoch_id", int(values["predecessor_epoch_id"])),
        ("predecessor_epoch_digest", values["predecessor_epoch_digest"]),
        ("predecessor_payload_digest", values["predecessor_payload_digest"]),
        ("predecessor_result_digest", values["predecessor_result_digest"]),
        ("route_key", values["route_key"]), ("source_event_key", values["source_event_key"]),
        ("reason", values["reason"]), ("principal", values["principal"]),
        ("external_effects", values["external_effects"]),
    ]).hexdigest


#: The fields an operator's submission decides; a resubmission must match them byte for byte.
_COMPARED = ("predecessor_protocol", "predecessor_receipt_id", "predecessor_event_id", "predecessor_epoch_id",
             "predecessor_epoch_digest", "predecessor_payload_digest", "predecessor_result_digest", "route_key",
             "source_event_key", "reason", "principal", "external_effects")


def _validate(replay_id, reason, principal, external_effects) -> tuple[str, str, str]:
    # The mode is checked first: any other mode is refused before anything is read or written.
    require_replay_mode(external_effects)
    replay_id = validate_key(replay_id, field="replay_id", max_length=80)
    if replay_id == LIVE_GENERATION:
        raise ReplayInvalid(f"replay_id {LIVE_GENERATION!r} is the live EventGeneration")
    principal = validate_key(principal, field="principal", max_length=150)
    if not isinstance(reason, str) or not reason.strip() or reason != reason.strip():
        raise ReplayInvalid("reason must be non-empty text without surrounding whitespace")
    if len(reason) > MAX_REASON_LENGTH:
        raise ReplayInvalid(f"reason is longer than {MAX_REASON_LENGTH} characters")
    return replay_id, reason, principal


def _predecessor_facts(org_id: str, account_key: str, predecessor_event_id) -> tuple[Event, dict, bytes]:
    """Read (never lock) the predecessor and build its ref; check it is terminal.

    Returns ``(event, ref fields, payload bytes)``; the bytes are the exact
    canonical payload whose digest the ref authorizes.
    """
    event_pk = require_id(predecessor_event_id, Event, field="predecessor_event_id")
    event = Event.objects.select_related("epoch").filter(org_id=org_id, account_key=account_key, pk=event_pk).first()
    if event is None:
        raise ReplayUnknownPredecessor(f"account {account_key} has no event {predecessor_event_id}")
    payload = canonical_json.dumps(event.payload)
    if digest_v2("connectors.event-payload", [("payload", payload)]).hexdigest != event.payload_digest:
        raise ReplayMismatch(f"event {event.pk} payload does not match its authorized digest")
    executions = list(Execution.objects.filter(org_id=org_id, projection__event=event).order_by("generation"))
    window_id = Projection.objects.filter(org_id=org_id, event=event).values_list("window_id", flat=True).first()
    if window_id is not None:
        # A window member is applied by its window's one Execution, minted only when the window seals.
        window_state = ProjectionWindow.objects.values_list("state", flat=True).get(org_id=org_id, pk=window_id)
        if window_state != "sealed":
            raise ReplayPredecessorNotTerminal(f"event {event.pk} is a member of window {window_id}, which is still "
                                               f"{window_state}; replay it once the window sealed and ran")
        known = {e.pk for e in executions}
        executions += [e for e in Execution.objects.filter(org_id=org_id, window_id=window_id).order_by("id")
                       if e.pk not in known]
    open_work = [e for e in executions if e.state not in TERMINAL_EXECUTION_STATES]
    if open_work:
        raise ReplayPredecessorNotTerminal(f"event {event.pk} still has execution {open_work[0].pk} in "
                                           f"{open_work[0].state}; replay it once it is terminal")
    completed = [e for e in executions if e.state == "completed"]
    ref = {
        "predecessor_protocol": PREDECESSOR_PROTOCOL,
        "predecessor_receipt_id": event.receipt_id,
        "predecessor_event_id": event.pk,
        "predecessor_epoch_id": event.epoch_id,
        "predecessor_epoch_digest": event.epoch.digest,
        "predecessor_payload_digest": event.payload_digest,
        "predecessor_result_digest": completed[-1].result_digest if completed else "",
        "route_key": event.route_key,
        "source_event_key": event.source_event_key,
    }
    return event, ref, payload


def _same(existing: ReplayRequest, values: dict) -> bool:
    return all(str(getattr(existing, name)) == str(values[name]) for name in _COMPARED)


def replay_submit(*, org: OrgScope, account_key: str, replay_id: str, predecessor_event_id,
                  reason: str, principal: str, external_effects: str) -> ReplayResult:
    """Admit one operator-authorized replay and materialize its descendants.

    Args:
        org: trusted scope (from authentication or the operator command).
        account_key: the account whose predecessor Event is replayed.
        replay_id: stable ReplayRequest ID (canonical key, at most 80
            characters, not ``live``); it becomes the replay EventGeneration.
        predecessor_event_id: id of the terminal predecessor Event (its Receipt,
            epoch, payload and result digests are bound by reference).
        reason: why (text, 1..500 characters, no surrounding whitespace).
        principal: the authorizing operator (canonical key).
        external_effects: must be ``suppress_external_effects``.

    Returns:
        :class:`ReplayResult`; ``created`` is False when the same ID was
        already admitted with the same bytes; ``materialized`` is False when
        the request is stored but materialization was refused (the gate left
        ``v2_serving`` in between); submit the same ID again to resume.

    Raises:
        ReplayModeUnsupported: another mode (before anything is read or written).
        InvalidIdentity / ReplayInvalid: malformed id, principal or reason.
        ReplayUnknownPredecessor: no such Event in the account.
        ReplayPredecessorNotTerminal: the predecessor still has open work.
        ReplayMismatch: the ID exists with other bytes (nothing changes).
        ReplayRouteNotServed: the target epoch does not serve the route or
            freezes another ordering contract.
        NotServing: the gate is not ``v2_serving``, its fence, epoch id or
            digest does not match, or the epoch is not ``active``.

    Seed 003, "Replay identity and predecessor" steps 1, 2 and 5.
    """
    replay_id, reason, principal = _validate(replay_id, reason, principal, external_effects)
    account_key = validate_key(account_key, field="account_key", max_length=80)
    if not AccountServingGate.objects.filter(org_id=org.org_id, account_key=account_key).exists():
        raise ReplayUnknownAccount(f"unknown account {account_key!r}")
    request, created = _admit(org.org_id, account_key, replay_id, predecessor_event_id, reason, principal)
    failpoints.hit(FP_AFTER_ADMISSION)
    try:
        result = replay_materialize(org=org, account_key=account_key, replay_id=replay_id)
    except NotServing:
        if created:
            # The request and its Receipt are durable and inert; resubmitting resumes materialization.
            return ReplayResult(request=request, created=True, materialized=False)
        raise
    result.created = created
    return result


def _admit(org_id: str, account_key: str, replay_id: str, predecessor_event_id, reason: str,
           principal: str) -> tuple[ReplayRequest, bool]:
    for _ in range(2):
        try:
            with transaction.atomic(durable=True):
                ctx = serving_lock(org_id=org_id, account_key=account_key)
                event, ref, payload = _predecessor_facts(org_id, account_key, predecessor_event_id)
                values = {"org_id": org_id, "account_key": account_key, "replay_id": replay_id,
                          "target_epoch": ctx.epoch, "target_epoch_digest": ctx.epoch.digest, **ref,
                          "reason": reason, "principal": principal, "external_effects": SUPPRESS_EXTERNAL_EFFECTS}
                existing = ReplayRequest.objects.filter(org_id=org_id, account_key=account_key,
                                                        replay_id=replay_id).first()
                if existing is not None:
                    if not _same(existing, values):
                        raise ReplayMismatch(f"replay {replay_id} was authorized with other facts")
                    return existing, False
                _route_of(ctx, event)
                receipt = insert(
                    Receipt, org_id=org_id, epoch=ctx.epoch, account_key=account_key,
                    channel=Receipt.objects.values_list("channel", flat=True).get(org_id=org_id, pk=event.receipt_id),
                    route_key=event.route_key, kind="replay", body=payload,
                    body_digest=digest_v2("connectors.receipt-body", [("body", payload)]).hexdigest,
                    component_count=1, quarantined_count=0)
                request = insert(ReplayRequest, **values, request_digest=_request_digest(values),
                                 profile_id=PROFILE_V2, receipt=receipt)
                return request, True
        except IntegrityError:
            continue  # the same ID committed concurrently: load and byte-compare it
    raise ReplayMismatch(f"concurrent submissions of replay {replay_id} did not settle")


def _route_of(ctx: ServingContext, event: Event) -> dict:
    """The target epoch's frozen route facts for the predecessor's route (fail closed)."""
    route = ctx.account["routes"].get(event.route_key)
    if route is None:
        raise ReplayRouteNotServed(f"epoch {ctx.epoch.pk} does not serve route {event.route_key}")
    if route["ordering_digest"] != event.ordering_contract_digest:
        raise ReplayRouteNotServed(f"epoch {ctx.epoch.pk} freezes another ordering contract for {event.route_key}; "
                                   "a replay cannot relabel its source position")
    return route


def replay_execution_ref(*, command_id: str, projection_id, pack_generation_id, epoch_digest: str,
                         definition_digest: str, input_digest: str, replay_id: str, external_effects: str) -> str:
    """The ExecutionRef digest of a replay Execution: the live fields plus the replay id and mode."""
    return digest_v2("connectors.execution-ref", [
        ("command_id", command_id), ("projection_id", projection_id), ("pack_generation_id", pack_generation_id),
        ("epoch_digest", epoch_digest), ("definition_digest", definition_digest), ("input_digest", input_digest),
        ("replay_id", replay_id), ("external_effects", external_effects)]).hexdigest


def replay_materialize(*, org: OrgScope, account_key: str, replay_id: str) -> ReplayResult:
    """Create the missing replay descendants of an admitted request under its exact target epoch.

    One transaction: lock gate -> exact epoch (``v2_serving``, fence, id,
    digest, ``active``), require the request's target epoch to be that epoch,
    then insert only what is missing: Component 0, the replay Event
    (EventGeneration = ReplayRequest ID), its Projection and Execution on the
    predecessor's OrderingLane partition. Existing descendants are
    byte-compared.

    Raises:
        ReplayNotFound: no such request.
        ReplayTargetNotServing / NotServing: the gate or epoch moved; nothing is inserted.
        ReplayMismatch: an existing descendant disagrees with the request.
        ReplayRouteNotServed: the epoch no longer serves the route as frozen.

    Seed 003, "Replay identity and predecessor" steps 3 to 6.
    """
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=org.org_id, account_key=account_key)
        request = ReplayRequest.objects.filter(org_id=org.org_id, account_key=account_key,
                                               replay_id=replay_id).first()
        if request is None:
            raise ReplayNotFound(f"account {account_key} has no replay {replay_id}")
        if request.target_epoch_id != ctx.epoch.pk or request.target_epoch_digest != ctx.epoch.digest:
            raise ReplayTargetNotServing(f"replay {replay_id} targets epoch {request.target_epoch_id}; the account "
                                         f"serves epoch {ctx.epoch.pk}; the stored target never changes: "
                                         "authorize a new ReplayRequest ID to replay under the serving epoch")
        receipt = Receipt.objects.get(org_id=org.org_id, pk=request.receipt_id)
        predecessor = Event.objects.get(org_id=org.org_id, pk=request.predecessor_event_id)
        body = bytes(receipt.body)
        if (receipt.kind != "replay" or receipt.epoch_id != ctx.epoch.pk
                or digest_v2("connectors.event-payload", [("payload", body)]).hexdigest
                != request.predecessor_payload_digest
                or predecessor.payload_digest != request.predecessor_payload_digest):
            raise ReplayMismatch(f"replay {replay_id}: receipt or predecessor bytes differ from the authorization")
        route = _route_of(ctx, predecessor)
        component = ReceiptComponent.objects.filter(receipt=receipt, ordinal=0).select_related("event").first()
        if component is not None:
            event = component.event
        else:
            event = Event.objects.filter(org_id=org.org_id, account_key=account_key, route_key=predecessor.route_key,
                                         source_event_key=predecessor.source_event_key,
                                         event_generation=replay_id).first()
            if event is None:
                event = _insert_event(ctx, request, receipt, predecessor, route)
            insert(ReceiptComponent, receipt=receipt, ordinal=0, disposition="event", item=predecessor.payload,
                   event=event)
        _check_event(request, receipt, predecessor, event)
        execution = _ensure_execution(ctx, request, event, route)
        return ReplayResult(request=request, materialized=True, event_ids=[event.pk], execution_ids=[execution.pk],
                            executions=[_execution_view(execution)])


def _check_event(request: ReplayRequest, receipt: Receipt, predecessor: Event, event: Event | None) -> None:
    if event is None or (
            event.event_generation, event.receipt_id, event.epoch_id, event.source_event_key, event.route_key,
            event.payload_digest, bytes(event.position), event.partition_key, event.ordering_contract_digest,
    ) != (request.replay_id, receipt.pk, request.target_epoch_id, predecessor.source_event_key, predecessor.route_key,
          predecessor.payload_digest, bytes(predecessor.position), predecessor.partition_key,
          predecessor.ordering_contract_digest):
        raise ReplayMismatch(f"replay {request.replay_id}: the stored replay Event does not match its request")


def _insert_event(ctx: ServingContext, request: ReplayRequest, receipt: Receipt, predecessor: Event,
                  route: dict) -> Event:
    # The replay inherits every source fact of the predecessor; only the generation and epoch are new.
    return insert(
        Event, org_id=request.org_id, epoch=ctx.epoch, account_key=request.account_key,
        route_key=predecessor.route_key, canonical_kind=predecessor.canonical_kind,
        source_event_key=predecessor.source_event_key, event_generation=request.replay_id,
        source_locator=predecessor.source_locator, occurred_at_ms=predecessor.occurred_at_ms,
        ordering_contract=route["ordering"]["contract"], ordering_contract_digest=route["ordering_digest"],
        partition_key=predecessor.partition_key, partition=predecessor.partition,
        position=bytes(predecessor.position), tie_breaker=predecessor.tie_breaker, payload=predecessor.payload,
        payload_digest=predecessor.payload_digest, receipt=receipt,
    )


def _ensure_execution(ctx: ServingContext, request: ReplayRequest, event: Event, route: dict) -> Execution:
    account = ctx.account
    definition_digest = digest_v2("connectors.route-definition", [
        ("pack_digest", account["pack_generation"]["digest"]), ("route_key", event.route_key)]).hexdigest
    projection = Projection.objects.filter(org_id=request.org_id, event=event).first()
    if projection is None:
        projection = insert(Projection, org_id=request.org_id, event=event, route_key=event.route_key,
                            definition_digest=definition_digest, input_digest=event.payload_digest)
    elif (projection.definition_digest, projection.input_digest) != (definition_digest, event.payload_digest):
        raise ReplayMismatch(f"replay {request.replay_id}: the stored Projection does not match the target epoch")
    # The replay id and mode are part of the Runtime command identity too (seed 003 "Replay and external effects").
    command_id = digest_v2("connectors.runtime-command", [
        ("org_id", request.org_id), ("projection_id", projection.pk), ("generation", 1),
        ("replay_id", request.replay_id), ("external_effects", request.external_effects)]).hexdigest
    execution_ref = replay_execution_ref(
        command_id=command_id, projection_id=projection.pk, pack_generation_id=account["pack_generation"]["id"],
        epoch_digest=ctx.epoch.digest, definition_digest=definition_digest, input_digest=projection.input_digest,
        replay_id=request.replay_id, external_effects=request.external_effects)
    existing = Execution.objects.filter(org_id=request.org_id, projection=projection, generation=1).first()
    if existing is not None:
        if (existing.command_id, existing.execution_ref_digest) != (command_id, execution_ref):
            raise ReplayMismatch(f"replay {request.replay_id}: the stored Execution has another ExecutionRef")
        return existing
    lane = None
    if route["ordering"]["contract"] != "order_independent":
        # The same guard as live admission: one lane per epoch, route and partition.
        lane = OrderingLane.objects.filter(org_id=request.org_id, epoch=ctx.epoch, route_key=event.route_key,
                                           partition_key=event.partition_key).first()
        if lane is None:
            lane = OrderingLaneStore.create(org_id=request.org_id, epoch=ctx.epoch, account_key=request.account_key,
                                            route_key=event.route_key, partition_key=event.partition_key,
                                            partition=event.partition, state="open")
    return ExecutionStore.create(org_id=request.org_id, projection=projection, generation=1, lane=lane,
                                 position=bytes(event.position), state="ready", command_id=command_id,
                                 execution_ref_digest=execution_ref)


def _execution_view(execution: Execution) -> dict:
    return {"id": int(execution.pk), "state": execution.state, "reason_code": execution.reason_code,
            "execution_ref_digest": execution.execution_ref_digest}


def replay_command_facts(event: Event) -> dict:
    """The replay facts a Runtime command of ``event`` carries: ``{}`` for a live Event.

    For a replay Event: ``{"replay_id": ..., "external_effects": ...}`` from
    its ReplayRequest (seed 003 "Replay and external effects": the mode is
    frozen into the Runtime command).

    Raises:
        ReplayNotFound: a replay Event whose request is missing (fail closed).
    """
    if event.event_generation == LIVE_GENERATION:
        return {}
    request = ReplayRequest.objects.filter(org_id=event.org_id, account_key=event.account_key,
                                           replay_id=event.event_generation).first()
    if request is None or request.receipt_id != event.receipt_id:
        raise ReplayNotFound(f"event {event.pk} names replay {event.event_generation} without its request")
    return {"replay_id": request.replay_id, "external_effects": request.external_effects}


def replay_lookup(*, org: OrgScope, account_key: str, replay_id: str) -> ReplayResult:
    """Return an existing request and its descendants without locking, creating or repairing anything.

    Works whatever the gate state (also while halted).

    Raises:
        InvalidIdentity: malformed ``account_key`` or ``replay_id``.
        ReplayNotFound: no such request.
    """
    account_key = validate_key(account_key, field="account_key", max_length=80)
    replay_id = validate_key(replay_id, field="replay_id", max_length=80)
    request = ReplayRequest.objects.filter(org_id=org.org_id, account_key=account_key, replay_id=replay_id).first()
    if request is None:
        raise ReplayNotFound(f"account {account_key} has no replay {replay_id}")
    events = list(Event.objects.filter(org_id=org.org_id, receipt_id=request.receipt_id).order_by("id"))
    executions = list(Execution.objects.filter(org_id=org.org_id, projection__event__in=events).order_by("id"))
    return ReplayResult(request=request, materialized=bool(executions), event_ids=[e.pk for e in events],
                        execution_ids=[e.pk for e in executions],
                        executions=[_execution_view(e) for e in executions])


__all__ = [
    "ReplayError", "ReplayInvalid", "ReplayMismatch", "ReplayModeUnsupported", "ReplayNotFound",
    "ReplayPredecessorNotTerminal", "ReplayResult", "ReplayRouteNotServed", "ReplayTargetNotServing",
    "ReplayUnknownAccount", "ReplayUnknownPredecessor", "replay_command_facts", "replay_lookup",
    "replay_materialize", "replay_submit",
]
