"""Immutable generations and their owner readers (seed 003 "Ownership boundaries",
"Existing foundations and schema ownership", "Generation and replay").

Three owners author immutable generations from JSON documents, each through a
management command:

- L1 pack generations (:func:`pack_publish`, ``connector_pack_publish``) with
  their Catalog binding view: one :class:`~connectors.models.CatalogBinding`
  per inbound route, callout profile, field mapping and push contract;
- L2 credential generations (:func:`credential_publish`,
  ``connector_credential_publish``): a secret-backend version reference; the
  secret goes to the versioned secrets directory, never to the database;
- L2 service configuration generations (:func:`service_configuration_apply`,
  ``connector_config_apply``): the exhaustive ordered account set, enabled
  routes, mapping selections and the exhaustive
  ``(account, CredentialRef) -> CredentialGeneration id`` relation.

Each owner's reader (:func:`pack_generation_read`,
:func:`credential_generation_read`, :func:`service_configuration_read`)
fresh-reads the exact generation by id, checks it under the owner's own
protocol and returns its deterministic receipt as opaque bytes plus the owner's
digest of them (:class:`~nexusflow.kernel.digests.OwnerReceipt`). Receipts are
rebuilt from the immutable row on every read, so a row that drifted (or a
caller's copy of a receipt) can never match one the owner did not produce.
Readers never read secret bytes.
"""
from __future__ import annotations

import json
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from django.db import IntegrityError, transaction

from connectors.contracts.pack_document import PackError, validate_pack_document
from connectors.models import (
    AccountServingGate,
    CatalogBinding,
    ConnectorServiceConfigurationGeneration,
    CredentialGeneration,
    PackGeneration,
)
from connectors.serving import secret_store
from connectors.serving.publication import publication_barrier_admit
from connectors.store import AccountServingGateStore, CredentialDispatchGateStore
from connectors.v1.barriers import v1_barrier_admit
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import PROFILE_V2, OwnerReceipt, digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

BINDING_KINDS = ("inbound_route", "callout_profile", "field_mapping", "push_contract")
#: Versions of the definition envelope and definition receipt of a binding owner.
DEFINITION_ENVELOPE_VERSION = "1"
DEFINITION_RECEIPT_VERSION = "1"
PACK_RECEIPT_PROTOCOL = "nexusflow.pack-generation-receipt.v1"
BINDING_RECEIPT_PROTOCOL = "nexusflow.binding-definition-receipt.v1"
CONFIG_GENERATION_PROTOCOL = "nexusflow.l2-service-configuration.v1"
CONFIG_RECEIPT_PROTOCOL = "nexusflow.l2-service-configuration-receipt.v1"
CREDENTIAL_RECEIPT_PROTOCOL = "nexusflow.credential-generation-receipt.v1"
RUNTIME_COMMAND_VERSION = "1"
#: Inside the configuration transaction, past the configuration maintenance barrier, the new generation
#: and its new gates written, before the commit: a configuration held here crosses a barrier close.
FP_CONFIGURATION_BEFORE_COMMIT = failpoints.declare("l2.configuration.before_commit")


class ConfigurationError(NexusError):
    """An L2 document or publication request is invalid (a definite refusal)."""

    code = "configuration_invalid"
    definite = True


class OwnerMismatch(NexusError):
    """An owner's exact generation is absent, mutated or inconsistent: authoritative."""

    code = "owner_mismatch"
    definite = True


class OwnerUnavailable(NexusError):
    """An owner could not be read right now; retrying may succeed."""

    code = "owner_unavailable"


def _receipt(owner: str, domain: str, body: dict) -> OwnerReceipt:
    data = canonical_json.dumps(body)
    return OwnerReceipt(owner, data, digest_v2(domain, [("receipt", data)]).hexdigest)


# --- L1 pack generations and the Catalog binding view ---------------------------
@dataclass(frozen=True)
class BindingRead:
    """One Catalog binding with its binding-owner proof (the preimage item 4 fields)."""

    pack_generation_id: int
    pack_ordinal: int
    row_id: str
    identity_digest: str
    kind: str
    owner_pack: str
    installation_id: str
    payload_digest: str
    business_key: str
    definition_version: str
    credential_refs: bytes
    runtime_command: str | None
    runtime_version: str | None
    definition: dict
    definition_digest: str
    receipt: OwnerReceipt


@dataclass(frozen=True)
class PackRead:
    """A fresh read of one exact pack generation: row, bindings in ordinal order, receipt."""

    generation: PackGeneration
    bindings: tuple[BindingRead, ...]
    receipt: OwnerReceipt

    def binding(self, kind: str, business_key: str) -> BindingRead:
        """Return the binding of ``kind`` named ``business_key``.

        Raises:
            ConfigurationError: no such binding in this generation.
        """
        for binding in self.bindings:
            if binding.kind == kind and binding.business_key == business_key:
                return binding
        raise ConfigurationError(f"pack {self.generation.pack_key} {self.generation.version} has no "
                                 f"{kind.replace('_', ' ')} {business_key!r}", code="binding_unknown")


