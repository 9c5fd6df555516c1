#!/usr/bin/env python3
"""pipegrid's predicted training throughput against published measurements (issue 11).

Every row of measurements.yaml (a published, measured training throughput) becomes a pipegrid
experiment that reproduces its setting: the zoo model with its parameters, the row's precision,
micro-batch = batch per GPU, pure data parallelism (`dp`) over the row's GPUs in its system.
pipegrid's throughput is converted to the row's metric and compared. Writes results.md,
accuracy.yaml (the check rows' errors by GPU and precision, which `pipegrid run` prints),
figure.png and figure.svg; exits 1 when the check rows fail (median |error| > 10%, max > 30%, or
a check row outside +-25% that is not in a same-configuration group whose published values
disagree by more than 1.4x: those are listed with the group's spread and floor).

    experiments/validation/run.py [--pipegrid build/pipegrid] [-j 2] [--rows all]
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, HERE)
import consistency  # noqa: E402
import pgx  # noqa: E402
import vlib  # noqa: E402

MEDIAN_LIMIT = 0.10  # check rows: median |error| at most this
MAX_LIMIT = 0.30  # check rows: max |error| at most this
ROW_LIMIT = 0.25  # check rows: every |error| at most this, but rows of a group whose sources disagree
SPREAD_LIMIT = 1.4  # by more than this (consistency.row_groups: published max / min of the group)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Rules and results: experiments/validation/README.md")
    vlib.add_common_args(p, "results.md and figure.png/.svg")
    p.add_argument("--rows", choices=("calibration", "check", "all"), default="all", help="which rows (default all)")
    p.add_argument("--scaling", metavar="FILE", default=vlib.SCALING,
                   help="multi-node scaling series (default: scaling.yaml here; '' for none)")
    p.add_argument("--megatron-max-gpus", type=int, default=4096,
                   help="Megatron-LM's rows (experiments/megatron/rows.yaml) on at most this many GPUs (default 4096: "
                        "all that pipegrid can replay; 0: none)")
    p.add_argument("--calibration", metavar="FILE",
                   help="apply a calibration.yaml's fitted efficiencies as device overrides (default: the catalog's)")
    return p.parse_args()


def pct(x):
    return f"{100 * x:+.1f}%"


UNITS = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "tflops_per_gpu": "TFLOP/s per GPU",
         "megatron_tflops_per_gpu": "TFLOP/s per GPU (Megatron's formula)", "iteration_s": "s per iteration",
         "layer_ms": "ms per layer and pass"}


def group_medians(rows, results, key, label):
    groups, failed = {}, {}
    for r in rows:
        x = results[r["id"]]
        groups.setdefault(key(r), [])
        if "error" in x:
            failed[key(r)] = failed.get(key(r), 0) + 1
        else:
            groups[key(r)].append(x["ratio"])
    return pgx.markdown_table(
        [label, "rows that ran", "could not run", "median pipegrid/published", "median \\|error\\|"],
        [[g, len(v), failed.get(g, 0), f"{statistics.median(v):.3f}" if v else "-",
          f"{100 * statistics.median(abs(x - 1) for x in v):.1f}%" if v else "-"]
         for g, v in sorted(groups.items())])


def write_scaling(f, scaling):
    """The multi-node section of results.md."""
    f.write("\nMulti-node data-parallel scaling (scaling.yaml; not part of the check): per-GPU rate at N "
            "DGX A100 nodes over the rate at 1 node, published and pipegrid's; error = pipegrid's / "
            "published - 1. Figure: scaling.png / scaling.svg.\n\n")
    table = []
    for s, p, pub, mine, err in scaling:
        if int(p["nodes"]) == 1:
            continue
        table.append([s["id"], p["nodes"], p["accumulation_steps"], f"{pub:.3f}",
                      "error: " + err if err else f"{mine:.3f}", "-" if err else pct(mine / pub - 1),
                      f"[{s['source']}]({s['url']})"])
    f.write(pgx.markdown_table(["series", "nodes", "accumulation", "published", "pipegrid", "error", "source"],
                               table) + "\n")


def write_outside(f, outside_rows):
    """The check rows outside +-25%, each with its same-configuration group's spread and floor."""
    f.write("Check rows outside +-25%, beside the data's own floor: the group is the row's same-configuration "
            "group (consistency.py: same model, GPU, precision and GPU count from other sources), spread its "
            "published max / min, floor the least max |error| any model reaches on it, (spread - 1) / "
            "(spread + 1); a row of a group whose spread exceeds 1.4x is excepted from the +-25% check.\n\n")
    table = [[r["id"], pct(err), label, "-" if spread is None else f"{spread:.2f}x",
              "-" if spread is None else f"{100 * consistency.floor(spread):.0f}%", "yes" if excepted else "no"]
             for r, err, label, spread, excepted in outside_rows]
    f.write((pgx.markdown_table(["id", "error", "group", "spread", "floor", "excepted"], table) if table
             else "(none)") + "\n\n")


