#!/usr/bin/env python3
"""moe.md from the stored H200 runs of moe_experts_torch.py and activation_torch.py (h200/moe/).

    python3 experiments/kernels/moe_md.py          # print moe.md
    python3 experiments/kernels/moe_md.py --check  # moe.md is the stored runs' table, and says what README.md says

Rates are set against the H200's datasheet figures as topologies/devices.yaml holds them (4.8 TB/s,
989 TFLOP/s bf16 dense) and beside the catalog's fractions for the kernel class pipegrid costs each
piece in. Bytes and FLOPs per piece are pipegrid's counts (core/block_kernels.cc), per element of one
GLU half (rows x FFN; GPT-OSS's FFN equals its hidden size, 2880).
"""
import json
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "h200", "moe")
H = FFN = 2880
# pipegrid's bytes per element (eb = 2) for the expert path's memory-bound pieces, forward and
# backward (core/block_kernels.cc: clamp_kernels, expert_bias_kernels, the fused activation).
PIECE_BYTES = {"clamp + cat": (16, 30), "fc2 bias (_apply_bias)": (28, 40)}
ACTIVATION_BYTES = (6, 9)
# The same pieces by kernel class: (bytes per element forward + backward, kernels as a function of
# the local experts), as core/block_kernels.cc splits them (eb = 2).
PIECE_KERNELS = {
    "clamp + cat": {"strided": (8 + 19, lambda local: 2 + 5), "elementwise": (8 + 11, lambda local: 1 + 2)},
    "fc2 bias (_apply_bias)": {"strided": (14 + 16, lambda local: 4 * local),
                               "elementwise": (14 + 24, lambda local: 2 + 3 * local + 2)},
}
# PyTorch eager's element-wise paths (aten/src/ATen/native/cuda/Loops.cuh): vectorised where every
# operand is contiguous and of one dtype; otherwise the unrolled (contiguous, casting) or the strided
# kernel (elementwise_kernel with an offset calculator).
NON_VECTORISED = ("clamp of a half (strided view)", "compare of a half (strided, bool out)",
                  "b * p (broadcast, fp32 out)", "t + bp (bf16 + fp32, fp32 out)")
VECTORISED = ("add, contiguous bf16", "clamp of a contiguous half", "cat of two halves", "cast fp32 -> bf16")


def catalog(device="h200"):
    """The figures of topologies/devices.yaml's entry this script uses (the H200's by default)."""
    with open(os.path.join(HERE, "..", "..", "topologies", "devices.yaml")) as f:
        d = yaml.safe_load(f)[device]
    m = d["memory_efficiency"]
    return {"bandwidth": float(d["memory_bandwidth"].rstrip("GBps")) * 1e9,
            "bf16": float(d["peak"]["bf16"].rstrip("TFLOPS")) * 1e12,
            "gemm": d["compute_efficiency"]["bf16"]["gemm"],
            "attention": d["compute_efficiency"]["bf16"]["attention"],
            "elementwise": m["elementwise"], "strided": m.get("strided", m["elementwise"]),
            "compiled": m.get("compiled", m["elementwise"]),
            "startup": float(d["kernel_startup"].rstrip("us")) * 1e-6}


def median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def fitted(run=""):
    """The strided and compiled classes' fractions of the bandwidth that make pipegrid's figures for
    the measured pieces equal the measurement (the element-wise kernels at the catalog's figure,
    every kernel one start-up): the strided one from GPT-OSS's eager clamp and fc2 bias (forward +
    backward, every configuration), the compiled one from the weighted activations as dropless
    training compiles them (`auto`, every shape). Returns ({class: median}, {class: [each]})."""
    c = catalog()
    experts, act = load(run)
    bw, su = c["bandwidth"], c["startup"]
    each = {"strided": [], "compiled": []}
    for cfg in experts["configs"].values():
        e = cfg["rows"] * FFN
        for piece, split in PIECE_KERNELS.items():
            measured = cfg["pieces"][piece]["forward_backward_ms"] * 1e-3
            (sb, sk), (eb_, ek) = split["strided"], split["elementwise"]
            rest = eb_ * e / (bw * c["elementwise"]) + (ek(cfg["local_experts"]) + sk(cfg["local_experts"])) * su
            each["strided"].append(sb * e / (bw * (measured - rest)))
    auto = {}
    for r in act["rows"]:
        if r.get("mode") == "auto" and "ms" in r:
            auto.setdefault((r["rows"], r["ffn"], r["kernel"]), []).append(r["ms"] * 1e-3)
    for (rows, ffn, _), ms in sorted(auto.items()):
        if len(ms) == 2:
            each["compiled"].append(sum(ACTIVATION_BYTES) * rows * ffn / (bw * (sum(ms) - 2 * su)))
    return {k: median(v) for k, v in each.items()}, each


