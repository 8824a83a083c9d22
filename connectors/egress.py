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
from django.db import IntegrityError, OperationalError, transaction

from nexusflow.kernel import canonical_json, failpoints, locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError, StaleVersion
from nexusflow.kernel.identity import canonical_locator
from nexusflow.kernel.scope import OrgScope

from . import conflict_recovery, outcomes, reasons
from .links import PUSH_ACTION_TYPE, effect_remote_scope
from .models import (
    DispatchPermit,
    PackGeneration,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteEffectEvidence,
    RemoteLink,
)
from .outbound import mapping_source_fields, policy_digest
from .packs import REMOTE_ID_PLACEHOLDER
from .selectors import head_of_lane_prepared
from .serving import CredentialUnavailable, NotServing, resolve_frozen_secret, serving_lock
from .store import (
    CredentialDispatchGateStore,
    DispatchPermitStore,
    RemoteEffectAttemptStore,
    RemoteEffectStore,
    RemoteLinkStore,
)
from .workers import holder_termination_proof, record_holder_termination

log = logging.getLogger(__name__)

FP_GRANT_BEFORE_COMMIT = failpoints.declare("permit.grant_before_commit")
FP_AFTER_GRANT = failpoints.declare("permit.after_grant")
FP_SENDING_BEFORE_COMMIT = failpoints.declare("permit.sending_before_commit")
FP_AFTER_SENDING = failpoints.declare("permit.after_sending")
FP_AFTER_RESPONSE = failpoints.declare("permit.after_response")
FP_AFTER_SETTLE = failpoints.declare("effect.after_settle")
FP_FINALIZE_INTENT_LOCKED = failpoints.declare("effect.finalize_intent_locked")
FP_AFTER_FINALIZE = failpoints.declare("effect.after_finalize")

NONTERMINAL = ("prepared", "dispatching", "uncertain", "remote_confirmed")
#: The closed DispatchLane set (seed 002): a row with any other lane is never claimed or recovered.
KNOWN_LANES = ("configured", "deferred_association")


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


#: The longest wait a provider's ``Retry-After`` may impose on an effect's next attempt.
MAX_RETRY_AFTER = dt.timedelta(seconds=300)
#: Statuses whose ``Retry-After`` header is read (rate limited, unavailable).
RETRY_AFTER_STATUSES = (429, 503)


def _retry_after(value: str | None) -> dt.timedelta | None:
    """A ``Retry-After`` header in delay-seconds form, capped at :data:`MAX_RETRY_AFTER`; ``None`` otherwise.

    The HTTP-date form is not read: the wait then falls back to the capped exponential backoff.
    """
    if value is None or not value.strip().isdigit():
        return None
    return min(dt.timedelta(seconds=int(value.strip())), MAX_RETRY_AFTER)


