"""V1 process generations and the V1 release digest (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover").

Every started V1 worker process is one :class:`~connectors.v1.models.V1ProcessGeneration`
row naming its registered :class:`~connectors.models.WorkerProcess` (``worker_id``)
and the exact V1 release it runs. The cutover terminates and isolates these
generations; a terminated generation is never reenabled (a new process is a new row).
"""
from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

from nexusflow.kernel.models import insert

from connectors.v1.models import V1ProcessGeneration

_V1_DIR = Path(__file__).resolve().parent
#: The V1ProcessGeneration this process started (``None``: this process started none).
_CURRENT: dict[str, int] = {}


def v1_release() -> str:
    """The V1 release digest: SHA-256 (64 hex) over every ``connectors/v1`` source file and the egress manifest.

    Files are taken in sorted relative-path order, each framed by its path and length, so a changed,
    added or removed file yields another release.
    """
    digest = hashlib.sha256(b"nexusflow.v1-release\x00")
    for path in sorted(p for p in _V1_DIR.rglob("*") if p.suffix in (".py", ".json") and "__pycache__" not in p.parts):
        data = path.read_bytes()
        name = path.relative_to(_V1_DIR).as_posix().encode("utf-8")
        digest.update(len(name).to_bytes(4, "big") + name + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def v1_process_generation_start(*, worker_id: str) -> V1ProcessGeneration:
    """Record that this process starts a new V1 process generation as ``worker_id`` (once per worker id).

    Args:
        worker_id: the id :func:`nexusflow.kernel.workers.worker_process_register` returned for this process.

    Raises:
        IntegrityError: ``worker_id`` already started a generation.
    """
    generation = insert(V1ProcessGeneration, worker_id=worker_id, host=socket.gethostname(), pid=os.getpid(),
                        release=v1_release())
    _CURRENT["id"] = int(generation.pk)
    return generation


def current_generation_id() -> int:
    """The id of the V1ProcessGeneration this process started, or 0 when it started none.

    Egress compares it with the org's :class:`~connectors.v1.models.V1EgressDenial` rows: a
    process without a generation is denied as soon as any generation of the org is.
    """
    return _CURRENT.get("id", 0)
