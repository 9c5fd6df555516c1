#!/usr/bin/env python3
"""Dense Llama pre-training on DGX-B200, DGX-GB200, DGX-GB300 and DGX-H100, published against pipegrid (rows.yaml).

    experiments/blackwell-dense/run.py [-j 2] [--max-gpus 1024] [--out results.md]
    experiments/blackwell-dense/run.py --validate   # rows.yaml's schema, quotes and split only

Each row becomes an experiment (the zoo model at sequence 8,192 in the row's precision, the row's
TP / PP / CP / VP / micro-batch and global batch, rows.yaml's stated assumptions), replayed with
`pipegrid run --json`; its tokens/s per GPU is global batch x 8,192 / iteration time / GPUs, and the
error pipegrid / published - 1. `--fit [GPU ...]` fits the b200's and gb200's (or the named GPUs')
fp8 GEMM efficiency on their calibration rows (fit.yaml; the bf16 and fp16 GEMM figures tied to it by
BF16_PER_FP8), which the catalog holds since 2026-12-04 (README.md); their other figures are the
H100/H200 fractions, assumed (topologies/devices.yaml).
"""
import argparse
import concurrent.futures
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import pgx  # noqa: E402

BLOCKS = {"llama3-8b": 32, "llama3-70b": 80, "llama3-405b": 126}
FIELDS = ("id", "source", "release", "table", "quote", "model", "system", "gpu", "gpus", "printed_precision",
          "precision", "tp", "pp", "cp", "vp", "mbs", "gbs", "seq", "metric", "value", "split")
PRINTED = {"FP8": "fp8", "FP8-CS": "fp8", "MXFP8": "mxfp8", "FP8-MX": "mxfp8"}
GPUS = {"DGX-B200": "b200", "DGX-GB200": "gb200", "DGX-GB300": "gb300", "DGX-H100": "h100"}
# NVLink per direction: NVLink 5 on Blackwell, NVLink 4 on DGX-H100 (the catalog's b200 / gb200 / gb300 / h100).
NVLINK = {"DGX-B200": "900GBps", "DGX-GB200": "900GBps", "DGX-GB300": "900GBps", "DGX-H100": "450GBps"}
# Blackwell's bf16 (and fp16) GEMM figure over its fp8 one: Transformer Engine's measured GEMM kernels on
# a B300, inputs pre-quantized, 13.102 ms per layer in bf16 against 6.812 in fp8 with per-tensor scales,
# at the datasheets' 1:2 peaks (docs/examples/gemm_profiling/gemm_profiling.rst at TransformerEngine
# 1609c890e; README.md). The catalog's bf16 figure is the fitted fp8 one times this; the fit ties them.
BF16_PER_FP8 = 2 * 6.812 / 13.102


