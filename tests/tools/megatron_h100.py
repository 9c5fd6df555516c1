#!/usr/bin/env python3
"""ctest: Megatron-Core's H100 table (experiments/megatron/h100_rows.yaml) and its replay (h100.py).

1. The transcription holds together: GPUs = t p d; aggregate petaFLOP/s = TFLOP/s per GPU x GPUs
   (both printed to 0.1); MFU = TFLOP/s per GPU / 989 (the H100's dense bf16 peak), printed to 1%;
   the printed model size = a GPT's parameters with untied embeddings, 12 l h^2 + 13 l h + 2 V h,
   within 3% (the labels are rounded).
2. h100.py's FLOP count is Megatron's formula: checked against the 6 N rule (N without the input
   embedding, a lookup) plus attention's 12 B s^2 l h, by hand for the 1.7B row.
3. A fresh replay of the rows on at most 96 GPUs gives the committed h100.md's values, and
   h100.yaml's summary is h100.md's table.
4. experiments/megatron/h100-1.7b.yaml, the 1.7B row as a file, gives h100.md's value.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile

import yaml

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pipegrid = sys.argv[1]
sys.path.insert(0, os.path.join(root, "experiments", "megatron"))
import h100  # noqa: E402

rows = h100.rows()
if len(rows) != 9:
    sys.exit(f"expected the table's 9 rows, got {len(rows)}")
for r in rows:
    if r["t"] * r["p"] * r["d"] != r["gpus"]:
        sys.exit(f"{r['id']}: t p d = {r['t'] * r['p'] * r['d']}, GPUs {r['gpus']}")
    if abs(r["tflops_per_gpu"] * r["gpus"] / 1000 - r["aggregate_pflops"]) > 0.05 + 0.05 * r["gpus"] / 1000:
        sys.exit(f"{r['id']}: {r['tflops_per_gpu']} x {r['gpus']} is not {r['aggregate_pflops']} PFLOP/s")
    if round(100 * r["tflops_per_gpu"] / 989) != r["mfu_percent"]:
        sys.exit(f"{r['id']}: {r['tflops_per_gpu']} / 989 is not {r['mfu_percent']}%")
    l, h, V = r["layers"], r["hidden"], r["vocabulary"]
    params = 12 * l * h * h + 13 * l * h + 2 * V * h
    label = float(r["model_size"].rstrip("B")) * 1e9
    if abs(params / label - 1) > 0.03:
        sys.exit(f"{r['id']}: {params / 1e9:.2f} B parameters, labelled {r['model_size']}")
    if r["hidden"] % r["heads"] or r["heads"] % r["t"]:
        sys.exit(f"{r['id']}: heads {r['heads']} against hidden {h} and t {r['t']}")

# 2. The 1.7B row: B 192, s 4096, l 24, h 2048, V 131072. Weights that a token's forward multiplies:
# 12 l h^2 + V h (the output layer; the input embedding is a lookup) = 1,207.96 M + 268.44 M; 6 N per
# token over 192 x 4096 tokens = 6.9665e15; attention's scores and their product with V: 12 B s^2 l h
# = 1.9000e15 (forward 4 B s^2 h per layer, backward twice that). Sum 8.8665e15.
one = next(r for r in rows if r["id"] == "h100-1.7b")
by_hand = 6 * (12 * 24 * 2048**2 + 131072 * 2048) * 192 * 4096 + 12 * 192 * 4096**2 * 24 * 2048
if abs(by_hand / 8.8665e15 - 1) > 1e-4 or abs(h100.flops_per_iteration(one) / by_hand - 1) > 1e-12:
    sys.exit(f"FLOPs per iteration: h100.py {h100.flops_per_iteration(one):.6g}, by hand {by_hand:.6g}")

# 3. The replay of the rows on at most 96 GPUs against the committed table.
committed = open(os.path.join(root, "experiments/megatron/h100.md")).read()
cells = {m.group(1): m.group(2) for m in re.finditer(r"^\| (h100-\S+) \|((?: [^|]* \|){8})", committed, re.M)}
errors = [float(v) for v in re.findall(r"^\| h100-\S+ \|(?: [^|]* \|){7} ([+-][\d.]+)% \|", committed, re.M)]
summary = yaml.safe_load(open(os.path.join(root, "experiments/megatron/h100.yaml")))
if (summary["check_rows"] != len(errors) != 9 or
        abs(100 * summary["max_error"] - max(abs(e) for e in errors)) > 0.051 or
        abs(100 * summary["median_error"] - statistics.median(abs(e) for e in errors)) > 0.051):
    sys.exit(f"h100.yaml {summary} is not h100.md's errors {errors}")
with tempfile.TemporaryDirectory() as tmp:
    small = [r["id"] for r in rows if r["gpus"] <= 96]
    p = subprocess.run([sys.executable, os.path.join(root, "experiments/megatron/h100.py"), "--pipegrid", pipegrid,
                        "--only"] + small + ["--out", tmp], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(p.stderr or p.stdout)
    fresh = open(os.path.join(tmp, "h100.md")).read()
    for rid in small:
        m = re.search(rf"^\| {re.escape(rid)} \|((?: [^|]* \|){{8}})", fresh, re.M)
        if not m or m.group(1) != cells.get(rid):
            sys.exit(f"{rid}: a fresh replay gives {m.group(1) if m else None}, h100.md has {cells.get(rid)}: "
                     "run experiments/megatron/h100.py")
# 4. experiments/megatron/h100-1.7b.yaml (the 1.7B row as a file a user runs) gives h100.md's value.
p = subprocess.run([pipegrid, "run", os.path.join(root, "experiments/megatron/h100-1.7b.yaml"), "--json"],
                   capture_output=True, text=True)
if p.returncode != 0:
    sys.exit(p.stderr)
import json  # noqa: E402
value = h100.flops_per_iteration(one) / (json.loads(p.stdout)["iteration_time_s"] * one["gpus"]) / 1e12
shown = float(cells["h100-1.7b"].split("|")[6])  # t, p, d, micro-batches, GPUs, published, pipegrid
if abs(value - shown) > 0.051:
    sys.exit(f"h100-1.7b.yaml gives {value:.2f} TFLOP/s per GPU, h100.md {shown}")
print(f"h100_rows.yaml: 9 rows consistent; replayed {small}: as committed; h100-1.7b.yaml: {value:.1f}")
