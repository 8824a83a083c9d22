"""Normalized values and condition logic of the Flow document (seed 004 section 7.2 step 1).

Small pure readers the passes share: a ``<value>`` as ``{"kind", "value"}``,
custom condition logic as an AST, connectors as target names.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from ..frontend import value_of


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _target(conn: Any) -> str | None:
    if isinstance(conn, dict):
        ref = conn.get("targetReference")
        return ref if isinstance(ref, str) and ref else None
    return None


def _bool_text(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    return str(value).strip().lower() == "true"


def normalize_value(value: Any) -> dict[str, Any] | None:
    """A ``<value>`` as ``{"kind", "value"}`` (numbers canonical text); None when absent."""
    kv = value_of(value)
    if kv is None:
        return None
    kind, text = kv
    if kind == "numberValue":
        try:
            text = format(Decimal(str(text)).normalize(), "f")
        except InvalidOperation:
            return {"kind": "invalid", "value": text}
    if kind == "booleanValue":
        text = str(text).strip().lower()
    return {"kind": kind, "value": text}


def parse_logic(text: str, count: int) -> Any:
    """Parse custom condition logic (``"(1 OR 2) AND 3"``) into ``["and"|"or"|"not", ...]`` / index.

    Raises:
        ValueError: syntax error or an index outside ``1..count``.
    """
    tokens = re.findall(r"\(|\)|\d+|[A-Za-z]+|\S", text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos].upper() if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("unexpected end of logic")
        pos += 1
        return tokens[pos - 1].upper()

    def expr(depth: int = 0) -> Any:
        if depth > 32:
            raise ValueError("logic nests too deeply")
        left = term(depth)
        while peek() == "OR":
            take()
            left = ["or", left, term(depth)]
        return left

    def term(depth: int) -> Any:
        left = factor(depth)
        while peek() == "AND":
            take()
            left = ["and", left, factor(depth)]
        return left

    def factor(depth: int) -> Any:
        tok = take()
        if tok == "NOT":
            return ["not", factor(depth + 1)]
        if tok == "(":
            inner = expr(depth + 1)
            if take() != ")":
                raise ValueError("missing ')'")
            return inner
        if tok.isdigit():
            index = int(tok)
            if not 1 <= index <= count:
                raise ValueError(f"condition {index} does not exist")
            return index
        raise ValueError(f"unexpected {tok!r}")

    tree = expr()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return tree


def _normalize_logic(raw: Any, count: int) -> Any:
    """``and``/``or`` stay text; custom logic becomes an AST. Raises ValueError."""
    if raw is None:
        return "and"
    text = str(raw).strip()
    low = text.lower()
    if low in ("and", "or"):
        return low
    if low == "no_conditions":
        return "and"
    return parse_logic(text, count)
