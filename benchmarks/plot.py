"""The benchmark's plot: makespan against the bound, and CPU per model call, per workload
and latency, this project on PostgreSQL + Redis beside the durable peer where the run has it
(a workload run on two qclusters is its own group; SQLite runs are their own series).

CPU is drawn as the comparison needs it: the peer has no web side, so ours is split into the
workers' share and daphne's on top of it, and PostgreSQL's CPU is a tick on each bar."""

from __future__ import annotations

import json
from pathlib import Path

PEER = "durable LangGraph"


def plot(result_files: list[Path], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [json.loads(path.read_text()) for path in result_files]
    rows = [_ours(r) for report in reports for r in report["results"]]
    rows += [_peer(p) for report in reports for p in report.get("peer", [])]
    series = sorted({(r["series"], r["latency_ms"]) for r in rows}, key=lambda s: (s[1], s[0] == PEER, s[0]))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    width = 0.8 / max(len(series), 1)
    fig, (ratio_ax, cpu_ax) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [1, 1]})

    def found(name, latency, workload):
        return next((r for r in rows if (r["series"], r["latency_ms"], r["workload"]) == (name, latency, workload)),
                    None)

    def offsets(index):
        return [i + index * width for i in range(len(workloads))]

    latencies = sorted({latency for _, latency in series})
    for index, (name, latency) in enumerate(series):
        cells = [found(name, latency, w) for w in workloads]
        color = plt.get_cmap("tab10")(latencies.index(latency) % 10)
        # One colour per latency: ours filled (paler on SQLite), the peer hatched beside it.
        look = ({"facecolor": "white", "edgecolor": color, "hatch": "///"} if name == PEER
                else {"color": color, "alpha": 0.55 if "SQLite" in name else 1.0})
        ratio_ax.bar(offsets(index), [c["ratio"] if c else 0 for c in cells], width,
                     label=f"{name}, L={latency} ms", **look)
        workers = [c["workers_ms"] if c else 0 for c in cells]
        cpu_ax.bar(offsets(index), workers, width,
                   label=f"{name}, L={latency} ms" + ("" if name == PEER else " (workers)"), **look)
        web = [c["web_ms"] if c else 0 for c in cells]
        if any(web):
            cpu_ax.bar(offsets(index), web, width, bottom=workers, color=color, alpha=0.3)
        cpu_ax.scatter(offsets(index), [c["postgres_ms"] if c else float("nan") for c in cells],
                       marker="_", s=120, color="black", zorder=3)
    for ax in (ratio_ax, cpu_ax):
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(workloads))], workloads)
    ratio_ax.axhline(1.0, color="black", linewidth=0.8)
    ratio_ax.set_yscale("log")
    ratio_ax.set_ylabel("makespan / bound (log scale)")
    ratio_ax.set_title("Makespan against the bound (3·L + critical path)", fontsize=10)
    ratio_ax.legend(fontsize=7, loc="upper left")
    cpu_ax.set_ylabel("CPU ms per model call")
    cpu_ax.set_ylim(top=cpu_ax.get_ylim()[1] * 1.3)  # room for the legend
    cpu_ax.set_title("CPU per model call: workers (pale on top: daphne); black tick: PostgreSQL", fontsize=10)
    cpu_ax.legend(fontsize=7, loc="upper left", ncols=2)

    machine = reports[0].get("machine", "") if reports else ""
    when = reports[0].get("measured_at", "") if reports else ""
    fig.suptitle(f"make bench on {machine}, {when}", fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    return output


def _ours(result: dict) -> dict:
    """One of this project's results, its CPU per call split into workers and web."""
    calls = max(result.get("llm_requests", 0), 1)
    cpu = result.get("cpu_s", {})
    clusters = result.get("clusters", 1)
    return {
        "series": "ours, " + result["setup"], "latency_ms": result["latency_ms"], "ratio": result["ratio"],
        "workload": result["workload"] + (f" ({clusters} qc)" if clusters > 1 else ""),
        "workers_ms": 1000 * cpu.get("workers", 0) / calls, "web_ms": 1000 * cpu.get("web", 0) / calls,
        "postgres_ms": (result.get("postgres_cpu_ms_per_llm_call", float("nan"))
                        if "PostgreSQL" in result["setup"] else float("nan")),  # no tick on SQLite
    }


def _peer(result: dict) -> dict:
    return {
        "series": PEER, "latency_ms": result["latency_ms"], "ratio": result["ratio"],
        "workload": result["workload"], "workers_ms": result["cpu_ms_per_call"], "web_ms": 0,
        "postgres_ms": result.get("pg_ms_per_call", float("nan")),
    }
