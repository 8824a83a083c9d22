from django.apps import AppConfig


class RuntimeOutboxConfig(AppConfig):
    name = "runtime_outbox"
    verbose_name = "Runtime outbox"

    def ready(self):
        from django.core import checks

        from nexusflow.kernel.commands import MESSAGE_FAMILY_CHECK
        from nexusflow.kernel.metrics import register_families
        from nexusflow.kernel.workers import register_open_work, register_reconciler, register_role
        from nexusflow.records.owner import register_owner_work
        from nexusflow.records.services import DELETE_STAGE_OWNER_WORK, register_after_save, register_before_delete

        from .command_inbox import command_handoff_accept
        from .messages import RUNTIME_COMMAND_HANDOFF, check_every_family_consumed, register_consumer
        from .metrics import admission_families, outbox_families
        from .owner import owner_before_delete, owner_intents_read, owner_work_check
        from .replay_guard import record_replay_write
        from .selectors import outbox_pending_count
        from .workers import runtime_units

        register_after_save(record_replay_write)
        # Seed 000: the owner work check runs first in every record deletion, before remote links.
        register_before_delete(owner_before_delete, stage=DELETE_STAGE_OWNER_WORK)
        # Identity transfer and the record support view ask for the owner's intents.
        register_owner_work(check=owner_work_check, read=owner_intents_read)
        register_role("runtime", runtime_units, order=20)
        register_reconciler("outbox.reconcile", role="runtime")
        register_open_work("outbox", outbox_pending_count)
        register_families("runtime_outbox", outbox_families)
        register_families("admission", admission_families)
        # The durable Runtime command inbox: V1's RuntimeCommandHandoff (runtime_outbox/command_inbox.py).
        register_consumer(RUNTIME_COMMAND_HANDOFF, command_handoff_accept)
        # Every declared message family has its one consumer once all apps are ready (``manage.py check``).
        checks.register(check_every_family_consumed, MESSAGE_FAMILY_CHECK)