def pack_payload_digest(document: dict) -> str:
    """The PackPayloadDigest of a pack document's canonical bytes (64 hex chars)."""
    return digest_v2("connectors.pack-generation", [("document", canonical_json.dumps(document))]).hexdigest


def derive_bindings(document: dict) -> list[dict]:
    """The Catalog bindings a pack document defines, in their fixed ordinal order.

    Order: inbound routes, callout profiles, one field mapping per push
    contract, push contracts, each in document order.

    Returns:
        ``[{"kind", "business_key", "definition", "credential_refs": [..],
        "runtime": (command, version) | None}]``.
    """
    out = []
    for route in document.get("inbound_routes", []):
        refs = [route["credential_ref"]] if route.get("credential_ref") else []
        out.append({"kind": "inbound_route", "business_key": route["route_key"], "definition": route,
                    "credential_refs": refs, "runtime": (route["application"]["command"], RUNTIME_COMMAND_VERSION)})
    for profile in document.get("callout_profiles", []):
        ref = (profile.get("auth") or {}).get("credential_ref")
        out.append({"kind": "callout_profile", "business_key": profile["profile_key"], "definition": profile,
                    "credential_refs": [ref] if ref else [], "runtime": None})
    for contract in document.get("push_contracts", []):
        mapping = {"source_object": contract["source_object"], "mapping": contract["mapping"],
                   "mirror_field": contract.get("mirror_field")}
        out.append({"kind": "field_mapping", "business_key": contract["contract_key"], "definition": mapping,
                    "credential_refs": [], "runtime": None})
    for contract in document.get("push_contracts", []):
        out.append({"kind": "push_contract", "business_key": contract["contract_key"], "definition": contract,
                    "credential_refs": [], "runtime": None})
    return out


def _binding_values(generation: PackGeneration, ordinal: int, item: dict) -> dict:
    definition_digest = digest_v2("l1.binding-definition", [
        ("kind", item["kind"]), ("business_key", item["business_key"]),
        ("definition", canonical_json.dumps(item["definition"]))]).hexdigest
    identity_digest = digest_v2("catalog.binding-identity", [
        ("owner_pack", generation.owner_key), ("installation_id", generation.installation_id),
        ("payload_digest", generation.digest), ("kind", item["kind"]), ("business_key", item["business_key"]),
        ("definition_version", generation.version)]).hexdigest
    row_id = digest_v2("catalog.binding-row", [
        ("pack_generation_id", str(int(generation.pk))), ("ordinal", ordinal),
        ("identity_digest", identity_digest)]).hexdigest
    runtime = item["runtime"] or ("", "")
    return {"ordinal": ordinal, "row_id": row_id, "identity_digest": identity_digest, "kind": item["kind"],
            "owner_pack": generation.owner_key, "installation_id": generation.installation_id,
            "payload_digest": generation.digest, "business_key": item["business_key"],
            "definition_version": generation.version,
            "credential_refs": canonical_json.dumps(sorted(item["credential_refs"])),
            "runtime_command": runtime[0], "runtime_version": runtime[1], "definition": item["definition"],
            "definition_digest": definition_digest, "profile_id": PROFILE_V2}


def _installation_id(owner_key: str, version: str, payload_digest: str) -> str:
    return f"{owner_key}@{version}#{payload_digest[:16]}"


def pack_publish(*, document: dict, source: str = "<document>") -> tuple[PackGeneration, bool]:
    """Publish one immutable pack generation and its Catalog bindings.

    Publishing the same bytes again returns the existing generation. A pack key
    and version name exactly one payload: other content under a published
    version is refused (publish a new version instead).

    Args:
        document: the parsed ``pack.json``.
        source: where it came from, for messages.

    Returns:
        ``(generation, created)``.

    Raises:
        PackError: an incomplete or invalid definition (``pack_invalid``).
        ConfigurationError: code ``pack_version_conflict`` (same key and version, other content).

    Seed 003 "Existing foundations and schema ownership".
    """
    validate_pack_document(document, source)
    digest = pack_payload_digest(document)
    pack_key, version = document["pack_key"], document["version"]
    for _ in range(2):
        existing = PackGeneration.objects.filter(pack_key=pack_key, version=version).first()
        if existing is not None:
            if existing.digest != digest:
                raise ConfigurationError(
                    f"pack {pack_key} version {version} is already published with other content "
                    f"(payload {existing.digest[:16]}); publish it under a new version", code="pack_version_conflict")
            return existing, False
        try:
            with transaction.atomic(durable=True):
                generation = insert(
                    PackGeneration, pack_key=pack_key, owner_key=document["owner_key"], version=version,
                    document=document, digest=digest, profile_id=PROFILE_V2,
                    installation_id=_installation_id(document["owner_key"], version, digest))
                for ordinal, item in enumerate(derive_bindings(document)):
                    insert(CatalogBinding, pack_generation=generation, **_binding_values(generation, ordinal, item))
            return generation, True
        except IntegrityError:
            continue  # a concurrent publication of the same generation committed first
    raise ConfigurationError(f"pack {pack_key} {version}: concurrent publication did not settle",
                             code="pack_version_conflict")


