"""What the egress adapter's steps share: the Grant and Response handles, failpoints, the frozen contract,
request encoding, evidence, backoff and quarantine.

Seed 003 "State machines" (DispatchPermit, RemoteEffect); the step modules are
:mod:`connectors.outbound.permit_grant`, :mod:`~connectors.outbound.permit_send`,
:mod:`~connectors.outbound.permit_settle`, :mod:`~connectors.outbound.effect_finalize` and
:mod:`~connectors.outbound.recovery`; :mod:`connectors.outbound.egress` composes them.
"""
from __future__ import annotations

import datetime as dt
import logging
import urllib.parse
from dataclasses import dataclass

from connectors.models import (
    DispatchPermit,
    PackGeneration,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteEffectEvidence,
)
from connectors.outbound.intents import policy_digest
from connectors.serving.gates import CredentialUnavailable
from connectors.store import (
    RemoteEffectStore,
    RemoteLinkStore,
)
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError

log = logging.getLogger(__name__)

FP_GRANT_BEFORE_COMMIT = failpoints.declare("permit.grant_before_commit")


FP_AFTER_GRANT = failpoints.declare("permit.after_grant")


FP_SENDING_BEFORE_COMMIT = failpoints.declare("permit.sending_before_commit")


FP_AFTER_SENDING = failpoints.declare("permit.after_sending")


FP_AFTER_RESPONSE = failpoints.declare("permit.after_response")


FP_AFTER_SETTLE = failpoints.declare("effect.after_settle")


#: Inside the rate-limit pause of a credential's dispatch lane, its gate locked and the window written.
FP_LANE_PAUSE_BEFORE_COMMIT = failpoints.declare("permit.lane_pause_before_commit")


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
    #: The effect's trace id (``RemoteEffect.trace_id``; ``""``: none).
    trace_id: str = ""


def backoff(attempts: int) -> dt.timedelta:
    return dt.timedelta(seconds=min(30.0, 0.25 * (2 ** min(attempts, 7))))


#: The longest wait a provider's ``Retry-After`` may impose on an effect's next attempt.
MAX_RETRY_AFTER = dt.timedelta(seconds=300)


#: Statuses whose ``Retry-After`` header is read (rate limited, unavailable).
RETRY_AFTER_STATUSES = (429, 503)


def retry_after(value: str | None) -> dt.timedelta | None:
    """A ``Retry-After`` header in delay-seconds form, capped at :data:`MAX_RETRY_AFTER`; ``None`` otherwise.

    The HTTP-date form is not read: the wait then falls back to the capped exponential backoff.
    """
    if value is None or not value.strip().isdigit():
        return None
    return min(dt.timedelta(seconds=int(value.strip())), MAX_RETRY_AFTER)


#: ``(pack generation id, its frozen digest, contract key, frozen policy digest)`` -> ``(contract, profile)``
#: already checked against the row in this process (see :func:`frozen_contract`); at most
#: :data:`FROZEN_CONTRACTS_KEPT` entries.
_FROZEN_CONTRACTS: dict[tuple, tuple[dict, dict]] = {}
FROZEN_CONTRACTS_KEPT = 256


def frozen_contract(effect: RemoteEffect) -> tuple[dict, dict, dict]:
    """The effect's frozen binding and the push contract and callout profile it froze: ``(binding, contract,
    profile)`` (dicts; callers do not change them).

    The contract and profile come from the exact PackGeneration the command froze, checked against the
    frozen digests. Pack generations are immutable once published, so a generation whose row matched once
    is kept in this process by ``(id, digest)`` and not read again for every step of every effect (a
    dispatch and its finalization used to read it about nine times); the binding itself is the effect's
    command's, read with the effect.

    Raises:
        EgressRefused: the generation's digest or the profile's policy digest differs from the frozen one.
    """
    binding = effect.command.frozen_binding
    frozen_pack = binding["pack_generation"]
    key = (int(frozen_pack["id"]), frozen_pack["digest"], binding["contract_key"], binding.get("policy_digest"))
    known = _FROZEN_CONTRACTS.get(key)
    if known is not None:
        return binding, known[0], known[1]
    pack = PackGeneration.objects.get(pk=frozen_pack["id"])
    if pack.digest != frozen_pack["digest"]:
        raise EgressRefused("frozen pack generation digest mismatch")
    contract = next(c for c in pack.document["push_contracts"] if c["contract_key"] == binding["contract_key"])
    profile = next(p for p in pack.document["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
    if "policy_digest" in binding and policy_digest(profile) != binding["policy_digest"]:
        raise EgressRefused("frozen callout policy digest mismatch")
    if len(_FROZEN_CONTRACTS) >= FROZEN_CONTRACTS_KEPT:
        _FROZEN_CONTRACTS.clear()
    _FROZEN_CONTRACTS[key] = (contract, profile)
    return binding, contract, profile


def append_evidence(effect: RemoteEffect, *, kind: str, actor: str, to_state: str, detail: dict) -> RemoteEffectEvidence:
    """Append one immutable reconciliation evidence row (inside the caller's transaction)."""
    from nexusflow.kernel.models import insert

    digest = digest_v2("connectors.effect-evidence", [
        ("effect", str(effect.pk)), ("kind", kind), ("from", effect.state), ("to", to_state),
        ("detail", canonical_json.dumps(detail))]).hexdigest
    return insert(RemoteEffectEvidence, org_id=effect.org_id, effect=effect, kind=kind, actor=actor[:120],
                  from_state=effect.state, to_state=to_state, detail=detail, digest=digest)


def content_type(contract: dict) -> str:
    return "application/x-www-form-urlencoded" if contract.get("body_encoding", "json") == "form" else "application/json"


def encode_body(contract: dict, fields: dict, associations: tuple = ()) -> bytes:
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


def bearer(secret: bytes) -> str:
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


def current_action_config(effect: RemoteEffect, binding: dict, contract: dict) -> dict:
    """The action config the effect was frozen under (intents authored before seed 002 snapshots: rebuilt from
    the same immutable pack generation and epoch document)."""
    if binding.get("action_config"):
        return binding["action_config"]
    from connectors.links.push_rules import action_config_snapshot

    pack = PackGeneration.objects.get(pk=binding["pack_generation"]["id"])
    profile = next(p for p in pack.document["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
    account = {"base_url": binding["base_url"], "credentials": {}}
    credential_ref = profile.get("auth", {}).get("credential_ref")
    if credential_ref:
        account["credentials"][credential_ref] = binding.get("credential_generation")
    return action_config_snapshot(pack=pack, contract=contract, profile=profile, account=account)


def suspend_links(links, reason: str, *, kind: str, detail: dict, actor: str = "egress") -> None:
    """Move each still-active link to ``suspended_drift`` with ``reason`` and an evidence row."""
    from connectors.links.push_rules import append_link_evidence

    for link in sorted(links, key=lambda row: int(row.pk)):
        link = RemoteLinkStore.lock(link.org_id, link.pk)
        if link.state != "active":
            continue
        append_link_evidence(link, kind=kind, actor=actor, to_state="suspended_drift",
                             detail={"reason": reason, **detail})
        RemoteLinkStore.transition(org_id=link.org_id, pk=link.pk, src="active", dst="suspended_drift",
                                   version=link.version, set_fields={"reason_code": reason})


def quarantine(effect: RemoteEffect, reason: str) -> None:
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
    #: The value of the profile's declared daily-limit header on a rate-limit answer, as sent.
    rate_scope: str | None = None
