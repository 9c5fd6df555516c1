#!/usr/bin/env python3
"""Megatron-LM's published multi-GPU runs (rows.yaml) replayed in pipegrid with 3D parallelism.

Each row becomes an experiment (GPT of the row's shape, DGX A100 nodes with a rail-optimised
InfiniBand fabric, the megatron partitioner, t, p and d = GPUs / (t p) as printed; Table 1's
micro-batch size and interleaving from the authors' run scripts; Table 5's 22B rows one micro-batch
of 4, the others micro-batch 1, 1F1B: rows.yaml); pipegrid's iteration time is converted to the row's metric and compared. Table 4's
per-layer rows are two probes each (the 22B shape with 4 and with 2 layers; the difference, halved). Rows on more
than --max-gpus GPUs are listed as not simulated (their task graphs take minutes each on a 2-core
machine). Writes results.md.

    experiments/megatron/run.py [--pipegrid build/pipegrid] [--max-gpus 512] [-j 2]
"""
import argparse
import concurrent.futures
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEQ, VOCAB = 2048, 51200

# Table 4's 22B model (Table 3): its rows carry these fields too.
T4_SHAPE = {"hidden": 6144, "heads": 64, "t": 8, "p": 1, "gpus": 8, "batch": 4}


def rows():
    data = yaml.safe_load(open(os.path.join(HERE, "rows.yaml")))
    out = []
    for table, spec in data.items():
        for i, values in enumerate(spec["rows"]):
            r = dict(zip(spec["columns"], values))
            if table == "korthikanti2022_table4":
                r = dict(T4_SHAPE, **r)
            r["table"] = table
            r["source"] = spec["source"]
            # Table 4: one configuration is two rows (forward, backward); split by configuration.
            position = i // 2 if table == "korthikanti2022_table4" else i
            r["set"] = "calibration" if position % 2 == 0 else "check"
            r.setdefault("recompute", "full")
            r.setdefault("sequence_parallel", False)
            out.append(r)
    return out


def flops_per_iteration(r):
    # Narayanan et al., section 5.1: 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)), recomputation included.
    B, l, h = r["batch"], r["layers"], r["hidden"]
    return 96 * B * SEQ * l * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * l * h))


def what_if_gpu(gemm, fit=None):
    """The A100 with its fp16/bf16 GEMM and attention efficiency set to `gemm`, or with a
    calibration.yaml's A100 figures (`fit`, a dict: efficiencies and start-up); None: the catalog's."""
    if fit:
        eff = fit["compute_efficiency"]["a100"]
        per = {x: dict(eff[x], attention=eff[x]["gemm"], recurrent=eff[x]["gemm"]) for x in eff}
        per["bf16"] = per["fp16"]
        return {"model": "a100", "compute_efficiency": per,
                "kernel_startup": f"{fit['kernel_startup_us']['a100']}us"}
    if gemm is None:
        return "a100"
    return {"model": "a100", "compute_efficiency": {x: {"gemm": gemm, "attention": gemm} for x in ("fp16", "bf16")}}


def micro_batch(r):
    """Per-replica micro-batch size: the row's `mbs` (Table 1, from the authors' run scripts; Table 5,
    rows.yaml's reading), else 1. It must divide the batch per replica."""
    b, d = r.get("mbs", 1), r["gpus"] // (r["t"] * r["p"])
    if r["batch"] % (d * b) != 0:
        raise ValueError(f"{r['id']}: micro-batch {b} x d {d} does not divide the batch {r['batch']}")
    return b


