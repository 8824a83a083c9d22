"""Migrations connectors 0003 and flows 0003 backfill reason codes before adding the CHECKs.

Rows written before the migrations, in reason-required states without a code,
get the code of the one write path that produced them; a run's unregistered
handler code becomes ``flow_step_definite_refusal``.
"""
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

BEFORE = [("connectors", "0002_worker_role_length"), ("flows", "0002_plan_catalog_composite_reference")]
AFTER = [("connectors", "0003_reason_codes"), ("flows", "0003_reason_codes")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    return executor.migrate(targets)


def _latest():
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    return executor.loader.graph.leaf_nodes()


def test_backfill_gives_every_halted_row_its_code(client, serving_org):
    from connectors.models import AccountServingGate, RemoteEffect, RemoteLink
    from nexusflow.flows.models import FlowRun, FlowStepExecution
    from packs.hubspot.fixtures.make_demo_webhooks import OUTPUT_PATH
    from packs.hubspot.sender import load_deliveries
    from tests.conftest import drain, post_signed
    from tests.flows.conftest import Rows

    for delivery in load_deliveries(OUTPUT_PATH)[:6]:
        post_signed(client, delivery.body, sign=delivery.sign)
    drain()

    rows = Rows(serving_org.org)
    failed_run = rows.run("TerminalFailed")
    failed_step = rows.step("Failed", run=failed_run)
    gate = AccountServingGate.objects.order_by("id").first()
    try:
        _migrate(BEFORE)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE flows_flowrun SET terminal_cause_code = 'mapping_produced_no_body' WHERE id = %s",
                           [failed_run.pk])
            cursor.execute("UPDATE connectors_accountservinggate SET state = 'v1_drained' WHERE id = %s", [gate.pk])
            cursor.execute("UPDATE connectors_remotelink SET state = 'suspended_drift'")
            linked = cursor.rowcount
            cursor.execute("UPDATE connectors_remoteeffect SET state = 'uncertain', reason_code = ''")
            effects = cursor.rowcount
    finally:
        _migrate(AFTER)
        _migrate(_latest())  # later migrations (renames included) must hold for the tests that follow
    assert linked and effects
    assert FlowRun.objects.get(pk=failed_run.pk).reason_code == "flow_step_definite_refusal"
    assert FlowStepExecution.objects.get(pk=failed_step.pk).reason_code == "flow_step_definite_refusal"
    assert AccountServingGate.objects.get(pk=gate.pk).reason_code == "cutover_in_progress"
    assert set(RemoteLink.objects.values_list("reason_code", flat=True)) == {"remote_not_found"}
    assert set(RemoteEffect.objects.values_list("reason_code", flat=True)) == {"response_ambiguous"}
