"""Egress recovery: abandon Permits whose holder is proven terminated, reconcile ``uncertain`` effects,
and verify a provider's create conflict with a read before trusting it (seed 003 "State machines",
"Transaction and crash rules"; seed 002 "Ambiguous Remote Effect").
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass

import httpx
from django.db import transaction

from connectors import reasons
from connectors.contracts import create_conflict_recovery as conflict_recovery
from connectors.contracts import outcomes
from connectors.links.link_keys import effect_remote_scope
from connectors.models import (
    DispatchPermit,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteEffectEvidence,
    RemoteLink,
)
from connectors.outbound.egress_common import (
    KNOWN_LANES,
    RETRY_AFTER_STATUSES,
    EgressRefused,
    append_evidence,
    backoff,
    bearer,
    frozen_contract,
    quarantine,
    retry_after,
)
from connectors.outbound.permit_settle import link_create
from connectors.serving.gates import CredentialUnavailable, resolve_frozen_secret
from connectors.store import (
    DispatchPermitStore,
    RemoteEffectAttemptStore,
    RemoteEffectStore,
)
from connectors.workers import holder_termination_proof, record_holder_termination
from nexusflow.kernel import locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.rows import first_row
from nexusflow.kernel.tls import tls_context

log = logging.getLogger(__name__)

# --- recovery ---------------------------------------------------------------------------
def permit_try_abandon_one(*, lanes: tuple[str, ...] = KNOWN_LANES) -> bool:
    """Close one open Permit of an effect of ``lanes`` whose holder process is proven terminated.

    ``granted`` proves no I/O: effect back to ``prepared``. ``sending`` may
    have crossed the boundary: effect ``uncertain``.
    """
    lanes = tuple(lane for lane in lanes if lane in KNOWN_LANES)
    for permit in DispatchPermit.objects.filter(state__in=("granted", "sending"),
                                                attempt__effect__dispatch_lane__in=lanes).order_by("id")[:50]:
        proof = holder_termination_proof(permit.holder_id)
        if proof is None:
            continue
        # The registry keeps the proof of this process generation's end; its egress ended with it.
        proof = record_holder_termination(permit.holder_id, proof)
        attempt = RemoteEffectAttempt.objects.get(org_id=permit.org_id, pk=permit.attempt_id)
        with transaction.atomic(durable=True):
            effect, locked, attempt = locks.acquire([
                locks.store_resource(RemoteEffectStore, permit.org_id, attempt.effect_id),
                locks.store_resource(DispatchPermitStore, permit.org_id, permit.pk),
                locks.store_resource(RemoteEffectAttemptStore, permit.org_id, attempt.pk),
            ])
            if locked.state not in ("granted", "sending") or effect.state != "dispatching":
                continue
            was_sending = locked.state == "sending"
            DispatchPermitStore.transition(org_id=locked.org_id, pk=locked.pk, src=locked.state, dst="abandoned",
                                           version=locked.version, set_fields={"closed_evidence": json.dumps(proof)})
            RemoteEffectAttemptStore.transition(org_id=attempt.org_id, pk=attempt.pk, src="started",
                                                dst="uncertain" if was_sending else "no_effect", version=attempt.version,
                                                set_fields={"error": reasons.HOLDER_ABANDONED})
            RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="dispatching",
                                         dst="uncertain" if was_sending else "prepared", version=effect.version,
                                         set_fields={"reason_code": reasons.HOLDER_ABANDONED if was_sending else ""})
        return True
    return False


#: Due uncertain effects the reconciler reads per query while it pages past parked ones.
RECONCILE_PAGE = 50


def _due_uncertain(now, lanes: tuple[str, ...]):
    """Every due ``uncertain`` effect of ``lanes`` (all orgs: a worker scan) in id order, a page at a time.

    Parked effects (operator-only reasons, or a profile that is not replay-safe)
    never move on their own; paging past them keeps any number of them from
    starving a later effect the reconciler can release. Operator-only reasons
    are excluded in SQL already. A row that leaves the set between pages can
    make the next page skip one row; the next call reads it.
    """
    offset, page = 0, RECONCILE_PAGE
    while True:
        rows = list(RemoteEffect.objects.filter(state="uncertain", dispatch_lane__in=lanes)
                    .exclude(next_attempt_at__gt=now).exclude(reason_code__in=reasons.OPERATOR_ONLY_UNCERTAIN)
                    .select_related("command").order_by("id")[offset:offset + page])
        yield from rows
        if len(rows) < page:
            return
        offset += page


def effect_try_reconcile_one(*, lanes: tuple[str, ...] = KNOWN_LANES, client: httpx.Client | None = None) -> bool:
    """Move one due ``uncertain`` effect on: exact idempotent repeat, or quarantine when exhausted.

    Only a frozen replay-safe idempotency contract allows ``uncertain ->
    prepared``; without it the effect stays parked for an operator. A create
    parked ``create_conflict_existing`` is resolved by its contract's verify
    read instead (:func:`effect_verify_create_conflict`; ``client`` serves that read).
    """
    from runtime_outbox.services import intent_result_record

    now = db_now()
    lanes = tuple(lane for lane in lanes if lane in KNOWN_LANES)
    for effect in _due_uncertain(now, lanes):
        if effect.reason_code == reasons.CREATE_CONFLICT_EXISTING:
            if effect_verify_create_conflict(effect, client=client):
                return True
            continue
        _binding, _contract_doc, profile = frozen_contract(effect)
        rules = outcomes.policy(profile)
        last = effect.attempts.order_by("-attempt_number").first()
        replay_safe = rules.replay_safe and last is not None and bool(last.idempotency_key)
        if not replay_safe or effect.reason_code in reasons.OPERATOR_ONLY_UNCERTAIN:
            continue  # parked: only an operator may resolve it
        with transaction.atomic(durable=True):
            locked = RemoteEffectStore.lock(effect.org_id, effect.pk)
            if locked.state != "uncertain" or locked.version != effect.version:
                # The decision above was read without the lock; if the effect moved
                # since (another dispatch and settlement may have parked it again with
                # an operator-only reason), it is decided afresh on a later round.
                continue
            if locked.attempt_count >= rules.max_attempts:
                RemoteEffectStore.transition(org_id=locked.org_id, pk=locked.pk, src="uncertain", dst="quarantined",
                                             version=locked.version, set_fields={"reason_code": reasons.RETRY_EXHAUSTED})
                intent_result_record(command=effect.command, outcome="quarantined", remote_id="",
                                     evidence={"reason": reasons.RETRY_EXHAUSTED, "attempts": locked.attempt_count})
            else:
                # The backoff was served while uncertain; the exact repeat may go now. The
                # uncertain Attempt stays as it is; the evidence row says why the effect moved.
                append_evidence(locked, kind="exact_repeat", actor="reconciler", to_state="prepared",
                                detail={"attempt_number": last.attempt_number,
                                        "idempotency_key": last.idempotency_key,
                                        "request_digest": last.request_digest})
                RemoteEffectStore.transition(org_id=locked.org_id, pk=locked.pk, src="uncertain", dst="prepared",
                                             version=locked.version,
                                             set_fields={"next_attempt_at": None, "reason_code": ""})
        return True
    return False


@dataclass(frozen=True)
class VerifyRead:
    status: int | None
    body: bytes
    error: str
    retry_after: str | None = None


def _verify_read(effect: RemoteEffect, binding: dict, contract: dict, profile: dict, remote_id: str,
                 client: httpx.Client | None) -> VerifyRead:
    """GET the candidate through the frozen base URL and credential generation; no transaction is open.

    A revoked or disabled credential generation, or unreadable secret material, reads nothing
    (a transient answer: the effect stays parked and is read again later).
    """
    from connectors.models import CredentialGenerationDispatchGate

    if transaction.get_connection().in_atomic_block:
        raise EgressRefused("the verify read must not run inside a transaction")
    headers = {"Accept": "application/json"}
    frozen = binding.get("credential_generation")
    try:
        if frozen:
            gate = first_row(CredentialGenerationDispatchGate, org_id=effect.org_id,
                             credential_generation_id=frozen["id"])
            if gate is None or gate.state != "enabled":
                return VerifyRead(None, b"", "credential generation not enabled")
        if profile.get("auth", {}).get("kind") == "bearer":
            headers["Authorization"] = bearer(resolve_frozen_secret(org_id=effect.org_id, frozen=frozen))
    except CredentialUnavailable as exc:
        return VerifyRead(None, b"", exc.code)
    url = binding["base_url"].rstrip("/") + conflict_recovery.verify_path(contract, remote_id)
    owned = client is None
    if owned:
        client = httpx.Client(timeout=outcomes.timeout_seconds(profile), verify=tls_context())
    try:
        reply = client.request("GET", url, headers=headers)
        return VerifyRead(reply.status_code, reply.content, "",
                          reply.headers.get("Retry-After") if reply.status_code in RETRY_AFTER_STATUSES else None)
    except httpx.HTTPError as exc:
        return VerifyRead(None, b"", f"{type(exc).__name__}: {exc}"[:255])
    finally:
        if owned:
            client.close()


def _candidate_linked_elsewhere(effect: RemoteEffect, contract: dict, remote_id: str) -> bool:
    """True when another non-retired link of the same owner, destination slot and account holds ``remote_id``."""
    owner_key = effect.command.frozen_binding["pack_generation"]["owner_key"]
    return RemoteLink.objects.filter(
        org_id=effect.org_id, owner_key=owner_key, destination_slot_id=contract["destination_slot_id"],
        remote_scope=effect_remote_scope(effect), live_remote_id=remote_id).exclude(link_key=effect.link_key) \
        .exclude(state="retired").exists()


def effect_verify_create_conflict(effect: RemoteEffect, *, client: httpx.Client | None = None) -> bool:
    """Prove or refute the candidate a refused create named, by the contract's verify read.

    Args:
        effect: an ``uncertain`` effect with reason ``create_conflict_existing``
            (read without a lock; re-checked under the lock after the read).
        client: optional HTTP client for the read (tests inject faults through it).

    Returns:
        ``True`` when the effect moved or was rescheduled; ``False`` when it
        carries no candidate evidence or its contract declares no recovery (left
        parked for an operator).

    The identity fields of the FROZEN create request (the bytes the create
    Attempt sent, never the live record) are compared with the remote record:
    a match confirms the effect with the candidate id and creates the slot's
    link exactly as a 2xx create does (``remote_confirmed``; finalization
    writes the mirror and the Runtime receipt); a mismatch quarantines it
    (``create_conflict_identity_mismatch``), a 404/410 too
    (``create_conflict_candidate_gone``), and so does a match whose candidate
    is already another record's linked remote record
    (``create_conflict_candidate_linked``: that link is left as it is); any other answer or no answer leaves
    it parked with ``next_attempt_at`` pushed back (``Retry-After`` honoured).
    No create is sent; the read holds no transaction.

    Seed 002 "Lifecycle", "Retry And Recovery Semantics"; seed 003 "Transaction and crash rules".
    """
    binding, contract, profile = frozen_contract(effect)
    found = (RemoteEffectEvidence.objects.filter(org_id=effect.org_id, effect=effect, kind="create_conflict_existing")
             .order_by("-id").first())
    if conflict_recovery.recovery_of(contract) is None or found is None:
        return False
    candidate = found.detail["candidate_remote_id"]
    attempt = effect.attempts.get(org_id=effect.org_id, attempt_number=found.detail["attempt_number"])
    request = conflict_recovery.request_fields(contract, bytes(attempt.request_body))
    read = _verify_read(effect, binding, contract, profile, candidate, client)
    verdict, differing = conflict_recovery.judge(contract, request=request, status=read.status, body=read.body)
    now = db_now()
    with transaction.atomic(durable=True):
        locked = RemoteEffectStore.lock(effect.org_id, effect.pk)
        if locked.state != "uncertain" or locked.version != effect.version \
                or locked.reason_code != reasons.CREATE_CONFLICT_EXISTING:
            return True  # moved meanwhile: decided afresh on a later round
        detail = {"candidate_remote_id": candidate, "verify_status": read.status, "verdict": verdict,
                  "attempt_number": attempt.attempt_number, "request_digest": attempt.request_digest,
                  "mismatched_fields": differing}
        if verdict == conflict_recovery.TRANSIENT:
            wait = max(backoff(locked.attempt_count), retry_after(read.retry_after) or dt.timedelta())
            log.info("verify read of effect %s deferred: %s", locked.pk, read.error or read.status,
                     extra={"org_id": locked.org_id, "effect_id": int(locked.pk)})
            RemoteEffectStore.touch(org_id=locked.org_id, pk=locked.pk, state=locked.state, version=locked.version,
                                    set_fields={"next_attempt_at": now + wait})
            return True
        if verdict == conflict_recovery.MATCH and _candidate_linked_elsewhere(locked, contract, candidate):
            verdict = "linked_elsewhere"
        if verdict == conflict_recovery.MATCH:
            try:
                link_create(locked, contract, candidate)
            except EgressRefused as exc:
                # Another link holds that id: parked for an operator, as after a 2xx create.
                append_evidence(locked, kind="create_conflict_unlinkable", actor="reconciler", to_state="uncertain",
                                detail={**detail, "error": str(exc)[:200]})
                RemoteEffectStore.touch(org_id=locked.org_id, pk=locked.pk, state=locked.state,
                                        version=locked.version,
                                        set_fields={"reason_code": reasons.REMOTE_LOCATOR_CONFLICT})
                return True
            append_evidence(locked, kind="create_conflict_verified", actor="reconciler", to_state="remote_confirmed",
                            detail=detail)
            RemoteEffectStore.transition(org_id=locked.org_id, pk=locked.pk, src="uncertain", dst="remote_confirmed",
                                         version=locked.version,
                                         set_fields={"remote_id": candidate, "reason_code": "",
                                                     "next_attempt_at": None})
            return True
        reason = {conflict_recovery.GONE: reasons.CREATE_CONFLICT_CANDIDATE_GONE,
                  "linked_elsewhere": reasons.CREATE_CONFLICT_CANDIDATE_LINKED}.get(
            verdict, reasons.CREATE_CONFLICT_IDENTITY_MISMATCH)
        detail["verdict"] = verdict
        append_evidence(locked, kind="create_conflict_refuted", actor="reconciler", to_state="quarantined",
                        detail={**detail, "reason": reason})
        quarantine(locked, reason)
    return True