def scaling_pairs(rows, results):
    """Pairs of rows that differ only in their GPU count (and the accumulation that keeps the global
    batch): 1 and N GPUs of one server, the same source, model, parameters, GPU, precision and batch per
    GPU. Per-GPU rate at N GPUs over the rate at 1, published and pipegrid's. Both sets; a diagnostic,
    not part of the check."""
    def key(r):
        return (r["source"], r["model"], tuple(sorted((r.get("model_params") or {}).items())), r["gpu"],
                str(r.get("gpu_memory")), r["precision"], str(r["batch_per_gpu"]), r["metric"])
    by = {}
    for r in rows:
        if r["id"].startswith("megatron-") or "error" in results.get(r["id"], {"error": 1}):
            continue
        by.setdefault(key(r), {})[int(r["gpus"])] = r
    out = []
    for _, g in sorted(by.items(), key=lambda kv: sorted(r["id"] for r in kv[1].values())):
        if 1 not in g or len(g) < 2:
            continue
        one = g[1]
        for n, r in sorted(g.items()):
            if n == 1:
                continue
            pub = float(r["value"]) / (n * float(one["value"]))
            mine = results[r["id"]]["pipegrid"] / (n * results[one["id"]]["pipegrid"])
            # the published time per micro-batch at 1 GPU, and what the N-GPU run takes beyond pipegrid's
            step = float(one["batch_per_gpu"]) / (float(one["value"]) * vlib.samples_per_unit(one))
            out.append((one, r, n, (int(one.get("accumulation_steps", 1)), int(r.get("accumulation_steps", 1))),
                        pub, mine, step * (1 / pub - 1 / mine)))
    return out


def write_pairs(f, pairs):
    f.write("\nIn-server data-parallel scaling (both sets; a diagnostic, not part of the check): pairs of rows "
            "that differ only in their GPU count; efficiency = per-GPU rate at N GPUs over the rate at 1, "
            "published and pipegrid's; accumulation = micro-batches per optimizer step at 1 / N GPUs (at N, "
            "1 means the gradients are all-reduced after every micro-batch); missing = the published time per "
            "micro-batch at 1 GPU x (1 / published - 1 / pipegrid's), the time per micro-batch the N-GPU run "
            "takes beyond pipegrid's scaling.\n\n")
    table = [[one["id"], r["id"], f"{acc[0]} / {acc[1]}", f"{pub:.3f}", f"{mine:.3f}", pct(mine / pub - 1),
              f"{1e3 * lost:.1f}"] for one, r, n, acc, pub, mine, lost in pairs]
    f.write(pgx.markdown_table(["1 GPU", "N GPUs", "accumulation", "published", "pipegrid", "pipegrid / published - 1",
                                "missing, ms"], table) + "\n\n")
    for label, sel in (("all-reduce after every micro-batch at N GPUs", lambda a: a[1] == 1),
                       ("accumulating at N GPUs", lambda a: a[1] > 1)):
        d = [mine / pub - 1 for _, _, _, acc, pub, mine, _ in pairs if sel(acc)]
        lost = [1e3 * x for *_, acc, _, _, x in pairs if sel(acc)]
        if d:
            f.write(f"- {label}: {len(d)} pairs, pipegrid's efficiency over the published median "
                    f"{pct(statistics.median(d))}, range {pct(min(d))} to {pct(max(d))}; missing per micro-batch "
                    f"median {statistics.median(lost):.1f} ms, range {min(lost):.1f} to {max(lost):.1f}\n")


