from django.apps import AppConfig


class KernelConfig(AppConfig):
    """The shared mechanism (ARCHITECTURE.md section 2): no models, only operator commands.

    ``manage.py state_graph`` prints the state machines; ``manage.py
    reason_codes`` lists the closed reason codes and runs their evidence
    queries. The system check ``kernel.E001`` keeps the managed substrate
    (:mod:`nexusflow.kernel.substrate`) out of every generic CRUD surface.
    """

    name = "nexusflow.kernel"
    label = "kernel"
    verbose_name = "NexusFlow kernel"

    def ready(self):
        # Registers the managed-substrate system check (kernel.E001).
        from . import substrate  # noqa: F401 - importing registers the check
