"""Outbound intents become one convergent remote effect (seed 003 "Outbound facts", seed 002).

- :func:`freeze_push_binding` freezes the FrozenDispatchBinding while the
  application transaction holds the gate and its exact active epoch;
- :func:`remote_effect_find_or_create` turns a delivered OutboundCommand into
  its one RemoteEffect inside the accepting transaction of
  :mod:`connectors.outbound.inbox` (redelivery loads the same row);
  :func:`remote_effect_accept` does it in its own transaction, for direct callers.

Dispatch, settlement and recovery live in :mod:`connectors.outbound.egress`, which checks a
binding against :func:`policy_digest` and :func:`mapping_source_fields` from here.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction

from connectors.contracts import outcomes
from connectors.links.link_keys import PUSH_ACTION_TYPE, link_key_for
from connectors.models import PackGeneration, RemoteEffect
from connectors.selectors import frozen_row, serving_accounts
from connectors.serving.gates import NotServing, serving_lock
from connectors.store import RemoteEffectStore
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.rows import first_row


class PushContractError(NexusError):
    """The intent cannot be frozen: a definite refusal before any provider I/O."""

    code = "push_contract_invalid"
    definite = True


class NothingToPush(PushContractError):
    """The record's values map to an empty request: there is nothing to send (an expected outcome)."""

    code = "mapping_produced_no_body"
    expected_outcome = True


def _serving_account_for_contract(org_id: str, contract_key: str) -> str:
    matches = [account_key for account_key, account in serving_accounts(org_id)
               if contract_key in account["push_contracts"]]
    if not matches:
        raise NotServing(f"no serving account offers push contract {contract_key!r}")
    if len(matches) > 1:
        raise PushContractError(f"push contract {contract_key!r} is offered by several accounts: {sorted(matches)}")
    return matches[0]


def delivery_contract_for(*, org_id: str, family: str):
    """The push contract a ``v2_serving`` account of ``org_id`` offers for the platform delivery ``family``
    (its pack's ``"delivers": {"family": ..., "fields": {...}}``), as a
    :class:`runtime_outbox.ports.DeliveryContract`. Read committed, no lock: the intent's binding freeze
    locks the gate and rechecks the contract.

    Raises:
        NotServing: no serving account delivers ``family``.
        PushContractError: several serving contracts deliver it (``delivery_ambiguous``).
    """
    from connectors.selectors import served_push_contracts
    from runtime_outbox.ports import DeliveryContract

    matches = [DeliveryContract(contract["contract_key"], contract["source_object"],
                                dict(contract["delivers"].get("fields") or {}))
               for _pack, _account, contract in served_push_contracts(org_id)
               if (contract.get("delivers") or {}).get("family") == family]
    if not matches:
        raise NotServing(f"no serving account delivers {family!r}")
    if len(matches) > 1:
        raise PushContractError(f"several serving contracts deliver {family!r}: "
                                f"{sorted(m.contract_key for m in matches)}", code="delivery_ambiguous")
    return matches[0]


def render_request_fields(contract: dict, fields: dict) -> dict[str, str]:
    """Apply the pack mapping to record fields.

    Each mapping entry takes its ``source`` fields in order, drops empty
    values and joins the rest with ``join`` (default: one space).
    """
    body: dict[str, str] = {}
    for entry in contract["mapping"]:
        parts = [fields.get(name) for name in entry["source"]]
        parts = [p for p in parts if isinstance(p, str) and p != ""]
        if parts:
            body[entry["target"]] = entry.get("join", " ").join(parts)
    return body


def mapping_source_fields(contract: dict) -> list[str]:
    """Every source field the contract's mapping reads (the #1781 authority scope of its body)."""
    return sorted({name for entry in contract["mapping"] for name in entry["source"]})


def policy_digest(profile: dict) -> str:
    """The route/policy digest a FrozenDispatchBinding carries for its callout profile."""
    return digest_v2("connectors.callout-policy", [("profile", canonical_json.dumps(profile))]).hexdigest


