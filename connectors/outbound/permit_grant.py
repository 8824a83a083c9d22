"""Egress step 1, grant: lock gate -> epoch -> credential gate -> effect, append an Attempt and a ``granted``
DispatchPermit, effect ``dispatching``; plan the create or update request (seed 003 "State machines";
seed 002 "Before POST", "Before PATCH").
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import secrets
import urllib.parse

from django.db import IntegrityError, transaction

from connectors import reasons
from connectors.contracts.pack_document import REMOTE_ID_PLACEHOLDER
from connectors.links.link_keys import effect_remote_scope
from connectors.models import (
    PackGeneration,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteLink,
)
from connectors.outbound.egress_common import (
    FP_AFTER_GRANT,
    FP_GRANT_BEFORE_COMMIT,
    KNOWN_LANES,
    NONTERMINAL,
    EgressRefused,
    Grant,
    append_evidence,
    bearer,
    current_action_config,
    encode_body,
    frozen_contract,
    quarantine,
    suspend_links,
)
from connectors.outbound.intents import mapping_source_fields
from connectors.selectors import head_of_lane_prepared
from connectors.serving.gates import CredentialUnavailable, NotServing, resolve_frozen_secret, serving_lock
from connectors.store import (
    CredentialDispatchGateStore,
    DispatchPermitStore,
    RemoteEffectAttemptStore,
    RemoteEffectStore,
    RemoteLinkStore,
)
from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity, StaleVersion
from nexusflow.kernel.identity import canonical_locator
from nexusflow.kernel.rows import fetch_where, first_row, get_joined, row_exists

log = logging.getLogger(__name__)

# --- candidates -------------------------------------------------------------
def _is_head(effect: RemoteEffect) -> bool:
    """True when ``effect`` may dispatch now: first of its link_key, and the slot is not occupied.

    An effect already past ``prepared`` (dispatching, uncertain, remote_confirmed)
    occupies the slot whatever its lane_sequence: outbox delivery order can differ
    from record version order, and seed 002 allows no second active attempt per link_key.
    """
    others = fetch_where(RemoteEffect, {"org_id": effect.org_id, "link_key": effect.link_key,
                                        "state__in": NONTERMINAL})
    for other in others:
        if other.pk == effect.pk:
            continue
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
    An effect whose credential dispatch lane is paused by a provider rate limit
    (``paused_until`` after the database clock) is not granted; its
    ``next_attempt_at`` moves to the pause's end (seed 004 section 16).
    """
    lanes = tuple(lane for lane in lanes if lane in KNOWN_LANES)
    now = db_now()
    for org_id, effect_id in head_of_lane_prepared(now, NONTERMINAL, lanes):
        effect = get_joined(RemoteEffect, ("command",), org_id=org_id, pk=effect_id)
        try:
            _require_material(effect)
            grant = _grant(effect, worker_id)
        except (NotServing, StaleVersion, CredentialUnavailable) as exc:
            log.info("grant skipped effect %s: %s", effect_id, exc,
                     extra={"org_id": org_id, "effect_id": int(effect_id), "code": getattr(exc, "code", None)})
            continue
        if grant is not None:
            failpoints.hit(FP_AFTER_GRANT)
            return grant
    return None


def _last_attempt(effect: RemoteEffect) -> RemoteEffectAttempt | None:
    """``effect.attempts.order_by("-attempt_number").first()``, by SQL built once."""
    rows = fetch_where(RemoteEffectAttempt, {"effect_id": effect.pk}, order="`attempt_number` DESC", limit=1)
    return rows[0] if rows else None


def _require_material(effect: RemoteEffect) -> None:
    """Raise :class:`CredentialUnavailable` unless the frozen secret version is readable and usable (bytes discarded)."""
    binding, _contract_doc, profile = frozen_contract(effect)
    if profile.get("auth", {}).get("kind") == "bearer":
        bearer(resolve_frozen_secret(org_id=effect.org_id, frozen=binding["credential_generation"]))


def _locked_with_command(effect: RemoteEffect) -> RemoteEffect | None:
    """``effect`` locked (``FOR UPDATE SKIP LOCKED``), carrying the OutboundCommand already read with it, or
    ``None`` when another transaction holds the effect's row.

    Two grant workers read the same head-of-lane candidates; the one that finds a candidate held (another
    grant, a settlement, an operator decision) moves on to its next candidate instead of queueing behind it
    and then finding it taken. A held effect that is still ``prepared`` when its holder ends is offered again
    by the next round's scan. The grant reads only the command's immutable columns (its frozen binding,
    request fields, source and keys), so the locked row takes the command object read a moment before
    instead of reading it again.
    """
    [locked] = RemoteEffectStore.lock_many(effect.org_id, [effect.pk], skip_locked=True) or [None]
    if locked is not None and locked.command_id == effect.command_id:
        locked.command = effect.command
    return locked


