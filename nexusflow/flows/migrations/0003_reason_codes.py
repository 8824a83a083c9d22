"""Every failed or quarantined run and step stores a closed reason code.

Seed 003, "Operational liveness and maintenance admission". ``FlowRun``'s
TerminalCauseCode column becomes ``reason_code`` (renamed, values kept);
steps and dependencies get the column. Before the CHECK constraints, existing
rows are backfilled from the only write paths that produced them:

- a ``TerminalFailed`` run whose code no Flow reason registers was ended by a
  definite refusal whose handler code was stored directly: it becomes
  ``flow_step_definite_refusal`` (the handler code stays on its attempts'
  ``safe_error_code``);
- a ``Failed`` or ``Quarantined`` step takes the code of its run, which moved
  in the same transaction.
"""

from django.db import migrations, models

# The Flow codes registered when this migration was written (frozen here on purpose).
FLOW_CODES = (
    "flow_trigger_record_deleted", "flow_effect_no_effect", "flow_step_retry_exhausted", "flow_step_definite_refusal",
    "flow_lease_expiry_exhausted", "flow_effect_quarantined", "flow_effect_receipt_missing",
    "flow_recovery_commit_evidence", "flow_handler_binding_mismatch",
)
DEFINITE_REFUSAL = "flow_step_definite_refusal"


def backfill_reason_codes(apps, schema_editor):
    FlowRun = apps.get_model("flows", "FlowRun")
    FlowStepExecution = apps.get_model("flows", "FlowStepExecution")
    db = schema_editor.connection.alias
    (FlowRun.objects.using(db).filter(state="TerminalFailed").exclude(reason_code__in=FLOW_CODES)
     .update(reason_code=DEFINITE_REFUSAL))
    halted = FlowStepExecution.objects.using(db).filter(state__in=("Failed", "Quarantined"), reason_code="")
    for step_id, run_code in halted.values_list("id", "run__reason_code"):
        FlowStepExecution.objects.using(db).filter(pk=step_id).update(reason_code=run_code or DEFINITE_REFUSAL)


class Migration(migrations.Migration):

    dependencies = [
        ('flows', '0002_plan_catalog_composite_reference'),
    ]

    operations = [
        migrations.RenameField(
            model_name='flowrun',
            old_name='terminal_cause_code',
            new_name='reason_code',
        ),
        migrations.AlterField(
            model_name='flowrun',
            name='reason_code',
            field=models.CharField(blank=True, default='', help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.", max_length=64),
        ),
        migrations.AddField(
            model_name='flowdependency',
            name='reason_code',
            field=models.CharField(blank=True, default='', help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.", max_length=64),
        ),
        migrations.AddField(
            model_name='flowstepexecution',
            name='reason_code',
            field=models.CharField(blank=True, default='', help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.", max_length=64),
        ),
        migrations.RunPython(backfill_reason_codes, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='flowdependency',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['rejected']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='flow_dependency_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='flowrun',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['Quarantined', 'TerminalFailed']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='flow_run_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='flowstepexecution',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['Failed', 'Quarantined']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='flow_step_reason_chk'),
        ),
    ]
