from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "nexusflow.flows"
    label = "flows"
    verbose_name = "Flow Runtime V2"

    def ready(self) -> None:
        from nexusflow.records.services import register_after_save, register_before_save
        from runtime_outbox.messages import INTENT_COMPLETED, register_consumer

        from . import reasons, transitions  # noqa: F401  register the reason codes and state machines
        from .inbox import intent_completed_accept
        from .services import flow_before_save, flow_trigger_on_record_saved

        register_before_save(flow_before_save)
        register_after_save(flow_trigger_on_record_saved)
        # A completed Runtime intent wakes its Flow through the message boundary (seed 004 sections 14.2, 15.2).
        register_consumer(INTENT_COMPLETED, intent_completed_accept)
