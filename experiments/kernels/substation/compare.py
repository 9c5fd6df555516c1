#!/usr/bin/env python3
"""pipegrid's BERT-Large encoder layer on a V100 in fp16 against the layer times published by
Ivanov et al.'s Substation (layers.csv, README.md).

For each configuration (batch, sequence) this script costs the zoo's `bert-large` at that sequence
length on the catalog's `v100` in fp16 with `pipegrid workload show --json` and takes one encoder
layer's forward + backward (`layer0`). It sets beside it:

- the published PyTorch time of one encoder layer, forward + backward;
- the GEMM efficiency the measurement implies at least: the four weight GEMMs' FLOPs (closed form,
  2 s h (4 h + 2 f) per sample forward, 3x with the backward) over the V100's fp16 peak and the
  measured time, as if every other kernel of the layer took no time;
- the GEMM efficiency that would close the gap with the layer's other kernels as pipegrid costs
  them (pipegrid's layer time less its four GEMMs' at the catalog's rate);
- the time per token at sequence 512 over that at 128, measured and pipegrid's.

    compare.py            writes compare.md here
    compare.py --check    recomputes and fails (exit 1) if compare.md differs, if pipegrid's
                          block FLOPs differ from the closed form, or if pipegrid's layer time is
                          more than 30% from a PyTorch measurement (a ctest)

The pipegrid binary is build/pipegrid of this checkout, or $PIPEGRID."""
import csv
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import pgx  # noqa: E402

TOLERANCE = 0.30  # the bound on a check row's error (docs/accuracy.md)


def rows():
    with open(os.path.join(HERE, "layers.csv"), newline="") as f:
        return list(csv.DictReader(f))


def deepbench_fit(device):
    """DeepBench's V100 fp16 GEMMs fitted alone (../deepbench/compare.py, hockney_fit): (r, t0 in s)."""
    spec = importlib.util.spec_from_file_location("deepbench_compare",
                                                  os.path.join(HERE, "..", "deepbench", "compare.py"))
    db = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(db)
    rate, t0, *_ = db.hockney_fit(device, db.rows("v100_gemm.csv"))["fp16"]
    return rate, t0 * 1e-6


def layer_gemm_time(tokens, h, f, device, rate, t0):
    """The four weight GEMMs of one layer, forward and backward (input gradient and weight gradient),
    each timed by DeepBench's fit: t0 + max(2 M N K / (r peak), 2 (M K + K N + M N) bytes / bandwidth)."""
    peak = device["peak_flops"]["fp16"]
    bw = device["memory_bandwidth_Bps"] * device["memory_efficiency"]["gemm"]
    total = 0.0
    for k_in, n_out in ((h, 3 * h), (h, h), (h, f), (f, h)):
        for m, n, k in ((tokens, n_out, k_in), (tokens, k_in, n_out), (k_in, n_out, tokens)):
            total += t0 + max(2.0 * m * n * k / (rate * peak), 2.0 * (m * k + k * n + m * n) / bw)
    return total


def gemm_flops(s, h, f):
    """Forward FLOPs per sample of the four weight GEMMs (QKV, output projection, two MLP matrices)."""
    return 2.0 * s * h * (4 * h + 2 * f)


