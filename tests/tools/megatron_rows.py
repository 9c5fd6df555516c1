#!/usr/bin/env python3
"""ctest: the transcription of Megatron-LM's A100 rows (experiments/megatron/rows.yaml), Tables 1 and 2
of Narayanan et al. (arXiv 2104.04473), against the paper's own arithmetic, not pipegrid's.

1. Every row's configuration holds together: GPUs = t p d, the batch a whole number of micro-batches
   per replica, the layers a whole number per model chunk (p x v).
2. The printed parameter count is the paper's eq. (2) of the row's shape, P = 12 l h^2 (1 + 13 / (12 h)
   + (V + s) / (12 l h)) with V = 51,200 and s = 2,048, to the printed 0.1 billion.
3. Table 2's printed training time for 300B tokens is the paper's eq. (4), 8 T P / (n X), of the row's
   GPUs n and TFLOP/s X, within 5% (the paper rounds; eq. 4 is its own approximation).
4. Each table's rows are split by the file's rule: in the order printed, 1st, 3rd, ... calibration.
5. Table 2's quote holds every row's GPUs, microbatch size, TFLOP/s and days, in the order printed.
"""
import os
import re
import sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "experiments", "megatron"))
import run  # noqa: E402
import yaml  # noqa: E402

V, S = 51200, 2048
rows = run.rows()
data = yaml.safe_load(open(os.path.join(root, "experiments", "megatron", "rows.yaml")))
problems = []
checked = {"narayanan2021_table1": 0, "narayanan2021_table2": 0}
for table in checked:
    ids = [r[0] for r in data[table]["rows"]]
    for i, r in enumerate(x for x in rows if x["table"] == table):
        checked[table] += 1
        t, p, v, l, h = r["t"], r["p"], r.get("v", 1), r["layers"], r["hidden"]
        if r["gpus"] % (t * p):
            problems.append(f"{r['id']}: {r['gpus']} GPUs is not a multiple of t p = {t * p}")
        d = r["gpus"] // (t * p)
        if r["batch"] % (d * r["mbs"]):
            problems.append(f"{r['id']}: batch {r['batch']} is not a whole number of micro-batches of {r['mbs']} on {d} replicas")
        if l % (p * v):
            problems.append(f"{r['id']}: {l} layers do not split into p x v = {p * v} chunks")
        P = 12 * l * h * h * (1 + 13 / (12 * h) + (V + S) / (12 * l * h))
        if abs(P / 1e9 - r["parameters_billion"]) > 0.051:
            problems.append(f"{r['id']}: eq. (2) gives {P / 1e9:.2f} B parameters, printed {r['parameters_billion']}")
        if "train_days" in r:
            days = 8 * 300e9 * r["parameters_billion"] * 1e9 / (r["gpus"] * r["tflops_per_gpu"] * 1e12) / 86400
            if abs(days / r["train_days"] - 1) > 0.05:
                problems.append(f"{r['id']}: eq. (4) gives {days:.1f} days, printed {r['train_days']}")
        if r["id"] != ids[i] or r["set"] != ("calibration" if i % 2 == 0 else "check"):
            problems.append(f"{r['id']}: set {r['set']} breaks the split rule (position {i + 1})")

quote = data["narayanan2021_table2"]["quote"]
cells = [c.strip() for c in quote.split("|")]
at = 0
for r in (x for x in rows if x["table"] == "narayanan2021_table2"):
    want = [str(r["gpus"]), str(r["mbs"]), str(r["tflops_per_gpu"]), str(r["train_days"])]
    try:
        at = cells.index(want[0], at)
    except ValueError:
        problems.append(f"{r['id']}: the quote has no GPU count {want[0]} after the previous row")
        continue
    if cells[at:at + 4] != want:
        problems.append(f"{r['id']}: the quote reads {cells[at:at + 4]}, the row {want}")
    at += 4
if not re.search(r"PTD Parallelism \| 174\.6 \| 96 \| 1536 \|", quote) or "529.6 | 280 | 2240" not in quote:
    problems.append("Table 2's quote lacks the model-parallel sizes and batches of the rows")
if checked != {"narayanan2021_table1": 10, "narayanan2021_table2": 6}:
    problems.append(f"expected Table 1's 10 rows and Table 2's 6 PTD-P rows, got {checked}")
if problems:
    sys.exit("\n".join(problems))
print(f"rows.yaml: Table 1's {checked['narayanan2021_table1']} and Table 2's {checked['narayanan2021_table2']} "
      "rows consistent with the paper's eq. (2) and (4), the split rule and the quote")
