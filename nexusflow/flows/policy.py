"""Runtime policy numbers for the Flow executor (seed 004 sections 12.3, 12.4 and 14.4).

Each value is read from Django settings first, then the environment, then the
default, at call time, so an operator (or a test) can shorten leases without
a code change:

- ``NEXUS_FLOW_LEASE_SECONDS`` (default 60): step lease length;
- ``NEXUS_FLOW_RETRY_BASE_SECONDS`` (default 2): first retry / recovery floor;
- ``NEXUS_FLOW_MAX_ATTEMPTS`` (default 5): attempts before a terminal failure;

the last two are the built-in defaults of the versioned runtime policy (:mod:`runtime_outbox.policy`),
whose published generations (environment, org, plan) win over them;
- ``NEXUS_FLOW_DEPENDENCY_DEADLINE_SECONDS`` (default 7 days).
"""
from __future__ import annotations

import functools
import hashlib

from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.tuning import setting_number

RETRY_CAP_SECONDS = 300.0
CLAIM_BATCH = 10
#: Steps a ``flow.step`` round claims by default (:func:`claim_batch`).
CLAIM_BATCH_DEFAULT = 8
JITTER_FRACTION = 0.1




def schedule_batch() -> int:
    """Records one ``flow.schedule`` admission transaction reads (``NEXUS_FLOW_SCHEDULE_BATCH``, 1 to 1000,
    default 200): a schedule occurrence admits its runs in transactions of at most this many records."""
    return max(1, min(1000, int(setting_number("NEXUS_FLOW_SCHEDULE_BATCH", 200))))


def claim_batch() -> int:
    """Steps one ``flow.step`` round claims in one transaction and then runs (``NEXUS_FLOW_CLAIM_BATCH``, 1 to
    :data:`CLAIM_BATCH`, default :data:`CLAIM_BATCH_DEFAULT`)."""
    return max(1, min(CLAIM_BATCH, int(setting_number("NEXUS_FLOW_CLAIM_BATCH", CLAIM_BATCH_DEFAULT))))


def lease_seconds() -> float:
    return setting_number("NEXUS_FLOW_LEASE_SECONDS", 60.0)


def retry_base_seconds(org_id: str | None = None) -> float:
    """The first retry's delay of ``org_id``'s steps (seconds): its runtime policy (``retries``), else
    ``NEXUS_FLOW_RETRY_BASE_SECONDS`` (default 2)."""
    from runtime_outbox.policy import runtime_policy

    return runtime_policy(org_id).retry_base_seconds


@functools.lru_cache(maxsize=4096)
def _plan_flow_name(org_id: str, plan_id: int) -> str:
    from .models import FlowExecutionPlan

    return (FlowExecutionPlan.objects.filter(org_id=org_id, pk=plan_id).values_list("flow_api_name", flat=True)
            .first() or "")


#: Recursive saves one logical save may cause (docs/operations.md "Flows that save their own records").
#: A save that a Flow run's own record write makes is a recursive save of the
#: logical save that started that run: the runs it admits are one level deeper.
#: Runs at depths 1..RECURSIVE_SAVE_LIMIT run as usual; a run one level past the
#: bound is admitted and ends ``TerminalFailed`` / ``flow_recursion_limit``
#: before its first element, so it writes nothing and starts no further run.
RECURSIVE_SAVE_LIMIT = 5


def max_attempts(org_id: str | None = None, plan_id: int | None = None) -> int:
    """Attempts a step of plan ``plan_id`` of ``org_id`` gets before its run fails ``retry_exhausted``: the
    runtime policy's bound for the plan's flow, else the org's, else ``NEXUS_FLOW_MAX_ATTEMPTS`` (default 5)
    (:mod:`runtime_outbox.policy`)."""
    from runtime_outbox.policy import runtime_policy

    return runtime_policy(org_id).max_attempts(_plan_flow_name(org_id, int(plan_id)) if org_id and plan_id else None)


def dependency_deadline_seconds() -> float:
    return setting_number("NEXUS_FLOW_DEPENDENCY_DEADLINE_SECONDS", 7 * 24 * 3600.0)


def max_wait_age_seconds() -> float:
    """Seconds a producer wait with no AlarmEvent may wait before its expiry policy applies (seed 004 14.4)."""
    return setting_number("NEXUS_FLOW_MAX_WAIT_AGE_SECONDS", 30 * 24 * 3600.0)


def retry_policy_digest(org_id: str | None = None, plan_id: int | None = None) -> str:
    """Digest of the retry policy selected at claim (immutable on the attempt)."""
    from runtime_outbox.policy import runtime_policy

    policy = runtime_policy(org_id)
    return digest_v2("flows.retry-policy", [
        ("base_ms", int(policy.retry_base_seconds * 1000)),
        ("cap_ms", int(RETRY_CAP_SECONDS * 1000)),
        ("max_attempts", policy.max_attempts(_plan_flow_name(org_id, int(plan_id)) if org_id and plan_id else None)),
        ("jitter_permille", int(JITTER_FRACTION * 1000)),
    ]).hexdigest


def recovery_backoff_floor_ms(*, step_id: int, attempt_number: int, org_id: str | None = None,
                              base_seconds: float | None = None) -> int:
    """Deterministic jittered backoff floor for one attempt (seed 004 section 12.1 step 5).

    ``base * 2**(n-1)``, capped, plus up to 10 % jitter derived from the step
    id and attempt number, never below the ordinary retry floor. ``base_seconds`` is
    :func:`retry_base_seconds` of ``org_id`` when the caller read it already.
    """
    base = (retry_base_seconds(org_id) if base_seconds is None else base_seconds) * 1000.0
    floor = min(base * (2 ** max(attempt_number - 1, 0)), RETRY_CAP_SECONDS * 1000.0)
    seed = hashlib.sha256(f"{step_id}:{attempt_number}".encode()).digest()
    jitter = int.from_bytes(seed[:4], "big") / 0xFFFFFFFF * JITTER_FRACTION
    return int(floor * (1.0 + jitter))
