"""The worker's ready line (orchestration/worker/warmup.py): `manage.py qcluster` says once,
when the last of its first workers has warmed up, that it takes tasks."""

from __future__ import annotations

import logging
import multiprocessing

from orchestration.worker import warmup


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