def compare(pipegrid, peak, efficiency, device):
    out = []
    for r in rows():
        if r["framework"] != "PyTorch":
            continue
        b, s, h, a = int(r["batch"]), int(r["sequence"]), int(r["hidden"]), int(r["heads"])
        p = subprocess.run([pipegrid, "workload", "show", "bert-large", "--device", "v100", "--precision", "fp16",
                            "-b", str(b), "--arg", f"sequence={s}", "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"pipegrid workload show bert-large: {p.stderr.strip()}")
        layer = next(x for x in json.loads(p.stdout)["layers"] if x["name"] == "layer0")
        f = 4 * h
        measured = float(r["time_ms"]) * 1e-3
        gemm = 3 * b * gemm_flops(s, h, f)
        core = 4.0 * s * s * h  # Q K^T and scores x V, forward, per sample
        others = {x["framework"]: float(x["time_ms"]) * 1e-3 for x in rows()
                  if (x["batch"], x["sequence"]) == (r["batch"], r["sequence"])}
        out.append({"batch": b, "sequence": s, "hidden": h, "heads": a, "measured": measured,
                    "pipegrid": layer["forward_s"] + layer["backward_s"], "forward": layer["forward_s"],
                    "backward": layer["backward_s"], "gemm_flops": gemm,
                    "block_flops": layer["forward_flops"] / b, "closed_form": gemm_flops(s, h, f) + core,
                    "min_gemm_efficiency": gemm / (peak * measured), "others": others, "peak": peak})
        # The rest of the layer as pipegrid costs it (its time less the GEMMs' at the catalog's rate:
        # at these sizes they are compute-bound), and the GEMM rate that would close the gap.
        rest = out[-1]["pipegrid"] - gemm / (peak * efficiency)
        out[-1]["rest"] = rest
        out[-1]["gemm_efficiency_needed"] = gemm / (peak * (measured - rest))
        # The GEMMs at cuBLAS's measured V100 rate (DeepBench), and what that leaves for the rest.
        rate, t0 = deepbench_fit(device)
        out[-1]["deepbench_gemm"] = layer_gemm_time(b * s, h, f, device, rate, t0)
        out[-1]["deepbench_fit"] = (rate, t0)
    return out


def markdown(res, efficiency):
    lines = ["# BERT-Large encoder layer, V100, fp16: pipegrid against Substation's published times",
             "",
             "Written by `compare.py` (README.md says what was measured). Times are one encoder layer's",
             "forward + backward; pipegrid is the zoo's `bert-large` block on the catalog's `v100` (fp16 GEMM",
             f"efficiency {efficiency:.4f}, the whole-model calibration).",
             "",
             "| batch | sequence | PyTorch (ms) | pipegrid (ms) | pipegrid / PyTorch | GEMM efficiency needed, the rest free | pipegrid's rest (ms) | GEMM efficiency needed beside it | DeepSpeed (ms) | Substation (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res:
        o = r["others"]
        lines.append(f"| {r['batch']} | {r['sequence']} | {r['measured'] * 1e3:.2f} | {r['pipegrid'] * 1e3:.2f} | "
                     f"{r['pipegrid'] / r['measured']:.3f} | {r['min_gemm_efficiency']:.3f} | {r['rest'] * 1e3:.2f} | "
                     f"{r['gemm_efficiency_needed']:.3f} | "
                     f"{o['DeepSpeed'] * 1e3:.2f} | {o['Substation'] * 1e3:.2f} |")
    by_s = {r["sequence"]: r for r in res}
    if 512 in by_s and 128 in by_s:
        lo, hi = by_s[128], by_s[512]
        per_token = lambda r, key: r[key] / (r["batch"] * r["sequence"])  # noqa: E731
        m = per_token(hi, "measured") / per_token(lo, "measured")
        p = per_token(hi, "pipegrid") / per_token(lo, "pipegrid")
        lines += ["", f"Time per token at sequence 512 over that at 128: measured {m:.3f}, pipegrid {p:.3f}."]
        # One GEMM rate e for both layers and the rest scaled by one k:
        # measured = gemm / (peak e) + k rest, two equations in 1 / e and k.
        (g1, r1, t1), (g2, r2, t2) = ((r["gemm_flops"] / r["peak"], r["rest"], r["measured"]) for r in (hi, lo))
        inv_e = (t2 - t1 * r2 / r1) / (g2 - g1 * r2 / r1)
        k = (t1 - g1 * inv_e) / r1
        lines += ["", f"One GEMM rate for both layers, and the rest of each at one multiple of pipegrid's cost: "
                  f"GEMMs at {1 / inv_e:.3f} of peak, the rest at {k:.2f}x."]
    rate, t0 = res[0]["deepbench_fit"]
    lines += ["", f"With the GEMMs at cuBLAS's rate on a V100 as DeepBench measured it (its fp16 GEMMs fitted alone: "
              f"r = {rate:.2f} of peak, t0 = {t0 * 1e6:.0f} us; ../deepbench/compare.md), the rest of each layer "
              "(the attention core's batched GEMMs and every memory-bound kernel) takes:", "",
              "| batch | sequence | GEMMs at DeepBench's rate (ms) | rest, measured less those (ms) | pipegrid's rest (ms) | ratio |",
              "|---|---|---|---|---|---|"]
    for r in res:
        left = r["measured"] - r["deepbench_gemm"]
        lines.append(f"| {r['batch']} | {r['sequence']} | {r['deepbench_gemm'] * 1e3:.2f} | {left * 1e3:.2f} | "
                     f"{r['rest'] * 1e3:.2f} | {left / r['rest']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main():
    args, pipegrid, device = pgx.compare_setup(__doc__)
    peak = device["peak_flops"]["fp16"]
    efficiency = device["compute_efficiency"]["fp16"]["gemm"]
    res = compare(pipegrid, peak, efficiency, device)
    text = markdown(res, efficiency)
    path = os.path.join(HERE, "compare.md")
    if not args.check:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}")
        return
    failures = []
    for r in res:
        if abs(r["block_flops"] / r["closed_form"] - 1) > 1e-9:
            failures.append(f"s={r['sequence']}: pipegrid's block FLOPs {r['block_flops']:.6g} per sample, "
                            f"closed form {r['closed_form']:.6g}")
        if abs(r["pipegrid"] / r["measured"] - 1) > TOLERANCE:
            failures.append(f"b={r['batch']} s={r['sequence']}: pipegrid {r['pipegrid'] * 1e3:.2f} ms against "
                            f"PyTorch's {r['measured'] * 1e3:.2f} ms, more than {TOLERANCE:.0%} off")
    with open(path, encoding="utf-8") as f:
        if f.read() != text:
            failures.append("compare.md is not what this binary gives: run compare.py")
    if failures:
        sys.exit("\n".join(failures))
    print(f"ok: {len(res)} layers")


if __name__ == "__main__":
    main()
