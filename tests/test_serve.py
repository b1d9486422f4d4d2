"""`manage.py serve` (assistant/management/commands/serve.py): several web processes share
their sockets' events through Redis, so without it the command says so and starts nothing.
(Two processes on one port, with Redis: tests/live/test_web_processes.py.)"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command


def test_several_processes_without_redis_are_refused_with_the_reason(settings, monkeypatch):
    settings.REDIS_URL = ""
    started = []
    monkeypatch.setattr("subprocess.Popen", lambda *args, **kwargs: started.append(args))
    with pytest.raises(CommandError, match="REDIS_URL"):
        call_command("serve", processes=2, port=0)
    assert started == []
