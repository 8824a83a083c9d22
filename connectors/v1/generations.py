"""V1 process generations and the V1 release digest (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover").

Every started V1 worker process is one :class:`~connectors.v1.models.V1ProcessGeneration`
row naming its registered :class:`~connectors.models.WorkerProcess` (``worker_id``)
and the exact V1 release it runs. The cutover terminates and isolates these
generations; a terminated generation is never reenabled (a new process is a new row).

Starting a generation is refused (:class:`V1GenerationRefused`, ``v1_generation_refused``) while
any org the V1 runtime serves (an org with V1 maintenance barriers, ``cutover v1-install``) is
being cut over past its drain: a gate beyond ``halting_v1`` (``cutover stop`` terminated V1), or
an egress denial while its gates still halt (the stop is under way). Only a certified cold abort
or a full restore (``cutover cold-abort`` / ``cutover restore``) returns the gates to
``v1_serving`` and so allows a new generation of the exact release. Once a V1 -> V2 activation
won its CutoverDecision (the ``control`` database, which no restore of the main database rewrites)
no generation ever starts again, whatever the main database says: a restored snapshot cannot
bring V1 back (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover"; proofs S003-RP-45,
S003-RP-50). The cutover app answers these questions through :func:`register_v1_start_check`.
"""
from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable
from pathlib import Path

from connectors.v1.models import V1ProcessGeneration
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.models import insert
from nexusflow.kernel.ports import Port

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


class V1GenerationRefused(NexusError):
    """No V1 process generation may start now; the message names each reason."""

    code = "v1_generation_refused"
    definite = True


#: The cutover app's answer: ``[reason, ...]`` why no V1 generation may start (empty: it may).
_START_CHECK: Port[Callable[[], list[str]]] = Port("V1 generation start check", provider="cutover")


def register_v1_start_check(check: Callable[[], list[str]]) -> None:
    """The cutover app registers the check :func:`v1_start_refusals` asks (in its ``AppConfig.ready()``)."""
    _START_CHECK.register(check)


def v1_start_refusals() -> list[str]:
    """Why no V1 process generation may start now (``[]``: it may): one sentence per reason.

    The cutover app answers (V1 reads no V2 gate itself): an activated V1 -> V2 attempt (control
    database), an org of the V1 runtime with a gate past ``halting_v1``, or one whose V1 egress is
    denied while its gates halt.
    """
    return list(_START_CHECK.get()())


def v1_process_generation_start(*, worker_id: str) -> V1ProcessGeneration:
    """Record that this process starts a new V1 process generation as ``worker_id`` (once per worker id).

    Args:
        worker_id: the id :func:`nexusflow.kernel.workers.worker_process_register` returned for this process.

    Raises:
        V1GenerationRefused: :func:`v1_start_refusals` found a reason (the process must not serve V1).
        IntegrityError: ``worker_id`` already started a generation.
    """
    refusals = v1_start_refusals()
    if refusals:
        raise V1GenerationRefused("no V1 process generation may start: " + "; ".join(refusals))
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
