#!/usr/bin/env python3
"""How far apart the published measurements are among themselves: a floor under any simulator's
error on them, computed from measurements.yaml alone (pipegrid is not run).

Three comparisons (README.md, "How consistent the data are"):

A. The same model, GPU, precision and GPU count in different sources (frameworks, profilers):
   the per-GPU rates (samples/s, or tokens/s for token models, so GNMT rows with different
   sentence lengths compare) and their spread max/min.
B. One GPU against eight in the same table (same source, commit, model, batch per GPU and
   precision): the per-GPU rate at 8 GPUs over the rate at 1, i.e. the published data-parallel
   scaling efficiency.
C. BERT-Large in one source commit on one GPU and precision, pre-training at sequence 128 and 512
   and SQuAD fine-tuning at 384: sequences/s per GPU, against the work per sequence, s (24 h^2 +
   4 s h) (forward FLOPs per token and layer, Narayanan et al., SC'21, eq. 2 without the
   vocabulary term; the heads are < 2% of the work and left out), s being the length the GPUs
   compute (a row's `computed_sequence` where its loader pads a batch only to its longest
   sequence, else its `sequence`).

For a pair of rows whose published ratio differs by a factor F from the ratio a model predicts
(equal rates for the same configuration in A; the work ratio in C), no model that predicts that
ratio can put both rows closer than (F - 1) / (F + 1) to their published values (the best it can do
is to err by -x on one and +x on the other). The script prints that floor for every pair.

  experiments/validation/consistency.py [--measurements FILE] [--out DIR]   # writes consistency.md
"""
import argparse
import itertools
import math
import os
import sys

import vlib

HIDDEN = {"bert-large": 1024}


def per_gpu_rate(row):
    """(rate per GPU, unit): tokens/s for models with a tokens rule, else samples/s; None for a
    tflops_per_gpu row (its work per sample depends on the counting convention)."""
    v = float(row["value"]) / int(row["gpus"])
    if row["metric"] == "tflops_per_gpu":
        return None
    try:
        tps = vlib.tokens_per_sample(row)
    except vlib.MappingError:
        tps = None
    if tps:
        return (v if row["metric"] == "tokens_per_s" else v * tps), "tokens/s"
    return v, "samples/s"


def floor(f):
    """Least max |error| over two rows whose published ratio is off by factor f from the model's."""
    f = max(f, 1 / f)
    return (f - 1) / (f + 1)


def pct(x):
    return f"{100 * x:.0f}%"


# Model parameters that say how a stack runs the model, not what it trains (kernel fusion; the
# positions BERT's masked-LM head runs on, where the loss reads only the masked ones either way):
# rows that differ only in them are the same configuration.
IMPLEMENTATION_PARAMS = {"fused_bn_relu", "kernel_fusion", "mlm_positions"}


def config_params(r):
    """A row's model parameters that define the configuration (sorted (key, value) pairs)."""
    return tuple(sorted((k, v) for k, v in (r.get("model_params") or {}).items() if k not in IMPLEMENTATION_PARAMS))


def same_config(rows):
    """A: groups of rows with the same model (and parameters, but for token models), GPU,
    precision and GPU count from at least two sources (a row with a computed_sequence only with
    rows of the same computed length)."""
    groups = {}
    for r in rows:
        rate = per_gpu_rate(r)
        if rate is None:
            continue
        params = () if rate[1] == "tokens/s" and r["model"].startswith("gnmt") else config_params(r)
        if r.get("computed_sequence"):  # another computation than the same sequence padded in full
            params += (("computed_sequence", r["computed_sequence"]),)
        model = "gnmt (per token)" if r["model"].startswith("gnmt") else r["model"]
        if r["model"] == "gnmt16":
            continue  # twice GNMT-8's layers: not the same work per token
        groups.setdefault((model, params, r["gpu"], r["precision"], int(r["gpus"])), []).append((r, rate))
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len({r["source"] for r, _ in members}) < 2:
            continue
        rates = [rate for _, (rate, _) in members]
        out.append((key, members, max(rates) / min(rates)))
    return out


def row_groups(rows):
    """{row id: (group label, spread max/min)} for every row in a same-configuration group: A's
    groups (same_config), and rows of the tflops_per_gpu metric (which A leaves out) with the same
    model and parameters, GPU, precision, GPU count and batch from two or more publications (urls),
    compared by their published TFLOP/s per GPU (Megatron's paper against its v1.0 blog)."""
    out = {}
    for (model, params, gpu, prec, n), members, spread in same_config(rows):
        label = f"{model}{''.join(f' {k}={v}' for k, v in params)} {gpu} x {n} {prec}"
        for r, _ in members:
            out[r["id"]] = (label, spread)
    tflops = {}
    for r in rows:
        if r["metric"] == "tflops_per_gpu":
            key = (r["model"], config_params(r), r["gpu"], r["precision"], int(r["gpus"]), r["batch_per_gpu"])
            tflops.setdefault(key, []).append(r)
    for (model, params, gpu, prec, n, b), members in sorted(tflops.items(), key=lambda kv: str(kv[0])):
        if len({r["url"] for r in members}) < 2:
            continue
        values = [float(r["value"]) for r in members]
        for r in members:
            out[r["id"]] = (f"{model} {gpu} x {n} {prec} b{b} (TFLOP/s per GPU)", max(values) / min(values))
    return out


def scaling(rows):
    """B: (row at 1 GPU, row at 8 GPUs, per-GPU rate ratio) in the same table."""
    def key(r):
        return (r["source"], r["url"], r["model"], tuple(sorted((r.get("model_params") or {}).items())),
                r["gpu"], r["precision"], r["batch_per_gpu"])
    ones = {key(r): r for r in rows if int(r["gpus"]) == 1}
    out = []
    for r in rows:
        if int(r["gpus"]) == 8 and key(r) in ones:
            one = ones[key(r)]
            out.append((one, r, per_gpu_rate(r)[0] / per_gpu_rate(one)[0]))
    return sorted(out, key=lambda t: t[2])


