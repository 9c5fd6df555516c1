#!/usr/bin/env python3
"""Collage-style backend placement (docs/backends.md): per model, the best placement's speed-up over
each single backend on a GPU and an FPGA catalog (topologies/backends/), Collage's published ratios
beside them, and what placement does to a pipeline plan's stages and iteration time.

    experiments/collage/run.py            # everything: results.md, speedup.png/.svg (about a minute)
    experiments/collage/run.py --check    # one model per catalog, asserts, no files (ctest)

The pipegrid binary is build/pipegrid of this checkout, or $PIPEGRID."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import pgx  # noqa: E402

ROOT = pgx.ROOT
CATALOGS = {  # device kind -> (catalog, models)
    "a100": ("topologies/backends/a100.yaml", ["resnet50", "vgg16", "bert-large", "gpt"]),
    "u280": ("topologies/backends/u280.yaml", ["resnet50", "vgg16", "bert-large"]),
}
FALLBACK = {"a100": "framework", "u280": "hls-generic"}  # the catalog's first backend implementing every layer
COVERS_ALL = {"framework", "tvm", "hls-generic"}  # backends with a "*" pattern
MICRO_BATCH = 8
PRECISION = "amp"
# Collage's published speed-ups over the best existing framework per device (inference latency).
PUBLISHED = [
    ("v1 abstract (arXiv:2111.00655v1, TVMCon 2021)", "two NVIDIA GPUs", [1.21, 1.39]),
    ("v1 abstract", "an Intel CPU", [1.40]),
    ("PACT'22 / arXiv v3 abstract", "RTX 2070, V100", [1.26, 1.43]),
    ("PACT'22 / arXiv v3 abstract", "Xeon 8259CL", [1.40]),
]
# Pipelines: 4 devices, 4 stages, 1F1B, 16 micro-batches of 8 (a placement is made for its batch).
CLUSTERS = {
    "a100": {"kind": "switch", "count": 4, "device": {"model": "a100", "name": "gpu"},
             "bandwidth": "300GBps", "latency": "1us"},
    "u280": {"kind": "fpga-ring", "count": 4, "device": {"model": "u280"},
             "qsfp": {"bandwidth": "100Gbps", "latency": "0.5us"}},
}
PIPELINES = [("a100", "bert-large"), ("a100", "resnet50"), ("u280", "resnet50"), ("u280", "vgg16")]


def place(model, catalog, use=None):
    cmd = [pgx.binary(), "place", model, "--backends", os.path.join(ROOT, catalog), "--json",
           "--precision", PRECISION, "--micro-batch-size", str(MICRO_BATCH)]
    if use:
        cmd += ["--use", ",".join(use)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"pipegrid place {model}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def pipeline(kind, model, backends, tmp):
    exp = {"name": f"collage pipeline {kind} {model}",
           "workload": {"model": model, "precision": PRECISION},
           "cluster": CLUSTERS[kind],
           "strategy": {"partitioner": "balanced", "schedule": "1f1b", "stages": 4, "micro_batch_size": MICRO_BATCH,
                        "micro_batches": 16}}
    if backends is not None:
        exp["backends"] = backends
    name = "none" if backends is None else "-".join(backends.get("use", ["all"]))
    return pgx.plan(exp, os.path.join(tmp, f"{kind}-{model}-{name}.yaml"))


def stage_summary(result):
    """Per stage: model layers, placed layers and predicted time per micro-batch (ms). A backend's fused
    group (conv -> add -> relu) is one layer of the placed workload, named by its model layers joined
    with '+' (docs/backends.md), so a stage's model layers are its names' '+'-separated parts."""
    return [(sum(len(n.split("+")) for n in s["layers"]), len(s["layers"]), s["predicted_time_s"] * 1e3)
            for s in result["stages"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="one model per catalog, assertions only")
    ap.add_argument("--out", default=HERE, help="folder for results.md and the figure")
    args = ap.parse_args()
    plt = None if args.check else pgx.matplotlib_pyplot()
    if not args.check:
        os.makedirs(args.out, exist_ok=True)  # a new folder (and its parents), as the other experiments do

    failures = []
    rows, speedups = [], {}
    for kind, (catalog, models) in CATALOGS.items():
        for model in (models[:1] if args.check else models):
            r = place(model, catalog)
            best = r["total_s"]
            groups = {}
            for l in r["layers"]:
                groups[l["backend"]] = groups.get(l["backend"], 0) + 1
            single = {b: (t / best if t else None) for b, t in r["single_backend_s"].items()}
            speedups[(kind, model)] = single
            fused = len({l["group"] for l in r["layers"]})  # a fused group is one layer of the placed workload
            rows.append([kind, model, pgx.fmt_time(best), ", ".join(f"{b} {n}" for b, n in sorted(groups.items())),
                         f"{fused} of {len(r['layers'])}", f"{pgx.fmt_time(r['conversion_s'])}"] +
                        [f"{single[b]:.2f}x" if single[b] else "-" for b in r["single_backend_s"]] +
                        [f"{min(v for v in single.values() if v):.3f}x"])
            if not r["exact"]:
                failures.append(f"{kind} {model}: the search was not exact")
            for b, s in single.items():
                if s is not None and s < 1 - 1e-9:
                    failures.append(f"{kind} {model}: {b} alone is faster than the placement ({s:.4f})")
            # The framework backend alone is the device catalog's cost model: the workload's own times.
            if kind == "a100":
                base = subprocess.run([pgx.binary(), "workload", "show", model, "--json", "--device", "a100",
                                       "--precision", PRECISION, "--micro-batch-size", str(MICRO_BATCH)],
                                      capture_output=True, text=True)
                if base.returncode == 0:
                    j = json.loads(base.stdout)
                    own = sum(l.get("forward_s", 0) + l.get("backward_s", 0) for l in j.get("layers", []))
                    fw = r["single_backend_s"]["framework"]
                    if own > 0 and abs(fw - own) > 1e-9 * own:
                        failures.append(f"a100 {model}: framework alone {fw} s != the cost model's {own} s")

    pipes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, model in (PIPELINES[:1] + PIPELINES[2:3] if args.check else PIPELINES):
            cat = os.path.join(ROOT, CATALOGS[kind][0])
            variants = {"no backends (device catalog)": None, "placement (all backends)": {"catalog": cat}}
            if not args.check:
                for name in speedups[(kind, CATALOGS[kind][1][0])]:
                    use = [name] if name in COVERS_ALL else [name, FALLBACK[kind]]
                    variants[f"{name} alone"] = {"catalog": cat, "use": use}
            for label, backends in variants.items():
                res = pipeline(kind, model, backends, tmp)
                if "error" in res:
                    failures.append(f"pipeline {kind} {model} {label}: {res['error']}")
                    continue
                pipes[(kind, model, label)] = res
            a = pipes.get((kind, model, "placement (all backends)"))
            b = pipes.get((kind, model, "no backends (device catalog)"))
            if b:  # every plan's stages hold the model's layers once, fused or not
                n = sum(m for m, _, _ in stage_summary(b))
                for (k2, m2, label), res in pipes.items():
                    if (k2, m2) == (kind, model) and sum(m for m, _, _ in stage_summary(res)) != n:
                        failures.append(f"pipeline {kind} {model} {label}: its stages hold "
                                        f"{sum(m for m, _, _ in stage_summary(res))} model layers, not {n}")
            if a and b and kind == "a100" and a["iteration_time_s"] > b["iteration_time_s"] * (1 + 1e-9):
                failures.append(f"pipeline a100 {model}: placement slower than the framework's kernels alone")

    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    if args.check:
        print(f"ok: {len(rows)} placements, {len(pipes)} pipeline plans")
        return

    lines = ["# Collage-style backend placement: results", "",
             "Generated by `experiments/collage/run.py` (do not edit). Catalogs: "
             "`topologies/backends/a100.yaml`, `topologies/backends/u280.yaml` (hypothetical figures). "
             f"Precision {PRECISION}, {MICRO_BATCH} samples per micro-batch; time = forward + backward of one "
             "micro-batch on one device.", "",
             "## Best placement against each backend alone (with the catalog's fallback)", ""]
    for kind, (catalog, models) in CATALOGS.items():
        names = list(speedups[(kind, models[0])].keys())
        kind_rows = [r for r in rows if r[0] == kind]
        lines += [f"### {kind}", "",
                  pgx.markdown_table(["device", "model", "placement", "model layers per backend",
                                      "placed layers (a fused group as one)", "conversions"] +
                                     [f"vs {n}" for n in names] + ["vs the best alone"], kind_rows), ""]
    lines += ["## Collage's published ratios (a different setting)", "",
              pgx.markdown_table(["source", "hardware", "speed-up over the best existing framework"],
                                 [[s, h, ", ".join(f"{x:.2f}x" for x in v)] for s, h, v in PUBLISHED]), "",
              "Collage measures inference latency of real backends on real devices against whole frameworks "
              "(which already mix libraries by hand-written rules); here the figures are training forward + "
              "backward times from pipegrid's cost model with hypothetical backend efficiencies, against one "
              "backend plus a fallback. The ratios are therefore not comparable as numbers: what carries over is "
              "the mechanism (per-pattern choice plus conversion costs), not the magnitude.", "",
              "## Placement in a pipeline (4 devices, 4 stages, balanced partitioner, 1F1B, 16 micro-batches)", ""]
    prow = []
    for (kind, model, label), res in pipes.items():
        st = stage_summary(res)
        prow.append([kind, model, label, pgx.fmt_time(res["iteration_time_s"]),
                     " / ".join(str(n) for n, _, _ in st), " / ".join(str(g) for _, g, _ in st),
                     " / ".join(f"{t:.2f}" for _, _, t in st)])
    lines += [pgx.markdown_table(["device", "model", "costs", "iteration", "model layers per stage",
                                  "placed layers per stage (a fused group as one)",
                                  "stage time per micro-batch (ms)"], prow), "",
              "A backend's fused group (a chain such as conv -> add -> relu run as one kernel) is one layer of "
              "the placed workload, so no stage boundary falls inside it; \"model layers\" counts the model's "
              "own layers (the first table's per-backend counts), \"placed layers\" the placed workload's.", ""]
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))

    if plt:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
        for ax, (kind, (catalog, models)) in zip(axes, CATALOGS.items()):
            names = list(speedups[(kind, models[0])].keys())
            width = 0.8 / len(names)
            for i, n in enumerate(names):
                vals = [speedups[(kind, m)][n] or 0 for m in models]
                ax.bar([x + i * width for x in range(len(models))], vals, width, label=f"vs {n} alone")
            ax.axhline(1, color="black", linewidth=0.8)
            for v in (1.21, 1.39, 1.40) if kind == "a100" else ():
                ax.axhline(v, color="grey", linestyle=":", linewidth=0.8)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(models))], models)
            ax.set_ylabel("speed-up of the placement (x)")
            ax.set_xlabel("model")
            ax.set_title(f"{kind} ({'GPU' if kind == 'a100' else 'FPGA'}, hypothetical backends)")
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        fig.text(0.01, 0.01, "dotted: Collage's published 1.21x, 1.39x, 1.40x (inference, real backends, "
                 "against whole frameworks)", fontsize=8)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        for ext in ("png", "svg"):
            fig.savefig(os.path.join(args.out, f"speedup.{ext}"), dpi=110, metadata={"Date": None}
                        if ext == "svg" else None)


if __name__ == "__main__":
    main()
