"""The Flow Runtime worker role, registered by ``FlowsConfig.ready`` (CONVENTIONS.md "Workers")."""
from __future__ import annotations

from nexusflow.kernel.workers import Unit


def flow_units(worker_id: str) -> list[tuple[str, Unit]]:
    """The ``flow`` role: wake signals, due time waits, runnable steps, expired leases and dependencies,
    runs left waiting on a terminal dependency, cancel cleanup, schedule-triggered flows' occurrences.

    ``flow.step`` listens for a wake hint when nothing is due (:func:`.services.execute.
    flow_try_run_step_or_wait_one`), so committed work is claimed at once instead of after an idle sleep."""
    from .services import (
        flow_try_cancel_cleanup_one,
        flow_try_expire_one,
        flow_try_recover_expired_one,
        flow_try_repair_one,
        flow_try_resume_due_one,
        flow_try_run_step_or_wait_one,
        flow_try_schedule_one,
        flow_try_wake_one,
    )

    return [("flow.wake", flow_try_wake_one),
            ("flow.resume_due", flow_try_resume_due_one),
            ("flow.step", lambda: flow_try_run_step_or_wait_one(worker_id=worker_id)),
            ("flow.recover", flow_try_recover_expired_one),
            ("flow.expire", flow_try_expire_one),
            ("flow.repair", flow_try_repair_one),
            ("flow.cancel_cleanup", flow_try_cancel_cleanup_one),
            ("flow.schedule", flow_try_schedule_one)]
