"""The V2 ServingEpoch preimage, its candidates and their owner verification
(seed 003 "Identity rules": "The V2 ServingEpoch preimage has one closed nested
order"; "State machines": ServingEpoch ``prepared -> verified | rejected``).

The preimage is the V2 digest profile's encoding
(:func:`nexusflow.kernel.digests.encode_v2`: framed domain and profile id, then each field as
``frame(name) || tagged value``; integers are fixed-width signed 64-bit
big-endian, text and bytes are u32 length framed) of exactly these fields, in
this order:

1. ``epoch.id`` (text), ``epoch.scope_digest`` (text);
2. the Catalog attestation: ``catalog.organization``,
   ``catalog.application_installation``, ``catalog.authorized_workload``,
   ``catalog.lineage_revision``, ``catalog.source_snapshot_digest``,
   ``catalog.view_digest``, ``catalog.receipt_protocol``,
   ``catalog.revision`` (the lineage revision tuple repeated),
   ``catalog.security_epoch`` (int), ``catalog.capability_version``;
3. the Service Configuration proof: ``config.generation_protocol``,
   ``config.receipt_protocol``, ``config.generation_id``,
   ``config.generation_digest``, ``config.receipt`` (opaque owner bytes),
   ``config.receipt_digest`` (the owner's digest, never a rehash);
4. ``bindings.count`` (int), then per binding in ordinal order:
   ``binding.ordinal`` (int), ``binding.row_id``, ``binding.identity_digest``,
   ``binding.kind``, ``binding.owner_pack``, ``binding.pack_installation_id``,
   ``binding.pack_payload_digest``, ``binding.business_key``,
   ``binding.definition_version``, ``binding.credential_refs`` (bytes),
   ``binding.runtime_command`` and ``binding.runtime_version`` (text or null),
   and immediately its owner proof: ``proof.pack_generation_id``,
   ``proof.definition_envelope_version``, ``proof.definition_receipt_version``,
   ``proof.definition_digest``, ``proof.receipt`` (bytes),
   ``proof.receipt_digest``;
5. ``credentials.count`` (int), then per credential generation in ascending
   byte order of its id (decimal text): ``credential.ordinal`` (int, zero
   based), ``credential.generation_id``, ``credential.receipt_protocol``,
   ``credential.transport_digest``, ``credential.receipt`` (bytes),
   ``credential.receipt_digest``.

The epoch digest is SHA-256 of the preimage. No canonical definition bytes,
configuration payload, transport configuration or secret material is part of
it; owner digests and receipts go in as exact opaque bytes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import pairwise

from django.db import IntegrityError, OperationalError, transaction

from connectors import reasons
from connectors.models import ConnectorServiceConfigurationGeneration, ServingEpoch
from connectors.serving.generations import (
    CONFIG_GENERATION_PROTOCOL,
    CONFIG_RECEIPT_PROTOCOL,
    CREDENTIAL_RECEIPT_PROTOCOL,
    DEFINITION_ENVELOPE_VERSION,
    DEFINITION_RECEIPT_VERSION,
    OwnerMismatch,
    OwnerUnavailable,
    ServiceConfigurationRead,
    service_configuration_read,
)
from connectors.store import ServingEpochStore
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V2, FieldValue, OwnerReceipt, digest_v2, encode_v2
from nexusflow.kernel.errors import DigestProfileError, NexusError
from nexusflow.kernel.scope import OrgScope

EPOCH_DOMAIN = "connectors.serving-epoch"
CATALOG_RECEIPT_PROTOCOL = "nexusflow.catalog-view-receipt.v1"
CATALOG_APPLICATION_INSTALLATION = "nexusflow.connector-v2"
CATALOG_AUTHORIZED_WORKLOAD = "connector.inbound+outbound"
CATALOG_SECURITY_EPOCH = 1
CATALOG_CAPABILITY_VERSION = "1"


class EpochCandidateInvalid(NexusError):
    """A candidate breaks the closed order: ordinals, counts, credential order or duplicates."""

    code = "epoch_candidate_invalid"
    definite = True


class EpochVerificationFailed(NexusError):
    code = "epoch_verification_failed"


class EpochVerificationDeferred(NexusError):
    """An owner was unavailable: the candidate stays ``prepared``; retry later."""

    code = "epoch_verification_deferred"


@dataclass(frozen=True)
class CatalogAttestation:
    organization: str
    application_installation: str
    authorized_workload: str
    lineage_revision: str
    source_snapshot_digest: str
    view_digest: str
    receipt_protocol: str
    security_epoch: int
    capability_version: str


@dataclass(frozen=True)
class ConfigProof:
    generation_protocol: str
    receipt_protocol: str
    generation_id: str
    generation_digest: str
    receipt: OwnerReceipt


@dataclass(frozen=True)
class BindingItem:
    ordinal: int
    row_id: str
    identity_digest: str
    kind: str
    owner_pack: str
    pack_installation_id: str
    pack_payload_digest: str
    business_key: str
    definition_version: str
    credential_refs: bytes
    runtime_command: str | None
    runtime_version: str | None
    pack_generation_id: str
    definition_envelope_version: str
    definition_receipt_version: str
    definition_digest: str
    receipt: OwnerReceipt


@dataclass(frozen=True)
class CredentialProof:
    ordinal: int
    generation_id: str
    receipt_protocol: str
    transport_digest: str
    receipt: OwnerReceipt


@dataclass(frozen=True)
class EpochCandidate:
    """Everything the V2 preimage holds, in its closed nested order."""

    epoch_id: str
    scope_digest: str
    catalog: CatalogAttestation
    config: ConfigProof
    bindings: tuple[BindingItem, ...]
    credentials: tuple[CredentialProof, ...]


def preimage_fields(candidate: EpochCandidate) -> list[tuple[str, FieldValue]]:
    """The ordered ``(name, value)`` fields of the V2 preimage (see the module docstring).

    Raises:
        EpochCandidateInvalid: binding ordinals not ``0..n-1`` in order, credential
            ordinals not ``0..n-1``, credential ids not strictly ascending by bytes
            (duplicates), or a binding or credential id repeated.
    """
    c = candidate
    for n, binding in enumerate(c.bindings):
        if binding.ordinal != n:
            raise EpochCandidateInvalid(f"binding {n} carries ordinal {binding.ordinal}")
    row_ids = [b.row_id for b in c.bindings]
    if len(set(row_ids)) != len(row_ids):
        raise EpochCandidateInvalid("a Catalog binding appears twice")
    ids = [p.generation_id.encode("utf-8") for p in c.credentials]
    if any(a >= b for a, b in pairwise(ids)):
        raise EpochCandidateInvalid("credential generations are not unique in ascending byte order")
    for n, proof in enumerate(c.credentials):
        if proof.ordinal != n:
            raise EpochCandidateInvalid(f"credential proof {n} carries ordinal {proof.ordinal}")
    cat = c.catalog
    fields: list[tuple[str, FieldValue]] = [
        ("epoch.id", c.epoch_id), ("epoch.scope_digest", c.scope_digest),
        ("catalog.organization", cat.organization), ("catalog.application_installation", cat.application_installation),
        ("catalog.authorized_workload", cat.authorized_workload), ("catalog.lineage_revision", cat.lineage_revision),
        ("catalog.source_snapshot_digest", cat.source_snapshot_digest), ("catalog.view_digest", cat.view_digest),
        ("catalog.receipt_protocol", cat.receipt_protocol), ("catalog.revision", cat.lineage_revision),
        ("catalog.security_epoch", cat.security_epoch), ("catalog.capability_version", cat.capability_version),
        ("config.generation_protocol", c.config.generation_protocol),
        ("config.receipt_protocol", c.config.receipt_protocol), ("config.generation_id", c.config.generation_id),
        ("config.generation_digest", c.config.generation_digest),
        ("config.receipt", c.config.receipt.receipt), ("config.receipt_digest", c.config.receipt.owner_digest),
        ("bindings.count", len(c.bindings)),
    ]
    for b in c.bindings:
        fields += [
            ("binding.ordinal", b.ordinal), ("binding.row_id", b.row_id),
            ("binding.identity_digest", b.identity_digest), ("binding.kind", b.kind),
            ("binding.owner_pack", b.owner_pack), ("binding.pack_installation_id", b.pack_installation_id),
            ("binding.pack_payload_digest", b.pack_payload_digest), ("binding.business_key", b.business_key),
            ("binding.definition_version", b.definition_version), ("binding.credential_refs", b.credential_refs),
            ("binding.runtime_command", b.runtime_command), ("binding.runtime_version", b.runtime_version),
            ("proof.pack_generation_id", b.pack_generation_id),
            ("proof.definition_envelope_version", b.definition_envelope_version),
            ("proof.definition_receipt_version", b.definition_receipt_version),
            ("proof.definition_digest", b.definition_digest),
            ("proof.receipt", b.receipt.receipt), ("proof.receipt_digest", b.receipt.owner_digest),
        ]
    fields.append(("credentials.count", len(c.credentials)))
    for p in c.credentials:
        fields += [
            ("credential.ordinal", p.ordinal), ("credential.generation_id", p.generation_id),
            ("credential.receipt_protocol", p.receipt_protocol), ("credential.transport_digest", p.transport_digest),
            ("credential.receipt", p.receipt.receipt), ("credential.receipt_digest", p.receipt.owner_digest),
        ]
    return fields


def encode_preimage(candidate: EpochCandidate) -> bytes:
    """Return the exact V2 ServingEpoch preimage bytes of ``candidate``.

    Raises:
        EpochCandidateInvalid: see :func:`preimage_fields`.
    """
    return encode_v2(EPOCH_DOMAIN, preimage_fields(candidate))


def epoch_digest_of(preimage: bytes) -> str:
    """SHA-256 of the preimage, 64 lowercase hex characters."""
    return hashlib.sha256(preimage).hexdigest()


def first_difference(expected: EpochCandidate, stored: bytes) -> str:
    """Name the first preimage field where ``stored`` departs from ``expected`` (for messages)."""
    prefix = encode_v2(EPOCH_DOMAIN, [])
    if stored[:len(prefix)] != prefix:
        return "domain or profile prefix"
    offset = len(prefix)
    for name, value in preimage_fields(expected):
        chunk = encode_v2(EPOCH_DOMAIN, [(name, value)])[len(prefix):]
        if stored[offset:offset + len(chunk)] != chunk:
            return name
        offset += len(chunk)
    return "trailing bytes" if len(stored) != offset else ""


# --- building a candidate from fresh owner reads ------------------------------------
def scope_digest_of(org_id: str, account_keys: list[str]) -> str:
    """ServingScopeDigest: the org and its exhaustive ordered account set."""
    return digest_v2("connectors.serving-scope", [("org_id", org_id),
                                                  ("accounts", canonical_json.dumps(account_keys))]).hexdigest


def _selected(config: ServiceConfigurationRead) -> list:
    """The epoch's Catalog binding set: every binding any account selects, once, by (generation, pack ordinal)."""
    chosen = {}
    for account in config.accounts:
        pack = config.packs[account["pack_generation_id"]]
        for kind, field in (("inbound_route", "routes"), ("callout_profile", "callout_profiles"),
                            ("field_mapping", "mappings"), ("push_contract", "push_contracts")):
            for key in account[field]:
                binding = pack.binding(kind, key)
                chosen[(binding.pack_generation_id, binding.pack_ordinal)] = binding
    return [chosen[k] for k in sorted(chosen)]


