"""Circuit breakers keyed by (skill, user), with one row per skill for everyone.

The old table was keyed by the skill's name alone. Its rows are only a breaker's
passing state (failures in a row, an open window), so it is replaced rather than
converted: every circuit starts closed.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('skills', '0003_rules_egress_memory_origin'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.DeleteModel(name='SkillCircuit'),
        migrations.CreateModel(
            name='SkillCircuit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('skill', models.CharField(max_length=100)),
                ('consecutive_failures', models.PositiveIntegerField(default=0)),
                ('opened_until', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('owner', models.ForeignKey(blank=True, help_text="Empty: the skill's circuit for every user.", null=True, on_delete=django.db.models.deletion.CASCADE, related_name='skill_circuits', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['skill', 'owner_id'],
                'constraints': [
                    models.UniqueConstraint(condition=models.Q(('owner__isnull', True)), fields=('skill',), name='skill_circuit_everyone'),
                    models.UniqueConstraint(condition=models.Q(('owner__isnull', False)), fields=('skill', 'owner'), name='skill_circuit_owner'),
                ],
            },
        ),
    ]
