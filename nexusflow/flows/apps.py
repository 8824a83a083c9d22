from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "nexusflow.flows"
    label = "flows"
    verbose_name = "Flow Runtime V2"

    def ready(self) -> None:
        from nexusflow.records.services import register_after_save, register_before_save

        from . import reasons, transitions  # noqa: F401  register the reason codes and state machines
        from .services import flow_before_save, flow_trigger_on_record_saved

        register_before_save(flow_before_save)
        register_after_save(flow_trigger_on_record_saved)