def _document(config: ServiceConfigurationRead) -> dict:
    """The epoch's reader index: what admission, claims and egress look up, from exact generations."""
    accounts = []
    for account in config.accounts:
        pack = config.packs[account["pack_generation_id"]]
        routes = {}
        for route_key in account["routes"]:
            ordering = pack.binding("inbound_route", route_key).definition["ordering"]
            routes[route_key] = {"ordering": ordering, "ordering_digest": digest_v2(
                "connectors.ordering-contract", [("ordering", canonical_json.dumps(ordering))]).hexdigest}
        credentials = {}
        for ref, generation_id in account["credentials"]:
            read = config.credentials[generation_id]
            credentials[ref] = {"id": generation_id, "digest": read.generation.digest,
                                "secret_version": read.generation.secret_version}
        accounts.append({
            "account_key": account["account_key"], "pack_key": pack.generation.pack_key,
            "owner_key": pack.generation.owner_key,
            "pack_generation": {"id": int(pack.generation.pk), "digest": pack.generation.digest},
            "routes": routes, "push_contracts": list(account["push_contracts"]), "mappings": list(account["mappings"]),
            "base_url": account["base_url"], "credentials": credentials,
            **({"remote_scope": account["remote_scope"]} if account.get("remote_scope") else {}),
        })
    row = config.generation
    return {"configuration": {"id": int(row.pk), "generation": row.generation, "digest": row.digest},
            "accounts": accounts}


