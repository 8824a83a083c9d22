from django.apps import AppConfig


class RuntimeOutboxConfig(AppConfig):
    name = "runtime_outbox"
    verbose_name = "Runtime outbox"

    def ready(self):
        from nexusflow.records.services import register_after_save

        from .replay_guard import record_replay_write

        register_after_save(record_replay_write)