def experiment(r, gpu="a100"):
    """The row as a pipegrid experiment; `gpu` a catalog name or a device with overrides. The
    data-parallel gradients are all-reduced as NCCL does across DGX nodes: one ring per NIC
    (`multi-ring`); the element-wise kernels fused as Megatron-LM fuses them by default
    (`kernel_fusion: megatron`: scale-mask-softmax, bias-dropout-add); Table 1's runs without the
    tensor-parallel collective beside the weight-gradient GEMM (rows.yaml)."""
    t, p, gpus = r["t"], r["p"], r["gpus"]
    d = gpus // (t * p)
    b, v = micro_batch(r), r.get("v", 1)
    strategy = {"partitioner": "megatron", "schedule": "interleaved-1f1b" if v > 1 else "1f1b", "stages": p,
                "replicas": d, "allreduce": "multi-ring", "tensor_parallel": t,
                "sequence_parallel": bool(r["sequence_parallel"]), "micro_batch_size": b,
                "micro_batches": r["batch"] // (d * b)}
    if v > 1:
        strategy["chunks"] = v
    if r.get("table", "").startswith("narayanan2021") and t > 1:
        strategy["tp_wgrad_overlap"] = False  # rows.yaml: the code of the authors' scripts predates it
    return {
        "name": r["id"],
        "workload": {"model": "gpt", "layers": r["layers"], "hidden": r["hidden"], "heads": r["heads"],
                     "sequence": SEQ, "vocabulary": VOCAB, "precision": "amp",
                     "kernel_fusion": "megatron"},
        "cluster": {"kind": "dgx", "nodes": gpus // 8,
                    "gpu": gpu,
                    "fabric": "rail" if gpus > 8 else "switch"},
        "strategy": strategy,
        "memory": dict({"optimizer": "mixed-adam", "recompute": r["recompute"]},
                       **({"grad_accumulation": grad_accumulation(r.get("table", ""))} if GRAD_ACCUMULATION else {})),
    }


# What-if (--grad-accumulation, or MEGATRON_GRAD_ACCUMULATION=1 for the scripts that import this one:
# experiments/validation/calibrate.py): the weight gradients accumulated as the rows' code does it.
GRAD_ACCUMULATION = os.environ.get("MEGATRON_GRAD_ACCUMULATION") == "1"


def grad_accumulation(table):
    """How the rows' code adds each micro-batch's weight gradients to the step's: Tables 1 and 2's
    Megatron-LM of 2021 (commit 6985e58938, --fp16 without --use-contiguous-buffers-in-ddp) leaves it
    to PyTorch's AccumulateGrad (`unfused`: from the second micro-batch); Tables 4 and 5's code of 2022
    (commit 02bb1f5c86; examples/pretrain_gpt3_175B.sh's --fp16, so no fp32 accumulation and hence no
    gradient-accumulation fusion, which needs it until 2022-09-27) adds every micro-batch's into local
    DDP's contiguous main_grad buffer by a hook (`main-grad`). Megatron-Core fuses it (the default)."""
    return "unfused" if table.startswith("narayanan2021") else "main-grad"


def layer_probe(r, layers, gpu="a100"):
    """Table 4's probe: the 22B model's shape with `layers` layers, the batch of 4 in one micro-batch
    (experiment() with d = 1 and micro-batch 1 gives 4 micro-batches of 1; here one of 4)."""
    e = experiment(dict(T4_SHAPE, id=f"{r['id']}-{layers}", layers=layers, recompute=r["recompute"],
                        sequence_parallel=r["sequence_parallel"], table=r.get("table", "")), gpu)
    e["strategy"]["micro_batch_size"] = T4_SHAPE["batch"]
    e["strategy"]["micro_batches"] = 1
    return e


def layer_time(pipegrid, r, gpu="a100"):
    """Seconds of one layer's pass (r["pass"]) on gpu0: (probe(4) - probe(2)) / 2."""
    spans = {}
    start = time.time()
    for layers in (2, 4):
        with tempfile.TemporaryDirectory() as tmp:
            path, tasks = os.path.join(tmp, "probe.yaml"), os.path.join(tmp, "tasks.csv")
            with open(path, "w") as f:
                yaml.safe_dump(layer_probe(r, layers, gpu), f)
            p = subprocess.run([pipegrid, "run", path, "--tasks", tasks], capture_output=True, text=True)
            if p.returncode != 0:
                return {"error": (p.stderr or p.stdout).strip().splitlines()[-1], "wall": time.time() - start}
            with open(tasks) as f:
                mine = [x for x in csv.DictReader(f) if x["device"] == "gpu0"]
        fwd = [float(x["end_s"]) for x in mine if x["kind"] == "forward"]
        bwd = [(float(x["start_s"]), float(x["end_s"])) for x in mine if x["kind"] == "backward"]
        spans[layers] = max(fwd) if r["pass"] == "forward" else max(e for _, e in bwd) - min(s for s, _ in bwd)
    return {"time": (spans[4] - spans[2]) / 2, "feasible": True, "breakdown": {}, "wall": time.time() - start}


def folded_search(pipegrid, exp, batch, t, p, micro_batch, recompute, chunks, mine, why=""):
    """The experiment `exp` replayed in SimGrid TP-folded (`pipegrid search --tp-folded`: every
    replica and pipeline rank, each TP group as its rank 0; equal to the whole graph where a TP group
    fills its node, t = 8 on DGX nodes: docs/3d-search.md), the search restricted to t, p, the
    micro-batch, recomputation and schedule (chunks > 1: interleaved). Its filters leave sequence
    parallelism and the distributed optimizer free: its best 4 are replayed and the first for which
    mine(candidate) holds is taken."""
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, exp["name"] + ".yaml")
        with open(path, "w") as f:
            yaml.safe_dump(exp, f)
        cmd = [pipegrid, "search", path, "--global-batch", str(batch), "--tensor-parallel", str(t),
               "--pipeline", str(p), "--micro-batch", str(micro_batch), "--recompute", recompute,
               "--top", "4", "--tp-folded", "--json"]
        cmd += ["--schedules", "interleaved-1f1b", "--chunks", str(chunks)] if chunks > 1 else ["--schedules", "1f1b"]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": why + "; TP-folded replay failed: " + (run.stderr or run.stdout).strip().splitlines()[-1],
                "wall": time.time() - start}
    found = [c for c in json.loads(run.stdout).get("simgrid_ranking", [])
             if c["t"] == t and c["p"] == p and (c.get("chunks") or 1) == chunks and mine(c)]
    if not found or t != 8:
        return {"error": why + "; no TP-folded replay of this configuration (or t below the node size)",
                "wall": time.time() - start}
    c = found[0]
    # The fold puts the TP collectives inside the passes: the exposed TP time is the estimate's.
    breakdown = dict(c.get("simulated_breakdown", {}))
    breakdown["tensor_parallel_s"] = c.get("analytic_breakdown", {}).get("tensor_parallel_s", 0)
    return {"time": c["simulated_iteration_time_s"], "feasible": True,  # the search ranks only what fits
            "breakdown": breakdown, "wall": time.time() - start, "folded": True}


