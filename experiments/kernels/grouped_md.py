#!/usr/bin/env python3
"""grouped.md from the stored H200 runs of grouped_gemm_torch.py (h200/grouped/).

    python3 experiments/kernels/grouped_md.py          # print grouped.md
    python3 experiments/kernels/grouped_md.py --check  # grouped.md is the stored runs' table, and the
                                                       # ranges README.md and docs/moe.md quote hold

pipegrid's figure for a cut is its grouped-GEMM cost (core/block_kernels.cc, core/device.cc): per GEMM
pass, one kernel start-up per wave of 4 experts plus the FLOPs at the device's `gemm` efficiency of
its peak (topologies/devices.yaml's h200, read through moe_md.catalog): bf16 at 0.70 of 989 TFLOP/s,
fp8 at 0.68 of 1,979. The fp8 figure here is the GEMMs' alone: pipegrid's quantization kernels, which
the measurement does not run, are left out of both sides.
"""
import json
import math
import os
import statistics
import sys

import yaml

from moe_md import HERE, catalog

RUNS = [os.path.join(HERE, "h200", "grouped", f"grouped_gemm_run{r}.json") for r in (1, 2)]
STREAMS = 4  # core/block_kernels.h kGroupedGemmStreams


def load():
    """Per cut (in the runs' order): the six GEMMs of both runs, summed per run."""
    runs = [json.load(open(p))["cuts"] for p in RUNS]
    cuts = {}
    for recs in runs:
        for i, r in enumerate(recs):
            # bf16 against float32 and 4 streams against 1 hold everywhere; fp8 misses its 0.1 only on
            # the longest reductions (below).
            assert r["check_bf16_rel"] < 1e-2 and r["check_4streams_rel"] < 1e-3, r
            assert r["check_fp8_rel"] < 0.1 or r["k"] >= 16384, r
            c = cuts.setdefault(r["cut"], {"local": r["local"], "flops": 0.0, "runs": [{}, {}], "fp8_rel": []})
            if recs is runs[0]:
                c["flops"] += r["flops"]
            c["fp8_rel"].append((r["k"], r["check_fp8_rel"]))
            run = c["runs"][runs.index(recs)]
            for key in ("bf16_4s_graph_ms", "bf16_4s_ms", "bf16_4s_host_ms", "bf16_1s_host_ms", "grouped_ms"):
                run[key] = run.get(key, 0.0) + r[key]
            # Transformer Engine's Float8CurrentScaling: fast accumulation in the forward GEMM only.
            fp8 = r["fp8fast_4s_graph_ms"] if r["gemm"].endswith("fwd") else r["fp8_4s_graph_ms"]
            run["fp8_te_ms"] = run.get("fp8_te_ms", 0.0) + fp8
    return cuts


def mean(c, key):
    return statistics.mean(run[key] for run in c["runs"])


def spread(c, key):
    a, b = (run[key] for run in c["runs"])
    return abs(a - b) / ((a + b) / 2)


def fp8_efficiency():
    with open(os.path.join(HERE, "..", "..", "topologies", "devices.yaml")) as f:
        d = yaml.safe_load(f)["h200"]
    return float(d["peak"]["fp8"].rstrip("TFLOPS")) * 1e12, d["compute_efficiency"]["fp8"]["gemm"]


def modelled(c, cat, peak, eff):
    """pipegrid's milliseconds for the cut's six GEMM passes (forward, data and weight gradients of
    fc1 and fc2): a start-up per wave of 4 experts in each, the FLOPs at peak x eff."""
    waves = math.ceil(c["local"] / STREAMS)
    return (6 * waves * cat["startup"] + c["flops"] / (peak * eff)) * 1e3


def table():
    cat = catalog("h200")
    fp8_peak, fp8_eff = fp8_efficiency()
    cuts = load()
    rows = []
    for name, c in cuts.items():
        dev, fp8 = mean(c, "bf16_4s_graph_ms"), mean(c, "fp8_te_ms")
        rows.append({
            "cut": name, "local": c["local"], "gflop": c["flops"] / 1e9, "device": dev,
            "frac": c["flops"] / (dev * 1e-3) / cat["bf16"], "spread": spread(c, "bf16_4s_graph_ms"),
            "eager": mean(c, "bf16_4s_ms"), "host_us": mean(c, "bf16_4s_host_ms") * 1e3 / (6 * c["local"]),
            "host1_us": mean(c, "bf16_1s_host_ms") * 1e3 / (6 * c["local"]), "grouped": mean(c, "grouped_ms"),
            "model": modelled(c, cat, cat["bf16"], cat["gemm"]),
            "fp8": fp8, "fp8_frac": c["flops"] / (fp8 * 1e-3) / fp8_peak,
            "fp8_model": modelled(c, cat, fp8_peak, fp8_eff), "fp8_rel": c["fp8_rel"]})
    return rows, cat, fp8_eff


