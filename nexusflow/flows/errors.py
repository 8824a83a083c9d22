"""Typed errors of the Flow Runtime; each ``code`` is stable and safe to show."""
from nexusflow.kernel.errors import NexusError

from .compiler import CompileError


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