def pack_publish_file(path: str | Path) -> tuple[PackGeneration, bool]:
    """Read ``path`` (a ``pack.json``) and :func:`pack_publish` it.

    Raises:
        PackError: unreadable file or JSON, or an invalid definition.
        ConfigurationError: see :func:`pack_publish`.
    """
    return pack_publish(document=pack_read_file(path), source=str(path))


def pack_read_file(path: str | Path) -> dict:
    """Read and validate one ``pack.json`` without writing anything.

    Raises:
        PackError: unreadable file or JSON, or an invalid definition.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
    except OSError as exc:
        raise PackError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PackError(f"{path}: {exc}") from None
    if not isinstance(document, dict):
        raise PackError(f"{path}: a pack is a JSON object")
    validate_pack_document(document, path)
    return document


def pack_generation_read(pack_generation_id: int) -> PackRead:
    """Fresh-read one exact pack generation and its bindings under the pack owner's protocol.

    Recomputes the payload digest from the stored document, re-derives every
    binding and compares it field by field with the stored Catalog rows.

    Raises:
        OwnerMismatch: the generation is absent, its payload digest or any
            binding row disagrees with its document, or a binding is missing or extra.
    """
    generation = PackGeneration.objects.filter(pk=pack_generation_id).first()
    if generation is None:
        raise OwnerMismatch(f"pack generation {pack_generation_id} does not exist")
    label = f"pack generation {generation.pk} ({generation.pack_key} {generation.version})"
    if generation.profile_id != PROFILE_V2:
        raise OwnerMismatch(f"{label} has digest profile {generation.profile_id!r}")
    if pack_payload_digest(generation.document) != generation.digest:
        raise OwnerMismatch(f"{label}: the stored document no longer matches its payload digest")
    if generation.installation_id != _installation_id(generation.owner_key, generation.version, generation.digest):
        raise OwnerMismatch(f"{label}: installation id disagrees with the generation")
    expected = [_binding_values(generation, n, item) for n, item in enumerate(derive_bindings(generation.document))]
    rows = list(CatalogBinding.objects.filter(pack_generation=generation).order_by("ordinal"))
    if len(rows) != len(expected):
        raise OwnerMismatch(f"{label}: {len(rows)} Catalog bindings stored, {len(expected)} defined")
    bindings = []
    for row, want in zip(rows, expected, strict=True):
        for name, value in want.items():
            stored = getattr(row, name)
            if isinstance(value, bytes):
                stored = bytes(stored)
            if stored != value:
                raise OwnerMismatch(f"{label}: binding {row.ordinal} field {name} disagrees with the definition")
        receipt = _receipt(row.owner_pack, "l1.binding-definition-receipt", {
            "protocol": BINDING_RECEIPT_PROTOCOL, "pack_generation_id": int(generation.pk), "kind": row.kind,
            "business_key": row.business_key, "definition_version": row.definition_version,
            "definition_digest": row.definition_digest, "payload_digest": row.payload_digest,
            "row_id": row.row_id})
        bindings.append(BindingRead(
            int(generation.pk), row.ordinal, row.row_id, row.identity_digest, row.kind, row.owner_pack,
            row.installation_id, row.payload_digest, row.business_key, row.definition_version,
            bytes(row.credential_refs), row.runtime_command or None, row.runtime_version or None, row.definition,
            row.definition_digest, receipt))
    receipt = _receipt(generation.owner_key, "l1.pack-generation-receipt", {
        "protocol": PACK_RECEIPT_PROTOCOL, "pack_generation_id": int(generation.pk), "pack_key": generation.pack_key,
        "owner_key": generation.owner_key, "version": generation.version, "payload_digest": generation.digest,
        "installation_id": generation.installation_id, "binding_count": len(bindings)})
    return PackRead(generation, tuple(bindings), receipt)


# --- L2 credential generations ---------------------------------------------------
def credential_generation_digest(*, org_id: str, account_key: str, credential_ref: str, secret_version: str,
                                 transport_digest: str) -> str:
    """The generation digest over stable identity, scope, version reference and transport digest."""
    return digest_v2("l2.credential-generation", [
        ("org_id", org_id), ("account_key", account_key), ("credential_ref", credential_ref),
        ("secret_version", secret_version), ("transport_digest", transport_digest)]).hexdigest


def transport_digest_of(transport: dict) -> str:
    """Digest of the non-secret transport configuration (64 hex chars)."""
    return digest_v2("l2.credential-transport", [("transport", canonical_json.dumps(transport))]).hexdigest


_CREDENTIAL_FIELDS = {"org_id", "account_key", "credential_ref", "version", "secret", "transport"}


def _secret_bytes(source: object, where: str) -> bytes | None:
    if source is None:
        return None
    if not isinstance(source, dict) or len(source) != 1 or not set(source) <= {"from_env", "from_file"}:
        raise ConfigurationError(f"{where}.secret must be {{\"from_env\": NAME}} or {{\"from_file\": PATH}}")
    (kind, target), = source.items()
    if not isinstance(target, str) or not target:
        raise ConfigurationError(f"{where}.secret.{kind} must be a non-empty string")
    if kind == "from_env":
        value = os.environ.get(target)
        if value is None:
            raise ConfigurationError(f"{where}: environment variable {target} is not set", code="secret_source_missing")
        return value.encode("utf-8")
    try:
        return Path(target).read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise ConfigurationError(f"{where}: cannot read secret file: {exc.strerror}",
                                 code="secret_source_missing") from None


def credential_publish(*, org: OrgScope, document: dict) -> tuple[CredentialGeneration, bool]:
    """Publish one immutable credential generation (and its dispatch gate) from a JSON document.

    Document: ``{"account_key", "credential_ref", "version", "secret"?:
    {"from_env": NAME} | {"from_file": PATH}, "transport"?: {...}, "org_id"?}``.
    With ``secret``, its bytes are written once to the versioned secrets
    directory; without it, that exact version file must already exist there.
    Publishing the same generation again returns it.

    Returns:
        ``(generation, created)``.

    Raises:
        ConfigurationError: malformed document, another org, a missing secret
            source or version file, or the version already published with
            another transport configuration (``credential_version_conflict``).
        SecretVersionConflict: the version file holds other bytes.
        InvalidIdentity: a non-canonical key.

    Seed 003 "Existing foundations and schema ownership".
    """
    where = "credential"
    if not isinstance(document, dict):
        raise ConfigurationError("a credential document is a JSON object")
    _check_org(document, org)
    unknown = sorted(set(document) - _CREDENTIAL_FIELDS)
    if unknown:
        raise ConfigurationError(f"unknown credential fields {unknown}; allowed: {sorted(_CREDENTIAL_FIELDS)}",
                                 code="unknown_field")
    ref = {"org_id": org.org_id,
           "account_key": validate_key(document.get("account_key"), field="account_key", max_length=80),
           "credential_ref": validate_key(document.get("credential_ref"), field="credential_ref", max_length=80),
           "secret_version": validate_key(document.get("version"), field="version", max_length=80)}
    transport = document.get("transport", {})
    if not isinstance(transport, dict):
        raise ConfigurationError(f"{where}.transport must be an object")
    secret = _secret_bytes(document.get("secret"), where)
    if secret is not None:
        secret_store.secret_write_once(secret=secret, **ref)
    elif not secret_store.secret_exists(**ref):
        raise ConfigurationError(
            f"no secret file for version {ref['secret_version']!r} at "
            f"{secret_store.secret_path(**ref)}; give \"secret\" or place the file first", code="secret_source_missing")
    transport_digest = transport_digest_of(transport)
    digest = credential_generation_digest(transport_digest=transport_digest, **ref)
    lookup = {"org_id": org.org_id, "account_key": ref["account_key"], "credential_ref": ref["credential_ref"],
              "secret_version": ref["secret_version"]}
    for _ in range(2):
        existing = CredentialGeneration.objects.filter(**lookup).first()
        if existing is not None:
            if existing.digest != digest:
                raise ConfigurationError(
                    f"credential {ref['account_key']}/{ref['credential_ref']} version {ref['secret_version']} is "
                    "already published with another transport configuration", code="credential_version_conflict")
            return existing, False
        try:
            with transaction.atomic(durable=True):
                # Frozen while an activation attempt holds the org's publication barriers.
                publication_barrier_admit(org_id=org.org_id, owner="credential_publication")
                generation = insert(CredentialGeneration, transport=transport, transport_digest=transport_digest,
                                    digest=digest, profile_id=PROFILE_V2, **ref)
                CredentialDispatchGateStore.create(org_id=org.org_id, credential_generation=generation,
                                                   state="enabled")
            return generation, True
        except IntegrityError:
            continue
    raise ConfigurationError("concurrent credential publication did not settle", code="credential_version_conflict")


@dataclass(frozen=True)
class CredentialRead:
    """A fresh read of one exact credential generation: row and receipt (no secret bytes)."""

    generation: CredentialGeneration
    receipt: OwnerReceipt


def credential_generation_read(*, org: OrgScope, credential_generation_id: int) -> CredentialRead:
    """Fresh-read one exact credential generation of ``org`` under the credential owner's protocol.

    Recomputes the transport and generation digests from the stored row; never
    reads the secret.

    Raises:
        OwnerMismatch: absent in this org, another profile, or a digest that no
            longer matches its fields (e.g. a drifted secret version reference).
    """
    row = CredentialGeneration.objects.filter(org_id=org.org_id, pk=credential_generation_id).first()
    if row is None:
        raise OwnerMismatch(f"credential generation {credential_generation_id} does not exist in org {org.org_id}")
    label = f"credential generation {row.pk} ({row.account_key}/{row.credential_ref})"
    if row.profile_id != PROFILE_V2:
        raise OwnerMismatch(f"{label} has digest profile {row.profile_id!r}")
    if transport_digest_of(row.transport) != row.transport_digest:
        raise OwnerMismatch(f"{label}: transport configuration disagrees with its digest")
    digest = credential_generation_digest(org_id=row.org_id, account_key=row.account_key,
                                          credential_ref=row.credential_ref, secret_version=row.secret_version,
                                          transport_digest=row.transport_digest)
    if digest != row.digest:
        raise OwnerMismatch(f"{label}: secret version reference or scope disagrees with its generation digest")
    receipt = _receipt("credentials", "l2.credential-generation-receipt", {
        "protocol": CREDENTIAL_RECEIPT_PROTOCOL, "credential_generation_id": int(row.pk), "org_id": row.org_id,
        "account_key": row.account_key, "credential_ref": row.credential_ref,
        "secret_version": row.secret_version, "transport_digest": row.transport_digest,
        "generation_digest": row.digest})
    return CredentialRead(row, receipt)


# --- L2 service configuration ------------------------------------------------------
_TOP_FIELDS = {"org_id", "accounts"}
_ACCOUNT_FIELDS = {"account_key", "pack", "pack_version", "routes", "push_contracts", "mappings", "base_url",
                   "credentials", "remote_scope"}


def _no_duplicate_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} in one JSON object")
        seen[key] = value
    return seen


def load_json_document(path: str | Path) -> object:
    """Read a JSON document, refusing duplicate keys in any object.

    Raises:
        ConfigurationError: unreadable file, invalid JSON or a duplicate key (code ``document_unreadable``).
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror}", code="document_unreadable") from None
    except ValueError as exc:
        raise ConfigurationError(f"{path} is not valid JSON: {exc}", code="document_unreadable") from None