def build_candidate(*, org: OrgScope, configuration_id: int, epoch_id: str) -> tuple[EpochCandidate, dict]:
    """Fresh-read every owner for ``configuration_id`` and build the candidate and its reader index.

    Raises:
        OwnerMismatch: any owner is absent, mutated or inconsistent (authoritative).
        OwnerUnavailable: an owner read failed for a retryable reason.
    """
    try:
        config = service_configuration_read(org=org, generation_id=configuration_id)
    except OperationalError as exc:
        raise OwnerUnavailable(f"owner read failed: {exc}") from exc
    bindings = _selected(config)
    items = tuple(BindingItem(
        ordinal=n, row_id=b.row_id, identity_digest=b.identity_digest, kind=b.kind, owner_pack=b.owner_pack,
        pack_installation_id=b.installation_id, pack_payload_digest=b.payload_digest, business_key=b.business_key,
        definition_version=b.definition_version, credential_refs=b.credential_refs,
        runtime_command=b.runtime_command, runtime_version=b.runtime_version,
        pack_generation_id=str(b.pack_generation_id), definition_envelope_version=DEFINITION_ENVELOPE_VERSION,
        definition_receipt_version=DEFINITION_RECEIPT_VERSION, definition_digest=b.definition_digest,
        receipt=b.receipt) for n, b in enumerate(bindings))
    by_bytes = sorted(config.credentials.items(), key=lambda kv: str(kv[0]).encode("utf-8"))
    credentials = tuple(CredentialProof(
        ordinal=n, generation_id=str(generation_id), receipt_protocol=CREDENTIAL_RECEIPT_PROTOCOL,
        transport_digest=read.generation.transport_digest, receipt=read.receipt)
        for n, (generation_id, read) in enumerate(by_bytes))
    pack_ids = sorted(config.packs)
    row = config.generation
    lineage = canonical_json.dumps([row.generation, pack_ids]).decode("utf-8")
    catalog = CatalogAttestation(
        organization=org.org_id, application_installation=CATALOG_APPLICATION_INSTALLATION,
        authorized_workload=CATALOG_AUTHORIZED_WORKLOAD, lineage_revision=lineage,
        source_snapshot_digest=digest_v2("catalog.source-snapshot", [("packs", canonical_json.dumps(
            [[pid, config.packs[pid].generation.digest] for pid in pack_ids]))]).hexdigest,
        view_digest=digest_v2("catalog.view", [("organization", org.org_id), ("bindings", canonical_json.dumps(
            [[b.row_id, b.identity_digest, b.definition_digest] for b in bindings]))]).hexdigest,
        receipt_protocol=CATALOG_RECEIPT_PROTOCOL, security_epoch=CATALOG_SECURITY_EPOCH,
        capability_version=CATALOG_CAPABILITY_VERSION)
    proof = ConfigProof(generation_protocol=CONFIG_GENERATION_PROTOCOL, receipt_protocol=CONFIG_RECEIPT_PROTOCOL,
                        generation_id=str(int(row.pk)), generation_digest=row.digest, receipt=config.receipt)
    candidate = EpochCandidate(epoch_id=epoch_id, scope_digest=scope_digest_of(
        org.org_id, [a["account_key"] for a in config.accounts]), catalog=catalog, config=proof,
        bindings=items, credentials=credentials)
    return candidate, _document(config)


