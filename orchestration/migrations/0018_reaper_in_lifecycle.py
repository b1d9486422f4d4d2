"""The reaper moved to orchestration/lifecycle/ (issue 25): its schedule follows it."""

from django.db import migrations

OLD, NEW = "orchestration.reaper.reap_expired", "orchestration.lifecycle.reaper.reap_expired"


def forwards(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(func=OLD).update(func=NEW)


def backwards(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(func=NEW).update(func=OLD)


class Migration(migrations.Migration):
    dependencies = [("orchestration", "0017_one_step_machine")]
    operations = [migrations.RunPython(forwards, backwards)]
