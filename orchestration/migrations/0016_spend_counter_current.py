from django.db import migrations, models


class Migration(migrations.Migration):
    """Every spend period has its end (0015 backfilled them), and the current ones (their
    end after now) are found through an index on every model call."""

    dependencies = [
        ('orchestration', '0015_conversation_outside_spend_zone'),
    ]

    operations = [
        migrations.AlterField(
            model_name='spendcounter',
            name='ends_at',
            field=models.DateTimeField(),
        ),
        migrations.AddIndex(
            model_name='spendcounter',
            index=models.Index(fields=['user', 'ends_at'], name='spend_counter_current'),
        ),
    ]