def _check_org(document: dict, org: OrgScope) -> None:
    if "org_id" in document and document["org_id"] != org.org_id:
        raise ConfigurationError(f"the document is for org {document['org_id']!r}, not {org.org_id!r}",
                                 code="configuration_org_mismatch")


def _key_list(account: dict, field: str, where: str) -> list[str]:
    values = account.get(field, [])
    if not isinstance(values, list):
        raise ConfigurationError(f"{where}.{field} must be a list")
    keys = [validate_key(v, field=f"{where}.{field}[]", max_length=120) for v in values]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ConfigurationError(f"{where}.{field} lists {dupes} more than once", code="duplicate_selection")
    return keys


def _base_url(account: dict, where: str, needed: bool) -> str | None:
    url = account.get("base_url")
    if url is None:
        if needed:
            raise ConfigurationError(f"{where}: push contracts need a base_url")
        return None
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parts is not None and ("@" in parts.netloc or parts.query or parts.fragment):
        # Credential material rides only in credential generations (bytes in the secret backend); a URL is
        # stored in the configuration document and every frozen binding. The URL is not echoed: it may hold it.
        raise ConfigurationError(f"{where}.base_url must not carry user information, a query or a fragment; "
                                 "publish credentials as credential generations", code="configuration_url_credentials")
    if parts is None or "{" in url or "}" in url:
        raise ConfigurationError(f"{where}.base_url {url!r} is a template placeholder, not a URL",
                                 code="configuration_placeholder")
    if parts.scheme not in ("http", "https") or not parts.netloc or url != url.strip():
        raise ConfigurationError(f"{where}.base_url must be an http(s) URL, got {url!r}")
    return url


