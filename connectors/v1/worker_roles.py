"""The ``v1`` worker role: ``manage.py run_workers --role v1`` runs the V1 runtime being retired.

Units in priority order (CONVENTIONS.md "Workers"): recover expired leases,
complete events whose Runtime acceptance committed, run (claim + handoff) one
event, poll one pulled route. Starting the role records the process's
:class:`~connectors.v1.models.V1ProcessGeneration` (seed 003 "Offline V1
shutdown, cold rollback, and V2 cutover": V1 process generations).
"""
from __future__ import annotations

from nexusflow.kernel.workers import Unit


def v1_units(worker_id: str) -> list[tuple[str, Unit]]:
    """Record this V1 process generation and return the ``v1`` role's units."""
    from connectors.v1.events import v1_event_try_complete_one, v1_event_try_recover_one, v1_event_try_run_one
    from connectors.v1.generations import v1_process_generation_start
    from connectors.v1.poller import v1_stream_try_poll_one

    v1_process_generation_start(worker_id=worker_id)
    return [("v1.event.recover", v1_event_try_recover_one),
            ("v1.event.complete", v1_event_try_complete_one),
            ("v1.event.run", lambda: v1_event_try_run_one(worker_id=worker_id)),
            ("v1.stream.poll", lambda: v1_stream_try_poll_one(worker_id=worker_id))]
