"""Digest profiles: published vectors for V2 and V1, independent re-encodings, refusals.

``digest_vectors.json`` is the published contract: another implementation can
check itself against it without reading this code.
"""
import hashlib
import json
import struct
from pathlib import Path

import pytest

from nexusflow.kernel.digests import (
    PROFILE_V1,
    PROFILE_V2,
    PROFILES,
    DigestSchema,
    OwnerReceipt,
    ProfiledDigest,
    author,
    digest_v2,
    is_inert,
    resolve,
    verify,
    verify_v1,
    verify_v2,
)
from nexusflow.kernel.errors import DigestProfileError

VECTORS = json.loads((Path(__file__).parent / "digest_vectors.json").read_text())


def _decode(value):
    if isinstance(value, dict) and "bytes_hex" in value:
        return bytes.fromhex(value["bytes_hex"])
    return value


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_published_vectors(vector):
    fields = [(name, _decode(value)) for name, value in vector["fields"]]
    assert digest_v2(vector["domain"], fields).hexdigest == vector["sha256"]


def _independent(domain, fields):
    def frame(b):
        return struct.pack(">I", len(b)) + b

    out = frame(domain.encode()) + frame(PROFILE_V2.encode())
    for name, value in fields:
        out += frame(name.encode())
        if value is None:
            out += b"\x00"
        elif isinstance(value, bool):
            out += b"\x04" + bytes([value])
        elif isinstance(value, int):
            out += b"\x03" + value.to_bytes(8, "big", signed=True)
        elif isinstance(value, str):
            out += b"\x01" + frame(value.encode())
        else:
            out += b"\x02" + frame(value)
    return hashlib.sha256(out).hexdigest()


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_vectors_match_an_independent_encoder(vector):
    fields = [(name, _decode(value)) for name, value in vector["fields"]]
    assert _independent(vector["domain"], fields) == vector["sha256"]


def test_length_framing_separates_field_boundaries():
    assert digest_v2("d", [("a", "bc")]) != digest_v2("d", [("ab", "c")])
    assert digest_v2("d", [("a", None)]) != digest_v2("d", [("a", "")])
    assert digest_v2("d", [("a", 1)]) != digest_v2("d", [("a", "1")])
    assert digest_v2("d1", [("a", 1)]) != digest_v2("d2", [("a", 1)])


def test_only_v2_authors_and_empty_or_legacy_never_verify():
    assert author(PROFILE_V2, "d", [("a", 1)]) == digest_v2("d", [("a", 1)])
    with pytest.raises(DigestProfileError):
        author(PROFILE_V1, "d", [("a", 1)])
    with pytest.raises(DigestProfileError):
        resolve("")
    stored = digest_v2("d", [("a", 1)])
    assert verify(stored, "d", [("a", 1)])
    assert not verify(stored, "d", [("a", 2)])
    with pytest.raises(DigestProfileError):
        verify(ProfiledDigest("", stored.hexdigest), "d", [("a", 1)])
    # V2 bytes relabeled as V1 are read by the V1 recipe, which does not match them.
    assert not verify(ProfiledDigest(PROFILE_V1, stored.hexdigest), "d", [("a", 1)])
    with pytest.raises(DigestProfileError):
        verify_v2(ProfiledDigest(PROFILE_V1, stored.hexdigest), "d", [("a", 1)])
    with pytest.raises(DigestProfileError):
        resolve("nexuscrm.connector-digest-profile.v3")
    with pytest.raises(DigestProfileError):
        resolve(PROFILE_V2.upper())  # no case folding of profile ids


def _independent_v1(domain, fields):
    body = "{" + ",".join(
        json.dumps(name, ensure_ascii=False) + ":" + json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        for name, value in sorted(fields)) + "}"
    return hashlib.sha256(domain.encode() + b"\n" + body.encode()).hexdigest()


@pytest.mark.parametrize("vector", VECTORS["v1_vectors"], ids=lambda v: v["name"])
def test_v1_vectors_are_read_only_by_the_v1_reader(vector):
    fields = [(name, _decode(value)) for name, value in vector["fields"]]
    hex_fields = [(n, v.hex() if isinstance(v, bytes) else v) for n, v in fields]
    assert _independent_v1(vector["domain"], hex_fields) == vector["sha256"]
    stored = ProfiledDigest(VECTORS["v1_profile_id"], vector["sha256"])
    assert verify_v1(stored, vector["domain"], fields)
    assert verify(stored, vector["domain"], fields)
    with pytest.raises(DigestProfileError):
        verify_v2(stored, vector["domain"], fields)
    with pytest.raises(DigestProfileError):
        author(PROFILE_V1, vector["domain"], fields)
    assert digest_v2(vector["domain"], fields).hexdigest != vector["sha256"]


