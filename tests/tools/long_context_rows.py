#!/usr/bin/env python3
"""ctest experiments/long_context_rows: experiments/long-context/rows.yaml holds NeMo's rows as printed
(each row's GPUs the product of its t, p, d, cp; its printed cells in its quote, the speedup among them
equal to with-CP / without-CP to the printed two decimals), split by the rule its header states (sorted
by id, alternate calibration and check); and the 4k and 8k rows replayed now give results.md's figures.

Usage: long_context_rows.py PIPEGRID REPO_ROOT"""
import os
import re
import sys

import yaml


def main():
    pipegrid, root = sys.argv[1], sys.argv[2]
    here = os.path.join(root, "experiments", "long-context")
    sys.path.insert(0, here)
    import run  # noqa: E402

    failures = []
    rows = yaml.safe_load(open(os.path.join(here, "rows.yaml")))["rows"]
    if len(rows) != 9:
        failures.append(f"{len(rows)} rows, the table prints 9")
    order = sorted(r["id"] for r in rows)
    for r in rows:
        want = "calibration" if order.index(r["id"]) % 2 == 0 else "check"
        if r["split"] != want:
            failures.append(f"{r['id']}: split {r['split']}, the rule gives {want}")
        if r["tp"] * r["pp"] * r["dp"] * r["cp"] != r["gpus"]:
            failures.append(f"{r['id']}: t p d cp do not multiply to its {r['gpus']} GPUs")
        cells = re.findall(r"<td[^>]*>([^<]*)</td>", r["quote"])
        printed = [r["sequence_k"], r["gpus"], r["tflops_per_gpu_without_cp"], r["tp"], r["pp"], r["dp"], r["cp"],
                   r["tflops_per_gpu"]]
        if [float(c) for c in cells[:8]] != [float(x) for x in printed]:
            failures.append(f"{r['id']}: the fields differ from the quoted cells {cells}")
        elif abs(float(cells[8]) - r["tflops_per_gpu"] / r["tflops_per_gpu_without_cp"]) > 0.005 + 1e-9:
            failures.append(f"{r['id']}: the printed speedup {cells[8]} is not with-CP / without-CP")
    results = open(os.path.join(here, "results.md")).read()
    for r in rows[:2]:
        got = run.replay(pipegrid, r)
        m = re.search(re.escape(f"| {r['id']} |") + r"[^\n]*?\| (\d+) \| ([+-][\d.]+)% \|", results)
        if "tflops" not in got or not m:
            failures.append(f"{r['id']}: replay {got}, results.md row {bool(m)}")
        elif f"{got['tflops']:.0f}" != m.group(1):
            failures.append(f"{r['id']}: replayed now {got['tflops']:.0f} TFLOP/s, results.md {m.group(1)}: run run.py")
    for f in failures:
        print("FAIL", f)
    print(f"long_context_rows: {len(rows)} rows, {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
