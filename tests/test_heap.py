"""Daphne and every qcluster worker keep what they loaded at start-up out of the garbage
collector's full collections (orchestration/heap.py), which otherwise walked all of it under
load, stopping every agent on the worker while they did."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.processes import database_url

# Django, the openai SDK and the skill registry alone are far more objects than this.
START_UP_OBJECTS = 50_000

PROCESSES = {
    "daphne's application": "import assistant.asgi",
    "a qcluster worker after its warm-up": (
        "import django; django.setup()\n"
        "from orchestration.worker.warmup import warm_up; warm_up()"
    ),
}


@pytest.mark.django_db(transaction=True)  # the warm-up's first query: on this database, from another process
@pytest.mark.parametrize("start", PROCESSES.values(), ids=PROCESSES.keys())
def test_start_up_is_frozen_out_of_the_collectors_sight(start):
    script = f"{start}\nimport gc; print(gc.get_freeze_count())"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "assistant.settings", "DATABASE_URL": database_url()}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > START_UP_OBJECTS
