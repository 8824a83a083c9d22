from django.apps import AppConfig


class ConnectorsConfig(AppConfig):
    name = "connectors"
    verbose_name = "Connector V2"

    def ready(self) -> None:
        from nexusflow.records.services import DELETE_STAGE_REMOTE_LINKS, register_before_delete
        from runtime_outbox.messages import FLOW_EFFECT_SUBMIT, OUTBOUND_COMMAND, register_consumer
        from runtime_outbox.services import no_effect_reasons_declare

        from . import reasons
        from .inbox import outbound_message_accept
        from .source_deletion import links_before_source_delete

        # Seed 000: after Runtime's owner work check, a deleted source's push links stop being PATCH authority.
        register_before_delete(links_before_source_delete, stage=DELETE_STAGE_REMOTE_LINKS)
        # The definite refusals this connector may settle as a NO_EFFECT Runtime result (seed 000).
        no_effect_reasons_declare(owner="connectors", reasons=reasons.NO_EFFECT_REASONS)
        # The effect owner's inbox for both command families (ARCHITECTURE.md section 2, "Runtime message families").
        register_consumer(OUTBOUND_COMMAND, outbound_message_accept)
        register_consumer(FLOW_EFFECT_SUBMIT, outbound_message_accept)
