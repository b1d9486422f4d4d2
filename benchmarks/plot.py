"""The benchmark's plot: makespan against the bound, and CPU per model call, per workload,
latency and setup (a workload run on two qclusters is its own group)."""

from __future__ import annotations

import json
from pathlib import Path


def plot(result_files: list[Path], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [json.loads(path.read_text()) for path in result_files]
    rows = [{**r, "workload": r["workload"] + (f" ({r['clusters']} qc)" if r.get("clusters", 1) > 1 else "")}
            for report in reports for r in report["results"]]
    series = sorted({(r["setup"], r["latency_ms"]) for r in rows})
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    width = 0.8 / max(len(series), 1)
    fig, (ratio_ax, event_ax) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})

    def bars(ax, value):
        for index, (setup, latency) in enumerate(series):
            values = [next((value(r) for r in rows if (r["setup"], r["latency_ms"], r["workload"]) ==
                            (setup, latency, w)), 0) for w in workloads]
            ax.bar([i + index * width for i in range(len(workloads))], values, width,
                   label=f"{setup}, L={latency} ms")
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(workloads))], workloads)

    bars(ratio_ax, lambda r: r["ratio"])
    ratio_ax.axhline(1.0, color="black", linewidth=0.8)
    ratio_ax.axhline(1.1, color="grey", linestyle="--", linewidth=0.8, label="aim 1.10 (wide, L=300 ms)")
    ratio_ax.axhline(2.5, color="grey", linestyle=":", linewidth=0.8, label="aim 2.5 (load, L=300 ms)")
    ratio_ax.set_yscale("log")
    ratio_ax.set_ylabel("makespan / bound (log scale)")
    ratio_ax.set_title("Makespan against the bound (3·L + critical path)", fontsize=10)
    ratio_ax.legend(fontsize=7)

    bars(event_ax, lambda r: r.get("cpu_ms_per_llm_call", 0))
    event_ax.axhline(8, color="grey", linestyle="--", linewidth=0.8, label="aim 8 ms")
    event_ax.set_ylabel("CPU ms per model call (daphne + qclusters)")
    event_ax.set_title("CPU per model call", fontsize=10)
    event_ax.legend(fontsize=7)

    machine = reports[0].get("machine", "") if reports else ""
    when = reports[0].get("measured_at", "") if reports else ""
    fig.suptitle(f"make bench on {machine}, {when}", fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    return output
