"""The load driver (benchmarks/load.py, `make load`) kept working: a few users for
a few seconds against daphne and a qcluster on the test database — on SQLite with the
in-memory channel layer, and on PostgreSQL + Redis when CI sets them.

No figures are asserted (the machine is shared), only what must hold under any load:
no errors, and every socket received exactly the events the database has, every other
turn's page hidden from its post on (the socket sends it nothing, then catches it up).
"""

from __future__ import annotations

import pytest
from django_q.models import Schedule

from benchmarks.__main__ import main as benchmarks_main
from benchmarks.load import LoadConfig, run_load, table
from orchestration.models import TurnStatus
from tests.factories import conversation_for, turn_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_load_driver_users_see_every_event(llm, tmp_path, capsys):
    # as the qcluster fixture does: the reaper's schedule must not fire in the middle
    Schedule.objects.filter(func="orchestration.lifecycle.reaper.reap_expired").delete()
    config = LoadConfig(users=3, duration=10, latency_ms=50, workers=3, agents=2, turns_per_conversation=2,
                        ramp=1, think=0.2, turn_timeout=60, progress_every=5, hidden=0.5, hidden_seconds=0.5,
                        steady_after_ramp=2)

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
    events = report["events"]
    assert report["hidden_turns"] >= 1 and events["held_back_from_hidden_tabs"] > 0, events
    assert report["latency_ms"]["event"]["n"] == events["received"] - events["held_back_from_hidden_tabs"]
    assert report["llm_requests"] == turns["completed"] * config.llm_calls_per_turn
    # The steady window's CPU (3–10 s) is within the whole run's, as the steady latencies are.
    steady, whole = report["steady_cpu_seconds"], report["cpu_seconds"]
    assert steady.keys() == whole.keys() and 0 < steady["qcluster"] <= whole["qcluster"], (steady, whole)
    assert "CPU s, steady state" in table(report)


def test_a_database_with_unfinished_turns_is_refused_before_anything_starts(alice, capsys):
    """Their agents would run beside the users' (the reaper takes them up) and skew every figure."""
    turn_for(conversation_for(alice), status=TurnStatus.WAITING)
    assert benchmarks_main(["loadtest", "--force"]) == 1
    assert "holds 1 unfinished turn(s)" in capsys.readouterr().err


@pytest.mark.parametrize("share", ["2", "-0.5", "half"])
def test_a_hidden_share_outside_0_to_1_is_refused_before_anything_starts(share, capsys):
    with pytest.raises(SystemExit) as refused:
        benchmarks_main(["loadtest", "--hidden", share])
    assert refused.value.code == 2
    assert f"--hidden: a share of the turns, from 0 to 1, not '{share}'" in capsys.readouterr().err
