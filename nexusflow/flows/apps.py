from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "nexusflow.flows"
    label = "flows"
    verbose_name = "Flow Runtime V2"

    def ready(self) -> None:
        from nexusflow.kernel.metrics import register_families
        from nexusflow.kernel.pressure import register_queue_age
        from nexusflow.kernel.workers import register_open_work, register_reconciler, register_role
        from nexusflow.records.services import (
            DELETE_STAGE_FLOW_WAITS,
            register_after_save,
            register_before_delete,
            register_before_save,
        )
        from runtime_outbox.handoff import register_handoff_finalizer
        from runtime_outbox.messages import INTENT_COMPLETED, register_consumer
        from runtime_outbox.replay_guard import register_flow_trigger_lookup

        from . import reasons, transitions  # noqa: F401  register the reason codes and state machines
        from .inbox import intent_completed_accept
        from .metrics import flow_families
        from .selectors import flow_oldest_due, flow_run_trigger, flow_runs_nonterminal_count
        from .services import effect_handoff_finalize, flow_before_save, flow_trigger_on_record_saved
        from .services.admission import flow_trigger_on_record_deleting
        from .services.subflows import subflow_run_ended
        from .services.wait_resolution import scheduled_paths_before_delete
        from .services.waits import record_deleting_signal, record_saved_signal
        from .store import register_run_ended
        from .workers import flow_units

        register_queue_age("flows", flow_oldest_due)
        register_before_save(flow_before_save)
        # A save signals the runs whose Wait element watches its record (producer record.condition), before
        # admission, so the runs it admits are not signalled by their own admitting save.
        register_after_save(record_saved_signal)
        register_after_save(flow_trigger_on_record_saved)
        # A record being deleted withdraws its scheduled paths still waiting for their time.
        register_before_delete(scheduled_paths_before_delete, stage=DELETE_STAGE_FLOW_WAITS)
        # ... and signals each run whose Wait element watches it (producer record.condition).
        register_before_delete(record_deleting_signal, stage=DELETE_STAGE_FLOW_WAITS)
        # ... and admits the runs of delete-triggered flows (RecordBeforeDelete) on it.
        register_before_delete(flow_trigger_on_record_deleting, stage=DELETE_STAGE_FLOW_WAITS)
        # The replay guard asks which record version triggered a run.
        register_flow_trigger_lookup(flow_run_trigger)
        register_role("flow", flow_units, order=30)
        register_families("flows", flow_families)
        for unit in ("flow.recover", "flow.expire", "flow.repair", "flow.cancel_cleanup"):
            register_reconciler(unit, role="flow")
        register_open_work("flow_runs", flow_runs_nonterminal_count)
        # A completed Runtime intent wakes its Flow through the message boundary (seed 004 sections 14.2, 15.2).
        register_consumer(INTENT_COMPLETED, intent_completed_accept)
        # A flow.effect.submit handoff the owner rejected (or whose acceptance stayed unknown) ends its wait
        # root-first before the Runtime marks the message terminal (seed 004 section 15.4).
        register_handoff_finalizer(effect_handoff_finalize)
        # A subflow's child run, ending, wakes the parent step waiting on it (producer ``subflow``).
        register_run_ended(subflow_run_ended)
        # A runtime policy generation that changes plan-eligibility bounds recompiles the active Flows it covers.
        from runtime_outbox.policy import register_policy_published

        from .services.policy_recompile import flow_plans_recompile

        register_policy_published(flow_plans_recompile)
