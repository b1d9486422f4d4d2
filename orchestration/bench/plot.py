"""The benchmark's plot: ratio to the ideal makespan, and event latency, per workload and setup."""

from __future__ import annotations

import json
from pathlib import Path


def plot(result_files: list[Path], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [json.loads(path.read_text()) for path in result_files]
    rows = [r for report in reports for r in report["results"]]
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
    ratio_ax.axhline(1.1, color="grey", linestyle="--", linewidth=0.8, label="aim 1.10 (one turn)")
    ratio_ax.axhline(1.5, color="grey", linestyle=":", linewidth=0.8, label="aim 1.5 (load)")
    ratio_ax.set_yscale("log")  # `load` is bound by workers and cores: an order of magnitude above the rest
    ratio_ax.set_ylabel("makespan / ideal (log scale)")
    ratio_ax.set_title("Makespan against the ideal", fontsize=10)
    ratio_ax.legend(fontsize=8)

    bars(event_ax, lambda r: r.get("event_latency_ms", {}).get("p95", 0))
    event_ax.axhline(100, color="grey", linestyle="--", linewidth=0.8, label="aim 100 ms (with Redis)")
    event_ax.set_ylabel("event commit → dashboard socket, p95 (ms)")
    event_ax.set_title("Event latency", fontsize=10)
    event_ax.legend(fontsize=8)

    machine = reports[0].get("machine", "") if reports else ""
    when = reports[0].get("measured_at", "") if reports else ""
    fig.suptitle(f"make bench on {machine}, {when}", fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    return output
