"""Serving generations, gates and epochs (seed 003 "State machines", "Generation and replay").

- :func:`service_configuration_apply` authors an immutable L2
  ``ConnectorServiceConfigurationGeneration`` from a JSON document, with its
  pack and credential generations;
- :func:`epoch_prepare` / :func:`epoch_verify` build and externally verify a
  ServingEpoch candidate from that exact generation;
- :func:`gate_transition` moves one AccountServingGate with evidence;
- :func:`serving_lock` is the lock every production V2 write takes first.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2, digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.ids import require_id
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

from .models import (
    AccountServingGate,
    ConnectorServiceConfigurationGeneration,
    CredentialGeneration,
    GateTransitionEvidence,
    PackGeneration,
    ServingEpoch,
)
from . import reasons
from .packs import PackError, load_pack
from .store import AccountServingGateStore, CredentialDispatchGateStore, ServingEpochStore


class ConfigurationError(NexusError):
    code = "configuration_invalid"


class NotServing(NexusError):
    """The account is not admitting V2 work (gate mode, fence or epoch)."""

    code = "not_serving"


class EpochVerificationFailed(NexusError):
    code = "epoch_verification_failed"


class CredentialUnavailable(NexusError):
    code = "credential_unavailable"


# --- L2 configuration -------------------------------------------------------
def _validate_document(document: dict) -> list[dict]:
    if not isinstance(document, dict):
        raise ConfigurationError("the configuration must be a JSON object with an 'accounts' list")
    accounts = document.get("accounts")
    if not isinstance(accounts, list) or not accounts:
        raise ConfigurationError("the configuration needs a non-empty 'accounts' list")
    seen: set[str] = set()
    for index, account in enumerate(accounts):
        if not isinstance(account, dict):
            raise ConfigurationError(f"accounts[{index}] must be an object")
        for list_key in ("routes", "push_contracts"):
            if not isinstance(account.get(list_key, []), list):
                raise ConfigurationError(f"accounts[{index}].{list_key} must be a list")
        if not isinstance(account.get("credentials", {}), dict):
            raise ConfigurationError(f"accounts[{index}].credentials must be an object")
        key = validate_key(account.get("account_key"), field="account_key", max_length=80)
        if key in seen:
            raise ConfigurationError(f"account {key} is listed twice")
        seen.add(key)
        try:
            pack = load_pack(account.get("pack", ""))
        except PackError as exc:
            raise ConfigurationError(f"account {key}: {exc}") from exc
        for route_key in account.get("routes", []):
            if pack.route(route_key).get("delivery") == "pull" and not account.get("base_url"):
                raise ConfigurationError(f"account {key}: pulled route {route_key} needs base_url")
        for contract_key in account.get("push_contracts", []):
            contract = pack.push_contract(contract_key)
            if "base_url" not in account:
                raise ConfigurationError(f"account {key}: push contract {contract_key} needs base_url")
            pack.callout_profile(contract["callout_profile"])
        credentials = account.get("credentials", {})
        for ref, locator in credentials.items():
            validate_key(ref, field="credential_ref", max_length=80)
            if not isinstance(locator, str) or not locator.startswith(("env:", "file:")):
                raise ConfigurationError(f"account {key}: credential {ref} must be env:NAME or file:PATH")
    return accounts


def service_configuration_apply(*, org: OrgScope, document: dict) -> ConnectorServiceConfigurationGeneration:
    """Author the next immutable L2 configuration generation for ``org``.

    Applying a document equal to the latest generation returns that generation.
    New accounts get an AccountServingGate in ``v1_serving`` (a fresh install
    then walks it through ``cutover greenfield``).

    Raises:
        ConfigurationError: unknown pack/route/contract, duplicate account,
            or a malformed credential locator.
    """
    accounts = _validate_document(document)
    with transaction.atomic(durable=True):
        pack_refs, credential_refs = {}, {}
        for account in accounts:
            pack = load_pack(account["pack"])
            generation, _ = _pack_generation(pack)
            pack_refs[account["account_key"]] = {"id": generation.pk, "digest": generation.digest}
            for ref, locator in sorted(account.get("credentials", {}).items()):
                credential = _credential_generation(org, account["account_key"], ref, locator)
                credential_refs.setdefault(account["account_key"], {})[ref] = {
                    "id": credential.pk, "digest": credential.digest}
        frozen = {"document": document, "packs": pack_refs, "credentials": credential_refs}
        digest = digest_v2("connectors.service-configuration", [("frozen", canonical_json.dumps(frozen))]).hexdigest
        latest = ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id).order_by("-generation").first()
        if latest is not None and latest.digest == digest:
            return latest
        generation = insert(
            ConnectorServiceConfigurationGeneration, org_id=org.org_id,
            generation=(latest.generation + 1) if latest else 1, document=frozen, digest=digest, profile_id=PROFILE_V2,
        )
        for account in accounts:
            if not AccountServingGate.objects.filter(org_id=org.org_id, account_key=account["account_key"]).exists():
                AccountServingGateStore.create(
                    org_id=org.org_id, account_key=account["account_key"], pack_key=account["pack"], state="v1_serving")
        return generation


def _pack_generation(pack) -> tuple[PackGeneration, bool]:
    existing = PackGeneration.objects.filter(pack_key=pack.pack_key, digest=pack.digest).first()
    if existing:
        return existing, False
    return insert(PackGeneration, pack_key=pack.pack_key, owner_key=pack.owner_key, version=pack.version,
                  document=pack.document, digest=pack.digest, profile_id=PROFILE_V2), True


def _credential_generation(org: OrgScope, account_key: str, ref: str, locator: str) -> CredentialGeneration:
    digest = digest_v2("connectors.credential-generation", [
        ("org_id", org.org_id), ("account_key", account_key), ("credential_ref", ref), ("locator", locator)]).hexdigest
    existing = CredentialGeneration.objects.filter(
        org_id=org.org_id, account_key=account_key, credential_ref=ref, digest=digest).first()
    if existing:
        return existing
    credential = insert(CredentialGeneration, org_id=org.org_id, account_key=account_key, credential_ref=ref,
                        secret_locator=locator, digest=digest)
    CredentialDispatchGateStore.create(org_id=org.org_id, credential_generation=credential, state="enabled")
    return credential


def resolve_secret(credential: CredentialGeneration) -> bytes:
    """Read the secret bytes a credential generation points to (never stored).

    Raises:
        CredentialUnavailable: the environment variable or file is missing.
    """
    kind, _, target = credential.secret_locator.partition(":")
    if kind == "env":
        value = os.environ.get(target)
        if value is None:
            raise CredentialUnavailable(f"environment variable {target} is not set")
        return value.encode("utf-8")
    try:
        return Path(target).read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise CredentialUnavailable(f"cannot read credential file: {exc.strerror}") from None


# --- ServingEpoch -----------------------------------------------------------
def _epoch_document(generation: ConnectorServiceConfigurationGeneration) -> dict:
    frozen = generation.document
    accounts = []
    for account in frozen["document"]["accounts"]:
        key = account["account_key"]
        pack = load_pack(account["pack"])
        routes = {}
        for route_key in account.get("routes", []):
            ordering = pack.route(route_key)["ordering"]
            routes[route_key] = {
                "ordering": ordering,
                "ordering_digest": digest_v2("connectors.ordering-contract",
                                             [("ordering", canonical_json.dumps(ordering))]).hexdigest,
            }
        accounts.append({
            "account_key": key,
            "pack_key": pack.pack_key,
            "owner_key": pack.owner_key,
            "pack_generation": frozen["packs"][key],
            "routes": routes,
            "push_contracts": list(account.get("push_contracts", [])),
            "base_url": account.get("base_url"),
            "credentials": frozen["credentials"].get(key, {}),
        })
    return {"configuration": {"id": generation.pk, "generation": generation.generation, "digest": generation.digest},
            "accounts": accounts}


def epoch_digest(document: dict) -> str:
    return digest_v2("connectors.serving-epoch", [("document", canonical_json.dumps(document))]).hexdigest


def epoch_prepare(*, org: OrgScope) -> ServingEpoch:
    """Create (or return) the ``prepared`` candidate for the latest configuration.

    Raises:
        ConfigurationError: the org has no configuration generation.
    """
    generation = ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id).order_by("-generation").first()
    if generation is None:
        raise ConfigurationError(f"org {org.org_id} has no connector configuration; run connector_config_apply")
    document = _epoch_document(generation)
    digest = epoch_digest(document)
    existing = ServingEpoch.objects.filter(org_id=org.org_id, digest=digest).exclude(state="rejected").first()
    if existing:
        return existing
    with transaction.atomic(durable=True):
        return ServingEpochStore.create(org_id=org.org_id, state="prepared", configuration=generation,
                                        document=document, digest=digest, profile_id=PROFILE_V2)


def epoch_verify(*, org: OrgScope, epoch_id: ServingEpoch.Id | int) -> ServingEpoch:
    """Fresh-read every owner and compare it byte-for-byte with the candidate.

    Reads the pack files, the configuration generation and every credential
    generation again; rebuilds the epoch document under the candidate's own
    profile; ``prepared -> verified`` on an exact match, ``-> rejected`` on an
    authoritative mismatch. A verified epoch is returned unchanged.

    Raises:
        InvalidIdentity: ``epoch_id`` is an id of another model (before SQL).
        EpochVerificationFailed: the candidate was rejected (it stays rejected).
    """
    epoch_id = require_id(epoch_id, ServingEpoch, field="epoch_id")
    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=epoch_id)
    if epoch.state in ("verified", "active"):
        return epoch
    problems: list[str] = []
    if epoch.profile_id != PROFILE_V2:
        problems.append(f"unsupported digest profile {epoch.profile_id!r}")
    try:
        rebuilt = _epoch_document(epoch.configuration)
    except (PackError, KeyError) as exc:
        problems.append(f"owner read failed: {exc}")
        rebuilt = None
    if rebuilt is not None:
        for account in rebuilt["accounts"]:
            current = PackGeneration.objects.filter(pk=account["pack_generation"]["id"]).first()
            fresh = load_pack(account["pack_key"])
            if current is None or current.digest != fresh.digest or current.digest != account["pack_generation"]["digest"]:
                problems.append(f"pack {account['pack_key']} changed since the configuration was frozen")
            for ref, cred in account["credentials"].items():
                row = CredentialGeneration.objects.filter(pk=cred["id"], org_id=org.org_id).first()
                if row is None or row.digest != cred["digest"] or row.account_key != account["account_key"]:
                    problems.append(f"credential {account['account_key']}/{ref} does not match its generation")
        if epoch_digest(rebuilt) != epoch.digest or rebuilt != epoch.document:
            problems.append("rebuilt epoch document differs from the prepared candidate")
    with transaction.atomic(durable=True):
        locked = ServingEpochStore.lock(org.org_id, epoch.pk)
        target = "rejected" if problems else "verified"
        ServingEpochStore.transition(org_id=org.org_id, pk=locked.pk, src=locked.state, dst=target, version=locked.version,
                                     set_fields={"reason_code": reasons.EPOCH_OWNER_MISMATCH if problems else ""})
    if problems:
        raise EpochVerificationFailed("; ".join(problems))
    return ServingEpoch.objects.get(org_id=org.org_id, pk=epoch.pk)


# --- Gates --------------------------------------------------------------------
def gate_transition(*, gate: AccountServingGate, dst: str, evidence: dict,
                    epoch: ServingEpoch | None = None, reason_code: str = "") -> AccountServingGate:
    """Move a locked gate to ``dst``, bump its fence and append the evidence row.

    Must run inside a transaction that locked ``gate``. The gate stores
    ``reason_code`` while it is not serving and clears it when it serves again.

    Args:
        reason_code: registered code of why the account stops serving; required
            when ``dst`` is a non-serving state (``ACCOUNT_SERVING_GATE.reason_required``).

    Raises:
        IllegalTransition: not a listed gate transition.
        ReasonRequired: ``dst`` is a non-serving state and ``reason_code`` is empty.
        FenceRejected: the gate moved since it was locked.
    """
    set_fields = {"fence_token": gate.fence_token + 1, "reason_code": reason_code}
    if epoch is not None:
        set_fields.update({"epoch_id": epoch.pk, "epoch_digest": epoch.digest})
    AccountServingGateStore.transition(org_id=gate.org_id, pk=gate.pk, src=gate.state, dst=dst,
                                       version=gate.version, set_fields=set_fields)
    insert(GateTransitionEvidence, org_id=gate.org_id, gate=gate, from_state=gate.state, to_state=dst,
           fence_token=gate.fence_token + 1, evidence=evidence)
    return AccountServingGate.objects.get(org_id=gate.org_id, pk=gate.pk)


@dataclass(frozen=True)
class ServingContext:
    """A locked gate and its exact active epoch, plus the account's frozen facts."""

    gate: AccountServingGate
    epoch: ServingEpoch

    @property
    def account(self) -> dict:
        for account in self.epoch.document["accounts"]:
            if account["account_key"] == self.gate.account_key:
                return account
        raise NotServing(f"account {self.gate.account_key} is not in epoch {self.epoch.pk}")


