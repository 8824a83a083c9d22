"""``manage.py state_graph APP.MODEL [--format text|dot]``: print a state machine.

Project-wide: every installed app's ``transitions`` module is imported, so each
machine registered with ``nexusflow.kernel.transitions.machine`` is known.
``list`` prints every machine with the store that persists it.
"""
from __future__ import annotations

from django.core.management.base import CommandError

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.store import load_all_stores
from nexusflow.kernel.transitions import load_all_machines


class Command(OperatorCommand):
    help = "Print a registered state machine (states and transitions) as text or Graphviz dot."

    def add_arguments(self, parser):
        parser.add_argument("name", help='Machine name, e.g. "flows.FlowRun"; "list" prints every name.')
        parser.add_argument("--format", choices=("text", "dot"), default="text")

    def handle(self, *args, name: str, format: str, **options):
        registry = load_all_machines()
        stores = load_all_stores()
        if name == "list":
            for key in sorted(registry):
                store = stores.get(key)
                where = f"{store.__module__}.{store.__qualname__}" if store else "table only (no store yet)"
                count = len(registry[key].pairs())
                self.stdout.write(f"{key}\t{count} transition{'' if count == 1 else 's'}\t{where}")
            return
        machine = registry.get(name)
        if machine is None:
            close = [k for k in sorted(registry) if k.split(".")[-1].lower() == name.split(".")[-1].lower()]
            hint = f"did you mean {', '.join(close)}?" if close else "`manage.py state_graph list` names them all"
            raise CommandError(f"unknown state machine {name!r}; {hint}", returncode=2)
        self.stdout.write(machine.to_dot() if format == "dot" else machine.to_text())
