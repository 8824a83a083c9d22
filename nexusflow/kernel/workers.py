"""Worker roles, open-work counters and the worker-process registry: what each app registers for its workers.

Every app that runs work registers it in its ``AppConfig.ready()``
(ARCHITECTURE.md section 2, "Which way imports point"), so neither the
worker command nor a caller that waits for idle imports the apps:

- :func:`register_role`: a ``run_workers --role`` value and the factory of
  its ``try_<verb>_one() -> bool`` units (CONVENTIONS.md "Workers");
  :func:`roles` and :func:`units_for` read the registry;
- :func:`register_open_work`: one named count of work a worker still has to
  move on; :func:`open_work` reads every count;
- :func:`register_worker_processes`: the one worker-process registry
  (seed 003, the holder a DispatchPermit or a lease names):
  :func:`worker_process_register` registers this process,
  :func:`holder_termination_proof` proves a holder gone.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .ports import Port

Unit = Callable[[], bool]
#: ``worker_id -> [(unit name, unit)]`` in priority order.
UnitsFactory = Callable[[str], list[tuple[str, Unit]]]


@dataclass(frozen=True)
class Role:
    """One worker role: ``order`` places it in :func:`roles`; ``in_all`` includes it in ``--role all``."""

    name: str
    units: UnitsFactory
    order: int
    in_all: bool = True


_ROLES: dict[str, Role] = {}


def register_role(name: str, units: UnitsFactory, *, order: int, in_all: bool = True) -> None:
    """Register the worker role ``name`` and the factory of its work units.

    Args:
        name: the ``run_workers --role`` value (e.g. ``"runtime"``).
        units: ``worker_id -> [(unit name, try_<verb>_one)]`` in priority order.
        order: position among the roles (ascending), so the order of :func:`roles`
            and of ``--role all`` does not depend on which app is loaded first.
        in_all: ``False`` for a role ``--role all`` leaves out (a narrower worker
            over work another role already takes).

    Raises:
        ValueError: ``name`` is registered already with another factory.
    """
    current = _ROLES.get(name)
    if current is not None and current.units is not units:
        raise ValueError(f"worker role {name!r} is registered already")
    _ROLES[name] = Role(name, units, int(order), bool(in_all))


def roles(*, all_only: bool = False) -> tuple[str, ...]:
    """The registered role names in ascending ``order``; ``all_only``: only those ``--role all`` runs."""
    ordered = sorted(_ROLES.values(), key=lambda role: (role.order, role.name))
    return tuple(role.name for role in ordered if role.in_all or not all_only)


#: Prefix of every installed reconciler schedule's name (nexusflow/kernel/schedules.py).
SCHEDULE_PREFIX = "nexusflow.reconcile."


@dataclass(frozen=True)
class Reconciler:
    """One registered reconciler: the worker ``role`` whose unit ``unit`` it runs every ``minutes``."""

    unit: str
    role: str
    minutes: int

    @property
    def schedule_name(self) -> str:
        return SCHEDULE_PREFIX + self.unit


_RECONCILERS: dict[str, Reconciler] = {}


def register_reconciler(unit: str, *, role: str, minutes: int = 1) -> None:
    """Register the unit ``unit`` of worker role ``role`` as a reconciler run every ``minutes`` (>= 1).

    Raises:
        ValueError: ``minutes`` below 1, or ``unit`` registered already for another role.
    """
    if minutes < 1:
        raise ValueError("a reconciler runs at most once a minute")
    current = _RECONCILERS.get(unit)
    if current is not None and current.role != role:
        raise ValueError(f"reconciler {unit!r} is registered already for role {current.role!r}")
    _RECONCILERS[unit] = Reconciler(unit, role, int(minutes))


def reconcilers() -> tuple[Reconciler, ...]:
    """The registered reconcilers, by unit name."""
    return tuple(_RECONCILERS[name] for name in sorted(_RECONCILERS))


def scheduled() -> bool:
    """``True`` when ``NEXUS_RECONCILERS=schedules``: ``qcluster`` is the authoritative reconciler runner."""
    from django.conf import settings

    return getattr(settings, "NEXUS_RECONCILERS", "workers") == "schedules"


def units_for(role: str, worker_id: str, *, include_reconcilers: bool | None = None) -> list[tuple[str, Unit]]:
    """Return the named work units of ``role`` in priority order.

    Args:
        include_reconcilers: keep the units registered as reconcilers
            (:func:`register_reconciler`); default: unless
            ``NEXUS_RECONCILERS=schedules`` makes ``qcluster`` their runner.

    Raises:
        ValueError: unknown role.
    """
    found = _ROLES.get(role)
    if found is None:
        raise ValueError(f"unknown worker role {role!r}")
    units = list(found.units(worker_id))
    if include_reconcilers is None:
        include_reconcilers = not scheduled()
    if include_reconcilers:
        return units
    skipped = set(_RECONCILERS)  # by name: egress-deferred's are egress's, narrowed
    return [(name, unit) for name, unit in units if name not in skipped]


@dataclass(frozen=True)
class _Counter:
    count: Callable[[], int]
    parked: bool


_OPEN_WORK: dict[str, _Counter] = {}


def register_open_work(name: str, counter: Callable[[], int], *, parked: bool = False) -> None:
    """Register one count of open work under ``name`` (the key :func:`open_work` reports it under).

    Args:
        name: the key, unique across apps (e.g. ``"outbox"``).
        counter: ``() -> int``, the rows of that kind a worker still has to move
            on (all orgs; a read outside any transaction).
        parked: the rows sit in a state their machine parks (an ``uncertain``
            effect): whether that still counts as open depends on the question,
            so :func:`open_work` includes it only when the caller names it.

    Raises:
        ValueError: ``name`` is registered already with another counter.
    """
    current = _OPEN_WORK.get(name)
    if current is not None and current.count is not counter:
        raise ValueError(f"open-work counter {name!r} is registered already")
    _OPEN_WORK[name] = _Counter(counter, bool(parked))


def open_work_kinds(*, parked: bool | None = None) -> tuple[str, ...]:
    """The registered counter names (``parked`` ``True``/``False``: only the parked / the unparked ones)."""
    return tuple(name for name, c in _OPEN_WORK.items() if parked is None or c.parked == parked)


def open_work(*, parked: Iterable[str] = ()) -> dict[str, int]:
    """Count the open work of every registered kind: ``{name: rows}``.

    Every unparked counter is included; a parked counter only when ``parked``
    names it. Idle means ``sum(open_work(...).values()) == 0``.

    Args:
        parked: names of parked counters to include as well.

    Raises:
        ValueError: ``parked`` names no registered parked counter.
    """
    wanted = set(parked)
    unknown = wanted - set(open_work_kinds(parked=True))
    if unknown:
        raise ValueError(f"no parked open-work counter {sorted(unknown)}; known: {open_work_kinds(parked=True)}")
    return {name: int(c.count()) for name, c in _OPEN_WORK.items() if not c.parked or name in wanted}


@dataclass(frozen=True)
class WorkerProcesses:
    """The worker-process registry's two operations.

    ``register(role) -> worker_id`` records this process and returns the
    holder id leases and Permits name; ``termination_proof(worker_id) ->
    dict | None`` returns evidence that the holder process ended, or
    ``None`` while that is unproven.
    """

    register: Callable[[str], str]
    termination_proof: Callable[[str], dict | None]


_PROCESSES: Port[WorkerProcesses] = Port("worker-process registry", provider="connectors")


def register_worker_processes(*, register: Callable[[str], str],
                              termination_proof: Callable[[str], dict | None]) -> None:
    """Install the worker-process registry (one provider).

    Raises:
        PortAlreadyRegistered: another registry is installed.
    """
    _PROCESSES.register(WorkerProcesses(register, termination_proof))


def worker_process_register(role: str) -> str:
    """Register this process as a worker of ``role`` (``"a+b"`` for several) and return its ``worker_id``.

    Raises:
        PortNotRegistered: no worker-process registry is installed.
    """
    return _PROCESSES.get().register(role)


def holder_termination_proof(worker_id: str) -> dict | None:
    """Return evidence that the holder process ``worker_id`` is terminated, or ``None`` if unproven.

    Seed 003 "State machines" (Permit abandonment): only a holder proven gone
    loses its Permit or lease before it expires.

    Raises:
        PortNotRegistered: no worker-process registry is installed.
    """
    return _PROCESSES.get().termination_proof(worker_id)