def hockney(key):
    """Least squares on relative residuals of t = 6 x waves x t0 + FLOPs / r over the cuts (results.md's
    form, with one start-up per wave of 4 experts in each pass): (t0 in us, r in FLOP/s, max and median
    |relative residual|)."""
    a = []
    for c in load().values():
        t = mean(c, key) * 1e-3
        a.append((6 * math.ceil(c["local"] / STREAMS) / t, c["flops"] / t))  # t0 * a0 + (1 / r) * a1 = 1
    s00, s01, s11 = (sum(x[i] * x[j] for x in a) for i, j in ((0, 0), (0, 1), (1, 1)))
    b0, b1 = sum(x[0] for x in a), sum(x[1] for x in a)
    det = s00 * s11 - s01 * s01
    t0, inv_r = (b0 * s11 - b1 * s01) / det, (s00 * b1 - s01 * b0) / det
    res = sorted(abs(t0 * x[0] + inv_r * x[1] - 1) for x in a)
    return t0 * 1e6, 1 / inv_r, res[-1], statistics.median(res)


def markdown():
    rows, cat, fp8_eff = table()
    fp8_peak, _ = fp8_efficiency()
    hb, h8 = hockney("bf16_4s_graph_ms"), hockney("fp8_te_ms")
    r = lambda x: x["model"] / x["device"]  # noqa: E731
    r8 = lambda x: x["fp8_model"] / x["fp8"]  # noqa: E731
    bound = [x for x in rows if x["eager"] > 1.5 * x["device"]]
    rel = sorted({k: e for x in rows for k, e in x["fp8_rel"]}.items())
    out = [
        "# The experts' grouped GEMMs on an H200, against pipegrid (issue 50, item 3)", "",
        "Written by `grouped_md.py` from `h200/grouped/` (two runs of `grouped_gemm_torch.py`, run 10 in "
        "README.md). Each cut is one MoE layer's six expert GEMM passes (fc1 and fc2: forward, data gradient, "
        "weight gradient) over a device's local experts at the per-device cut of one of experiments/moe's "
        "rows, balanced routing; one cuBLAS GEMM per expert round-robin over 4 streams, as Transformer "
        "Engine's grouped linear runs them. **device**: the same launches captured in a CUDA graph and "
        "replayed (the device's time alone), mean of the two runs, and their spread; **eager**: launched "
        "from Python, timed by CUDA events (the longer of the device's and the host's time); **host per "
        "GEMM**: the host's time to issue the cut over its 6 x local GEMMs, on 4 streams (on 1); "
        f"**pipegrid**: a start-up of {cat['startup'] * 1e6:.0f} us per wave of 4 experts in each pass plus the "
        f"FLOPs at the catalog's `gemm` efficiency (bf16 {cat['gemm']:.2f} of 989 TFLOP/s, fp8 {fp8_eff:.2f} of "
        "1,979); **fp8**: torch._scaled_mm with one scale per tensor (Transformer Engine's current scaling: "
        "fast accumulation in the forward GEMM, split accumulation in the gradients'), quantization not "
        "timed on either side; **grouped**: torch._grouped_mm (one kernel, bf16), for reference.", "",
        "| cut | local experts | GFLOP | device ms (spread) | of bf16 peak | eager ms | host per GEMM, us | "
        "grouped ms | pipegrid ms | pipegrid / device | fp8 device ms | of fp8 peak | pipegrid fp8 ms | "
        "pipegrid / fp8 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        out.append(
            f"| {x['cut']} | {x['local']} | {x['gflop']:,.0f} | {x['device']:.2f} ({100 * x['spread']:.0f}%) | "
            f"{x['frac']:.2f} | {x['eager']:.2f} | {x['host_us']:.0f} ({x['host1_us']:.0f}) | {x['grouped']:.2f} | "
            f"{x['model']:.2f} | {r(x):.2f} | {x['fp8']:.2f} | {x['fp8_frac']:.2f} | {x['fp8_model']:.2f} | "
            f"{r8(x):.2f} |")
    out += [
        "",
        f"- **bf16**: the device runs every cut at {min(x['frac'] for x in rows):.2f} to "
        f"{max(x['frac'] for x in rows):.2f} of peak, as the dense tensor-parallel GEMMs "
        "(results.md's Hockney fit, 0.70), down to 1,024 rows per expert; pipegrid's figure is "
        f"{min(map(r, rows)):.2f} to {max(map(r, rows)):.2f} of the measurement. So the grouped-GEMM class "
        "needs no figure of its own on Hopper: it takes the `gemm` one, now measured at these cuts.",
        f"- **fp8**: {min(x['fp8_frac'] for x in rows):.2f} to {max(x['fp8_frac'] for x in rows):.2f} of peak "
        f"(the fine cuts lowest); pipegrid's GEMMs are {min(map(r8, rows)):.2f} to {max(map(r8, rows)):.2f} "
        f"of the measurement at the catalog's {fp8_eff:.2f} (DeepGEMM's published rate).",
        f"- **Hockney's two parameters** over the 16 cuts (a start-up per wave of 4 experts in each pass, "
        f"least squares on relative residuals): bf16 t0 = {hb[0]:.1f} us, r_inf = {hb[1] / cat['bf16']:.3f} of "
        f"peak (residuals: max {100 * hb[2]:.1f}%, median {100 * hb[3]:.1f}%), against the catalog's "
        f"{cat['startup'] * 1e6:.0f} us and {cat['gemm']:.2f}; fp8 t0 = {h8[0]:.1f} us, r_inf = "
        f"{h8[1] / fp8_peak:.3f} (max {100 * h8[2]:.1f}%, median {100 * h8[3]:.1f}%), against "
        f"{cat['startup'] * 1e6:.0f} us and {fp8_eff:.2f}. The fp8 GEMMs' longer fixed time is what makes "
        "pipegrid fast on the finest fp8 cuts; the catalog has one start-up per device and kernel class, not "
        "per precision (not changed).",
        f"- **The host**: issued from Python, the per-expert launches cost {min(x['host_us'] for x in rows):.0f} "
        f"to {max(x['host_us'] for x in rows):.0f} us each on 4 streams, the group's fork and join of streams "
        f"included ({min(x['host1_us'] for x in rows):.0f} "
        f"to {max(x['host1_us'] for x in rows):.0f} on 1) on this machine's CPU, and the eager time is the "
        f"host's on {len(bound)} of {len(rows)} cuts ({', '.join(x['cut'] for x in bound)}: up to "
        f"{max(x['eager'] / x['device'] for x in rows):.1f}x the device's). Transformer Engine loops over "
        "the experts in C++, not Python, so these host figures bound Transformer Engine's from above; they are not in the "
        "catalog.",
        "- **fp8's accuracy check** (expert 0 against float32): relative error "
        + ", ".join(f"{e:.3f} at K = {k:,}" for k, e in rel[:1] + rel[-3:])
        + ": the error grows with the reduction's length, as Hopper's FP8 tensor cores keep about 14 bits "
        "of the sum (DeepSeek-V3, arXiv 2412.19437, section 3.3.2); the bf16 results are within 0.2% of "
        "float32 on every GEMM. The times are unaffected.", ""]
    return "\n".join(out)


def check():
    rows, _, _ = table()
    with open(os.path.join(HERE, "grouped.md")) as f:
        assert f.read() == markdown() + "\n", "grouped.md is stale: grouped_md.py > grouped.md"
    for x in rows:  # what README.md, docs/moe.md and the catalog's source say of these runs
        assert 0.66 <= x["frac"] <= 0.75, x
        assert 1.0 <= x["model"] / x["device"] <= 1.1, x
        assert 0.85 <= x["fp8_model"] / x["fp8"] <= 1.05, x
    hb, h8 = hockney("bf16_4s_graph_ms"), hockney("fp8_te_ms")
    assert 3 < hb[0] < 6 and 8 < h8[0] < 12 and hb[2] < 0.05 and h8[2] < 0.05, (hb, h8)
    print(f"ok: {len(rows)} cuts, bf16 {min(x['frac'] for x in rows):.2f}-{max(x['frac'] for x in rows):.2f} "
          "of peak, pipegrid 1.0-1.1x the device bf16, 0.85-1.05x fp8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    elif not sys.argv[1:]:
        print(markdown())
    else:
        sys.exit(__doc__)
