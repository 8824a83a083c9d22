"""Worker process identity (the holder that Permits and leases name) and the connector's worker roles.

A Permit can be abandoned only with proof that its holder process is gone:
on the same host, the pid no longer exists or now belongs to a process that
started at another time (``/proc/<pid>/stat`` start ticks). A holder on another
host cannot be proven gone from here and its Permit stays open.

``ConnectorsConfig.ready`` registers this registry with
:func:`nexusflow.kernel.workers.register_worker_processes`; the connector's
roles are in :mod:`connectors.worker_roles`.
"""
from __future__ import annotations

import os
import socket
import uuid

from django.db import transaction

from connectors.models import WorkerProcess
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.models import insert
from nexusflow.kernel.rows import first_row


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` after the parenthesised command name (field 3, the state, first), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])  # field 22 (starttime)


def _exited(pid: int) -> bool:
    """The process has exited and only its exit status waits for its parent (zombie ``Z`` or dead ``X``)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in (b"Z", b"X")


def register_worker(role: str) -> str:
    """Register this process and return its ``worker_id``."""
    pid = os.getpid()
    worker_id = f"{role}:{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}"
    insert(WorkerProcess, worker_id=worker_id, role=role, host=socket.gethostname(), pid=pid,
           process_start_ticks=_start_ticks(pid) or 0)
    return worker_id


def holder_termination_proof(worker_id: str) -> dict | None:
    """Return evidence that the holder process is terminated, or ``None`` if unproven."""
    worker = first_row(WorkerProcess, worker_id=worker_id)
    if worker is None or worker.host != socket.gethostname():
        return None
    if worker.pid == os.getpid():
        return None
    ticks = _start_ticks(worker.pid)
    if ticks is None:
        return {"host": worker.host, "pid": worker.pid, "proof": "pid_absent"}
    if ticks != worker.process_start_ticks:
        return {"host": worker.host, "pid": worker.pid, "proof": "pid_reused", "start_ticks": ticks}
    if _exited(worker.pid):  # a zombie runs no code and holds no socket: its egress ended with it
        return {"host": worker.host, "pid": worker.pid, "proof": "pid_exited"}
    return None



def record_holder_termination(worker_id: str, proof: dict) -> dict:
    """Record, once, the proof that worker process generation ``worker_id`` ended; return the recorded proof.

    The registry row keeps the first proof (``terminated_at``,
    ``termination_proof``); a later call returns that same proof. The proof
    states that the holder's provider egress ended with the process: the
    sole egress adapter runs in the worker process, so its connections close
    when the process is gone (seed 003 "State machines", Permit abandonment).
    """
    from connectors.store import WorkerProcessStore

    proof = {**proof, "worker_id": worker_id, "egress": "closed_with_process"}
    with transaction.atomic():
        WorkerProcessStore.record_termination(worker_id=worker_id, proof=proof, at=db_now())
        recorded = WorkerProcess.objects.filter(worker_id=worker_id).values_list("termination_proof", flat=True).first()
    return recorded or proof
