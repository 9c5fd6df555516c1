"""Summarise the device runs (h200/run1, h200/run2, h100/run1, h100/run2: what run.sh wrote under
$OUT) into results.json and results.md: per-shape GEMM throughput and efficiency, Hockney fits,
attention, HBM, burst vs power-capped rate. Plain Python 3, no third-party packages.
usage: python3 make_md.py
"""
import json
import math
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = ["run1", "run2"]

# Vendor dense peaks (NVIDIA H100 and H200 datasheets; see README.md): TFLOP/s and TB/s
PEAK = {
    "h200": {"bf16": 989.0, "tf32": 494.7, "fp32": 66.9, "hbm_tbps": 4.8, "name": "NVIDIA H200"},
    "h100": {"bf16": 989.0, "tf32": 494.7, "fp32": 66.9, "hbm_tbps": 3.35, "name": "NVIDIA H100 SXM5 80GB"},
}


DEVDIRS = ["h200", "h100"]


def load(run, name):
    with open(os.path.join(HERE, run, name)) as f:
        return json.load(f)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def hockney(points, weighted=True):
    """Least squares for time = t0 + flops / r over (flops, seconds) points. weighted: relative
    residuals (minimise sum((pred - t) / t)^2), i.e. regress 1 on (1/t, f/t)."""
    s11 = s12 = s22 = b1 = b2 = 0.0
    for f, t in points:
        w = 1.0 / t if weighted else 1.0
        x1, x2, y = w * 1.0, w * f, w * t
        s11 += x1 * x1
        s12 += x1 * x2
        s22 += x2 * x2
        b1 += x1 * y
        b2 += x2 * y
    det = s11 * s22 - s12 * s12
    t0 = (b1 * s22 - b2 * s12) / det
    inv_r = (s11 * b2 - s12 * b1) / det
    r = 1.0 / inv_r
    res = [abs((t0 + f * inv_r - t) / t) for f, t in points]
    return {"t0_us": t0 * 1e6, "r_inf_tflops": r / 1e12, "n_half_gflop": r * t0 / 1e9,
            "median_abs_rel_residual": median(res), "max_abs_rel_residual": max(res), "points": len(points)}