def _epoch_key(org: OrgScope, configuration: ConnectorServiceConfigurationGeneration, sequence: int) -> str:
    return "epoch-" + digest_v2("connectors.epoch-key", [
        ("org_id", org.org_id), ("configuration_id", int(configuration.pk)),
        ("configuration_digest", configuration.digest), ("sequence", sequence)]).hexdigest[:40]


def epoch_prepare(*, org: OrgScope) -> ServingEpoch:
    """Create (or return) the ``prepared`` candidate for the org's latest configuration generation.

    The candidate's preimage is built from fresh owner reads only; no caller
    supplies a receipt. An existing non-rejected candidate for the same
    generation is returned.

    Raises:
        ConfigurationError: the org has no configuration generation.
        EpochVerificationFailed: an owner is absent or mismatched, so no candidate exists.
        OwnerUnavailable: an owner could not be read right now.

    Seed 003 "Identity rules", "State machines".
    """
    from connectors.serving.generations import ConfigurationError

    generation = ConnectorServiceConfigurationGeneration.objects.filter(org_id=org.org_id).order_by("-generation").first()
    if generation is None:
        raise ConfigurationError(f"org {org.org_id} has no connector configuration; run connector_config_apply",
                                 code="configuration_missing")
    existing = ServingEpoch.objects.filter(org_id=org.org_id, configuration=generation).exclude(
        state="rejected").order_by("-id").first()
    if existing is not None:
        return existing
    sequence = ServingEpoch.objects.filter(org_id=org.org_id).count() + 1
    for _ in range(3):
        epoch_key = _epoch_key(org, generation, sequence)
        try:
            candidate, document = build_candidate(org=org, configuration_id=int(generation.pk), epoch_id=epoch_key)
        except OwnerMismatch as exc:
            raise EpochVerificationFailed(f"no candidate can be prepared: {exc}") from exc
        preimage = encode_preimage(candidate)
        try:
            with transaction.atomic(durable=True):
                return ServingEpochStore.create(
                    org_id=org.org_id, state="prepared", configuration=generation, document=document,
                    epoch_key=epoch_key, preimage=preimage, digest=epoch_digest_of(preimage), profile_id=PROFILE_V2)
        except IntegrityError:
            sequence += 1
    raise EpochVerificationFailed("could not allocate an epoch id")


