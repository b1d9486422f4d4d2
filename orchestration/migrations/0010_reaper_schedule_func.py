"""The reaper's schedule calls orchestration.reaper.reap_expired itself (the task module
no longer imports the reaper, which imports it)."""

from django.db import migrations

OLD, NEW = "orchestration.tasks.reap", "orchestration.reaper.reap_expired"


def forwards(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(func=OLD).update(func=NEW)


def backwards(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(func=NEW).update(func=OLD)


class Migration(migrations.Migration):
    dependencies = [("orchestration", "0009_turn_prior_window_calls")]
    operations = [migrations.RunPython(forwards, backwards)]