def _resolve_pack(account: dict, where: str) -> PackGeneration:
    if "pack" not in account:
        raise ConfigurationError(f"{where} names no pack")
    pack_key = validate_key(account["pack"], field=f"{where}.pack", max_length=80)
    rows = PackGeneration.objects.filter(pack_key=pack_key)
    if "pack_version" in account:
        rows = rows.filter(version=account["pack_version"])
    generation = rows.order_by("-id").first()
    if generation is None:
        version = f" version {account['pack_version']}" if "pack_version" in account else ""
        raise ConfigurationError(f"{where}: pack {pack_key!r}{version} is not published; run "
                                 f"`manage.py connector_pack_publish packs/{pack_key}/pack.json`", code="pack_unknown")
    return generation


def _freeze_account(org: OrgScope, index: int, account: object) -> dict:
    where = f"accounts[{index}]"
    if not isinstance(account, dict):
        raise ConfigurationError(f"{where} must be an object")
    unknown = sorted(set(account) - _ACCOUNT_FIELDS)
    if unknown:
        raise ConfigurationError(f"{where}: unknown fields {unknown}; allowed: {sorted(_ACCOUNT_FIELDS)}",
                                 code="unknown_field")
    key = validate_key(account.get("account_key"), field=f"{where}.account_key", max_length=80)
    where = f"account {key}"
    pack = pack_generation_read(int(_resolve_pack(account, where).pk))
    routes = _key_list(account, "routes", where)
    contracts = _key_list(account, "push_contracts", where)
    pulled = False
    for route in routes:
        pulled = pulled or pack.binding("inbound_route", route).definition.get("delivery") == "pull"
    profiles = []
    for contract in contracts:
        profile = pack.binding("push_contract", contract).definition["callout_profile"]
        pack.binding("callout_profile", profile)
        if profile not in profiles:
            profiles.append(profile)
    mappings = _key_list(account, "mappings", where) if "mappings" in account else list(contracts)
    for mapping in mappings:
        pack.binding("field_mapping", mapping)
    credentials = account.get("credentials", {})
    if not isinstance(credentials, dict):
        raise ConfigurationError(f"{where}.credentials must be an object {{credential_ref: secret version}}")
    relation = []
    for ref, version in sorted(credentials.items()):
        validate_key(ref, field=f"{where}.credentials key", max_length=80)
        if not isinstance(version, str):
            raise ConfigurationError(f"{where}.credentials.{ref} must name a published secret version (text), "
                                     f"got {json.dumps(version)}", code="credential_reference_invalid")
        validate_key(version, field=f"{where}.credentials.{ref}", max_length=80)
        generation = CredentialGeneration.objects.filter(
            org_id=org.org_id, account_key=key, credential_ref=ref, secret_version=version).first()
        if generation is None:
            raise ConfigurationError(f"{where}: credential {ref} version {version!r} is not published for org "
                                     f"{org.org_id}; run `manage.py connector_credential_publish`",
                                     code="credential_unknown")
        relation.append([ref, int(generation.pk)])
    frozen = {"account_key": key, "pack_key": pack.generation.pack_key, "pack_generation_id": int(pack.generation.pk),
              "routes": routes, "push_contracts": contracts, "callout_profiles": profiles, "mappings": mappings,
              "base_url": _base_url(account, where, bool(contracts) or pulled), "credentials": relation}
    if "remote_scope" in account:
        # Frozen only when declared, so documents (and digests) of accounts without it do not change.
        frozen["remote_scope"] = validate_key(account["remote_scope"], field=f"{where}.remote_scope", max_length=80)
    return frozen


