"""Engine tests: the real openai SDK against the scripted server, tasks run inline
(django-q2 sync), on the real database with real commits (on_commit must fire)."""

from __future__ import annotations

import pytest
from django.utils.module_loading import import_string
from django_q.conf import Conf

from orchestration.models import Turn
from orchestration.lifecycle.turns import turn_start
from tests.checks import assert_ended_turns_closed
from tests.factories import conversation_for
from tests.support.llm_server import ScriptedLLM


@pytest.fixture
def llm(settings, monkeypatch):
    server = ScriptedLLM().start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    settings.ASSISTANT_LLM_PROVIDER = "openai"
    settings.ASSISTANT_LLM_MAX_RETRIES = 0
    settings.ASSISTANT_LLM_TIMEOUT_SECONDS = 10
    settings.ASSISTANT_LLM_RETRY_BACKOFF_SECONDS = 0.01
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def default_profiles(request):
    """Data migrations' rows do not survive transactional tests' flushes: put them back."""
    if "db" in request.fixturenames or "transactional_db" in request.fixturenames:
        from orchestration.engine.profiles import install_default_profiles

        install_default_profiles()


@pytest.fixture
def inline_tasks(monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", True)


@pytest.fixture
def run_turn(transactional_db, inline_tasks, alice, request):
    """Send `text` as alice in a new conversation; tasks run inline, so it returns done."""

    def run(text: str = "Please help", *, user=None) -> Turn:
        conversation = conversation_for(user or alice)
        turn = turn_start(conversation=conversation, text=text)
        turn.refresh_from_db()
        return turn

    yield run
    assert_ended_turns_closed()
    marker = request.node.get_closest_marker("replayed")
    if marker is not None and not marker.kwargs.get("skip"):
        replayed_without_divergence()


def replayed_without_divergence() -> None:
    """Every answered turn of the test, run again through the engine from its records
    (orchestration/replay/): the engine still takes the same decisions on it."""
    from orchestration.replay.replaying import replay

    for turn in Turn.objects.filter(status="completed", forked_from=None).exclude(
            conversation__title__startswith="Replay of").select_related("conversation__owner"):
        result = replay(turn)
        assert result.divergences == [], f"turn {turn.pk} replayed with divergences: {result.divergences}"


@pytest.fixture
def queued(monkeypatch, transactional_db):
    """Tasks go to a list instead of running inline; `drain()` runs them in order, one at
    a time, like a single worker would (`drain(1)`: only the next one)."""
    tasks: list[tuple[str, tuple]] = []
    monkeypatch.setattr("orchestration.delivery.queue.async_task", lambda func, *args: tasks.append((func, args)))

    def drain(limit: int = 100) -> list[str]:
        ran = []
        while tasks and len(ran) < limit:
            func, args = tasks.pop(0)
            ran.append(f"{func.rsplit('.', 1)[1]}{args}")
            import_string(func)(*args)
        assert not tasks or limit < 100, ran
        return ran

    drain.tasks = tasks
    return drain
