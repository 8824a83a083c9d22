"""Shared file handling for the Flow management commands."""
from __future__ import annotations

from pathlib import Path

from nexusflow.flows.inventory import FLOW_SUFFIX, flow_api_name_of  # one naming rule


def expand(paths: list[str]) -> list[Path]:
    """Expand directories to their ``*.flow-meta.xml`` files, sorted; keep files as given."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out.extend(sorted(p.glob(f"*{FLOW_SUFFIX}")))
        else:
            out.append(p)
    return out


def read_flow_files(paths: list[str], stderr) -> tuple[list[tuple[Path, str, bytes]], int]:
    """Read every Flow file named by ``paths`` (directories expanded).

    Returns:
        ``([(path, flow_api_name, source_bytes), ...], unreadable_count)``;
        each unreadable file is reported on ``stderr``.
    """
    files: list[tuple[Path, str, bytes]] = []
    failed = 0
    for path in expand(paths):
        try:
            files.append((path, flow_api_name_of(path), path.read_bytes()))
        except OSError as exc:
            stderr.write(f"{path}: cannot read: {exc.strerror}")
            failed += 1
    return files, failed
