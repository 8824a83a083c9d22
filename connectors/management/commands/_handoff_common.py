"""Shared exit codes and error mapping of the halt / handoff / successor commands.

Exit codes: 0 done; 1 bad input (unknown org or epoch, malformed id);
2 usage (argparse); 3 refused by the current state (nothing changed by the
refused step); 4 halting is still pending (open Permits or predecessor work).
"""
import json

from django.core.management.base import CommandError

from connectors.serving.handoff import REQUIRES_DRAIN, UnknownEpoch, UnknownOrg
from nexusflow.kernel.errors import InvalidIdentity

EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_PENDING = 1, 3, 4


def command_error(exc: Exception) -> CommandError:
    """Map a service error to a CommandError carrying its stable code and exit code."""
    if isinstance(exc, InvalidIdentity):
        return CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT)
    if isinstance(exc, (UnknownEpoch, UnknownOrg)):
        return CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT)
    return CommandError(f"{getattr(exc, 'code', 'error')}: {exc}", returncode=EXIT_REFUSED)


def add_successor_arguments(parser) -> None:
    """The arguments of the commands that act on one successor epoch."""
    parser.add_argument("--org", required=True, help="Org id.")
    parser.add_argument("--successor", required=True, type=int, help="Id of the verified successor ServingEpoch.")
    parser.add_argument("--transition-class", default=REQUIRES_DRAIN,
                        help="Successor transition class; only requires_drain is supported.")
    parser.add_argument("--compatibility-evidence", help="JSON file; recorded nowhere, enables nothing.")


def read_evidence(path: str | None):
    """Read an optional compatibility-evidence JSON file (it never enables another transition class)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise CommandError(f"cannot read {path}: {exc}", returncode=EXIT_BAD_INPUT) from exc
