from django.apps import AppConfig


class KernelConfig(AppConfig):
    """The shared mechanism (ARCHITECTURE.md section 2): no models, only operator commands.

    ``manage.py state_graph`` prints the state machines; ``manage.py
    reason_codes`` lists the closed reason codes and runs their evidence
    queries.
    """

    name = "nexusflow.kernel"
    label = "kernel"
    verbose_name = "NexusFlow kernel"
