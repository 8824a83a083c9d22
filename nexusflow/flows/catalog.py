"""The sealed Flow action capability catalog (seed 004 section 8).

``catalog.json`` (next to this module) holds neutral descriptors and handler
bindings as data. :func:`catalog_build` normalizes and validates them, applies
the conflict policy of section 8.3 and computes, in order, the descriptor
digest, the binding fingerprint, the entry digest and the catalog digest
(section 8.1). :func:`catalog_seal` persists the generation as an immutable
``FlowActionCapabilityCatalog`` row bound to one complete RuntimeWorkBinding;
the compiler and the runtime read only such a sealed snapshot.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import PROFILE_V2, digest_json_v2, digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key

from .binding import RuntimeWorkBinding
from .models import FlowActionCapabilityCatalog
from .store import catalog_insert

CATALOG_PATH = Path(__file__).with_name("catalog.json")
CONTRACT_VERSIONS = frozenset({"flows.action-capability.v1"})
FINGERPRINT_ALGORITHM = "flows.binding-fingerprint.v1"

ENTRY_KINDS = frozenset({"effect"})
INPUT_SOURCES = frozenset({"string_literal", "trigger_record_id"})
SOURCE_KEYS = ("action_type", "action_name", "owner_registration_id", "handler_ref", "handler_version", "kind",
               "effect_family", "inputs", "capabilities")
CAPABILITY_KEYS = (
    "execution_class", "transaction_policy", "replay_policy", "fanout_bound", "read_contract",
    "lock_plan_contract", "effect_owner", "idempotency_policy", "output_durability", "security_policy",
    "minimum_capability_version",
)


class CatalogError(NexusError):
    """The catalog source is invalid or conflicting; the whole generation is rejected."""

    code = "flow_catalog_invalid"


class CatalogMismatch(NexusError):
    """A persisted generation does not match its scope or recomputed digest."""

    code = "flow_catalog_mismatch"


@dataclass(frozen=True)
class CatalogEntry:
    """One effective action entry (seed 004 section 8.1)."""

    action_key: str  # "<actionType>:<actionName>"
    action_type: str
    action_name: str
    owner_registration_id: str
    handler_ref: str
    handler_version: str
    kind: str
    effect_family: str
    inputs: tuple[tuple[str, str], ...]  # (name, source), sorted by name
    capabilities: dict[str, Any]
    descriptor_digest: str
    binding_fingerprint: str
    entry_digest: str

    def as_json(self) -> dict[str, Any]:
        return {
            "action_key": self.action_key,
            "action_type": self.action_type,
            "action_name": self.action_name,
            "owner_registration_id": self.owner_registration_id,
            "handler_ref": self.handler_ref,
            "handler_version": self.handler_version,
            "kind": self.kind,
            "effect_family": self.effect_family,
            "inputs": [{"name": n, "source": s} for n, s in self.inputs],
            "capabilities": self.capabilities,
            "descriptor_digest": self.descriptor_digest,
            "binding_fingerprint": self.binding_fingerprint,
            "entry_digest": self.entry_digest,
        }


@dataclass(frozen=True)
class CatalogSnapshot:
    """A sealed generation as the compiler and the runtime read it."""

    binding: RuntimeWorkBinding
    contract_version: str
    generation_id: str
    digest: str
    entries: dict[str, CatalogEntry]

    def entry(self, action_type: str, action_name: str) -> CatalogEntry | None:
        return self.entries.get(action_key(action_type, action_name))

    def entries_json(self) -> list[dict[str, Any]]:
        return [self.entries[k].as_json() for k in sorted(self.entries)]


def action_key(action_type: str, action_name: str) -> str:
    return f"{action_type}:{action_name}"


def catalog_source_load(path: Path | None = None) -> dict[str, Any]:
    """Read the catalog source document (default: ``catalog.json``).

    Raises:
        CatalogError: unreadable or not a JSON object.
    """
    try:
        doc = json.loads((path or CATALOG_PATH).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CatalogError(f"catalog source unreadable: {exc}") from exc
    if not isinstance(doc, dict):
        raise CatalogError("catalog source must be a JSON object")
    return doc


def _text(raw: dict, name: str, *, max_length: int = 120) -> str:
    try:
        return validate_key(raw.get(name), field=name, max_length=max_length)
    except InvalidIdentity as exc:
        raise CatalogError(f"catalog entry: {exc}") from exc


def _normalize_entry(raw: Any) -> CatalogEntry:
    if not isinstance(raw, dict):
        raise CatalogError("catalog entry must be an object")
    action_type = _text(raw, "action_type", max_length=40)
    action_name = _text(raw, "action_name")
    kind = _text(raw, "kind", max_length=32)
    if kind not in ENTRY_KINDS:
        raise CatalogError(f"{action_name}: unknown kind {kind!r}")
    inputs_raw = raw.get("inputs")
    if not isinstance(inputs_raw, list) or not inputs_raw:
        raise CatalogError(f"{action_name}: inputs must be a non-empty list")
    inputs: dict[str, str] = {}
    for item in inputs_raw:
        if not isinstance(item, dict):
            raise CatalogError(f"{action_name}: input must be an object")
        name = _text(item, "name", max_length=80)
        source = _text(item, "source", max_length=40)
        if source not in INPUT_SOURCES:
            raise CatalogError(f"{action_name}.{name}: unknown input source {source!r}")
        if name in inputs:
            raise CatalogError(f"{action_name}: input {name} declared twice")
        inputs[name] = source
    caps = raw.get("capabilities")
    if not isinstance(caps, dict) or set(caps) != set(CAPABILITY_KEYS):
        raise CatalogError(f"{action_name}: capabilities must declare exactly {', '.join(CAPABILITY_KEYS)}")
    if kind == "effect" and caps.get("execution_class") != "external_effect":
        raise CatalogError(f"{action_name}: an effect entry must declare execution_class external_effect")
    effect_family = _text(raw, "effect_family", max_length=64)
    owner = _text(raw, "owner_registration_id")
    handler_ref = _text(raw, "handler_ref", max_length=200)
    handler_version = _text(raw, "handler_version", max_length=40)
    sorted_inputs = tuple(sorted(inputs.items()))
    descriptor = {
        "kind": kind,
        "effect_family": effect_family,
        "inputs": [list(pair) for pair in sorted_inputs],
        "capabilities": caps,
    }
    try:
        descriptor_digest = digest_json_v2("flows.catalog.descriptor", canonical_json.dumps(descriptor)).hexdigest
    except ValueError as exc:
        raise CatalogError(f"{action_name}: capabilities are not canonical JSON") from exc
    fingerprint = digest_v2("flows.catalog.binding-fingerprint", [
        ("algorithm", FINGERPRINT_ALGORITHM),
        ("owner_registration_id", owner),
        ("handler_ref", handler_ref),
        ("handler_version", handler_version),
        ("descriptor_digest", descriptor_digest),
    ]).hexdigest
    key = action_key(action_type, action_name)
    body = {
        "action_key": key,
        "owner_registration_id": owner,
        "handler_ref": handler_ref,
        "handler_version": handler_version,
        "descriptor": descriptor,
        "binding_fingerprint": fingerprint,
    }
    entry_digest = digest_json_v2("flows.catalog.entry", canonical_json.dumps(body)).hexdigest
    return CatalogEntry(
        action_key=key, action_type=action_type, action_name=action_name, owner_registration_id=owner,
        handler_ref=handler_ref, handler_version=handler_version, kind=kind, effect_family=effect_family,
        inputs=sorted_inputs, capabilities=caps, descriptor_digest=descriptor_digest,
        binding_fingerprint=fingerprint, entry_digest=entry_digest,
    )


def catalog_build(*, binding: RuntimeWorkBinding, source: dict[str, Any]) -> CatalogSnapshot:
    """Normalize, validate and digest one generation for ``binding`` (seed 004 section 8.2).

    Args:
        binding: the complete RuntimeWorkBinding the generation is sealed for.
        source: ``{"contract_version": str, "entries": [entry, ...]}``.

    Returns:
        The sealed in-memory snapshot; ``generation_id`` is content-addressed.

    Raises:
        CatalogError: invalid entry, unknown contract version, or two different
            entries for one action key (section 8.3: the whole generation fails).
    """
    contract_version = source.get("contract_version")
    if contract_version not in CONTRACT_VERSIONS:
        raise CatalogError(f"unknown catalog contract version {contract_version!r}")
    raw_entries = source.get("entries")
    if not isinstance(raw_entries, list):
        raise CatalogError("entries must be a list")
    entries: dict[str, CatalogEntry] = {}
    for raw in raw_entries:
        entry = _normalize_entry(raw)
        existing = entries.get(entry.action_key)
        if existing is not None and existing.entry_digest != entry.entry_digest:
            raise CatalogError(f"conflicting registrations for action {entry.action_key}")
        entries[entry.action_key] = entry
    fields: list[tuple[str, str | int | None]] = [
        ("binding_digest", binding.digest),
        ("contract_version", contract_version),
        ("entry_count", len(entries)),
    ]
    fields += [("entry_digest", entries[k].entry_digest) for k in sorted(entries)]
    digest = digest_v2("flows.catalog", fields).hexdigest
    return CatalogSnapshot(binding=binding, contract_version=contract_version,
                           generation_id=f"cg_{digest[:32]}", digest=digest, entries=entries)


def catalog_seal(*, snapshot: CatalogSnapshot) -> FlowActionCapabilityCatalog:
    """Persist ``snapshot`` as an immutable generation, or return the existing one.

    Runs in the caller's transaction when there is one (savepoint for the
    insert race).

    Raises:
        CatalogMismatch: a row with that generation id holds another digest.
    """
    binding = snapshot.binding
    scope = dict(org_id=binding.org_id, app_installation_id=binding.app_installation_id,
                 runtime_capability_id=binding.runtime_capability_id, binding_digest=binding.digest)
    existing = FlowActionCapabilityCatalog.objects.filter(generation_id=snapshot.generation_id, **scope).first()
    if existing is None:
        try:
            with transaction.atomic():
                existing = catalog_insert(
                    **scope, binding=binding.as_dict(), generation_id=snapshot.generation_id,
                    contract_version=snapshot.contract_version, digest_profile=PROFILE_V2,
                    digest=snapshot.digest, entries=snapshot.entries_json(), created_at=db_now(),
                )
        except IntegrityError:
            existing = FlowActionCapabilityCatalog.objects.get(generation_id=snapshot.generation_id, **scope)
    if existing.digest != snapshot.digest:
        raise CatalogMismatch(f"catalog generation {snapshot.generation_id} holds a different digest")
    return existing


def catalog_snapshot_from_row(*, binding: RuntimeWorkBinding, row: FlowActionCapabilityCatalog) -> CatalogSnapshot:
    """Rebuild and verify the snapshot of a persisted generation.

    Raises:
        CatalogMismatch: the row's scope differs from ``binding`` or its
            entries no longer reproduce its digest.
    """
    if (row.org_id, row.app_installation_id, row.runtime_capability_id, row.binding_digest) != (
        binding.org_id, binding.app_installation_id, binding.runtime_capability_id, binding.digest
    ):
        raise CatalogMismatch("catalog generation belongs to another work scope")
    source = {
        "contract_version": row.contract_version,
        "entries": [{k: e[k] for k in SOURCE_KEYS} for e in row.entries],
    }
    snapshot = catalog_build(binding=binding, source=source)
    if snapshot.digest != row.digest or snapshot.generation_id != row.generation_id:
        raise CatalogMismatch(f"catalog generation {row.generation_id} does not reproduce its digest")
    return snapshot


def catalog_current(*, binding: RuntimeWorkBinding) -> CatalogSnapshot:
    """Build the snapshot of the shipped ``catalog.json`` for ``binding`` (no DB)."""
    return catalog_build(binding=binding, source=catalog_source_load())
