"""Typed errors of the Flow Runtime; each ``code`` is stable and safe to show.

The compiler's :class:`Diagnostic` and :class:`CompileError` live here, at the
bottom of the app with the other errors, so the store, the catalog and the
runtime raise and catch them without importing the compiler.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nexusflow.kernel.errors import NexusError


@dataclass(frozen=True)
class Diagnostic:
    """One compiler finding; ``code`` is stable and machine-readable; warnings never block."""

    code: str
    element: str | None = None
    message: str = ""
    severity: str = "error"

    @property
    def family(self) -> str:
        return self.code.split(":", 1)[0]

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code, "element": self.element, "detail": self.message}

    def __str__(self) -> str:
        where = f" [{self.element}]" if self.element else ""
        return f"{self.code}{where}: {self.message}" if self.message else f"{self.code}{where}"


class CompileError(NexusError):
    """Compilation failed; ``diagnostics`` lists every stable blocking finding."""

    code = "flow_compile_failed"

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("; ".join(str(d) for d in self.diagnostics) or self.code)


class FlowAdmissionRejected(NexusError):
    """A saved record met an activation whose binding is not the request-bound view (seed 004 section 7.4)."""

    code = "flow_admission_rejected"


class WakeSignalRejected(NexusError):
    """No run with that id exists in the producer's complete trusted work scope."""

    code = "flow_wake_signal_rejected"


class WakeSignalConflict(NexusError):
    """The same (scope, run, dependency key) was already accepted with other evidence."""

    code = "flow_wake_signal_conflict"


class PlanMismatch(NexusError):
    """A persisted plan does not match its run, catalog or compiled identity."""

    code = "flow_plan_mismatch"


class ActivationRejected(CompileError):
    """The plan compiled but cannot be activated on this engine generation (seed 004 section 7.4).

    ``diagnostics`` carry ``engine_unsupported:*`` codes naming each blocker.
    """

    code = "flow_activation_rejected"


class CheckpointRejected(NexusError):
    """A checkpoint payload holds credential material or exceeds its size bound (seed 004 sections 10.4, 17.3).

    Definite: replaying the same input produces the same payload.
    """

    code = "flow_checkpoint_rejected"
    definite = True


class FlowRunNotFound(NexusError):
    """No run with that id in the trusted org (a FlowRunId-only lookup is never made)."""

    code = "flow_run_not_found"
    http_status = 404


class LateLockDiscovery(NexusError):
    """A step needs a business row outside its admitted lock plan (seed 004 section 13.3).

    ``resource`` is the ``[object_name, record_key]`` pair that was discovered.
    """

    code = "flow_late_lock_discovery"

    def __init__(self, message: str = "", *, resource: list[str] | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.resource = resource or []


class FlowExecutionError(NexusError):
    """A step's element graph cannot run (bad reference, budget exhausted); definite, never retried."""

    code = "flow_execution_error"
    definite = True


class FlowInputRejected(NexusError):
    """An operator start's inputs do not fit the active plan's input variables; nothing was written.

    Codes: ``flow_input_unknown`` (no input variable of that name),
    ``flow_input_type`` (the value does not fit the variable's data type or
    collection shape), ``flow_input_missing`` (a scalar input was not given),
    ``flow_input_record_missing`` (a record input names no live record of its
    object in the org).
    """

    code = "flow_input_rejected"
    definite = True


class FlowNotStartable(NexusError):
    """No active autolaunched plan of that Flow in the org (record-triggered flows start from saves)."""

    code = "flow_not_startable"
    definite = True


class FlowStartConflict(NexusError):
    """The request id already started a run of that Flow with other inputs."""

    code = "flow_start_conflict"
    definite = True


class WaitSignalRefused(NexusError):
    """An operator's signal names a producer that takes none, or a run that does not wait on it (seed 004 14.1)."""

    code = "flow_wait_signal_refused"
