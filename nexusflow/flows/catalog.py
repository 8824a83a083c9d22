"""The sealed Flow action capability catalog (seed 004 section 8).

``catalog.json`` (next to this module) holds neutral descriptors and handler
bindings as data. :func:`catalog_build` normalizes and validates them, applies
the conflict policy of section 8.3 and computes, in order, the descriptor
digest, the binding fingerprint, the entry digest and the catalog digest
(section 8.1). :func:`catalog_seal` persists the generation as an immutable
``FlowActionCatalogGeneration`` row bound to one complete RuntimeWorkBinding;
the compiler and the runtime read only such a sealed snapshot.
"""
from __future__ import annotations

import json
import re
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
from .models import FlowActionCatalogGeneration
from .store import catalog_insert

CATALOG_PATH = Path(__file__).with_name("catalog.json")
CONTRACT_VERSIONS = frozenset({"flows.action-capability.v2"})
FINGERPRINT_ALGORITHM = "flows.binding-fingerprint.v1"

ENTRY_KINDS = frozenset({"effect", "record_read", "record_mutation", "pure", "wait"})
OWNER_CLASSES = frozenset({"platform", "pack", "extension"})
#: Action types only the platform may register (section 8.3 "reserved names").
RESERVED_ACTION_TYPES = frozenset({"element"})
INPUT_SOURCES = frozenset({"string_literal", "trigger_record_id", "value"})
SOURCE_KEYS = ("action_type", "action_name", "owner_registration_id", "owner_class", "handler_ref",
               "handler_version", "kind", "effect_family", "inputs", "capabilities")
CAPABILITY_KEYS = (
    "execution_class", "transaction_policy", "replay_policy", "fanout_bound", "read_contract",
    "lock_plan_contract", "effect_owner", "idempotency_policy", "output_durability", "security_policy",
    "minimum_capability_version",
)
#: Closed vocabularies of the neutral descriptor (section 8.4 table); ``None`` = a free canonical key.
CAPABILITY_VALUES: dict[str, frozenset[str] | None] = {
    "execution_class": frozenset({"pure_compute", "record_read", "record_mutation", "wait", "external_effect"}),
    "transaction_policy": frozenset({"caller_transaction", "owned_transaction", "transaction_forbidden",
                                     "profile_dependent"}),
    "replay_policy": frozenset({"deterministic_replay", "idempotent_by_key", "at_most_once", "not_replayable"}),
    "read_contract": frozenset({"checkpoint_only", "current_transactional_read", "verified_snapshot"}),
    "lock_plan_contract": frozenset({"static_resource_keys", "metadata_derived_keys", "late_discovery_allowed",
                                     "unknown"}),
    "output_durability": frozenset({"ephemeral", "checkpointed", "owner_receipt"}),
    "idempotency_policy": None,
    "security_policy": None,
}
KIND_CLASS = {"effect": "external_effect", "record_read": "record_read", "record_mutation": "record_mutation",
              "pure": "pure_compute", "wait": "wait"}
_FANOUT = re.compile(r"^(?:static:[1-9][0-9]{0,5}|metadata_derived|unknown)$")
_OWNER = re.compile(r"^(?:none|integration_work|runtime_delivery|owner:[a-z][a-z0-9_.-]{0,63})$")


class CatalogError(NexusError):
    """The catalog source is invalid or conflicting; the whole generation is rejected."""

    code = "flow_catalog_invalid"


class CatalogMismatch(NexusError):
    """A persisted generation does not match its scope or recomputed digest."""

    code = "flow_catalog_mismatch"


