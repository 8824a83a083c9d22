"""Outbound intents become one convergent remote effect (seed 003 "Outbound facts", seed 002).

- :func:`freeze_push_binding` freezes the FrozenDispatchBinding while the
  application transaction holds the gate and its exact active epoch;
- :func:`remote_effect_accept` turns a delivered OutboundCommand into its one
  RemoteEffect (outbox redelivery loads the same row).

Dispatch, settlement and recovery live in :mod:`connectors.egress`.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import NexusError

from . import outcomes
from .egress import policy_digest
from .links import PUSH_ACTION_TYPE, link_key_for
from .models import AccountServingGate, PackGeneration, RemoteEffect
from .serving import NotServing, serving_lock
from .store import RemoteEffectStore


class PushContractError(NexusError):
    """The intent cannot be frozen: a definite refusal before any provider I/O."""

    code = "push_contract_invalid"
    definite = True


def _serving_account_for_contract(org_id: str, contract_key: str) -> str:
    matches = []
    for gate in AccountServingGate.objects.filter(org_id=org_id, state="v2_serving").select_related("epoch"):
        account = next((a for a in gate.epoch.document["accounts"] if a["account_key"] == gate.account_key), None)
        if account and contract_key in account["push_contracts"]:
            matches.append(gate.account_key)
    if not matches:
        raise NotServing(f"no serving account offers push contract {contract_key!r}")
    if len(matches) > 1:
        raise PushContractError(f"push contract {contract_key!r} is offered by several accounts: {sorted(matches)}")
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


def freeze_push_binding(*, org_id: str, contract_key: str, record, intent_key: str, effect_root_id: str = "",
                        effect_generation_id: str = "", successor: dict | None = None) -> dict:
    """Lock the serving gate and epoch and freeze every dispatch fact for one intent.

    Args:
        record: the locked source record (``object_name``, ``record_key``, ``fields``).
        intent_key: the OutboundCommand idempotency key (64 hex chars).
        effect_root_id / effect_generation_id: the logical-effect identity the binding also binds.
        successor: for a successor EffectGeneration, the operator authorization and the
            predecessor's command key and digest (seed 003 "Replay and external effects").

    Returns:
        The FrozenDispatchBinding dict: account, epoch id/digest, pack
        generation, contract, configuration and credential generations,
        digest profile, request fields and digest, ``link_key`` and the one
        provider idempotency key every attempt reuses.

    Raises:
        NotServing: no serving account, or its gate/epoch is not serving.
        PushContractError: ambiguous account, wrong object, or empty body.
    """
    account_key = _serving_account_for_contract(org_id, contract_key)
    ctx = serving_lock(org_id=org_id, account_key=account_key)
    account = ctx.account
    if contract_key not in account["push_contracts"]:
        raise NotServing(f"account {account_key} no longer offers {contract_key}")
    pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
    contract = next((c for c in pack.document.get("push_contracts", []) if c["contract_key"] == contract_key), None)
    if contract is None:
        raise PushContractError(f"pack generation {pack.pk} has no contract {contract_key}")
    if contract["source_object"] != record.object_name:
        raise PushContractError(f"contract {contract_key} does not apply to {record.object_name}")
    request_fields = render_request_fields(contract, record.fields)
    if not request_fields:
        raise PushContractError("the mapping produced no body", code="mapping_produced_no_body")
    profile = next(p for p in pack.document.get("callout_profiles", []) if p["profile_key"] == contract["callout_profile"])
    credential_ref = profile.get("auth", {}).get("credential_ref")
    credential = account["credentials"].get(credential_ref) if credential_ref else None
    if credential_ref and credential is None:
        raise PushContractError(f"account {account_key} has no credential {credential_ref}")
    link_key = link_key_for(owner_key=pack.owner_key, action_slot_id=contract["action_slot_id"],
                            action_type=PUSH_ACTION_TYPE, source_object=record.object_name,
                            source_record_key=record.record_key, destination_slot_id=contract["destination_slot_id"])
    provider_key = ("nf-" + intent_key[:48]) if outcomes.policy(profile).replay_safe else None
    return {
        "account_key": account_key,
        "epoch": {"id": ctx.epoch.pk, "digest": ctx.epoch.digest},
        "configuration": account.get("configuration") or ctx.epoch.document["configuration"],
        "pack_generation": {"id": pack.pk, "digest": pack.digest, "owner_key": pack.owner_key},
        "contract_key": contract_key,
        "contract_digest": digest_v2("connectors.push-contract", [("contract", canonical_json.dumps(contract))]).hexdigest,
        "credential_generation": credential,
        "profile_id": PROFILE_V2,
        "base_url": account["base_url"],
        "request_fields": request_fields,
        "request_digest": digest_v2("connectors.push-request", [("fields", canonical_json.dumps(request_fields))]).hexdigest,
        "link_key": link_key,
        "dispatch_lane": "configured",
        "callout_profile": contract["callout_profile"],
        "policy_digest": policy_digest(profile),
        "provider_idempotency_key": provider_key,
        "effect_root_id": effect_root_id,
        "effect_generation_id": effect_generation_id,
        "effect_generation_predecessor": successor,
    }


def remote_effect_accept(*, command) -> RemoteEffect:
    """Return the one RemoteEffect of ``command``, creating it on first delivery.

    Raises:
        PushContractError: an existing effect's logical-effect digest differs
            from the command's (fail closed).
    """
    existing = RemoteEffect.objects.filter(command=command).first()
    if existing is None:
        try:
            with transaction.atomic(durable=True):
                existing = RemoteEffectStore.create(
                    org_id=command.org_id, command=command, logical_effect_digest=command.idempotency_key,
                    account_key=command.account_key, contract_key=command.contract_key,
                    link_key=command.link_key, dispatch_lane=command.frozen_binding.get("dispatch_lane", "configured"),
                    lane_sequence=command.source_record_version, state="prepared")
        except IntegrityError:
            existing = RemoteEffect.objects.get(command=command)
    if existing.logical_effect_digest != command.idempotency_key or existing.org_id != command.org_id:
        raise PushContractError(f"remote effect {existing.pk} does not match command {command.pk}")
    return existing
