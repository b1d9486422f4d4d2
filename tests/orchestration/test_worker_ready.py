"""A qcluster's start-up (orchestration/worker/warmup.py): its first process imports the
engine before it forks, and `manage.py qcluster` says once, when the last of its first
workers has warmed up, that it takes tasks."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import sys

import pytest

from orchestration.worker import warmup
from tests.support.processes import database_url

ENGINE = ("orchestration.worker.tasks", "orchestration.llm.openai_provider", "openai.resources.chat",
          "httpx_aiohttp", "skills.registry")


def _ready_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Worker ready")]


def test_the_last_of_the_first_workers_says_it_once(monkeypatch, settings, caplog):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": 3}
    settings.ASSISTANT_AGENTS_IN_FLIGHT = 50
    monkeypatch.setattr(warmup, "_warmed", multiprocessing.Value("i", 0))
    caplog.set_level(logging.INFO, logger="orchestration.worker.warmup")
    for _ in range(2):
        warmup._announce_ready()
    assert _ready_lines(caplog) == []
    warmup._announce_ready()
    assert _ready_lines(caplog) == ["Worker ready: 3 processes take tasks, up to 50 agents at once."]
    warmup._announce_ready()  # a worker replacing a recycled one
    assert len(_ready_lines(caplog)) == 1


def test_outside_a_qcluster_nothing_is_counted(caplog):
    caplog.set_level(logging.INFO, logger="orchestration.worker.warmup")
    assert warmup._warmed is None  # the tests' processes are not a qcluster
    warmup._announce_ready()
    assert _ready_lines(caplog) == []


@pytest.mark.django_db(transaction=True)  # the process reads this test's database
def test_a_qcluster_imports_the_engine_before_it_forks():
    """What the forked workers would each import again (0.7–1 s of CPU apiece on 2 cores)
    is in the qcluster's first process once Django is set up, frozen out of the
    collector's sight, with no database connection left open to cross the fork."""
    script = (
        "import sys; sys.argv = ['manage.py', 'qcluster']\n"
        "import django; django.setup()\n"
        "import gc, json; from django.db import connection\n"
        f"print(json.dumps({{'missing': [m for m in {ENGINE!r} if m not in sys.modules],"
        " 'frozen': gc.get_freeze_count(), 'connected': connection.connection is not None}))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "assistant.settings", "DATABASE_URL": database_url(),
           "ASSISTANT_LLM_PROVIDER": "openai", "OPENAI_API_KEY": "sk-test", "Q_SYNC": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout.splitlines()[-1])
    assert started["missing"] == [] and not started["connected"]
    assert started["frozen"] > 50_000  # Django, the SDK and the registry are far more objects
