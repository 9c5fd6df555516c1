#!/usr/bin/env python3
"""BaPipe-style exploration against data parallelism, GPipe and PipeDream (+1F1B).

VGG-16, ResNet-50 and GNMT-8 (fp16, mini-batch 64) on 4 and 8 V100s behind a PCIe-class switch,
and on rings of Alveo U280s and of VU9Ps linked through their QSFP28 ports: simulated iteration
time and peak memory of dp, gpipe (uniform stages), pipedream + 1f1b and bapipe, each with the
freedom to pick its micro-batch size. Writes results.md (tables and ratios, with BaPipe's published
headline beside them) and figure.png / figure.svg next to this script.

    experiments/bapipe/run.py        (after tools/setup; about a minute on 2 cores)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import pgx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")
MINI_BATCH = 64

MODELS = {"vgg16": "VGG-16", "resnet50": "ResNet-50", "gnmt8": "GNMT-8"}
CLUSTERS = {
    "4 x V100": {"kind": "switch", "count": 4, "device": {"name": "gpu", "model": "v100"},
                 "bandwidth": "16GBps", "latency": "5us"},
    "8 x V100": {"kind": "switch", "count": 8, "device": {"name": "gpu", "model": "v100"},
                 "bandwidth": "16GBps", "latency": "5us"},
    "4 x U280 ring": {"kind": "fpga-ring", "count": 4, "device": "u280"},
    "8 x U280 ring": {"kind": "fpga-ring", "count": 8, "device": "u280"},
    "4 x VU9P ring": {"kind": "fpga-ring", "count": 4, "device": "vu9p"},
    "8 x VU9P ring": {"kind": "fpga-ring", "count": 8, "device": "vu9p"},
}
STRATEGIES = {
    "dp": {"partitioner": "dp", "schedule": "gpipe"},
    "gpipe": {"partitioner": "uniform", "schedule": "gpipe"},
    "uniform+1f1b": {"partitioner": "uniform", "schedule": "1f1b"},
    "pipedream+1f1b": {"partitioner": "pipedream", "schedule": "1f1b"},
    "bapipe": {"partitioner": "bapipe"},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", default=HERE, help="folder for results.md and figure.png/.svg (default: this script's)")
    args = ap.parse_args()
    dest = args.out
    os.makedirs(dest, exist_ok=True)
    plt = pgx.matplotlib_pyplot()  # first: may re-run this script under an interpreter that has it
    os.makedirs(OUT, exist_ok=True)
    jobs = []
    for m in MODELS:
        for c, cluster in CLUSTERS.items():
            for s, strategy in STRATEGIES.items():
                e = {"name": f"{m} on {c}, {s}",
                     "workload": {"model": m, "precision": "fp16"},
                     "cluster": cluster,
                     "strategy": dict(strategy, mini_batch=MINI_BATCH),
                     "memory": {"optimizer": "mixed-adam"}}
                path = os.path.join(OUT, f"{m}-{c.replace(' ', '').replace('x', 'x')}-{s.replace('+', '_')}.yaml")
                jobs.append(((m, c, s), e, path))
    results = pgx.run_all(jobs)
    rows, ratio_rows, errors = [], [], []
    BASELINES = ("dp", "gpipe", "uniform+1f1b", "pipedream+1f1b")
    best_speedup = {s: 0 for s in BASELINES}
    best_memory = {s: 0 for s in BASELINES}
    # The check: bapipe explores gpipe and uniform + 1f1b, so it must beat or tie both.
    TOLERANCE = 1e-6
    violations = []
    for m in MODELS:
        for c in CLUSTERS:
            cells = [MODELS[m], c]
            r = {s: results[(m, c, s)] for s in STRATEGIES}
            for s in STRATEGIES:
                x = r[s]
                if "error" in x:
                    cells.append("does not fit" if "memory" in x["error"] or "fit" in x["error"] else "error")
                    errors.append(f"{MODELS[m]} on {c}, {s}: {x['error']}")
                else:
                    flag = "" if x["feasible"] else " (over memory)"
                    cells.append(f"{pgx.fmt_time(x['iteration_time_s'])} / "
                                 f"{pgx.fmt_gib(x['peak_memory_bytes'])}{flag}")
            rows.append(cells)
            b = r["bapipe"]
            if "error" in b:
                continue
            reps = [st["replicas"] for st in b["stages"]]
            layout = f"{len(reps)} stages x {reps[0]}" if len(set(reps)) == 1 else \
                f"{len(reps)} stages, replicas {'-'.join(str(x) for x in reps)}"
            ratios = [MODELS[m], c, f"{b['schedule']}, {b['micro_batches']} x {b['micro_batch_size']:g}, {layout}"]
            for s in ("gpipe", "uniform+1f1b"):
                x = r[s]
                if "error" not in x and x["feasible"] and \
                        b["iteration_time_s"] > x["iteration_time_s"] * (1 + TOLERANCE):
                    violations.append(f"{MODELS[m]} on {c}: bapipe {pgx.fmt_time(b['iteration_time_s'])} "
                                      f"> {s} {pgx.fmt_time(x['iteration_time_s'])}")
            if not b["feasible"]:
                violations.append(f"{MODELS[m]} on {c}: bapipe's plan is over memory")
            for s in BASELINES:
                x = r[s]
                if "error" in x or not x["feasible"]:
                    ratios += ["-", "-"]
                    continue
                speed = x["iteration_time_s"] / b["iteration_time_s"]
                mem = x["peak_memory_bytes"] / b["peak_memory_bytes"]
                best_speedup[s] = max(best_speedup[s], speed)
                best_memory[s] = max(best_memory[s], mem)
                ratios += [f"{speed:.2f}x", f"{mem:.2f}x"]
            ratio_rows.append(ratios)
    with open(os.path.join(dest, "results.md"), "w") as f:
        f.write("# BaPipe-style exploration: results\n\n")
        f.write(f"Generated by `experiments/bapipe/run.py` (mini-batch {MINI_BATCH}, fp16, mixed-precision Adam; "
                "every strategy picks its best micro-batch size). Simulated iteration time / peak memory "
                "(GiB, the fullest device):\n\n")
        f.write(pgx.markdown_table(["model", "cluster"] + list(STRATEGIES), rows) + "\n\n")
        f.write("bapipe's plan and its speedup / memory reduction (peak memory ratio) against each baseline:\n\n")
        f.write(pgx.markdown_table(["model", "cluster", "bapipe's plan"] +
                                   [h for s in BASELINES for h in (f"vs {s}: speedup", "memory")],
                                   ratio_rows) + "\n\n")
        f.write("Check (bapipe beats or ties gpipe and uniform+1f1b on every row, and fits memory): " +
                ("holds.\n\n" if not violations else "FAILS:\n\n" + "\n".join(f"- {v}" for v in violations) +
                 "\n\n"))
        f.write("BaPipe's abstract (published): up to 3.2x speedup and 4x memory reduction against data-parallel and "
                "pipeline-parallel frameworks.\n\n")
        f.write("pipegrid's bapipe here: up to " +
                ", ".join(f"{best_speedup[s]:.2f}x speedup and {best_memory[s]:.2f}x memory reduction vs {s}"
                          for s in best_speedup) + ".\n")
        if errors:
            f.write("\nRuns that did not produce a plan:\n\n" + "\n".join(f"- {e}" for e in errors) + "\n")
    if plt:
        fig, axes = plt.subplots(2, len(MODELS), figsize=(5 * len(MODELS), 7))
        colours = {"dp": "#7F7F7F", "gpipe": "#4C72B0", "uniform+1f1b": "#8172B2", "pipedream+1f1b": "#DD8452", "bapipe": "#55A868"}
        for col, m in enumerate(MODELS):
            for row, (key, label) in enumerate((("iteration_time_s", "iteration time (s)"),
                                               ("peak_memory_bytes", "peak memory (GiB)"))):
                ax = axes[row][col]
                width = 0.8 / len(STRATEGIES)
                for k, s in enumerate(STRATEGIES):
                    ys = []
                    for c in CLUSTERS:
                        x = results[(m, c, s)]
                        v = 0 if "error" in x else x[key]
                        ys.append(v / 2**30 if "memory" in key else v)
                    ax.bar([i + k * width for i in range(len(CLUSTERS))], ys, width, label=s, color=colours[s])
                ax.set_xticks([i + 0.4 - width / 2 for i in range(len(CLUSTERS))])
                ax.set_xticklabels(list(CLUSTERS), rotation=30, ha="right", fontsize=8)
                ax.set_ylabel(label)
                if row == 0:
                    ax.set_yscale("log")
                if row == 0:
                    ax.set_title(MODELS[m])
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        for ext in ("png", "svg"):
            fig.savefig(os.path.join(dest, f"figure.{ext}"), dpi=120,
                        metadata={"Date": None} if ext == "svg" else {"Software": None})
    print(f"wrote {os.path.join(dest, 'results.md')}" + (" and figure.png, figure.svg" if plt else ""))
    if violations:
        print("bapipe does not beat or tie a baseline it explores:\n  " + "\n  ".join(violations), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
