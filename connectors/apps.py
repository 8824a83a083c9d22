from django.apps import AppConfig


class ConnectorsConfig(AppConfig):
    name = "connectors"
    verbose_name = "Connector V2"

    def ready(self) -> None:
        from connectors import reasons, selectors, worker_roles, workers
        from connectors.links import identity_transfer as link_transfer
        from connectors.links.link_keys import inbound_link_create, inbound_link_find, record_links_describe
        from connectors.links.source_deletion import links_before_source_delete
        from connectors.metrics import connector_families
        from connectors.outbound.inbox import outbound_message_accept
        from connectors.runtime_answers import (
            delivery_contract_for,
            freeze_push_binding,
            no_effect_unsettled_attempt,
            predecessor_effect_read,
        )
        from connectors.v1 import selectors as v1_selectors
        from connectors.v1 import worker_roles as v1_worker_roles
        from nexusflow.kernel.metrics import register_families
        from nexusflow.kernel.pressure import register_queue_age
        from nexusflow.kernel.workers import (
            register_open_work,
            register_reconciler,
            register_role,
            register_worker_processes,
        )
        from nexusflow.records.remote_links import RemoteLinks, register_remote_links
        from nexusflow.records.services import DELETE_STAGE_REMOTE_LINKS, register_before_delete
        from runtime_outbox import ports as runtime_ports
        from runtime_outbox.messages import FLOW_EFFECT_SUBMIT, OUTBOUND_COMMAND, register_consumer
        from runtime_outbox.services import no_effect_reasons_declare

        register_queue_age("connectors", selectors.execution_oldest_ready)
        # Seed 000: after Runtime's owner work check, a deleted source's push links stop being PATCH authority.
        register_before_delete(links_before_source_delete, stage=DELETE_STAGE_REMOTE_LINKS)
        # Identity transfer moves the records' remote links; the support view lists them.
        register_remote_links(RemoteLinks(lock=link_transfer.links_lock, plan=link_transfer.links_plan,
                                          apply=link_transfer.links_apply,
                                          validate_replay=link_transfer.links_validate_replay,
                                          describe=record_links_describe))
        # The definite refusals this connector may settle as a NO_EFFECT Runtime result (seed 000).
        no_effect_reasons_declare(owner="connectors", reasons=reasons.NO_EFFECT_REASONS)
        # What the Runtime asks the effect owner (runtime_outbox/ports.py).
        runtime_ports.register_push_binding_freezer(freeze_push_binding)
        runtime_ports.register_no_effect_proof(no_effect_unsettled_attempt)
        runtime_ports.register_delivery_contract(delivery_contract_for)
        runtime_ports.register_predecessor_effect(predecessor_effect_read)
        runtime_ports.register_inbound_links(find=inbound_link_find, create=inbound_link_create)
        # Workers: the process registry every holder names, the roles and their open work.
        register_worker_processes(register=workers.register_worker,
                                  termination_proof=workers.holder_termination_proof)
        register_role("connector", worker_roles.connector_units, order=10)
        register_role("egress", worker_roles.egress_units, order=40)
        register_role("egress-deferred", worker_roles.egress_deferred_units, order=50, in_all=False)
        register_role("stream", worker_roles.stream_units, order=60)
        # The maintenance/reconciliation units qcluster may run as schedules (nexusflow/kernel/schedules.py).
        for unit in ("receipt.reconcile", "window.close", "dependency.expire", "execution.recover"):
            register_reconciler(unit, role="connector")
        for unit in ("permit.abandon", "effect.reconcile"):
            register_reconciler(unit, role="egress")
        # The V1 runtime being retired: never part of ``--role all`` (V1 and V2 claimants never run together).
        register_role("v1", v1_worker_roles.v1_units, order=70, in_all=False)
        register_families("connectors", connector_families)
        register_open_work("executions", selectors.executions_open_count)
        register_open_work("effects", selectors.effects_open_count)
        register_open_work("permits", selectors.permits_open_count)
        register_open_work("uncertain_effects", selectors.effects_uncertain_count, parked=True)
        register_open_work("reconcilable", selectors.effects_create_conflict_count, parked=True)
        register_open_work("v1_events", v1_selectors.v1_events_open_count, parked=True)
        register_open_work("v1_calls", v1_selectors.v1_calls_unsettled_count, parked=True)
        # The effect owner's inbox for both command families (ARCHITECTURE.md section 2, "Runtime message families").
        register_consumer(OUTBOUND_COMMAND, outbound_message_accept)
        register_consumer(FLOW_EFFECT_SUBMIT, outbound_message_accept)
