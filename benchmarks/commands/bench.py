"""Benchmark the engine against a latency-simulating LLM server and a real qcluster.

Run it on a scratch database (it creates users, conversations and turns):
`make bench` does, for the embedded default and for PostgreSQL + Redis. The `tokens`
section (benchmarks/tokens.py) runs the seed example inline in this process, in a few
seconds: `python -m benchmarks bench --workloads tokens` runs only that, without daphne or
a qcluster. The `ratelimited` workload (benchmarks/ratelimited.py) runs last, on a qcluster
of its own that is told the provider's limits, against the server enforcing them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from benchmarks import ratelimited
from benchmarks.commands import STYLE, Refused, refuse_unfinished_turns, say
from benchmarks.handoffs import HANDOFFS
from benchmarks.load import Daphne
from benchmarks.runner import median_run, now_label, queries_per_agent_step, run_workload
from benchmarks.tokens import seed_example_figures
from benchmarks.tokens import table as tokens_table
from benchmarks.workloads import WORKLOADS
from tests.support.llm_server import ScriptedLLM
from tests.support.processes import Cluster, database_url, production_env

TOKENS = "tokens"  # a section, not a timed workload: the seed example's token economy
RATELIMITED = ratelimited.NAME  # a burst against an enforcing provider, on a qcluster of its own
SDK_RETRIES = 2  # the setting's default (the other workloads run without: ASSISTANT_LLM_MAX_RETRIES=0)

HELP = ("Measure makespan against the bound, agents in flight, hand-offs, LLM requests, CPU, memory "
        "and SQL per step; a burst against a provider's rate limits (ratelimited); and the seed "
        "example's prompt tokens per call (tokens).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", nargs="+", default=[*WORKLOADS, RATELIMITED, TOKENS],
                        choices=[*WORKLOADS, RATELIMITED, TOKENS])
    parser.add_argument("--latency", nargs="+", type=int, default=[100, 300, 2000],
                        help="LLM latency, ms (ratelimited runs at the median one only).")
    parser.add_argument("--workers", type=int, default=settings.Q_WORKERS)
    parser.add_argument("--second-cluster", action=argparse.BooleanOptionalAction, default=True,
                        help="Run the load workload again with a second qcluster (standing in for a "
                             "second machine).")
    parser.add_argument("--repeat", type=int, default=3,
                        help="Runs of each one-turn workload; the run with the median ratio is reported.")
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="Run the same workloads through the durable peer (LangGraph with its "
                             "PostgreSQL checkpointer: benchmarks/peer_langgraph.py) on PostgreSQL.")
    parser.add_argument("--output", default="bench-results/results.json")
    parser.add_argument("--tokens-output", default="bench-results/tokens.json")
    parser.add_argument("--force", action="store_true", help="Run on a database not named *bench*.")
    parser.add_argument("--plot", nargs="*", metavar="RESULTS_JSON",
                        help="Only draw docs/bench.png from these result files (no run).")


def run(options: argparse.Namespace) -> None:
    if options.plot is not None:
        from benchmarks.plot import plot as draw

        path = draw([Path(p) for p in options.plot or [options.output]], Path("docs/bench.png"))
        say(STYLE.SUCCESS(f"Wrote {path}"))
        return
    name = str(connection.settings_dict["NAME"])
    if "bench" not in Path(name).name and not options.force:
        raise Refused(f"Refusing to write benchmark data into {name!r}; point DATABASE_URL at a "
                      "scratch database whose name contains 'bench' (make bench does), or pass --force.")
    setup = ("PostgreSQL" if connection.vendor == "postgresql" else "SQLite") + (
        " + Redis" if settings.REDIS_URL else " (embedded)")
    timed = [w for w in options.workloads if w in WORKLOADS]
    if timed or RATELIMITED in options.workloads:
        refuse_unfinished_turns(name)
        _timed(timed, options.latency, options.workers, options.second_cluster, options.repeat, options.output, setup,
               RATELIMITED in options.workloads, options.peer and connection.vendor == "postgresql")
    if TOKENS in options.workloads:
        _tokens(options.tokens_output, setup)


def _tokens(output: str, setup: str) -> None:
    user = get_user_model().objects.create_user(  # a fresh one: no meeting from an earlier run overlaps
        username=f"bench-tokens-{get_user_model().objects.filter(username__startswith='bench-tokens-').count() + 1}",
        email="bench-tokens@example.com")
    figures = seed_example_figures(user=user)
    say(tokens_table(figures))
    report = {"measured_at": now_label(), "machine": _machine(), "setup": setup, **figures.as_dict()}
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    say(STYLE.SUCCESS(f"Wrote {path}"))


def _timed(workloads, latency, workers, second_cluster, repeat, output, setup, rate_limited, peer) -> None:
    server = ScriptedLLM().start()
    env = {"ASSISTANT_LLM_PROVIDER": "openai", "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "bench",
           "ASSISTANT_LLM_MAX_RETRIES": "0", "Q_LOG_LEVEL": "INFO", **production_env()}
    logs = Path(tempfile.mkdtemp(prefix="bench-"))
    web = Daphne.start(env=env, log_path=logs / "daphne.log")
    clusters = [Cluster.start(env=env, log_path=logs / "qcluster.log", workers=workers)]
    results, limited = [], []
    try:
        web.wait_ready()
        clusters[0].wait_ready()
        warm = clusters[0].wait_warm(workers)  # workers warm up after spawning (orchestration/worker/warmup.py)
        say(f"{setup}: daphne and a qcluster of {workers} workers (warm after {warm:.1f}s); "
            f"logs in {logs}")

        def run_once(workload: str, latency_ms: int):
            return run_workload(workload=WORKLOADS[workload], latency_ms=latency_ms, server=server,
                                clusters=clusters, web=web, setup=setup, workers=workers)

        def measure(workload: str, latency_ms: int, runs: int) -> None:
            label = f"{workload} on {len(clusters)} qclusters" if len(clusters) > 1 else workload
            say(f"  running {label} at {latency_ms} ms ({runs}×) …", end="")
            result = median_run([run_once(workload, latency_ms) for _ in range(runs)])
            results.append(result.as_dict())
            say(f" {result.makespan_s:.2f}s (bound {result.bound_s:.2f}s, ×{result.ratio:.2f}), "
                f"{result.peak_in_flight} in flight, {result.cpu_ms_per_llm_call:.1f} ms CPU/call")

        say("  a warm-up turn (not reported): every worker's first task pays one-off costs")
        warm_since = len(server.requests)
        run_once("wide", latency[0])
        limits = ratelimited.limits_for(server, warm_since)  # a wide turn's tokens, as a provider counts them
        for latency_ms in latency:
            for workload in workloads:
                measure(workload, latency_ms, 1 if WORKLOADS[workload].conversations > 1 else repeat)
        loads = [w for w in workloads if WORKLOADS[w].conversations > 1]
        if second_cluster and loads:
            clusters.append(Cluster.start(env=env, log_path=logs / "qcluster-2.log", workers=workers))
            clusters[1].wait_ready()
            clusters[1].wait_warm(workers)
            run_once("wide", latency[0])  # the second cluster's warm-up
            for latency_ms in latency:
                for workload in loads:
                    measure(workload, latency_ms, 1)
        if rate_limited:
            limited = _rate_limited(server, env, limits, logs, workers, second_cluster,
                                    sorted(latency)[len(latency) // 2], clusters, web, setup, repeat)
    finally:
        for cluster in clusters:
            cluster.stop()
        web.stop()
    peers = _peer_runs(server, workloads, latency, repeat) if peer else []
    queries = _queries_per_step(server)
    server.stop()
    if results:
        say(_table(results))
    if peers:
        say(_peer_table(peers, results))
    if limited:
        say(ratelimited.table(limited))
    say("SQL queries per sub-agent step (wide, by agent count; all of a delivery's per model call, but the "
        "reads a process makes every so often / the engine's in a steady-state step): "
        + ", ".join(f"{n} agents: {q} / {steady}" for n, (q, steady) in queries.items()))
    report = {"measured_at": now_label(), "machine": _machine(), "setup": setup, "workers": workers,
              "results": results, "queries_per_agent_step": {n: q for n, (q, _) in queries.items()},
              "statements_per_steady_step": {n: steady for n, (_, steady) in queries.items()}, RATELIMITED: limited,
              "peer": peers}
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    say(STYLE.SUCCESS(f"Wrote {path}"))


def _rate_limited(server, env, limits, logs, workers, second_cluster, latency_ms, clusters, web, setup,
                  repeat) -> list[dict]:
    """The ratelimited workload, `repeat` runs, on a qcluster of its own (then two, with
    --second-cluster), told the limits as ASSISTANT_PROVIDER_LIMITS, with the SDK's retries
    at their default. `clusters` is emptied of the others (stopped) and holds these, for
    the caller to stop."""
    for cluster in clusters:
        cluster.stop()
    clusters.clear()
    env = {**env, **limits.env(), "ASSISTANT_LLM_MAX_RETRIES": str(SDK_RETRIES)}
    say(f"  {RATELIMITED}: limits {limits.as_dict()}; the burst needs {limits.demand_tokens} tokens "
        f"({limits.demand_tokens / limits.tpm:.1f}× the tokens per minute)")
    found = []
    for count in (1, 2) if second_cluster else (1,):
        while len(clusters) < count:
            cluster = Cluster.start(env=env, log_path=logs / f"qcluster-limited-{len(clusters) + 1}.log",
                                    workers=workers)
            clusters.append(cluster)
            cluster.wait_ready()
            cluster.wait_warm(workers)
            server.rate_limit = None
            run_workload(workload=WORKLOADS["wide"], latency_ms=latency_ms, server=server, clusters=clusters,
                         web=web, setup=setup, workers=workers)  # its warm-up, not reported
        runs = []
        for _ in range(repeat):
            say(f"  running {RATELIMITED} on {count} qcluster(s) at {latency_ms} ms …", end="")
            result = ratelimited.run_ratelimited(server=server, limits=limits, latency_ms=latency_ms,
                                                 clusters=clusters, setup=setup, workers=workers)
            result.sdk_retries_in_env = SDK_RETRIES
            server.rate_limit = None
            runs.append(result.as_dict())
            say(f" {result.rate_limited} 429s ({result.rate_limited_pct}% of {result.requests}), "
                f"{result.agents_failed}/{result.agents} agents failed, {result.tokens_per_minute_pct}% of the TPM")
        found += runs + ([ratelimited.pooled(runs)] if len(runs) > 1 else [])
    return found


def _peer_runs(server: ScriptedLLM, workloads: list[str], latency: list[int], repeat: int) -> list[dict]:
    """The same workloads through the durable peer, against the same model server, in its
    own tables of the bench database (the qclusters are stopped by now)."""
    try:
        from benchmarks.peer_langgraph import run_peer
    except ImportError:
        say("  the durable peer needs LangGraph: pip install -e '.[bench]'")
        return []
    url = database_url()  # the database this process uses (a test's, in the tests)
    found = []
    for latency_ms in latency:
        for workload in workloads:
            runs = 1 if WORKLOADS[workload].conversations > 1 else repeat
            say(f"  running {workload} through the durable peer at {latency_ms} ms ({runs}×) …", end="")
            done = sorted((run_peer(workload=WORKLOADS[workload], latency_ms=latency_ms, server=server,
                                    database_url=url) for _ in range(runs)), key=lambda r: r["ratio"])
            result = done[len(done) // 2]
            found.append(result)
            say(f" {result['makespan_s']:.2f}s (×{result['ratio']:.2f}), {result['cpu_ms_per_call']:.1f} ms CPU/call")
    return found


def _peer_table(peers: list[dict], results: list[dict]) -> str:
    """This project beside the durable peer, workload by workload (one qcluster)."""
    ours = {(r["workload"], r["latency_ms"]): r for r in results if r["clusters"] == 1}
    head = (f"{'workload':<9} {'L ms':>5} {'ratio peer':>10} {'ratio ours':>10} {'CPU ms/call peer':>16} "
            f"{'CPU ms/call ours':>16} {'PG ms/call peer':>15} {'PG ms/call ours':>15}")
    rows = ["", "beside the durable peer (LangGraph + PostgreSQL checkpointer, same model server)", head,
            "-" * len(head)]
    for p in peers:
        r = ours.get((p["workload"], p["latency_ms"]))
        if r is None:
            continue
        rows.append(f"{p['workload']:<9} {p['latency_ms']:>5} {p['ratio']:>10.2f} {r['ratio']:>10.2f} "
                    f"{p['cpu_ms_per_call']:>16.1f} {r['cpu_ms_per_llm_call']:>16.1f} "
                    f"{p['pg_ms_per_call']:>15.1f} {r['postgres_cpu_ms_per_llm_call']:>15.1f}")
    return "\n".join(rows)


def _queries_per_step(server: ScriptedLLM) -> dict[int, tuple[float, float]]:
    """Measured in this process (tasks inline), against the same scripted server."""
    from unittest import mock

    from django.test import override_settings

    with mock.patch.dict(os.environ, {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "bench"}), \
            override_settings(ASSISTANT_LLM_PROVIDER="openai"):
        return {n: queries_per_agent_step(server=server, agents=n) for n in (2, 4, 8)}


def _table(results: list[dict]) -> str:
    """Two tables: the run (time, load, CPU, memory), then its hand-offs (p50/p95 ms)."""
    head = (f"{'workload':<9} {'qc':>2} {'L ms':>5} {'makespan s':>10} {'bound s':>8} {'ratio':>6} {'in flight':>9} "
            f"{'LLM req':>9} {'CPU ms/call':>11} {'PG ms/call':>10} {'PSS MB':>7} {'event p95':>9} "
            f"{'sockets ok':>10} {'turns ok':>8}")
    rows = [head, "-" * len(head)]
    for r in results:
        requests = f"{r['llm_requests']}/{r['expected_llm_requests']}"
        sockets = f"{r['sockets_equal_to_database']}/{r['turns']}"
        rows.append(f"{r['workload']:<9} {r['clusters']:>2} {r['latency_ms']:>5} {r['makespan_s']:>10.2f} "
                    f"{r['bound_s']:>8.2f} {r['ratio']:>6.2f} {r['peak_in_flight']:>9} {requests:>9} "
                    f"{r['cpu_ms_per_llm_call']:>11.1f} {r['postgres_cpu_ms_per_llm_call']:>10.1f} "
                    f"{r['pss_mb']['total']:>7.0f} {r['event_latency_ms'].get('p95', 0):>7.0f}ms {sockets:>10} "
                    f"{r['turns_completed']:>4}/{r['turns']:<3}")
    head = f"{'workload':<9} {'qc':>2} {'L ms':>5} " + " ".join(f"{name:>24}" for name in HANDOFFS)
    rows += ["", "hand-offs, p50 / p95 ms (from the model server's timeline)", head, "-" * len(head)]
    for r in results:
        cells = [f"{h.get('p50', 0):.1f} / {h.get('p95', 0):.1f}" if h.get("n") else "–"
                 for h in (r["handoff_ms"][name] for name in HANDOFFS)]
        rows.append(f"{r['workload']:<9} {r['clusters']:>2} {r['latency_ms']:>5} "
                    + " ".join(f"{cell:>24}" for cell in cells))
    return "\n".join(rows)


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"
