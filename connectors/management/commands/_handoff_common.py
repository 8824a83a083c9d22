"""Shared exit codes and error mapping of the halt / handoff / successor commands.

Exit codes: 0 done; 1 bad input (unknown org or epoch, malformed id);
2 usage (argparse); 3 refused by the current state (nothing changed by the
refused step); 4 halting is still pending (open Permits or predecessor work).
"""
from django.core.management.base import CommandError

from connectors.handoff import UnknownEpoch
from nexusflow.kernel.errors import InvalidIdentity

EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_PENDING = 1, 3, 4


def command_error(exc: Exception) -> CommandError:
    """Map a service error to a CommandError carrying its stable code and exit code."""
    if isinstance(exc, InvalidIdentity):
        return CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT)
    if isinstance(exc, UnknownEpoch):
        return CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT)
    return CommandError(f"{getattr(exc, 'code', 'error')}: {exc}", returncode=EXIT_REFUSED)
