"""Golden vectors of the V2 ServingEpoch preimage and an independent re-encoder (seed 003
"Identity rules": "The V2 ServingEpoch preimage has one closed nested order"; proofs
S003-RP-05, S003-RP-06).

``epoch_preimage_vectors.json`` freezes candidate inputs and their exact
preimage bytes. The re-encoder below is written from the seed's list with
``struct`` only; it shares no code with :mod:`connectors.serving.epoch` or the kernel
digest module, so a change of order, width, framing or tag in either shows up
as a byte difference.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from connectors.serving.epoch import (
    BindingItem,
    CatalogAttestation,
    ConfigProof,
    CredentialProof,
    EpochCandidate,
    EpochCandidateInvalid,
    encode_preimage,
    epoch_digest_of,
)
from nexusflow.kernel.digests import OwnerReceipt

VECTORS = Path(__file__).with_name("epoch_preimage_vectors.json")
PROFILE = "nexuscrm.connector-digest-profile.v2"
DOMAIN = "connectors.serving-epoch"


# --- the independent re-encoder -------------------------------------------------------
def _frame(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _text(value: str) -> bytes:
    return b"\x01" + _frame(value.encode("utf-8"))


def _bytes(value: bytes) -> bytes:
    return b"\x02" + _frame(value)


def _int(value: int) -> bytes:
    return b"\x03" + struct.pack(">q", value)


def _opt_text(value: str | None) -> bytes:
    return b"\x00" if value is None else _text(value)


def _field(name: str, encoded: bytes) -> bytes:
    return _frame(name.encode("utf-8")) + encoded


def reencode(spec: dict) -> bytes:
    """Build the preimage from a vector spec in the seed's order, by hand."""
    out = _frame(DOMAIN.encode()) + _frame(PROFILE.encode())
    # 1. epoch id and ServingScopeDigest
    out += _field("epoch.id", _text(spec["epoch_id"])) + _field("epoch.scope_digest", _text(spec["scope_digest"]))
    # 2. Catalog attestation (the revision tuple appears twice)
    cat = spec["catalog"]
    for name in ("organization", "application_installation", "authorized_workload", "lineage_revision",
                 "source_snapshot_digest", "view_digest", "receipt_protocol"):
        out += _field(f"catalog.{name}", _text(cat[name]))
    out += _field("catalog.revision", _text(cat["lineage_revision"]))
    out += _field("catalog.security_epoch", _int(cat["security_epoch"]))
    out += _field("catalog.capability_version", _text(cat["capability_version"]))
    # 3. Service Configuration proof
    cfg = spec["config"]
    for name in ("generation_protocol", "receipt_protocol", "generation_id", "generation_digest"):
        out += _field(f"config.{name}", _text(cfg[name]))
    out += _field("config.receipt", _bytes(bytes.fromhex(cfg["receipt_hex"])))
    out += _field("config.receipt_digest", _text(cfg["receipt_digest"]))
    # 4. bindings: count, then each item and its owner proof
    out += _field("bindings.count", _int(len(spec["bindings"])))
    for b in spec["bindings"]:
        out += _field("binding.ordinal", _int(b["ordinal"]))
        for name in ("row_id", "identity_digest", "kind", "owner_pack", "pack_installation_id",
                     "pack_payload_digest", "business_key", "definition_version"):
            out += _field(f"binding.{name}", _text(b[name]))
        out += _field("binding.credential_refs", _bytes(b["credential_refs"].encode()))
        out += _field("binding.runtime_command", _opt_text(b["runtime_command"]))
        out += _field("binding.runtime_version", _opt_text(b["runtime_version"]))
        for name in ("pack_generation_id", "definition_envelope_version", "definition_receipt_version",
                     "definition_digest"):
            out += _field(f"proof.{name}", _text(b[name]))
        out += _field("proof.receipt", _bytes(bytes.fromhex(b["receipt_hex"])))
        out += _field("proof.receipt_digest", _text(b["receipt_digest"]))
    # 5. credential generations in ascending byte order of their id
    out += _field("credentials.count", _int(len(spec["credentials"])))
    for n, c in enumerate(sorted(spec["credentials"], key=lambda c: c["generation_id"].encode())):
        out += _field("credential.ordinal", _int(n))
        for name in ("generation_id", "receipt_protocol", "transport_digest"):
            out += _field(f"credential.{name}", _text(c[name]))
        out += _field("credential.receipt", _bytes(bytes.fromhex(c["receipt_hex"])))
        out += _field("credential.receipt_digest", _text(c["receipt_digest"]))
    return out


