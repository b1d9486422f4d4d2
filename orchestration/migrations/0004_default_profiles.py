from django.db import migrations


def install(apps, schema_editor):
    from orchestration.engine.profiles import install_default_profiles

    install_default_profiles(apps.get_model("orchestration", "AgentProfile"))


def uninstall(apps, schema_editor):
    from orchestration.engine.profiles import DEFAULT_PROFILES

    names = [p["name"] for p in DEFAULT_PROFILES]
    apps.get_model("orchestration", "AgentProfile").objects.filter(name__in=names).delete()


class Migration(migrations.Migration):
    dependencies = [("orchestration", "0003_engine")]
    operations = [migrations.RunPython(install, uninstall)]
