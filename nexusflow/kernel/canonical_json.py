"""Canonical JSON bytes used for payload digests.

Sorted keys, no insignificant whitespace, UTF-8, no NaN. Used only to digest
payloads we author; provider bytes are stored as received.
"""
from __future__ import annotations

import json
from typing import Any


def dumps(value: Any) -> bytes:
    """Return the canonical UTF-8 JSON encoding of ``value``.

    Raises:
        ValueError: NaN or infinity anywhere in ``value``.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