@pytest.mark.parametrize("case", VECTORS["refusals"], ids=lambda c: c["name"])
def test_published_refusals(case):
    fields = [(name, _decode(value)) for name, value in case["fields"]]
    stored = ProfiledDigest(case["profile_id"], case["sha256"])
    if case["profile_id"] == "":
        assert is_inert(stored.profile_id)
        for reader in (verify, verify_v1, verify_v2):
            with pytest.raises(DigestProfileError):
                reader(stored, case["domain"], fields)
        # Matching V2 bytes do not help: no profile is inferred from digest shape.
        assert digest_v2(case["domain"], fields).hexdigest == case["sha256"]
    elif case["sha256"] == digest_v2(case["domain"], fields).hexdigest:
        assert not verify(stored, case["domain"], fields)
    else:
        with pytest.raises(DigestProfileError):
            verify_v2(stored, case["domain"], fields)
        assert verify_v1(stored, case["domain"], fields)


def test_every_profile_states_what_it_fixes():
    assert set(PROFILES) == {PROFILE_V1, PROFILE_V2}
    assert [p.profile_id for p in PROFILES.values() if p.authoring] == [PROFILE_V2]
    for profile in PROFILES.values():
        assert profile.algorithm == "sha256"
        assert all([profile.domain_separator, profile.field_order, profile.integer_encoding,
                    profile.text_encoding, profile.bytes_encoding, profile.null_encoding, profile.normalization])
    assert VECTORS["profile_id"] == PROFILE_V2 and VECTORS["v1_profile_id"] == PROFILE_V1


def test_owner_receipts_are_copied_and_never_recanonicalized():
    buffer = bytearray(b'{"b": 1,  "a": 2}')  # deliberately non-canonical JSON bytes
    receipt = OwnerReceipt("catalog", buffer, "owner-digest-1")
    buffer[:] = b"tampered"
    assert receipt.receipt == b'{"b": 1,  "a": 2}'
    assert receipt.fields("catalog") == [("catalog.receipt", b'{"b": 1,  "a": 2}'),
                                          ("catalog.receipt_digest", "owner-digest-1")]
    view = memoryview(bytearray(b"abc"))
    assert OwnerReceipt("l2", view, "d").receipt == b"abc"
    with pytest.raises(DigestProfileError):
        OwnerReceipt("catalog", '{"a": 2}', "d")  # text would invite re-encoding
    with pytest.raises(DigestProfileError):
        OwnerReceipt("catalog", b"x", "")
    with pytest.raises(DigestProfileError):
        digest_v2("d", [("receipt", receipt)])
    # The opaque bytes go in exactly: the same receipt in canonical form digests differently.
    canonical = OwnerReceipt("catalog", b'{"a":2,"b":1}', "owner-digest-1")
    assert digest_v2("d", receipt.fields("r")) != digest_v2("d", canonical.fields("r"))


def test_a_schema_fixes_field_order_and_refuses_missing_or_extra_fields():
    schema = DigestSchema("nexus.test", ("account", "channel", "key"))
    values = {"key": "k1", "account": "a", "channel": "webhooks"}
    assert schema.digest(values) == digest_v2("nexus.test", [("account", "a"), ("channel", "webhooks"), ("key", "k1")])
    with pytest.raises(DigestProfileError, match="missing"):
        schema.digest({"account": "a", "channel": "webhooks"})
    with pytest.raises(DigestProfileError, match="unexpected"):
        schema.digest({**values, "extra": 1})


def test_malformed_stored_hex_and_out_of_range_integers_fail_closed():
    assert not verify(ProfiledDigest(PROFILE_V2, "é" * 64), "d", [("a", 1)])
    assert not verify(ProfiledDigest(PROFILE_V1, "é" * 64), "d", [("a", 1)])
    for bad in (1 << 63, -(1 << 63) - 1):
        with pytest.raises(DigestProfileError):
            digest_v2("d", [("a", bad)])
    assert digest_v2("d", [("a", (1 << 63) - 1)]) != digest_v2("d", [("a", -(1 << 63))])