def freeze_push_binding(*, org_id: str, contract_key: str, record, intent_key: str, effect_root_id: str = "",
                        effect_generation_id: str = "", successor: dict | None = None,
                        origin: dict | None = None) -> dict:
    """Lock the serving gate and epoch and freeze every dispatch fact for one intent.

    Args:
        record: the locked source record (``object_name``, ``record_key``, ``fields``).
        intent_key: the OutboundCommand idempotency key (64 hex chars).
        effect_root_id / effect_generation_id: the logical-effect identity the binding also binds.
        successor: for a successor EffectGeneration, the operator authorization and the
            predecessor's command key and digest (seed 003 "Replay and external effects").

        origin: who and what originated the push: ``user_id`` (the #1781
            originating user; default the automated-process user) and the
            human-readable Flow names (``flow_developer_name``,
            ``flow_action_name``, ``flow_version_id``), stored as snapshots only.

    Returns:
        The FrozenDispatchBinding dict: account, epoch id/digest, pack
        generation, contract, configuration and credential generations,
        digest profile, request fields and digest, ``link_key`` and the one
        provider idempotency key every attempt reuses; and the seed 002
        snapshots: ``slot`` (stable ids), ``action_config`` (see
        :func:`connectors.links.push_rules.action_config_snapshot`), ``request``
        (method/path per operation, replay-safe headers, body hash,
        responseIdPath), ``authority`` (#1781: originating user, allowed
        fields, decision time, mapping fingerprint) and ``writeback`` (the
        mirror tuple and its value at authoring); ``associations``: the
        position-aligned save-time source record ids of the contract's
        association contracts (``""`` when blank), and ``dispatch_lane``
        (``deferred_association`` for a create candidate whose
        ``create_inline`` target is not linked yet; see
        :func:`connectors.outbound.associations.association_freeze`). Authoring never
        performs remote I/O.

    Raises:
        NotServing: no serving account, or its gate/epoch is not serving.
        PushContractError: ambiguous account, wrong object, empty body, a
            stable slot id missing from the pack (``stable_slot_unresolved``),
            a mapping or association source field the originating user may
            not read (``authority_denied``), or an association the intent
            cannot be admitted with (``association_source_invalid``,
            ``association_target_unserved``, ``association_target_missing``,
            ``association_target_not_linked``).
    """
    from connectors.links.push_rules import action_config_snapshot
    from connectors.outbound.associations import association_freeze, association_source_fields
    from nexusflow.kernel.clock import db_now
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER, AuthorityDenied, require_read_authority

    account_key = _serving_account_for_contract(org_id, contract_key)
    ctx = serving_lock(org_id=org_id, account_key=account_key, shared=True)
    account = ctx.account
    if contract_key not in account["push_contracts"]:
        raise NotServing(f"account {account_key} no longer offers {contract_key}")
    pack = frozen_row(PackGeneration, pk=account["pack_generation"]["id"], digest=account["pack_generation"]["digest"])
    contract = next((c for c in pack.document.get("push_contracts", []) if c["contract_key"] == contract_key), None)
    if contract is None:
        raise PushContractError(f"pack generation {pack.pk} has no contract {contract_key}")
    if contract["source_object"] != record.object_name:
        raise PushContractError(f"contract {contract_key} does not apply to {record.object_name}")
    if not all(isinstance(contract.get(key), str) and contract.get(key) for key in
               ("action_slot_id", "destination_slot_id")) or not pack.owner_key:
        raise PushContractError(f"contract {contract_key}: the pack names no stable owner/action/destination slot id",
                                code="stable_slot_unresolved")
    origin = dict(origin or {})
    user_id = origin.pop("user_id", None) or AUTOMATED_PROCESS_USER
    try:
        decision = require_read_authority(
            user_id=user_id, object_name=record.object_name, org_id=org_id,
            fields=sorted(set(mapping_source_fields(contract)) | set(association_source_fields(contract))))
    except AuthorityDenied as exc:
        raise PushContractError(str(exc), code="authority_denied") from None
    request_fields = render_request_fields(contract, record.fields)
    if not request_fields:
        raise NothingToPush("the mapping produced no body")
    profile = next(p for p in pack.document.get("callout_profiles", []) if p["profile_key"] == contract["callout_profile"])
    credential_ref = profile.get("auth", {}).get("credential_ref")
    credential = account["credentials"].get(credential_ref) if credential_ref else None
    if credential_ref and credential is None:
        raise PushContractError(f"account {account_key} has no credential {credential_ref}")
    link_key = link_key_for(owner_key=pack.owner_key, action_slot_id=contract["action_slot_id"],
                            action_type=PUSH_ACTION_TYPE, source_object=record.object_name,
                            source_record_key=record.record_key, destination_slot_id=contract["destination_slot_id"])
    associations, lane = association_freeze(org_id=org_id, pack=pack, account=account, contract=contract,
                                            record=record, link_key=link_key, error=PushContractError)
    provider_key = ("nf-" + intent_key[:48]) if outcomes.policy(profile).replay_safe else None
    action_config = action_config_snapshot(pack=pack, contract=contract, profile=profile, account=account,
                                           origin=origin)
    header = outcomes.policy(profile).idempotency_header
    request_digest = digest_v2("connectors.push-request", [("fields", canonical_json.dumps(request_fields))]).hexdigest
    return {
        "account_key": account_key,
        **({"remote_scope": account["remote_scope"]} if account.get("remote_scope") else {}),
        "epoch": {"id": ctx.epoch.pk, "digest": ctx.epoch.digest},
        "configuration": account.get("configuration") or ctx.epoch.document["configuration"],
        "pack_generation": {"id": pack.pk, "digest": pack.digest, "owner_key": pack.owner_key},
        "contract_key": contract_key,
        "contract_digest": digest_v2("connectors.push-contract", [("contract", canonical_json.dumps(contract))]).hexdigest,
        "credential_generation": credential,
        "profile_id": PROFILE_V2,
        "base_url": account["base_url"],
        "request_fields": request_fields,
        "request_digest": request_digest,
        "link_key": link_key,
        "dispatch_lane": lane,
        "associations": associations,
        "callout_profile": contract["callout_profile"],
        "policy_digest": policy_digest(profile),
        "provider_idempotency_key": provider_key,
        "effect_root_id": effect_root_id,
        "effect_generation_id": effect_generation_id,
        "effect_generation_predecessor": successor,
        "slot": {"owner_key": pack.owner_key, "action_slot_id": contract["action_slot_id"],
                 "destination_slot_id": contract["destination_slot_id"], "action_type": PUSH_ACTION_TYPE,
                 "source_object": record.object_name, "source_record_id": record.record_key},
        "action_config": action_config,
        "request": {"create": dict(contract["create"]), "update": dict(contract["update"]),
                    "response_id_path": contract["response_id_path"],
                    "replay_safe_headers": {header: provider_key} if (header and provider_key) else {},
                    "body_digest": request_digest, "destination": action_config["endpoint"],
                    "credential_ref": action_config["credential_ref"]},
        "authority": {"originating_user": user_id, "source_object": record.object_name,
                      "source_record_id": record.record_key, "allowed_fields": list(decision.allowed_fields),
                      "decided_at": db_now().isoformat(), "mapping_fingerprint": action_config["mapping_fingerprint"],
                      # The access policy generation the decision was made under (none: the metadata view's).
                      **({"context_digest": decision.context_digest} if decision.context_digest else {})},
        "writeback": {"source_object": record.object_name, "source_record_id": record.record_key,
                      "mirror_field": contract.get("mirror_field", ""),
                      "expected": (record.mirrors or {}).get(contract.get("mirror_field", "")) or ""},
    }


