"""Named crash points (ARCHITECTURE.md section 6, "Failpoints").

``hit(name)`` is inert unless the environment variable ``NEXUS_FAILPOINTS``
names it. The value is a comma-separated list of ``name`` or ``name=action``:

- ``kill`` (default): the process sends itself SIGKILL, as a crash would;
- ``pause``: the process writes ``<NEXUS_FAILPOINT_DIR>/<name>.<pid>`` and
  sleeps until something kills it, so a test can kill it from outside;
- ``hold``: the caller writes ``<NEXUS_FAILPOINT_DIR>/<name>.<pid>`` and waits
  (at most 120 s, then ``TimeoutError``) until ``<...>.go`` exists, then
  goes on: a race test holds a real transaction open at a named point
  while a concurrent one queues behind its row locks, then releases it.

Every name must be declared with :func:`declare` so a typo cannot silently
disable a crash test.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

DECLARED: set[str] = set()


def declare(name: str) -> str:
    """Register a failpoint name and return it."""
    DECLARED.add(name)
    return name


def _armed() -> dict[str, str]:
    raw = os.environ.get("NEXUS_FAILPOINTS", "")
    armed: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, action = item.partition("=")
        armed[name] = action or "kill"
    return armed


def hit(name: str) -> None:
    """Crash or pause here when ``NEXUS_FAILPOINTS`` arms ``name``.

    Raises:
        KeyError: ``name`` was never declared.
    """
    if name not in DECLARED:
        raise KeyError(f"undeclared failpoint {name!r}")
    action = _armed().get(name)
    if action is None:
        return
    if action == "hold":
        directory = Path(os.environ.get("NEXUS_FAILPOINT_DIR", "/tmp"))
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / f"{name}.{os.getpid()}"
        go = marker.with_name(marker.name + ".go")
        marker.write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not go.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"failpoint {name} was held for 120 s and never released")
            time.sleep(0.02)
        return
    if action == "pause":
        directory = Path(os.environ.get("NEXUS_FAILPOINT_DIR", "/tmp"))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{name}.{os.getpid()}").write_text(str(os.getpid()))
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)