def _grant(effect: RemoteEffect, worker_id: str) -> Grant | None:
    binding, contract, _profile = frozen_contract(effect)
    with transaction.atomic(durable=True):
        ctx = serving_lock(org_id=effect.org_id, account_key=effect.account_key, shared=True)
        if binding["epoch"]["id"] != ctx.epoch.pk or binding["epoch"]["digest"] != ctx.epoch.digest:
            raise NotServing(f"effect {effect.pk} is bound to epoch {binding['epoch']['id']}, not the active one")
        credential_gate = None
        if binding.get("credential_generation"):
            # Shared, as the account gate: a revocation locks it FOR UPDATE and waits for the grants in flight.
            credential_gate = CredentialDispatchGateStore.lock_where_shared(
                effect.org_id, credential_generation_id=binding["credential_generation"]["id"])
            if credential_gate.state != "enabled":
                return None
        if credential_gate is not None and credential_gate.paused_until is not None \
                and credential_gate.paused_until > db_now():
            # The provider's rate-limit window on this credential's lane (permit_settle.lane_pause): no Permit
            # inside it. The effect is due again at its end, so the claim scan stops offering it meanwhile.
            effect = _locked_with_command(effect)
            if effect is not None and effect.state == "prepared" and (effect.next_attempt_at is None
                                               or effect.next_attempt_at < credential_gate.paused_until):
                RemoteEffectStore.touch(org_id=effect.org_id, pk=effect.pk, state=effect.state,
                                        version=effect.version,
                                        set_fields={"next_attempt_at": credential_gate.paused_until})
            return None
        effect = _locked_with_command(effect)
        if effect is None or effect.state != "prepared" or effect.dispatch_lane not in KNOWN_LANES \
                or not _is_head(effect):
            return None
        previous = _last_attempt(effect)
        if previous is not None and previous.state == "uncertain":
            # Exact repeat under the frozen idempotency contract: same bytes, same key. A create is
            # never repeated for a source deleted meanwhile: if the first call did not land, the
            # repeat would make an orphan remote row (seed 002 "Retry And Recovery Semantics" 7).
            if previous.operation == "create" and not _source_exists(effect):
                append_evidence(effect, kind="refused_before_post", actor="egress", to_state="quarantined",
                                detail={"reason": reasons.SOURCE_DELETED_BEFORE_POST, "repeat_of": previous.attempt_number})
                quarantine(effect, reasons.SOURCE_DELETED_BEFORE_POST)
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
        return Grant(effect.org_id, effect.pk, attempt.pk, permit.pk, fence, effect.trace_id)


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
    link = first_row(RemoteLink, org_id=effect.org_id, link_key=effect.link_key)
    if link is not None:
        link = RemoteLinkStore.lock(link.org_id, link.pk)
    body = encode_body(contract, effect.command.request_fields)
    key = binding.get("provider_idempotency_key")
    if link is None:
        if not _plan_create(effect, binding, contract):
            return None
        body = _create_body(effect, binding, contract, body)
        if body is None:
            return None
        return "create", contract["create"]["method"], contract["create"]["path"], body, key
    path = _plan_update(effect, binding, contract, link)
    if path is None:
        return None
    return "update", contract["update"]["method"], path, body, key


def _source_exists(effect: RemoteEffect) -> bool:
    from nexusflow.records.models import Record

    return row_exists(Record, org_id=effect.org_id, object_name=effect.command.source_object,
                      record_key=effect.command.source_record_key, is_deleted=False)


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


def _legacy_remote_id(effect: RemoteEffect, contract: dict) -> str | None:
    """The V1 mirror field holding a value for the effect's record when its org ran V1, else ``None``.

    A record of a V1 org with a remote id (or a provenance marker) and no link of the key is one the V1 link
    adoption refused: creating it would guess (seed 002 "Migration Contract For #1783").
    """
    from connectors.v1.models import V1MaintenanceBarrier
    from nexusflow.records.models import Record

    fields = [f for f in [contract.get("mirror_field"), contract.get("provenance_field"),
                          *contract.get("legacy_mirror_fields", [])] if f]
    if not fields or not row_exists(V1MaintenanceBarrier, org_id=effect.org_id):
        return None
    record = first_row(Record, org_id=effect.org_id, object_name=effect.command.source_object,
                       record_key=effect.command.source_record_key)
    mirrors = (record.mirrors or {}) if record is not None else {}
    return next((f for f in fields if mirrors.get(f)), None)


