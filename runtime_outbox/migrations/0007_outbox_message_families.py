# Outbox messages become Runtime message families (ARCHITECTURE.md section 2, "Runtime message families").

import django.db.models.deletion
from django.db import migrations, models

import nexusflow.kernel.identity

#: The value existing rows hold between the column's creation and the backfill below, which replaces it on every
#: row (each existing message has its command); the column keeps no default.
BACKFILL = "backfill-pending"


def backfill_families(apps, schema_editor):
    """Every existing message delivers one OutboundCommand: its family, key, payload, digest and full trusted
    scope are computed exactly as ``runtime_outbox.messages.publish`` writes them for that command."""
    from runtime_outbox.messages import command_message, seal

    message_model = apps.get_model("runtime_outbox", "OutboxMessage")
    db = schema_editor.connection.alias
    for message in message_model.objects.using(db).select_related("command").order_by("id"):
        command = message.command
        family, key, payload = command_message(command)
        version, stored, digest = seal(family, key, payload)
        message_model.objects.using(db).filter(pk=message.pk).update(
            app_installation_id=command.app_installation_id, runtime_capability_id=command.runtime_capability_id,
            binding_digest=command.binding_digest, family=family, message_key=key, payload_schema_version=version,
            payload=stored, payload_digest=digest)


class Migration(migrations.Migration):

    dependencies = [
        ('runtime_outbox', '0006_owner_leading_intent_index'),
    ]

    # Columns are created NOT NULL with their binary collation (altering NULL -> NOT NULL would drop it).
    operations = [
        migrations.AddField(
            model_name='outboxmessage',
            name='app_installation_id',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', default=BACKFILL, max_length=128),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='runtime_capability_id',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', default=BACKFILL, max_length=128),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='binding_digest',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', default=BACKFILL, max_length=128),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='family',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', default=BACKFILL, max_length=64),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='message_key',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', default=BACKFILL, max_length=128),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='payload_schema_version',
            field=models.PositiveIntegerField(default=1),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='payload',
            field=models.JSONField(default=dict, help_text='The frozen, safe payload handed to the consumer (as an immutable envelope).'),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='payload_digest',
            field=nexusflow.kernel.identity.IdentityField(db_collation='utf8mb4_bin', default=BACKFILL, max_length=64),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name='outboxmessage',
            name='command',
            field=models.ForeignKey(blank=True, help_text='The intent the message is about, when it is about one.', null=True, on_delete=django.db.models.deletion.PROTECT, to='runtime_outbox.outboundcommand'),
        ),
        migrations.RunPython(backfill_families, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='outboxmessage',
            constraint=models.UniqueConstraint(fields=('family', 'message_key'), name='outbox_message_key_uniq'),
        ),
    ]
