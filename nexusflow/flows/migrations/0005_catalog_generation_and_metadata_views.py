"""Catalog generations under their seed name; RuntimeMetadataView artifacts; activation bindings.

Seed 004 sections 7.4 and 8.4: the catalog artifact is ``FlowActionCatalogGeneration``;
a plan references its content-addressed ``RuntimeMetadataView`` through
``(org_id, metadata_view_digest)`` with ``ON DELETE RESTRICT``. Plans written
before this migration get a view row holding an empty schema (the schema they
were compiled against was not stored), marked ``{"backfilled": true}``.
"""

import django.db.models.deletion
from django.db import migrations, models

import nexusflow.kernel.identity
import nexusflow.kernel.models

FORWARD_FK = (
    "ALTER TABLE `flows_flowexecutionplan` ADD CONSTRAINT `flow_plan_metadata_view_fk` "
    "FOREIGN KEY (`org_id`, `metadata_view_digest`) "
    "REFERENCES `flows_flowruntimemetadataview` (`org_id`, `view_digest`) ON DELETE RESTRICT ON UPDATE RESTRICT"
)
BACKWARD_FK = "ALTER TABLE `flows_flowexecutionplan` DROP FOREIGN KEY `flow_plan_metadata_view_fk`"


def backfill_views(apps, schema_editor):
    """One view row per (org, view digest) already referenced by a plan, and activation bindings."""
    from django.utils import timezone

    plan_model = apps.get_model("flows", "FlowExecutionPlan")
    view_model = apps.get_model("flows", "FlowRuntimeMetadataView")
    activation_model = apps.get_model("flows", "FlowActivation")
    db = schema_editor.connection.alias
    pairs = set(plan_model.objects.using(db).values_list("org_id", "metadata_view_digest"))
    for org_id, digest in sorted(pairs):
        view_model.objects.using(db).bulk_create([view_model(
            org_id=org_id, view_digest=digest, digest_profile="nexuscrm.connector-digest-profile.v2",
            objects_payload={"backfilled": True}, created_at=timezone.now())])
    for plan in plan_model.objects.using(db).all():
        view = view_model.objects.using(db).get(org_id=plan.org_id, view_digest=plan.metadata_view_digest)
        plan_model.objects.using(db).filter(org_id=plan.org_id, pk=plan.pk).update(metadata_view_id=view.pk)
        activation_model.objects.using(db).filter(org_id=plan.org_id, plan_id=plan.pk).update(
            runtime_work_binding_digest=plan.runtime_work_binding_digest,
            trigger_binding_digest=plan.trigger_binding_digest)


class Migration(migrations.Migration):

    dependencies = [
        ('flows', '0004_typed_ids'),
    ]

    operations = [
        migrations.RenameModel(
            old_name='FlowActionCapabilityCatalog',
            new_name='FlowActionCatalogGeneration',
        ),
        migrations.AddField(
            model_name='flowactivation',
            name='runtime_work_binding_digest',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64, null=True),
        ),
        migrations.AddField(
            model_name='flowactivation',
            name='trigger_binding_digest',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64, null=True),
        ),
        migrations.CreateModel(
            name='FlowRuntimeMetadataView',
            fields=[
                ('id', nexusflow.kernel.models.TypedIdField(primary_key=True, serialize=False)),
                ('org_id', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64)),
                ('view_digest', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64)),
                ('digest_profile', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64)),
                ('objects_payload', models.JSONField(help_text='Object and field schema of the view, as compiled against.')),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('org_id', 'view_digest'), name='flow_metadata_view_uniq')],
            },
        ),
        migrations.AddField(
            model_name='flowexecutionplan',
            name='metadata_view',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='plans',
                                    to='flows.flowruntimemetadataview'),
        ),
        migrations.RunPython(backfill_views, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='flowexecutionplan',
            name='metadata_view',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='plans',
                                    to='flows.flowruntimemetadataview'),
        ),
        migrations.RunSQL(FORWARD_FK, reverse_sql=BACKWARD_FK),
    ]