def epoch_problems(*, org: OrgScope, epoch: ServingEpoch) -> list[str]:
    """Fresh-read every owner and byte-compare the rebuilt candidate with ``epoch``.

    Returns:
        Authoritative problems (empty when the candidate is exact).

    Raises:
        OwnerUnavailable: an owner could not be read (not a verdict).

    Never reads secret bytes.
    """
    if epoch.profile_id != PROFILE_V2:
        return [f"unsupported digest profile {epoch.profile_id!r}"]
    if not epoch.epoch_key:
        return ["the candidate has no V2 epoch id (legacy unprofiled candidate)"]
    try:
        candidate, document = build_candidate(org=org, configuration_id=int(epoch.configuration_id),
                                              epoch_id=epoch.epoch_key)
    except (OwnerMismatch, EpochCandidateInvalid, DigestProfileError) as exc:
        return [f"owner verification failed: {exc}"]
    problems = []
    stored = bytes(epoch.preimage)
    rebuilt = encode_preimage(candidate)
    if rebuilt != stored:
        problems.append(f"the prepared preimage differs from the owners at {first_difference(candidate, stored)}")
    if epoch_digest_of(stored) != epoch.digest or epoch_digest_of(rebuilt) != epoch.digest:
        problems.append("the epoch digest is not the digest of the owners' preimage")
    if document != epoch.document:
        problems.append("the reader index differs from the owners' exact generations")
    return problems