def remote_effect_find_or_create(*, command) -> RemoteEffect:
    """Return the one RemoteEffect of ``command``, creating it in the caller's transaction on first delivery.

    Raises:
        RuntimeError: called outside a transaction.
        PushContractError: an existing effect's logical-effect digest differs
            from the command's (fail closed), or a successor's predecessor is
            not proven ``no_effect``.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("the remote effect is created inside the accepting transaction")
    existing = first_row(RemoteEffect, org_id=command.org_id, command=command)
    if existing is None:
        slot = command.frozen_binding.get("slot") or {}
        try:
            with transaction.atomic():
                ordinal = _supersede_predecessor_create(command)
                existing = RemoteEffectStore.create(
                    org_id=command.org_id, command=command, logical_effect_digest=command.idempotency_key,
                    account_key=command.account_key, contract_key=command.contract_key,
                    link_key=command.link_key, dispatch_lane=command.frozen_binding.get("dispatch_lane", "configured"),
                    lane_sequence=command.source_record_version, state="prepared",
                    owner_key=slot.get("owner_key", ""), action_slot_id=slot.get("action_slot_id", ""),
                    destination_slot_id=slot.get("destination_slot_id", ""), source_object=command.source_object,
                    source_record_key=command.source_record_key, attempt_ordinal=ordinal)
        except IntegrityError:
            # A concurrent delivery committed the effect first (the insert waited for it).
            existing = RemoteEffect.objects.get(org_id=command.org_id, command=command)
    if existing.logical_effect_digest != command.idempotency_key or existing.org_id != command.org_id:
        raise PushContractError(f"remote effect {existing.pk} does not match command {command.pk}")
    return existing


def remote_effect_accept(*, command) -> RemoteEffect:
    """Return the one RemoteEffect of ``command``, creating it in its own transaction on first call.

    For direct callers outside the Runtime relay (which delivers through
    :func:`connectors.outbound.inbox.outbound_message_accept`); it records no InboxAcceptance.

    Raises:
        PushContractError: as :func:`remote_effect_find_or_create`.
    """
    with transaction.atomic(durable=True):
        return remote_effect_find_or_create(command=command)


def _supersede_predecessor_create(command) -> int:
    """For a successor EffectGeneration: release the predecessor's create slot; return the new AttemptOrdinal.

    Seed 002 "Attempt Key": the only path to a new POST after a terminal
    create is ``terminal_failed -> superseded -> new attempt`` by explicit
    operator intent. The operator's successor command is that intent; its
    predecessor effect is terminal ``no_effect`` (checked when the successor
    was authored) and keeps its state; only its occupancy ends here, in the
    transaction that creates the successor effect.
    """
    if command.predecessor_id is None:
        return 1
    predecessor = first_row(RemoteEffect, org_id=command.org_id, command_id=command.predecessor_id)
    if predecessor is None:
        return 1
    predecessor = RemoteEffectStore.lock(command.org_id, predecessor.pk)
    if not proven_no_effect(predecessor):
        raise PushContractError(f"predecessor effect {predecessor.pk} is {predecessor.state}, not no_effect",
                                code="predecessor_not_proven_no_effect")
    if predecessor.create_slot is not None:
        RemoteEffectStore.touch(org_id=command.org_id, pk=predecessor.pk, state=predecessor.state,
                                version=predecessor.version, set_fields={"create_slot": None})
    return predecessor.attempt_ordinal + 1


def proven_no_effect(effect: RemoteEffect) -> bool:
    """Is ``effect`` terminal with proof that the provider performed nothing?

    ``no_effect`` is that proof; so is ``quarantined`` by a seed 002 "Before
    POST" gate (:data:`connectors.reasons.REFUSED_BEFORE_POST`) with no
    Attempt at all: it was refused before any DispatchPermit existed. An
    operator quarantine is a decision to park, not a proof.
    """
    from connectors import reasons

    if effect.state == "no_effect":
        return True
    return (effect.state == "quarantined" and effect.reason_code in reasons.REFUSED_BEFORE_POST
            and not effect.attempts.exists())


def predecessor_effect_read(*, org_id: str, command):
    """The RemoteEffect of the org's OutboundCommand ``command`` for successor authoring, or ``None``.

    Answers :func:`runtime_outbox.ports.predecessor_effect` (registered in
    ``ConnectorsConfig.ready``); read committed without a lock, as
    ``no_effect`` is terminal (seed 003 "Replay and external effects").

    Returns:
        ``PredecessorEffect(effect_id, state, proven_no_effect)`` (see :func:`proven_no_effect`).
    """
    from runtime_outbox.ports import PredecessorEffect

    effect = first_row(RemoteEffect, org_id=org_id, command=command)
    if effect is None:
        return None
    return PredecessorEffect(int(effect.pk), effect.state, proven_no_effect(effect))


def no_effect_unsettled_attempt(*, org_id: str, command_id: int) -> int | None:
    """The first Attempt of the intent whose I/O may have started without a definite refusal, or ``None``.

    An Attempt whose Permit reached ``sending`` (``io_may_have_started_at``
    set) proves nothing unless the Attempt ended ``no_effect`` and its Permit
    was ``returned``. Answers :func:`runtime_outbox.ports.no_effect_unsettled_attempt`
    (seed 000 "A validated NO_EFFECT resource result").
    """
    from connectors.models import DispatchPermit

    unsettled = (DispatchPermit.objects.filter(org_id=org_id, attempt__effect__command_id=command_id,
                                               io_may_have_started_at__isnull=False)
                 .exclude(attempt__state="no_effect", state="returned").values_list("attempt_id", flat=True)[:1])
    return int(unsettled[0]) if unsettled else None
