"""Where a worker role's time goes: cProfile summaries of ``run_workers`` processes (``make bench``).

A worker started with ``NEXUS_WORKER_PROFILE_DIR`` writes ``<dir>/<roles>-<pid>.prof`` when it stops
(runtime_outbox/management/commands/run_workers.py). :func:`summarise` merges every file of one role and
returns the functions that take the most time, split into the database round trips (lock waits
included), Django's ORM, provider HTTP calls and NexusFlow's own code, so a missed target points at what to change.
"""
from __future__ import annotations

import pstats
from pathlib import Path
from typing import Any

#: Functions listed per role.
TOP = 12
#: The worker loop itself (it spans every unit, so it is left out of the slowest functions).
LOOP_FILES = ("run_workers.py", "kernel/workers.py")
#: Where a function's own time is charged: the first prefix its file path contains.
BUCKETS = (("database", ("MySQLdb", "_mysql", "Connection.query", "Connection.autocommit", "Connection.ping",
                          "Connection.next_result", "Connection.store_result")), ("django", ("/django/",)),
           ("http", ("/httpx/", "/httpcore/", "socket", "select.poll", "ssl.")),
           ("nexusflow", ("/nexusflow/", "/connectors/", "/runtime_outbox/", "/cutover/", "/packs/")))


def _bucket(filename: str, name: str) -> str:
    text = f"{filename}:{name}"
    for bucket, needles in BUCKETS:
        if any(n in text for n in needles):
            return bucket
    return "python"


def summarise(directory: Path) -> dict[str, Any]:
    """Per role found in ``directory``: seconds of own time per bucket and the :data:`TOP` functions.

    Returns:
        ``{role: {"processes": n, "seconds": {"database": s, "django": s, "http": s, "nexusflow": s,
        "python": s, "idle_sleep": s}, "top_cumulative": [{"function": "file:line(name)", "seconds": s, "calls": n},
        ...]}}``; ``{}`` when there is no profile. Idle sleep (``time.sleep``) is kept apart.
    """
    by_role: dict[str, list[Path]] = {}
    for path in sorted(Path(directory).glob("*.prof")):
        by_role.setdefault(path.stem.rsplit("-", 1)[0], []).append(path)
    out: dict[str, Any] = {}
    for role, paths in by_role.items():
        stats = pstats.Stats(*[str(p) for p in paths])
        seconds = {bucket: 0.0 for bucket, _ in BUCKETS} | {"python": 0.0, "idle_sleep": 0.0}
        rows = []
        for (filename, line, name), (_cc, calls, own, cumulative, _callers) in stats.stats.items():
            if name == "<built-in method time.sleep>":
                seconds["idle_sleep"] += own
                continue
            seconds[_bucket(filename, name)] += own
            if (any(n in filename for n in ("/nexusflow/", "/connectors/", "/runtime_outbox/", "/cutover/"))
                    and not filename.endswith(LOOP_FILES) and name != "<lambda>"):
                rows.append({"function": f"{Path(filename).name}:{line}({name})", "seconds": round(cumulative, 3),
                             "calls": calls})
        rows.sort(key=lambda r: -r["seconds"])
        out[role] = {"processes": len(paths), "seconds": {k: round(v, 3) for k, v in seconds.items()},
                     "top_cumulative": rows[:TOP]}
    return out
