"""Seed 002 push protocol rules on the one effect model: slot identity, snapshots, drift, occupancy.

Seed 002 "Identity Model", "Drift Matrix", "Before POST", "Before PATCH" and
"Retry And Recovery Semantics"; ARCHITECTURE.md section 4.

- :func:`action_config_snapshot` is the frozen, human-readable snapshot of one
  push slot's action config under one pack installation (names are snapshots,
  never keys);
- :func:`mapping_fingerprint` / :func:`body_fingerprint` are the two mapping
  authorities a finalized link carries (seed 002 CARVE_DOWN);
- :func:`patch_drift` classifies the drift between a link's last validated
  snapshot and the current action config (fail closed, benign, or benign once
  validated);
- :func:`orphaned_lineage` finds rows of the same source record whose slot no
  serving pack offers any more (key-changing drift: fail closed before POST);
- :func:`append_link_evidence` appends the link's lifecycle history.

L0 only: every provider, object and profile literal comes from pack data.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from connectors.links.link_keys import PUSH_ACTION_TYPE
from connectors.models import (
    PackGeneration,
    PushLinkRevalidationReceipt,
    RemoteEffect,
    RemoteLink,
    RemoteLinkEvidence,
)
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2

#: Version of the mapping/body fingerprint algorithm (recorded on revalidation receipts).
FINGERPRINT_ALGORITHM = "push-fingerprint.v1"

#: Drift surfaces a callout profile may declare benign in ``"drift": {"benign": [...]}``.
DECLARABLE_BENIGN = ("credential_ref", "credential_generation", "endpoint")


def _digest(domain: str, value) -> str:
    return digest_v2(domain, [("value", canonical_json.dumps(value))]).hexdigest


def mapping_fingerprint(contract: dict) -> str:
    """MappingFingerprint: the digest of the pack-authored outbound mapping rows (64 hex chars)."""
    return digest_v2("connectors.push-mapping", [("algorithm", FINGERPRINT_ALGORITHM),
                                                 ("mapping", canonical_json.dumps(contract["mapping"]))]).hexdigest


def body_fingerprint(contract: dict) -> str:
    """BodyFingerprint: the digest of the body shape (encoding, wrap, association templates; 64 hex chars)."""
    shape = {"encoding": contract.get("body_encoding", "json"), "wrap": contract.get("body_wrap"),
             "associations": contract.get("associations", [])}
    if contract.get("associations_key"):
        shape["associations_key"] = contract["associations_key"]
    return digest_v2("connectors.push-body", [("algorithm", FINGERPRINT_ALGORITHM),
                                              ("shape", canonical_json.dumps(shape))]).hexdigest


def render_update_route(snapshot: dict, remote_id: str) -> str:
    """``METHOD base_url+path`` of the PATCH for ``remote_id`` under ``snapshot`` (the remote route it names)."""
    path = snapshot["update"]["path"].replace("{remote_id}", urllib.parse.quote(remote_id, safe=""))
    return f'{snapshot["update"]["method"]} {snapshot["endpoint"]["base_url"].rstrip("/")}{path}'


def action_config_snapshot(*, pack: PackGeneration, contract: dict, profile: dict, account: dict,
                           origin: dict | None = None) -> dict:
    """The frozen action-config snapshot of one push slot (seed 002 "Link Key": what a link stores).

    Args:
        pack: the pack generation serving the slot.
        contract / profile: its push contract and callout profile documents.
        account: the serving account document (``base_url``, ``credentials``).
        origin: human-readable names of the originating Flow action, if any
            (``flow_developer_name``, ``flow_action_name``, ``flow_version_id``).

    Returns:
        A JSON dict: stable slot ids, human-readable snapshots
        (``connector_namespace``, ``target_object``, ``profile_name``, Flow
        names), the pack installation, route templates and their hashes,
        ``response_id_path``, credential/auth/endpoint snapshot, retry-policy
        hash, the two fingerprints, the mirror tuple and the profile's declared
        drift contract.
    """
    auth = profile.get("auth", {})
    credential_ref = auth.get("credential_ref", "")
    retry = {"retry": profile.get("retry", {}), "outcomes": profile.get("outcomes", {}),
             "timeout_seconds": profile.get("timeout_seconds")}
    return {
        "owner_key": pack.owner_key,
        "action_slot_id": contract.get("action_slot_id", ""),
        "destination_slot_id": contract.get("destination_slot_id", ""),
        "action_type": PUSH_ACTION_TYPE,
        "source_object": contract["source_object"],
        "connector_namespace": pack.pack_key,
        "target_object": contract.get("target_object", ""),
        "profile_name": contract["callout_profile"],
        "contract_key": contract["contract_key"],
        "flow": dict(origin or {}),
        "install_id": pack.installation_id or f"{pack.owner_key}@{pack.version}",
        "pack_generation": {"id": int(pack.pk), "digest": pack.digest},
        "create": dict(contract["create"]),
        "update": dict(contract["update"]),
        "create_path_hash": _digest("connectors.create-path", contract["create"]),
        "update_path_hash": _digest("connectors.update-path", contract["update"]),
        "response_id_path": contract["response_id_path"],
        "response_id_path_hash": _digest("connectors.response-id-path", contract["response_id_path"]),
        "credential_ref": credential_ref,
        "auth_kind": auth.get("kind", ""),
        "credential_generation": (account.get("credentials") or {}).get(credential_ref) if credential_ref else None,
        "endpoint": {"base_url": account.get("base_url", ""), "class": profile.get("endpoint_class", "")},
        "retry_policy_hash": _digest("connectors.retry-policy", retry),
        "idempotency": dict(profile.get("idempotency", {})),
        "mapping_fingerprint": mapping_fingerprint(contract),
        "body_fingerprint": body_fingerprint(contract),
        "mirror_tuple": {"source_object": contract["source_object"], "field": contract.get("mirror_field", "")},
        "drift": {"benign": sorted(set(profile.get("drift", {}).get("benign", [])) & set(DECLARABLE_BENIGN)),
                  "remote_conflict": profile.get("drift", {}).get("remote_conflict", "suspend")},
    }


@dataclass(frozen=True)
class Drift:
    """One drift classification of a finalized link against the current action config.

    ``verdict``: ``ok`` (no material change), ``validated`` (only benign
    surfaces changed: the link's LastValidatedPackInstallId may advance),
    ``mapping`` (mapping/body fingerprint differs: refuse the PATCH, keep the
    link), ``suspend`` (a fail-closed surface changed: the link becomes
    ``suspended_drift``). ``surfaces`` names what changed.
    """

    verdict: str
    surfaces: tuple[str, ...]


def patch_drift(link: RemoteLink, current: dict) -> Drift:
    """Classify ``current`` (an :func:`action_config_snapshot`) against ``link``'s validated snapshot.

    Seed 002 "Drift Matrix", finalized-link column: the update route (method,
    base URL and rendered path for the link's remote id), credential reference,
    auth kind, credential generation and endpoint class fail closed unless the
    *current* profile declares the surface benign; a target-object rename is
    benign only while the rendered route is unchanged (the destination contract
    proves the same remote target); Flow/action/profile/namespace names, the
    pack installation, retry policy, create path and responseIdPath are benign;
    the mirror tuple is not compared here (the link keeps the tuple it was
    created with; finalization refuses to mirror into another one);
    mapping and body fingerprints are compared with the link's own current
    fingerprints (never the snapshot), so only a revalidation receipt moves them.
    """
    before = link.snapshot
    benign = set(current["drift"]["benign"])
    surfaces: list[str] = []
    fail: list[str] = []
    if "update" not in before or "endpoint" not in before:
        return Drift("suspend", ("snapshot_incomplete",))
    if render_update_route(before, link.remote_id) != render_update_route(current, link.remote_id):
        fail.append("update_route")
    for surface, key in (("credential_ref", "credential_ref"), ("auth_kind", "auth_kind"),
                         ("credential_generation", "credential_generation")):
        if before.get(key) != current.get(key):
            (surfaces if surface in benign else fail).append(surface)
    if before["endpoint"].get("class", "") != current["endpoint"].get("class", ""):
        (surfaces if "endpoint" in benign else fail).append("endpoint")
    for surface in ("connector_namespace", "target_object", "profile_name", "flow", "install_id",
                    "retry_policy_hash", "create_path_hash", "response_id_path_hash", "idempotency"):
        if before.get(surface) != current.get(surface):
            surfaces.append(surface)
    if fail:
        return Drift("suspend", tuple(fail))
    if (link.mapping_fingerprint, link.body_fingerprint) != (current["mapping_fingerprint"],
                                                             current["body_fingerprint"]):
        return Drift("mapping", ("mapping_fingerprint",) + tuple(surfaces))
    return Drift("validated" if surfaces else "ok", tuple(surfaces))


def active_slots(org_id: str) -> set[tuple[str, str, str]]:
    """``(owner_key, action_slot_id, destination_slot_id)`` of every push contract the org's serving accounts offer."""
    from connectors.selectors import served_push_contracts

    return {(pack.owner_key, contract.get("action_slot_id", ""), contract.get("destination_slot_id", ""))
            for pack, _account, contract in served_push_contracts(org_id)}


@dataclass(frozen=True)
class Lineage:
    """Rows of one source record under a slot no serving pack offers (seed 002 key-changing drift)."""

    links: tuple[RemoteLink, ...]
    effects: tuple[RemoteEffect, ...]

    def __bool__(self) -> bool:
        return bool(self.links or self.effects)

    def as_evidence(self) -> dict:
        return {"links": [{"id": int(link.pk), "link_key": link.link_key, "owner_key": link.owner_key,
                           "action_slot_id": link.action_slot_id, "destination_slot_id": link.destination_slot_id,
                           "state": link.state} for link in self.links],
                "effects": [{"id": int(e.pk), "link_key": e.link_key, "state": e.state} for e in self.effects]}


def orphaned_lineage(*, org_id: str, source_object: str, source_record_key: str, link_key: str) -> Lineage:
    """Push links and create-holding effects of the record whose stable slot is not offered now.

    A link or unsuperseded create of the same record under another link key
    whose ``(owner, action slot, destination slot)`` is still served belongs
    to another live slot and is not lineage. Retired links are resolved lineage.
    """
    from connectors.selectors import push_rows_of_record

    served = active_slots(org_id)
    links, effects = push_rows_of_record(org_id=org_id, source_object=source_object,
                                         source_record_key=source_record_key, action_type=PUSH_ACTION_TYPE,
                                         link_key=link_key)
    return Lineage(
        tuple(link for link in links if (link.owner_key, link.action_slot_id, link.destination_slot_id) not in served),
        tuple(effect for effect in effects
              if (effect.owner_key, effect.action_slot_id, effect.destination_slot_id) not in served))


def link_row_digest(link: RemoteLink, *, revalidation_operation_id: str | None = None) -> str:
    """Digest of the complete persisted link row a revalidation member binds (seed 002 CARVE_DOWN, invariant 2).

    Covers the link id, durable identity, remote id, complete persisted
    profile/path snapshot, current fingerprints, installation lineage and the
    current revalidation pointer. The pointer is digested as the operation id
    of the receipt it names (the seed's LastMappingRevalidationOperationId;
    one receipt per operation and link), read from that receipt, or ``""``
    while the link was never revalidated. ``revalidation_operation_id``
    supplies it for a projected after-state whose receipt is not written yet,
    so a receipt can record the digest of the row that will point at it.

    Returns:
        64 lowercase hex characters.
    """
    pointer = revalidation_operation_id
    if pointer is None:
        pointer = ""
        if link.last_mapping_revalidation_id is not None:
            pointer = PushLinkRevalidationReceipt.objects.filter(
                org_id=link.org_id, pk=link.last_mapping_revalidation_id).values_list("operation_id", flat=True).get()
    return digest_v2("connectors.push-link-row", [
        ("id", str(int(link.pk))), ("link_key", link.link_key), ("owner_key", link.owner_key),
        ("action_slot_id", link.action_slot_id), ("destination_slot_id", link.destination_slot_id),
        ("source", f"{link.source_object}/{link.source_record_key}"), ("remote_scope", link.remote_scope),
        ("remote_id", link.remote_id), ("state", link.state), ("snapshot", canonical_json.dumps(link.snapshot)),
        ("mapping_fingerprint", link.mapping_fingerprint), ("body_fingerprint", link.body_fingerprint),
        ("created_install_id", link.created_install_id),
        ("last_validated_install_id", link.last_validated_install_id),
        ("last_mapping_revalidation", pointer),
    ]).hexdigest


def append_link_evidence(link: RemoteLink, *, kind: str, actor: str, to_state: str, detail: dict) -> RemoteLinkEvidence:
    """Append one immutable lifecycle row for ``link`` (inside the caller's transaction)."""
    from nexusflow.kernel.models import insert

    digest = digest_v2("connectors.link-evidence", [
        ("link", str(int(link.pk))), ("kind", kind), ("from", link.state), ("to", to_state),
        ("detail", canonical_json.dumps(detail))]).hexdigest
    return insert(RemoteLinkEvidence, org_id=link.org_id, link=link, kind=kind, actor=actor[:120],
                  from_state=link.state, to_state=to_state, detail=detail, digest=digest)
