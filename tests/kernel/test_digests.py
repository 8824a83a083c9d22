"""Digest profile v2: published test vectors plus an independent re-encoding."""
import hashlib
import json
import struct
from pathlib import Path

import pytest

from nexusflow.kernel.digests import (
    PROFILE_V1,
    PROFILE_V2,
    ProfiledDigest,
    author,
    digest_v2,
    resolve,
    verify,
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
    with pytest.raises(DigestProfileError):
        verify(ProfiledDigest(PROFILE_V1, stored.hexdigest), "d", [("a", 1)])
