#!/usr/bin/env python3
"""pipegrid's V100 LSTM step and GEMMs against DeepBench's measurements (v100_lstm.csv,
v100_gemm.csv, README.md).

DeepBench times one unidirectional LSTM layer without its input projection (CUDNN_SKIP_INPUT). pipegrid
costs a whole `lstm` layer, input projection included, so for each row this script costs two model
files on the catalog's `v100` with `pipegrid workload show --json`: the LSTM layer (input [T, H],
hidden H) and a `linear` layer that is exactly its input projection (H -> 4 H per step, no bias:
the same FLOPs, streamed bytes and weights, and the same layer overhead). Their difference is
pipegrid's cost of DeepBench's layer: forward per step, and the backward (data + weights).
Each GEMM row (C[M, N] = A[M, K] B[K, N], cuBLAS) is a `linear` layer of K inputs and M outputs, no
bias, at a micro-batch of N: pipegrid's forward time minus the device's layer overhead (a framework
cost, not the kernel's) is its time for that GEMM.

    compare.py            writes compare.md here
    compare.py --check    recomputes and fails (exit 1) if compare.md differs (a ctest)

The pipegrid binary is build/pipegrid of this checkout, or $PIPEGRID."""
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import pgx  # noqa: E402


def layer_times(pipegrid, model, batch, folder):
    path = os.path.join(folder, model["name"] + ".json")
    with open(path, "w") as f:
        json.dump(model, f)
    p = subprocess.run([pipegrid, "workload", "show", path, "--device", "v100", "--json", "-b", str(batch)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"pipegrid workload show {path}: {p.stderr.strip()}")
    layer = json.loads(p.stdout)["layers"][-1]
    return layer["forward_s"], layer["backward_s"]


def rows(name="v100_lstm.csv"):
    with open(os.path.join(HERE, name), newline="") as f:
        return list(csv.DictReader(f))


def compare_gemms(pipegrid, layer_overhead):
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for r in rows("v100_gemm.csv"):
            m, n, k, prec = int(r["m"]), int(r["n"]), int(r["k"]), r["precision"]
            model = {"name": "gemm", "precision": prec, "micro_batch_size": n,
                     "layers": [{"name": "x", "kind": "input", "shape": [k]},
                                {"name": "g", "kind": "linear", "inputs": ["x"], "in_features": k,
                                 "out_features": m, "bias": False}]}
            fwd, _ = layer_times(pipegrid, model, n, folder)
            out.append({"precision": prec, "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k,
                        "measured": float(r["time_ms"]) * 1e-3, "pipegrid": fwd - layer_overhead})
    return out


def compare(pipegrid):
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for r in rows():
            h, n, t, prec = int(r["hidden"]), int(r["batch"]), int(r["steps"]), r["precision"]
            x = {"name": "x", "kind": "input", "shape": [t, h]}
            lstm = {"name": "lstm", "precision": prec, "micro_batch_size": n,
                    "layers": [x, {"name": "l", "kind": "lstm", "inputs": ["x"], "hidden": h}]}
            proj = {"name": "proj", "precision": prec, "micro_batch_size": n,
                    "layers": [x, {"name": "p", "kind": "linear", "inputs": ["x"], "in_features": h,
                                   "out_features": 4 * h, "bias": False}]}
            lf, lb = layer_times(pipegrid, lstm, n, folder)
            pf, pb = layer_times(pipegrid, proj, n, folder)
            fwd_step = (lf - pf) / t
            bwd = lb - pb
            m_fwd = float(r["forward_ms"]) * 1e-3 / t
            m_bwd = (float(r["backward_data_ms"]) + float(r["backward_weights_ms"])) * 1e-3
            out.append({"precision": prec, "hidden": h, "batch": n, "steps": t, "m_fwd": m_fwd, "p_fwd": fwd_step,
                        "m_bwd": m_bwd, "p_bwd": bwd})
    return out


def gemm_markdown(res):
    lines = ["## GEMMs (cuBLAS, CUDA 10.1, the 2019 workbook)", "",
             "pipegrid / DeepBench time per GEMM, by size (FLOPs = 2 M N K), and the rate DeepBench measured:", "",
             "| precision | FLOPs | GEMMs | ratio: median | range | DeepBench TFLOP/s: median | range |",
             "|---|---|---|---|---|---|---|"]
    bins = [(0, 1e9, "under 1 G"), (1e9, 1e11, "1-100 G"), (1e11, float("inf"), "100 G and more")]
    for prec in ("fp16", "fp32"):
        for lo, hi, label in bins:
            sel = [r for r in res if r["precision"] == prec and lo <= r["flops"] < hi]
            if not sel:
                continue
            ratio = [r["pipegrid"] / r["measured"] for r in sel]
            rate = [r["flops"] / r["measured"] / 1e12 for r in sel]
            lines.append(f"| {prec} | {label} | {len(sel)} | {statistics.median(ratio):.2f} | {min(ratio):.2f}-"
                         f"{max(ratio):.2f} | {statistics.median(rate):.1f} | {min(rate):.1f}-{max(rate):.1f} |")
    lines.append("")
    return "\n".join(lines)


def hockney_fit(device, gemms, wave=False):
    """A cost model fitted on DeepBench's GEMMs alone (pipegrid not involved), per precision: time =
    t0 + max(2 M N K / (r x peak), bytes / (bandwidth x the catalog's GEMM memory efficiency)), bytes =
    element size x (M K + K N + M N); r and t0 by grid search (r in 0.30-1.00 by 0.01, t0 in 0-30 us
    by 1 us) minimising the sum of squared ln(model / measured). With `wave`, the compute term is
    quantised as cuBLAS runs it: 128 x 128 output tiles, split-K in 1, 2, 4 or 8, whole waves of the
    V100's 80 SMs (the best split). gemms: rows of v100_gemm.csv. Returns {precision: (r, t0 us,
    rms ln, median |error|, 90th)}."""
    peak = device["peak_flops"]
    bw = device["memory_bandwidth_Bps"] * device["memory_efficiency"]["gemm"]
    sms = 80  # V100 SXM2 (NVIDIA Tesla V100 whitepaper)
    out = {}
    for prec, eb in (("fp16", 2), ("fp32", 4)):
        pts = []
        for r in gemms:
            if r["precision"] != prec:
                continue
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            if wave:
                # whole waves x one tile's work (128 x 128 x K / s), each SM at peak / sms
                tiles = math.ceil(m / 128) * math.ceil(n / 128)
                work = min(math.ceil(tiles * s / sms) * 2 * 128 * 128 * math.ceil(k / s) * sms
                           for s in (1, 2, 4, 8)) / peak[prec]
            else:
                work = 2 * m * n * k / peak[prec]
            pts.append((work, eb * (m * k + k * n + m * n) / bw, float(r["time_ms"]) * 1e-3))
        best = None
        for ri in range(30, 101):
            rate = ri / 100
            for t0 in range(0, 31):
                e = [math.log((t0 * 1e-6 + max(w / rate, mem)) / t) for w, mem, t in pts]
                cost = sum(x * x for x in e)
                if best is None or cost < best[0]:
                    best = (cost, rate, t0, e)
        cost, rate, t0, e = best
        a = sorted(math.expm1(abs(x)) for x in e)
        out[prec] = (rate, t0, math.sqrt(cost / len(e)), statistics.median(a), a[int(0.9 * len(a))])
    return out


def fit_markdown(device):
    lines = ["## A cost model fitted on these GEMMs alone", "",
             "Without pipegrid: time = t0 + max(2 M N K / (r x peak), bytes / (900 GB/s x 0.83)), r and t0 "
             "fitted per precision on its 160 GEMMs (`hockney_fit`); the second line of each precision "
             "quantises the work into whole waves of 128 x 128 tiles on the 80 SMs (split-K 1-8). "
             "Errors are model / DeepBench - 1.", "",
             "| precision | model | r (of peak) | t0 us | rms ln | median \\|error\\| | 90th percentile |",
             "|---|---|---|---|---|---|---|"]
    for wave in (False, True):
        for prec, (rate, t0, rms, med, p90) in hockney_fit(device, rows("v100_gemm.csv"), wave).items():
            lines.append(f"| {prec} | {'waves of 128 x 128 tiles' if wave else 'roofline + t0'} | {rate:.2f} | {t0} | "
                         f"{rms:.3f} | {100 * med:.1f}% | {100 * p90:.1f}% |")
    lines.append("")
    return "\n".join(lines)


def markdown(res):
    lines = ["# pipegrid's V100 LSTM step against DeepBench (cuDNN 7.3.1, DGX-1)", "",
             "Generated by `compare.py` (method: README.md) from `v100_lstm.csv` and the catalog's `v100`. "
             "Forward: time per step; backward: the whole layer's data and weight gradients (ms). "
             "Excess = DeepBench - pipegrid per step; ratio = pipegrid / DeepBench.", ""]
    for prec in ("fp16", "fp32"):
        sel = [r for r in res if r["precision"] == prec]
        lines += [f"## {prec}", "",
                  "| hidden | batch | steps | forward us/step: DeepBench | pipegrid | excess us | backward ms: DeepBench "
                  "| pipegrid | ratio |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in sel:
            lines.append(f"| {r['hidden']} | {r['batch']} | {r['steps']} | {r['m_fwd'] * 1e6:.1f} | "
                         f"{r['p_fwd'] * 1e6:.1f} | {(r['m_fwd'] - r['p_fwd']) * 1e6:+.1f} | {r['m_bwd'] * 1e3:.3f} | "
                         f"{r['p_bwd'] * 1e3:.3f} | {r['p_bwd'] / r['m_bwd']:.2f} |")
        ratios = [r["p_fwd"] / r["m_fwd"] for r in sel]
        excess = [(r["m_fwd"] - r["p_fwd"]) * 1e6 for r in sel]
        bratios = [r["p_bwd"] / r["m_bwd"] for r in sel]
        lines += ["", f"{prec}, {len(sel)} rows: forward ratio median {statistics.median(ratios):.2f} "
                  f"(range {min(ratios):.2f} to {max(ratios):.2f}), excess median {statistics.median(excess):+.1f} us "
                  f"(range {min(excess):+.1f} to {max(excess):+.1f}); backward ratio median "
                  f"{statistics.median(bratios):.2f} (range {min(bratios):.2f} to {max(bratios):.2f}).", ""]
    return "\n".join(lines)


def main():
    args, pipegrid, device = pgx.compare_setup(__doc__)
    text = (markdown(compare(pipegrid)) + "\n" + gemm_markdown(compare_gemms(pipegrid, device["layer_overhead_s"])) +
            "\n" + fit_markdown(device))
    path = os.path.join(HERE, "compare.md")
    if args.check:
        # The fit recovers a known model: GEMMs timed by the roofline form itself at r = 0.62, t0 = 7 us.
        fake = []
        for r in rows("v100_gemm.csv"):
            m, n, k, eb = int(r["m"]), int(r["n"]), int(r["k"]), 2 if r["precision"] == "fp16" else 4
            t = 7e-6 + max(2 * m * n * k / (0.62 * device["peak_flops"][r["precision"]]),
                           eb * (m * k + k * n + m * n) / (device["memory_bandwidth_Bps"] * device["memory_efficiency"]["gemm"]))
            fake.append(dict(r, time_ms=str(t * 1e3)))
        for prec, (rate, t0, rms, *_) in hockney_fit(device, fake).items():
            if (rate, t0) != (0.62, 7) or rms > 1e-9:
                sys.exit(f"hockney_fit recovers r {rate}, t0 {t0} us (rms {rms}) in {prec}, not 0.62 and 7 us")
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{path} is not what {pipegrid} gives: run experiments/kernels/deepbench/compare.py")
        print("compare.md matches")
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
