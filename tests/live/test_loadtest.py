"""The load driver (benchmarks/load.py, `make load`) kept working: a few users for
a few seconds against daphne and a qcluster on the test database — on SQLite with the
in-memory channel layer, and on PostgreSQL + Redis when CI sets them.

No figures are asserted (the machine is shared), only what must hold under any load:
no errors, and every socket received exactly the events the database has.
"""

from __future__ import annotations

import pytest
from django_q.models import Schedule

from benchmarks.load import LoadConfig, run_load, table

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_load_driver_users_see_every_event(llm, tmp_path, capsys):
    # as the qcluster fixture does: the reaper's schedule must not fire in the middle
    Schedule.objects.filter(func="orchestration.lifecycle.reaper.reap_expired").delete()
    config = LoadConfig(users=3, duration=10, latency_ms=50, workers=3, agents=2, turns_per_conversation=2,
                        ramp=1, think=0.2, turn_timeout=60, progress_every=5)

    report = run_load(config, server=llm, log_dir=tmp_path)

    with capsys.disabled():
        print("\n" + table(report))
    assert report["errors"]["total"] == 0, report["errors"]
    sockets = report["sockets"]
    assert sockets["count"] >= 3 and sockets["equal_to_database"] == sockets["count"], sockets
    assert sockets["duplicates"] == 0 and sockets["reconnects"] == 0
    turns = report["turns"]
    assert turns["completed"] >= 3 and turns["completed"] == turns["started"], turns
    assert turns["in_database"] == {"completed": turns["completed"]}
    assert report["events"]["received"] == report["events"]["in_database"] > 0
    assert report["latency_ms"]["page"]["n"] == sockets["count"]
    assert report["latency_ms"]["event"]["n"] == report["events"]["received"]
    assert report["llm_requests"] == turns["completed"] * config.llm_calls_per_turn