def serving_lock(*, org_id: str, account_key: str) -> ServingContext:
    """Lock AccountServingGate then its exact ServingEpoch and require V2 serving.

    Seed 003 "State machines": every production V2 admission, claim, outbound
    authoring and Permit acquisition requires ``v2_serving``, an exact
    gate-to-epoch id and digest match and epoch state ``active``.

    Raises:
        NotServing: unknown account, wrong gate mode, or epoch mismatch.
    """
    try:
        gate = AccountServingGateStore.lock_by_account(org_id, account_key)
    except AccountServingGate.DoesNotExist:
        raise NotServing(f"unknown account {account_key!r}") from None
    if gate.state != "v2_serving" or gate.epoch_id is None:
        raise NotServing(f"account {account_key} gate is {gate.state}")
    epoch = ServingEpochStore.lock(org_id, gate.epoch_id)
    if epoch.state != "active" or epoch.digest != gate.epoch_digest:
        raise NotServing(f"account {account_key} epoch {epoch.pk} is {epoch.state}")
    return ServingContext(gate, epoch)


def find_account_org(account_key: str) -> str | None:
    """Return the org owning ``account_key`` (account keys are globally unique ingress paths)."""
    orgs = list(AccountServingGate.objects.filter(account_key=account_key).values_list("org_id", flat=True)[:2])
    if len(orgs) != 1:
        return None
    return orgs[0]


__all__ = [
    "ConfigurationError", "CredentialUnavailable", "EpochVerificationFailed", "NotServing", "ServingContext",
    "epoch_prepare", "epoch_verify", "find_account_org", "gate_transition", "resolve_secret",
    "service_configuration_apply", "serving_lock",
]
