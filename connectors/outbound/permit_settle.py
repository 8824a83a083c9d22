"""Egress step 3, settle: lock effect -> Permit, append the response, classify it with the frozen callout
policy, move the effect and close the Permit ``returned``; a confirmed create writes its RemoteLink
(seed 003 "State machines"; seed 002 "After POST", "Drift Matrix").
"""
from __future__ import annotations

import datetime as dt
import json
import logging

from django.db import IntegrityError, transaction

from connectors import reasons
from connectors.contracts import create_conflict_recovery as conflict_recovery
from connectors.contracts import outcomes
from connectors.links.link_keys import PUSH_ACTION_TYPE, effect_remote_scope
from connectors.models import (
    DispatchPermit,
    RemoteEffect,
    RemoteLink,
)
from connectors.outbound.egress_common import (
    FP_AFTER_SETTLE,
    FP_LANE_PAUSE_BEFORE_COMMIT,
    EgressRefused,
    Grant,
    Response,
    append_evidence,
    backoff,
    current_action_config,
    frozen_contract,
    retry_after,
    suspend_links,
)
from connectors.store import (
    CredentialDispatchGateStore,
    DispatchPermitStore,
    RemoteEffectAttemptStore,
    RemoteEffectStore,
    RemoteLinkStore,
)
from nexusflow.kernel import failpoints, locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity, StaleVersion
from nexusflow.kernel.identity import canonical_locator
from nexusflow.kernel.rows import first_row, get_joined, get_row

log = logging.getLogger(__name__)

# --- (3) settle -----------------------------------------------------------------
def _extract_id(body: bytes, path: str) -> str | None:
    """The remote id at ``path`` in a JSON body, or ``None`` when absent or not a canonical locator
    that fits a RemoteLink (a text or integer id; no control or invisible characters, at most 160)."""
    try:
        value = json.loads(body.decode("utf-8"))
        for part in path.split("."):
            value = value[part]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if not isinstance(value, (str, int)):
        return None
    try:
        return canonical_locator(value, field="response remote id",
                                 max_length=RemoteLink._meta.get_field("remote_id").max_length)
    except InvalidIdentity:
        return None


