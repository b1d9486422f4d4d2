from django.apps import AppConfig
from django.conf import settings


class OrchestrationConfig(AppConfig):
    name = "orchestration"
    verbose_name = "Orchestration (audit trail)"

    def ready(self):
        from django_q.signals import post_spawn

        from orchestration import checks  # noqa: F401 - registers the system checks
        from orchestration.delivery import taskqueue

        taskqueue.install()  # before a qcluster creates its queue and forks its workers

        from orchestration.worker.warmup import preload, warm_up

        post_spawn.connect(warm_up, dispatch_uid="orchestration-warm-up")
        if settings.RUNNING_QCLUSTER:
            preload()  # before the qcluster forks: its workers share what it imported
