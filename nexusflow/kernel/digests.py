"""Profiled digests (seed 003 "Identity rules", the digest-state table).

A digest is only meaningful together with the closed profile that produced
it. The registry is closed; each profile has exactly one reader and a stored
digest is only ever read by the reader its own profile id names:

``nexuscrm.connector-digest-profile.v2`` (authors; exact V2 reader):

- domain separator: the caller's domain, framed, then the profile id, framed;
- fields: in the caller's fixed order, each as ``frame(name) || value``;
- values: ``0x00`` null; ``0x01`` text = u32 big-endian byte length + UTF-8;
  ``0x02`` bytes = u32 length + raw bytes; ``0x03`` integer = 8-byte signed
  big-endian; ``0x04`` boolean = one byte;
- normalization: none; values are digested exactly as given (identity values
  are validated canonical before they get here), owner receipts as opaque bytes;
- algorithm: SHA-256, rendered as 64 lowercase hex characters.

``nexuscrm.connector-digest-profile.v1`` (read-only; exact V1 reader): the
retired recipe ``SHA-256(utf8(domain) || 0x0A || compact sorted-key JSON of
the fields as an object)``. It is kept byte-stable so stored V1 rows can be
checked by their own recipe; it never authors, is never relabeled and is never
compared with V2 bytes.

Legacy unprofiled rows (empty profile id) are inert: no reader exists, they
never verify and are replaced rather than assigned an inferred profile. An
empty profile id is not an alias of anything; no profile is inferred from
digest shape.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import DigestProfileError

PROFILE_V2 = "nexuscrm.connector-digest-profile.v2"
PROFILE_V1 = "nexuscrm.connector-digest-profile.v1"

FieldValue = str | bytes | int | bool | None


@dataclass(frozen=True, slots=True)
class DigestProfile:
    """What a closed profile fixes (seed 003 "Identity rules")."""

    profile_id: str
    authoring: bool
    domain_separator: str
    field_order: str
    integer_encoding: str
    text_encoding: str
    bytes_encoding: str
    null_encoding: str
    normalization: str
    algorithm: str = "sha256"


PROFILES: dict[str, DigestProfile] = {
    PROFILE_V2: DigestProfile(
        PROFILE_V2, authoring=True,
        domain_separator="frame(utf8(domain)) || frame(utf8(profile_id))",
        field_order="caller-fixed order; each field frame(utf8(name)) || tagged value",
        integer_encoding="0x03 || int64 big-endian (signed)",
        text_encoding="0x01 || u32be(len) || utf8",
        bytes_encoding="0x02 || u32be(len) || raw bytes",
        null_encoding="0x00",
        normalization="none",
    ),
    PROFILE_V1: DigestProfile(
        PROFILE_V1, authoring=False,
        domain_separator="utf8(domain) || 0x0A",
        field_order="JSON object keys sorted by code point",
        integer_encoding="JSON number",
        text_encoding="JSON string (UTF-8, not escaped)",
        bytes_encoding="JSON string of lowercase hex",
        null_encoding="JSON null",
        normalization="none",
    ),
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
        if not -(1 << 63) <= value < (1 << 63):
            raise DigestProfileError("integer outside the signed 64-bit range")
        return b"\x03" + struct.pack(">q", value)
    if isinstance(value, str):
        return b"\x01" + _frame(value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"\x02" + _frame(bytes(value))
    if isinstance(value, OwnerReceipt):
        raise DigestProfileError("an owner receipt goes in as its fields(), bytes and owner digest")
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


def verify_v2(stored: ProfiledDigest, domain: str, fields: Sequence[tuple[str, FieldValue]]) -> bool:
    """The exact V2 reader: recompute under V2 and compare in constant time.

    Raises:
        DigestProfileError: ``stored`` names any profile other than V2 (a V1
            row, a legacy unprofiled row, an unknown id).
    """
    if stored.profile_id != PROFILE_V2:
        raise DigestProfileError(f"the V2 reader refuses a {stored.profile_id or 'legacy unprofiled'} digest")
    return _same_hex(digest_v2(domain, fields).hexdigest, stored.hexdigest)


def _same_hex(computed: str, stored: str) -> bool:
    """Constant-time comparison; a stored value that is not ASCII hex simply does not match."""
    if not isinstance(stored, str) or not stored.isascii():
        return False
    return hmac.compare_digest(computed, stored)


def _v1_value(value: FieldValue):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if value is None or isinstance(value, (str, int, bool)):
        return value
    raise DigestProfileError(f"unsupported digest value type {type(value).__name__}")


def encode_v1(domain: str, fields: Sequence[tuple[str, FieldValue]]) -> bytes:
    """Return the exact pre-image bytes of the retired V1 recipe (read path only)."""
    import json

    if not domain:
        raise DigestProfileError("empty domain separator")
    body = json.dumps({name: _v1_value(value) for name, value in fields}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)
    return domain.encode("utf-8") + b"\n" + body.encode("utf-8")


def verify_v1(stored: ProfiledDigest, domain: str, fields: Sequence[tuple[str, FieldValue]]) -> bool:
    """The exact V1 reader: check a retained V1 digest by the V1 recipe only.

    Raises:
        DigestProfileError: ``stored`` names any profile other than V1.
    """
    if stored.profile_id != PROFILE_V1:
        raise DigestProfileError(f"the V1 reader refuses a {stored.profile_id or 'legacy unprofiled'} digest")
    return _same_hex(hashlib.sha256(encode_v1(domain, fields)).hexdigest(), stored.hexdigest)


READERS = {PROFILE_V2: verify_v2, PROFILE_V1: verify_v1}


def verify(stored: ProfiledDigest, domain: str, fields: Sequence[tuple[str, FieldValue]]) -> bool:
    """Check ``stored`` with the one reader its own profile id names.

    Never recomputes under another profile and never compares across profiles.

    Raises:
        DigestProfileError: empty (legacy unprofiled: inert, never verifies)
            or unknown profile id.
    """
    return READERS[resolve(stored.profile_id).profile_id](stored, domain, fields)


def is_inert(profile_id: str) -> bool:
    """True for a legacy unprofiled row (empty profile id): it can never verify."""
    return profile_id == ""


@dataclass(frozen=True, slots=True)
class OwnerReceipt:
    """An external owner's receipt: opaque bytes plus the owner's own digest.

    The bytes are copied on construction (a caller's buffer can change later)
    and are never parsed, re-encoded or recanonicalized; the digest is the
    owner's, stored as given, never recomputed by the connector (seed 003,
    "The V2 ServingEpoch preimage has one closed nested order").

    Raises:
        DigestProfileError: ``receipt`` is text or another non-bytes value, or
            ``owner_digest`` is empty.
    """

    owner: str
    receipt: bytes
    owner_digest: str

    def __init__(self, owner: str, receipt: bytes | bytearray | memoryview, owner_digest: str):
        if not isinstance(receipt, (bytes, bytearray, memoryview)):
            raise DigestProfileError(f"owner receipt must be bytes, not {type(receipt).__name__}")
        if not owner_digest:
            raise DigestProfileError("owner receipt without the owner's digest")
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "receipt", bytes(receipt))
        object.__setattr__(self, "owner_digest", owner_digest)

    def fields(self, prefix: str) -> list[tuple[str, FieldValue]]:
        """``[(prefix.receipt, bytes), (prefix.receipt_digest, text)]`` for a preimage."""
        return [(f"{prefix}.receipt", self.receipt), (f"{prefix}.receipt_digest", self.owner_digest)]


@dataclass(frozen=True, slots=True)
class DigestSchema:
    """A named digest with a closed, ordered field list.

    ``schema.digest(values)`` fixes field order once for every caller: a
    missing or extra field is an error, never silently skipped.
    """

    domain: str
    field_names: tuple[str, ...]

    def digest(self, values: dict[str, FieldValue]) -> ProfiledDigest:
        """Author the V2 digest of ``values`` in the schema's order.

        Raises:
            DigestProfileError: a field is missing or not in the schema.
        """
        missing = [n for n in self.field_names if n not in values]
        extra = sorted(set(values) - set(self.field_names))
        if missing or extra:
            raise DigestProfileError(f"{self.domain}: missing fields {missing}, unexpected fields {extra}")
        return digest_v2(self.domain, [(name, values[name]) for name in self.field_names])


def digest_json_v2(domain: str, canonical_json: bytes) -> ProfiledDigest:
    """Digest opaque canonical JSON bytes as a single ``payload`` field."""
    return digest_v2(domain, [("payload", canonical_json)])


def iter_fields(mapping: dict[str, FieldValue], order: Iterable[str]) -> list[tuple[str, FieldValue]]:
    """Return ``mapping`` as ordered pairs, requiring every name in ``order``."""
    return [(name, mapping[name]) for name in order]