def write_results(path, rows, results, lines, failures, scaling=(), outside_rows=(), pairs=()):
    order = sorted(rows, key=lambda r: (r["set"], r["id"]))
    table = []
    for r in order:
        x = results[r["id"]]
        link = f"[{r['source']}]({r['url']})"
        pub = f"{vlib.fmt_value(float(r['value']))} {UNITS.get(r['metric'], r['metric'])}"
        if "error" in x:
            got, ratio = "error", "-"
        else:
            got = (vlib.fmt_value(x["pipegrid"]) + ("" if x["feasible"] else " (over memory)")
                   + (" (SimGrid, TP-folded: above the task limit as a whole graph)" if x.get("folded") else ""))
            ratio = f"{x['ratio']:.3f}"
        table.append([r["id"], r["model"] + "".join(f" {k}={v}" for k, v in sorted((r.get("model_params") or {}).items())),
                      f"{r['gpu']} x {r['gpus']}", r["precision"], r["batch_per_gpu"], pub, got, ratio, r["set"], link])
    with open(path, "w") as f:
        f.write("# pipegrid against published training throughput: results\n\n")
        f.write("Generated by `experiments/validation/run.py` from `measurements.yaml` (rules: README.md). "
                "Each row is pure data parallelism (`dp`), micro-batch = the row's batch per GPU; "
                "ratio = pipegrid / published, error = ratio - 1.\n\n")
        f.write(pgx.markdown_table(["id", "model", "gpu x count", "precision", "batch", "published", "pipegrid",
                                    "ratio", "set", "source"], table) + "\n\n")
        f.write("\n".join(f"- {line}" for line in lines) + "\n\n")
        f.write(("Check: holds (median |error| <= 10%, max <= 30%, every check row within +-25% but those "
                 "excepted below).\n\n" if not failures else
                 "Check FAILS:\n\n" + "\n".join(f"- {x}" for x in failures) + "\n\n"))
        write_outside(f, outside_rows)
        f.write("Per source (both sets):\n\n" + group_medians(rows, results, lambda r: r["source"], "source") + "\n\n")
        f.write("Per GPU and precision (both sets):\n\n" +
                group_medians(rows, results, lambda r: f"{r['gpu']} {r['precision']}", "gpu, precision") + "\n")
        if pairs:
            write_pairs(f, pairs)
        if scaling:
            write_scaling(f, scaling)
        errs = [r for r in order if "error" in results[r["id"]]]
        if errs:
            f.write("\nRows pipegrid could not run:\n\n" +
                    "\n".join(f"- {r['id']}: {results[r['id']]['error']}" for r in errs) + "\n")


MODEL_NAMES = {"bert-large": "BERT-Large", "resnet50": "ResNet-50", "vgg16": "VGG-16", "gpt": "GPT",
               "gnmt8": "GNMT-8", "gnmt16": "GNMT-16", "transformer-big": "Transformer-big"}


