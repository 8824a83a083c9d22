"""Closed reason codes for halted, quarantined and rejected states.

Each code names its owner, the query an operator runs for evidence, the alert
deadline and the remediation allowed (ARCHITECTURE.md section 6).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import NexusError


@dataclass(frozen=True, slots=True)
class ReasonCode:
    code: str
    owner: str
    evidence: str
    alert_after_seconds: int
    remediation: str


REASONS: dict[str, ReasonCode] = {}


def register(code: str, *, owner: str, evidence: str, alert_after_seconds: int, remediation: str) -> ReasonCode:
    reason = ReasonCode(code, owner, evidence, alert_after_seconds, remediation)
    REASONS[code] = reason
    return reason


def require(code: str) -> str:
    """Return ``code`` if registered.

    Raises:
        NexusError: unknown reason code (code ``unknown_reason_code``).
    """
    if code not in REASONS:
        raise NexusError(f"unknown reason code {code!r}", code="unknown_reason_code")
    return code
