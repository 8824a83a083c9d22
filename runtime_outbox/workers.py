"""The Runtime worker role, registered by ``RuntimeOutboxConfig.ready`` (CONVENTIONS.md "Workers")."""
from __future__ import annotations

from nexusflow.kernel.workers import Unit


def runtime_units(worker_id: str) -> list[tuple[str, Unit]]:
    """The ``runtime`` role: deliver due outbox messages; reconcile handoffs whose delivery budget is spent."""
    from .handoff import outbox_try_reconcile_one
    from .services import outbox_try_deliver_batch

    return [("outbox.deliver", outbox_try_deliver_batch), ("outbox.reconcile", outbox_try_reconcile_one)]