# --- the production path ------------------------------------------------------------------
def candidate_from(spec: dict) -> EpochCandidate:
    cat, cfg = spec["catalog"], spec["config"]
    credentials = sorted(spec["credentials"], key=lambda c: c["generation_id"].encode())
    return EpochCandidate(
        epoch_id=spec["epoch_id"], scope_digest=spec["scope_digest"],
        catalog=CatalogAttestation(**{k: cat[k] for k in (
            "organization", "application_installation", "authorized_workload", "lineage_revision",
            "source_snapshot_digest", "view_digest", "receipt_protocol", "security_epoch", "capability_version")}),
        config=ConfigProof(cfg["generation_protocol"], cfg["receipt_protocol"], cfg["generation_id"],
                           cfg["generation_digest"],
                           OwnerReceipt("l2", bytes.fromhex(cfg["receipt_hex"]), cfg["receipt_digest"])),
        bindings=tuple(BindingItem(
            ordinal=b["ordinal"], row_id=b["row_id"], identity_digest=b["identity_digest"], kind=b["kind"],
            owner_pack=b["owner_pack"], pack_installation_id=b["pack_installation_id"],
            pack_payload_digest=b["pack_payload_digest"], business_key=b["business_key"],
            definition_version=b["definition_version"], credential_refs=b["credential_refs"].encode(),
            runtime_command=b["runtime_command"], runtime_version=b["runtime_version"],
            pack_generation_id=b["pack_generation_id"], definition_envelope_version=b["definition_envelope_version"],
            definition_receipt_version=b["definition_receipt_version"], definition_digest=b["definition_digest"],
            receipt=OwnerReceipt("pack", bytes.fromhex(b["receipt_hex"]), b["receipt_digest"]))
            for b in spec["bindings"]),
        credentials=tuple(CredentialProof(n, c["generation_id"], c["receipt_protocol"], c["transport_digest"],
                                          OwnerReceipt("cred", bytes.fromhex(c["receipt_hex"]), c["receipt_digest"]))
                          for n, c in enumerate(credentials)),
    )


def _vectors() -> list[dict]:
    return json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]


@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: v["name"])
def test_the_preimage_bytes_match_the_golden_vector_and_the_independent_re_encoder(vector):
    expected = bytes.fromhex(vector["preimage_hex"])
    assert reencode(vector["spec"]) == expected
    produced = encode_preimage(candidate_from(vector["spec"]))
    assert produced == expected
    assert epoch_digest_of(produced) == hashlib.sha256(expected).hexdigest() == vector["digest"]


@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: v["name"])
def test_owner_identities_digests_and_receipts_enter_the_preimage_as_exact_opaque_bytes(vector):
    spec = vector["spec"]
    preimage = encode_preimage(candidate_from(spec))
    # The profile id is framed into the preimage, right after the domain.
    assert preimage.startswith(_frame(DOMAIN.encode()) + _frame(PROFILE.encode()))
    receipts = [spec["config"]] + spec["bindings"] + spec["credentials"]
    for item in receipts:
        # Receipt bytes verbatim (even non-canonical JSON), and the owner's digest as given, never a rehash.
        assert _bytes(bytes.fromhex(item["receipt_hex"])) in preimage
        assert _text(item["receipt_digest"]) in preimage


def test_a_receipt_buffer_changed_after_capture_does_not_change_the_preimage():
    spec = _vectors()[0]["spec"]
    candidate = candidate_from(spec)
    buffer = bytearray(bytes.fromhex(spec["config"]["receipt_hex"]))
    receipt = OwnerReceipt("l2", buffer, spec["config"]["receipt_digest"])
    buffer[:] = b"tampered after capture"
    from dataclasses import replace

    candidate = replace(candidate, config=replace(candidate.config, receipt=receipt))
    assert encode_preimage(candidate) == bytes.fromhex(_vectors()[0]["preimage_hex"])


def test_credential_proofs_out_of_byte_order_duplicated_or_misnumbered_are_refused():
    from dataclasses import replace

    candidate = candidate_from(_vectors()[0]["spec"])
    reversed_order = replace(candidate, credentials=tuple(
        replace(p, ordinal=n) for n, p in enumerate(reversed(candidate.credentials))))
    with pytest.raises(EpochCandidateInvalid):
        encode_preimage(reversed_order)
    duplicated = replace(candidate, credentials=(candidate.credentials[0], replace(candidate.credentials[0], ordinal=1)))
    with pytest.raises(EpochCandidateInvalid):
        encode_preimage(duplicated)
    misnumbered = replace(candidate, bindings=tuple(replace(b, ordinal=b.ordinal + 1) for b in candidate.bindings))
    with pytest.raises(EpochCandidateInvalid):
        encode_preimage(misnumbered)
