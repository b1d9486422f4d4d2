"""Schedule the reaper (then orchestration.tasks.reap; see 0010) every minute on django-q2's scheduler."""

from django.db import migrations


def schedule_reaper(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name="assistant-reaper",
        defaults={"func": "orchestration.tasks.reap", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def unschedule_reaper(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="assistant-reaper").delete()


class Migration(migrations.Migration):
    dependencies = [("orchestration", "0001_initial"), ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more")]
    operations = [migrations.RunPython(schedule_reaper, unschedule_reaper)]
