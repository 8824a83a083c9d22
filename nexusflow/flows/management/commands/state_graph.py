"""``manage.py state_graph APP.MODEL [--format text|dot]``: print a state machine.

Project-wide: imports every installed app's ``transitions`` module so each
machine registered with ``nexusflow.kernel.transitions.machine`` is known.
"""
from __future__ import annotations

import importlib

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError

from nexusflow.kernel.transitions import REGISTRY


def load_all_machines() -> dict:
    """Import ``<app>.transitions`` for every installed app and return the registry."""
    for config in apps.get_app_configs():
        module = f"{config.name}.transitions"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return REGISTRY


class Command(BaseCommand):
    help = "Print a registered state machine (states and transitions) as text or Graphviz dot."

    def add_arguments(self, parser):
        parser.add_argument("name", help='Machine name, e.g. "flows.FlowRun"; "list" prints every name.')
        parser.add_argument("--format", choices=("text", "dot"), default="text")

    def handle(self, *args, name: str, format: str, **options):
        registry = load_all_machines()
        if name == "list":
            self.stdout.write("\n".join(sorted(registry)))
            return
        machine = registry.get(name)
        if machine is None:
            known = ", ".join(sorted(registry)) or "(none)"
            raise CommandError(f"unknown state machine {name!r}; known: {known}", returncode=2)
        self.stdout.write(machine.to_dot() if format == "dot" else machine.to_text())
