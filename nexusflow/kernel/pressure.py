"""Database pressure and the admission of new durable mutation work (seed 004 section 16.2).

Workers ask :func:`mutation_admission` before they claim new durable mutation work (a Flow step). Under
pressure the answer is a reason code and the claim round takes nothing: the worker's idle back-off
applies, so overload is never answered with more polling or more connections, while the cold lanes
(dependency wakeups, due waits, effect completions, lease recovery) never ask and keep moving: the
reserved share of section 16.2.

The signals are read from the database itself (:func:`nexusflow.kernel.selectors.database_load`): the
statements this account is running on the database now (lock waits included) and its sessions against
the server's ``max_connections``. The bounds are settings (environment variables of the same name):

- ``NEXUS_PRESSURE_ACTIVE_STATEMENTS`` (default 32): at or above this many running statements, new
  mutation work waits;
- ``NEXUS_PRESSURE_CONNECTION_SHARE`` (default 0.8): at or above this share of ``max_connections`` in
  use, new mutation work waits, well before the server refuses connections;
- ``NEXUS_PRESSURE_READ_SECONDS`` (default 1.0): a process reads the signals at most this often (0: on
  every question);
- ``NEXUS_PRESSURE_LOCK_WAITS`` (default 16): at or above this many transactions of the server waiting
  for a row lock now (``Innodb_row_lock_current_waits``), new mutation work waits: the contention would
  only grow with it;
- ``NEXUS_PRESSURE_EXPIRED_LEASES`` (default 16): at or above this many step leases expired and not yet
  recovered, new Flow step claims wait (judged by the flows app,
  :func:`nexusflow.flows.services.claim.flow_lease_admission`): workers are dying or overrun, and recovery
  (which never asks) catches up first.

These settings are the defaults of the versioned runtime policy (:mod:`runtime_outbox.policy`), whose
published environment generation wins over them.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from .tuning import setting_number

log = logging.getLogger("nexusflow.pressure")

#: Reason codes of a paused admission.
QUEUE_AGE = "queue_age"
PRESSURE_ACTIVE_STATEMENTS = "db_pressure_active_statements"
PRESSURE_CONNECTIONS = "db_pressure_connections"
PRESSURE_LOCK_WAITS = "db_pressure_lock_waits"



@dataclass(frozen=True)
class PressureBounds:
    """The bounds in force: ``active_statements`` (count), ``connection_share`` (0..1], ``read_seconds``,
    ``lock_waits`` (transactions of the server waiting for a row lock now), ``expired_leases`` (step leases
    expired and not yet recovered)."""

    active_statements: int
    connection_share: float
    read_seconds: float
    lock_waits: int = 16
    expired_leases: int = 16


def pressure_bounds() -> PressureBounds:
    """The configured bounds (module docstring), read on every call so a changed setting applies at once.

    Raises:
        ValueError: a bound is not a number, or out of range (active statements below 1, a share outside
            (0, 1], negative read seconds).
    """
    bounds = PressureBounds(active_statements=int(setting_number("NEXUS_PRESSURE_ACTIVE_STATEMENTS", 32)),
                            connection_share=setting_number("NEXUS_PRESSURE_CONNECTION_SHARE", 0.8),
                            read_seconds=setting_number("NEXUS_PRESSURE_READ_SECONDS", 1.0),
                            lock_waits=int(setting_number("NEXUS_PRESSURE_LOCK_WAITS", 16)),
                            expired_leases=int(setting_number("NEXUS_PRESSURE_EXPIRED_LEASES", 16)))
    if (bounds.active_statements < 1 or not 0 < bounds.connection_share <= 1 or bounds.read_seconds < 0
            or bounds.lock_waits < 1 or bounds.expired_leases < 1):
        raise ValueError(f"pressure bounds out of range: {bounds}")
    return bounds


@dataclass(frozen=True)
class PressureReading:
    """One reading: ``connections`` and ``active_statements`` of this account on the database,
    ``max_connections`` of the server (0: unbounded), and ``reason``: the code of the bound reached, or ``""``."""

    connections: int
    active_statements: int
    max_connections: int
    reason: str
    #: Transactions of the whole server waiting for a row lock now (``Innodb_row_lock_current_waits``).
    lock_waits: int = 0

    def as_json(self) -> dict:
        return asdict(self)


def read_pressure(bounds: PressureBounds | None = None, *, status: dict[str, int] | None = None) -> PressureReading:
    """Read the signals now and judge them against ``bounds`` (default :func:`pressure_bounds`).

    ``status``: the server counters already read (:func:`nexusflow.kernel.selectors.database_status`), so a
    caller that has them does not read them again.
    """
    from .selectors import database_load, database_status

    connections, active, max_connections = database_load()
    lock_waits = (status or database_status())["Innodb_row_lock_current_waits"]
    return judge(PressureReading(connections, active, max_connections, "", lock_waits), bounds or pressure_bounds())


def judge(reading: PressureReading, bounds: PressureBounds) -> PressureReading:
    """``reading`` with ``reason`` set to the first bound of ``bounds`` it reaches (``""``: none)."""
    reason = ""
    if reading.active_statements >= bounds.active_statements:
        reason = PRESSURE_ACTIVE_STATEMENTS
    elif reading.max_connections and reading.connections >= bounds.connection_share * reading.max_connections:
        reason = PRESSURE_CONNECTIONS
    elif reading.lock_waits >= bounds.lock_waits:
        reason = PRESSURE_LOCK_WAITS
    return replace(reading, reason=reason)


#: ``key -> (monotonic time, bound, reason)``: this process's last judgement of each admission question.
_JUDGED: dict[object, tuple[float, object, str]] = {}


def cached_judgement(key, *, bound, read_seconds: float, judge: Callable[[], tuple[str, dict]], purpose: str) -> str:
    """The reason code (``""``: admitted) of the admission question ``key`` under ``bound``: ``judge()`` (which
    reads the signal and returns ``(reason, details for the log)``) runs at most every ``read_seconds`` per
    process while the bound is unchanged, and each change between admitted and paused is logged once
    (``"<purpose> admission paused: <reason>"`` / ``"... resumed"``, with the details)."""
    now = time.monotonic()
    last = _JUDGED.get(key)
    if last is not None and last[1] == bound and now - last[0] < read_seconds:
        return last[2]
    reason, details = judge()
    if reason != (last[2] if last is not None else ""):
        (log.warning if reason else log.info)("%s admission %s", purpose,
                                              f"paused: {reason}" if reason else "resumed", extra=details)
    _JUDGED[key] = (now, bound, reason)
    return reason


def _admission(purpose: str, bounds: PressureBounds) -> str:
    """The cached judgement of ``purpose`` under ``bounds`` (:func:`cached_judgement`)."""

    def judge() -> tuple[str, dict]:
        reading = read_pressure(bounds)
        return reading.reason, {"pressure": reading.as_json()}

    return cached_judgement(purpose, bound=bounds, read_seconds=bounds.read_seconds, judge=judge, purpose=purpose)


def mutation_admission(bounds: PressureBounds | None = None) -> str:
    """``""`` when new durable mutation work may be claimed now, else the reason code it waits for.

    ``bounds``: the runtime policy's pressure bounds (default :func:`pressure_bounds`, the settings).
    Reads the signals at most every ``bounds.read_seconds`` per process (the last reading under the same
    bounds answers in between) and logs each change between admitted and paused once.
    """
    return _admission("mutation", bounds or pressure_bounds())


def ingress_admission(bounds: PressureBounds) -> str:
    """``""`` when the ingress admits a delivery now, else the reason code it sheds for (the runtime
    policy's higher ``ingress`` bounds; read and cached like :func:`mutation_admission`)."""
    return _admission("ingress", bounds)


#: ``name -> reader(org_id, now) -> the eligible time of the org's oldest due work (a datetime), or None``.
_QUEUE_READERS: dict = {}


def register_queue_age(name: str, reader) -> None:
    """Register a reader of the oldest due durable work of an org (idempotent per ``name``): the flows app
    reads its due ``Runnable`` roots, the connector app its ready inbound executions (their ``ready``)."""
    _QUEUE_READERS[name] = reader


def queue_age_seconds(org_id: str) -> float:
    """Age in seconds, on the database clock, of the org's oldest due durable work over every registered
    reader (0 when none is due)."""
    from .clock import db_now

    now = db_now()
    oldest = [at for reader in list(_QUEUE_READERS.values()) if (at := reader(org_id, now)) is not None]
    return max(0.0, (now - min(oldest)).total_seconds()) if oldest else 0.0


def ingress_queue_admission(org_id: str, *, bound_seconds: int | None, read_seconds: float) -> str:
    """``""`` when the org's ingress admits now, else :data:`QUEUE_AGE`: its oldest due durable work has waited
    ``bound_seconds`` or longer, so new root work of that org is refused (503, redelivered later) while its
    backlog drains; other orgs are not affected. ``None`` bound: never. Read at most every ``read_seconds``
    per org and process; each change between admitted and shed logged once."""
    if bound_seconds is None:
        return ""

    def judge() -> tuple[str, dict]:
        age = queue_age_seconds(org_id)
        return (QUEUE_AGE if age >= bound_seconds else ""), {"org_id": org_id, "queue_age_seconds": round(age, 3)}

    return cached_judgement(("queue_age", org_id), bound=bound_seconds, read_seconds=read_seconds, judge=judge,
                            purpose="ingress")
