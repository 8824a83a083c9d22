"""Typed errors raised by kernel mechanisms.

Every error carries a stable ``code`` so APIs and commands can report it
without parsing messages.
"""
from __future__ import annotations


class NexusError(Exception):
    """Base class: ``code`` is stable and safe to show to callers."""

    code = "nexus_error"
    #: True when retrying the same input can never succeed (a definite refusal).
    definite = False
    #: True for a definite refusal that is the expected, recorded outcome of valid input: there was
    #: nothing to do (e.g. a push whose mapping produces no body). A Flow step ending on one takes the
    #: ``benign`` reason ``flow_step_expected_refusal`` instead of ``flow_step_definite_refusal``.
    expected_outcome = False

    def __init__(self, message: str = "", *, code: str | None = None):
        super().__init__(message or self.code)
        if code:
            self.code = code


class InvalidIdentity(NexusError):
    """A key or locator failed canonical validation (seed 003 "Identity rules")."""

    code = "invalid_identity"


class IllegalTransition(NexusError):
    """A state change is not in the authority's transition table."""

    code = "illegal_transition"


class ReasonRequired(IllegalTransition):
    """A halted, quarantined or refused state entered without its reason code."""

    code = "reason_required"


class StaleVersion(NexusError):
    """A compare-and-swap matched no row: state, version or fence moved."""

    code = "stale_version"


class FenceRejected(StaleVersion):
    """A fenced write lost: the gate, epoch, lease or holder fence is not current."""

    code = "fence_rejected"


class MultipleRowsUpdated(NexusError):
    """A compare-and-swap matched more than one row; the schema is broken."""

    code = "cas_multiple_rows"


class ImmutableRow(NexusError):
    """``save()``/``delete()`` was called on a row that only a store may write."""

    code = "immutable_row"


class DigestProfileError(NexusError):
    """A digest names an unknown, read-only or empty profile."""

    code = "digest_profile_invalid"


class LockOrderViolation(NexusError):
    """A transaction acquired a lock class lower than one it already holds."""

    code = "lock_order_violation"


class RetryableConflict(NexusError):
    """A ``FOR UPDATE NOWAIT`` read met a lock: retry later (HTTP 409)."""

    code = "retryable_conflict"