@dataclass(frozen=True)
class CatalogEntry:
    """One effective action entry (seed 004 section 8.1).

    ``handler_ref``/``handler_version`` are ``None`` for a reserved,
    contract-only entry: it resolves but cannot compile as executable.
    """

    action_key: str  # "<actionType>:<actionName>"
    action_type: str
    action_name: str
    owner_registration_id: str
    owner_class: str
    handler_ref: str | None
    handler_version: str | None
    kind: str
    effect_family: str
    inputs: tuple[tuple[str, str, bool], ...]  # (name, source, required), sorted by name
    capabilities: dict[str, Any]
    descriptor_digest: str
    binding_fingerprint: str
    entry_digest: str

    @property
    def executable(self) -> bool:
        return self.handler_ref is not None

    def as_json(self) -> dict[str, Any]:
        return {
            "action_key": self.action_key,
            "action_type": self.action_type,
            "action_name": self.action_name,
            "owner_registration_id": self.owner_registration_id,
            "owner_class": self.owner_class,
            "handler_ref": self.handler_ref,
            "handler_version": self.handler_version,
            "kind": self.kind,
            "effect_family": self.effect_family,
            "inputs": [{"name": n, "source": s, "required": r} for n, s, r in self.inputs],
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


def normalize_capabilities(raw: Any, *, where: str) -> dict[str, Any]:
    """Validate and normalize one capability descriptor (all eleven capabilities, section 8.4).

    Raises:
        CatalogError: a missing, extra or unknown capability value (a missing
            capability never defaults: it is a rejected generation).
    """
    if not isinstance(raw, dict) or set(raw) != set(CAPABILITY_KEYS):
        raise CatalogError(f"{where}: capabilities must declare exactly {', '.join(CAPABILITY_KEYS)}")
    out: dict[str, Any] = {}
    for key in CAPABILITY_KEYS:
        value = raw[key]
        if key == "minimum_capability_version":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CatalogError(f"{where}: minimum_capability_version must be a positive integer")
            out[key] = value
            continue
        if not isinstance(value, str):
            raise CatalogError(f"{where}: {key} must be text")
        value = value.strip().lower()
        if key == "fanout_bound":
            ok = bool(_FANOUT.match(value))
        elif key == "effect_owner":
            ok = bool(_OWNER.match(value))
        elif CAPABILITY_VALUES[key] is None:
            ok = bool(re.match(r"^[a-z0-9_.:+-]{1,120}$", value))
        else:
            ok = value in CAPABILITY_VALUES[key]
        if not ok:
            raise CatalogError(f"{where}: unknown {key} {value!r}")
        out[key] = value
    return out


def descriptor_digest_of(descriptor: dict[str, Any]) -> str:
    """Step 1 of section 8.1: digest of the normalized capability descriptor."""
    return digest_json_v2("flows.catalog.descriptor", canonical_json.dumps(descriptor)).hexdigest


def binding_fingerprint_of(*, owner_registration_id: str, handler_ref: str | None, handler_version: str | None,
                           descriptor_digest: str) -> str:
    """Step 2 of section 8.1: algorithm version, owner, handler ref, implementation version, descriptor digest."""
    return digest_v2("flows.catalog.binding-fingerprint", [
        ("algorithm", FINGERPRINT_ALGORITHM),
        ("owner_registration_id", owner_registration_id),
        ("handler_ref", handler_ref),
        ("handler_version", handler_version),
        ("descriptor_digest", descriptor_digest),
    ]).hexdigest


def entry_digest_of(body: dict[str, Any]) -> str:
    """Step 3 of section 8.1: digest of the normalized complete entry (fingerprint included)."""
    return digest_json_v2("flows.catalog.entry", canonical_json.dumps(body)).hexdigest


def catalog_digest_of(*, binding_digest: str, contract_version: str, entry_digests: list[str]) -> str:
    """Step 4 of section 8.1: the complete RuntimeWorkBindingDigest plus the sorted entry digests."""
    fields: list[tuple[str, str | int | None]] = [
        ("binding_digest", binding_digest),
        ("contract_version", contract_version),
        ("entry_count", len(entry_digests)),
    ]
    fields += [("entry_digest", d) for d in entry_digests]
    return digest_v2("flows.catalog", fields).hexdigest


def _normalize_entry(raw: Any) -> CatalogEntry:
    if not isinstance(raw, dict):
        raise CatalogError("catalog entry must be an object")
    action_type = _text(raw, "action_type", max_length=60)
    action_name = _text(raw, "action_name")
    where = action_key(action_type, action_name)
    kind = _text(raw, "kind", max_length=32)
    if kind not in ENTRY_KINDS:
        raise CatalogError(f"{where}: unknown kind {kind!r}")
    owner_class = raw.get("owner_class", "pack")
    if owner_class not in OWNER_CLASSES:
        raise CatalogError(f"{where}: unknown owner_class {owner_class!r}")
    if action_type in RESERVED_ACTION_TYPES and owner_class != "platform":
        raise CatalogError(f"{where}: action type {action_type!r} is reserved for the platform")
    inputs_raw = raw.get("inputs")
    if not isinstance(inputs_raw, list):
        raise CatalogError(f"{where}: inputs must be a list")
    inputs: dict[str, tuple[str, bool]] = {}
    for item in inputs_raw:
        if not isinstance(item, dict):
            raise CatalogError(f"{where}: input must be an object")
        name = _text(item, "name", max_length=80)
        source = _text(item, "source", max_length=40)
        if source not in INPUT_SOURCES:
            raise CatalogError(f"{where}.{name}: unknown input source {source!r}")
        required = item.get("required", True)
        if not isinstance(required, bool):
            raise CatalogError(f"{where}.{name}: required must be a boolean")
        if name in inputs:
            raise CatalogError(f"{where}: input {name} declared twice")
        inputs[name] = (source, required)
    caps = normalize_capabilities(raw.get("capabilities"), where=where)
    if caps["execution_class"] != KIND_CLASS[kind]:
        raise CatalogError(f"{where}: a {kind} entry must declare execution_class {KIND_CLASS[kind]}")
    if kind == "effect" and caps["effect_owner"] == "none":
        raise CatalogError(f"{where}: an external effect needs an effect owner")
    if kind != "effect" and caps["effect_owner"] != "none":
        raise CatalogError(f"{where}: only an external effect declares an effect owner")
    effect_family = _text(raw, "effect_family", max_length=64)
    owner = _text(raw, "owner_registration_id")
    handler_ref = raw.get("handler_ref")
    handler_version = raw.get("handler_version")
    if (handler_ref is None) != (handler_version is None):
        raise CatalogError(f"{where}: a handler binding names both its reference and its implementation version")
    if handler_ref is not None:
        handler_ref = _text(raw, "handler_ref", max_length=200)
        handler_version = _text(raw, "handler_version", max_length=40)
    sorted_inputs = tuple(sorted((n, s, r) for n, (s, r) in inputs.items()))
    descriptor = {
        "kind": kind,
        "effect_family": effect_family,
        "inputs": [list(triple) for triple in sorted_inputs],
        "capabilities": caps,
    }
    descriptor_digest = descriptor_digest_of(descriptor)
    fingerprint = binding_fingerprint_of(owner_registration_id=owner, handler_ref=handler_ref,
                                         handler_version=handler_version, descriptor_digest=descriptor_digest)
    body = {
        "action_key": where,
        "owner_registration_id": owner,
        "owner_class": owner_class,
        "handler_ref": handler_ref,
        "handler_version": handler_version,
        "descriptor": descriptor,
        "binding_fingerprint": fingerprint,
    }
    return CatalogEntry(
        action_key=where, action_type=action_type, action_name=action_name, owner_registration_id=owner,
        owner_class=owner_class, handler_ref=handler_ref, handler_version=handler_version, kind=kind,
        effect_family=effect_family, inputs=sorted_inputs, capabilities=caps, descriptor_digest=descriptor_digest,
        binding_fingerprint=fingerprint, entry_digest=entry_digest_of(body),
    )


class CatalogBuilder:
    """Assemble one generation for one complete binding (seed 004 section 8.2 steps 1-5).

    ``submit`` takes neutral entries from any source; a conflicting second
    submission for one action type rejects the whole generation (section 8.3),
    a byte-identical one is idempotent. ``seal`` sorts and digests.
    """

    def __init__(self, *, binding: RuntimeWorkBinding, contract_version: str):
        if contract_version not in CONTRACT_VERSIONS:
            raise CatalogError(f"unknown catalog contract version {contract_version!r}")
        self.binding = binding
        self.contract_version = contract_version
        self._entries: dict[str, CatalogEntry] = {}
        self._sealed = False

    def submit(self, raw: Any, *, scope: RuntimeWorkBinding | None = None) -> CatalogEntry:
        """Normalize and add one entry.

        Raises:
            CatalogError: invalid entry, a source scoped to another binding,
                a pack overriding a platform-owned action, or any conflict.
        """
        if self._sealed:
            raise CatalogError("the generation is sealed")
        if scope is not None and scope.digest != self.binding.digest:
            raise CatalogError("a source bound to another RuntimeWorkBinding cannot join this generation")
        entry = _normalize_entry(raw)
        existing = self._entries.get(entry.action_key)
        if existing is not None and existing.entry_digest != entry.entry_digest:
            if existing.owner_class == "platform" and entry.owner_class != "platform":
                raise CatalogError(f"{entry.action_key} is platform-owned; a {entry.owner_class} cannot override it")
            raise CatalogError(f"conflicting registrations for action {entry.action_key}")
        self._entries[entry.action_key] = entry
        return entry

    def seal(self) -> CatalogSnapshot:
        self._sealed = True
        entries = dict(sorted(self._entries.items()))
        digest = catalog_digest_of(binding_digest=self.binding.digest, contract_version=self.contract_version,
                                   entry_digests=[e.entry_digest for e in entries.values()])
        return CatalogSnapshot(binding=self.binding, contract_version=self.contract_version,
                               generation_id=f"cg_{digest[:32]}", digest=digest, entries=entries)


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
    builder = CatalogBuilder(binding=binding, contract_version=source.get("contract_version"))
    raw_entries = source.get("entries")
    if not isinstance(raw_entries, list):
        raise CatalogError("entries must be a list")
    for raw in raw_entries:
        builder.submit(raw)
    return builder.seal()


def catalog_seal(*, snapshot: CatalogSnapshot) -> FlowActionCatalogGeneration:
    """Persist ``snapshot`` as an immutable generation, or return the existing one.

    Runs in the caller's transaction when there is one (savepoint for the
    insert race).

    Raises:
        CatalogMismatch: a row with that generation id holds another digest.
    """
    binding = snapshot.binding
    scope = dict(org_id=binding.org_id, app_installation_id=binding.app_installation_id,
                 runtime_capability_id=binding.runtime_capability_id, binding_digest=binding.digest)
    existing = FlowActionCatalogGeneration.objects.filter(generation_id=snapshot.generation_id, **scope).first()
    if existing is None:
        try:
            with transaction.atomic():
                existing = catalog_insert(
                    **scope, binding=binding.as_dict(), generation_id=snapshot.generation_id,
                    contract_version=snapshot.contract_version, digest_profile=PROFILE_V2,
                    digest=snapshot.digest, entries=snapshot.entries_json(), created_at=db_now(),
                )
        except IntegrityError:
            existing = FlowActionCatalogGeneration.objects.get(generation_id=snapshot.generation_id, **scope)
    if existing.digest != snapshot.digest:
        raise CatalogMismatch(f"catalog generation {snapshot.generation_id} holds a different digest")
    return existing


def catalog_snapshot_from_row(*, binding: RuntimeWorkBinding, row: FlowActionCatalogGeneration) -> CatalogSnapshot:
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
        "entries": [{k: e[k] for k in SOURCE_KEYS if k in e} for e in row.entries],
    }
    snapshot = catalog_build(binding=binding, source=source)
    if snapshot.digest != row.digest or snapshot.generation_id != row.generation_id:
        raise CatalogMismatch(f"catalog generation {row.generation_id} does not reproduce its digest")
    return snapshot


def catalog_current(*, binding: RuntimeWorkBinding) -> CatalogSnapshot:
    """Build the snapshot of the shipped ``catalog.json`` for ``binding`` (no DB)."""
    return catalog_build(binding=binding, source=catalog_source_load())