def load(run=""):
    """The stored runs: the first (h200/moe/) or the repeat on another machine (run="run2")."""
    experts = json.load(open(os.path.join(RUNS, run, "moe_experts.json")))
    activation = json.load(open(os.path.join(RUNS, run, "activation.json")))
    return experts, activation


def spread():
    """|run1 - run2| / mean over every timed figure of both scripts: (median, max)."""
    (e1, a1), (e2, a2) = load(), load("run2")
    d = [abs(x - y) / ((x + y) / 2)
         for n, c in e1["configs"].items() for k, v in c["pieces"].items() if "error" not in v
         for x, y in [(v[f], e2["configs"][n]["pieces"][k][f]) for f in ("forward_ms", "forward_backward_ms")]]
    d += [abs(x["ms"] - y["ms"]) / ((x["ms"] + y["ms"]) / 2) for x, y in zip(a1["rows"], a2["rows"]) if "ms" in x]
    d.sort()
    return d[len(d) // 2], d[-1]


def markdown():
    c = catalog()
    experts, act = load()
    bw, peak = c["bandwidth"], c["bf16"]
    out = ["# MoE expert kernels on an H200 (GPT-OSS's unfused path, the experts' activations, attention)", "",
           "Generated by `moe_md.py` from h200/moe/ (`moe_experts_torch.py`, `activation_torch.py`; method in "
           "their docstrings and README.md).", "",
           f"{experts['device']}, PyTorch {experts['torch']} (CUDA {experts['cuda']}); medians of "
           f"{experts['reps']} CUDA-event-timed calls. Fractions: of the datasheet's {bw / 1e12:.1f} TB/s and "
           f"{peak / 1e12:.0f} TFLOP/s (bf16 dense). The catalog costs GEMMs at {c['gemm']:.2f} of peak, "
           f"fused attention at {c['attention']:.2f}, element-wise kernels at {c['elementwise']:.2f} of the "
           f"bandwidth, PyTorch eager's off its vectorised path (`strided`) at {c['strided']:.2f}, "
           f"torch.compile's weighted activations (`compiled`) at {c['compiled']:.2f}.", "",
           "## GPT-OSS-120B's experts as TEGroupedMLP runs them unfused", "",
           "Per device and micro-batch, one MoE layer, balanced routing. GEMMs: one cuBLAS call per local "
           "expert into one buffer; rates over 2 x rows x 2880 x 5760 (fc1) and x 2880 (fc2) per pass, "
           "backward twice that. Memory-bound pieces: GB/s over pipegrid's byte counts. Host: the time "
           "to issue the forward, no synchronisation inside (eager PyTorch, not Transformer Engine).", "",
           "| configuration | piece | forward (ms) | fwd + bwd (ms) | host, fwd (ms) | rate, fwd | rate, bwd |",
           "|---|---|---|---|---|---|---|"]
    for name, cfg in experts["configs"].items():
        rows = cfg["rows"]
        label = f"{name}: {rows} rows, {cfg['local_experts']} x {cfg['rows_per_expert']}"
        for piece, m in cfg["pieces"].items():
            if "error" in m:
                continue
            f, fb, host = m["forward_ms"], m["forward_backward_ms"], m["host_forward_ms"]
            b = fb - f
            rate_f = rate_b = ""
            gemm = ("fc1" in piece or "fc2" in piece) and ("gemm" in piece or "grouped_mm" in piece)
            if gemm:
                fl = 2 * rows * H * (2 * FFN if "fc1" in piece else FFN)
                rate_f = f"{fl / f / 1e9:.0f} TFLOP/s ({fl / f / 1e-3 / peak:.2f})"
                rate_b = f"{2 * fl / b / 1e9:.0f} TFLOP/s ({2 * fl / b / 1e-3 / peak:.2f})"
            elif piece in PIECE_BYTES or piece.startswith("weighted quick-geglu"):
                pf, pb = ACTIVATION_BYTES if piece.startswith("weighted") else PIECE_BYTES[piece]
                e = rows * FFN
                rate_f = f"{pf * e / f / 1e6:.0f} GB/s ({pf * e / f * 1e3 / bw:.2f})"
                rate_b = f"{pb * e / b / 1e6:.0f} GB/s ({pb * e / b * 1e3 / bw:.2f})"
            mark = " (h)" if host > 0.8 * f else ""
            out.append(f"| {label} | {piece} | {f:.3f}{mark} | {fb:.3f} | {host:.3f} | {rate_f} | {rate_b} |")
            label = ""
    med, mx = spread()
    out += ["", "(h): the host took over 0.8 of the forward's time to issue it: eager PyTorch's launches, not "
            "the GPU, may bound that figure. The repeat on another machine of the same kind (h200/moe/run2/, not "
            "tabled) gives a median run-to-run spread of "
            f"{med:.1%} over every figure of both scripts, at most {mx:.0%}: the host-bound micro-batch-1 cut at "
            "EP 8 ran up to 1.7x slower there, its host issuing the same forward in 4.0 ms against 1.8.", "",
            "pipegrid's figures for the same pieces, forward + backward (the catalog's H200 as above, 5 us "
            "start-up per call; GEMMs one start-up per wave of 4 experts; the clamp's and fc2 bias's kernels "
            "split by class as core/block_kernels.cc splits them), against the 4-stream measurement; "
            "the path without fc1's bias add, which Transformer Engine runs in the GEMM:", "",
            "| configuration | GEMMs | clamp + cat | activation | fc2 bias | path | path measured | measured / pipegrid "
            "| the same, activation as `auto` |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, cfg in experts["configs"].items():
        p, m = modelled(cfg, c), cfg["pieces"]
        path = m["whole path, 4 streams"]["forward_backward_ms"] - m["fc1 bias add"]["forward_backward_ms"]
        auto = [r["ms"] for r in act["rows"] if r.get("mode") == "auto" and r["kernel"] == "weighted quick-geglu"
                and r["rows"] == cfg["rows"] and r["ffn"] == FFN]
        act_ms = [v for k, v in m.items() if k.startswith("weighted quick-geglu")][0]["forward_backward_ms"]
        with_auto = f"{(path - act_ms + sum(auto)) / p['path']:.2f}" if len(auto) == 2 else "not measured"
        out.append(f"| {name} | {p['gemm']:.3f} | {p['clamp']:.3f} | {p['act']:.3f} | {p['bias']:.3f} | "
                   f"{p['path']:.3f} | {path:.3f} | {path / p['path']:.2f} | {with_auto} |")
    fit, each = fitted()
    fit2, _ = fitted("run2")
    out += ["", "The weighted quick-GEGLU there ran under `torch.compile(dynamic=True)` (every dimension "
            "symbolic); the activations' table below has it as dropless training compiles it. The `strided` "
            "and `compiled` figures are fitted on these runs (`fitted()`: the fraction that makes pipegrid's "
            "figure for each measured piece equal the measurement, with the piece's vectorised kernels at the "
            f"element-wise figure): strided {fit['strided']:.2f}, the median over the clamp and fc2 bias of the "
            f"four cuts ({min(each['strided']):.2f} to {max(each['strided']):.2f}); compiled "
            f"{fit['compiled']:.2f}, the median over the activations' `auto` rows below "
            f"({min(each['compiled']):.2f} to {max(each['compiled']):.2f}). The repeat gives "
            f"{fit2['strided']:.2f} and {fit2['compiled']:.2f}. So the table above is the fit's own data for "
            "those pieces, not a check of them; what checks them is experiments/moe's check rows.", "",
            "## The experts' activations and PyTorch eager's element-wise paths", "",
            "Achieved GB/s over the bytes each kernel must move (activations: 6 bytes per element forward, "
            "10 backward, with the weights' gradient's sum over the features). Modes: eager; `static`: "
            "torch.compile at one shape; `auto`: torch.compile after calls at two other row counts, as "
            "dropless training's varying rows make it recompile with the rows symbolic (Megatron-Core's "
            "`jit_fuser` is torch.compile); `dynamic`: dynamic=True. Fraction: of the datasheet's bandwidth.", "",
            "| rows x FFN | kernel | mode | pass | ms | GB/s | fraction |", "|---|---|---|---|---|---|---|"]
    for r in act["rows"]:
        if "error" in r or "ms" not in r:
            continue
        out.append(f"| {r['rows']} x {r['ffn']} | {r['kernel']} | {r['mode']} | {r['pass_']} | {r['ms']:.3f} | "
                   f"{r['gbps']:.0f} | {r['gbps'] * 1e9 / bw:.2f} |")
    nv, v, auto_b, auto_f = summary(act, bw)
    out += ["", f"PyTorch eager's non-vectorised paths (strided, broadcast, casting): {min(nv):.2f} to "
            f"{max(nv):.2f} of the bandwidth; its vectorised path: {min(v):.2f} to {max(v):.2f}. The experts' "
            f"compiled weighted activations as dropless training runs them (`auto`): forward {min(auto_f):.2f} to "
            f"{max(auto_f):.2f}, backward {min(auto_b):.2f} to {max(auto_b):.2f}.", "",
            "## Fused attention at GPT-OSS's shapes (and heads of 128 for the same FLOPs)", "",
            "Causal, bf16, the key-value heads repeated to the query heads; TFLOP/s over the useful FLOPs "
            "(half of 4 s^2 d per head forward, 3.5x that forward + backward).", "",
            "| batch x sequence | heads x dim | backend | forward (ms) | fwd + bwd (ms) | TFLOP/s fwd | TFLOP/s fwd + bwd |",
            "|---|---|---|---|---|---|---|"]
    for a in experts["attention"]:
        if "error" in a:
            continue
        out.append(f"| {a['batch']} x {a['sequence']} | {a['heads']} x {a['head_dim']} | {a['backend']} | "
                   f"{a['forward_ms']:.3f} | {a['forward_backward_ms']:.3f} | {a['forward_tflops']:.0f} "
                   f"({a['forward_tflops'] * 1e12 / peak:.2f}) | {a['forward_backward_tflops']:.0f} "
                   f"({a['forward_backward_tflops'] * 1e12 / peak:.2f}) |")
    return "\n".join(out) + "\n"


def modelled(cfg, c):
    """pipegrid's forward + backward milliseconds for the expert path's pieces (core/block_kernels.cc
    and core/device.cc's roofline: start-ups plus the larger of FLOPs over the rate and bytes over
    the bandwidth), recomputed here from the catalog's figures."""
    rows, local, startup = cfg["rows"], cfg["local_experts"], 5e-3
    waves = -(-local // 4)
    gemm = 3 * 2 * rows * H * 3 * FFN / (c["bf16"] * c["gemm"]) * 1e3 + 2 * 3 * waves * startup
    mem = lambda b, cls="elementwise": b * rows * FFN / (c["bandwidth"] * c[cls]) * 1e3  # noqa: E731
    piece = lambda k: sum(mem(b, cls) + n(local) * startup for cls, (b, n) in k.items())  # noqa: E731
    p = {"gemm": gemm, "clamp": piece(PIECE_KERNELS["clamp + cat"]),
         "act": mem(sum(ACTIVATION_BYTES), "compiled") + 2 * startup,
         "bias": piece(PIECE_KERNELS["fc2 bias (_apply_bias)"])}
    p["path"] = sum(p.values())
    return p


def summary(act, bw):
    """Fractions of the bandwidth: the non-vectorised and vectorised eager kernels, the compiled
    activations' backward and forward as dropless training runs them."""
    frac = lambda r: r["gbps"] * 1e9 / bw  # noqa: E731
    rows = [r for r in act["rows"] if "gbps" in r]
    nv = [frac(r) for r in rows if r["kernel"] in NON_VECTORISED]
    v = [frac(r) for r in rows if r["kernel"] in VECTORISED]
    auto = [r for r in rows if r["mode"] == "auto"]
    return (nv, v, [frac(r) for r in auto if r["pass_"] == "backward"],
            [frac(r) for r in auto if r["pass_"] == "forward"])


def check():
    """moe.md is the stored runs' table; the runs' checks passed; and what README.md and
    experiments/moe/README.md say of them holds: the non-vectorised eager kernels below 0.6 of the
    bandwidth, the vectorised ones above 0.65, the compiled activations' backward below 0.4; and the
    catalog's H200 strided and compiled figures are fitted()'s, and the H100's strided one the H200's
    element rate over the H100's bandwidth."""
    with open(os.path.join(HERE, "moe.md")) as f:
        if f.read() != markdown():
            sys.exit("moe.md differs from moe_md.py's output: regenerate it")
    for run in ("", "run2"):  # both runs say it
        experts, act = load(run)
        assert all(c["checks_ok"] for c in experts["configs"].values()), "a configuration failed its check"
        nv, v, auto_b, _ = summary(act, catalog()["bandwidth"])
        assert max(nv) < 0.6 and min(v) > 0.65 and max(auto_b) < 0.4, (run, nv, v, auto_b)
    fit, _ = fitted()
    c = catalog()
    for cls in ("strided", "compiled"):  # the catalog's H200 figures are this fit's, to two places
        assert round(fit[cls], 2) == c[cls], f"topologies/devices.yaml's h200 {cls}: {c[cls]}, the fit {fit[cls]:.3f}"
    # The H100's strided figure: the H200's element rate (same SMs and clocks) over the H100's bandwidth.
    h100 = catalog("h100")
    derived = round(c["strided"] * c["bandwidth"] / h100["bandwidth"], 2)
    assert h100["strided"] == derived, (h100["strided"], derived)
    print(f"ok: non-vectorised {min(nv):.2f}-{max(nv):.2f}, vectorised {min(v):.2f}-{max(v):.2f}, "
          f"compiled backward {min(auto_b):.2f}-{max(auto_b):.2f} of the bandwidth")


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    elif len(sys.argv) == 1:
        print(markdown(), end="")
    else:
        sys.exit(__doc__)