def summarize(devdir):
    RUNS = [os.path.join(devdir, r) for r in ("run1", "run2")]
    raw = {r: load(r, "results.json") for r in RUNS}
    att = {r: load(r, "attn_torch.json") for r in RUNS}
    devname = raw[RUNS[0]]["device"]["name"]
    kind = "h200" if "H200" in devname else "h100"
    pk = PEAK[kind]

    # GEMMs: key -> list of per-run medians (ms)
    def key(g):
        return (g["group"], g["model"], g["t"], g["b"], g["gemm"], g["pass"], g["mode"], g["M"], g["N"], g["K"])

    gem = {}
    order = []
    for r in RUNS:
        for g in raw[r]["gemm"]:
            k = key(g)
            if k not in gem:
                gem[k] = {"g": g, "ms": []}
                order.append(k)
            gem[k]["ms"].append(g["ms_median"])
    rows = []
    for k in order:
        g = gem[k]["g"]
        ms = gem[k]["ms"]
        mean = sum(ms) / len(ms)
        peak = pk[g["mode"]]
        tf = g["flops"] / mean / 1e9
        rows.append(dict(group=g["group"], model=g["model"], t=g["t"], b=g["b"], gemm=g["gemm"], pass_=g["pass"],
                         mode=g["mode"], layout=g["layout"], M=g["M"], N=g["N"], K=g["K"], flops=g["flops"],
                         ms_runs=ms, ms=mean, spread=(max(ms) - min(ms)) / mean, tflops=tf, frac=tf / peak))

    tp = [x for x in rows if x["group"] == "tp"]
    sq = [x for x in rows if x["group"] == "square"]
    fits = {
        "tp_all_weighted": hockney([(x["flops"], x["ms"] / 1e3) for x in tp]),
        "tp_fwd_weighted": hockney([(x["flops"], x["ms"] / 1e3) for x in tp if x["pass_"] == "fwd"]),
        "tp_all_unweighted": hockney([(x["flops"], x["ms"] / 1e3) for x in tp], weighted=False),
        "square_weighted": hockney([(x["flops"], x["ms"] / 1e3) for x in sq]),
    }
    for f in fits.values():
        f["r_inf_over_peak"] = f["r_inf_tflops"] / pk["bf16"]

    # per layer (the 12 GEMMs of one transformer layer's fwd+bwd): flop-weighted efficiency
    layer = {}
    for x in tp:
        k = (x["model"], x["t"], x["b"])
        a = layer.setdefault(k, [0.0, 0.0])
        a[0] += x["flops"]
        a[1] += x["ms"] / 1e3
    layer_rows = [dict(model=k[0], t=k[1], b=k[2], gflop=v[0] / 1e9, ms=v[1] * 1e3,
                       tflops=v[0] / v[1] / 1e12, frac=v[0] / v[1] / 1e12 / pk["bf16"]) for k, v in layer.items()]

    # attention, unfused (kbench) and fused (PyTorch SDPA)
    un = {}
    for r in RUNS:
        for a in raw[r]["attention_unfused"]:
            un.setdefault(a["t"], []).append(a)
    fused = {}
    for r in RUNS:
        for a in att[r]["attention_fused"]:
            if "error" in a:
                continue
            fused.setdefault((a["backend"], a["t"]), []).append(a)
    hbm = {}
    for r in RUNS:
        for h in raw[r]["hbm"]:
            hbm.setdefault(h["what"], []).append(h["gbps"])
    cross = {}
    for r in RUNS:
        for c in att[r]["gemm_crosscheck"]:
            cross.setdefault((c["M"], c["N"], c["K"]), []).append(c["tflops"])

    # clocks during the runs
    clk = {}
    for r in RUNS:
        sm, pw, busy = [], [], 0
        with open(os.path.join(HERE, r, "clocks.csv")) as f:
            next(f)
            for line in f:
                p = [s.strip() for s in line.split(",")]
                if len(p) < 7 or "%" not in p[5]:
                    continue
                if int(p[5].split()[0]) >= 95:
                    sm.append(float(p[1].split()[0]))
                    pw.append(float(p[3].split()[0]))
                    busy += p[6].endswith("4")
        clk[r] = {"busy_samples": len(sm), "sm_mhz_median": median(sm), "sm_mhz_min": min(sm), "sm_mhz_max": max(sm),
                  "power_w_median": median(pw), "samples_with_sw_power_cap": busy}

    env = open(os.path.join(HERE, RUNS[0], "env.txt")).read()

    def grab(pat):
        m = re.search(pat, env)
        return m.group(1).strip() if m else "?"

    envd = {"gpu": devname, "driver": grab(r"Driver Version\s*:\s*(\S+)"), "cuda": grab(r"CUDA Version\s*:\s*(\S+)"),
            "power_limit": grab(r"Current Power Limit\s*:\s*([^\n]+)"),
            "max_sm_clock": grab(r"Max Clocks[\s\S]*?SM\s*:\s*([^\n]+)"),
            "max_mem_clock": grab(r"Max Clocks[\s\S]*?Memory\s*:\s*([^\n]+)"),
            "fb_total": grab(r"FB Memory Usage\s*\n\s*Total\s*:\s*([^\n]+)"),
            "cublas": raw[RUNS[0]]["device"]["cublas"], "torch": att[RUNS[0]]["torch"], "cudnn": att[RUNS[0]]["cudnn"],
            "sms": raw[RUNS[0]]["device"]["sms"], "l2_mb": round(raw[RUNS[0]]["device"]["l2_bytes"] / 2**20)}

    sus = {}
    cands = [os.path.join(r, "sustain.json") for r in RUNS]
    cands += [os.path.join(devdir, "sustain", f"sustain{i}.json") for i in (1, 2)]
    for c in cands:
        if os.path.exists(os.path.join(HERE, c)):
            with open(os.path.join(HERE, c)) as f:
                sus[c] = json.load(f)["windows"]
    summary = {"device_kind": kind, "sustain": sus, "env": envd, "peak": pk, "method": raw[RUNS[0]]["method"], "runs": RUNS,
               "clocks": clk, "hockney": fits, "gemm": rows, "layer_gemm_efficiency": layer_rows,
               "attention_unfused": {str(t): v for t, v in un.items()},
               "attention_fused": {f"{b}/t{t}": v for (b, t), v in fused.items()},
               "hbm_gbps": hbm, "torch_gemm_crosscheck_tflops": {f"{m}x{n}x{k}": v for (m, n, k), v in cross.items()},
               "checks": raw[RUNS[0]]["checks"]}

    # ---------------------------------------------------------------- markdown
    L = []
    w = L.append
    w("# %s (`%s/`)\n" % (devname, devdir))
    w("From `%s/run1` and `%s/run2` (two runs of `run.sh` on the same warm machine, 2026-11-27). "
      "Every time is the median of 30 CUDA-event-timed launches after 5 warm-ups; tables give the mean of the "
      "two runs' medians, and `spread` is |run1 - run2| / mean. Fractions are of the vendor dense peak: "
      "%.0f TFLOP/s bf16, %.1f tf32, %.1f fp32, %.2f TB/s HBM (NVIDIA %s datasheet).\n"
      % (devdir, devdir, pk["bf16"], pk["tf32"], pk["fp32"], pk["hbm_tbps"], kind.upper()))
    w("## Device\n")
    w("| item | value |\n|---|---|")
    for k2, v in envd.items():
        w(f"| {k2} | {v} |")
    for r in RUNS:
        c = clk[r]
        w(f"| {os.path.basename(r)}: SM clock while busy (>=95% util, nvidia-smi samples) | median {c['sm_mhz_median']:.0f} MHz "
          f"(min {c['sm_mhz_min']:.0f}, max {c['sm_mhz_max']:.0f}), power median {c['power_w_median']:.0f} W, "
          f"{c['samples_with_sw_power_cap']} of {c['busy_samples']} samples flagged SW power cap |")
    w("")
    w("## Peak: square bf16 GEMMs (cuBLAS, NT layout, fp32 accumulate)\n")
    w("| M=N=K | ms | TFLOP/s | fraction of 989 | spread |\n|---|---|---|---|---|")
    for x in sq:
        w(f"| {x['M']} | {x['ms']:.4f} | {x['tflops']:.1f} | {x['frac']:.3f} | {x['spread']:.3f} |")
    again = [x for x in rows if x["group"] == "square-again"]
    for x in again:
        w(f"| {x['M']} again, right after the fp32 GEMMs (a lower-power phase) | {x['ms']:.4f} | {x['tflops']:.1f} | "
          f"{x['frac']:.3f} | {x['spread']:.3f} |")
    for (m, n, k), v in cross.items():
        tfm = sum(v) / len(v)
        w(f"| PyTorch F.linear {m}x{n}x{k} (after attention/HBM phases) | - | {tfm:.1f} | {tfm / pk['bf16']:.3f} | - |")
    w("")
    if sus:
        w("## Burst vs power-capped rate (8192^3 bf16, back to back after 3 s idle; rate per 25 launches)\n")
        w("| run | first window TFLOP/s | after 0.5 s | after 2 s | median of windows after 2 s | last (about 8 s) |")
        w("|---|---|---|---|---|---|")
        for r, ws in sus.items():
            def at(tt):
                return next(x["tflops"] for x in ws if x["t_s"] >= tt)
            late = median([x["tflops"] for x in ws if x["t_s"] >= 2])
            w(f"| {r} | {ws[0]['tflops']:.0f} | {at(0.5):.0f} | {at(2):.0f} | {late:.0f} | {ws[-1]['tflops']:.0f} |")
        w("")
    w("## fp32 and tf32 GEMM (8192^3)\n")
    w("| mode | ms | TFLOP/s | fraction of vendor peak |\n|---|---|---|---|")
    for x in rows:
        if x["group"] == "fp32":
            w(f"| {x['mode']} | {x['ms']:.3f} | {x['tflops']:.1f} | {x['frac']:.3f} of {pk[x['mode']]} |")
    w("")
    w("## Hockney fit: time = t0 + FLOPs / r_inf (n_1/2 = r_inf x t0)\n")
    w("| points | weighting | r_inf TFLOP/s | r_inf / peak | t0 us | n_1/2 GFLOP | median abs rel residual | max |")
    w("|---|---|---|---|---|---|---|---|")
    for name, f in fits.items():
        wt = "relative" if "unweighted" not in name else "absolute"
        w(f"| {name.rsplit('_', 1)[0]} ({f['points']}) | {wt} | {f['r_inf_tflops']:.1f} | {f['r_inf_over_peak']:.3f} | "
          f"{f['t0_us']:.1f} | {f['n_half_gflop']:.1f} | {f['median_abs_rel_residual']:.3f} | "
          f"{f['max_abs_rel_residual']:.3f} |")
    w("")
    w("## Per-layer GEMM efficiency (the 12 GEMMs of one layer: 4 forward, 4 dgrad, 4 wgrad; FLOP-weighted)\n")
    w("| model | t | b | GFLOP | ms | TFLOP/s | fraction of 989 |\n|---|---|---|---|---|---|---|")
    for x in layer_rows:
        w(f"| {x['model']} | {x['t']} | {x['b']} | {x['gflop']:.0f} | {x['ms']:.3f} | {x['tflops']:.1f} | {x['frac']:.3f} |")
    w("")
    w("## Tensor-parallel per-device GEMMs (Megatron layout; forward NT, dgrad NN, wgrad TN)\n")
    w("Forward Y[M,N] = X[M,K] W^T with M = b x seq tokens; dgrad dX[M,K] = dY[M,N] W; wgrad dW[N,K] = dY^T X. "
      "Shape given as the forward's M x N x K. Cells: TFLOP/s (fraction of 989).\n")
    w("| model | t | b | gemm | M x N x K | fwd ms | fwd | dgrad | wgrad | max spread |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    by = {}
    for x in tp:
        by.setdefault((x["model"], x["t"], x["b"], x["gemm"]), {})[x["pass_"]] = x
    for (m, t, b, gname), d in by.items():
        f = d["fwd"]
        cells = " | ".join(f"{d[p]['tflops']:.0f} ({d[p]['frac']:.2f})" for p in ("fwd", "dgrad", "wgrad"))
        sp = max(d[p]["spread"] for p in d)
        w(f"| {m} | {t} | {b} | {gname} | {f['M']} x {f['N']} x {f['K']} | {f['ms']:.4f} | {cells} | {sp:.3f} |")
    w("")
    w("## Attention at GPT-3 175B per-device shapes (96/t heads of 128, seq 2048, b 1, causal, bf16)\n")
    w("Unfused (kbench): batched cuBLAS GEMM Q K^T over the full s x s, a causal scale-mask-softmax kernel "
      "(bf16 in/out, fp32 math; bytes = read + write of the s x s scores), batched GEMM P V. "
      "GEMM FLOPs counted over the full s x s (2 s^2 d per head each).\n")
    w("| t | heads | QK^T ms (TFLOP/s) | softmax ms (GB/s) | PV ms (TFLOP/s) | total ms | rel err vs float64 |")
    w("|---|---|---|---|---|---|---|")
    for t in sorted(un):
        a = un[t]
        mq = sum(x["qk_ms"] for x in a) / len(a)
        ms_ = sum(x["softmax_ms"] for x in a) / len(a)
        mp = sum(x["pv_ms"] for x in a) / len(a)
        mt = sum(x["total_ms"] for x in a) / len(a)
        w(f"| {t} | {a[0]['heads']} | {mq:.4f} ({a[0]['qk_flops'] / mq / 1e9:.0f}) | {ms_:.4f} "
          f"({a[0]['softmax_bytes'] / ms_ / 1e6:.0f}) | {mp:.4f} ({a[0]['pv_flops'] / mp / 1e9:.0f}) | {mt:.4f} | "
          f"{a[0]['rel_err']:.2g} |")
    w("")
    w("Fused (PyTorch %s scaled_dot_product_attention, one backend forced at a time; cuDNN %s). "
      "TFLOP/s count the useful causal FLOPs, 2 s^2 d per head for the forward (half the full 4 s^2 d), "
      "3.5x that for forward+backward; `fwd full` is the non-causal forward with 4 s^2 d per head.\n"
      % (att[RUNS[0]]["torch"], att[RUNS[0]]["cudnn"]))
    w("| backend | t | heads | fwd causal ms (TFLOP/s) | fwd full ms (TFLOP/s) | fwd+bwd causal ms (TFLOP/s) | rel err |")
    w("|---|---|---|---|---|---|---|")
    for (bname, t) in sorted(fused, key=lambda k: (k[0], k[1])):
        a = fused[(bname, t)]

        def mm(field):
            return sum(x[field]["ms_median"] for x in a) / len(a)

        def tt(field):
            return sum(x[field] for x in a) / len(a)

        w(f"| {bname} | {t} | {a[0]['heads']} | {mm('fwd_causal'):.4f} ({tt('fwd_causal_tflops'):.0f}) | "
          f"{mm('fwd_full'):.4f} ({tt('fwd_full_tflops'):.0f}) | {mm('fwd_bwd_causal'):.4f} "
          f"({tt('fwd_bwd_causal_tflops'):.0f}) | {a[0]['rel_err']:.2g} |")
    w("")
    w("## HBM bandwidth (4 GiB buffers)\n")
    w("| what | GB/s (mean of runs) | fraction of %.2f TB/s | runs |\n|---|---|---|---|" % pk["hbm_tbps"])
    for k2, v in hbm.items():
        m_ = sum(v) / len(v)
        note = " (read + write counted)" if "cop" in k2.lower() or "Memcpy" in k2 else " (read only)"
        w(f"| {k2}{note} | {m_:.0f} | {m_ / 1e3 / pk['hbm_tbps']:.3f} | {', '.join(f'{x:.0f}' for x in v)} |")
    w("")
    w("## Correctness checks (before timing)\n")
    w("| GEMM | mode | layout | M x N x K | rel err vs float64 | ok |\n|---|---|---|---|---|---|")
    for c in raw[RUNS[0]]["checks"]:
        w(f"| {c['what']} | {c['mode']} | {c['layout']} | {c['M']} x {c['N']} x {c['K']} | {c['rel_err']:.2g} | {c['ok']} |")
    return summary, L


def main():
    out, md = {}, []
    for d in DEVDIRS:
        summ, lines = summarize(d)
        out[d] = summ
        md.append(lines)
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    head = ["# GPU kernel measurements: H200 and H100 (issue 27 item 8)\n",
            "Generated by `make_md.py`; method, sources and caveats in README.md. Key figures "
            "(mean of two runs each; fractions of the vendor dense peak 989 TFLOP/s bf16):\n",
            "| figure | " + " | ".join(out[d]["env"]["gpu"] for d in DEVDIRS) + " |",
            "|---|" + "---|" * len(DEVDIRS)]

    def row(name, fn):
        head.append(f"| {name} | " + " | ".join(fn(out[d]) for d in DEVDIRS) + " |")

    def gem(s, M, grp="square"):
        x = next(x for x in s["gemm"] if x["group"] == grp and x["M"] == M)
        return x

    row("bf16 GEMM 8192^3, power-capped (TFLOP/s, fraction)", lambda s: f"{gem(s, 8192)['tflops']:.0f} ({gem(s, 8192)['frac']:.3f})")
    row("bf16 GEMM best square, power-capped", lambda s: "%.0f (%d^3)" % max((x["tflops"], x["M"]) for x in s["gemm"] if x["group"] == "square"))
    row("bf16 GEMM 8192^3 again, right after the fp32 GEMMs", lambda s: f"{gem(s, 8192, 'square-again')['tflops']:.0f}")
    row("bf16 GEMM 8192^3 burst: first 25 launches after 3 s idle (per sustain run)",
        lambda s: " / ".join(f"{w_[0]['tflops']:.0f}" for w_ in s["sustain"].values()))
    row("bf16 GEMM 8192^3 sustained: median of 25-launch windows 2..8 s (per sustain run)",
        lambda s: " / ".join(f"{median([x['tflops'] for x in w_ if x['t_s'] >= 2]):.0f}" for w_ in s["sustain"].values()))
    row("SM clock while busy (median MHz, of 1980 max)", lambda s: " / ".join(f"{c['sm_mhz_median']:.0f}" for c in s["clocks"].values()))
    row("Hockney, all 384 TP GEMMs: r_inf (TFLOP/s), r_inf/peak, t0 (us), n_1/2 (GFLOP)",
        lambda s: "%.0f, %.3f, %.1f, %.1f" % (s["hockney"]["tp_all_weighted"]["r_inf_tflops"], s["hockney"]["tp_all_weighted"]["r_inf_over_peak"],
                                            s["hockney"]["tp_all_weighted"]["t0_us"], s["hockney"]["tp_all_weighted"]["n_half_gflop"]))
    row("per-layer GEMM efficiency, range over models x t x b", lambda s: "%.3f .. %.3f" % (min(x["frac"] for x in s["layer_gemm_efficiency"]), max(x["frac"] for x in s["layer_gemm_efficiency"])))
    row("tf32 / fp32 GEMM 8192^3 (TFLOP/s)", lambda s: " / ".join(f"{x['tflops']:.0f}" for x in s["gemm"] if x["group"] == "fp32"))
    row("attention GPT-3 t=8 (12 heads): unfused total / cuDNN fused fwd (ms)",
        lambda s: "%.3f / %.3f" % (sum(a["total_ms"] for a in s["attention_unfused"]["8"]) / 2,
                                   sum(a["fwd_causal"]["ms_median"] for a in s["attention_fused"]["cudnn/t8"]) / 2))
    row("attention GPT-3 t=1 (96 heads): unfused total / cuDNN fused fwd (ms)",
        lambda s: "%.3f / %.3f" % (sum(a["total_ms"] for a in s["attention_unfused"]["1"]) / 2,
                                   sum(a["fwd_causal"]["ms_median"] for a in s["attention_fused"]["cudnn/t1"]) / 2))
    row("HBM GB/s: cudaMemcpy D2D (r+w) / read-only (fraction of datasheet)",
        lambda s: "%.0f / %.0f (%.2f / %.2f of %.2f TB/s)" % (
            sum(s["hbm_gbps"]["cudaMemcpy D2D"]) / 2, sum(s["hbm_gbps"]["read-only reduction"]) / 2,
            sum(s["hbm_gbps"]["cudaMemcpy D2D"]) / 2 / 1e3 / s["peak"]["hbm_tbps"],
            sum(s["hbm_gbps"]["read-only reduction"]) / 2 / 1e3 / s["peak"]["hbm_tbps"], s["peak"]["hbm_tbps"]))
    text = "\n".join(head) + "\n\n" + "\n\n".join("\n".join(L) for L in md) + "\n"
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write(text)
    print("\n".join(head))


if __name__ == "__main__":
    main()
