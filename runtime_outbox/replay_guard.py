"""Runtime refuses outbound authoring from a replay execution (seed 003 "Replay and external effects").

A replay Execution carries its external-effect mode in the ExecutionRef
digest and in the Runtime command (``command["external_effects"]``). Runtime
applies such a command inside :func:`suppressed_external_effects`:

- while it runs, :func:`outbound_authoring_check` refuses every
  OutboundCommand (the synchronous path);
- every record version it writes is recorded as an immutable
  :class:`ReplayRecordWrite` (records after-save hook), so a Flow that the
  write triggered and that runs later, in its own transaction, is refused too
  (the FlowRun names the exact triggering record version).

Refusal is :class:`ReplayOutboundRefused` (code ``replay_outbound_refused``,
definite: retrying the same step can never succeed).

Which record version triggered a FlowRun is the Flow Runtime's fact: it
answers through :func:`register_flow_trigger_lookup` (``FlowsConfig.ready``).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.models import insert
from nexusflow.kernel.ports import Port
from nexusflow.kernel.rows import first_row
from nexusflow.kernel.scope import OrgScope

from .models import ReplayRecordWrite

#: The only external-effect mode a replay may carry.
SUPPRESS_EXTERNAL_EFFECTS = "suppress_external_effects"
#: Every mode Runtime understands; a command naming another one is refused.
REPLAY_MODES = frozenset({SUPPRESS_EXTERNAL_EFFECTS})


class ReplayOutboundRefused(NexusError):
    """An OutboundCommand was requested from a replay execution context."""

    code = "replay_outbound_refused"
    definite = True


class ReplayModeUnsupported(NexusError):
    """A command or request names an external-effect mode other than ``suppress_external_effects``."""

    code = "replay_mode_unsupported"
    definite = True
    http_status = 400


#: ``(*, org_id, flow_run_id) -> (object_name, record_key, record_version) | None``.
FlowTriggerLookup = Callable[..., "tuple[str, str, int] | None"]
_FLOW_TRIGGER: Port[FlowTriggerLookup] = Port("flow-run trigger lookup", provider="nexusflow.flows")


def register_flow_trigger_lookup(lookup: FlowTriggerLookup) -> None:
    """Install the one lookup of the record version that triggered a FlowRun.

    ``lookup(*, org_id, flow_run_id)`` returns ``(object name, record key,
    record version)`` of the run's trigger, or ``None`` when the org has no
    such run (or it was not record-triggered).

    Raises:
        PortAlreadyRegistered: another lookup is installed.
    """
    _FLOW_TRIGGER.register(lookup)


_ACTIVE: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("nexus_replay_context", default=None)


def require_replay_mode(mode: object) -> str:
    """Return ``mode`` when it is the one supported replay mode.

    Raises:
        ReplayModeUnsupported: any other value (including a missing one).
    """
    if not isinstance(mode, str) or mode not in REPLAY_MODES:
        raise ReplayModeUnsupported(f"external-effect mode {mode!r} is not supported; only "
                                    f"{SUPPRESS_EXTERNAL_EFFECTS} may replay")
    return mode


@contextlib.contextmanager
def suppressed_external_effects(*, org_id: str, command_id: str, mode: str) -> Iterator[None]:
    """Run the block as a replay execution context of ``command_id`` (org ``org_id``).

    Raises:
        ReplayModeUnsupported: ``mode`` is not ``suppress_external_effects``.
    """
    require_replay_mode(mode)
    token = _ACTIVE.set((org_id, command_id))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_replay_command() -> str | None:
    """The command id of the replay execution context this code runs in, else ``None``."""
    current = _ACTIVE.get()
    return current[1] if current else None


def record_replay_write(*, org: OrgScope, record, change) -> None:
    """Records after-save hook: remember a record version written in a replay execution context.

    Runs in the saving (application) transaction; does nothing outside a
    replay context. Idempotent per record version.
    """
    current = _ACTIVE.get()
    if current is None or current[0] != org.org_id:
        return
    exists = ReplayRecordWrite.objects.filter(org_id=org.org_id, object_name=record.object_name,
                                              record_key=record.record_key, record_version=record.version).exists()
    if not exists:
        insert(ReplayRecordWrite, org_id=org.org_id, object_name=record.object_name, record_key=record.record_key,
               record_version=record.version, command_id=current[1], external_effects=SUPPRESS_EXTERNAL_EFFECTS)


def outbound_authoring_check(*, org_id: str, origin_flow_run_id) -> None:
    """Refuse authoring when it comes from a replay execution context.

    Args:
        org_id: the trusted scope's org.
        origin_flow_run_id: the FlowRun that asks for the effect, or ``None``.

    Raises:
        ReplayOutboundRefused: this code runs inside a replay application
            command, or the FlowRun was triggered by a record version that a
            replay application command wrote.
        PortNotRegistered: a FlowRun is named and the Flow Runtime is not installed.
    """
    command_id = active_replay_command()
    if command_id is not None:
        raise ReplayOutboundRefused(f"replay command {command_id[:16]} cannot author an outbound command")
    if origin_flow_run_id is None:
        return
    trigger = _FLOW_TRIGGER.get()(org_id=org_id, flow_run_id=origin_flow_run_id)
    if trigger is None:
        return
    write = first_row(ReplayRecordWrite, org_id=org_id, object_name=trigger[0], record_key=trigger[1],
                      record_version=trigger[2])
    if write is not None:
        raise ReplayOutboundRefused(f"flow run {origin_flow_run_id} was triggered by replay command "
                                    f"{write.command_id[:16]}; it cannot author an outbound command")