def row_name(r):
    """A check row as a reader names it (`pipegrid run` prints it beside the row's id): the model,
    its size or sequence, the GPUs, the precision and the source; e.g. "BERT-Large s384 on 8 A100s,
    amp (NVIDIA DeepLearningExamples (PyTorch))"."""
    if r["model"] == "megatron-gpt":
        m = r["megatron"]
        size = f"{m['parameters_billion']:g}B" if "parameters_billion" in m else m.get("model", "")
        extra = {"full": ", full recomputation", "selective": ", selective recomputation"}.get(m.get("recompute"), "")
        return (f"GPT {size} t{m['t']} p{m['p']}{' SP' if m.get('sequence_parallel') else ''}{extra} on "
                f"{m['gpus']} A100s, amp ({m['source'].split(',')[0]}, {r['url'].split('/')[-1]})")
    model = MODEL_NAMES.get(r["model"], r["model"])
    seq = r.get("model_params", {}).get("sequence")
    gpus = r["gpus"]
    return (f"{model}{f' s{seq}' if seq else ''} on {gpus} {r['gpu'].upper()}{'s' if gpus != 1 else ''}, "
            f"{r['precision']} ({r['source']})")


def accuracy_entry(errs, spread=(), names=None):
    """One accuracy.yaml entry: errs [(|error|, row id)], spread the groups' max / min, names {row id:
    its readable name} (the worst row's is written beside its id)."""
    errs, spread = sorted(errs), sorted(spread)
    name = (names or {}).get(errs[-1][1])
    return (f"{{check_rows: {len(errs)}, median_error: {statistics.median(e for e, _ in errs):.4f}, "
            f"max_error: {errs[-1][0]:.4f}, worst: {errs[-1][1]}, " +
            (f"worst_name: \"{name}\", " if name else "") + f"spread_groups: {len(spread)}" +
            (f", median_spread: {statistics.median(spread):.4f}, max_spread: {spread[-1]:.4f}" if spread else "") +
            "}")