def load():
    with open(os.path.join(HERE, "rows.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def validate(rows):
    """Problems with rows.yaml (empty: none): fields, the quotes holding each value, the split rule."""
    problems, ids = [], set()
    for r in rows:
        rid = r.get("id", "?")
        missing = [k for k in FIELDS if k not in r]
        if missing:
            problems.append(f"{rid}: no {', '.join(missing)}")
            continue
        checks = [(rid not in ids, "id used twice"),
                  (r["model"] in BLOCKS, f"model {r['model']} is not one of {sorted(BLOCKS)}"),
                  (GPUS.get(r["system"]) == r["gpu"], f"system {r['system']} does not run gpu {r['gpu']}"),
                  (PRINTED.get(r["printed_precision"]) == r["precision"],
                   f"printed precision {r['printed_precision']} is not precision {r['precision']}"),
                  (f"| {r['gpus']} |" in r["quote"] and f"| {r['gbs']} | {r['mbs']} | {r['seq']} |" in r["quote"],
                   "the quote does not hold its GPUs, GBS, MBS and sequence"),
                  (str(r["value"]) in r["quote"] and r["printed_precision"] in r["quote"],
                   "the quote does not hold its value and precision"),
                  (r["gpus"] % (r["tp"] * r["pp"] * r["cp"]) == 0, "TP x PP x CP does not divide the GPUs")]
        ids.add(rid)
        problems += [f"{rid}: {m}" for ok, m in checks if not ok]
        if not problems and r["gbs"] % (replicas(r) * r["mbs"]):
            problems.append(f"{rid}: GBS is not a multiple of replicas x MBS")
        problems += [f"{rid}: same_config {s.get('release')}: the quote does not hold its value and precision"
                     for s in r.get("same_config", [])
                     if str(s["value"]) not in s["quote"] or r["printed_precision"] not in s["quote"]]
    if problems:
        return problems
    groups = {}
    for r in rows:
        groups.setdefault((r["gpu"], r["precision"]), []).append(r)
    for g in groups.values():
        for i, r in enumerate(sorted(g, key=lambda r: r["id"])):
            if r["split"] != ("calibration" if i % 2 == 0 else "check"):
                problems.append(f"{r['id']}: split {r['split']} breaks the rule (by gpu and precision, sorted by id, "
                                "alternating from calibration)")
    return problems


def replicas(r):
    return r["gpus"] // (r["tp"] * r["pp"] * r["cp"])


def nvlink_domain(r):
    """As experiments/moe/run.py: a DGX node's 8, or on DGX-GB200 and DGX-GB300 (NVL72 racks alike) the
    Slurm segment Megatron-Bridge's launcher asks for (trays of 4 GPUs, up to 18 trays per segment, else
    the largest divisor <= 18)."""
    if r["system"] not in ("DGX-GB200", "DGX-GB300"):
        return 8
    trays = r["gpus"] // 4
    return 4 * (trays if trays <= 18 else max(s for s in range(1, 19) if trays % s == 0))


def device(r, fit):
    """The row's GPU: the catalog's, or with the fitted fp8 GEMM efficiency of `fit` {gpu: value} and the
    bf16 and fp16 GEMM figures derived from it (BF16_PER_FP8)."""
    if r["gpu"] not in (fit or {}):
        return r["gpu"]
    x = fit[r["gpu"]]
    half = {"gemm": round(x * BF16_PER_FP8, 4)}
    return {"model": r["gpu"], "compute_efficiency": {"fp8": {"gemm": x}, "bf16": half, "fp16": half}}


def experiment(r, fit=None):
    d, vp = replicas(r), r["vp"] or 1
    strategy = {"partitioner": "megatron" if BLOCKS[r["model"]] % (r["pp"] * vp) == 0 else "balanced",
                "schedule": "interleaved-1f1b" if vp > 1 else "1f1b", "stages": r["pp"], "replicas": d,
                "tensor_parallel": r["tp"], "sequence_parallel": r["tp"] > 1, "tp_overlap": r["tp"] > 1,
                "allreduce": "multi-ring", "dp_overlap": True, "gradient_reduce": "bf16",
                "micro_batch_size": r["mbs"], "micro_batches": r["gbs"] // (d * r["mbs"])}
    if vp > 1:
        strategy["chunks"] = vp
    if r["cp"] > 1:
        strategy["context_parallel"] = r["cp"]
    n = nvlink_domain(r)
    return {"name": r["id"],
            "workload": {"model": r["model"], "sequence": r["seq"], "precision": r["precision"],
                         "attention": "fused", "kernel_fusion": "megatron"},
            "cluster": {"kind": "dgx", "nodes": r["gpus"] // n, "gpus_per_node": n, "gpu": device(r, fit),
                        "nvlink": {"bandwidth": NVLINK[r["system"]], "latency": "0.5us"},
                        "infiniband": {"bandwidth": "400Gbps", "latency": "1us"},
                        "fabric": "rail" if r["gpus"] > n else "switch"},
            "strategy": strategy,
            "memory": {"optimizer": "mixed-adam", "recompute": "none", "zero": 1}}


def replay(pipegrid, r, fit=None):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(experiment(r, fit), f, sort_keys=False)
        path = f.name
    try:
        p = subprocess.run([pipegrid, "run", path, "--json"], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-300:]}
    j = json.loads(p.stdout)
    return {"time": j["iteration_time_s"], "feasible": j["feasible"]}


def fit_gpu(pipegrid, rows, gpu, jobs, iterations=14):
    """The fp8 GEMM efficiency of `gpu` that minimises the sum of ln(pipegrid / published)^2 over its
    calibration rows: golden-section search in ln(efficiency) over [0.2, 0.9]."""
    mine = [r for r in rows if r["gpu"] == gpu and r["split"] == "calibration"]

    def objective(x):
        with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
            got = list(ex.map(lambda r: replay(pipegrid, r, {gpu: round(x, 4)}), mine))
        return sum(math.log(tokens(r, g["time"]) / r["value"]) ** 2 for r, g in zip(mine, got))

    lo, hi = math.log(0.2), math.log(0.9)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = objective(math.exp(a)), objective(math.exp(b))
    for _ in range(iterations):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = objective(math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = objective(math.exp(b))
    x = round(math.exp((lo + hi) / 2), 3)
    return x, objective(x), [r["id"] for r in mine]


def tokens(r, time):
    return r["gbs"] * r["seq"] / time / r["gpus"]


def spread(r):
    vals = [r["value"]] + [s["value"] for s in r.get("same_config", [])]
    return len(vals), min(vals), max(vals)


def markdown(rows, got):
    out = ["# Dense Llama pre-training on Blackwell and H100: published against pipegrid", "",
           "Written by `experiments/blackwell-dense/run.py` (rows, quotes, assumptions: rows.yaml). error = "
           "pipegrid / published - 1 in tokens/s per GPU. \"releases\": the same configuration in other "
           "releases of the page. Catalog: topologies/devices.yaml as built into the binary: the b200's, "
           "gb200's and gb300's fp8 GEMM efficiencies are fitted on their calibration rows below (fit.yaml, "
           "README.md), their other figures the H100/H200 fractions, assumed; the h100's are measured kernel "
           "rates, never fitted (its calibration rows are set aside). The check rows are never fitted on.", ""]
    errors = {}
    for split in ("calibration", "check"):
        out += [f"## {split.capitalize()} rows", "",
                "| row | release | configuration | published | releases (n, min-max) | pipegrid | error |",
                "|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["split"] != split:
                continue
            x = got[r["id"]]
            conf = (f"{r['gpus']} {r['gpu'].upper()}, {r['precision']}, TP{r['tp']} PP{r['pp']} CP{r['cp']}"
                    + (f" VP{r['vp']}" if r["vp"] else "") + f", MBS{r['mbs']} GBS{r['gbs']}")
            n, lo, hi = spread(r)
            rel = f"{n}, {lo:,}-{hi:,}" if n > 1 else "1"
            if "error" in x:
                out.append(f"| {r['id']} | {r['release']} | {conf} | {r['value']:,} | {rel} | error | {x['error']} |")
                continue
            pred = tokens(r, x["time"])
            err = pred / r["value"] - 1
            errors.setdefault(split, []).append(err)
            errors.setdefault(r["precision"], []).append(err)
            errors.setdefault(f"{r['gpu']} {split}", []).append(err)
            over = "" if x["feasible"] else " (over memory)"
            out.append(f"| {r['id']} | {r['release']} | {conf} | {r['value']:,} | {rel} | {pred:,.0f}{over} | "
                       f"{100 * err:+.1f}% |")
        out.append("")
    def summary(name, es):
        return (f"{name}: {len(es)} rows, median |error| {100 * statistics.median(abs(e) for e in es):.1f}%, "
                f"max {100 * max(abs(e) for e in es):.1f}%, pipegrid faster on {sum(e > 0 for e in es)}")
    out += ["## Summary", ""] + [f"- {summary(k, errors[k])}" for k in ("calibration", "check", "fp8", "mxfp8")
                                  if k in errors] + [
        f"- {summary(k, errors[k])}" for k in sorted(errors) if " " in k]
    return "\n".join(out) + "\n"


NAMES = {"llama3-8b": "Llama 3 8B", "llama3-70b": "Llama 3 70B", "llama3-405b": "Llama 3.1 405B"}
MARKERS = {"b200": ("o", "tab:blue"), "gb200": ("s", "tab:green"), "gb300": ("D", "tab:purple"),
           "h100": ("^", "tab:orange")}


def plot(plt, rows, got):
    """figure.png / .svg: each row's error against its published rate, a marker per GPU, filled for check
    rows and hollow for calibration rows, the releases' spread as a vertical bar, the +-25% band shaded."""
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.axhspan(-25, 25, color="0.93", zorder=0)
    ax.axhline(0, color="0.5", lw=0.8, zorder=1)
    for gpu, (marker, color) in MARKERS.items():
        for split in ("calibration", "check"):
            mine = [r for r in rows if r["gpu"] == gpu and r["split"] == split and "error" not in got[r["id"]]]
            if not mine:
                continue
            x = [r["value"] for r in mine]
            y = [100 * (tokens(r, got[r["id"]]["time"]) / r["value"] - 1) for r in mine]
            ax.plot(x, y, marker, ms=8, color=color, mfc=color if split == "check" else "none", ls="none",
                    label=f"{gpu.upper()}, {split} rows", zorder=3)
            for r, yi in zip(mine, y):  # the releases of one configuration: the error each would give
                n, lo, hi = spread(r)
                if n > 1:
                    ax.vlines(r["value"], yi + 100 * (r["value"] / hi - 1) * (1 + yi / 100),
                              yi + 100 * (r["value"] / lo - 1) * (1 + yi / 100), color=color, lw=1, zorder=2)
    ax.set_xscale("log")
    ticks = [300, 1000, 3000, 10000, 30000]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:,}" for t in ticks])
    ax.set_xticks([], minor=True)
    ax.set_xlabel("published throughput, tokens/s per GPU (log scale)")
    ax.set_ylabel("pipegrid / published - 1 (%)")
    ax.set_ylim(-45, 45)
    ax.grid(alpha=0.3)
    ax.set_title("Dense Llama pre-training (Megatron-Bridge's page): pipegrid's error per row", fontsize=11)
    ax.text(0.01, 0.97, "shaded: +-25%; bars: the range over the page's releases", transform=ax.transAxes,
            fontsize=8, va="top", color="0.3")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(HERE, f"figure.{ext}"), dpi=120, metadata={"Date": None} if ext == "svg" else {})
    plt.close(fig)


def write_accuracy(path, rows, got):
    """accuracy.yaml: the check rows by GPU and precision, which `pipegrid run` prints for a dense
    transformer workload on those GPUs (pgx.write_accuracy, experiments/moe's format)."""
    def name(r):
        return (f"{NAMES[r['model']]} on {r['gpus']} {r['gpu'].upper()}s, {r['precision']}, TP{r['tp']} PP{r['pp']} "
                f"({r['source']} {r['release']})")
    pgx.write_accuracy(path, [
        "Written by experiments/blackwell-dense/run.py (its last full run, results.md): the dense check rows",
        "(published training runs, never fitted on) by GPU and precision, |error| = |pipegrid / published - 1|;",
        "faster: rows pipegrid predicts faster; spread: the releases of one configuration, max / min.",
        "`pipegrid run` prints the entry of each catalog GPU and precision a dense transformer workload uses;",
        "run.py --validate checks it against results.md."],
        rows, {r["id"]: tokens(r, got[r["id"]]["time"]) / r["value"] - 1 for r in rows if "error" not in got[r["id"]]},
        name)


def check_accuracy(rows):
    """accuracy.yaml against results.md's check table: the same groups, counts, median and max."""
    with open(os.path.join(HERE, "accuracy.yaml"), encoding="utf-8") as f:
        acc = yaml.safe_load(f)
    with open(os.path.join(HERE, "results.md"), encoding="utf-8") as f:
        lines = f.read().split("## Check rows")[1].split("## Summary")[0].splitlines()
    table = {c[1].strip(): float(c[7].strip().rstrip("%")) / 100 for c in (x.split("|") for x in lines if x.startswith("| bd-"))}
    by = {}
    for r in rows:
        if r["id"] in table:
            by.setdefault((r["gpu"], r["precision"]), []).append(abs(table[r["id"]]))
    got = {(g, p): e for g, ps in acc.items() for p, e in ps.items()}
    assert set(got) == set(by), (sorted(got), sorted(by))
    for k, errs in by.items():
        e = got[k]
        assert e["check_rows"] == len(errs) and abs(e["max_error"] - max(errs)) < 6e-4, (k, e, errs)
        assert abs(e["median_error"] - statistics.median(errs)) < 6e-4, (k, e, errs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--fit", nargs="*", metavar="GPU",
                    help="fit these GPUs' fp8 GEMM efficiency on their calibration rows (default: b200 gb200), "
                         "each written into fit.yaml beside the others")
    ap.add_argument("--with-fit", metavar="FIT_YAML", help="replay with a fit's figures in place of the catalog's")
    args = ap.parse_args()
    rows = load()
    problems = validate(rows)
    if problems:
        sys.exit("experiments/blackwell-dense/rows.yaml:\n  " + "\n  ".join(problems))
    if args.validate:
        check_accuracy(rows)
        print(f"ok: {len(rows)} rows; accuracy.yaml agrees with results.md")
        return
    full = args.fit is None and not args.with_fit and args.out == os.path.join(HERE, "results.md") \
        and args.max_gpus >= max(r["gpus"] for r in rows)
    plt = pgx.matplotlib_pyplot() if full else None  # first: may re-run this script under another python
    pipegrid = pgx.binary()
    pgx.check_catalog(pipegrid, ("b200", "gb200", "gb300", "h100"))
    rows = [r for r in rows if r["gpus"] <= args.max_gpus]
    if args.fit is not None:
        out = {"what": "fp8 GEMM efficiency (compute_efficiency: {fp8: {gemm: ...}}) per GPU, fitted on "
                       "rows.yaml's calibration rows by run.py --fit, the bf16 and fp16 GEMM figures tied "
                       f"at {BF16_PER_FP8:.4f} times it", "fit": {}}
        fit_path = os.path.join(HERE, "fit.yaml")
        if os.path.exists(fit_path):
            with open(fit_path, encoding="utf-8") as f:
                out["fit"] = yaml.safe_load(f)["fit"]
        for gpu in args.fit or ("b200", "gb200"):
            if not any(r["gpu"] == gpu and r["split"] == "calibration" for r in rows):
                sys.exit(f"--fit {gpu}: rows.yaml has no calibration row on it")
            x, obj, ids = fit_gpu(pipegrid, rows, gpu, args.j)
            out["fit"][gpu] = {"fp8_gemm": x, "objective": round(obj, 4), "rows": ids}
            print(gpu, out["fit"][gpu], flush=True)
        with open(fit_path, "w", encoding="utf-8") as f:
            yaml.safe_dump(out, f, sort_keys=False)
        return
    fit = None
    if args.with_fit:
        with open(args.with_fit, encoding="utf-8") as f:
            fit = {g: v["fp8_gemm"] for g, v in yaml.safe_load(f)["fit"].items()}
    with concurrent.futures.ThreadPoolExecutor(args.j) as ex:
        got = dict(zip([r["id"] for r in rows], ex.map(lambda r: replay(pipegrid, r, fit), rows)))
    text = markdown(rows, got)
    if full:
        write_accuracy(os.path.join(HERE, "accuracy.yaml"), rows, got)
        if plt:
            plot(plt, rows, got)
            text += "\n![pipegrid's error per row](figure.png)\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
