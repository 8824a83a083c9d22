"""Complete durable executor (seed 004 sections 10.1-10.4, 13.3, 18.2).

Adds the legacy status projection of every existing root (derived from its
canonical state before the CHECK that keeps them equal is installed), the
attempt's lock plan and metrics, and the append-only Flow audit table.
"""

import django.db.models.deletion
from django.db import migrations, models

import nexusflow.kernel.identity
import nexusflow.kernel.models


class Migration(migrations.Migration):

    dependencies = [
        ('flows', '0005_catalog_generation_and_metadata_views'),
    ]

    operations = [
        migrations.CreateModel(
            name='FlowAuditEvent',
            fields=[
                ('id', nexusflow.kernel.models.TypedIdField(primary_key=True, serialize=False)),
                ('org_id', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64)),
                ('event', models.CharField(max_length=48)),
                ('detail', models.JSONField(default=dict)),
                ('created_at', models.DateTimeField()),
            ],
        ),
        migrations.AddField(
            model_name='flowrun',
            name='legacy_status',
            field=models.CharField(default='Running', max_length=16),
        ),
        migrations.AddField(
            model_name='flowstepattempt',
            name='lock_plan',
            field=models.JSONField(default=list),
        ),
        migrations.AddField(
            model_name='flowstepattempt',
            name='lock_plan_digest',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64, null=True),
        ),
        migrations.AddField(
            model_name='flowstepattempt',
            name='metrics_summary',
            field=models.JSONField(default=dict),
        ),
        migrations.RunSQL(
            sql=("UPDATE flows_flowrun SET legacy_status = CASE "
                 "WHEN state = 'Waiting' THEN 'Paused' WHEN state = 'Succeeded' THEN 'Finished' "
                 "WHEN state IN ('TerminalFailed', 'Quarantined', 'Cancelled') THEN 'Error' ELSE 'Running' END"),
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AddConstraint(
            model_name='flowrun',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('legacy_status', 'Error'), ('state__in', ['Cancelled', 'Quarantined', 'TerminalFailed'])), models.Q(('legacy_status', 'Finished'), ('state__in', ['Succeeded'])), models.Q(('legacy_status', 'Paused'), ('state__in', ['Waiting'])), models.Q(('legacy_status', 'Running'), ('state__in', ['Accepted', 'CancelRequested', 'Runnable', 'Running'])), _connector='OR'), name='flow_run_legacy_projection_chk'),
        ),
        migrations.AddField(
            model_name='flowauditevent',
            name='attempt',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='flows.flowstepattempt'),
        ),
        migrations.AddField(
            model_name='flowauditevent',
            name='run',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='audit_events', to='flows.flowrun'),
        ),
        migrations.AddField(
            model_name='flowauditevent',
            name='step',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='flows.flowstepexecution'),
        ),
        migrations.AddIndex(
            model_name='flowauditevent',
            index=models.Index(fields=['org_id', 'run', 'id'], name='flow_audit_run_idx'),
        ),
    ]