def permit_settle(grant: Grant, response: Response) -> str:
    """Record the provider response and move the effect; returns the new effect state.

    A create answered with a status the contract's ``create_conflict_recovery``
    lists, whose body names an existing remote id, is neither confirmed nor a
    definite refusal: the effect parks ``uncertain`` (``create_conflict_existing``)
    with the candidate id in its evidence, due at once for
    :func:`effect_verify_create_conflict`. A ``Retry-After`` (delay seconds) on a
    429/503 answer pushes the next attempt back, capped at :data:`MAX_RETRY_AFTER`.
    A rate-limit answer (the profile's ``rate_limit.statuses``, default 429)
    first pauses the credential's dispatch lane (:func:`lane_pause`), returns
    the effect to ``prepared`` whatever its Attempt count and is never counted
    toward ``retry.max_attempts``.

    Raises:
        FenceRejected: the Permit is no longer this holder's ``sending`` Permit.
    """
    from runtime_outbox.services import intent_result_record

    read = get_joined(RemoteEffect, ("command",), org_id=grant.org_id, pk=grant.effect_id)
    _binding, contract, profile = frozen_contract(read)
    now = db_now()
    limits = outcomes.rate_limit(profile)
    rate_limited = response.status in limits.statuses
    paused_until = lane_pause(grant, limits, response, now) if rate_limited else None
    with transaction.atomic(durable=True):
        effect, permit, attempt = locks.acquire([
            locks.store_resource(RemoteEffectStore, grant.org_id, grant.effect_id),
            locks.store_resource(DispatchPermitStore, grant.org_id, grant.permit_id),
            locks.store_resource(RemoteEffectAttemptStore, grant.org_id, grant.attempt_id),
        ])
        if permit.state != "sending" or permit.holder_fence != grant.holder_fence or effect.state != "dispatching":
            raise StaleVersion(f"permit {permit.pk} is {permit.state}; effect {effect.pk} is {effect.state}")
        if effect.command_id == read.command_id:
            effect.command = read.command  # the immutable intent read with the effect above, not read again
        evidence = {"response_status": response.status, "response_body": response.body, "error": response.error}
        status = response.status
        verdict = outcomes.classify(profile, status=status, connect_failed=response.connect_failed)
        next_attempt_at = now + max(backoff(effect.attempt_count), retry_after(response.retry_after) or dt.timedelta())
        candidate = None
        if attempt.operation == "create" and verdict != outcomes.CONFIRMED:
            candidate = conflict_recovery.existing_id(contract, status=status, body=response.body)
        if candidate is not None:
            # The create was refused because its identity exists remotely, and the answer names a candidate.
            # Not a no_effect (the slot's record may well exist) and never a second create: parked for the
            # reconciler's verify read of the candidate (seed 002 "Retry And Recovery Semantics").
            new_state, attempt_state, reason = "uncertain", "no_effect", reasons.CREATE_CONFLICT_EXISTING
            append_evidence(effect, kind="create_conflict_existing", actor="egress", to_state="uncertain",
                            detail={"candidate_remote_id": candidate, "status": status,
                                    "attempt_number": attempt.attempt_number,
                                    "request_digest": attempt.request_digest})
            next_attempt_at = now
        elif verdict == outcomes.CONFIRMED:
            remote_id = _extract_id(response.body, contract["response_id_path"])
            unlinkable = None
            if attempt.operation == "create" and remote_id is not None:
                try:
                    link_create(effect, contract, remote_id)
                except EgressRefused as exc:
                    # Another link holds that id: the Permit still closes; an operator decides.
                    unlinkable = str(exc)
            if attempt.operation == "create" and (remote_id is None or unlinkable):
                new_state, attempt_state = "uncertain", "uncertain"
                reason = reasons.REMOTE_LOCATOR_CONFLICT if unlinkable else reasons.RESPONSE_ID_MISSING
                evidence["error"] = (unlinkable or response.error or "2xx create without a usable remote id")
            else:
                if attempt.operation != "create":
                    link = RemoteLinkStore.lock(effect.org_id, RemoteLink.objects.get(
                        org_id=effect.org_id, link_key=effect.link_key).pk)
                    remote_id = link.remote_id
                    if effect.lane_sequence > link.last_pushed_version:
                        RemoteLinkStore.touch(org_id=link.org_id, pk=link.pk, state=link.state, version=link.version,
                                              set_fields={"last_pushed_version": effect.lane_sequence})
                new_state, attempt_state, reason = "remote_confirmed", "confirmed", ""
                evidence["remote_id"] = remote_id
        elif verdict == outcomes.REFUSED:
            new_state, attempt_state, reason = "no_effect", "no_effect", reasons.DEFINITE_REFUSAL
            if attempt.operation == "update":
                _suspend_on_remote_evidence(effect, profile, status, response.body)
            elif effect.attempts.filter(org_id=effect.org_id, state="uncertain").exists():
                # A refused repeat proves nothing about the earlier create that may have landed: the effect
                # stays ambiguous, never a proven no_effect a successor could supersede with a second POST.
                new_state, reason = "uncertain", reasons.RESPONSE_AMBIGUOUS
        elif verdict == outcomes.NOT_PERFORMED:
            # Proof of no effect: another Attempt only while the frozen policy has Attempts left. A
            # rate-limit answer performed nothing and is never counted: the paused lane spaces the retries.
            attempt_state = "no_effect"
            counted = effect.attempt_count - effect.attempts.filter(
                org_id=effect.org_id, response_status__in=limits.statuses).exclude(pk=attempt.pk).count()
            if paused_until is not None:
                next_attempt_at = max(next_attempt_at, paused_until)
            if rate_limited or counted < outcomes.policy(profile).max_attempts:
                new_state, reason = "prepared", ""
            elif effect.attempts.filter(org_id=effect.org_id, state="uncertain").exists():
                # This Attempt proves nothing about an earlier one that may have landed: the effect
                # stays ambiguous (the reconciler quarantines it, exhausted), never a proven no_effect
                # a successor could supersede with a second POST (seed 002 "After POST").
                new_state, reason = "uncertain", reasons.RESPONSE_AMBIGUOUS
            else:
                new_state, reason = "no_effect", reasons.RETRY_EXHAUSTED
        elif verdict == outcomes.AMBIGUOUS:
            new_state, attempt_state, reason = "uncertain", "uncertain", reasons.RESPONSE_AMBIGUOUS
        else:
            # A status the profile does not classify: ambiguous and parked for an operator.
            new_state, attempt_state, reason = "uncertain", "uncertain", reasons.UNCLASSIFIED_RESPONSE
        RemoteEffectAttemptStore.transition(
            org_id=attempt.org_id, pk=attempt.pk, src="started", dst=attempt_state, version=attempt.version,
            set_fields={"response_status": status, "response_body": response.body, "error": evidence["error"][:255],
                        "remote_id": evidence.get("remote_id") or ""})
        RemoteEffectStore.transition(
            org_id=effect.org_id, pk=effect.pk, src="dispatching", dst=new_state, version=effect.version,
            set_fields={"reason_code": reason, "remote_id": evidence.get("remote_id") or "",
                        "next_attempt_at": next_attempt_at})
        DispatchPermitStore.transition(
            org_id=permit.org_id, pk=permit.pk, src="sending", dst="returned", version=permit.version,
            fences={"holder_fence": grant.holder_fence},
            set_fields={"closed_evidence": json.dumps({"status": status, "error": response.error[:200]})})
        if new_state == "no_effect":
            intent_result_record(command=effect.command, outcome="no_effect", remote_id="",
                                 evidence={"status": status, "reason": reason, "classified": verdict})
    failpoints.hit(FP_AFTER_SETTLE)
    return new_state