def work_per_sequence(row):
    h = HIDDEN[row["model"]]
    s = float(row.get("computed_sequence") or vlib.model_param(row, "sequence"))
    return s * (24 * h * h + 4 * s * h)


def bert_variants(rows):
    """C: pairs of BERT-Large rows from one source commit on one GPU and precision, different
    sequence lengths or tasks, with (published rate ratio) / (work-inverse ratio)."""
    bert = [r for r in rows if r["model"] in HIDDEN]
    groups = {}
    for r in bert:
        groups.setdefault((r["url"], r["gpu"], r["precision"]), []).append(r)
    out = []
    for (url, gpu, prec), members in sorted(groups.items()):
        for a, b in itertools.combinations(sorted(members, key=lambda r: r["id"]), 2):
            task_a, task_b = ("squad" in a["id"]), ("squad" in b["id"])
            if vlib.model_param(a, "sequence") == vlib.model_param(b, "sequence") and task_a == task_b:
                continue  # same variant (1 and 8 GPUs): that is comparison B
            ra, rb = float(a["value"]) / int(a["gpus"]), float(b["value"]) / int(b["gpus"])  # sequences/s
            expected = work_per_sequence(b) / work_per_sequence(a)  # rate a / rate b if efficiency were equal
            out.append((a, b, ra / rb, expected, (ra / rb) / expected))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measurements", default=vlib.MEASUREMENTS)
    p.add_argument("--out", default=vlib.HERE, help="folder for consistency.md (default: this folder)")
    args = p.parse_args()
    rows = vlib.load_rows(args.measurements)
    sets = {r["id"]: r["set"] for r in rows}
    L = ["# How consistent the published measurements are among themselves", "",
         "Generated by `experiments/validation/consistency.py` from `measurements.yaml` alone (pipegrid "
         "is not run). *floor*: the least max |error| any model can reach on the pair if it predicts "
         "the ratio stated in the section (README.md, \"How consistent the data are\"). "
         "Set: c = calibration, k = check.", ""]

    L += ["## A. Same model, GPU, precision and GPU count, different sources", "",
          "| model | gpu x count | precision | per-GPU rate (source, batch) | max/min | floor |", "|---|---|---|---|---|---|"]
    for (model, params, gpu, prec, n), members, spread in same_config(rows):
        cells = "; ".join(f"{rate:,.0f} {unit} ({r['source'].replace('NVIDIA DeepLearningExamples', 'DLE')}, "
                          f"b{r['batch_per_gpu']}, {sets[r['id']][0] if sets[r['id']] == 'calibration' else 'k'})"
                          for r, (rate, unit) in sorted(members, key=lambda m: m[1][0]))
        name = model + "".join(f" {k}={v}" for k, v in params)
        L.append(f"| {name} | {gpu} x {n} | {prec} | {cells} | {spread:.2f} | {pct(floor(spread))} |")

    L += ["", "## B. Data-parallel scaling in one table: per-GPU rate at 8 GPUs / at 1 GPU", "",
          "| model | gpu | precision | batch/GPU | 1 GPU (set) | 8 GPUs (set) | scaling | source |", "|---|---|---|---|---|---|---|---|"]
    for one, eight, ratio in scaling(rows):
        name = one["model"] + "".join(f" {k}={v}" for k, v in sorted((one.get("model_params") or {}).items()))
        L.append(f"| {name} | {one['gpu']} | {one['precision']} | {one['batch_per_gpu']} | "
                 f"{float(one['value']):,.0f} ({sets[one['id']]}) | {float(eight['value']):,.0f} ({sets[eight['id']]}) | "
                 f"{ratio:.2f} | {one['source'].replace('NVIDIA DeepLearningExamples', 'DLE')} |")

    L += ["", "## C. BERT-Large variants in one source commit, same GPU and precision", "",
          "Rate ratio = sequences/s per GPU of the first row / the second. Work ratio = work per sequence "
          "of the second / the first (s (24h^2 + 4sh), s the computed length: `computed_sequence` where "
          "a row has one): the rate ratio a model with equal efficiency predicts. "
          "F = rate ratio / work ratio.", "",
          "| first row (set) | second row (set) | rate ratio | work ratio | F | floor |", "|---|---|---|---|---|---|"]
    worst = {}
    for a, b, ratio, expected, f in bert_variants(rows):
        L.append(f"| {a['id']} ({sets[a['id']]}) | {b['id']} ({sets[b['id']]}) | {ratio:.2f} | {expected:.3f} | "
                 f"{f:.2f} | {pct(floor(f))} |")
        for r in (a, b):
            worst[r["id"]] = max(worst.get(r["id"], 0), floor(f))
    for (model, params, gpu, prec, n), members, spread in same_config(rows):
        for r, _ in members:
            worst[r["id"]] = max(worst.get(r["id"], 0), floor(spread))

    over = sorted((v, k) for k, v in worst.items() if sets[k] == "check" and v > 0.10)
    L += ["", "## Check rows in a pair whose floor exceeds 10%", "",
          "| check row | largest floor of its pairs (A, C) |", "|---|---|"]
    L += [f"| {k} | {pct(v)} |" for v, k in reversed(over)]
    L.append("")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "consistency.md")
    with open(path, "w") as f:
        f.write("\n".join(L))
    print(f"wrote {path}: {len(over)} check rows in a pair whose floor exceeds 10%")


if __name__ == "__main__":
    sys.exit(main())