def replay_folded(pipegrid, r, gemm=None, why="", gpu=None):
    """A row whose whole graph is above pipegrid's task limit, replayed TP-folded (folded_search)
    as the row runs: its sequence parallelism, no distributed optimizer (2104.04473 predates it).
    gpu: a device spec (default the catalog's A100, or the what-if GEMM efficiency)."""
    return folded_search(pipegrid, experiment(r, gpu or what_if_gpu(gemm)), r["batch"], r["t"], r["p"],
                         micro_batch(r), r["recompute"], r.get("v", 1),
                         lambda c: c["sequence_parallel"] == bool(r["sequence_parallel"])
                         and not c["distributed_optimizer"], why)


def run_whole(pipegrid, exp, fold):
    """`pipegrid run --json` of the experiment `exp` as a whole graph: its time, feasibility, breakdown
    and wall time; above pipegrid's task limit, fold(why) instead (a TP-folded replay)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, exp["name"] + ".yaml")
        with open(path, "w") as f:
            yaml.safe_dump(exp, f)
        start = time.time()
        p = subprocess.run([pipegrid, "run", path, "--json"], capture_output=True, text=True)
        wall = time.time() - start
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()[-1]
        if "too large to simulate" in err:
            return fold("not replayed whole: " + err.split(": ", 2)[-1])
        return {"error": err, "wall": wall}
    j = json.loads(p.stdout)
    return {"time": j["iteration_time_s"], "feasible": j["feasible"], "breakdown": j.get("breakdown", {}),
            "wall": wall}


def simulate(pipegrid, r, gemm=None, fit=None):
    gpu = what_if_gpu(gemm, fit)
    if r["table"] == "korthikanti2022_table4":
        return layer_time(pipegrid, r, gpu)
    return run_whole(pipegrid, experiment(r, gpu), lambda why: replay_folded(pipegrid, r, why=why, gpu=gpu))


def deep_pipeline_summary(all_rows, done):
    """Issue 56's measure: the rows with p >= 8 (both sets), their median |error| and their signs, with
    the sign read as pipegrid fast (+ in TFLOP/s, - in time) or slow."""
    deep = [r for r in all_rows if r["p"] >= 8 and r["id"] in done]
    if not deep:
        return []
    fast = sum(1 for r in deep if (done[r["id"]][0] > 0) == ("tflops_per_gpu" in r))
    by_table = {}
    for r in deep:
        label = r["source"].split("arXiv ")[1].split(")")[0] + " Table " + r["table"].split("_table")[1]
        by_table.setdefault(label, []).append(abs(done[r["id"]][0]))
    per = "; ".join(f"{k}: {len(v)}, median {100 * statistics.median(v):.1f}%" for k, v in by_table.items())
    return [f"- rows with p >= 8 (both sets): {len(deep)}, median |error| "
            f"{100 * statistics.median(abs(done[r['id']][0]) for r in deep):.1f}%, pipegrid fast on {fast} "
            f"and slow on {len(deep) - fast} ({per})"]


def scaling_groups(all_rows, done):
    """The replayed rows of one table, model and global batch on several GPU counts (Table 2: strong
    scaling), each group by GPU count."""
    groups = {}
    for r in all_rows:
        if "tflops_per_gpu" in r and r["id"] in done:
            groups.setdefault((r["table"], r["hidden"], r["layers"], r["batch"]), []).append(r)
    return [sorted(rs, key=lambda r: r["gpus"]) for _, rs in sorted(groups.items())
            if len({r["gpus"] for r in rs}) > 1]


def strong_scaling_table(all_rows, done):
    """scaling_groups' per-GPU rate at each count over the rate at the fewest, published and pipegrid's."""
    lines = []
    for rs in scaling_groups(all_rows, done):
        base, mine = rs[0]["tflops_per_gpu"], done[rs[0]["id"]][1]
        for r in rs[1:]:
            pub, ours = r["tflops_per_gpu"] / base, done[r["id"]][1] / mine
            lines.append(f"| {rs[0]['id']} | {r['id']} | {r['gpus']} / {rs[0]['gpus']} | {pub:.3f} | {ours:.3f} | "
                         f"{100 * (ours / pub - 1):+.1f}% |")
    if not lines:
        return []
    return ["", "Strong scaling at a fixed global batch (rows of one table, model and batch on several GPU counts): "
            "TFLOP/s per GPU at N GPUs over that at the fewest, published and pipegrid's.", "",
            "| fewest GPUs | row | GPUs | published | pipegrid | pipegrid / published - 1 |",
            "|---|---|---|---|---|---|"] + lines


def strong_scaling_figure(plt, all_rows, done, stem):
    """scaling_groups as a figure: TFLOP/s per GPU against GPUs, published and pipegrid's, one colour per
    model (stem.png and stem.svg)."""
    groups = scaling_groups(all_rows, done)
    if not groups:
        return
    fig, ax = plt.subplots(figsize=(7.0, 5.2))
    for rs in groups:
        size, t, p, batch = (rs[0][k] for k in ("parameters_billion", "t", "p", "batch"))
        gpus = [r["gpus"] for r in rs]
        line, = ax.plot(gpus, [r["tflops_per_gpu"] for r in rs], "o-",
                        label=f"GPT {size:g}B (t {t}, p {p}, batch {batch}): published")
        ax.plot(gpus, [done[r["id"]][1] for r in rs], "s--", color=line.get_color(), markerfacecolor="none",
                label=f"GPT {size:g}B: pipegrid (1F1B, micro-batch 1)")
    ax.set_xscale("log", base=2)
    ticks = sorted({r["gpus"] for rs in groups for r in rs})
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{g:,}" for g in ticks])
    ax.minorticks_off()
    ax.set_xlabel("A100 GPUs (global batch fixed)")
    ax.set_ylabel("achieved TFLOP/s per GPU")
    ax.set_title("Strong scaling: arXiv 2104.04473, Table 2 (PTD-P rows)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{stem}.{ext}", dpi=130, metadata={"Date": None} if ext == "svg" else None)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipegrid", default=os.environ.get("PIPEGRID", os.path.join(ROOT, "build", "pipegrid")))
    ap.add_argument("--max-gpus", type=int, default=512)
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--gemm-efficiency", type=float, metavar="X",
                    help="what-if: the A100's fp16/bf16 GEMM and attention efficiency set to X instead of the "
                         "catalog's (a diagnostic, not a fit; the table says so)")
    ap.add_argument("--grad-accumulation", action="store_true",
                    help="what-if: the weight gradients accumulated as each row's code does it (grad_accumulation(); "
                         "the catalog's rows leave it fused)")
    ap.add_argument("--with-fit", metavar="FILE",
                    help="what-if: the A100's efficiencies and start-up from a calibration.yaml (calibrate.py --out)")
    a = ap.parse_args()
    global GRAD_ACCUMULATION
    GRAD_ACCUMULATION = GRAD_ACCUMULATION or a.grad_accumulation
    fit = yaml.safe_load(open(a.with_fit)) if a.with_fit else None
    sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
    import pgx  # noqa: E402
    # The figure only for the catalog's run of every row (first: may re-run this script under another python).
    catalog_run = not (a.gemm_efficiency or fit or GRAD_ACCUMULATION) and a.max_gpus >= max(r["gpus"] for r in rows())
    plt = pgx.matplotlib_pyplot() if catalog_run else None
    pgx.check_catalog(a.pipegrid, ("a100",))  # the catalog's A100 is what this run reports
    all_rows = rows()
    todo = [r for r in all_rows if r["gpus"] <= a.max_gpus]
    with concurrent.futures.ThreadPoolExecutor(a.j) as ex:
        results = dict(zip([r["id"] for r in todo],
                           ex.map(lambda r: simulate(a.pipegrid, r, a.gemm_efficiency, fit), todo)))
    lines = ["# Megatron-LM's published runs, replayed (generated by run.py)", "",
             f"Command: `experiments/megatron/run.py --max-gpus {a.max_gpus}"
             + (f" --gemm-efficiency {a.gemm_efficiency}`. WHAT-IF: the A100's fp16/bf16 GEMM and attention "
                f"efficiency set to {a.gemm_efficiency} (not the catalog's)." if a.gemm_efficiency else
                "`. Catalog: topologies/devices.yaml's a100 as it stands (its fp16 GEMM efficiency and kernel start-up "
                "fitted on the calibration rows here and experiments/validation's together; check rows never).")
             + (" WHAT-IF (--grad-accumulation): the weight gradients accumulated as each row's code does it "
                "(Table 1: PyTorch's AccumulateGrad, `unfused`; Tables 4 and 5: Megatron-LM's main_grad hook, "
                "`main-grad`; run.py's grad_accumulation())." if GRAD_ACCUMULATION else "")
             + (f" WHAT-IF (--with-fit {a.with_fit}): the A100's efficiencies and kernel start-up from that fit "
                f"(start-up {fit['kernel_startup_us']['a100']} us, fp16 GEMM {fit['compute_efficiency']['a100']['fp16']['gemm']})."
                if fit else "")
             + " Rows, sources and assumptions: rows.yaml.", "",
             "| row | set | t | p | d | b | schedule | GPUs | published | pipegrid | error | exposed TP / bubble per device | wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errs = {"calibration": [], "check": []}
    folded = {"calibration": 0, "check": 0}
    done = {}  # row id: (error, pipegrid's value in the row's metric)
    for r in all_rows:
        d = r["gpus"] // (r["t"] * r["p"])
        mb = T4_SHAPE["batch"] if r["table"] == "korthikanti2022_table4" else micro_batch(r)  # layer_probe's
        cfg = f"{r['t']} | {r['p']} | {d} | {mb} | " + (f"interleaved v{r['v']}" if r.get("v", 1) > 1 else "1F1B")
        metric = "tflops_per_gpu" if "tflops_per_gpu" in r else "time_ms" if "time_ms" in r else "iteration_s"
        published = r[metric]
        x = results.get(r["id"])
        if x is None:
            lines.append(f"| {r['id']} | {r['set']} | {cfg} | {r['gpus']} | {published} | "
                         f"not simulated (> {a.max_gpus} GPUs) | | | |")
            continue
        if "error" in x:
            lines.append(f"| {r['id']} | {r['set']} | {cfg} | {r['gpus']} | {published} | "
                         f"error: {x['error']} | | | |")
            continue
        if metric == "tflops_per_gpu":
            value = flops_per_iteration(r) / (x["time"] * r["gpus"]) / 1e12
            err = value / published - 1
            shown = f"{value:.1f} TFLOP/s"
        elif metric == "time_ms":
            value = 1000 * x["time"]
            err = value / published - 1
            shown = f"{value:.2f} ms ({r['pass']})"
        else:
            value = x["time"]
            err = value / published - 1
            shown = f"{value:.2f} s"
        errs[r["set"]].append(abs(err))
        done[r["id"]] = (err, value)
        folded[r["set"]] += 1 if x.get("folded") else 0
        b = x["breakdown"]
        if x.get("folded"):
            shown += " (SimGrid, TP-folded: the whole graph is above the task limit)"
        lines.append(f"| {r['id']} | {r['set']} | {cfg} | {r['gpus']} | {published} | {shown}"
                     f"{'' if x['feasible'] else ' (over memory)'} | {100 * err:+.1f}% | "
                     f"{b.get('tensor_parallel_s', 0):.3g} s / {b.get('bubble_s', 0):.3g} s | {x['wall']:.0f} s |")
    lines.append("")
    for s, e in errs.items():
        if e:
            lines.append(f"- {s} rows simulated: {len(e)}, median |error| {100 * statistics.median(e):.1f}%, "
                         f"max {100 * max(e):.1f}%" + (f" ({folded[s]} of them replayed TP-folded: the whole graph "
                                                        "is above the task limit)" if folded[s] else ""))
    lines += deep_pipeline_summary(all_rows, done) + strong_scaling_table(all_rows, done)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    if plt is not None:
        strong_scaling_figure(plt, all_rows, done, os.path.join(os.path.dirname(os.path.abspath(a.out)),
                                                                "strong-scaling"))
        lines.append("")
        lines.append("![Table 2's strong scaling, published and pipegrid's](strong-scaling.png)")
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
