"""The tables in ``transitions.py`` are the seeds' state machines, edge for edge.

The seed sections are copied verbatim into ``seed_tables/``; this test parses
them (seed 003's arrow notation, seed 002's "Allowed next states" tables,
seed 004's mermaid diagrams) and compares every machine with its table.
Where the code deliberately adds to a seed machine, the addition is listed
below with the seed text that requires it, so a new edge cannot slip in.
"""
from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import pytest

from nexusflow.kernel.transitions import load_all_machines

HERE = Path(__file__).parent / "seed_tables"
MACHINES = load_all_machines()

#: Edges the code adds to a seed 003 machine, each justified by seed text.
ADDITIONS_003 = {
    # 003 "Durable source ordering": a lower or late position is recorded as superseded without calling Runtime.
    "Execution": {("ready", "superseded")},
    # 002 "Remote Link State" adds suspended_drift (ARCHITECTURE.md section 4: RemoteLink states are seed 002's).
    "RemoteLink": {("active", "suspended_drift"), ("suspended_drift", "active"), ("suspended_drift", "retired")},
}
#: Seed 003 names the machines it lists; ApplicationResult is an immutable terminal fact, not a machine.
NOT_MACHINES_003 = {"ApplicationResult"}
APP_OF_003 = {"ServingPublicationBarrierSet": "connectors", "ProjectionWindow": "connectors"}


def parse_003(text: str) -> dict[str, set[tuple[str, str]]]:
    """``{machine: {(src, dst)}}`` from seed 003's arrow block."""
    machines: dict[str, set[tuple[str, str]]] = {}
    current, last_source = None, None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("```"):
            continue
        head = re.match(r"^(\w+):\s*(.*)$", line)
        if head:
            current, line = head.group(1), head.group(2)
            machines.setdefault(current, set())
            if not line:
                continue
        line = re.sub(r"\s*\([^)]*\)", "", line)  # parenthesised notes: "(predecessor)", "(proved no effect...)"
        line = re.sub(r"--[^>]*-->", "->", line)  # labelled arrows: "--atomic first activation-->"
        line = line.strip()
        if line.startswith("\\->"):  # continuation branch from the previous line's source
            line = f"{last_source} {line[1:]}"
        if "->" not in line:
            continue
        segments = [[s.strip() for s in seg.split("|")] for seg in line.split("->")]
        last_source = segments[0][0]
        for sources, targets in pairwise(segments):
            machines[current] |= {(s, t) for s in sources for t in targets}
    return machines


def parse_002(text: str) -> dict[str, set[tuple[str, str]]]:
    """``{table title: {(src, dst)}}`` from seed 002's "Allowed next states" tables."""
    machines: dict[str, set[tuple[str, str]]] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("### "):
            title = line[4:].strip()
            machines[title] = set()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if title and len(cells) == 3 and cells[0].startswith("`"):
            src = cells[0].strip("`")
            machines[title] |= {(src, dst) for dst in re.findall(r"`(\w+)`", cells[2])}
    return machines


def parse_004(text: str) -> dict[str, set[tuple[str, str]]]:
    """``{machine: {(src, dst)}}`` from seed 004 section 11's mermaid diagrams."""
    machines: dict[str, set[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^### 11\.\d (\w+)", line)
        if head:
            current = head.group(1)
            machines[current] = set()
        edge = re.match(r"^\s*(\w+) --> (\w+)", line)
        if current and edge:
            machines[current].add((edge.group(1), edge.group(2)))
    return machines


def edges(name: str) -> set[tuple[str, str]]:
    return set(MACHINES[name].pairs())


SEED_003 = parse_003((HERE / "003_state_machines.txt").read_text())
SEED_002 = parse_002((HERE / "002_lifecycle.md").read_text())
SEED_004 = parse_004((HERE / "004_section_11.md").read_text())


def test_the_parsers_read_what_the_seeds_say():
    assert ("v2_halted", "v2_serving") in SEED_003["AccountServingGate"]
    assert ("v2_validating", "v1_drained") in SEED_003["AccountServingGate"]
    assert ("halting_v2", "v2_halted") in SEED_003["AccountServingGate"]
    assert SEED_003["ProjectionWindow"] == {("open", "sealed"), ("open", "quarantined")}
    assert ("uncertain", "prepared") in SEED_003["RemoteEffect"]
    assert ("processing", "pending") in SEED_002["Create Attempt State"]
    assert ("terminal_failed", "superseded") in SEED_002["Create Attempt State"]
    assert ("Waiting", "Pending") in SEED_004["FlowStepExecution"]
    assert len(SEED_004["FlowStepAttempt"]) == 8


@pytest.mark.parametrize("seed_name", sorted(set(SEED_003) - NOT_MACHINES_003))
def test_seed_003_machines(seed_name):
    name = f"{APP_OF_003.get(seed_name, 'connectors')}.{seed_name}"
    assert name in MACHINES, f"seed 003 machine {seed_name} has no table"
    assert edges(name) == SEED_003[seed_name] | ADDITIONS_003.get(seed_name, set())


def test_seed_002_remote_link_state():
    # Seed 002 calls the live link state `finalized`; seed 003 and this code call it `active`.
    rename = {"finalized": "active"}
    seed = {(rename.get(s, s), rename.get(d, d)) for s, d in SEED_002["Remote Link State"]}
    assert seed == edges("connectors.RemoteLink")


def test_seed_002_create_attempt_state():
    assert SEED_002["Create Attempt State"] == edges("connectors.PushAttemptStatus")


@pytest.mark.parametrize("seed_name", sorted(SEED_004))
def test_seed_004_section_11_machines(seed_name):
    assert edges(f"flows.{seed_name}") == SEED_004[seed_name]