def required_credential_refs(account: dict, pack: PackRead) -> list[str]:
    """The CredentialRefs the account's selected bindings need, sorted (routes and callout profiles)."""
    refs: set[str] = set()
    for kind, keys in (("inbound_route", account["routes"]), ("callout_profile", account["callout_profiles"])):
        for key in keys:
            refs.update(json.loads(pack.binding(kind, key).credential_refs))
    return sorted(refs)


def check_account_relation(org: OrgScope, account: dict, pack: PackRead) -> list[CredentialRead]:
    """Check one frozen account's ``(account, CredentialRef) -> CredentialGeneration`` relation.

    It must be exhaustive and exact: every CredentialRef the selected bindings
    need mapped once, nothing else mapped, and every mapped generation's stable
    identity and account scope equal to the binding's.

    Returns:
        The fresh reads of the mapped credential generations, in relation order.

    Raises:
        OwnerMismatch: a missing, extra or duplicate mapping, a generation of
            another account or CredentialRef, or a mapped generation that fails
            its owner read.

    Seed 003 "Existing foundations and schema ownership"; proof S003-RP-03.
    """
    key = account["account_key"]
    pairs = account["credentials"]
    mapped = [ref for ref, _ in pairs]
    dupes = sorted({r for r in mapped if mapped.count(r) > 1})
    if dupes:
        raise OwnerMismatch(f"account {key}: duplicate credential mapping for {dupes}")
    needed = required_credential_refs(account, pack)
    missing, extra = sorted(set(needed) - set(mapped)), sorted(set(mapped) - set(needed))
    if missing:
        raise OwnerMismatch(f"account {key}: no credential generation mapped for {missing}")
    if extra:
        raise OwnerMismatch(f"account {key}: credential mapping {extra} is not used by any selected binding")
    reads = []
    for ref, generation_id in pairs:
        read = credential_generation_read(org=org, credential_generation_id=generation_id)
        if read.generation.account_key != key or read.generation.credential_ref != ref:
            raise OwnerMismatch(f"account {key}: credential {ref} maps to generation {generation_id} of "
                                f"{read.generation.account_key}/{read.generation.credential_ref}")
        reads.append(read)
    return reads


