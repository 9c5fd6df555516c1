#!/usr/bin/env python3
"""The 3D search on GPT-3 175B over 1,024 A100s (gpt3-175b-1024.yaml, global batch 1,536): times the
whole `pipegrid search ... --top 10` (enumeration, ranking of every candidate that fits, the best 10
replayed in SimGrid) a few times, and draws its candidates: iteration time against peak memory per
device, the replayed ones marked (search.png, search.svg; data in search.json).

    experiments/megatron/search.py [--pipegrid build/pipegrid] [--runs 3] [--top 10] [--tp-folded] [--figure-only]

--tp-folded replays the best 10 TP-folded (docs/3d-search.md): only the timing is printed and the
JSON kept in search-tp-folded.json; search.json and the figure stay the whole-graph run's.

Timing is the wall time of the whole process (time.monotonic around it), median and range over the
runs; run it on an otherwise idle machine for a figure worth quoting.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
import pgx  # noqa: E402

EXPERIMENT = os.path.join(HERE, "gpt3-175b-1024.yaml")
GLOBAL_BATCH = 1536


def run_search(pipegrid, top, tp_folded=False):
    cmd = [pipegrid, "search", EXPERIMENT, "--global-batch", str(GLOBAL_BATCH), "--top", str(top), "--json"]
    if tp_folded:
        cmd.append("--tp-folded")
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return wall, json.loads(p.stdout)


def figure(plt, data, out_base):
    if plt is None:
        return
    ranked = data["analytic_ranking"]
    replayed = data["simgrid_ranking"]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    mem = [c["peak_memory_bytes"] / 2**30 for c in ranked]
    time_s = [c["analytic_iteration_time_s"] for c in ranked]
    ax.scatter(mem, time_s, s=7, color="0.6", alpha=0.5, linewidths=0,
               label=f"every candidate that fits ({len(ranked)}), analytic estimate")
    ax.scatter([c["peak_memory_bytes"] / 2**30 for c in replayed],
               [c["analytic_iteration_time_s"] for c in replayed], s=40, facecolors="none",
               edgecolors="tab:blue", linewidths=1.2, label=f"best {len(replayed)} (analytic)")
    ax.scatter([c["peak_memory_bytes"] / 2**30 for c in replayed],
               [c["simulated_iteration_time_s"] for c in replayed], s=28, marker="x", color="tab:red",
               linewidths=1.2, label="the same, replayed in SimGrid")
    if replayed:
        w = replayed[0]
        ax.scatter([w["peak_memory_bytes"] / 2**30], [w["simulated_iteration_time_s"]], s=160, marker="*",
                   color="gold", edgecolors="black", linewidths=0.8, zorder=5,
                   label="SimGrid's fastest:\nt{} p{} d{} b{} {}{}".format(
                       w["t"], w["p"], w["d"], w["micro_batch_size"],
                       ("interleaved v{}".format(w["chunks"]) if w["schedule"] == "interleaved-1f1b" else w["schedule"]),
                       ", " + ("no" if w["recompute"] == "none" else w["recompute"]) + " recomputation"
                       + (", SP" if w["sequence_parallel"] else "") + (", dist. optimizer" if w["distributed_optimizer"] else "")))
    ax.set_yscale("log")
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter
    lo, hi = min(time_s), max(time_s)
    ticks = [t for t in (20, 25, 30, 35, 40, 50, 60, 80, 100, 150, 200, 300, 400, 600, 1000) if lo * 0.8 <= t <= hi * 1.2]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("iteration time (s, log scale)")
    ax.set_title(f"3D search: GPT-3 175B on 1,024 A100 (dgx-a100-1024), global batch {GLOBAL_BATCH}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{out_base}.{ext}", dpi=150, bbox_inches="tight",
                    metadata={"Date": None} if ext == "svg" else None)
    print(f"wrote {out_base}.png and {out_base}.svg")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipegrid", default=os.environ.get("PIPEGRID", os.path.join(ROOT, "build", "pipegrid")))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--figure-only", action="store_true", help="draw from search.json, no run")
    ap.add_argument("--tp-folded", action="store_true", help="replay TP-folded; timing and search-tp-folded.json only")
    a = ap.parse_args()
    plt = pgx.matplotlib_pyplot()  # first: may re-run this script under an interpreter that has it
    data_file = os.path.join(HERE, "search.json")
    if not a.figure_only:
        walls, data = [], None
        for i in range(a.runs):
            wall, data = run_search(a.pipegrid, a.top, a.tp_folded)
            walls.append(wall)
            print(f"run {i + 1}: {wall:.1f} s", flush=True)
        print(f"pipegrid search (GPT-3 175B, 1,024 A100, top {a.top}{' TP-folded' if a.tp_folded else ''}): median {statistics.median(walls):.1f} s, "
              f"{min(walls):.1f}-{max(walls):.1f} s over {len(walls)} runs; {data['combinations']} combinations, "
              f"{data['feasible']} fit and are ranked")
        keep = ("t", "p", "d", "micro_batch_size", "micro_batches", "schedule", "chunks", "recompute",
                "sequence_parallel", "distributed_optimizer", "analytic_iteration_time_s", "peak_memory_bytes")
        data["analytic_ranking"] = [{k: c[k] for k in keep} for c in data["analytic_ranking"]]  # what the figure needs
        if a.tp_folded:
            with open(os.path.join(HERE, "search-tp-folded.json"), "w") as f:
                json.dump(data, f, separators=(",", ":"))
            return
        with open(data_file, "w") as f:
            json.dump(data, f, separators=(",", ":"))
    with open(data_file) as f:
        data = json.load(f)
    figure(plt, data, os.path.join(HERE, "search"))


if __name__ == "__main__":
    main()
