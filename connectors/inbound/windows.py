"""ProjectionWindow: grouped, latest, batch and settle routes (seed 003 "Inbound facts").

A route may declare one window as data::

    "window": {"policy": "latest" | "settle" | "batch" | "grouped",
               "grouping": [field, ...],          # grouped: required; latest/settle: default the partition
               "close_after_seconds": 30,         # the window closes this long after it opens (DB clock)
               "max_items": 100}                  # batch/grouped: it also closes when full

- ``latest``: the sealed window applies only its greatest SourcePosition member;
- ``settle``, ``batch``, ``grouped``: it applies every member in SourcePosition order.

There is at most one ``open`` window per epoch, route and canonical grouping
key (a unique index over ``open_key``). Admission adds a member under the
window's row lock; a seal clears ``open_key`` and mints the window's one
Execution in the same transaction, so input that races a seal lands in a
successor window and two closers mint one Execution generation
(``Execution.window`` is unique). The ``window`` object itself is checked
when a pack is loaded, by :mod:`connectors.contracts.windows`.
"""
from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction

from connectors.models import Event, Execution, OrderingLane, Projection, ProjectionWindow
from connectors.selectors import windows_due
from connectors.serving.gates import NotServing, serving_lock
from connectors.store import ExecutionStore, OrderingLaneStore, ProjectionWindowStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import StaleVersion

log = logging.getLogger(__name__)

FP_BEFORE_SEAL = failpoints.declare("window.before_seal")


def grouping_of(route: dict, raw: dict, partition: list) -> tuple[list, str]:
    """The canonical grouping values and key of one admitted item."""
    window = route["window"]
    fields = window.get("grouping") or ([] if window["policy"] == "batch" else None)
    values = partition if fields is None else [None if raw.get(f) is None else str(raw.get(f)) for f in fields]
    key = digest_v2("connectors.window-grouping", [
        ("route_key", route["route_key"]), ("grouping", canonical_json.dumps(values))]).hexdigest
    return values, key


def lock_open_windows(*, org_id: str, epoch, route_key: str, grouping_keys: list[str]) -> dict[str, ProjectionWindow]:
    """Lock every open window of this epoch and route among ``grouping_keys``, in ascending id order.

    Admission locks the windows a batch needs once, before it adds members,
    so windows are always locked in the canonical key order.
    """
    if not grouping_keys:
        return {}
    rows = ProjectionWindowStore.lock_all(org_id, epoch=epoch, route_key=route_key, open_key__in=sorted(set(grouping_keys)),
                                          state="open")
    return {row.open_key: row for row in rows}


def window_for_member(*, org_id: str, epoch, account_key: str, route: dict, lane: OrderingLane | None,
                      grouping: list, grouping_key: str, held: dict[str, ProjectionWindow]) -> ProjectionWindow:
    """The locked open window for this grouping key, opening a new one when none is open.

    ``held`` is the map :func:`lock_open_windows` returned; a window opened or
    sealed here updates it. Two admissions opening the same window collide on
    the unique ``open_key`` index; the loser's transaction retries and finds
    the winner's window.
    """
    window = held.get(grouping_key)
    if window is not None and window.state == "open":
        return window
    close = route["window"]
    window = ProjectionWindowStore.create(
        org_id=org_id, epoch=epoch, account_key=account_key, route_key=route["route_key"], grouping_key=grouping_key,
        open_key=grouping_key, grouping=grouping, policy=close["policy"],
        close_policy={"close_after_seconds": close["close_after_seconds"], "max_items": close.get("max_items", 1000)},
        lane=lane, state="open", close_at=db_now() + dt.timedelta(seconds=close["close_after_seconds"]))
    held[grouping_key] = window
    return window


def window_add_member(window: ProjectionWindow, epoch, account: dict) -> ProjectionWindow:
    """Count a member in the locked open window; seal it when it is full."""
    count = window.member_count + 1
    window.version = ProjectionWindowStore.touch(org_id=window.org_id, pk=window.pk, state="open",
                                                 version=window.version, set_fields={"member_count": count})
    window.member_count = count
    if count >= window.close_policy["max_items"]:
        seal(window, epoch, account)
        window.state = "sealed"
    return window


def seal(window: ProjectionWindow, epoch, account: dict) -> Execution:
    """Seal the locked open window and mint its one Execution (same transaction).

    Raises:
        StaleVersion: the window moved since it was locked.
    """
    failpoints.hit(FP_BEFORE_SEAL)
    ProjectionWindowStore.transition(org_id=window.org_id, pk=window.pk, src="open", dst="sealed",
                                     version=window.version, set_fields={"open_key": None})
    applied = _applied_members(window)
    chosen = applied[-1]
    input_digest = digest_v2("connectors.window-input", [
        ("window_id", window.pk), ("policy", window.policy),
        ("members", canonical_json.dumps([p.input_digest for p in applied]))]).hexdigest
    command_id = digest_v2("connectors.runtime-command", [
        ("org_id", window.org_id), ("window_id", window.pk), ("generation", 1)]).hexdigest
    execution_ref = digest_v2("connectors.execution-ref", [
        ("command_id", command_id), ("window_id", window.pk),
        ("pack_generation_id", account["pack_generation"]["id"]), ("epoch_digest", epoch.digest),
        ("definition_digest", chosen.definition_digest), ("input_digest", input_digest)]).hexdigest
    return ExecutionStore.create(org_id=window.org_id, projection=chosen, generation=1, lane=window.lane,
                                 position=bytes(chosen.event.position), state="ready", command_id=command_id,
                                 execution_ref_digest=execution_ref, window=window)


def _applied_members(window: ProjectionWindow) -> list[Projection]:
    """The member Projections a window applies, in SourcePosition order (``latest``: only the greatest)."""
    members = list(Projection.objects.filter(org_id=window.org_id, window_id=window.pk).select_related("event"))
    members.sort(key=lambda p: (bytes(p.event.position), p.pk))
    return members[-1:] if window.policy == "latest" else members


def window_members(execution: Execution) -> list[Event]:
    """The events a window Execution applies, in SourcePosition order."""
    return [p.event for p in _applied_members(execution.window)]


def window_try_close_one() -> bool:
    """Seal one open window whose ``close_at`` passed (DB clock). Returns ``True`` if one was sealed."""
    for org_id, window_id in windows_due(db_now()):
        window = ProjectionWindow.objects.filter(org_id=org_id, pk=window_id).first()
        if window is None:
            continue
        try:
            with transaction.atomic(durable=True):
                ctx = serving_lock(org_id=org_id, account_key=window.account_key)
                if window.epoch_id != ctx.epoch.pk:
                    continue  # a predecessor epoch's window drains through the handoff, not here
                if window.lane_id is not None:
                    OrderingLaneStore.lock(org_id, window.lane_id)
                locked = ProjectionWindowStore.lock(org_id, window.pk)
                if locked.state != "open" or locked.close_at > db_now():
                    continue
                seal(locked, ctx.epoch, ctx.account)
                return True
        except (NotServing, StaleVersion) as exc:
            log.info("window %s not sealed: %s", window_id, exc, extra={"code": getattr(exc, "code", None)})
    return False