def _config_digest(frozen: dict) -> str:
    return digest_v2("l2.service-configuration.generation", [("canonical", canonical_json.dumps(frozen))]).hexdigest


def service_configuration_apply(*, org: OrgScope, document: object) -> ConnectorServiceConfigurationGeneration:
    """Author the next immutable L2 ConnectorServiceConfigurationGeneration for ``org``.

    Document: ``{"org_id"?, "accounts": [{"account_key", "pack", "pack_version"?,
    "routes": [..], "push_contracts": [..], "mappings"?: [..], "base_url"?,
    "credentials": {"<CredentialRef>": "<published secret version>"}, "remote_scope"?}]}``
    (``remote_scope``: the provider tenant whose remote ids the account sees; accounts of one
    tenant share it; default the account key).
    Packs and credential versions are authoring locators, resolved here once to
    exact published generations; the frozen generation keeps only exact ids.
    Applying a document equal to the latest generation returns that generation.
    New accounts get an AccountServingGate in ``v1_serving``.

    Raises:
        ConfigurationError: malformed document, another org, unknown or
            duplicate fields or selections, an unpublished pack or credential,
            a placeholder or non-http(s) base_url, or an inexact credential relation.
        InvalidIdentity: a non-canonical key.
        V1MaintenanceClosed: the org's configuration maintenance barrier is closed for a cutover (503).

    Seed 003 "Existing foundations and schema ownership", "Layer contract" (L2).
    """
    if not isinstance(document, dict):
        raise ConfigurationError("the configuration must be a JSON object with an 'accounts' list")
    _check_org(document, org)
    unknown = sorted(set(document) - _TOP_FIELDS)
    if unknown:
        raise ConfigurationError(f"unknown top-level fields {unknown}; allowed: {sorted(_TOP_FIELDS)}",
                                 code="unknown_field")
    accounts = document.get("accounts")
    if not isinstance(accounts, list) or not accounts:
        raise ConfigurationError("the configuration needs a non-empty 'accounts' list")
    frozen_accounts = [_freeze_account(org, n, a) for n, a in enumerate(accounts)]
    keys = [a["account_key"] for a in frozen_accounts]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ConfigurationError(f"accounts {dupes} are listed more than once", code="duplicate_selection")
    owners = AccountServingGate.objects.filter(account_key__in=keys).exclude(org_id=org.org_id)
    taken = sorted(owners.values_list("account_key", flat=True))
    if taken:
        raise ConfigurationError(f"accounts {taken} already belong to another org", code="account_taken")
    for account in frozen_accounts:
        try:
            check_account_relation(org, account, pack_generation_read(account["pack_generation_id"]))
        except OwnerMismatch as exc:
            raise ConfigurationError(str(exc), code="credential_relation_invalid") from None
    body = {"protocol": CONFIG_GENERATION_PROTOCOL, "org_id": org.org_id, "accounts": frozen_accounts}
    with transaction.atomic(durable=True):
        # The configuration owner's maintenance barrier (seed 003 "Offline V1 shutdown ..."): frozen during a cutover.
        # The ServingPublicationBarrierSet (the gates, first in the lock order): frozen while an activation holds it.
        publication_barrier_admit(org_id=org.org_id, owner="configuration")
        v1_barrier_admit(org_id=org.org_id, kind="configuration")
        latest = ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id).order_by("-generation").first()
        if latest is not None and {k: v for k, v in latest.document.items() if k != "generation"} == body:
            return latest
        number = (latest.generation + 1) if latest else 1
        frozen = {**body, "generation": number}
        generation = insert(ConnectorServiceConfigurationGeneration, org_id=org.org_id, generation=number,
                            document=frozen, digest=_config_digest(frozen), profile_id=PROFILE_V2)
        existing = set(AccountServingGate.objects.filter(org_id=org.org_id).values_list("account_key", flat=True))
        for account in frozen_accounts:
            if account["account_key"] not in existing:
                AccountServingGateStore.create(org_id=org.org_id, account_key=account["account_key"],
                                               pack_key=account["pack_key"], state="v1_serving")
        failpoints.hit(FP_CONFIGURATION_BEFORE_COMMIT)
        return generation


