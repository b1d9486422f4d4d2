"""`python -m benchmarks bench` (`make bench`) kept working: one short workload against daphne and a
qcluster on the test database. No figure is asserted (the machine is shared), only what
must hold: every LLM request expected and no other, every event on the dashboard's
socket, and SQL queries per sub-agent step that do not grow with the number of agents.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main as bench_main
from orchestration.models import TurnStatus
from tests.factories import conversation_for, turn_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_bench_measures_a_workload(tmp_path, capsys):
    output = tmp_path / "bench.json"
    assert bench_main(["bench", "--workloads", "diamond", "--latency", "300", "--repeat", "1", "--workers", "4",
                       "--force", "--output", str(output)]) == 0

    report = json.loads(output.read_text())
    (result,) = report["results"]
    assert (result["workload"], result["turns_completed"], result["turns"]) == ("diamond", 1, 1)
    assert result["llm_requests"] == result["expected_llm_requests"] == 16
    assert result["sockets_equal_to_database"] == 1 and result["event_latency_ms"]["n"] > 0
    assert result["ratio"] == pytest.approx(result["makespan_s"] / result["bound_s"], abs=0.01)
    assert {"web", "workers", "postgres", "redis"} <= result["cpu_s"].keys()
    assert result["peak_in_flight"] >= 2  # a and b at once (300 ms calls: they overlap even on a busy machine)
    assert result["pss_mb"]["workers"] > 0 and result["pss_mb"]["web"] > 0
    handoffs = result["handoff_ms"]
    # Each turn's requests were told apart: a and b dispatched; c after both, d after c;
    # 2 steps each between the 3 calls of 4 agents; one start and one wake-up.
    assert {name: figures["n"] for name, figures in handoffs.items()} == {
        "start → first request": 1, "dispatch → agents": 2, "dependency → dependent": 2,
        "agent step": 8, "agents → orchestrator": 1}
    per_step = report["queries_per_agent_step"]
    # Flat in the number of agents (the reads a process makes every so often, whatever its
    # calls, are not counted per call: they made this depend on how long each run took).
    assert list(per_step) == ["2", "4", "8"] and max(per_step.values()) - min(per_step.values()) <= 0.5, per_step
    assert set(report["statements_per_steady_step"].values()) == {4.0}, report  # as the budget test holds
    if report["setup"].startswith("PostgreSQL"):  # the durable peer, on the same model server
        (peer,) = report["peer"]
        assert (peer["workload"], peer["llm_requests"]) == ("diamond", 16) and peer["ratio"] >= 1, peer
    table = capsys.readouterr().out
    assert "diamond" in table and "dependency → dependent" in table


def test_a_database_with_unfinished_turns_is_refused_before_anything_starts(alice, capsys):
    """Their agents would run beside the workloads (the reaper takes them up) and skew every figure."""
    turn_for(conversation_for(alice), status=TurnStatus.RUNNING)
    assert bench_main(["bench", "--workloads", "chain", "--force"]) == 1
    assert "holds 1 unfinished turn(s)" in capsys.readouterr().err


def test_trace_cost_compares_export_off_and_on(tmp_path, monkeypatch, capsys):
    """`python -m benchmarks trace_cost` kept working: the spans reach its receiver and
    the export alone reads the turn's records once (no figure of time asserted)."""
    from orchestration.reports import otel

    # The bench points this process's exporter at its receiver: undone afterwards.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setattr(otel, "_provider", None)
    output = tmp_path / "trace-cost.json"
    assert bench_main(["trace_cost", "--turns", "1", "--rounds", "1", "--output", str(output)]) == 0
    off, on, received = json.loads(output.read_text())
    assert (off["export"], on["export"]) == ("off", "on") and off["model_calls"] == on["model_calls"] > 0
    assert on["export_queries_per_turn"] == 6 and received["received"]["posts"] > 0
    assert "| on |" in capsys.readouterr().out
