"""The engine run inline in this process with another model and other skill handlers:
how a replay and a fork run a turn (replaying.py, forking.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from unittest import mock

from django.conf import settings
from django.test.utils import override_settings
from django_q.conf import Conf


@contextmanager
def engine_with(model, get_skill: Callable, limits: dict, **more_settings):
    """Tasks run inline; the orchestrator and every agent ask `model`; the executor looks
    skills up with `get_skill`; a new turn takes `limits` (over the settings')."""
    from skills import executor

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(Conf, "SYNC", True))
        stack.enter_context(mock.patch("orchestration.engine.orchestrator.get_provider", lambda: model))
        stack.enter_context(mock.patch("orchestration.engine.agent.get_provider", lambda: model))
        stack.enter_context(mock.patch.object(executor, "get_skill", get_skill))
        stack.enter_context(override_settings(ASSISTANT_LIMITS={**settings.ASSISTANT_LIMITS, **limits},
                                              **more_settings))
        yield
