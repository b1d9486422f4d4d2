"""One step machine (issue 25): crashes are counted apart from deliveries, and a
delegating agent waiting for its own agents has a state of its own.

`attempts` / `step_attempts` counted every claim (pauses, Continues and hand-backs used
up the crash allowance); they become `crashes`, counted from zero. A dispatch that was
`created` with `awaiting` set was waiting for its agents: it is `waiting` now.
"""

from django.db import migrations, models


def forwards(apps, schema_editor):
    AgentDispatch = apps.get_model("orchestration", "AgentDispatch")
    Turn = apps.get_model("orchestration", "Turn")
    AgentDispatch.objects.update(crashes=0)
    Turn.objects.update(crashes=0)
    AgentDispatch.objects.filter(state="created").exclude(awaiting={}).update(state="waiting")


def backwards(apps, schema_editor):
    AgentDispatch = apps.get_model("orchestration", "AgentDispatch")
    AgentDispatch.objects.filter(state="waiting").update(state="created")


class Migration(migrations.Migration):
    dependencies = [("orchestration", "0016_spend_counter_current")]

    operations = [
        migrations.RenameField("agentdispatch", "attempts", "crashes"),
        migrations.RenameField("turn", "step_attempts", "crashes"),
        migrations.AlterField(
            model_name="agentdispatch", name="state",
            field=models.CharField(choices=[
                ("created", "Created"), ("running", "Running"), ("waiting", "Waiting"),
                ("waiting_for_merge", "Waiting For Merge"), ("completed", "Completed"), ("failed", "Failed"),
                ("skipped", "Skipped"), ("cancelled", "Cancelled"), ("closed", "Closed")],
                default="created", max_length=24),
        ),
        migrations.RunPython(forwards, backwards),
    ]
