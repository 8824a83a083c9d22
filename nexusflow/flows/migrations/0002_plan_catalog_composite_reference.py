"""Enforce the plan-to-catalog composite reference of seed 004 section 7.4.

Every component of ``(OrgID, AppInstallationID, RuntimeCapabilityID,
RuntimeWorkBindingDigest, CatalogGenerationId, CatalogDigest)`` must match the
referenced generation, and a referenced generation cannot be deleted
(``ON DELETE RESTRICT``). Django has no composite foreign key, so the
constraint is plain SQL inside the MySQL/TiDB common subset.
"""
from django.db import migrations

FORWARD = (
    "ALTER TABLE `flows_flowexecutionplan` ADD CONSTRAINT `flow_plan_catalog_composite_fk` "
    "FOREIGN KEY (`org_id`, `app_installation_id`, `runtime_capability_id`, `runtime_work_binding_digest`, "
    "`catalog_id`, `catalog_digest`) "
    "REFERENCES `flows_flowactioncapabilitycatalog` (`org_id`, `app_installation_id`, `runtime_capability_id`, "
    "`binding_digest`, `id`, `digest`) ON DELETE RESTRICT ON UPDATE RESTRICT"
)
BACKWARD = "ALTER TABLE `flows_flowexecutionplan` DROP FOREIGN KEY `flow_plan_catalog_composite_fk`"


class Migration(migrations.Migration):

    dependencies = [
        ('flows', '0001_initial'),
    ]

    operations = [
        migrations.RunSQL(FORWARD, reverse_sql=BACKWARD),
    ]
