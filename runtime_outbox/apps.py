from django.apps import AppConfig


class RuntimeOutboxConfig(AppConfig):
    name = "runtime_outbox"
    verbose_name = "Runtime outbox"

    def ready(self):
        from django.core import checks

        from nexusflow.records.services import DELETE_STAGE_OWNER_WORK, register_after_save, register_before_delete

        from .messages import check_every_family_consumed
        from .owner import owner_before_delete
        from .replay_guard import record_replay_write

        register_after_save(record_replay_write)
        # Seed 000: the owner work check runs first in every record deletion, before remote links.
        register_before_delete(owner_before_delete, stage=DELETE_STAGE_OWNER_WORK)
        # Every declared message family has its one consumer once all apps are ready (``manage.py check``).
        checks.register(check_every_family_consumed)
