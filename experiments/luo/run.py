#!/usr/bin/env python3
"""Luo et al.-style pipeline planning (INFOCOM'22) against DAPPLE, PipeDream, GPipe and BaPipe.

VGG-19, GNMT-16, BERT-24, XLNet-36 and AmoebaNet-36 from DAPPLE's measured V100 layer profiles
(workloads/profiles/dapple/, trace-driven) on DGX-1 V100 clusters: one server (8 GPUs, NVLink
hybrid cube-mesh), two servers over EDR InfiniBand and over 25 Gb/s Ethernet (16 GPUs), and a
mixed-link cluster (a DGX-1 and a PCIe-only server, 16 GPUs). Every planner picks its micro-batch
size dividing the mini-batch; the simulated (SimGrid) iteration time of its plan and its search
time are tabulated (search times printed, not written: results.md has the same bytes for the same
inputs). Writes results.md (with Luo et al.'s headline, up to 157% faster = 2.57x,
beside pipegrid's best ratio) and figure.png / figure.svg next to this script (or in --out).

A planner that `pipegrid list planners` does not show (e.g. `luo` before it is merged) is
reported as missing; its cells stay empty.

    experiments/luo/run.py            (after tools/setup --all; a few minutes on 2 cores)
    experiments/luo/run.py --smallest (VGG-19 on one DGX-1 only: the ctest)
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import pgx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")
PROFILES = os.path.join(pgx.ROOT, "workloads", "profiles", "dapple")

# DAPPLE's profiles carry the per-GPU batch they were measured with (`pbs-N`). The mini-batch of an
# iteration is 16 such batches: one profiled batch per GPU on 16 GPUs, two on 8 (pipegrid's choice;
# DAPPLE's and Luo et al.'s global batch sizes are not in docs/reference/papers.md).
BATCHES_PER_ITERATION = 16
MODELS = {
    "vgg19": {"label": "VGG-19", "file": "vgg-19-pbs-32.txt", "batch": 32},
    "gnmt16": {"label": "GNMT-16", "file": "gnmt-16-pbs-64.txt", "batch": 64},
    "bert24": {"label": "BERT-24", "file": "bert-24-pbs-6.txt", "batch": 6},
    "xlnet36": {"label": "XLNet-36", "file": "xlnet-36-pbs-1.txt", "batch": 1},
    "amoeba36": {"label": "AmoebaNet-36", "file": "amoeba-36-pbs-1.txt", "batch": 1},
}
CLUSTERS = {
    "1 DGX-1 (8)": "dgx1-v100-8",
    "2 DGX-1, IB (16)": "dgx1-v100-16",
    "2 DGX-1, 25GbE (16)": "dgx1-v100-16-25gbe",
    "DGX-1 + PCIe (16)": "dgx1-mixed-16",
}
PLANNERS = {
    "luo": {"planner": "luo"},  # luo's own search alone: the column the finding is read from
    "dapple": {"planner": "dapple"},
    # PipeDream plans at its profile's batch: micro-batches of the profiled size (PipeDream's own
    # setting; its planner on GNMT-16 over 16 GPUs also takes 10-24 s a call here).
    "pipedream": {"partitioner": "pipedream", "schedule": "1f1b", "micro_batches": BATCHES_PER_ITERATION},
    "gpipe-uniform": {"partitioner": "uniform", "schedule": "gpipe"},
    "bapipe": {"planner": "bapipe"},
    # luo with `baselines: true`: its own plans and every other planner's, the best kept. It beats or
    # ties every baseline by construction (their plans are among its candidates), so it is named so
    # and kept apart from luo's own column.
    "best-of-all (luo + baselines)": {"planner": "luo", "baselines": True},
}
COMBINED = "best-of-all (luo + baselines)"
# The baselines whose plans luo's `baselines: true` takes as candidates: the registered planners.
# pipedream and gpipe-uniform are partitioner + schedule choices, not planners: not among them.
COMBINED_COVERS = ("dapple", "bapipe")
BASELINES = ("dapple", "pipedream", "gpipe-uniform", "bapipe")
HEADLINE = 2.57  # Luo et al.: "up to 157% faster than state-of-the-art designs"
MEMORY = {"optimizer": "adam"}  # fp32 profiles: weights, gradients and two Adam moments


def work_bound(model, gpus):
    """No plan beats the busiest device: every GPU's share of the mini-batch's forward and backward
    compute, read from the profile here (Input nodes' times dropped, as pipegrid does), with times
    linear in the batch and communication free. Seconds."""
    m = MODELS[model]
    total_ms = 0.0
    with open(os.path.join(PROFILES, m["file"])) as f:
        for line in f:
            x = re.search(r"^node\S+ -- (.*?) -- forward_compute_time=([0-9.]+), backward_compute_time=([0-9.]+)", line)
            if x and not x.group(1).startswith("Input"):
                total_ms += float(x.group(2)) + float(x.group(3))
    return total_ms / 1e3 * BATCHES_PER_ITERATION / gpus


def gpus_of(cluster):
    return int(re.search(r"\(([0-9]+)\)", cluster).group(1))


def available_planners():
    p = subprocess.run([pgx.binary(), "list", "planners"], capture_output=True, text=True, check=True)
    # Lines "  NAME  description" under a "planners:" heading (or bare lines).
    names = set()
    for line in p.stdout.splitlines():
        words = line.split()
        if words and not line.rstrip().endswith(":"):
            names.add(words[0])
    return names


def experiment(model, cluster, planner):
    m = MODELS[model]
    strategy = dict(PLANNERS[planner])
    if "micro_batches" not in strategy:
        strategy["global_batch"] = m["batch"] * BATCHES_PER_ITERATION
    return {
        "name": f"{m['label']} on {cluster}, {planner}",
        "workload": {"profile": os.path.join(PROFILES, m["file"]), "batch": m["batch"], "device": "v100"},
        "cluster": {"preset": CLUSTERS[cluster]},
        "strategy": strategy,
        "memory": MEMORY,
    }


def cell_time(x):
    if x is None:
        return "missing"
    if "error" in x:
        return "no plan" if "fit" in x["error"] or "memory" in x["error"] else "error"
    return pgx.fmt_time(x["iteration_time_s"]) + ("" if x["feasible"] else " (over memory)")


def ok(x):
    return x is not None and "error" not in x and x["feasible"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", default=HERE, help="folder for results.md and figure.png/.svg (default: this script's)")
    ap.add_argument("--smallest", action="store_true", help="only VGG-19 on one DGX-1 (seconds; the ctest)")
    args = ap.parse_args()
    dest = args.out
    os.makedirs(dest, exist_ok=True)
    plt = pgx.matplotlib_pyplot()  # first: may re-run this script under an interpreter that has it
    if not os.path.isdir(PROFILES):
        sys.exit(f"DAPPLE's profiles are missing: {PROFILES}")
    os.makedirs(OUT, exist_ok=True)
    have = available_planners()
    # Strategies without a planner key run the default planner (`partitioner`) with their partitioner.
    missing = [p for p in PLANNERS if PLANNERS[p].get("planner", "partitioner") not in have]
    for p in missing:
        print(f"planner {p} is missing (pipegrid list planners does not show it): reported as missing",
              file=sys.stderr)
    models = ["vgg19"] if args.smallest else list(MODELS)
    clusters = ["1 DGX-1 (8)"] if args.smallest else list(CLUSTERS)
    jobs = []
    for m in models:
        for c in clusters:
            for p in PLANNERS:
                if p in missing:
                    continue
                name = f"{m}-{CLUSTERS[c]}-{p}"
                jobs.append(((m, c, p), experiment(m, c, p), os.path.join(OUT, name + ".yaml")))
    results = pgx.run_all(jobs)

    rows, ratio_rows, search_rows, errors = [], [], [], []
    best_over_best, best_over = 0.0, {b: 0.0 for b in BASELINES}
    worst_over_best = None
    max_headroom = 0.0  # the most any planner could gain over the best baseline (work bound)
    violations = []  # the combined column must beat or tie every baseline (a check of the combining)
    luo_losses = []  # rows where luo's own search is slower than a baseline (reported, not an error)
    TOLERANCE = 1e-6
    for m in models:
        for c in clusters:
            r = {p: results.get((m, c, p)) for p in PLANNERS}
            for p, x in r.items():
                if x is not None and "error" in x:
                    errors.append(f"{MODELS[m]['label']} on {c}, {p}: {x['error']}")
            rows.append([MODELS[m]["label"], c] + [cell_time(r[p]) for p in PLANNERS])
            search_rows.append([MODELS[m]["label"], c] + [
                "missing" if r[p] is None else "-" if "error" in r[p] else f"{r[p]['planning_seconds']:.3f}"
                for p in PLANNERS])
            base = {b: r[b]["iteration_time_s"] for b in BASELINES if ok(r[b])}
            ratios = []
            if ok(r["luo"]) and base:
                t = r["luo"]["iteration_time_s"]
                best = min(base.values())
                over_best = best / t
                best_over_best = max(best_over_best, over_best)
                worst_over_best = over_best if worst_over_best is None else min(worst_over_best, over_best)
                ratios.append(f"{over_best:.2f}x")
                for b in BASELINES:
                    if b in base:
                        best_over[b] = max(best_over[b], base[b] / t)
                        ratios.append(f"{base[b] / t:.2f}x")
                    else:
                        ratios.append("-")
            else:
                ratios = ["-"] * (1 + len(BASELINES))
            if ok(r[COMBINED]):
                for b, tb in ((b, tb) for b, tb in base.items() if b in COMBINED_COVERS):
                    if r[COMBINED]["iteration_time_s"] > tb * (1 + TOLERANCE):
                        violations.append(f"{MODELS[m]['label']} on {c}: {COMBINED} "
                                          f"{pgx.fmt_time(r[COMBINED]['iteration_time_s'])} > {b} "
                                          f"{pgx.fmt_time(tb)}")
            elif COMBINED not in missing:
                violations.append(f"{MODELS[m]['label']} on {c}: {COMBINED} has no feasible plan")
            if ok(r["luo"]):
                slower = [b for b, tb in base.items() if r["luo"]["iteration_time_s"] > tb * (1 + TOLERANCE)]
                if slower:
                    luo_losses.append(f"{MODELS[m]['label']} on {c}: luo {pgx.fmt_time(r['luo']['iteration_time_s'])}"
                                      f" is slower than " + ", ".join(f"{b} ({pgx.fmt_time(base[b])})" for b in slower))
            best_name = min(base, key=base.get) if base else "-"
            bound = work_bound(m, gpus_of(c))
            headroom = min(base.values()) / bound if base else None
            if headroom is not None:
                max_headroom = max(max_headroom, headroom)
            ratio_rows.append([MODELS[m]["label"], c, best_name, pgx.fmt_time(bound),
                               f"{headroom:.2f}x" if headroom else "-"] + ratios)

    lines = ["# Luo et al.-style planning against DAPPLE, PipeDream, GPipe and BaPipe", "",
             "Generated by `experiments/luo/run.py`" + (" --smallest" if args.smallest else "") +
             "; see README.md for the set-up and the reading.", ""]
    if missing:
        lines += [f"**Missing planners** (not shown by `pipegrid list planners` when this ran): "
                  f"{', '.join(missing)}; their cells say `missing`.", ""]
    lines += ["## Simulated iteration time (SimGrid), per planner", "",
              pgx.markdown_table(["model", "cluster"] + list(PLANNERS), rows), "",
              "## luo's speed-up (baseline time / luo time; luo's own search, without the baselines' plans)", "",
              pgx.markdown_table(["model", "cluster", "best baseline", "work bound", "best / bound", "over the best"] +
                                 [f"over {b}" for b in BASELINES], ratio_rows), "",
              "Work bound: every GPU's share of the mini-batch's forward + backward compute (from the profile, "
              "communication free): no plan is faster. best / bound is the most any planner, luo included, "
              f"could gain over the best baseline of the row in this model: at most {max_headroom:.2f}x here.", ""]
    if best_over_best > 0:
        lines += [f"Luo et al.'s headline: up to **{HEADLINE:.2f}x** (157% faster) than the state of the art. "
                  f"pipegrid: luo's own search is up to **{best_over_best:.2f}x** faster than the best baseline of a "
                  f"row (at worst {worst_over_best:.2f}x, i.e. {'slower' if worst_over_best < 1 - TOLERANCE else 'never slower'}"
                  f"); over each baseline at best: " +
                  ", ".join(f"{b} {best_over[b]:.2f}x" for b in BASELINES) + ".", ""]
    else:
        lines += [f"Luo et al.'s headline: up to **{HEADLINE:.2f}x** (157% faster). pipegrid: no luo result "
                  "(missing or no feasible plan), so no ratio.", ""]
    lines += ["## Rows where luo's own search is slower than a baseline", ""] + (
        [f"- {v}" for v in luo_losses] if luo_losses else ["None."]) + [""]
    if violations:
        lines += [f"## Rows where {COMBINED} does not beat or tie a planner whose plans it had ({', '.join(COMBINED_COVERS)})",
                  ""] + [f"- {v}" for v in violations] + [""]
    if errors:
        lines += ["## Runs without a plan", ""] + [f"- {e}" for e in errors] + [""]
    with open(os.path.join(dest, "results.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    # Wall-clock times differ from run to run: printed, not written into results.md (same inputs, same
    # bytes); README.md keeps a measured snapshot.
    print("## Planner search time (s, wall clock of the planner inside `pipegrid plan`)\n")
    print(pgx.markdown_table(["model", "cluster"] + list(PLANNERS), search_rows))

    if plt is not None:
        figure(plt, models, clusters, results, missing, dest)
    if violations:
        print(f"{COMBINED} does not beat or tie every baseline (its candidates include theirs):\n  " +
              "\n  ".join(violations), file=sys.stderr)
        sys.exit(1)


def figure(plt, models, clusters, results, missing, dest):
    present = [p for p in PLANNERS if p not in missing]
    fig, axes = plt.subplots(1, len(models), figsize=(2.6 * len(models) + 1, 4.2), squeeze=False)
    width = 0.8 / max(1, len(present))
    for col, m in enumerate(models):
        ax = axes[0][col]
        for k, p in enumerate(present):
            xs, ys = [], []
            for i, c in enumerate(clusters):
                x = results.get((m, c, p))
                if ok(x):
                    xs.append(i + (k - (len(present) - 1) / 2) * width)
                    ys.append(x["iteration_time_s"] * 1e3)
            ax.bar(xs, ys, width, label=p, color=f"C{k}")
        ax.set_xticks(range(len(clusters)))
        ax.set_xticklabels([c.replace(" (", "\n(") for c in clusters], fontsize=6, rotation=45, ha="right")
        ax.set_title(MODELS[m]["label"], fontsize=9)
        ax.set_yscale("log")  # the planners differ by up to 4x, the models by 100x
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 200, not 2 x 10^2
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="y", labelsize=7, which="both")
        ax.grid(axis="y", which="major", color="0.9", linewidth=0.6)
        ax.set_axisbelow(True)
        if col == 0:
            ax.set_ylabel("simulated iteration time (ms)", fontsize=8)
    # One legend for every panel, below them: never over the bars.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(present), fontsize=7, frameon=False)
    fig.suptitle("Simulated iteration time (log scale) of each planner's plan: DAPPLE's profiles on DGX-1 clusters" +
                 (f"\n(missing: {', '.join(missing)})" if missing else ""), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(dest, f"figure.{ext}"), dpi=130,
                    metadata={"Date": None} if ext == "svg" else {"Software": None})
    print(f"wrote {os.path.join(dest, 'results.md')} and figure.png, figure.svg", file=sys.stderr)


if __name__ == "__main__":
    main()
