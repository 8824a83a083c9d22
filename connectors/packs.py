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

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key

from .ordering import validate_contract
from .outcomes import validate_profile as validate_outcome_profile
from .signatures import validate_config as validate_auth_config
from .stream_routes import validate_pull_route
from .windows import validate_window, validate_window_ordering


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
            profile or push contract, or an unsupported auth or ordering contract.
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


def _validate_drift_contract(drift) -> None:
    """A callout profile's seed 002 drift contract: ``benign`` surfaces, ``conflict_statuses``, ``remote_conflict``.

    Raises:
        ValueError: not an object, an unknown key or surface, a status outside
            400-499, or a ``remote_conflict`` other than ``suspend`` / ``reconcile``.
    """
    from .pushlinks import DECLARABLE_BENIGN

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
