"""V1 event execution: SchedulerLease, claim with lease, Runtime handoff, completion on acceptance, recovery.

Seed 003 "V1 concepts to retire": the V1 Event carries its own execution status,
lease, retry and owner; the org's SchedulerLease participates in execution
ownership; and Runtime handoff acceptance is the event's completion. The handoff
crosses the Runtime message boundary (ARCHITECTURE.md section 2, "Runtime message
families"): the ``runtime.command.handoff`` message is published in the same
transaction that moves the event ``running -> handed_off``; the Runtime command
inbox (:mod:`runtime_outbox.command_inbox`) accepts it; the event completes when
that acceptance is committed. V1 never writes a record itself.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from connectors.reasons import V1_HANDOFF_REJECTED, V1_RETRY_EXHAUSTED
from connectors.v1.config import live_account, live_pack
from connectors.v1.ingress import payload_digest
from connectors.v1.models import V1Event, V1SchedulerLease
from connectors.v1.store import V1EventStore, V1SchedulerLeaseStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import StaleVersion
from nexusflow.kernel.scope import TrustedRuntimeWorkScope
from nexusflow.kernel.workers import holder_termination_proof
from runtime_outbox import messages
from runtime_outbox.selectors import inbox_acceptance_state
from runtime_outbox.services import outbox_deliver_now

log = logging.getLogger(__name__)

#: The SchedulerLease name under which V1 events are claimed.
EVENT_SCHEDULER = "v1.events"
#: The Runtime capability V1 hands its application commands to.
RUNTIME_CAPABILITY = "connectors.v1.inbound"

FP_AFTER_CLAIM = failpoints.declare("v1.event.after_claim")
FP_AFTER_HANDOFF = failpoints.declare("v1.event.after_handoff")


def lease_seconds() -> float:
    """Seconds a V1 claim (and the SchedulerLease) lasts: ``NEXUS_V1_LEASE_SECONDS``, default 30."""
    return float(os.environ.get("NEXUS_V1_LEASE_SECONDS", "30"))


def max_attempts() -> int:
    """Claims a V1 event gets before it fails with ``v1_retry_exhausted``: ``NEXUS_V1_MAX_ATTEMPTS``, default 5."""
    return int(os.environ.get("NEXUS_V1_MAX_ATTEMPTS", "5"))


def retry_backoff(attempts: int) -> dt.timedelta:
    """The wait before a lost or failed claim is retried: 2 ** attempts seconds, capped at 60 s."""
    return dt.timedelta(seconds=min(60, 2 ** attempts))


@dataclass(frozen=True)
class V1Claim:
    org_id: str
    event_id: V1Event.Id
    lease_token: str
    scheduler_fence: int


# --- SchedulerLease ---------------------------------------------------------------------------------
def scheduler_lease_hold(*, org_id: str, name: str, worker_id: str, now: dt.datetime) -> V1SchedulerLease | None:
    """Take or renew the org's SchedulerLease ``name`` for ``worker_id`` inside the caller's transaction.

    A lease held by another worker is taken over only once it expired or its
    holder is proven terminated; each take-over increments ``fence_token``.

    Returns:
        The locked lease (held by ``worker_id`` until ``now + lease_seconds()``), or ``None`` when another
        live holder has it.

    Raises:
        RuntimeError: called outside a transaction.
        IntegrityError: a concurrent first creation of the lease (the caller's transaction rolls back).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("the SchedulerLease is held inside the claiming transaction")
    expires = now + dt.timedelta(seconds=lease_seconds())
    lease = V1SchedulerLeaseStore.lock_by_name(org_id, name)
    if lease is None:
        return V1SchedulerLeaseStore.create(org_id=org_id, name=name, state="held", holder=worker_id,
                                            fence_token=1, expires_at=expires)
    if lease.state == "held" and lease.holder != worker_id and lease.expires_at > now \
            and holder_termination_proof(lease.holder) is None:
        return None
    fence = lease.fence_token if (lease.state == "held" and lease.holder == worker_id) else lease.fence_token + 1
    fields = {"holder": worker_id, "fence_token": fence, "expires_at": expires}
    if lease.state == "free":
        version = V1SchedulerLeaseStore.transition(org_id=org_id, pk=lease.pk, src="free", dst="held",
                                                   version=lease.version, set_fields=fields)
    else:
        version = V1SchedulerLeaseStore.touch(org_id=org_id, pk=lease.pk, state="held", version=lease.version,
                                              set_fields=fields)
    lease.state, lease.version, lease.holder, lease.fence_token, lease.expires_at = \
        "held", version, worker_id, fence, expires
    return lease


# --- claim ---------------------------------------------------------------------------------------------
def v1_event_claim(*, org_id: str, worker_id: str) -> V1Claim | None:
    """Claim the oldest due ``pending`` V1 event of ``org_id`` under the org's SchedulerLease.

    Returns:
        The claim (event ``running``, leased to ``worker_id``), or ``None`` (no due event, or another live
        worker holds the SchedulerLease).

    Seed 003 "V1 concepts to retire" (Event lease/owner; SchedulerLease participation).
    """
    now = db_now()
    try:
        with transaction.atomic(durable=True):
            lease = scheduler_lease_hold(org_id=org_id, name=EVENT_SCHEDULER, worker_id=worker_id, now=now)
            if lease is None:
                return None
            event = V1EventStore.lock_due(org_id, now)
            if event is None:
                return None
            token = secrets.token_hex(16)
            V1EventStore.transition(
                org_id=org_id, pk=event.pk, src="pending", dst="running", version=event.version,
                set_fields={"lease_owner": worker_id, "lease_token": token, "scheduler_fence": lease.fence_token,
                            "lease_expires_at": now + dt.timedelta(seconds=lease_seconds()),
                            "attempt_count": event.attempt_count + 1})
            return V1Claim(org_id, event.pk, token, lease.fence_token)
    except IntegrityError:
        return None  # a concurrent first creation of the SchedulerLease won; the next round claims


# --- handoff --------------------------------------------------------------------------------------------
def v1_handoff_facts(event: V1Event) -> tuple[TrustedRuntimeWorkScope, str, dict]:
    """``(scope, message key, payload)`` of the event's ``runtime.command.handoff`` message.

    The application command is the live route's ``application`` block plus the
    event's facts, the shape Runtime's command handlers take. The command id
    and ExecutionRef digest are derived from the event identity, so a retried
    handoff publishes the exact same message (a duplicate is a no-op).
    """
    account = live_account(event.org_id, event.account_key)
    route = next(r for r in live_pack(account)["inbound_routes"] if r["route_key"] == event.route_key)
    command = {
        "application": route["application"], "owner_key": live_owner_key(account),
        "account_key": event.account_key, "route_key": event.route_key,
        **({"remote_scope": account["remote_scope"]} if account.get("remote_scope") else {}),
        "canonical_kind": event.canonical_kind, "source_locator": event.source_locator,
        "source_event_key": event.source_event_key, "payload": event.payload,
    }
    command_id = "v1-" + digest_v2("connectors.v1.command-id", [
        ("org_id", event.org_id), ("account_key", event.account_key),
        ("source_event_key", event.source_event_key)]).hexdigest[:48]
    execution_ref = digest_v2("connectors.v1.execution-ref", [
        ("command_id", command_id), ("event_id", int(event.pk)), ("payload", payload_digest(event.payload))]).hexdigest
    binding = digest_v2("connectors.v1.binding", [("route", canonical_json.dumps(route))]).hexdigest
    scope = TrustedRuntimeWorkScope(event.org_id, f"connectors.v1:{account['pack_key']}", RUNTIME_CAPABILITY, binding)
    return scope, command_id, {"command_id": command_id, "execution_ref_digest": execution_ref, "command": command}


def live_owner_key(account: dict) -> str:
    """The ConnectorOwnerKey of the account's pack (its ``owner_key``), read from the live pack document."""
    return live_pack(account)["owner_key"]


def v1_event_handoff(claim: V1Claim) -> str | None:
    """Publish the claimed event's application command and move it ``running -> handed_off``, in one transaction.

    Returns:
        The outbox message id as text, or ``None`` when the claim's lease was lost (nothing published).
    """
    event = V1Event.objects.get(org_id=claim.org_id, pk=claim.event_id)
    scope, key, payload = v1_handoff_facts(event)
    with transaction.atomic(durable=True):
        event = V1EventStore.lock(claim.org_id, claim.event_id)
        if event.state != "running" or event.lease_token != claim.lease_token:
            return None
        V1EventStore.transition(org_id=claim.org_id, pk=event.pk, src="running", dst="handed_off",
                                version=event.version, fences={"lease_token": claim.lease_token},
                                set_fields={"handoff_key": key})
        message = messages.publish(scope, messages.RUNTIME_COMMAND_HANDOFF, key, payload)
    return str(message.pk)


def v1_event_complete(*, org_id: str, event_id: V1Event.Id) -> str | None:
    """Complete a ``handed_off`` event from its Runtime inbox acceptance (or fail it on a rejected tombstone).

    Returns:
        The event's new state, or ``None`` while the Runtime has not decided yet.

    Seed 003 "Existing foundations and schema ownership": for V1, handoff acceptance is completion.
    """
    event = V1Event.objects.get(org_id=org_id, pk=event_id)
    verdict = inbox_acceptance_state(org_id=org_id, message_key=event.handoff_key) if event.handoff_key else None
    if verdict is None:
        return None
    with transaction.atomic(durable=True):
        event = V1EventStore.lock(org_id, event_id)
        if event.state != "handed_off":
            return event.state
        if verdict == "accepted":
            V1EventStore.transition(org_id=org_id, pk=event.pk, src="handed_off", dst="completed",
                                    version=event.version, set_fields={"completed_at": db_now(), "lease_token": "",
                                                                       "lease_expires_at": None})
            return "completed"
        V1EventStore.transition(org_id=org_id, pk=event.pk, src="handed_off", dst="failed", version=event.version,
                                set_fields={"reason_code": V1_HANDOFF_REJECTED})
        return "failed"


# --- worker units -----------------------------------------------------------------------------------------
def v1_event_try_run_one(*, worker_id: str) -> bool:
    """Claim one due V1 event, hand it to the Runtime, deliver the handoff in-process, complete it.

    Returns:
        True when an event was claimed.

    Raises:
        RuntimeError: called inside a transaction.
    """
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("V1 workers run outside any transaction")
    now = db_now()
    orgs = list(V1Event.objects.filter(state="pending").exclude(next_attempt_at__gt=now)
                .order_by("id").values_list("org_id", flat=True).distinct()[:20])
    for org_id in dict.fromkeys(orgs):
        claim = v1_event_claim(org_id=org_id, worker_id=worker_id)
        if claim is None:
            continue
        failpoints.hit(FP_AFTER_CLAIM)
        message_id = v1_event_handoff(claim)
        if message_id is None:
            return True
        failpoints.hit(FP_AFTER_HANDOFF)
        # The same-process delivery of ARCHITECTURE.md section 2: the relay would do exactly this.
        outbox_deliver_now(org_id=claim.org_id, message_id=int(message_id))
        v1_event_complete(org_id=claim.org_id, event_id=claim.event_id)
        return True
    return False


def v1_event_try_complete_one() -> bool:
    """Complete one ``handed_off`` V1 event whose Runtime acceptance (or rejection) has committed since.

    Returns:
        True when an event moved.
    """
    for event in V1Event.objects.filter(state="handed_off").order_by("updated_at", "id")[:50]:
        if v1_event_complete(org_id=event.org_id, event_id=event.pk) in ("completed", "failed"):
            return True
    return False


def v1_event_try_recover_one() -> bool:
    """Return one ``running`` V1 event whose lease expired (or whose holder is proven gone) to ``pending``.

    The retry waits :func:`retry_backoff`; an event claimed :func:`max_attempts` times fails with
    ``v1_retry_exhausted`` instead. Seed 003 "V1 concepts to retire" (Event lease and retry).

    Returns:
        True when an event moved.
    """
    now = db_now()
    for event in V1Event.objects.filter(state="running").order_by("lease_expires_at", "id")[:50]:
        if event.lease_expires_at > now and holder_termination_proof(event.lease_owner) is None:
            continue
        with transaction.atomic(durable=True):
            locked = V1EventStore.lock(event.org_id, event.pk)
            if locked.state != "running" or locked.lease_token != event.lease_token:
                continue
            try:
                if locked.attempt_count >= max_attempts():
                    V1EventStore.transition(org_id=locked.org_id, pk=locked.pk, src="running", dst="failed",
                                            version=locked.version, set_fields={"reason_code": V1_RETRY_EXHAUSTED})
                else:
                    V1EventStore.transition(
                        org_id=locked.org_id, pk=locked.pk, src="running", dst="pending", version=locked.version,
                        set_fields={"lease_owner": "", "lease_token": "", "lease_expires_at": None,
                                    "next_attempt_at": now + retry_backoff(locked.attempt_count)})
            except StaleVersion:
                continue
        return True
    return False