#: ``pause_kind`` of a credential dispatch lane paused by a ``Retry-After`` window / a declared daily limit.
PAUSE_RATE_LIMITED, PAUSE_DAILY_LIMIT = "rate_limited", "daily_limit"


def daily_reset(now: dt.datetime, reset_hour_utc: int) -> dt.datetime:
    """The next ``reset_hour_utc`` o'clock (UTC) strictly after ``now`` (the database clock)."""
    reset = now.astimezone(dt.UTC).replace(hour=reset_hour_utc, minute=0, second=0, microsecond=0)
    return reset if reset > now else reset + dt.timedelta(days=1)


def lane_pause(grant: Grant, limits: outcomes.RateLimit, response: Response, now: dt.datetime) -> dt.datetime | None:
    """Pause the Permit's credential dispatch lane for a rate-limit answer; returns the end of the pause.

    Seed 004 section 16 (egress per DispatchLane); issue 22 item 3. A rate
    limit is the provider's, shared by every worker sending with the same
    credential: the window is written on the credential dispatch gate, which
    every grant locks before it appends a Permit, so no Permit is granted to
    that lane before ``paused_until`` (the database clock). A daily limit (the
    profile's declared header and value) pauses until the next reset hour; a
    ``Retry-After`` (delay seconds, capped at :data:`MAX_RETRY_AFTER`) for its
    window. A pause only ever extends. Returns ``None`` (nothing written) for a
    rate-limit answer with neither. Runs in its own transaction, committed
    before the settlement (the gate ranks before the effect in the lock
    order): a crash between the two leaves the lane paused and the effect
    ``dispatching`` for recovery.
    """
    if limits.daily_header and response.rate_scope is not None \
            and response.rate_scope.strip().lower() == limits.daily_value.lower():
        until, kind = daily_reset(now, limits.reset_hour_utc), PAUSE_DAILY_LIMIT
    else:
        window = retry_after(response.retry_after)
        if window is None:
            return None
        until, kind = now + window, PAUSE_RATE_LIMITED
    permit = get_row(DispatchPermit, {"org_id": grant.org_id, "pk": grant.permit_id})
    with transaction.atomic(durable=True):
        gate = CredentialDispatchGateStore.lock(grant.org_id, permit.credential_gate_id)
        if gate.paused_until is not None and gate.paused_until >= until:
            return gate.paused_until
        CredentialDispatchGateStore.touch(
            org_id=gate.org_id, pk=gate.pk, state=gate.state, version=gate.version,
            set_fields={"paused_until": until, "pause_kind": kind, "pause_status": response.status})
        failpoints.hit(FP_LANE_PAUSE_BEFORE_COMMIT)
    log.info("credential gate %s paused until %s (%s, status %s)", gate.pk, until.isoformat(), kind, response.status)
    return until


