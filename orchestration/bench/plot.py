"""The benchmark's plot: ratio to the ideal makespan, per workload and setup."""

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
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for index, (setup, latency) in enumerate(series):
        values = [
            next((r["ratio"] for r in rows if (r["setup"], r["latency_ms"], r["workload"]) == (setup, latency, w)), 0)
            for w in workloads
        ]
        positions = [i + index * width for i in range(len(workloads))]
        ax.bar(positions, values, width, label=f"{setup}, L={latency} ms")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.1, color="grey", linestyle="--", linewidth=0.8, label="aim 1.10")
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(workloads))], workloads)
    ax.set_yscale("log")  # `load` on a few workers is an order of magnitude above the rest
    ax.set_ylabel("makespan / ideal (log scale)")
    machine = reports[0].get("machine", "") if reports else ""
    ax.set_title(f"Makespan against the ideal ({machine})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    return output