def _plan_create(effect: RemoteEffect, binding: dict, contract: dict) -> bool:
    """Seed 002 "Before POST" gates of a create candidate; ``True`` when the create may be granted."""
    from connectors.links.push_rules import orphaned_lineage

    if not (effect.owner_key and effect.action_slot_id and effect.destination_slot_id):
        _refuse_create(effect, reasons.STABLE_SLOT_UNRESOLVED, {"slot": binding.get("slot")})
        return False
    if not _source_exists(effect):
        _refuse_create(effect, reasons.SOURCE_DELETED_BEFORE_POST,
                       {"source": f"{effect.command.source_object}/{effect.command.source_record_key}"})
        return False
    legacy = _legacy_remote_id(effect, contract)
    if legacy is not None:
        _refuse_create(effect, reasons.LEGACY_REMOTE_ID_UNLINKED,
                       {"field": legacy, "source": f"{effect.command.source_object}/{effect.command.source_record_key}"})
        return False
    lineage = orphaned_lineage(org_id=effect.org_id, source_object=effect.command.source_object,
                               source_record_key=effect.command.source_record_key, link_key=effect.link_key)
    if lineage:
        suspend_links(lineage.links, reasons.SLOT_LINEAGE_UNRESOLVED, kind="drift_suspended",
                       detail={"surfaces": ["slot_lineage"], "new_link_key": effect.link_key})
        _refuse_create(effect, reasons.SLOT_LINEAGE_UNRESOLVED, lineage.as_evidence())
        return False
    if not _take_create_slot(effect):
        quarantine(effect, reasons.PRIOR_CREATE_UNRESOLVED)
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
    vector (:func:`connectors.outbound.associations.association_resolve`): a
    ``create_inline`` target not linked yet leaves the effect ``prepared``
    with ``next_attempt_at`` :data:`ASSOCIATION_WAIT` ahead; a missing vector
    fails closed (``association_snapshot_missing``), a target that can never
    resolve too (``association_target_unresolved``); both quarantine the
    create before any Attempt.
    """
    from connectors.outbound.associations import READY, SNAPSHOT_MISSING, WAIT, association_resolve

    if not contract.get("associations"):
        return body
    previous = effect.attempts.filter(operation="create").order_by("-attempt_number").first()
    if previous is not None:
        return bytes(previous.request_body)
    pack = PackGeneration.objects.get(pk=binding["pack_generation"]["id"])
    resolution = association_resolve(effect=effect, binding=binding, pack_document=pack.document, contract=contract)
    if resolution.verdict == READY:
        return encode_body(contract, effect.command.request_fields, resolution.entries)
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
    quarantine(effect, reason)


def _plan_update(effect: RemoteEffect, binding: dict, contract: dict, link: RemoteLink) -> str | None:
    """Seed 002 "Before PATCH": the link is the only PATCH authority; returns the rendered path or ``None``."""
    from connectors.links.push_rules import Drift, append_link_evidence, patch_drift
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER, field_read_authority
    from runtime_outbox.services import intent_result_record

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
        quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    template = contract["update"]["path"]
    if template.count(REMOTE_ID_PLACEHOLDER) != 1:
        # The route cannot name the linked record (a generation published before publication refused
        # such routes): the update would reach whatever the body or the route chose, not the link's id.
        append_evidence(effect, kind="refused_before_patch", actor="egress", to_state="quarantined",
                        detail={"reason": reasons.LINK_NOT_PATCHABLE, "update_path": template,
                                "link_key": link.link_key})
        quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    current = current_action_config(effect, binding, contract)
    drift = patch_drift(link, current)
    if link.remote_scope != effect_remote_scope(effect, binding):
        # The slot is served by another account now: the remote id names a record of the old one's tenant.
        drift = Drift("suspend", ("remote_scope",))
    if drift.verdict == "suspend":
        suspend_links([link], reasons.LINK_DRIFT, kind="drift_suspended",
                       detail={"surfaces": list(drift.surfaces), "install_id": current["install_id"]})
        quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    if drift.verdict == "mapping":
        quarantine(effect, reasons.MAPPING_DRIFT)
        return None
    authority = binding.get("authority") or {}
    decision = field_read_authority(user_id=authority.get("originating_user") or AUTOMATED_PROCESS_USER,
                                    object_name=effect.command.source_object,
                                    fields=mapping_source_fields(contract), org_id=effect.org_id)
    if decision.denied:
        quarantine(effect, reasons.AUTHORITY_DENIED)
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
        quarantine(effect, reasons.LINK_NOT_PATCHABLE)
        return None
    return template.replace(REMOTE_ID_PLACEHOLDER, urllib.parse.quote(remote_id, safe=""))
