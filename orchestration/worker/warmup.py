"""Start a worker's runner, and pay its one-off start-up costs before its first task.

Importing the openai SDK and its (lazily imported) resources, the channel layer (with
Redis: channels_redis and redis.asyncio), loading the skill registry and the engine
modules costs about two seconds of CPU per process. Paid inside the first task,
8 workers starting 8 agents at once on 2 cores turned a 2 s fan-out into 20 s.
django-q2 sends `post_spawn` in every new worker process.
"""

from __future__ import annotations

import logging

from django.conf import settings

logger = logging.getLogger(__name__)


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
    logger.debug("worker warmed up")
