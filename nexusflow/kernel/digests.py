"""Profiled digests (seed 003 "Identity rules", the digest-state table).

A digest is only meaningful together with the closed profile that produced
it. ``nexuscrm.connector-digest-profile.v2`` is the only authoring profile:

- domain separator: the caller's domain, framed, then the profile id, framed;
- fields: in the caller's fixed order, each as ``frame(name) || value``;
- values: ``0x00`` null; ``0x01`` text = u32 big-endian byte length + UTF-8;
  ``0x02`` bytes = u32 length + raw bytes; ``0x03`` integer = 8-byte signed
  big-endian; ``0x04`` boolean = one byte;
- algorithm: SHA-256, rendered as 64 lowercase hex characters.

``...v1`` is read-only: it can be named by stored rows but never authors.
Legacy unprofiled digests (empty profile id) never verify.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from .errors import DigestProfileError

PROFILE_V2 = "nexuscrm.connector-digest-profile.v2"
PROFILE_V1 = "nexuscrm.connector-digest-profile.v1"

FieldValue = str | bytes | int | bool | None


@dataclass(frozen=True, slots=True)
class DigestProfile:
    profile_id: str
    authoring: bool


PROFILES: dict[str, DigestProfile] = {
    PROFILE_V2: DigestProfile(PROFILE_V2, authoring=True),
    PROFILE_V1: DigestProfile(PROFILE_V1, authoring=False),
}


@dataclass(frozen=True, slots=True)
class ProfiledDigest:
    """A digest and the exact profile id it was computed under."""

    profile_id: str
    hexdigest: str


def _frame(data: bytes) -> bytes:
    if len(data) > 0xFFFFFFFF:
        raise DigestProfileError("field longer than 2**32-1 bytes")
    return struct.pack(">I", len(data)) + data


def _encode_value(value: FieldValue) -> bytes:
    if value is None:
        return b"\x00"
    if isinstance(value, bool):
        return b"\x04" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x03" + struct.pack(">q", value)
    if isinstance(value, str):
        return b"\x01" + _frame(value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"\x02" + _frame(bytes(value))
    raise DigestProfileError(f"unsupported digest value type {type(value).__name__}")


def encode_v2(domain: str, fields: Sequence[tuple[str, FieldValue]]) -> bytes:
    """Return the exact pre-image bytes of a v2 digest (for test vectors)."""
    if not domain:
        raise DigestProfileError("empty domain separator")
    parts = [_frame(domain.encode("utf-8")), _frame(PROFILE_V2.encode("utf-8"))]
    for name, value in fields:
        parts.append(_frame(name.encode("utf-8")))
        parts.append(_encode_value(value))
    return b"".join(parts)


def digest_v2(domain: str, fields: Sequence[tuple[str, FieldValue]]) -> ProfiledDigest:
    """Author a digest under the v2 profile.

    Args:
        domain: domain separator naming what is digested, e.g. ``"receipt.payload"``.
        fields: ordered ``(name, value)`` pairs; values are text, bytes, int,
            bool or ``None``.

    Returns:
        ``ProfiledDigest(profile_id=PROFILE_V2, hexdigest=<64 hex chars>)``.

    Raises:
        DigestProfileError: empty domain or an unsupported value type.
    """
    return ProfiledDigest(PROFILE_V2, hashlib.sha256(encode_v2(domain, fields)).hexdigest())


def author(profile_id: str, domain: str, fields: Sequence[tuple[str, FieldValue]]) -> ProfiledDigest:
    """Author under ``profile_id``; only the v2 profile may author.

    Raises:
        DigestProfileError: empty, unknown or read-only profile id.
    """
    profile = resolve(profile_id)
    if not profile.authoring:
        raise DigestProfileError(f"profile {profile_id} is read-only")
    return digest_v2(domain, fields)


def resolve(profile_id: str) -> DigestProfile:
    """Return the closed profile named exactly by ``profile_id``.

    Raises:
        DigestProfileError: empty (legacy unprofiled) or unknown id.
    """
    if not profile_id:
        raise DigestProfileError("empty profile id is not an alias for any profile")
    try:
        return PROFILES[profile_id]
    except KeyError:
        raise DigestProfileError(f"unknown digest profile {profile_id!r}") from None


def verify(stored: ProfiledDigest, domain: str, fields: Sequence[tuple[str, FieldValue]]) -> bool:
    """Recompute ``stored`` under its own profile and compare in constant time.

    Only v2 digests can be recomputed here; v1 rows are read by their own
    reader and legacy rows never verify.

    Raises:
        DigestProfileError: empty, unknown or v1 profile.
    """
    profile = resolve(stored.profile_id)
    if profile.profile_id != PROFILE_V2:
        raise DigestProfileError(f"profile {profile.profile_id} has no v2 recomputation")
    return hmac.compare_digest(digest_v2(domain, fields).hexdigest, stored.hexdigest)


def digest_json_v2(domain: str, canonical_json: bytes) -> ProfiledDigest:
    """Digest opaque canonical JSON bytes as a single ``payload`` field."""
    return digest_v2(domain, [("payload", canonical_json)])


def iter_fields(mapping: dict[str, FieldValue], order: Iterable[str]) -> list[tuple[str, FieldValue]]:
    """Return ``mapping`` as ordered pairs, requiring every name in ``order``."""
    return [(name, mapping[name]) for name in order]
