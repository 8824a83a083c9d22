"""Canonical identity validation (seed 003 "Identity rules").

Keys and locators are validated before insert and then compared
byte-for-byte: no TRIM, no case folding, no fallback normalization. Identity
columns use ``utf8mb4_bin`` collation (see :class:`IdentityField`).
"""
from __future__ import annotations

import unicodedata

from django.db import models

from .errors import InvalidIdentity

DEFAULT_MAX_LENGTH = 255


def validate_key(value: object, *, field: str = "key", max_length: int = DEFAULT_MAX_LENGTH) -> str:
    """Return ``value`` unchanged when it is a canonical key, else raise.

    Args:
        value: the candidate key; ``str`` or UTF-8 ``bytes``.
        field: name used in the error message.
        max_length: maximum length in characters.

    Raises:
        InvalidIdentity: ``None``, empty, surrounding whitespace, NUL or other
            control characters, invalid UTF-8, non-NFC text, or over-length.
    """
    if value is None:
        raise InvalidIdentity(f"{field}: null is not a key")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidIdentity(f"{field}: invalid UTF-8") from exc
    if not isinstance(value, str):
        raise InvalidIdentity(f"{field}: expected text, got {type(value).__name__}")
    if value == "":
        raise InvalidIdentity(f"{field}: empty")
    if value != value.strip():
        raise InvalidIdentity(f"{field}: surrounding whitespace")
    if len(value) > max_length:
        raise InvalidIdentity(f"{field}: longer than {max_length} characters")
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs") or ch in ("\u2028", "\u2029"):
            raise InvalidIdentity(f"{field}: control character U+{ord(ch):04X}")
    if unicodedata.normalize("NFC", value) != value:
        raise InvalidIdentity(f"{field}: not in Unicode NFC form")
    return value


def canonical_locator(value: object, *, field: str = "locator", max_length: int = DEFAULT_MAX_LENGTH) -> str:
    """Render an external locator (int or text) as its canonical key.

    Integers become their decimal form; text must already be canonical.

    Raises:
        InvalidIdentity: booleans, floats, integers outside the signed/unsigned
            64-bit range, or a text value failing :func:`validate_key`.
    """
    if isinstance(value, bool) or isinstance(value, float):
        raise InvalidIdentity(f"{field}: {type(value).__name__} is not a locator")
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise InvalidIdentity(f"{field}: integer outside the 64-bit range")
        return str(value)
    return validate_key(value, field=field, max_length=max_length)


class IdentityField(models.CharField):
    """A ``VARCHAR`` with binary collation for byte-exact identity columns."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("max_length", DEFAULT_MAX_LENGTH)
        kwargs.setdefault("db_collation", "utf8mb4_bin")
        super().__init__(*args, **kwargs)
