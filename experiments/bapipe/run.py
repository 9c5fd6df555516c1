#!/usr/bin/env python3
"""BaPipe-style exploration against data parallelism, GPipe and PipeDream (+1F1B).

VGG-16, ResNet-50 and GNMT-8 (fp16, mini-batch 64) on 4 and 8 V100s behind a PCIe-class switch,
and on rings of Alveo U280s and of VU9Ps linked through their QSFP28 ports: simulated iteration
time and peak memory of dp, gpipe (uniform stages), pipedream + 1f1b and bapipe, each with the
freedom to pick its micro-batch size. Writes results.md (tables and ratios, with BaPipe's published
headline beside them) and figure.png / figure.svg next to this script.

    experiments/bapipe/run.py        (after tools/setup --all; about a minute on 2 cores)
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
                     "strategy": dict(strategy, global_batch=MINI_BATCH),
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
            if len(reps) == 1:  # one stage: data parallelism, whatever order the schedule names
                plan = f"data parallelism on {reps[0]}, {b['micro_batches']} x {b['micro_batch_size']:g}"
            else:
                plan = f"{b['schedule']}, {b['micro_batches']} x {b['micro_batch_size']:g}, {layout}"
            ratios = [MODELS[m], c, plan]
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
        figure(results, plt, dest)
    print(f"wrote {os.path.join(dest, 'results.md')}" + (" and figure.png, figure.svg" if plt else ""))
    if violations:
        print("bapipe does not beat or tie a baseline it explores:\n  " + "\n  ".join(violations), file=sys.stderr)
        sys.exit(1)


# BaPipe's abstract (the only text read): "up to 3.2x speedup and 4x memory reduction" against
# data-parallel and pipeline-parallel frameworks.
PUBLISHED_SPEEDUP = 3.2
PUBLISHED_MEMORY = 4.0
COLOURS = {"dp": "#7F7F7F", "gpipe": "#4C72B0", "uniform+1f1b": "#8172B2", "pipedream+1f1b": "#DD8452",
           "bapipe": "#55A868"}


def figure(results, plt, dest):
    """Per model (columns): iteration time of every strategy (ms, log axis with 1-2-5 labels),
    then bapipe's speedup and memory reduction over each baseline (linear, from 0) with BaPipe's
    published maxima drawn as lines."""
    from matplotlib.ticker import FixedLocator, NullLocator

    baselines = [s for s in STRATEGIES if s != "bapipe"]
    fig, axes = plt.subplots(3, len(MODELS), figsize=(5.2 * len(MODELS), 11.5))
    clusters = list(CLUSTERS)
    xs = range(len(clusters))

    def bars(ax, names, value):
        width = 0.8 / len(names)
        for k, s in enumerate(names):
            ys = [value(m_c, s) for m_c in clusters]
            ax.bar([i - 0.4 + (k + 0.5) * width for i in xs], [y or 0 for y in ys], width, label=s, color=COLOURS[s])
        ax.set_xticks(list(xs))
        ax.set_xticklabels(clusters, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(clusters) - 0.4)

    for col, m in enumerate(MODELS):
        def result(c, s):
            x = results[(m, c, s)]
            return None if "error" in x or not x["feasible"] else x

        def time_ms(c, s):
            x = result(c, s)
            return None if x is None else x["iteration_time_s"] * 1e3

        def ratio(key):
            def f(c, s):
                x, b = result(c, s), result(c, "bapipe")
                return None if x is None or b is None else x[key] / b[key]
            return f

        ax = axes[0][col]
        bars(ax, list(STRATEGIES), time_ms)
        ax.set_yscale("log")
        values = [v for c in clusters for s in STRATEGIES for v in [time_ms(c, s)] if v]
        ticks = [t * 10 ** e for e in range(-1, 5) for t in (1, 2, 5)]
        ax.set_ylim(min(values) / 1.5, max(values) * 1.5)
        ax.yaxis.set_major_locator(FixedLocator([t for t in ticks if min(values) / 1.5 <= t <= max(values) * 1.5]))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylabel("iteration time (ms, log scale)")
        ax.set_title(MODELS[m])
        ax.grid(axis="y", alpha=0.3)

        for row, key, published, style, label in (
                (1, "iteration_time_s", PUBLISHED_SPEEDUP, "--", "speedup"),
                (2, "peak_memory_bytes", PUBLISHED_MEMORY, ":", "memory reduction")):
            ax = axes[row][col]
            bars(ax, baselines, ratio(key))
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.axhline(published, color="#C44E52", linestyle=style, linewidth=1.3,
                       label=f"BaPipe (published): up to {published:g}x")
            ax.set_ylim(0, 4.5)
            ax.set_ylabel(f"bapipe's {label} over (x)")
            ax.grid(axis="y", alpha=0.3)
    # Legends above each row, outside the axes: they cover no bar.
    for row, title in enumerate(("Simulated iteration time (lower is better); a missing bar: no plan fits memory",
                                 "bapipe's speedup over each baseline (baseline time / bapipe time; 1 = tie)",
                                 "bapipe's memory reduction (baseline peak memory / bapipe peak memory)")):
        handles, labels = axes[row][0].get_legend_handles_labels()
        axes[row][1].legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.08 if row == 0 else 1.0),
                            ncol=len(labels), fontsize=8, frameon=False, title=title, title_fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.93, bottom=0.06, hspace=0.75, wspace=0.25)
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(dest, f"figure.{ext}"), dpi=120,
                    metadata={"Date": None} if ext == "svg" else {"Software": None})


if __name__ == "__main__":
    main()
