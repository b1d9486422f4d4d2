"""Engine tests: the real openai SDK against the scripted server, tasks run inline
(django-q2 sync), on the real database with real commits (on_commit must fire)."""

from __future__ import annotations

import pytest
from django_q.conf import Conf

from orchestration.models import Turn
from orchestration.turns import turn_start
from tests.factories import conversation_for
from orchestration.bench.llm_server import ScriptedLLM


@pytest.fixture
def llm(settings, monkeypatch):
    server = ScriptedLLM().start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    settings.ASSISTANT_LLM_PROVIDER = "openai"
    settings.ASSISTANT_LLM_MAX_RETRIES = 0
    settings.ASSISTANT_LLM_TIMEOUT_SECONDS = 10
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def default_profiles(request):
    """Data migrations' rows do not survive transactional tests' flushes: put them back."""
    if "db" in request.fixturenames or "transactional_db" in request.fixturenames:
        from orchestration.profiles import install_default_profiles

        install_default_profiles()


@pytest.fixture
def inline_tasks(monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", True)


@pytest.fixture
def run_turn(transactional_db, inline_tasks, alice):
    """Send `text` as alice in a new conversation; tasks run inline, so it returns done."""

    def run(text: str = "Please help", *, user=None) -> Turn:
        conversation = conversation_for(user or alice)
        turn = turn_start(conversation=conversation, text=text)
        turn.refresh_from_db()
        return turn

    return run
