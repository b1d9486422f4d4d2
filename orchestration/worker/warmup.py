"""Pay a qcluster's start-up costs once, before it forks, and start each worker's runner.

Importing the openai SDK and its (lazily imported) resources, channels_redis and
redis.asyncio, loading the skill registry and the engine modules costs about two seconds
of CPU. Paid inside a worker's first task, 8 workers starting 8 agents at once on 2 cores
turned a 2 s fan-out into 20 s. Paid in each worker as it spawned (django-q2's
`post_spawn`), it still cost every worker, and every recycled one, 0.7–1 s of CPU on this
project's 2-core machines. So the qcluster's first process imports all of it once
(`preload`, from the app's `ready`), before django-q2 forks the Sentinel and it the
workers: they share those pages, and `warm_up` is left only what cannot cross a fork
(the runner's thread and loop, the database connection, the channel layer's instance).

Once every worker the cluster started has warmed up, the last one says so in one log
line: django-q2's own "running" is logged before that, and only at Q_LOG_LEVEL=INFO,
so `make run` showed nothing from the worker.
"""

from __future__ import annotations

import logging
import multiprocessing

from django.conf import settings
from django.utils.module_loading import import_string

from orchestration.heap import freeze_start_up

logger = logging.getLogger(__name__)

# Workers warmed up so far: made before the qcluster forks its processes, which share it.
_warmed = multiprocessing.Value("i", 0) if settings.RUNNING_QCLUSTER else None
_preloaded = False  # this process (or the one it was forked from) ran `preload`


def preload() -> None:
    """Import what every worker needs, in the qcluster's first process, before it forks.
    Nothing here starts a thread or keeps a connection: those do not survive a fork."""
    global _preloaded
    from django.db import connections
    from django_q.conf import Conf

    if Conf.SYNC:
        return
    _import_engine()
    connections.close_all()  # should the imports have queried: a connection must not cross a fork
    freeze_start_up()  # the children's collections leave the shared pages alone
    _preloaded = True


def warm_up(**kwargs) -> None:
    from channels.layers import get_channel_layer
    from django_q.conf import Conf

    if Conf.SYNC:  # django-q2 runs an inline task through its worker function: no process
        return

    from orchestration.delivery.runner import runner_start
    from orchestration.models import Turn

    if not _preloaded:  # a worker spawned, not forked (another start method): no pages shared
        _import_engine()
    runner_start()
    Turn.objects.filter(pk=0).exists()  # the (persistent) database connection, and the ORM's first query
    get_channel_layer()
    freeze_start_up()
    logger.debug("worker warmed up")
    _announce_ready()


def _import_engine() -> None:
    from channels.layers import channel_layers

    from orchestration.worker import tasks  # noqa: F401 - the engine, and the jobs it registers
    from skills import registry
    from skills.tools import use_skill_tool

    use_skill_tool(registry.skill_names())
    import_string(channel_layers.configs["default"]["BACKEND"])  # with Redis: channels_redis and redis.asyncio
    if settings.ASSISTANT_LLM_PROVIDER == "openai":
        import httpx_aiohttp  # noqa: F401 - the runner's connection pool (aiohttp), imported lazily by the SDK
        import openai.resources.chat  # noqa: F401 - the SDK imports it at a client's first call

        import orchestration.llm.openai_provider  # noqa: F401 - and the SDK


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
