"""V1 acceptance tombstones: transport identity preserved across the V1 -> V2 upgrade.

Seed 003 "Inbound facts" (ReceiptAdmissionKey): after V1 drains, the upgrade
imports only non-executable identity tombstones. Each binds one
``(account, channel, transport key)`` to the authorized payload digest and a
predecessor ref (V1 Receipt / WorkItem identities). A later V2 delivery of
the same key whose items byte-match answers "already accepted" and
materializes nothing; a digest mismatch fails closed (409).

The import file is JSON::

    {"tombstones": [{"account_key": "...", "channel": "...",
                     "body": [ ...the V1-accepted batch, as delivered... ],
                     "predecessor": {"protocol": "v1", "receipt_id": "...", "work_item_ids": [...]}}]}

Transport key and payload digest are derived from ``body`` by the same
route split as live admission, so both sides compare equal bytes. For a
pulled route (``delivery: pull``) ``body`` is the one envelope V1 pulled and
accepted, keyed exactly as the stream poller keys it (its opaque id, one
Receipt per envelope).
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from connectors.inbound.admission import (
    MalformedBody,
    classify_items,
    identity_digest_for,
    split_body,
    transport_key_for,
)
from connectors.models import (
    AccountServingGate,
    ConnectorServiceConfigurationGeneration,
    PackGeneration,
    ReceiptAdmissionKey,
)
from connectors.store import AccountServingGateStore
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

#: Gate states in which V1 has drained and V2 does not admit yet.
IMPORTABLE_STATES = ("v1_drained", "v2_validating")


class TombstoneImportError(NexusError):
    code = "tombstone_import_invalid"


class TombstoneConflict(NexusError):
    code = "tombstone_conflict"


class TombstoneGateState(NexusError):
    """The gate is not in a state where V1 has drained and V2 does not admit yet."""

    code = "tombstone_gate_state"


@dataclass
class TombstoneImportReport:
    created: int = 0
    existing: int = 0


def _route(org_id: str, account_key: str, channel: str) -> dict:
    """The enabled route of ``channel`` in the org's latest configuration generation (its exact pack generation)."""
    generation = (ConnectorServiceConfigurationGeneration.objects.filter(org_id=org_id)
                  .order_by("-generation").first())
    if generation is None:
        raise TombstoneImportError(f"org {org_id} has no connector configuration")
    account = next((a for a in generation.document["accounts"] if a["account_key"] == account_key), None)
    if account is None:
        raise TombstoneImportError(f"account {account_key!r} is not in the configuration")
    pack = PackGeneration.objects.get(pk=account["pack_generation_id"])
    route = next((r for r in pack.document.get("inbound_routes", [])
                  if r["channel"] == channel and r["route_key"] in account.get("routes", [])), None)
    if route is None:
        raise TombstoneImportError(f"account {account_key} has no enabled route for channel {channel!r}")
    return route


def _pulled_identity(route: dict, envelope) -> tuple[str, list]:
    """The transport key and classified items of one pulled envelope, as the stream poller derives them."""
    from connectors.contracts.stream_routes import envelope_transport_key, expand_envelope

    if not isinstance(envelope, dict):
        raise MalformedBody("a pulled route's tombstone body is the one envelope object V1 accepted")
    return envelope_transport_key(route, envelope), classify_items(route, expand_envelope(route, envelope))


def v1_tombstones_import(*, org: OrgScope, document: dict) -> TombstoneImportReport:
    """Import V1 acceptance tombstones for ``org`` (idempotent).

    Each tombstone commits in one transaction that locks the account gate and
    requires it in ``v1_drained`` or ``v2_validating``.

    Raises:
        TombstoneImportError: malformed file, unknown account/channel, or a
            body the route cannot split.
        TombstoneGateState: a gate outside the importable states.
        TombstoneConflict: the key exists with another payload digest,
            another predecessor, or as a V2 Receipt.
    """
    entries = document.get("tombstones") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise TombstoneImportError('the file must be {"tombstones": [...]} with at least one entry')
    report = TombstoneImportReport()
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("predecessor"), dict):
            raise TombstoneImportError(f"tombstones[{index}] needs account_key, channel, body and predecessor")
        account_key = validate_key(entry.get("account_key"), field="account_key", max_length=80)
        channel = validate_key(entry.get("channel"), field="channel", max_length=80)
        route = _route(org.org_id, account_key, channel)
        try:
            canonical_json.dumps(entry["predecessor"])  # stored as JSON: strict, finite, valid Unicode
            body = canonical_json.dumps(entry.get("body"))
            if route.get("delivery") == "pull":
                transport_key, items = _pulled_identity(route, entry.get("body"))
            else:
                items = split_body(route, body)
                transport_key = transport_key_for(route, items)
        except MalformedBody as exc:
            raise TombstoneImportError(f"tombstones[{index}]: {exc}") from exc
        except (ValueError, UnicodeError) as exc:  # NaN, infinities, lone surrogates
            raise TombstoneImportError(f"tombstones[{index}]: not strict JSON ({exc})") from exc
        identity = identity_digest_for(items)
        tombstone = {"predecessor": entry["predecessor"], "route_key": route["route_key"]}
        with transaction.atomic(durable=True):
            try:
                gate = AccountServingGateStore.lock_by_account(org.org_id, account_key)
            except AccountServingGate.DoesNotExist:
                raise TombstoneImportError(f"account {account_key!r} has no gate") from None
            if gate.state not in IMPORTABLE_STATES:
                raise TombstoneGateState(
                    f"account {account_key} is {gate.state}; tombstones import only in {', '.join(IMPORTABLE_STATES)}")
            existing = ReceiptAdmissionKey.objects.filter(org_id=org.org_id, account_key=account_key, channel=channel,
                                                          transport_key=transport_key).first()
            if existing is not None:
                if existing.receipt_id is not None or existing.identity_digest != identity \
                        or existing.v1_tombstone != tombstone:
                    raise TombstoneConflict(f"tombstones[{index}]: the key exists with other facts")
                report.existing += 1
                continue
            insert(ReceiptAdmissionKey, org_id=org.org_id, account_key=account_key, channel=channel,
                   transport_key=transport_key, identity_digest=identity, profile_id=PROFILE_V2,
                   v1_tombstone=tombstone)
            report.created += 1
    return report