def write_accuracy(path, rows, results, groups):
    """accuracy.yaml: the check rows by GPU and precision, which `pipegrid run` prints for the
    catalog GPUs and precision it uses (tools/output/report.cc): measurements.yaml's, and apart,
    under `megatron-lm`, Megatron-LM's published 3D runs (experiments/megatron/rows.yaml, those
    this run ran). Beside each measurements.yaml entry, the data's own spread: the
    same-configuration groups (consistency.row_groups: published by two or more sources) on that
    GPU and precision, check and calibration rows alike, their max / min. Deterministic:
    tests/tools/validation_runs.py compares a fresh run's measurements.yaml entries with the
    committed ones, and the Megatron-LM entries with the committed results.md."""
    by_gpu, megatron, names = {}, {}, {}
    readable = {r["id"]: row_name(r) for r in rows}
    for r in rows:
        if r["set"] != "check" or "error" in results[r["id"]]:
            continue
        err = (abs(results[r["id"]]["ratio"] - 1), r["id"])
        into = megatron if r["model"] == "megatron-gpt" else by_gpu
        into.setdefault(r["gpu"], {}).setdefault(r["precision"], []).append(err)
        if r["model"] != "megatron-gpt":
            names.setdefault(r["gpu"], {r["gpu"]}).add(vlib.device_spec(r)["model"])
    spreads = {}
    for r in rows:
        if r["id"] in groups:
            spreads.setdefault((r["gpu"], r["precision"]), {}).update([groups[r["id"]]])
    out = ["# Written by experiments/validation/run.py (its last run, as results.md): the check rows",
           "# (published training runs, never fitted on) by GPU and precision, |error| = |pipegrid /",
           "# published - 1|: measurements.yaml's, and under megatron-lm Megatron-LM's 3D runs",
           "# (experiments/megatron/rows.yaml; the H100's: experiments/megatron/h100.yaml, Megatron-Core's",
           "# runs, written by h100.py, and nemo_h100.yaml, NeMo 24.07's fp8 runs, written by nemo_h100.py).",
           "# `pipegrid run` prints the entries of each catalog GPU",
           "# (`catalog` names it) and precision it uses. spread: the data's own floor, the",
           "# same-configuration groups of measurements.yaml on that GPU and precision (published by two",
           "# or more sources), max / min. tests/tools/validation_runs.py fails when a fresh run differs."]
    for gpu in sorted(by_gpu):
        out.append(f"{gpu}:")
        out.append(f"  catalog: [{', '.join(sorted(names[gpu]))}]")
        for prec in sorted(by_gpu[gpu]):
            out.append(f"  {prec}: " + accuracy_entry(by_gpu[gpu][prec], spreads.get((gpu, prec), {}).values(),
                                                      readable))
        if gpu in megatron:
            out.append("  megatron-lm:")
            for prec in sorted(megatron[gpu]):
                out.append(f"    {prec}: " + accuracy_entry(megatron[gpu][prec], (), readable))
    # Megatron-Core's H100 runs (experiments/megatron/h100.py's last full run, h100.yaml): a GPU
    # with no measurements.yaml row, its catalog figures measured, never fitted.
    # NeMo 24.07's FP8 runs on DGX-H100 (experiments/megatron/nemo_h100.py's last full run,
    # nemo_h100.yaml), the H100's fp8 entry beside it.
    megatron_dir = os.path.join(vlib.ROOT, "experiments", "megatron")
    h100, nemo = os.path.join(megatron_dir, "h100.yaml"), os.path.join(megatron_dir, "nemo_h100.yaml")
    h100_lines = []
    if os.path.exists(h100):
        x = vlib.load_yaml(h100)
        table = vlib.load_yaml(os.path.join(megatron_dir, "h100_rows.yaml"))
        row = dict(zip(table["columns"], next(r for r in table["rows"] if r[0] == x["worst"])))
        name = f"GPT {row['model_size']} t{row['t']} p{row['p']} on {row['gpus']} H100s, bf16 (Megatron-Core's table)"
        h100_lines.append(f"    amp-bf16: {{check_rows: {x['check_rows']}, median_error: {x['median_error']:.4f}, "
                          f"max_error: {x['max_error']:.4f}, worst: megatron-{x['worst']}, worst_name: \"{name}\", "
                          f"spread_groups: 0}}")
    if os.path.exists(nemo):
        x = vlib.load_yaml(nemo)
        table = vlib.load_yaml(os.path.join(megatron_dir, "nemo_h100_rows.yaml"))
        row = dict(zip(table["columns"], next(r for r in table["rows"] if r[0] == x["worst"])))
        printed = row["quote"].strip().strip("|").split("|")[0].strip()  # the table's model name
        name = (f"{printed} on {row['gpus']} H100s, fp8, TP{row['tp']} PP{row['pp']} CP{row['cp']} "
                f"(NeMo 24.07's table)")
        h100_lines.append(f"    fp8: {{check_rows: {x['check_rows']}, median_error: {x['median_error']:.4f}, "
                          f"max_error: {x['max_error']:.4f}, worst: {x['worst']}, worst_name: \"{name}\", "
                          f"faster: {x['faster']}, spread_groups: 0}}")
    if h100_lines:
        out += ["h100:", "  catalog: [h100]", "  megatron-lm:"] + h100_lines
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def finish_figure(plt, fig, ax, out, name):
    """Legend to the right, then out/name.png and .svg (deterministic SVG: fixed hash salt, no date)."""
    import matplotlib
    matplotlib.rcParams["svg.hashsalt"] = "pipegrid-validation"
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{name}.{ext}"), dpi=120, metadata={"Date": None} if ext == "svg" else {})
    plt.close(fig)


