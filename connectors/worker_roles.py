"""The connector's worker roles, registered with :func:`nexusflow.kernel.workers.register_role`.

Each role is its units in priority order (CONVENTIONS.md "Workers"):
``connector``, ``egress``, ``egress-deferred`` and ``stream``.
"""
from __future__ import annotations

from nexusflow.kernel.workers import Unit

# The units are imported when a worker asks for its role, not when the app loads: loading the
# app must not load the egress adapter or its HTTP client (tests/connectors/links/test_push_revalidation.py).


def connector_units(worker_id: str) -> list[tuple[str, Unit]]:
    """The ``connector`` role: inbound receipts, windows, dependencies and executions."""
    from connectors.inbound.admission import receipt_try_reconcile_one
    from connectors.inbound.executions import (
        dependency_try_expire_one,
        execution_try_recover_one,
        execution_try_run_one,
    )
    from connectors.inbound.windows import window_try_close_one

    return [("receipt.reconcile", receipt_try_reconcile_one),
            ("window.close", window_try_close_one),
            ("dependency.expire", dependency_try_expire_one),
            ("execution.run", lambda: execution_try_run_one(worker_id=worker_id)),
            ("execution.recover", lambda: execution_try_recover_one(worker_id=worker_id))]


def _egress_units(worker_id: str, lanes: tuple[str, ...]) -> list[tuple[str, Unit]]:
    from connectors.outbound.egress import (
        effect_try_dispatch_one,
        effect_try_finalize_one,
        effect_try_reconcile_one,
        permit_try_abandon_one,
    )

    return [("permit.abandon", lambda: permit_try_abandon_one(lanes=lanes)),
            ("effect.finalize", lambda: effect_try_finalize_one(lanes=lanes)),
            ("effect.reconcile", lambda: effect_try_reconcile_one(lanes=lanes)),
            ("effect.dispatch", lambda: effect_try_dispatch_one(worker_id=worker_id, lanes=lanes))]


def egress_units(worker_id: str) -> list[tuple[str, Unit]]:
    """The ``egress`` role: every known DispatchLane."""
    from connectors.outbound.egress import KNOWN_LANES

    return _egress_units(worker_id, KNOWN_LANES)


def egress_deferred_units(worker_id: str) -> list[tuple[str, Unit]]:
    """The ``egress-deferred`` role: seed 002's narrow worker, only ``deferred_association`` rows (each SQL claim)."""
    return _egress_units(worker_id, ("deferred_association",))


def stream_units(worker_id: str) -> list[tuple[str, Unit]]:
    """The ``stream`` role: poll the pulled routes."""
    from connectors.inbound.stream_poll import stream_try_poll_one

    return [("stream.poll", stream_try_poll_one)]
