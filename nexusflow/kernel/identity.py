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

#: Categories that render as nothing or are not characters: control (Cc),
#: format (Cf: zero-width space, BOM, bidi overrides, soft hyphen, word
#: joiner, tags), surrogate (Cs), private use (Co), unassigned and
#: noncharacters (Cn), line and paragraph separators (Zl, Zp).
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
#: Letters that render blank (Hangul fillers, Braille blank, combining grapheme joiner).
_INVISIBLE_LETTERS = frozenset({"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800", "\u034f"})


def validate_key(value: object, *, field: str = "key", max_length: int = DEFAULT_MAX_LENGTH) -> str:
    """Return ``value`` unchanged when it is a canonical key, else raise.

    Args:
        value: the candidate key; ``str`` or UTF-8 ``bytes``.
        field: name used in the error message.
        max_length: maximum length in characters.

    Raises:
        InvalidIdentity: ``None``, empty, surrounding whitespace, NUL or other
            control characters, invisible characters (format, private-use,
            unassigned, separators other than U+0020, blank letters), a
            leading combining mark, invalid UTF-8, non-NFC text, or
            over-length.
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
    if value.isascii() and value.isprintable():
        # U+0020..U+007E only: no control, format or blank character, no combining mark, already NFC.
        return value
    for ch in value:
        category = unicodedata.category(ch)
        if category in _INVISIBLE_CATEGORIES or ch in _INVISIBLE_LETTERS or (category == "Zs" and ch != " "):
            raise InvalidIdentity(f"{field}: invisible or control character U+{ord(ch):04X} ({category})")
    if unicodedata.category(value[0]).startswith("M"):
        raise InvalidIdentity(f"{field}: starts with a combining mark U+{ord(value[0]):04X}")
    if unicodedata.normalize("NFC", value) != value:
        raise InvalidIdentity(f"{field}: not in Unicode NFC form")
    return value


def validate_note(value: object, *, field: str = "reason", max_length: int = 500) -> str:
    """Return an operator's free-text note (a reason) stripped, when it is printable text, else raise.

    Raises:
        InvalidIdentity: not text, blank, longer than ``max_length`` characters, or holding a control
            character other than tab and newline, or a lone surrogate (text that cannot be stored as UTF-8).
    """
    if not isinstance(value, str) or not value.strip() or len(value) > max_length:
        raise InvalidIdentity(f"{field} must be 1..{max_length} characters of printable text")
    if any(unicodedata.category(c) in ("Cc", "Cs") and c not in "\t\n" for c in value):
        raise InvalidIdentity(f"{field} must be 1..{max_length} characters of printable text")
    return value.strip()


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
    """A ``VARCHAR`` with binary collation for byte-exact identity columns.

    ``utf8mb4_bin`` is a PAD SPACE collation on MariaDB and TiDB: ``'k'`` and
    ``'k '`` compare equal. Comparison stays byte-exact because no value with
    surrounding whitespace can reach the column or a lookup: values are
    validated on insert and store writes, and every lookup value is validated
    here (:meth:`get_prep_value`), so ``filter(key="k ")`` raises
    :class:`InvalidIdentity` instead of matching ``"k"``.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("max_length", DEFAULT_MAX_LENGTH)
        kwargs.setdefault("db_collation", "utf8mb4_bin")
        super().__init__(*args, **kwargs)

    def canonical(self, value):
        """Return ``value`` as the column stores it, or raise: the one rule for writes and lookups.

        ``None`` passes where the column is nullable and ``""`` where it may be
        blank; anything else must be a canonical key (bytes become their text).

        Raises:
            InvalidIdentity: see :func:`validate_key`.
        """
        if (value is None and self.null) or (value == "" and self.blank):
            return value
        name = f"{self.model.__name__}.{self.name}" if hasattr(self, "model") else self.name
        return validate_key(value, field=name, max_length=self.max_length)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if value is None else self.canonical(value)
