"""The sole egress adapter: DispatchPermit acquisition, one-shot send, settlement, recovery.

Seed 003 "State machines" (DispatchPermit, RemoteEffect) and "Transaction and
crash rules"; seed 002 "Before POST", "After POST", "Before PATCH".

Per effect: (1) grant: lock gate -> epoch -> credential gate -> effect,
append an Attempt and a ``granted`` Permit, effect ``dispatching``;
(2) send: lock credential gate -> Permit, win ``granted -> sending``
(``io_may_have_started``), commit, then call the provider; (3) settle: lock
effect -> Permit, append the response, move the effect and close the Permit
``returned``; (4) finalize: lock record -> effect, write the mirror, record the
Runtime intent receipt. No transaction spans the HTTP call.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import urllib.parse
from dataclasses import dataclass

import httpx
from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json, failpoints, locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError, StaleVersion
from nexusflow.kernel.scope import OrgScope

from . import reasons
from .links import PUSH_ACTION_TYPE
from .models import (
    DispatchPermit,
    PackGeneration,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteLink,
)
from .selectors import head_of_lane_prepared
from .serving import NotServing, resolve_frozen_secret, serving_lock
from .store import (
    CredentialDispatchGateStore,
    DispatchPermitStore,
    RemoteEffectAttemptStore,
    RemoteEffectStore,
    RemoteLinkStore,
)
from .workers import holder_termination_proof

log = logging.getLogger(__name__)

FP_AFTER_GRANT = failpoints.declare("permit.after_grant")
FP_AFTER_SENDING = failpoints.declare("permit.after_sending")
FP_AFTER_RESPONSE = failpoints.declare("permit.after_response")
FP_AFTER_SETTLE = failpoints.declare("effect.after_settle")

NONTERMINAL = ("prepared", "dispatching", "uncertain", "remote_confirmed")
#: Ambiguous attempts allowed before an effect is quarantined for an operator.
MAX_UNCERTAIN_ATTEMPTS = 10


class EgressRefused(NexusError):
    code = "egress_refused"


@dataclass(frozen=True)
class Grant:
    org_id: str
    effect_id: RemoteEffect.Id
    attempt_id: RemoteEffectAttempt.Id
    permit_id: DispatchPermit.Id
    holder_fence: str


def _backoff(attempts: int) -> dt.timedelta:
    return dt.timedelta(seconds=min(30.0, 0.25 * (2 ** min(attempts, 7))))


def _contract(effect: RemoteEffect) -> tuple[dict, dict, dict]:
    binding = effect.command.frozen_binding
    pack = PackGeneration.objects.get(pk=binding["pack_generation"]["id"])
    if pack.digest != binding["pack_generation"]["digest"]:
        raise EgressRefused("frozen pack generation digest mismatch")
    contract = next(c for c in pack.document["push_contracts"] if c["contract_key"] == binding["contract_key"])
    profile = next(p for p in pack.document["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
    return binding, contract, profile


def _content_type(contract: dict) -> str:
    return "application/x-www-form-urlencoded" if contract.get("body_encoding", "json") == "form" else "application/json"


def _encode_body(contract: dict, fields: dict) -> bytes:
    """The request bytes for ``fields``: sorted form encoding or canonical JSON, per the contract."""
    if contract.get("body_encoding", "json") == "form":
        return urllib.parse.urlencode(sorted(fields.items())).encode("utf-8")
    return canonical_json.dumps(fields)


# --- candidates -------------------------------------------------------------
def _is_head(effect: RemoteEffect) -> bool:
    earlier = RemoteEffect.objects.filter(org_id=effect.org_id, dispatch_lane=effect.dispatch_lane,
                                          state__in=NONTERMINAL).exclude(pk=effect.pk)
    for other in earlier.only("lane_sequence", "id"):
        if (other.lane_sequence, other.pk) < (effect.lane_sequence, effect.pk):
            return False
    return True


# --- (1) grant -----------------------------------------------------------------
def permit_try_grant_one(*, worker_id: str) -> Grant | None:
    """Grant a DispatchPermit for the next dispatchable effect, or return ``None``."""
    now = db_now()
    for org_id, effect_id in head_of_lane_prepared(now, NONTERMINAL):
        effect = RemoteEffect.objects.select_related("command").get(org_id=org_id, pk=effect_id)
        try:
            grant = _grant(effect, worker_id)
        except (NotServing, StaleVersion) as exc:
            log.info("grant skipped effect %s: %s", effect_id, exc)
            continue
        if grant is not None:
            failpoints.hit(FP_AFTER_GRANT)
            return grant
    return None


def _grant(effect: RemoteEffect, worker_id: str) -> Grant | None:
    binding, contract, _profile = _contract(effect)
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=effect.org_id, account_key=effect.account_key)
        if binding["epoch"]["id"] != ctx.epoch.pk or binding["epoch"]["digest"] != ctx.epoch.digest:
            raise NotServing(f"effect {effect.pk} is bound to epoch {binding['epoch']['id']}, not the active one")
        credential_gate = None
        if binding.get("credential_generation"):
            credential_gate = CredentialDispatchGateStore.lock_where(
                effect.org_id, credential_generation_id=binding["credential_generation"]["id"])
            if credential_gate.state != "enabled":
                return None
        effect = RemoteEffectStore.lock(effect.org_id, effect.pk)
        if effect.state != "prepared" or not _is_head(effect):
            return None
        previous = effect.attempts.order_by("-attempt_number").first()
        if previous is not None and previous.state == "uncertain":
            # Exact repeat under the frozen idempotency contract: same bytes, same key.
            operation, method, path = previous.operation, previous.method, previous.path
            body, key = bytes(previous.request_body), previous.idempotency_key
        else:
            plan = _plan_request(effect, binding, contract)
            if plan is None:
                return None
            operation, method, path, body, key = plan
        attempt = RemoteEffectAttemptStore.create(
            org_id=effect.org_id, effect=effect, attempt_number=(previous.attempt_number + 1) if previous else 1,
            operation=operation, method=method, path=path, request_body=body,
            request_digest=digest_v2("connectors.effect-request", [("method", method), ("path", path),
                                                                    ("body", body)]).hexdigest,
            idempotency_key=key or "", state="started")
        fence = secrets.token_hex(16)
        if credential_gate is None:
            raise EgressRefused("the binding names no credential generation")
        permit = DispatchPermitStore.create(
            org_id=effect.org_id, attempt=attempt, gate=ctx.gate, credential_gate=credential_gate, state="granted",
            holder_id=worker_id, holder_fence=fence, gate_fence_token=ctx.gate.fence_token,
            credential_fence_token=credential_gate.fence_token)
        RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="prepared", dst="dispatching",
                                     version=effect.version, set_fields={"attempt_count": effect.attempt_count + 1})
        return Grant(effect.org_id, effect.pk, attempt.pk, permit.pk, fence)


def _plan_request(effect: RemoteEffect, binding: dict, contract: dict):
    """Decide create vs update from the RemoteLink (never from a mirror field)."""
    link = RemoteLink.objects.filter(org_id=effect.org_id, link_key=effect.dispatch_lane).first()
    body = _encode_body(contract, effect.command.request_fields)
    key = binding.get("provider_idempotency_key")
    if link is None:
        prior = RemoteEffect.objects.filter(org_id=effect.org_id, dispatch_lane=effect.dispatch_lane,
                                            state="quarantined").exclude(pk=effect.pk).exists()
        if prior:
            _quarantine(effect, reasons.PRIOR_CREATE_UNRESOLVED)
            return None
        return "create", contract["create"]["method"], contract["create"]["path"], body, key
    if link.state != "active":
        _quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    path = contract["update"]["path"].replace("{remote_id}", urllib.parse.quote(link.remote_id, safe=""))
    return "update", contract["update"]["method"], path, body, key


def _quarantine(effect: RemoteEffect, reason: str) -> None:
    from runtime_outbox.services import intent_result_record

    version = RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src=effect.state, dst="quarantined",
                                           version=effect.version, set_fields={"reason_code": reason})
    effect.state, effect.version = "quarantined", version
    intent_result_record(command=effect.command, outcome="quarantined", remote_id="", evidence={"reason": reason})


# --- (2) send ---------------------------------------------------------------------
@dataclass(frozen=True)
class Response:
    status: int | None
    body: bytes
    error: str
    connect_failed: bool = False


def permit_send(grant: Grant, *, client: httpx.Client | None = None) -> Response | None:
    """Win ``granted -> sending`` and make the one provider call.

    Returns:
        The provider response, or ``None`` when this caller lost the one-shot
        transition (another caller sent, or the Permit was closed).
    """
    effect = RemoteEffect.objects.select_related("command").get(org_id=grant.org_id, pk=grant.effect_id)
    binding, contract, profile = _contract(effect)
    secret = None
    if profile.get("auth", {}).get("kind") == "bearer":
        # Resolved while the Permit is still provably pre-I/O: missing material blocks before ``sending``.
        secret = resolve_frozen_secret(org_id=grant.org_id, frozen=binding["credential_generation"])
    with transaction.atomic(durable=True):
        permit = DispatchPermit.objects.get(pk=grant.permit_id, org_id=grant.org_id)
        credential_gate = CredentialDispatchGateStore.lock(grant.org_id, permit.credential_gate_id)
        if credential_gate.state != "enabled" or credential_gate.fence_token != permit.credential_fence_token:
            return None
        permit = DispatchPermitStore.lock(grant.org_id, grant.permit_id)
        if permit.state != "granted" or permit.holder_fence != grant.holder_fence:
            return None
        DispatchPermitStore.transition(org_id=grant.org_id, pk=permit.pk, src="granted", dst="sending",
                                       version=permit.version, fences={"holder_fence": grant.holder_fence},
                                       set_fields={"io_may_have_started_at": db_now()})
    failpoints.hit(FP_AFTER_SENDING)
    attempt = RemoteEffectAttempt.objects.get(org_id=grant.org_id, pk=grant.attempt_id)
    headers = {"Content-Type": _content_type(contract), "Accept": "application/json"}
    if secret is not None:
        headers["Authorization"] = "Bearer " + secret.decode("utf-8")
    if attempt.idempotency_key and profile.get("idempotency", {}).get("header"):
        headers[profile["idempotency"]["header"]] = attempt.idempotency_key
    url = binding["base_url"].rstrip("/") + attempt.path
    owned = client is None
    client = client or httpx.Client(timeout=float(profile.get("timeout_seconds", 10)))
    try:
        reply = client.request(attempt.method, url, content=bytes(attempt.request_body), headers=headers)
        return Response(reply.status_code, reply.content, "")
    except httpx.ConnectError as exc:
        return Response(None, b"", f"connect: {exc}", connect_failed=True)
    except httpx.HTTPError as exc:
        return Response(None, b"", f"{type(exc).__name__}: {exc}"[:255])
    finally:
        if owned:
            client.close()


# --- (3) settle -----------------------------------------------------------------
def _extract_id(body: bytes, path: str) -> str | None:
    try:
        value = json.loads(body.decode("utf-8"))
        for part in path.split("."):
            value = value[part]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value) and str(value) == str(value).strip():
        return str(value)
    return None


def permit_settle(grant: Grant, response: Response) -> str:
    """Record the provider response and move the effect; returns the new effect state.

    Raises:
        FenceRejected: the Permit is no longer this holder's ``sending`` Permit.
    """
    from runtime_outbox.services import intent_result_record

    effect = RemoteEffect.objects.select_related("command").get(org_id=grant.org_id, pk=grant.effect_id)
    _binding, contract, _profile = _contract(effect)
    now = db_now()
    with transaction.atomic(durable=True):
        effect, permit, attempt = locks.acquire([
            locks.store_resource(RemoteEffectStore, grant.org_id, grant.effect_id),
            locks.store_resource(DispatchPermitStore, grant.org_id, grant.permit_id),
            locks.store_resource(RemoteEffectAttemptStore, grant.org_id, grant.attempt_id),
        ])
        if permit.state != "sending" or permit.holder_fence != grant.holder_fence or effect.state != "dispatching":
            raise StaleVersion(f"permit {permit.pk} is {permit.state}; effect {effect.pk} is {effect.state}")
        evidence = {"response_status": response.status, "response_body": response.body, "error": response.error}
        status = response.status
        if status is not None and 200 <= status < 300:
            remote_id = _extract_id(response.body, contract["response_id_path"])
            if attempt.operation == "create" and remote_id is None:
                new_state, attempt_state, reason = "uncertain", "uncertain", reasons.RESPONSE_ID_MISSING
            else:
                if attempt.operation == "create":
                    _link_create(effect, contract, remote_id)
                else:
                    remote_id = RemoteLink.objects.get(org_id=effect.org_id, link_key=effect.dispatch_lane).remote_id
                new_state, attempt_state, reason = "remote_confirmed", "confirmed", ""
                evidence["remote_id"] = remote_id
        elif status is not None and status in contract.get("definite_refusal_statuses", []):
            new_state, attempt_state, reason = "no_effect", "no_effect", reasons.DEFINITE_REFUSAL
            if attempt.operation == "update" and status == 404:
                link = RemoteLinkStore.lock(effect.org_id, RemoteLink.objects.get(
                    org_id=effect.org_id, link_key=effect.dispatch_lane).pk)
                if link.state == "active":
                    RemoteLinkStore.transition(org_id=link.org_id, pk=link.pk, src="active", dst="suspended_drift",
                                               version=link.version,
                                               set_fields={"reason_code": reasons.REMOTE_NOT_FOUND})
        elif response.connect_failed or (status is not None and status in contract.get("not_performed_statuses", [])):
            # Connection refused, or a status the contract declares as "not performed"
            # (rate limited, idempotency key busy): proof of no effect, retry after backoff.
            new_state, attempt_state, reason = "prepared", "no_effect", ""
        elif status is None or status in contract.get("retryable_statuses", []):
            # Timeout, reset, or a status that may follow a performed request: ambiguous.
            new_state, attempt_state, reason = "uncertain", "uncertain", reasons.RESPONSE_AMBIGUOUS
        else:
            # A status the contract does not classify: ambiguous and parked for an operator.
            new_state, attempt_state, reason = "uncertain", "uncertain", reasons.UNCLASSIFIED_RESPONSE
        RemoteEffectAttemptStore.transition(
            org_id=attempt.org_id, pk=attempt.pk, src="started", dst=attempt_state, version=attempt.version,
            set_fields={"response_status": status, "response_body": response.body, "error": response.error[:255],
                        "remote_id": evidence.get("remote_id") or ""})
        RemoteEffectStore.transition(
            org_id=effect.org_id, pk=effect.pk, src="dispatching", dst=new_state, version=effect.version,
            set_fields={"reason_code": reason, "remote_id": evidence.get("remote_id") or "",
                        "next_attempt_at": now + _backoff(effect.attempt_count)})
        DispatchPermitStore.transition(
            org_id=permit.org_id, pk=permit.pk, src="sending", dst="returned", version=permit.version,
            fences={"holder_fence": grant.holder_fence},
            set_fields={"closed_evidence": json.dumps({"status": status, "error": response.error[:200]})})
        if new_state == "no_effect":
            intent_result_record(command=effect.command, outcome="no_effect", remote_id="",
                                 evidence={"status": status, "reason": reason})
    failpoints.hit(FP_AFTER_SETTLE)
    return new_state


def _link_create(effect: RemoteEffect, contract: dict, remote_id: str) -> None:
    command = effect.command
    binding = command.frozen_binding
    snapshot = {"pack_generation": binding["pack_generation"], "contract_key": binding["contract_key"],
                "contract_digest": binding["contract_digest"], "epoch": binding["epoch"],
                "create_path": contract["create"]["path"], "update_path": contract["update"]["path"],
                "response_id_path": contract["response_id_path"]}
    try:
        with transaction.atomic():
            RemoteLinkStore.create(
                org_id=effect.org_id, link_key=effect.dispatch_lane, owner_key=binding["pack_generation"]["owner_key"],
                action_slot_id=contract["action_slot_id"], action_type=PUSH_ACTION_TYPE,
                destination_slot_id=contract["destination_slot_id"], source_object=command.source_object,
                source_record_key=command.source_record_key, remote_scope=effect.account_key, remote_id=remote_id,
                live_remote_id=remote_id, state="active", snapshot=snapshot, created_by_effect_id=effect.pk)
    except IntegrityError:
        existing = RemoteLink.objects.filter(org_id=effect.org_id, link_key=effect.dispatch_lane).first()
        if existing is None or existing.remote_id != remote_id:
            raise EgressRefused(f"remote id {remote_id} conflicts with an existing link") from None


# --- (4) finalize -------------------------------------------------------------------
def effect_try_finalize_one() -> bool:
    """Finalize one ``remote_confirmed`` effect: mirror writeback + Runtime receipt. Never calls the provider."""
    from nexusflow.records.metadata import InvalidFieldValue
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock, record_write_mirror
    from runtime_outbox.services import intent_result_record

    effect = RemoteEffect.objects.filter(state="remote_confirmed").select_related("command").order_by("id").first()
    if effect is None:
        return False
    command = effect.command
    _binding, contract, _profile = _contract(effect)
    with transaction.atomic(durable=True):
        mirror = "skipped"
        record = None
        try:
            record = record_lock(org=OrgScope(effect.org_id), object_name=command.source_object,
                                 record_key=command.source_record_key)
        except Record.DoesNotExist:
            mirror = "source_deleted"
        effect = RemoteEffectStore.lock(effect.org_id, effect.pk)
        if effect.state != "remote_confirmed":
            return True
        if record is not None and contract.get("mirror_field"):
            try:
                record_write_mirror(org=OrgScope(effect.org_id), record=record, field=contract["mirror_field"],
                                    value=effect.remote_id)
                mirror = "written"
            except InvalidFieldValue:
                mirror = "conflict"
        RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="remote_confirmed", dst="finalized",
                                     version=effect.version)
        intent_result_record(command=command, outcome="finalized", remote_id=effect.remote_id,
                             evidence={"mirror": mirror})
    return True


# --- recovery ---------------------------------------------------------------------------
def permit_try_abandon_one() -> bool:
    """Close one open Permit whose holder process is proven terminated.

    ``granted`` proves no I/O: effect back to ``prepared``. ``sending`` may
    have crossed the boundary: effect ``uncertain``.
    """
    for permit in DispatchPermit.objects.filter(state__in=("granted", "sending")).order_by("id")[:50]:
        proof = holder_termination_proof(permit.holder_id)
        if proof is None:
            continue
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


def effect_try_reconcile_one() -> bool:
    """Move one due ``uncertain`` effect on: exact idempotent repeat, or quarantine when exhausted.

    Only a frozen replay-safe idempotency contract allows ``uncertain ->
    prepared``; without it the effect stays parked for an operator.
    """
    from runtime_outbox.services import intent_result_record

    now = db_now()
    for effect in (RemoteEffect.objects.filter(state="uncertain").exclude(next_attempt_at__gt=now)
                   .select_related("command").order_by("id")[:20]):
        _binding, _contract_doc, profile = _contract(effect)
        last = effect.attempts.order_by("-attempt_number").first()
        replay_safe = bool(profile.get("idempotency", {}).get("replay_safe")) and last is not None and last.idempotency_key
        if not replay_safe or effect.reason_code in reasons.OPERATOR_ONLY_UNCERTAIN:
            continue  # parked: only an operator may resolve it
        with transaction.atomic(durable=True):
            locked = RemoteEffectStore.lock(effect.org_id, effect.pk)
            if locked.state != "uncertain" or locked.version != effect.version:
                # The decision above was read without the lock; if the effect moved
                # since (another dispatch and settlement may have parked it again with
                # an operator-only reason), it is decided afresh on a later round.
                continue
            uncertain = RemoteEffectAttempt.objects.filter(org_id=locked.org_id, effect_id=locked.pk,
                                                            state="uncertain").count()
            if uncertain >= MAX_UNCERTAIN_ATTEMPTS:
                RemoteEffectStore.transition(org_id=locked.org_id, pk=locked.pk, src="uncertain", dst="quarantined",
                                             version=locked.version, set_fields={"reason_code": reasons.RETRY_EXHAUSTED})
                intent_result_record(command=effect.command, outcome="quarantined", remote_id="",
                                     evidence={"reason": reasons.RETRY_EXHAUSTED, "attempts": locked.attempt_count})
            else:
                # The backoff was served while uncertain; the exact repeat may go now.
                RemoteEffectStore.transition(org_id=locked.org_id, pk=locked.pk, src="uncertain", dst="prepared",
                                             version=locked.version,
                                             set_fields={"next_attempt_at": None, "reason_code": ""})
        return True
    return False


def effect_try_dispatch_one(*, worker_id: str, client: httpx.Client | None = None) -> bool:
    """Grant, send and settle one effect. Returns ``True`` if work was done."""
    grant = permit_try_grant_one(worker_id=worker_id)
    if grant is None:
        return False
    response = permit_send(grant, client=client)
    if response is None:
        return True
    failpoints.hit(FP_AFTER_RESPONSE)
    try:
        permit_settle(grant, response)
    except StaleVersion as exc:
        log.warning("settlement of permit %s fenced: %s", grant.permit_id, exc)
    return True
