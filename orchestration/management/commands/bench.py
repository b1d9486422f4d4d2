"""Benchmark the engine against a latency-simulating LLM server and a real qcluster.

Run it on a scratch database (it creates users, conversations and turns):
`make bench` does, for the embedded default and for PostgreSQL + Redis.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from orchestration.bench.llm_server import ScriptedLLM
from orchestration.bench.load import Daphne
from orchestration.bench.processes import Cluster, production_env
from orchestration.bench.runner import median_run, now_label, queries_per_agent_step, run_workload
from orchestration.bench.workloads import WORKLOADS


class Command(BaseCommand):
    help = "Measure makespan against the ideal, LLM requests, CPU, memory and SQL per step."

    def add_arguments(self, parser):
        parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
        parser.add_argument("--latency", nargs="+", type=int, default=[100, 300], help="LLM latency, ms.")
        parser.add_argument("--workers", type=int, default=settings.Q_WORKERS)
        parser.add_argument("--repeat", type=int, default=3,
                            help="Runs of each one-turn workload; the run with the median ratio is reported.")
        parser.add_argument("--output", default="bench-results/results.json")
        parser.add_argument("--force", action="store_true", help="Run on a database not named *bench*.")
        parser.add_argument("--plot", nargs="*", metavar="RESULTS_JSON",
                            help="Only draw docs/bench.png from these result files (no run).")

    def handle(self, *args, workloads, latency, workers, repeat, output, force, plot, **options):
        if plot is not None:
            from orchestration.bench.plot import plot as draw

            path = draw([Path(p) for p in plot or [output]], Path("docs/bench.png"))
            self.stdout.write(self.style.SUCCESS(f"Wrote {path}"))
            return
        name = str(connection.settings_dict["NAME"])
        if "bench" not in Path(name).name and not force:
            raise CommandError(f"Refusing to write benchmark data into {name!r}; point DATABASE_URL at a "
                               "scratch database whose name contains 'bench' (make bench does), or pass --force.")
        setup = ("PostgreSQL" if connection.vendor == "postgresql" else "SQLite") + (
            " + Redis" if settings.REDIS_URL else " (embedded)")
        server = ScriptedLLM().start()
        env = {"ASSISTANT_LLM_PROVIDER": "openai", "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "bench",
               "ASSISTANT_LLM_MAX_RETRIES": "0", "Q_LOG_LEVEL": "INFO", **production_env()}
        logs = Path(tempfile.mkdtemp(prefix="bench-"))
        web = Daphne.start(env=env, log_path=logs / "daphne.log")
        cluster = Cluster.start(env=env, log_path=logs / "qcluster.log", workers=workers)
        results = []
        try:
            web.wait_ready()
            cluster.wait_ready()
            warm = cluster.wait_warm(workers)  # workers warm up after spawning (orchestration/warmup.py)
            self.stdout.write(f"{setup}: daphne and a qcluster of {workers} workers (warm after {warm:.1f}s); "
                              f"logs in {logs}")

            def run(workload: str, latency_ms: int):
                return run_workload(workload=WORKLOADS[workload], latency_ms=latency_ms, server=server,
                                    cluster=cluster, web=web, setup=setup, workers=workers)

            self.stdout.write("  a warm-up turn (not reported): every worker's first task pays one-off costs")
            run("wide", latency[0])
            for latency_ms in latency:
                for workload in workloads:
                    runs = 1 if WORKLOADS[workload].conversations > 1 else repeat
                    self.stdout.write(f"  running {workload} at {latency_ms} ms ({runs}×) …", ending="")
                    self.stdout.flush()
                    result = median_run([run(workload, latency_ms) for _ in range(runs)])
                    results.append(result.as_dict())
                    self.stdout.write(f" {result.makespan_s:.2f}s (ideal {result.ideal_s:.2f}s, ×{result.ratio:.2f}), "
                                      f"events p95 {result.event_latency_ms.get('p95', 0):.0f} ms")
        finally:
            cluster.stop()
            web.stop()
        queries = _queries_per_step(server)
        server.stop()
        self.stdout.write(_table(results))
        self.stdout.write("SQL queries per sub-agent step (wide, by agent count): "
                          + ", ".join(f"{n} agents: {q}" for n, q in queries.items()))
        report = {"measured_at": now_label(), "machine": _machine(), "setup": setup, "workers": workers,
                  "results": results, "queries_per_agent_step": queries}
        path = Path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
        self.stdout.write(self.style.SUCCESS(f"Wrote {path}"))


def _queries_per_step(server: ScriptedLLM) -> dict[int, float]:
    """Measured in this process (tasks inline), against the same scripted server."""
    from unittest import mock

    from django.test import override_settings

    with mock.patch.dict(os.environ, {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "bench"}), \
            override_settings(ASSISTANT_LLM_PROVIDER="openai"):
        return {n: queries_per_agent_step(server=server, agents=n) for n in (2, 4, 8)}


def _table(results: list[dict]) -> str:
    head = (f"{'workload':<9} {'L ms':>5} {'makespan s':>10} {'ideal s':>8} {'ratio':>6} {'LLM req':>9} "
            f"{'CPU s/call':>10} {'event p50':>9} {'event p95':>9} {'sockets ok':>10} {'turns ok':>8}")
    rows = [head, "-" * len(head)]
    for r in results:
        requests = f"{r['llm_requests']}/{r['expected_llm_requests']}"
        events = r["event_latency_ms"]
        sockets = f"{r['sockets_equal_to_database']}/{r['turns']}"
        rows.append(f"{r['workload']:<9} {r['latency_ms']:>5} {r['makespan_s']:>10.2f} {r['ideal_s']:>8.2f} "
                    f"{r['ratio']:>6.2f} {requests:>9} {r['cpu_s_per_llm_call']:>10.4f} "
                    f"{events.get('p50', 0):>7.0f}ms {events.get('p95', 0):>7.0f}ms {sockets:>10} "
                    f"{r['turns_completed']:>4}/{r['turns']:<3}")
    return "\n".join(rows)


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"