def _contract(effect: RemoteEffect) -> tuple[dict, dict, dict]:
    binding = effect.command.frozen_binding
    pack = PackGeneration.objects.get(pk=binding["pack_generation"]["id"])
    if pack.digest != binding["pack_generation"]["digest"]:
        raise EgressRefused("frozen pack generation digest mismatch")
    contract = next(c for c in pack.document["push_contracts"] if c["contract_key"] == binding["contract_key"])
    profile = next(p for p in pack.document["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
    if "policy_digest" in binding and policy_digest(profile) != binding["policy_digest"]:
        raise EgressRefused("frozen callout policy digest mismatch")
    return binding, contract, profile


def append_evidence(effect: RemoteEffect, *, kind: str, actor: str, to_state: str, detail: dict) -> RemoteEffectEvidence:
    """Append one immutable reconciliation evidence row (inside the caller's transaction)."""
    from nexusflow.kernel.models import insert

    digest = digest_v2("connectors.effect-evidence", [
        ("effect", str(effect.pk)), ("kind", kind), ("from", effect.state), ("to", to_state),
        ("detail", canonical_json.dumps(detail))]).hexdigest
    return insert(RemoteEffectEvidence, org_id=effect.org_id, effect=effect, kind=kind, actor=actor[:120],
                  from_state=effect.state, to_state=to_state, detail=detail, digest=digest)


def _content_type(contract: dict) -> str:
    return "application/x-www-form-urlencoded" if contract.get("body_encoding", "json") == "form" else "application/json"


def _encode_body(contract: dict, fields: dict, associations: tuple = ()) -> bytes:
    """The request bytes for ``fields``: sorted form encoding or canonical JSON, per the contract.

    A JSON contract with ``"body_wrap": KEY`` sends ``{KEY: fields}``; a
    create with resolved ``associations`` (rendered templates) also carries
    them as a list under the contract's ``associations_key``.
    """
    if contract.get("body_encoding", "json") == "form":
        return urllib.parse.urlencode(sorted(fields.items())).encode("utf-8")
    if associations:
        return canonical_json.dumps({contract["body_wrap"]: fields, contract["associations_key"]: list(associations)})
    if contract.get("body_wrap"):
        return canonical_json.dumps({contract["body_wrap"]: fields})
    return canonical_json.dumps(fields)


# --- candidates -------------------------------------------------------------
def _is_head(effect: RemoteEffect) -> bool:
    """True when ``effect`` may dispatch now: first of its link_key, and the slot is not occupied.

    An effect already past ``prepared`` (dispatching, uncertain, remote_confirmed)
    occupies the slot whatever its lane_sequence: outbox delivery order can differ
    from record version order, and seed 002 allows no second active attempt per link_key.
    """
    others = RemoteEffect.objects.filter(org_id=effect.org_id, link_key=effect.link_key,
                                         state__in=NONTERMINAL).exclude(pk=effect.pk)
    for other in others.only("lane_sequence", "id", "state"):
        if other.state != "prepared" or (other.lane_sequence, other.pk) < (effect.lane_sequence, effect.pk):
            return False
    return True


# --- (1) grant -----------------------------------------------------------------
def permit_try_grant_one(*, worker_id: str, lanes: tuple[str, ...] = KNOWN_LANES) -> Grant | None:
    """Grant a DispatchPermit for the next dispatchable effect of ``lanes``, or return ``None``.

    Args:
        lanes: the DispatchLanes this claimant takes; values outside
            :data:`KNOWN_LANES` are dropped, so an unknown lane is never claimed.

    An effect whose frozen credential generation is revoked, or whose exact
    secret version is unreadable, stays ``prepared`` and blocked: dispatch
    never falls forward to a newer generation (seed 003 "Generation and replay").
    """
    lanes = tuple(lane for lane in lanes if lane in KNOWN_LANES)
    now = db_now()
    for org_id, effect_id in head_of_lane_prepared(now, NONTERMINAL, lanes):
        effect = RemoteEffect.objects.select_related("command").get(org_id=org_id, pk=effect_id)
        try:
            _require_material(effect)
            grant = _grant(effect, worker_id)
        except (NotServing, StaleVersion, CredentialUnavailable) as exc:
            log.info("grant skipped effect %s: %s", effect_id, exc)
            continue
        if grant is not None:
            failpoints.hit(FP_AFTER_GRANT)
            return grant
    return None


def _require_material(effect: RemoteEffect) -> None:
    """Raise :class:`CredentialUnavailable` unless the frozen secret version is readable and usable (bytes discarded)."""
    binding, _contract_doc, profile = _contract(effect)
    if profile.get("auth", {}).get("kind") == "bearer":
        _bearer(resolve_frozen_secret(org_id=effect.org_id, frozen=binding["credential_generation"]))


def _bearer(secret: bytes) -> str:
    """The ``Authorization`` header value for ``secret``.

    Raises:
        CredentialUnavailable: the bytes are not printable ASCII text (no header can carry them).
    """
    try:
        text = secret.decode("ascii")
    except UnicodeDecodeError:
        raise CredentialUnavailable("the secret is not ASCII text", code="credential_material_unusable") from None
    if not text or not all(" " <= ch <= "~" for ch in text):
        raise CredentialUnavailable("the secret holds control characters", code="credential_material_unusable")
    return "Bearer " + text


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
        if effect.state != "prepared" or effect.dispatch_lane not in KNOWN_LANES or not _is_head(effect):
            return None
        previous = effect.attempts.order_by("-attempt_number").first()
        if previous is not None and previous.state == "uncertain":
            # Exact repeat under the frozen idempotency contract: same bytes, same key. A create is
            # never repeated for a source deleted meanwhile: if the first call did not land, the
            # repeat would make an orphan remote row (seed 002 "Retry And Recovery Semantics" 7).
            if previous.operation == "create" and not _source_exists(effect):
                append_evidence(effect, kind="refused_before_post", actor="egress", to_state="quarantined",
                                detail={"reason": reasons.SOURCE_DELETED_BEFORE_POST, "repeat_of": previous.attempt_number})
                _quarantine(effect, reasons.SOURCE_DELETED_BEFORE_POST)
                return None
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
        failpoints.hit(FP_GRANT_BEFORE_COMMIT)
        return Grant(effect.org_id, effect.pk, attempt.pk, permit.pk, fence)


def _plan_request(effect: RemoteEffect, binding: dict, contract: dict):
    """Decide create vs update from the RemoteLink (never from a mirror field), failing closed.

    Runs in the grant transaction with the effect locked. Returns
    ``(operation, method, path, body, idempotency_key)``, or ``None`` when the
    effect was refused, superseded or parked instead (seed 002 "Before POST",
    "Before PATCH").

    An existing link is locked (after the effect: lock order) before anything
    is decided from it, so an operator decision on the link (retire, rebind,
    mapping revalidation) either commits first and is seen here, or waits for
    this grant and then sees the effect in flight.
    """
    link = RemoteLink.objects.filter(org_id=effect.org_id, link_key=effect.link_key).first()
    if link is not None:
        link = RemoteLinkStore.lock(link.org_id, link.pk)
    body = _encode_body(contract, effect.command.request_fields)
    key = binding.get("provider_idempotency_key")
    if link is None:
        if not _plan_create(effect, binding):
            return None
        body = _create_body(effect, binding, contract, body)
        if body is None:
            return None
        return "create", contract["create"]["method"], contract["create"]["path"], body, key
    path = _plan_update(effect, binding, contract, link)
    if path is None:
        return None
    return "update", contract["update"]["method"], path, body, key


def _current_action_config(effect: RemoteEffect, binding: dict, contract: dict) -> dict:
    """The action config the effect was frozen under (intents authored before seed 002 snapshots: rebuilt from
    the same immutable pack generation and epoch document)."""
    if binding.get("action_config"):
        return binding["action_config"]
    from .pushlinks import action_config_snapshot

    pack = PackGeneration.objects.get(pk=binding["pack_generation"]["id"])
    profile = next(p for p in pack.document["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
    account = {"base_url": binding["base_url"], "credentials": {}}
    credential_ref = profile.get("auth", {}).get("credential_ref")
    if credential_ref:
        account["credentials"][credential_ref] = binding.get("credential_generation")
    return action_config_snapshot(pack=pack, contract=contract, profile=profile, account=account)


def _source_exists(effect: RemoteEffect) -> bool:
    from nexusflow.records.models import Record

    return Record.objects.filter(org_id=effect.org_id, object_name=effect.command.source_object,
                                 record_key=effect.command.source_record_key, is_deleted=False).exists()


def _take_create_slot(effect: RemoteEffect) -> bool:
    """Occupy the link key's one create slot (unique index); ``False`` if another effect holds it."""
    if effect.create_slot == effect.link_key:
        return True
    try:
        with transaction.atomic():
            effect.version = RemoteEffectStore.touch(org_id=effect.org_id, pk=effect.pk, state=effect.state,
                                                     version=effect.version,
                                                     set_fields={"create_slot": effect.link_key})
    except IntegrityError:
        return False
    effect.create_slot = effect.link_key
    return True


def _plan_create(effect: RemoteEffect, binding: dict) -> bool:
    """Seed 002 "Before POST" gates of a create candidate; ``True`` when the create may be granted."""
    from .pushlinks import orphaned_lineage

    if not (effect.owner_key and effect.action_slot_id and effect.destination_slot_id):
        _refuse_create(effect, reasons.STABLE_SLOT_UNRESOLVED, {"slot": binding.get("slot")})
        return False
    if not _source_exists(effect):
        _refuse_create(effect, reasons.SOURCE_DELETED_BEFORE_POST,
                       {"source": f"{effect.command.source_object}/{effect.command.source_record_key}"})
        return False
    lineage = orphaned_lineage(org_id=effect.org_id, source_object=effect.command.source_object,
                               source_record_key=effect.command.source_record_key, link_key=effect.link_key)
    if lineage:
        _suspend_links(lineage.links, reasons.SLOT_LINEAGE_UNRESOLVED, kind="drift_suspended",
                       detail={"surfaces": ["slot_lineage"], "new_link_key": effect.link_key})
        _refuse_create(effect, reasons.SLOT_LINEAGE_UNRESOLVED, lineage.as_evidence())
        return False
    if not _take_create_slot(effect):
        _quarantine(effect, reasons.PRIOR_CREATE_UNRESOLVED)
        return False
    return True


#: How long a create waits before it looks again for a ``create_inline`` association target's link.
ASSOCIATION_WAIT = dt.timedelta(seconds=5)


def _create_body(effect: RemoteEffect, binding: dict, contract: dict, body: bytes) -> bytes | None:
    """The association-complete create body, or ``None`` when the create waits or was refused.

    Seed 002 "Deferred Association Dispatch Lane" and "Retry And Recovery
    Semantics" 1. Runs in the grant transaction with the effect locked, after
    the "Before POST" gates. A later Attempt of the same create reuses the
    body frozen on an earlier create Attempt (the association targets are
    never re-resolved). Otherwise the targets come from the frozen source-id
    vector (:func:`connectors.associations.association_resolve`): a
    ``create_inline`` target not linked yet leaves the effect ``prepared``
    with ``next_attempt_at`` :data:`ASSOCIATION_WAIT` ahead; a missing vector
    fails closed (``association_snapshot_missing``), a target that can never
    resolve too (``association_target_unresolved``); both quarantine the
    create before any Attempt.
    """
    from .associations import READY, SNAPSHOT_MISSING, WAIT, association_resolve

    if not contract.get("associations"):
        return body
    previous = effect.attempts.filter(operation="create").order_by("-attempt_number").first()
    if previous is not None:
        return bytes(previous.request_body)
    pack = PackGeneration.objects.get(pk=binding["pack_generation"]["id"])
    resolution = association_resolve(effect=effect, binding=binding, pack_document=pack.document, contract=contract)
    if resolution.verdict == READY:
        return _encode_body(contract, effect.command.request_fields, resolution.entries)
    if resolution.verdict == WAIT:
        effect.version = RemoteEffectStore.touch(org_id=effect.org_id, pk=effect.pk, state=effect.state,
                                                 version=effect.version,
                                                 set_fields={"next_attempt_at": db_now() + ASSOCIATION_WAIT})
        return None
    reason = (reasons.ASSOCIATION_SNAPSHOT_MISSING if resolution.verdict == SNAPSHOT_MISSING
              else reasons.ASSOCIATION_TARGET_UNRESOLVED)
    _refuse_create(effect, reason, {"association": resolution.detail, "live_lookup": resolution.live_lookup})
    return None


def _refuse_create(effect: RemoteEffect, reason: str, detail: dict) -> None:
    """A create candidate fails closed before any I/O: terminal ``quarantined`` holding the create slot.

    It stays the slot's unsuperseded terminal create, so a later save cannot
    POST either. It has no Attempt, which proves it never crossed the I/O
    boundary, so an operator may supersede it (``manage.py effects
    successor``) once the cause is resolved (seed 002 "Attempt Key").
    """
    _take_create_slot(effect)
    append_evidence(effect, kind="refused_before_post", actor="egress", to_state="quarantined",
                    detail={"reason": reason, **detail})
    _quarantine(effect, reason)


def _suspend_links(links, reason: str, *, kind: str, detail: dict, actor: str = "egress") -> None:
    """Move each still-active link to ``suspended_drift`` with ``reason`` and an evidence row."""
    from .pushlinks import append_link_evidence

    for link in sorted(links, key=lambda row: int(row.pk)):
        link = RemoteLinkStore.lock(link.org_id, link.pk)
        if link.state != "active":
            continue
        append_link_evidence(link, kind=kind, actor=actor, to_state="suspended_drift",
                             detail={"reason": reason, **detail})
        RemoteLinkStore.transition(org_id=link.org_id, pk=link.pk, src="active", dst="suspended_drift",
                                   version=link.version, set_fields={"reason_code": reason})


def _plan_update(effect: RemoteEffect, binding: dict, contract: dict, link: RemoteLink) -> str | None:
    """Seed 002 "Before PATCH": the link is the only PATCH authority; returns the rendered path or ``None``."""
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER, field_read_authority
    from runtime_outbox.services import intent_result_record

    from .pushlinks import Drift, append_link_evidence, patch_drift

    if link.last_pushed_version and effect.lane_sequence <= link.last_pushed_version:
        # This record version, or a newer one, already reached the remote: it is never sent (again).
        # Runtime's receipt says ``superseded``: nothing was sent, and this version or a newer one holds the remote.
        append_evidence(effect, kind="superseded", actor="egress", to_state="quarantined",
                        detail={"lane_sequence": effect.lane_sequence,
                                "link_last_pushed_version": link.last_pushed_version})
        RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="prepared", dst="quarantined",
                                     version=effect.version,
                                     set_fields={"reason_code": reasons.SUPERSEDED_BY_NEWER_VERSION})
        intent_result_record(command=effect.command, outcome="superseded", remote_id=link.remote_id,
                             evidence={"reason": reasons.SUPERSEDED_BY_NEWER_VERSION,
                                       "link_last_pushed_version": link.last_pushed_version})
        return None
    if link.state != "active":
        _quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    template = contract["update"]["path"]
    if template.count(REMOTE_ID_PLACEHOLDER) != 1:
        # The route cannot name the linked record (a generation published before publication refused
        # such routes): the update would reach whatever the body or the route chose, not the link's id.
        append_evidence(effect, kind="refused_before_patch", actor="egress", to_state="quarantined",
                        detail={"reason": reasons.LINK_NOT_PATCHABLE, "update_path": template,
                                "link_key": link.link_key})
        _quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    current = _current_action_config(effect, binding, contract)
    drift = patch_drift(link, current)
    if link.remote_scope != effect_remote_scope(effect, binding):
        # The slot is served by another account now: the remote id names a record of the old one's tenant.
        drift = Drift("suspend", ("remote_scope",))
    if drift.verdict == "suspend":
        _suspend_links([link], reasons.LINK_DRIFT, kind="drift_suspended",
                       detail={"surfaces": list(drift.surfaces), "install_id": current["install_id"]})
        _quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    if drift.verdict == "mapping":
        _quarantine(effect, reasons.MAPPING_DRIFT)
        return None
    authority = binding.get("authority") or {}
    decision = field_read_authority(user_id=authority.get("originating_user") or AUTOMATED_PROCESS_USER,
                                    object_name=effect.command.source_object,
                                    fields=mapping_source_fields(contract))
    if decision.denied:
        _quarantine(effect, reasons.AUTHORITY_DENIED)
        return None
    if drift.verdict == "validated":
        locked = RemoteLinkStore.lock(link.org_id, link.pk)
        snapshot = {**current, "mirror_tuple": locked.snapshot.get("mirror_tuple", current["mirror_tuple"])}
        append_link_evidence(locked, kind="drift_validated", actor="egress", to_state=locked.state,
                             detail={"surfaces": list(drift.surfaces), "install_id": current["install_id"]})
        RemoteLinkStore.touch(org_id=locked.org_id, pk=locked.pk, state=locked.state, version=locked.version,
                              set_fields={"snapshot": json.dumps(snapshot), "last_validated_install_id": current["install_id"]})
    try:
        remote_id = canonical_locator(link.remote_id, field="link remote id",
                                      max_length=RemoteLink._meta.get_field("remote_id").max_length)
    except InvalidIdentity:
        _quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    return template.replace(REMOTE_ID_PLACEHOLDER, urllib.parse.quote(remote_id, safe=""))


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
    #: The provider's ``Retry-After`` header on a 429/503 answer, as sent.
    retry_after: str | None = None


def permit_send(grant: Grant, *, client: httpx.Client | None = None) -> Response | None:
    """Win ``granted -> sending`` and make the one provider call.

    Returns:
        The provider response, or ``None`` when this caller lost the one-shot
        transition (another caller sent, or the Permit was closed).
    """
    effect = RemoteEffect.objects.select_related("command").get(org_id=grant.org_id, pk=grant.effect_id)
    binding, contract, profile = _contract(effect)
    attempt = RemoteEffectAttempt.objects.get(org_id=grant.org_id, pk=grant.attempt_id)
    owned = client is None
    # The whole request is built while the Permit is still provably pre-I/O: anything that cannot
    # be sent (missing or unusable material, an unbuildable request) closes the Permit before
    # ``sending``; after ``sending`` nothing but the provider call itself may fail.
    try:
        headers = {"Content-Type": _content_type(contract), "Accept": "application/json"}
        if profile.get("auth", {}).get("kind") == "bearer":
            headers["Authorization"] = _bearer(
                resolve_frozen_secret(org_id=grant.org_id, frozen=binding["credential_generation"]))
        header = outcomes.policy(profile).idempotency_header
        if attempt.idempotency_key and header:
            headers[header] = attempt.idempotency_key
        url = binding["base_url"].rstrip("/") + attempt.path
        if owned:
            client = httpx.Client(timeout=outcomes.timeout_seconds(profile))
        request = client.build_request(attempt.method, url, content=bytes(attempt.request_body), headers=headers)
    except (CredentialUnavailable, ValueError, TypeError, httpx.HTTPError, httpx.InvalidURL) as exc:
        if owned and client is not None:
            client.close()
        why = exc.code if isinstance(exc, NexusError) else f"request_unbuildable: {type(exc).__name__}: {exc}"
        _self_abandon_pre_io(grant, {"proof": "holder_released_before_sending", "why": why[:200]})
        return None
    try:
        try:
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
                failpoints.hit(FP_SENDING_BEFORE_COMMIT)
        except OperationalError as exc:
            # The ``granted -> sending`` transaction rolled back (a deadlock victim, a lock wait
            # timeout): nothing was sent. The holder closes its own Permit now instead of leaving it
            # ``granted`` until its process ends; the effect is granted afresh.
            proof = {"proof": "holder_released_before_sending",
                     "why": f"sending_transition_failed: {exc.args[0] if exc.args else exc}"}
            for tries_left in (2, 1, 0):
                try:
                    _self_abandon_pre_io(grant, proof)
                    break
                except OperationalError:
                    if not tries_left:
                        raise  # the Permit stays ``granted``; holder-termination recovery closes it
            return None
        failpoints.hit(FP_AFTER_SENDING)
        reply = client.send(request)
        return Response(reply.status_code, reply.content, "",
                        retry_after=reply.headers.get("Retry-After") if reply.status_code in RETRY_AFTER_STATUSES
                        else None)
    except httpx.ConnectError as exc:
        return Response(None, b"", f"connect: {exc}", connect_failed=True)
    except httpx.HTTPError as exc:
        return Response(None, b"", f"{type(exc).__name__}: {exc}"[:255])
    finally:
        if owned:
            client.close()


def _self_abandon_pre_io(grant: Grant, proof: dict) -> None:
    """The holder itself closes its still-``granted`` Permit: it never sent, and never will.

    Legal only for the holder (holder fence) and only from ``granted``:
    the effect returns to ``prepared``, the Attempt records ``no_effect``.
    """
    with transaction.atomic(durable=True):
        effect, permit, attempt = locks.acquire([
            locks.store_resource(RemoteEffectStore, grant.org_id, grant.effect_id),
            locks.store_resource(DispatchPermitStore, grant.org_id, grant.permit_id),
            locks.store_resource(RemoteEffectAttemptStore, grant.org_id, grant.attempt_id),
        ])
        if permit.state != "granted" or permit.holder_fence != grant.holder_fence or effect.state != "dispatching":
            return
        _close_pre_io(effect, permit, attempt, proof=proof, error=proof.get("why", "released"))


def _close_pre_io(effect: RemoteEffect, permit: DispatchPermit, attempt: RemoteEffectAttempt, *, proof: dict,
                  error: str) -> None:
    """Abandon a locked ``granted`` Permit with ``proof`` of no I/O; effect ``dispatching -> prepared``."""
    DispatchPermitStore.transition(org_id=permit.org_id, pk=permit.pk, src="granted", dst="abandoned",
                                   version=permit.version, set_fields={"closed_evidence": json.dumps(proof)})
    RemoteEffectAttemptStore.transition(org_id=attempt.org_id, pk=attempt.pk, src="started", dst="no_effect",
                                        version=attempt.version, set_fields={"error": error[:255]})
    RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="dispatching", dst="prepared",
                                 version=effect.version, set_fields={"reason_code": ""})


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

    Raises:
        FenceRejected: the Permit is no longer this holder's ``sending`` Permit.
    """
    from runtime_outbox.services import intent_result_record

    effect = RemoteEffect.objects.select_related("command").get(org_id=grant.org_id, pk=grant.effect_id)
    _binding, contract, profile = _contract(effect)
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
        verdict = outcomes.classify(profile, status=status, connect_failed=response.connect_failed)
        next_attempt_at = now + max(_backoff(effect.attempt_count), _retry_after(response.retry_after) or dt.timedelta())
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
                    _link_create(effect, contract, remote_id)
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
            # Proof of no effect: another Attempt only while the frozen policy has Attempts left.
            attempt_state = "no_effect"
            if effect.attempt_count < outcomes.policy(profile).max_attempts:
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
    _suspend_links([link], reason, kind="remote_not_found" if reason == reasons.REMOTE_NOT_FOUND else "remote_conflict",
                   detail={"effect": int(effect.pk), "status": status,
                           "response_digest": digest_v2("connectors.response", [("body", bytes(body))]).hexdigest})


def _link_create(effect: RemoteEffect, contract: dict, remote_id: str) -> None:
    """Finalize the slot's link in the settlement transaction (seed 002 "After POST" step 2).

    Raises:
        EgressRefused: another non-retired link of the same owner, destination
            slot and remote scope holds ``remote_id`` (the hard remote-locator
            uniqueness index); that link is suspended ``remote_locator_conflict``.
    """
    command = effect.command
    binding = command.frozen_binding
    snapshot = dict(_current_action_config(effect, binding, contract))
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
        existing = RemoteLink.objects.filter(org_id=effect.org_id, link_key=effect.link_key).first()
        if existing is not None and existing.remote_id == remote_id:
            return
        holder = RemoteLink.objects.filter(
            org_id=effect.org_id, owner_key=binding["pack_generation"]["owner_key"],
            destination_slot_id=contract["destination_slot_id"], remote_scope=effect_remote_scope(effect, binding),
            live_remote_id=remote_id).first()
        if holder is not None:
            _suspend_links([holder], reasons.REMOTE_LOCATOR_CONFLICT, kind="remote_conflict",
                           detail={"effect": int(effect.pk), "claimed_by_link_key": effect.link_key,
                                   "remote_id": remote_id})
        raise EgressRefused(f"remote id {remote_id} conflicts with an existing link") from None


# --- (4) finalize -------------------------------------------------------------------
def effect_try_finalize_one(*, lanes: tuple[str, ...] = KNOWN_LANES) -> bool:
    """Finalize one ``remote_confirmed`` effect of ``lanes``: mirror writeback + Runtime receipt.

    Seed 002 "After POST" step 3 and "Drift Matrix" rows on the mirror tuple
    and on local deletion. The mirror is written only after the link holds the
    remote id, only to the frozen writeback tuple and only while it equals the
    link's mirror tuple (a changed tuple is ``tuple_changed``: not written);
    it is idempotent and never authority. A source deleted before writeback
    finalizes the effect without any call and suspends the link
    (``source_deleted``): its evidence stays for reconciliation or retire.
    Never calls the provider. An effect of an unknown DispatchLane is never taken.

    Lock order (seed 000, ARCHITECTURE.md section 6): the effect's
    OutboundCommand intent first (``locks.result_commit``), then the source
    record, then the effect, its link and the Runtime receipt.
    """
    from nexusflow.records.metadata import InvalidFieldValue, UnknownField
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock, record_write_mirror
    from runtime_outbox.models import IntentResultReceipt
    from runtime_outbox.services import intent_result_record
    from runtime_outbox.store import OutboundCommandStore

    from .pushlinks import append_link_evidence

    lanes = tuple(lane for lane in lanes if lane in KNOWN_LANES)
    effect = (RemoteEffect.objects.filter(state="remote_confirmed", dispatch_lane__in=lanes)
              .select_related("command").order_by("id").first())
    if effect is None:
        return False
    command = effect.command
    _binding, contract, _profile = _contract(effect)
    writeback = command.frozen_binding.get("writeback") or {
        "source_object": command.source_object, "source_record_id": command.source_record_key,
        "mirror_field": contract.get("mirror_field", "")}
    with transaction.atomic(durable=True):
        mirror = "skipped"
        record = None
        # Seed 000: the result commit locks its intent before the local record projection (the one
        # sanctioned reversal); owner checks read intents NOWAIT, so none waits behind this in reverse.
        with locks.result_commit(lambda: OutboundCommandStore.lock(effect.org_id, command.pk)):
            failpoints.hit(FP_FINALIZE_INTENT_LOCKED)
            try:
                record = record_lock(org=OrgScope(effect.org_id), object_name=writeback["source_object"],
                                     record_key=writeback["source_record_id"])
            except Record.DoesNotExist:
                mirror = "source_deleted"
        effect = RemoteEffectStore.lock(effect.org_id, effect.pk)
        if effect.state != "remote_confirmed":
            return True
        link = RemoteLink.objects.filter(org_id=effect.org_id, link_key=effect.link_key).first()
        if link is not None:
            link = RemoteLinkStore.lock(link.org_id, link.pk)
        receipt = IntentResultReceipt.objects.filter(org_id=effect.org_id, command_id=command.pk).first()
        if receipt is not None:
            # Runtime already completed this intent: finish Connector's own bookkeeping from that exact
            # receipt (seed 000 lost-response replay), whatever became of the link or the record since.
            _finish_from_receipt(effect, link, receipt)
            return True
        link_tuple = (link.snapshot.get("mirror_tuple") or {}) if link is not None else {}
        if record is not None and writeback["mirror_field"]:
            if link_tuple and link_tuple.get("field") != writeback["mirror_field"]:
                mirror = "tuple_changed"
            else:
                try:
                    record_write_mirror(org=OrgScope(effect.org_id), record=record, field=writeback["mirror_field"],
                                        value=effect.remote_id)
                    mirror = "written"
                except (InvalidFieldValue, UnknownField):
                    mirror = "conflict"
        if link is not None:
            version = link.version
            if mirror == "source_deleted" and link.state == "active":
                append_link_evidence(link, kind="source_deleted", actor="egress", to_state="suspended_drift",
                                     detail={"effect": int(effect.pk), "remote_id": effect.remote_id})
                version = RemoteLinkStore.transition(org_id=link.org_id, pk=link.pk, src="active",
                                                     dst="suspended_drift", version=version,
                                                     set_fields={"reason_code": reasons.SOURCE_DELETED})
                link.state = "suspended_drift"
            RemoteLinkStore.touch(org_id=link.org_id, pk=link.pk, state=link.state, version=version,
                                  set_fields={"mirror_status": mirror})
        RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="remote_confirmed", dst="finalized",
                                     version=effect.version)
        intent_result_record(command=command, outcome="finalized", remote_id=effect.remote_id,
                             evidence={"mirror": mirror})
    failpoints.hit(FP_AFTER_FINALIZE)
    return True


def _finish_from_receipt(effect: RemoteEffect, link: RemoteLink | None, receipt) -> None:
    """Close a ``remote_confirmed`` effect whose intent Runtime already completed, from that receipt only.

    Seed 000: after Runtime completion, Integration finishes its private
    bookkeeping using that exact acknowledgement even if the old link has
    since been retired or deleted. Nothing is projected onto the record, no
    second receipt is written and the Flow is not woken again; an evidence
    row names the receipt used (its outcome and remote id, so an operator
    sees any disagreement). Called with the effect (and link, if any) locked.
    """
    append_evidence(effect, kind="finalized_from_receipt", actor="egress", to_state="finalized",
                    detail={"receipt": int(receipt.pk), "outcome": receipt.outcome,
                            "receipt_remote_id": receipt.remote_id, "remote_id": effect.remote_id,
                            "link_state": link.state if link is not None else None})
    mirror = (receipt.evidence or {}).get("mirror")
    if link is not None and link.state != "retired" and mirror and link.mirror_status != mirror:
        RemoteLinkStore.touch(org_id=link.org_id, pk=link.pk, state=link.state, version=link.version,
                              set_fields={"mirror_status": mirror})
    RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="remote_confirmed", dst="finalized",
                                 version=effect.version)


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
        _binding, _contract_doc, profile = _contract(effect)
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
    from .models import CredentialGenerationDispatchGate

    if transaction.get_connection().in_atomic_block:
        raise EgressRefused("the verify read must not run inside a transaction")
    headers = {"Accept": "application/json"}
    frozen = binding.get("credential_generation")
    try:
        if frozen:
            gate = CredentialGenerationDispatchGate.objects.filter(org_id=effect.org_id,
                                                                   credential_generation_id=frozen["id"]).first()
            if gate is None or gate.state != "enabled":
                return VerifyRead(None, b"", "credential generation not enabled")
        if profile.get("auth", {}).get("kind") == "bearer":
            headers["Authorization"] = _bearer(resolve_frozen_secret(org_id=effect.org_id, frozen=frozen))
    except CredentialUnavailable as exc:
        return VerifyRead(None, b"", exc.code)
    url = binding["base_url"].rstrip("/") + conflict_recovery.verify_path(contract, remote_id)
    owned = client is None
    if owned:
        client = httpx.Client(timeout=outcomes.timeout_seconds(profile))
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
    binding, contract, profile = _contract(effect)
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
            wait = max(_backoff(locked.attempt_count), _retry_after(read.retry_after) or dt.timedelta())
            log.info("verify read of effect %s deferred: %s", locked.pk, read.error or read.status)
            RemoteEffectStore.touch(org_id=locked.org_id, pk=locked.pk, state=locked.state, version=locked.version,
                                    set_fields={"next_attempt_at": now + wait})
            return True
        if verdict == conflict_recovery.MATCH and _candidate_linked_elsewhere(locked, contract, candidate):
            verdict = "linked_elsewhere"
        if verdict == conflict_recovery.MATCH:
            try:
                _link_create(locked, contract, candidate)
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
        _quarantine(locked, reason)
    return True


def effect_try_dispatch_one(*, worker_id: str, client: httpx.Client | None = None,
                            lanes: tuple[str, ...] = KNOWN_LANES) -> bool:
    """Grant, send and settle one effect of ``lanes``. Returns ``True`` if work was done."""
    grant = permit_try_grant_one(worker_id=worker_id, lanes=lanes)
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
