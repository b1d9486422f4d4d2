"""Start a worker's runner, and pay its one-off start-up costs before its first task.

Importing the openai SDK and its (lazily imported) resources, the channel layer (with
Redis: channels_redis and redis.asyncio), loading the skill registry and the engine
modules costs about two seconds of CPU per process. Paid inside the first task,
8 workers starting 8 agents at once on 2 cores turned a 2 s fan-out into 20 s.
django-q2 sends `post_spawn` in every new worker process.

Once every worker the cluster started has warmed up, the last one says so in one log
line: django-q2's own "running" is logged before that, and only at Q_LOG_LEVEL=INFO,
so `make run` showed nothing from the worker.
"""

from __future__ import annotations

import logging
import multiprocessing

from django.conf import settings

from orchestration.heap import freeze_start_up

logger = logging.getLogger(__name__)

# Workers warmed up so far: made before the qcluster forks its processes, which share it.
_warmed = multiprocessing.Value("i", 0) if settings.RUNNING_QCLUSTER else None


def warm_up(**kwargs) -> None:
    from channels.layers import get_channel_layer
    from django_q.conf import Conf

    if Conf.SYNC:  # django-q2 runs an inline task through its worker function: no process
        return

    from orchestration.delivery.runner import runner_start
    from orchestration.worker import tasks  # noqa: F401 - the engine, and the jobs it registers

    runner_start()
    from orchestration.models import Turn
    from skills import registry
    from skills.tools import use_skill_tool

    use_skill_tool(registry.skill_names())
    Turn.objects.filter(pk=0).exists()  # the (persistent) database connection, and the ORM's first query
    get_channel_layer()  # imports channels_redis and redis.asyncio: ~0.5 s of CPU, at the first event
    if settings.ASSISTANT_LLM_PROVIDER == "openai":
        import httpx_aiohttp  # noqa: F401 - the runner's connection pool (aiohttp), imported lazily by the SDK

        import orchestration.llm.openai_provider  # noqa: F401 - and the SDK
    freeze_start_up()
    logger.debug("worker warmed up")
    _announce_ready()


def _announce_ready() -> None:
    """Count this worker in; the one that completes the cluster's first set logs the
    ready line (a worker started later, to replace a recycled one, stays quiet)."""
    if _warmed is None:
        return
    workers = settings.Q_CLUSTER["workers"]
    with _warmed.get_lock():
        _warmed.value += 1
        last = _warmed.value == workers
    if last:
        logger.info("Worker ready: %d processes take tasks, up to %d agents at once.",
                    workers, settings.ASSISTANT_AGENTS_IN_FLIGHT)