#: Update-response statuses that prove the finalized link no longer names its remote record.
_REMOTE_GONE = (404, 410)


#: Refused update statuses read as an out-of-band change when the profile lists none
#: (``drift.conflict_statuses``): a conflict and a failed precondition.
DEFAULT_CONFLICT_STATUSES = (409, 412)


def _suspend_on_remote_evidence(effect: RemoteEffect, profile: dict, status: int | None, body: bytes) -> None:
    """A refused PATCH that proves the remote record gone or changed out-of-band suspends the link.

    Seed 002 "Before PATCH" and "Retry And Recovery Semantics" 8: remote 404 /
    deleted suspends (``remote_not_found``); a status the profile lists in
    ``drift.conflict_statuses`` (default :data:`DEFAULT_CONFLICT_STATUSES`: an
    out-of-band change, a failed precondition)
    suspends (``remote_conflict``) unless the profile declares
    ``"drift": {"remote_conflict": "reconcile"}`` (a safe reconciliation
    contract: the link stays active, the refused PATCH stays refused). Never a
    replacement create. Called with the effect, Permit and Attempt locked.
    """
    drift = profile.get("drift", {})
    if status in _REMOTE_GONE:
        reason = reasons.REMOTE_NOT_FOUND
    elif status in drift.get("conflict_statuses", DEFAULT_CONFLICT_STATUSES) \
            and drift.get("remote_conflict", "suspend") != "reconcile":
        reason = reasons.REMOTE_CONFLICT
    else:
        return
    link = RemoteLink.objects.get(org_id=effect.org_id, link_key=effect.link_key)
    suspend_links([link], reason, kind="remote_not_found" if reason == reasons.REMOTE_NOT_FOUND else "remote_conflict",
                   detail={"effect": int(effect.pk), "status": status,
                           "response_digest": digest_v2("connectors.response", [("body", bytes(body))]).hexdigest})


def link_create(effect: RemoteEffect, contract: dict, remote_id: str) -> None:
    """Finalize the slot's link in the settlement transaction (seed 002 "After POST" step 2).

    Raises:
        EgressRefused: another non-retired link of the same owner, destination
            slot and remote scope holds ``remote_id`` (the hard remote-locator
            uniqueness index); that link is suspended ``remote_locator_conflict``.
    """
    command = effect.command
    binding = command.frozen_binding
    snapshot = dict(current_action_config(effect, binding, contract))
    if binding.get("writeback"):
        snapshot["mirror_tuple"] = {"source_object": binding["writeback"]["source_object"],
                                    "field": binding["writeback"]["mirror_field"]}
    try:
        with transaction.atomic():
            RemoteLinkStore.create(
                org_id=effect.org_id, link_key=effect.link_key, owner_key=binding["pack_generation"]["owner_key"],
                action_slot_id=contract["action_slot_id"], action_type=PUSH_ACTION_TYPE,
                destination_slot_id=contract["destination_slot_id"], source_object=command.source_object,
                source_record_key=command.source_record_key, remote_scope=effect_remote_scope(effect, binding),
                remote_id=remote_id, live_remote_id=remote_id, state="active", snapshot=snapshot, created_by_effect_id=effect.pk,
                created_install_id=snapshot["install_id"], last_validated_install_id=snapshot["install_id"],
                mapping_fingerprint=snapshot["mapping_fingerprint"], body_fingerprint=snapshot["body_fingerprint"],
                last_pushed_version=effect.lane_sequence)
    except IntegrityError:
        existing = first_row(RemoteLink, org_id=effect.org_id, link_key=effect.link_key)
        if existing is not None and existing.remote_id == remote_id:
            return
        holder = RemoteLink.objects.filter(
            org_id=effect.org_id, owner_key=binding["pack_generation"]["owner_key"],
            destination_slot_id=contract["destination_slot_id"], remote_scope=effect_remote_scope(effect, binding),
            live_remote_id=remote_id).first()
        if holder is not None:
            suspend_links([holder], reasons.REMOTE_LOCATOR_CONFLICT, kind="remote_conflict",
                           detail={"effect": int(effect.pk), "claimed_by_link_key": effect.link_key,
                                   "remote_id": remote_id})
        raise EgressRefused(f"remote id {remote_id} conflicts with an existing link") from None