def epoch_verify(*, org: OrgScope, epoch_id: ServingEpoch.Id | int) -> ServingEpoch:
    """``prepared -> verified | rejected`` after fresh-reading and byte-comparing every owner.

    Reads the Catalog bindings and every pack generation, the configuration
    generation and every credential generation again, rebuilds the preimage
    under the candidate's own profile and compares bytes, digest and reader
    index. A verified or active epoch is returned unchanged.

    Raises:
        InvalidIdentity: ``epoch_id`` is an id of another model (before SQL).
        EpochVerificationFailed: the candidate was (or already is) rejected.
        EpochVerificationDeferred: an owner was unavailable; it stays ``prepared``.

    Seed 003 "State machines" (ServingEpoch); proofs S003-RP-01, S003-RP-02.
    """
    from nexusflow.kernel.ids import require_id

    epoch_id = require_id(epoch_id, ServingEpoch, field="epoch_id")
    epoch = ServingEpoch.objects.get(org_id=org.org_id, pk=epoch_id)
    if epoch.state in ("verified", "active"):
        return epoch
    if epoch.state != "prepared":
        raise EpochVerificationFailed(f"epoch {epoch.pk} is {epoch.state}")
    try:
        problems = epoch_problems(org=org, epoch=epoch)
    except OwnerUnavailable as exc:
        raise EpochVerificationDeferred(str(exc)) from exc
    with transaction.atomic(durable=True):
        locked = ServingEpochStore.lock(org.org_id, epoch.pk)
        if locked.state != "prepared" or locked.version != epoch.version:
            raise EpochVerificationDeferred(f"epoch {epoch.pk} changed during verification; verify again")
        target = "rejected" if problems else "verified"
        ServingEpochStore.transition(org_id=org.org_id, pk=locked.pk, src="prepared", dst=target,
                                     version=locked.version,
                                     set_fields={"reason_code": reasons.EPOCH_OWNER_MISMATCH if problems else ""})
    if problems:
        raise EpochVerificationFailed("; ".join(problems))
    return ServingEpoch.objects.get(org_id=org.org_id, pk=epoch.pk)


def epoch_recheck_for_activation(*, org: OrgScope, epoch: ServingEpoch) -> None:
    """Reread the owners of a ``verified`` epoch right before activation; reject it on a mismatch.

    Raises:
        EpochVerificationFailed: an authoritative mismatch (the epoch moved
            ``verified -> rejected``).
        EpochVerificationDeferred: an owner was unavailable (it stays ``verified``).

    Seed 003 "State machines": ``verified`` is evidence at one point in time.
    """
    try:
        problems = epoch_problems(org=org, epoch=epoch)
    except OwnerUnavailable as exc:
        raise EpochVerificationDeferred(str(exc)) from exc
    if not problems:
        return
    with transaction.atomic(durable=True):
        locked = ServingEpochStore.lock(org.org_id, epoch.pk)
        if locked.state == "verified":
            ServingEpochStore.transition(org_id=org.org_id, pk=locked.pk, src="verified", dst="rejected",
                                         version=locked.version,
                                         set_fields={"reason_code": reasons.EPOCH_OWNER_MISMATCH})
    raise EpochVerificationFailed("; ".join(problems))
