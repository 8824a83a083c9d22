# Fence questions of a reconciling flow.effect.submit message, counted apart from its delivery tries
# (seed 004 section 15.4; runtime_outbox/handoff.py).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runtime_outbox', '0008_inbox_acceptance'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboxmessage',
            name='reconcile_attempts',
            field=models.PositiveIntegerField(default=0, help_text='RejectIfUnaccepted questions asked while reconciling (seed 004 section 15.4).'),
        ),
    ]
