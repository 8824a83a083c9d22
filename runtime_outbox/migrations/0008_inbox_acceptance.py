# The Runtime transport authority's acceptance record (seed 004 section 10.7).

from django.db import migrations, models

import nexusflow.kernel.identity
import nexusflow.kernel.models


class Migration(migrations.Migration):

    dependencies = [
        ('runtime_outbox', '0007_outbox_message_families'),
    ]

    operations = [
        migrations.CreateModel(
            name='InboxAcceptance',
            fields=[
                ('id', nexusflow.kernel.models.TypedIdField(primary_key=True, serialize=False)),
                ('org_id', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64)),
                ('app_installation_id', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=128)),
                ('runtime_capability_id', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=128)),
                ('binding_digest', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=128)),
                ('family', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64)),
                ('message_key', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=128, unique=True)),
                ('outbox_message_id', nexusflow.kernel.models.TypedIdReference(to='runtime_outbox.OutboxMessage')),
                ('payload_digest', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=64)),
                ('consumer', nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', max_length=80)),
                ('state', models.CharField(max_length=16)),
                ('version', models.PositiveBigIntegerField(default=1)),
                ('accepted_ref', models.CharField(blank=True, default='', help_text="The consumer's record created on acceptance, e.g. remote_effect:<id>.", max_length=160)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'abstract': False,
                'base_manager_name': 'objects',
            },
        ),
    ]
