"""L1 pack definitions read from ``packs/<pack_key>/pack.json`` (data only).

A pack document names its inbound routes (channel, auth mechanism, item
schema, ordering facts, application command) and its push contracts
(paths, mapping, response id path, mirror field). L0 interprets only these
generic shapes; provider names appear only in the pack data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from connectors.contracts.create_conflict_recovery import validate as validate_conflict_recovery
from connectors.contracts.ordering import validate_contract
from connectors.contracts.outcomes import validate_profile as validate_outcome_profile
from connectors.contracts.signatures import validate_config as validate_auth_config
from connectors.contracts.stream_routes import validate_pull_route
from connectors.contracts.windows import validate_window, validate_window_ordering
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key


class PackError(NexusError):
    code = "pack_invalid"


@dataclass(frozen=True)
class PackDocument:
    pack_key: str
    owner_key: str
    version: str
    document: dict
    digest: str

    def route(self, route_key: str) -> dict:
        for route in self.document.get("inbound_routes", []):
            if route["route_key"] == route_key:
                return route
        raise PackError(f"pack {self.pack_key} has no inbound route {route_key!r}")

    def route_for_channel(self, channel: str, enabled: list[str]) -> dict | None:
        for route in self.document.get("inbound_routes", []):
            if route["channel"] == channel and route["route_key"] in enabled:
                return route
        return None

    def push_contract(self, contract_key: str) -> dict:
        for contract in self.document.get("push_contracts", []):
            if contract["contract_key"] == contract_key:
                return contract
        raise PackError(f"pack {self.pack_key} has no push contract {contract_key!r}")

    def callout_profile(self, profile_key: str) -> dict:
        for profile in self.document.get("callout_profiles", []):
            if profile["profile_key"] == profile_key:
                return profile
        raise PackError(f"pack {self.pack_key} has no callout profile {profile_key!r}")


_TYPE_NAMES = {dict: "object", list: "array"}


def _shape(doc: dict, path: Path | str) -> None:
    """Each section is a list of objects: anything else is refused before it is read."""
    for section in ("inbound_routes", "push_contracts", "callout_profiles"):
        items = doc.get(section, [])
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise PackError(f"{path}: {section} must be a JSON array of objects")


def validate_pack_document(doc: dict, path: Path | str) -> None:
    """Check that ``doc`` is a complete pack definition.

    Raises:
        PackError: a missing or non-canonical key, an incomplete route, callout
            profile or push contract, an unsupported auth or ordering contract,
            an invalid association block (see :func:`validate_associations`),
            an invalid ``create_conflict_recovery`` block (see
            :func:`connectors.contracts.create_conflict_recovery.validate`), a malformed
            ``delivers`` block (the platform delivery family a contract carries, and which
            source field holds each action input), or a push contract
            whose routes or mapping could choose the remote record instead of
            its RemoteLink (see :func:`validate_remote_identity`).
    """
    if not isinstance(doc, dict):
        raise PackError(f"{path}: a pack is a JSON object")
    for key in ("pack_key", "owner_key", "version"):
        if key not in doc:
            raise PackError(f"{path}: missing {key}")
        validate_key(doc[key], field=key)
    _shape(doc, path)
    for route in doc.get("inbound_routes", []):
        for key in ("route_key", "channel", "auth", "transport_key", "kinds", "source_event_key", "ordering", "application"):
            if key not in route:
                raise PackError(f"{path}: route {route.get('route_key')!r} missing {key}")
        for key, kind in (("kinds", dict), ("source_event_key", list), ("ordering", dict), ("application", dict)):
            if not isinstance(route[key], kind):
                raise PackError(f"{path}: route {route['route_key']!r}: {key} must be a JSON {_TYPE_NAMES[kind]}")
        if not all(isinstance(spec, dict) for spec in route["kinds"].values()):
            raise PackError(f"{path}: route {route['route_key']!r}: every kind is an object")
        try:
            if route.get("delivery", "push") not in ("push", "pull"):
                raise ValueError("delivery must be 'push' (signed requests) or 'pull' (fetched from a stream)")
            if route.get("delivery", "push") == "pull":
                validate_pull_route(route)
            else:
                validate_auth_config(route["auth"])
        except ValueError as exc:
            raise PackError(f"{path}: route {route['route_key']}: {exc}") from exc
        try:
            validate_contract(route["ordering"])
            if "window" in route:
                validate_window(route["window"])
                validate_window_ordering(route["window"], route["ordering"])
        except ValueError as exc:
            raise PackError(f"{path}: route {route['route_key']}: {exc}") from exc
    for contract in doc.get("push_contracts", []):
        for key in ("contract_key", "action_slot_id", "destination_slot_id", "source_object", "callout_profile",
                    "create", "update", "response_id_path", "mapping"):
            if key not in contract:
                raise PackError(f"{path}: push contract {contract.get('contract_key')!r} missing {key}")
        if not isinstance(contract["mapping"], (dict, list)) or not contract["mapping"]:
            raise PackError(f"{path}: push contract {contract['contract_key']} has an empty or malformed mapping")
        for key in ("action_slot_id", "destination_slot_id"):
            if not isinstance(contract[key], str) or not contract[key].strip():
                raise PackError(f"{path}: push contract {contract['contract_key']}: {key} must be a non-empty "
                                f"stable slot id")
        if not isinstance(contract.get("target_object", ""), str):
            raise PackError(f"{path}: push contract {contract['contract_key']}: target_object must be text")
        delivers = contract.get("delivers")
        if delivers is not None and not (
                isinstance(delivers, dict) and set(delivers) == {"family", "fields"}
                and isinstance(delivers["family"], str) and delivers["family"]
                and isinstance(delivers["fields"], dict) and delivers["fields"]
                and all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in delivers["fields"].items())):
            raise PackError(f"{path}: push contract {contract['contract_key']}: delivers is "
                            f'{{"family": <delivery family>, "fields": {{<action input>: <source field>}}}}')
        try:
            validate_conflict_recovery(contract)
            validate_remote_identity(contract)
        except ValueError as exc:
            raise PackError(f"{path}: {exc}") from exc
    for profile in doc.get("callout_profiles", []):
        if "profile_key" not in profile:
            raise PackError(f"{path}: a callout profile has no profile_key")
        try:
            _validate_drift_contract(profile.get("drift", {}))
        except ValueError as exc:
            raise PackError(f"{path}: callout profile {profile['profile_key']!r}: {exc}") from exc
        try:
            validate_outcome_profile(profile)
        except ValueError as exc:
            raise PackError(f"{path}: callout profile {profile['profile_key']!r}: {exc}") from exc
    profiles = {p["profile_key"] for p in doc.get("callout_profiles", [])}
    for contract in doc.get("push_contracts", []):
        if contract["callout_profile"] not in profiles:
            raise PackError(f"{path}: push contract {contract['contract_key']} names unknown callout profile "
                            f"{contract['callout_profile']!r}")
    try:
        validate_associations(doc.get("push_contracts", []))
    except ValueError as exc:
        raise PackError(f"{path}: {exc}") from exc
    for kind, items, key in (("route", doc.get("inbound_routes", []), "route_key"),
                             ("callout profile", doc.get("callout_profiles", []), "profile_key"),
                             ("push contract", doc.get("push_contracts", []), "contract_key")):
        names = [item[key] for item in items]
        for name in names:
            try:
                validate_key(name, field=key, max_length=120)
            except InvalidIdentity as exc:
                raise PackError(f"{path}: {kind} {exc}") from None
        if len(set(names)) != len(names):
            raise PackError(f"{path}: a {kind} key is listed twice")


#: Association modes (seed 002 "Deferred Association Dispatch Lane"): a ``create_inline`` target may still be
#: pending when the source is saved (its create then waits in the ``deferred_association`` lane); an
#: ``update_only`` target must already be linked when the intent is authored (the create never waits for it).
ASSOCIATION_MODES = ("create_inline", "update_only")
#: The placeholder an association template carries for the target's remote id.
REMOTE_ID_PLACEHOLDER = "{remote_id}"


def _placeholders(value) -> int:
    """How many string leaves of a JSON value hold :data:`REMOTE_ID_PLACEHOLDER`."""
    if isinstance(value, str):
        return int(REMOTE_ID_PLACEHOLDER in value)
    if isinstance(value, dict):
        return sum(_placeholders(item) for item in value.values())
    if isinstance(value, list):
        return sum(_placeholders(item) for item in value)
    return 0


def validate_associations(contracts: list[dict]) -> None:
    """Check every push contract's ``associations`` block (seed 002 association contracts).

    A contract may list ``associations``: position-aligned entries
    ``{"source_field": <field of the contract's source object holding the
    target record's key>, "target_contract": <another push contract of the
    same pack>, "mode": "create_inline" | "update_only", "template": <a JSON
    object with the "{remote_id}" placeholder>}``. A create's body then carries
    the rendered templates as a list under ``associations_key``, beside the
    ``body_wrap`` object; so the contract is JSON, wraps its fields and names a
    different ``associations_key``. Targets form no cycle (a create never
    waits for itself).

    Raises:
        ValueError: a malformed entry, an unknown or self target, an unknown
            mode, a template without the placeholder, a duplicate entry, a
            missing/clashing ``associations_key``, or a target cycle.
    """
    by_key = {contract.get("contract_key"): contract for contract in contracts}
    edges: dict[str, set[str]] = {}
    for contract in contracts:
        name = contract.get("contract_key")
        entries = contract.get("associations", [])
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise ValueError(f"push contract {name}: associations must be a JSON array of objects")
        if not entries:
            if "associations_key" in contract:
                raise ValueError(f"push contract {name}: associations_key without associations")
            continue
        key = contract.get("associations_key")
        if not isinstance(key, str) or not key or key != key.strip():
            raise ValueError(f"push contract {name}: associations need a non-empty associations_key")
        if contract.get("body_encoding", "json") != "json" or not contract.get("body_wrap") \
                or contract["body_wrap"] == key:
            raise ValueError(f"push contract {name}: associations need a JSON body with a body_wrap other than "
                             f"the associations_key")
        seen = set()
        for position, entry in enumerate(entries):
            where = f"push contract {name}: association {position}"
            if set(entry) != {"source_field", "target_contract", "mode", "template"}:
                raise ValueError(f"{where} must have exactly source_field, target_contract, mode and template")
            try:
                validate_key(entry["source_field"], field="source_field")
            except InvalidIdentity as exc:
                raise ValueError(f"{where}: {exc}") from None
            target = entry["target_contract"]
            if not isinstance(target, str) or target not in by_key or target == name:
                raise ValueError(f"{where}: target_contract {target!r} is not another push contract of the pack")
            if entry["mode"] not in ASSOCIATION_MODES:
                raise ValueError(f"{where}: mode must be one of {list(ASSOCIATION_MODES)}")
            if not isinstance(entry["template"], dict) or _placeholders(entry["template"]) == 0:
                raise ValueError(f"{where}: template must be a JSON object carrying {REMOTE_ID_PLACEHOLDER!r}")
            if (entry["source_field"], target) in seen:
                raise ValueError(f"{where}: source_field and target_contract are listed twice")
            seen.add((entry["source_field"], target))
            edges.setdefault(name, set()).add(target)
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        if node in visiting:
            raise ValueError(f"push contract {node}: association targets form a cycle")
        visiting.add(node)
        for successor in sorted(edges.get(node, ())):
            visit(successor)
        visiting.discard(node)
        done.add(node)

    for node in sorted(edges):
        visit(node)


def _route(contract: dict, operation: str) -> str:
    route = contract[operation]
    name = f"push contract {contract['contract_key']}: {operation}"
    if not isinstance(route, dict) or not isinstance(route.get("method"), str) or not route["method"]:
        raise ValueError(f"{name} must be an object with a method and a path")
    path = route.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"{name}.path must be a text starting with '/'")
    return path


def validate_remote_identity(contract: dict) -> None:
    """Check that a push contract leaves the choice of remote record to its RemoteLink alone.

    Seed 002 "Source Of Truth" (the PATCH target is the RemoteLink's remote
    id; route templates are pack-owned, never sourced from record fields) and
    seed 003 "Required proof" (field ownership cannot influence remote
    identity selection). Checked at publication, so no served contract can
    break it:

    - ``create.path`` holds no ``{...}`` placeholder: before a create there
      is no remote id, and nothing of the record may name one;
    - ``update.path`` holds :data:`REMOTE_ID_PLACEHOLDER` exactly once and no
      other placeholder: the update names exactly the linked remote record;
    - no ``mapping`` target names the provider's id property: the
      ``response_id_path`` (where the provider answers the remote id), that
      path inside the ``body_wrap`` object, or the path's last segment (the
      property's name). A mapped record field would otherwise pick or
      overwrite the remote identity.

    Args:
        contract: one push contract of a pack document (its required keys present).

    Raises:
        ValueError: a route that is not ``{"method", "path"}`` with a path
            starting with ``/``, a placeholder in the create path, an update
            path without exactly one ``{remote_id}`` or with another
            placeholder, or a mapping target on the id property.
    """
    name = f"push contract {contract['contract_key']}"
    create, update = _route(contract, "create"), _route(contract, "update")
    if "{" in create or "}" in create:
        raise ValueError(f"{name}: create.path {create!r} holds a placeholder; a create names no remote record")
    if update.count(REMOTE_ID_PLACEHOLDER) != 1 or "{" in update.replace(REMOTE_ID_PLACEHOLDER, "") \
            or "}" in update.replace(REMOTE_ID_PLACEHOLDER, ""):
        raise ValueError(f"{name}: update.path {update!r} must hold {REMOTE_ID_PLACEHOLDER!r} exactly once and no "
                         f"other placeholder: the update names the linked remote record, nothing else")
    id_path = contract["response_id_path"]
    if not isinstance(id_path, str) or not id_path or any(not part for part in id_path.split(".")):
        raise ValueError(f"{name}: response_id_path must be a non-empty dotted JSON path")
    wrap = contract.get("body_wrap")
    for entry in contract["mapping"] if isinstance(contract["mapping"], list) else ():
        target = entry.get("target") if isinstance(entry, dict) else None
        if not isinstance(target, str):
            continue
        position = f"{wrap}.{target}" if wrap else target
        if id_path in (target, position) or target == id_path.rsplit(".", 1)[-1]:
            raise ValueError(f"{name}: mapping target {target!r} names the provider's id property "
                             f"(response_id_path {id_path!r}); the remote identity comes only from the RemoteLink")


def _validate_drift_contract(drift) -> None:
    """A callout profile's seed 002 drift contract: ``benign`` surfaces, ``conflict_statuses``, ``remote_conflict``.

    Raises:
        ValueError: not an object, an unknown key or surface, a status outside
            400-499, or a ``remote_conflict`` other than ``suspend`` / ``reconcile``.
    """
    from connectors.links.push_rules import DECLARABLE_BENIGN

    if not isinstance(drift, dict):
        raise ValueError("drift must be a JSON object")
    unknown = set(drift) - {"benign", "conflict_statuses", "remote_conflict"}
    if unknown:
        raise ValueError(f"drift has unknown keys {sorted(unknown)}")
    benign = drift.get("benign", [])
    if not isinstance(benign, list) or not set(benign) <= set(DECLARABLE_BENIGN):
        raise ValueError(f"drift.benign may list only {list(DECLARABLE_BENIGN)}")
    statuses = drift.get("conflict_statuses", [])
    if not isinstance(statuses, list) or not all(
            isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 499 for code in statuses):
        raise ValueError("drift.conflict_statuses must list 4xx status codes")
    if drift.get("remote_conflict", "suspend") not in ("suspend", "reconcile"):
        raise ValueError("drift.remote_conflict is 'suspend' or 'reconcile'")


def load_pack(pack_key: str, packs_dir: Path | None = None) -> PackDocument:
    """Read and validate one pack.

    Raises:
        PackError: missing file, unreadable JSON or an incomplete definition.
    """
    validate_key(pack_key, field="pack_key")
    directory = Path(packs_dir or settings.NEXUS_PACKS_DIR)
    path = directory / pack_key / "pack.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PackError(f"no pack {pack_key!r} at {path}") from None
    except json.JSONDecodeError as exc:
        raise PackError(f"{path}: {exc}") from exc
    validate_pack_document(doc, path)
    if doc["pack_key"] != pack_key:
        raise PackError(f"{path}: pack_key {doc['pack_key']!r} does not match its folder")
    digest = digest_v2("connectors.pack-generation", [("document", canonical_json.dumps(doc))]).hexdigest
    return PackDocument(doc["pack_key"], doc["owner_key"], doc["version"], doc, digest)
