"""Ordering contracts: the closed generic shape L0 interprets (seed 003 "Durable source ordering").

A pack route freezes one ``OrderingContract`` in its ServingEpoch::

    {"contract": "latest_source_position", "partition": [field, ...], "position": [int field, ...],
     "tie_breaker": field, "comparator_version": "1", "settle_seconds": 0}
    {"contract": "strict_source_sequence", "partition": [...], "position": [int field],
     "tie_breaker": field, "comparator_version": "1",
     "successor": {"first": 1, "step": 1},
     "gap": {"deadline_seconds": 300, "disposition": "quarantine" | "skip"}}
    {"contract": "order_independent", "conformance": "<why the route's operations commute>"}

SourcePosition bytes are the position fields as fixed-width big-endian
offsets (8 bytes each, so byte order equals numeric order), then ``0x00``
and the SourceEventKey, which closes the order deterministically.
"""
from __future__ import annotations

import struct
from typing import Any

CONTRACTS = ("latest_source_position", "strict_source_sequence", "order_independent")
GAP_DISPOSITIONS = ("quarantine", "skip")
_OFFSET = 1 << 63


class OrderingContractError(ValueError):
    """A route's ordering object is not one of the closed shapes above."""


def _int(value: Any, name: str, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise OrderingContractError(f"{name} must be an integer >= {minimum}")
    return value


def _fields(value: Any, name: str, *, allow_empty: bool) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(f, str) and f for f in value):
        raise OrderingContractError(f"{name} must be a list of field names")
    if not value and not allow_empty:
        raise OrderingContractError(f"{name} must name at least one field")
    return value


def validate_contract(ordering: Any) -> dict:
    """Check one route ``ordering`` object against the closed shapes.

    Returns:
        the same dict.

    Raises:
        OrderingContractError: unknown contract, missing or ill-typed facts.
    """
    if not isinstance(ordering, dict):
        raise OrderingContractError("ordering must be an object")
    contract = ordering.get("contract")
    if contract not in CONTRACTS:
        raise OrderingContractError(f"unsupported ordering contract {contract!r}; expected one of {', '.join(CONTRACTS)}")
    if contract == "order_independent":
        if not isinstance(ordering.get("conformance"), str) or not ordering["conformance"].strip():
            raise OrderingContractError("order_independent needs a conformance statement")
        _fields(ordering.get("partition", []), "partition", allow_empty=True)
        _fields(ordering.get("position", []), "position", allow_empty=True)
        return ordering
    _fields(ordering.get("partition"), "partition", allow_empty=True)
    position = _fields(ordering.get("position"), "position", allow_empty=False)
    if not isinstance(ordering.get("tie_breaker"), str) or not isinstance(ordering.get("comparator_version"), str):
        raise OrderingContractError("tie_breaker and comparator_version are required")
    if contract == "latest_source_position":
        _int(ordering.get("settle_seconds", 0), "settle_seconds", minimum=0)
        return ordering
    if len(position) != 1:
        raise OrderingContractError("strict_source_sequence orders by exactly one integer position field")
    successor = ordering.get("successor")
    if not isinstance(successor, dict):
        raise OrderingContractError("strict_source_sequence needs a successor rule {first, step}")
    _int(successor.get("first"), "successor.first", minimum=-(1 << 62))
    _int(successor.get("step"), "successor.step", minimum=1)
    gap = ordering.get("gap")
    if not isinstance(gap, dict):
        raise OrderingContractError("strict_source_sequence needs a gap rule {deadline_seconds, disposition}")
    _int(gap.get("deadline_seconds"), "gap.deadline_seconds", minimum=1)
    if gap.get("disposition") not in GAP_DISPOSITIONS:
        raise OrderingContractError(f"gap.disposition must be one of {', '.join(GAP_DISPOSITIONS)}")
    return ordering


def encode_position(values: list[int], source_event_key: str) -> bytes:
    """SourcePosition bytes: fixed-width big-endian offsets, ``0x00``, the SourceEventKey."""
    return b"".join(struct.pack(">Q", v + _OFFSET) for v in values) + b"\x00" + source_event_key.encode("utf-8")


def sequence_of(position: bytes | memoryview | None) -> int | None:
    """The first position field of SourcePosition bytes (the strict sequence number)."""
    if position is None:
        return None
    return struct.unpack(">Q", bytes(position)[:8])[0] - _OFFSET


def sequence_floor(sequence: int) -> bytes:
    """The lowest SourcePosition bytes with this sequence number (a dependency's required position).

    A sequence below the 64-bit range (the predecessor of the lowest possible
    position) clamps to the lowest encodable bytes: no source position
    precedes it, so only the gap deadline can resolve such a dependency.
    """
    return struct.pack(">Q", max(sequence + _OFFSET, 0))


def expected_successor(ordering: dict, high_water: bytes | None) -> int:
    """The exact next sequence number under ``strict_source_sequence``."""
    successor = ordering["successor"]
    current = sequence_of(high_water)
    return successor["first"] if current is None else current + successor["step"]