def plot_scaling(plt, out, scaling):
    """scaling.png / .svg: per series, the published scaling (markers) and pipegrid's (line) against
    the node count."""
    ids = sorted({s["id"] for s, *_ in scaling})
    if not ids:
        return False
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for i, sid in enumerate(ids):
        pts = sorted([(int(p["nodes"]), pub, mine) for s, p, pub, mine, err in scaling
                      if s["id"] == sid and err is None], key=lambda t: t[0])
        label = sid.replace("dle-", "").replace("-bertl-pretrain", "").replace("-multinode", "")
        ax.plot([t[0] for t in pts], [t[2] for t in pts], color=cmap(i % 10), lw=1.2)
        ax.scatter([t[0] for t in pts], [t[1] for t in pts], color=cmap(i % 10), edgecolor="black",
                   linewidth=0.5, s=30, zorder=3, label=label)
    ax.set_xscale("log", base=2)
    nodes = sorted({int(p["nodes"]) for _, p, *_ in scaling})
    ax.set_xticks(nodes)
    ax.set_xticklabels([str(n) for n in nodes])
    ax.set_xlabel("DGX A100 nodes (8 GPUs each)")
    ax.set_ylabel("per-GPU rate / rate on 1 node")
    ax.set_title("Multi-node scaling: published (markers) and pipegrid (lines)")
    ax.grid(True, color="0.92", lw=0.5)
    finish_figure(plt, fig, ax, out, "scaling")
    return True


