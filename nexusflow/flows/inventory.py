"""Compile-only inventory of a folder of Flow metadata files (seed 004 section 20.4).

:func:`flow_inventory` compiles every ``*.flow-meta.xml`` file of a folder
without executing anything or touching the database and returns one
:class:`InventoryRow` per file: selected profile or the precise rejection
reasons, unknown capabilities, loop and fan-out proof, step count, the
section 20.7 migration cohort, and whether this engine generation would
activate and run it (``runs``; else its ``blockers``: the compile refusal,
or the activation gate's ``engine_unsupported:*`` diagnostics). Subflow elements resolve against the other
files of the same folder (by Flow API name). A file that cannot be read or
parsed is a rejection with a reason, never a crash.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nexusflow.records.metadata import MetadataView, current_view

from .binding import flow_runtime_binding
from .catalog import CatalogSnapshot, catalog_current
from .compiler import analyze_flow
from .handlers import compiled_subflow_payloads, engine_support_diagnostics

FLOW_SUFFIX = ".flow-meta.xml"
#: Compile-only checks need a trusted org for the binding; it is never persisted and names no tenant.
CHECK_ORG = "compile-check"


def flow_api_name_of(path: Path | str) -> str:
    """``Foo.flow-meta.xml`` -> ``Foo``; ``owner__repo__Foo.flow-meta.xml`` -> ``Foo``.

    Flow API names never hold two consecutive underscores, so a ``__``
    prefix is provenance (how collected files are named), not part of the name.
    """
    name = Path(path).name
    stem = name[: -len(FLOW_SUFFIX)] if name.endswith(FLOW_SUFFIX) else name.split(".", 1)[0]
    return stem.rsplit("__", 1)[-1]


#: Why a file does not run, by blocker code prefix (first match wins; ``engine`` otherwise): what the issue of
#: record says a refusal may be for. ``screens``: a screen flow or a UI component; ``org_capability``: an org's own
#: Apex, Slack or prompt capability that is not in the sealed catalog; ``process_type``: Orchestrator,
#: Process Builder or workflow processes; ``broken_metadata``: a reference to something the file or its
#: folder does not define; ``engine``: a Flow feature this engine generation does not run yet.
REFUSAL_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("screens", ("unsupported_element:screens", "unsupported_process_type:Flow", "unknown_action:component:")),
    ("process_type", ("unsupported_process_type:Orchestrator", "unsupported_process_type:Workflow",
                      "unsupported_process_type:InvocableProcess", "unsupported_element:orchestrated")),
    ("org_capability", ("unknown_action:apex:", "unknown_action:slack", "unsupported_process_type:PromptFlow",
                        "unsupported_trigger_type:Capability", "unsupported_start:capabilityTypes",
                        "unsupported_reference:$Input", "unsupported_reference:$Output")),
    ("broken_metadata", ("unresolved_reference:", "unknown_subflow:", "unresolved_packaging_token",
                         "unknown_action:flow:")),
)


def refusal_class(code: str) -> str:
    """The :data:`REFUSAL_CLASSES` class of one blocker ``code``."""
    for name, prefixes in REFUSAL_CLASSES:
        if code.startswith(prefixes):
            return name
    return "engine"


@dataclass
class InventoryRow:
    """One file's compile-only result; :meth:`as_json` is the ``--json`` object."""

    file: str
    flow: str
    profile: str | None
    reasons: list[dict[str, Any]]
    unknown_capabilities: list[str]
    steps: int
    cohort: int
    loops: list[dict[str, Any]] = field(default_factory=list)
    fan_out: str = "bounded"
    warnings: list[dict[str, Any]] = field(default_factory=list)
    plan_digest: str | None = None
    #: Would this engine generation activate and run it (:func:`..handlers.engine_support_diagnostics`)?
    runs: bool = False
    #: Why not: ``[{"code", "element", "detail"}]`` (empty when it runs).
    blockers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rejected(self) -> bool:
        return self.profile is None

    @property
    def refused_for(self) -> list[str]:
        """The classes of its blockers (:func:`refusal_class`), sorted; empty when it runs."""
        return sorted({refusal_class(b["code"]) for b in self.blockers})

    def as_json(self, *, detail: bool = False) -> dict[str, Any]:
        out = {
            "file": self.file, "flow": self.flow, "profile": self.profile, "rejected": self.rejected,
            "reasons": self.reasons, "unknown_capabilities": self.unknown_capabilities, "steps": self.steps,
            "cohort": self.cohort, "runs": self.runs, "blockers": self.blockers, "refused_for": self.refused_for,
        }
        if detail:
            out.update(loops=self.loops, fan_out=self.fan_out, warnings=self.warnings, plan_digest=self.plan_digest)
        return out


def flow_inventory(directory: str, *, schema: str = "open", view: MetadataView | None = None,
                   catalog: CatalogSnapshot | None = None) -> list[InventoryRow]:
    """Compile every ``*.flow-meta.xml`` under ``directory`` (not recursive), sorted by file name.

    Args:
        directory: the folder as given by the operator; each row's ``file`` is
            ``os.path.join(directory, name)``.
        schema: ``"open"`` (default: objects and fields are not checked against
            this deployment's metadata view) or ``"strict"``.
        view / catalog: override the metadata view and the sealed catalog
            (default: this process's view and the shipped catalog).

    Raises:
        NotADirectoryError: ``directory`` is not a folder.
    """
    if not os.path.isdir(directory):
        raise NotADirectoryError(directory)
    view = view or current_view()
    if catalog is None:
        catalog = catalog_current(binding=flow_runtime_binding(org_id=CHECK_ORG, metadata_view_digest=view.digest))
    names = sorted(n for n in os.listdir(directory) if n.endswith(FLOW_SUFFIX))
    sources: dict[str, bytes] = {}
    unreadable: dict[str, str] = {}
    for name in names:
        try:
            sources[name] = Path(directory, name).read_bytes()
        except OSError as exc:
            unreadable[name] = exc.strerror or type(exc).__name__
    by_api = {flow_api_name_of(n): src for n, src in sources.items()}
    rows: list[InventoryRow] = []
    for name in names:
        file = os.path.join(directory, name)
        flow = flow_api_name_of(name)
        if name in unreadable:
            reasons = [{"code": "unreadable", "element": None, "detail": unreadable[name]}]
            rows.append(InventoryRow(file=file, flow=flow, profile=None, unknown_capabilities=[], steps=0, cohort=1,
                                     reasons=reasons, blockers=reasons))
            continue
        result = analyze_flow(source=sources[name], flow_api_name=flow, catalog=catalog, view=view,
                              subflows=by_api, schema=schema)
        reasons = [d.as_json() for d in result.errors]
        blockers = reasons if result.plan is None else [
            d.as_json() for d in engine_support_diagnostics(result.plan.payload, catalog,
                                                            compiled_subflow_payloads(result.plan))]
        rows.append(InventoryRow(
            file=file, flow=flow, profile=None if result.rejected else result.profile, runs=not blockers,
            blockers=blockers, reasons=reasons, unknown_capabilities=list(result.unknown_capabilities),
            steps=result.steps, cohort=result.cohort, loops=result.loops, fan_out=result.fan_out,
            warnings=[d.as_json() for d in result.diagnostics if d.severity != "error"],
            plan_digest=result.plan.plan_digest if result.plan is not None else None,
        ))
    return rows