@dataclass(frozen=True)
class ServiceConfigurationRead:
    """A fresh read of one exact L2 generation: row, frozen accounts, pack and credential reads, receipt."""

    generation: ConnectorServiceConfigurationGeneration
    accounts: tuple[dict, ...]
    packs: dict[int, PackRead]
    credentials: dict[int, CredentialRead]
    receipt: OwnerReceipt


def service_configuration_read(*, org: OrgScope, generation_id: int) -> ServiceConfigurationRead:
    """Fresh-read one exact L2 generation of ``org``, with every pack and credential generation it names.

    Recomputes the generation digest from the stored canonical document,
    re-reads every referenced pack generation and checks every account's
    credential relation (:func:`check_account_relation`).

    Raises:
        OwnerMismatch: absent, another profile or org, digest disagreement, an
            empty or duplicate account set, or any referenced owner mismatch.
    """
    row = ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id, pk=generation_id).first()
    if row is None:
        raise OwnerMismatch(f"configuration generation {generation_id} does not exist in org {org.org_id}")
    label = f"configuration generation {row.generation}"
    if row.profile_id != PROFILE_V2:
        raise OwnerMismatch(f"{label} has digest profile {row.profile_id!r}")
    document = row.document
    if _config_digest(document) != row.digest:
        raise OwnerMismatch(f"{label}: stored document disagrees with its generation digest")
    if document.get("protocol") != CONFIG_GENERATION_PROTOCOL or document.get("org_id") != org.org_id \
            or document.get("generation") != row.generation:
        raise OwnerMismatch(f"{label}: protocol, org or generation number disagree with the row")
    accounts = document.get("accounts") or []
    keys = [a.get("account_key") for a in accounts]
    if not accounts or len(set(keys)) != len(keys):
        raise OwnerMismatch(f"{label}: the account set is empty or lists an account twice")
    packs: dict[int, PackRead] = {}
    credentials: dict[int, CredentialRead] = {}
    for account in accounts:
        pack_id = account["pack_generation_id"]
        if pack_id not in packs:
            packs[pack_id] = pack_generation_read(pack_id)
        pack = packs[pack_id]
        if pack.generation.pack_key != account["pack_key"]:
            raise OwnerMismatch(f"{label}: account {account['account_key']} pack key disagrees with its generation")
        for kind, field in (("inbound_route", "routes"), ("push_contract", "push_contracts"),
                            ("callout_profile", "callout_profiles"), ("field_mapping", "mappings")):
            for business_key in account[field]:
                try:
                    pack.binding(kind, business_key)
                except ConfigurationError as exc:
                    raise OwnerMismatch(f"{label}: {exc}") from None
        wanted_profiles = []
        for contract in account["push_contracts"]:
            profile = pack.binding("push_contract", contract).definition["callout_profile"]
            if profile not in wanted_profiles:
                wanted_profiles.append(profile)
        if wanted_profiles != account["callout_profiles"]:
            raise OwnerMismatch(f"{label}: account {account['account_key']} callout profiles disagree with its contracts")
        if sorted(account["mappings"]) != sorted(set(account["mappings"])) or \
                not set(account["push_contracts"]) <= set(account["mappings"]):
            raise OwnerMismatch(f"{label}: account {account['account_key']} mapping selection is incomplete or repeated")
        for read in check_account_relation(org, account, pack):
            credentials[int(read.generation.pk)] = read
    receipt = _receipt("l2-configuration", "l2.service-configuration.receipt", {
        "protocol": CONFIG_RECEIPT_PROTOCOL, "org_id": row.org_id, "generation_id": int(row.pk),
        "generation": row.generation, "generation_digest": row.digest, "profile_id": row.profile_id})
    return ServiceConfigurationRead(row, tuple(accounts), packs, credentials, receipt)


__all__ = [
    "BINDING_KINDS", "BindingRead", "ConfigurationError", "CredentialRead", "OwnerMismatch", "OwnerUnavailable",
    "PackRead", "ServiceConfigurationRead", "check_account_relation", "credential_generation_read",
    "credential_publish", "derive_bindings", "load_json_document", "pack_generation_read", "pack_publish",
    "pack_publish_file", "required_credential_refs", "service_configuration_apply", "service_configuration_read",
]
