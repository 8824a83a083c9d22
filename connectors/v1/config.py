"""What the V1 runtime reads to serve: its account registry and the live configuration (never a V2 gate).

Seed 003 "V1 concepts to retire" ("mutable live route or pack fallbacks"): V1
serves from the org's latest ConnectorServiceConfigurationGeneration and the
pack documents it names, read at use. It never reads an AccountServingGate or
a ServingEpoch (seed 003 "State machines": V1 is not retrofitted to read the
gate); ``tests/connectors/v1/test_no_v2_gate.py`` holds it to that.
"""
from __future__ import annotations

from connectors.inbound.admission import UnknownIngress
from connectors.models import ConnectorServiceConfigurationGeneration, CredentialGeneration, PackGeneration
from connectors.serving import secret_store
from connectors.v1.models import V1Account
from nexusflow.kernel.errors import NexusError

#: Seconds a caller waits before retrying what V1 cannot serve now (HTTP ``Retry-After``).
RETRY_AFTER_SECONDS = 5


class V1CredentialUnavailable(NexusError):
    """The credential a V1 route or contract names cannot be read now (HTTP 503 + Retry-After)."""

    code = "credential_unavailable"
    http_status = 503
    retry_after = RETRY_AFTER_SECONDS


class V1ContractUnknown(NexusError):
    """No account of the org's live configuration offers the push contract (HTTP 404)."""

    code = "v1_contract_unknown"
    http_status = 404


def v1_account(account_key: str) -> V1Account | None:
    """The V1 registry row of ``account_key`` (account keys are globally unique ingress paths), or ``None``."""
    return V1Account.objects.filter(account_key=account_key).first()


def live_configuration(org_id: str) -> dict:
    """The org's latest configuration generation document (``{"accounts": [...], ...}``).

    Raises:
        UnknownIngress: the org has no configuration.
    """
    row = (ConnectorServiceConfigurationGeneration.objects.filter(org_id=org_id)
           .order_by("-generation").first())
    if row is None:
        raise UnknownIngress(f"org {org_id} has no connector configuration")
    return row.document


def live_account(org_id: str, account_key: str) -> dict:
    """The frozen account entry of ``account_key`` in the org's live configuration.

    Raises:
        UnknownIngress: the account is not configured.
    """
    account = next((a for a in live_configuration(org_id)["accounts"] if a["account_key"] == account_key), None)
    if account is None:
        raise UnknownIngress(f"account {account_key!r} is not configured")
    return account


def live_pack(account: dict) -> dict:
    """The pack document the account's configuration names (by its exact pack generation id)."""
    return PackGeneration.objects.get(pk=account["pack_generation_id"]).document


def live_pack_owner(account: dict) -> str:
    """The owner key of the pack generation the account's configuration names."""
    return PackGeneration.objects.get(pk=account["pack_generation_id"]).owner_key


def live_route(org_id: str, account_key: str, channel: str, *, delivery: str = "push") -> tuple[dict, dict]:
    """``(account, route)``: the enabled route of ``channel`` with ``delivery`` (``push`` or ``pull``).

    Raises:
        UnknownIngress: no such enabled route.
    """
    account = live_account(org_id, account_key)
    route = next((r for r in live_pack(account).get("inbound_routes", [])
                  if r["channel"] == channel and r["route_key"] in account["routes"]), None)
    if route is None or route.get("delivery", "push") != delivery:
        raise UnknownIngress(f"account {account_key} has no enabled {delivery} route for channel {channel!r}")
    return account, route


def live_contract(org_id: str, contract_key: str) -> tuple[dict, dict, dict]:
    """``(account, contract, callout profile)`` of the one live account offering ``contract_key``.

    Raises:
        V1ContractUnknown: no account (or more than one) offers it.
    """
    offering = [a for a in live_configuration(org_id)["accounts"] if contract_key in a.get("push_contracts", [])]
    if len(offering) != 1:
        raise V1ContractUnknown(f"{len(offering)} configured accounts offer push contract {contract_key!r}")
    account = offering[0]
    pack = live_pack(account)
    contract = next(c for c in pack["push_contracts"] if c["contract_key"] == contract_key)
    profile = next(p for p in pack["callout_profiles"] if p["profile_key"] == contract["callout_profile"])
    return account, contract, profile


def live_secret(org_id: str, account: dict, credential_ref: str) -> bytes:
    """The secret bytes the account's live credential relation maps ``credential_ref`` to.

    Raises:
        V1CredentialUnavailable: no mapping, the generation is gone, or its exact version is unreadable.
    """
    generation_id = next((g for ref, g in account.get("credentials", []) if ref == credential_ref), None)
    credential = (CredentialGeneration.objects.filter(org_id=org_id, pk=generation_id).first()
                  if generation_id is not None else None)
    if credential is None:
        raise V1CredentialUnavailable(f"account {account['account_key']} has no credential {credential_ref}")
    try:
        return secret_store.secret_read(org_id=org_id, account_key=credential.account_key,
                                        credential_ref=credential.credential_ref,
                                        secret_version=credential.secret_version)
    except secret_store.SecretUnavailable:
        raise V1CredentialUnavailable(f"account {account['account_key']}: credential {credential_ref} "
                                      f"is unreadable") from None
