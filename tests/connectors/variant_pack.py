"""A copy of the packs folder whose webhook route declares another ordering contract or a window.

The inbound-chain tests need routes the shipped packs do not have
(``strict_source_sequence``, ``order_independent``, windows). They copy the
real packs, change only the webhook route, and point ``NEXUS_PACKS_DIR`` at
the copy, so admission, signatures and Runtime stay the production code.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

STRICT = {"contract": "strict_source_sequence", "partition": ["objectId"], "position": ["eventId"],
          "tie_breaker": "eventId", "comparator_version": "1", "successor": {"first": 1, "step": 1},
          "gap": {"deadline_seconds": 3600, "disposition": "quarantine"}}
INDEPENDENT = {"contract": "order_independent",
               "conformance": "test route: every event of an object is applied and none overwrites another"}


def use_variant(settings, monkeypatch, tmp_path: Path, mutate: Callable[[dict], None]) -> Path:
    """Copy the packs, apply ``mutate`` to the webhook route, and serve packs from the copy."""
    target = tmp_path / "packs"
    shutil.copytree(settings.NEXUS_PACKS_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    path = target / "hubspot" / "pack.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    mutate(document["inbound_routes"][0])
    document["version"] = f"{document['version']}-variant"
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    settings.NEXUS_PACKS_DIR = target
    monkeypatch.setenv("NEXUS_PACKS_DIR", str(target))  # for worker subprocesses
    return target


def strict(**gap) -> Callable[[dict], None]:
    def mutate(route: dict) -> None:
        route["ordering"] = {**STRICT, "gap": {**STRICT["gap"], **gap}}
    return mutate


def independent(route: dict) -> None:
    route["ordering"] = dict(INDEPENDENT)


def settle(seconds: int) -> Callable[[dict], None]:
    def mutate(route: dict) -> None:
        route["ordering"]["settle_seconds"] = seconds
    return mutate


def window(**spec) -> Callable[[dict], None]:
    def mutate(route: dict) -> None:
        route["ordering"] = dict(INDEPENDENT)
        route["window"] = spec
    return mutate
