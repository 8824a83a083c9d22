"""Worker roles: each is a list of ``try_<verb>_one() -> bool`` units (CONVENTIONS.md "Workers")."""
from __future__ import annotations

from typing import Callable

Unit = Callable[[], bool]


def units_for(role: str, worker_id: str) -> list[tuple[str, Unit]]:
    """Return the named work units of ``role`` in priority order.

    Raises:
        ValueError: unknown role.
    """
    if role == "connector":
        from connectors.executions import dependency_try_expire_one, execution_try_recover_one, execution_try_run_one
        from connectors.inbound import receipt_try_reconcile_one
        from connectors.windows import window_try_close_one

        return [("receipt.reconcile", receipt_try_reconcile_one),
                ("window.close", window_try_close_one),
                ("dependency.expire", dependency_try_expire_one),
                ("execution.run", lambda: execution_try_run_one(worker_id=worker_id)),
                ("execution.recover", lambda: execution_try_recover_one(worker_id=worker_id))]
    if role == "runtime":
        from runtime_outbox.services import outbox_try_deliver_one

        return [("outbox.deliver", outbox_try_deliver_one)]
    if role == "flow":
        from nexusflow.flows.services import flow_try_recover_expired_one, flow_try_run_step_one, flow_try_wake_one

        return [("flow.wake", flow_try_wake_one),
                ("flow.step", lambda: flow_try_run_step_one(worker_id=worker_id)),
                ("flow.recover", flow_try_recover_expired_one),
                ("flow.cancel_cleanup", _flow_cancel_cleanup())]
    if role in ("egress", "egress-deferred"):
        from connectors.egress import (
            KNOWN_LANES,
            effect_try_dispatch_one,
            effect_try_finalize_one,
            effect_try_reconcile_one,
            permit_try_abandon_one,
        )

        # ``egress`` takes every known DispatchLane; ``egress-deferred`` is seed 002's narrow
        # worker: only ``deferred_association`` rows, applied in each SQL claim.
        lanes = KNOWN_LANES if role == "egress" else ("deferred_association",)
        return [("permit.abandon", lambda: permit_try_abandon_one(lanes=lanes)),
                ("effect.finalize", lambda: effect_try_finalize_one(lanes=lanes)),
                ("effect.reconcile", lambda: effect_try_reconcile_one(lanes=lanes)),
                ("effect.dispatch", lambda: effect_try_dispatch_one(worker_id=worker_id, lanes=lanes))]
    if role == "stream":
        from connectors.stream import stream_try_poll_one

        return [("stream.poll", stream_try_poll_one)]
    raise ValueError(f"unknown worker role {role!r}")


def _flow_cancel_cleanup() -> Unit:
    from nexusflow.flows.services import flow_try_cancel_cleanup_one

    return flow_try_cancel_cleanup_one


ROLES = ("connector", "runtime", "flow", "egress", "egress-deferred", "stream")
