"""Halted, quarantined and refused connector rows store a closed reason code.

Seed 003, "Operational liveness and maintenance admission". Adds
``reason_code`` to gates, epochs, credential gates and links, and a CHECK per
model that the reason-required states (``connectors/transitions.py``) carry a
non-empty code. Existing rows are backfilled first from the one write path
that could have produced each of them:

- a gate in a non-serving state was walked there by the greenfield cutover:
  ``cutover_in_progress``;
- a ``rejected`` epoch failed owner verification: ``epoch_owner_mismatch``;
- a ``suspended_drift`` link got a 404 on PATCH: ``remote_not_found``;
- an ``uncertain`` effect without a code followed a timeout or a retryable
  status: ``response_ambiguous``.
"""

from django.db import migrations, models

BACKFILL = (
    ("AccountServingGate", ("halting_v1", "v1_stopped", "v1_drained", "v2_validating", "halting_v2", "v2_halted"),
     "cutover_in_progress"),
    ("ServingEpoch", ("rejected",), "epoch_owner_mismatch"),
    ("RemoteLink", ("suspended_drift",), "remote_not_found"),
    ("RemoteEffect", ("uncertain",), "response_ambiguous"),
)


def backfill_reason_codes(apps, schema_editor):
    db = schema_editor.connection.alias
    for model_name, states, code in BACKFILL:
        model = apps.get_model("connectors", model_name)
        model.objects.using(db).filter(state__in=states, reason_code="").update(reason_code=code)


class Migration(migrations.Migration):

    dependencies = [
        ('connectors', '0002_worker_role_length'),
        ('runtime_outbox', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='accountservinggate',
            name='reason_code',
            field=models.CharField(blank=True, default='', help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.", max_length=64),
        ),
        migrations.AddField(
            model_name='credentialgenerationdispatchgate',
            name='reason_code',
            field=models.CharField(blank=True, default='', help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.", max_length=64),
        ),
        migrations.AddField(
            model_name='remotelink',
            name='reason_code',
            field=models.CharField(blank=True, default='', help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.", max_length=64),
        ),
        migrations.AddField(
            model_name='servingepoch',
            name='reason_code',
            field=models.CharField(blank=True, default='', help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.", max_length=64),
        ),
        migrations.RunPython(backfill_reason_codes, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='accountservinggate',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['halting_v1', 'halting_v2', 'v1_drained', 'v1_stopped', 'v2_halted', 'v2_validating']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='account_gate_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='credentialgenerationdispatchgate',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['revoked']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='credential_gate_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='execution',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['quarantined', 'superseded']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='execution_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='receiptcomponent',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('disposition', 'quarantined'), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='receipt_component_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='remoteeffect',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['no_effect', 'quarantined', 'uncertain']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='remote_effect_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='remotelink',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['suspended_drift']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='remote_link_reason_chk'),
        ),
        migrations.AddConstraint(
            model_name='servingepoch',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state__in', ['rejected']), _negated=True), models.Q(('reason_code', ''), _negated=True), _connector='OR'), name='serving_epoch_reason_chk'),
        ),
    ]
