"""Typed errors raised by kernel mechanisms.

Every error carries a stable ``code`` so APIs and commands can report it
without parsing messages, and the HTTP answer the REST API gives for it
(``http_status``, ``retry_after``): one exception handler
(:func:`nexusflow.api_errors.exception_handler`) turns any of them into
``{"error": code, "detail": message}``, so a view raises and never maps.
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
    #: HTTP status of the REST answer: 409 unless the class says otherwise (a refusal given the current
    #: state; 400 for bad input, 404 for a missing target, 503 for "not now").
    http_status = 409
    #: Seconds a caller waits before retrying (the ``Retry-After`` header), or ``None`` for no header.
    retry_after: int | None = None

    def __init__(self, message: str = "", *, code: str | None = None, http_status: int | None = None,
                 retry_after: int | None = None):
        """Carry ``message`` (the code when empty).

        Args:
            code, http_status, retry_after: this instance's answer instead of the class's (``retry_after`` in
                seconds), e.g. where one view answers a refusal differently from the class.
        """
        super().__init__(message or self.code)
        if code:
            self.code = code
        if http_status is not None:
            self.http_status = http_status
        if retry_after is not None:
            self.retry_after = retry_after


class InvalidIdentity(NexusError):
    """A key or locator failed canonical validation (seed 003 "Identity rules")."""

    code = "invalid_identity"
    http_status = 400


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
    """A ``FOR UPDATE NOWAIT`` read met a lock: retry later (HTTP 409 + ``Retry-After``)."""

    code = "retryable_conflict"
    #: The lock is held by a committing transaction: it is released within seconds.
    retry_after = 2