def plot(plt, out, rows, results):
    # Per-layer rows (2205.05198 Table 4) have no throughput of the whole model: in results.md only.
    ok = [r for r in sorted(rows, key=lambda r: r["id"])
          if "error" not in results[r["id"]] and r["metric"] != "layer_ms"]
    if not ok:
        return False
    models = sorted({r["model"] for r in ok})
    cmap = plt.get_cmap("tab10")
    colours = {m: cmap(i % 10) for i, m in enumerate(models)}
    markers = {"check": "o", "calibration": "^"}
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    xs = [results[r["id"]]["published_samples_per_s"] for r in ok]
    ys = [results[r["id"]]["samples_per_s"] for r in ok]
    lo, hi = min(xs + ys) / 1.6, max(xs + ys) * 1.6
    line = [lo, hi]
    ax.fill_between(line, [v * 0.8 for v in line], [v * 1.2 for v in line], color="0.9", label="$\\pm$20%")
    ax.plot(line, line, color="0.3", lw=1, label="y = x")
    for s in ("check", "calibration"):
        for m in models:
            pts = [(results[r["id"]]["published_samples_per_s"], results[r["id"]]["samples_per_s"])
                   for r in ok if r["set"] == s and r["model"] == m]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=markers.get(s, "s"),
                           color=colours[m], edgecolor="black", linewidth=0.5, s=45, label=f"{m} ({s})", zorder=3)
    other = [r for r in ok if r["set"] not in markers]
    if other:
        ax.scatter([results[r["id"]]["published_samples_per_s"] for r in other],
                   [results[r["id"]]["samples_per_s"] for r in other], marker="s",
                   color=[colours[r["model"]] for r in other], label="unassigned rows", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("published throughput (samples/s; tokens/s and TFLOP/s rows converted to samples/s)")
    ax.set_ylabel("pipegrid throughput (samples/s)")
    ax.set_title("pipegrid against published training throughput\n(data parallel; megatron-gpt: Megatron-LM's 3D-parallel runs)")
    ax.grid(True, which="both", color="0.92", lw=0.5)
    finish_figure(plt, fig, ax, out, "figure")
    return True


def main():
    plt = pgx.matplotlib_pyplot()  # first: may re-run this script under an interpreter that has it
    args = parse_args()
    rows = vlib.load_rows(args.measurements, args.rows) + vlib.load_megatron_rows(args.rows, args.megatron_max_gpus)
    pgx.check_catalog(args.pipegrid)  # the catalog's figures are what this run reports
    pg = vlib.Pipegrid(args.pipegrid, args.jobs)
    n = len(rows)
    done = []

    def progress(key, result):
        if key[0] != "run":
            return
        done.append(key)
        print(f"row {len(done)}/{n} {key[1]}: " + ("error: " + result["error"].splitlines()[0] if "error" in result
                                                  else f"{result['throughput_samples_per_s']:.1f} samples/s"),
              flush=True)

    efficiency_of = vlib.calibrated(args.calibration) if args.calibration else None
    results = vlib.predict(pg, rows, efficiency_of, progress=progress)
    lines, failures, outside_rows = [], [], []
    groups = consistency.row_groups(vlib.load_rows(args.measurements))  # all rows: a group spans both sets
    for s in ("check", "calibration"):
        these = [r for r in rows if r["set"] == s]
        errs = [results[r["id"]]["ratio"] - 1 for r in these if "error" not in results[r["id"]]]
        broken = [r["id"] for r in these if "error" in results[r["id"]]]
        line = vlib.summary(s, errs)
        if broken:
            line += f" ({len(broken)} more could not run)"
        lines.append(line)
        if s == "check" and these:
            if errs and statistics.median(abs(e) for e in errs) > MEDIAN_LIMIT:
                failures.append(f"median |error| {100 * statistics.median(abs(e) for e in errs):.1f}% > 10%")
            if errs and max(abs(e) for e in errs) > MAX_LIMIT:
                failures.append(f"max |error| {100 * max(abs(e) for e in errs):.1f}% > 30%")
            for r in sorted(these, key=lambda r: r["id"]):
                x = results[r["id"]]
                if "error" in x:
                    failures.append(f"{r['id']}: pipegrid could not run it")
                elif abs(x["ratio"] - 1) > ROW_LIMIT:
                    label, spread = groups.get(r["id"], ("-", None))
                    excepted = spread is not None and spread > SPREAD_LIMIT
                    outside_rows.append((r, x["ratio"] - 1, label, spread, excepted))
                    if not excepted:
                        failures.append(f"{r['id']}: error {pct(x['ratio'] - 1)} (outside +-25%)")
    # Multi-node scaling (scaling.yaml): the communication model against published scaling.
    scaling = vlib.predict_scaling(pg, vlib.load_scaling(args.scaling), efficiency_of) if args.scaling else []
    multi = [(s, p, pub, mine, err) for s, p, pub, mine, err in scaling if int(p["nodes"]) > 1]
    if multi:
        errs = [mine / pub - 1 for _, _, pub, mine, err in multi if err is None]
        broken = sum(1 for *_, err in multi if err)
        lines.append(vlib.summary("multi-node scaling", errs).replace(" rows: ", " points: ", 1)
                     .replace("|error|", "|scaling error|") +
                     (f" ({broken} more could not run)" if broken else "") + " (not part of the check)")
    batches = sorted({int(r.get("batch", 1)) for r in rows})
    if len(batches) > 1:  # rows added later were split among themselves (measurements.yaml's header)
        for b in batches:
            these = [r for r in rows if r["set"] == "check" and int(r.get("batch", 1)) == b]
            errs = [results[r["id"]]["ratio"] - 1 for r in these if "error" not in results[r["id"]]]
            outside = sum(1 for e in errs if abs(e) > ROW_LIMIT)
            lines.append(vlib.summary(f"batch {b} check", errs) + f", {outside} outside +-25%")
    os.makedirs(args.out, exist_ok=True)
    write_results(os.path.join(args.out, "results.md"), rows, results, lines, failures, scaling, outside_rows,
                  scaling_pairs(rows, results))
    if any(r["set"] == "check" for r in rows):
        write_accuracy(os.path.join(args.out, "accuracy.yaml"), rows, results, groups)
    drawn = plot(plt, args.out, rows, results) if plt else False
    if plt and scaling:
        plot_scaling(plt, args.out, scaling)
    for line in lines:
        print(line)
    print(f"wrote {os.path.join(args.out, 'results.md')}" + (" and figure.png, figure.svg" if drawn else ""))
    if failures and any(r["set"] == "check" for r in rows):
        print("check fails:\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
