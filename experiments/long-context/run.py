#!/usr/bin/env python3
"""Long-context training throughput: NeMo's published Llama 2 7B rows with context parallelism,
replayed (issue 51, item 6). rows.yaml holds the rows as printed, their source, the split into
calibration and check rows and what is assumed; this script turns each row into an experiment, runs
`pipegrid run --json` on it and writes results.md beside it: pipegrid's model TFLOP/s per GPU against
the published one, the check rows' median and largest |error| (the rule of experiments/validation:
median <= 10%, every row within +-25%), and where the time goes.

    experiments/long-context/run.py [--pipegrid build/pipegrid] [--max-gpus 1024] [--out results.md]

Exits 1 when the check fails (nothing is fitted here: the rows show where the model stands)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
import pgx  # noqa: E402

TOKENS_PER_BATCH = 4194304  # rows.yaml: the global batch assumed at every length


def experiment(row):
    """The experiment of a row, as rows.yaml's assumptions say."""
    s = row["sequence_k"] * 1024
    gpus = row["gpus"]
    per_node = min(8, gpus)
    tp, pp, dp, cp = row["tp"], row["pp"], row["dp"], row["cp"]
    assert tp * pp * dp * cp == gpus, row["id"]
    return f"""name: {row['id']}
workload: {{model: llama2-7b, sequence: {s}, precision: fp8, kernel_fusion: megatron, attention: fused}}
cluster: {{kind: dgx, nodes: {gpus // per_node}, gpus_per_node: {per_node}, gpu: h100,
          nvlink: {{bandwidth: 450GBps, latency: 0.5us}}, infiniband: {{bandwidth: 400Gbps, latency: 1us}}, fabric: rail}}
strategy: {{partitioner: megatron, schedule: 1f1b, stages: {pp}, replicas: {dp}, tensor_parallel: {tp},
           context_parallel: {cp}, sequence_parallel: {'true' if tp > 1 else 'false'}, micro_batch_size: 1,
           global_batch: {TOKENS_PER_BATCH // s}, dp_overlap: true}}
memory: {{optimizer: mixed-adam, zero: 1, recompute: none}}
"""


def replay(pipegrid, row):
    p = subprocess.run([pipegrid, "run", "-", "--json"], input=experiment(row), capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip()}
    j = json.loads(p.stdout)
    b = j["breakdown"]
    return {"tflops": j["model_flops"]["model_flops_per_s_per_device"] / 1e12,
            "iteration_s": j["iteration_time_s"], "feasible": j["feasible"],
            "compute_s": b["compute_s"], "cp_s": b.get("context_parallel_s", 0.0),
            "tp_s": b["tensor_parallel_s"], "dp_s": b["data_parallel_s"], "bubble_s": b["bubble_s"]}


def best_without_cp(pipegrid, row, with_cp):
    """pipegrid's best configuration without CP on the row's GPUs (`search --cp 1`, its winner replayed
    in SimGrid), as model TFLOP/s per GPU: the same model FLOPs per iteration as the CP run's."""
    s = row["sequence_k"] * 1024
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(experiment(row))
    try:
        p = subprocess.run([pipegrid, "search", f.name, "--global-batch", str(TOKENS_PER_BATCH // s), "--cp", "1",
                            "--top", "1", "--json"], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        print(row["id"], "search without CP failed:", p.stderr.strip()[:200], file=sys.stderr)
        return None
    j = json.loads(p.stdout)
    if not j.get("simgrid_ranking"):
        return None
    best = j["simgrid_ranking"][0]
    label = f"t{best['t']} p{best['p']} d{best['d']}"
    return with_cp["tflops"] * with_cp["iteration_s"] / best["simulated_iteration_time_s"], label


def crossover(rows, results, without):
    """Published and pipegrid's speedup of the CP configuration over the best without CP, per row."""
    out = ["| tokens | GPUs | published: without CP / with CP (speedup) | pipegrid: best without CP | with CP (speedup) |",
           "|---|---|---|---|---|"]
    first = {"published": None, "pipegrid": None}
    for r in rows:
        if r["id"] not in without or without[r["id"]] is None:
            continue
        tf, label = without[r["id"]]
        mine = results[r["id"]]["tflops"]
        pub = r["tflops_per_gpu"] / r["tflops_per_gpu_without_cp"]
        ours = mine / tf
        for who, x in (("published", pub), ("pipegrid", ours)):
            if first[who] is None and x > 1.005 and r["cp"] > 1:
                first[who] = r["sequence_k"]
        out.append(f"| {r['sequence_k']}k | {r['gpus']} | {r['tflops_per_gpu_without_cp']} / {r['tflops_per_gpu']} "
                   f"({pub:.2f}x) | {tf:.0f} ({label}) | {mine:.0f} ({ours:.2f}x) |")
    return "\n".join(out), first


def table(rows, results):
    out = ["| row | split | tokens | GPUs | TP PP DP CP | published TFLOP/s/GPU | pipegrid | error | "
           "without CP, published | pipegrid's time: compute / exposed CP / TP / DP / bubble |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        x = results.get(r["id"])
        config = f"{r['tp']} {r['pp']} {r['dp']} {r['cp']}"
        head = f"| {r['id']} | {r['split']} | {r['sequence_k']}k | {r['gpus']} | {config} | {r['tflops_per_gpu']} |"
        if x is None:
            out.append(head + " not replayed (--max-gpus) | | " + f"{r['tflops_per_gpu_without_cp']} | |")
        elif "error" in x:
            out.append(head + f" failed: {x['error'][:80]} | | {r['tflops_per_gpu_without_cp']} | |")
        else:
            err = x["tflops"] / r["tflops_per_gpu"] - 1
            over = "" if x["feasible"] else " (over memory)"
            parts = " / ".join(f"{x[k]:.3g} s" for k in ("compute_s", "cp_s", "tp_s", "dp_s", "bubble_s"))
            out.append(head + f" {x['tflops']:.0f}{over} | {100 * err:+.1f}% | {r['tflops_per_gpu_without_cp']} | {parts} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipegrid", default=None)
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--without-cp", type=int, default=256, metavar="GPUS",
                    help="search the best configuration without CP for the rows on at most GPUS (0: none)")
    a = ap.parse_args()
    pipegrid = a.pipegrid or pgx.binary()
    with open(os.path.join(HERE, "rows.yaml")) as f:
        rows = yaml.safe_load(f)["rows"]
    results = {}
    for r in rows:
        if r["gpus"] <= a.max_gpus:
            results[r["id"]] = replay(pipegrid, r)
            print(r["id"], results[r["id"]].get("tflops", results[r["id"]].get("error")), flush=True)
    check = [r for r in rows if r["split"] == "check"]
    errors = [abs(results[r["id"]]["tflops"] / r["tflops_per_gpu"] - 1) for r in check
              if r["id"] in results and "tflops" in results[r["id"]]]
    replayed = len(errors) == len(check)
    median = statistics.median(errors) if errors else float("nan")
    worst = max(errors) if errors else float("nan")
    passed = replayed and median <= 0.10 and worst <= 0.25
    text = ["# Long-context rows: NeMo's Llama 2 7B with context parallelism, replayed", "",
            "Written by `experiments/long-context/run.py` from [rows.yaml](rows.yaml) (source, quotes, split and "
            "assumptions there); pipegrid's figure is `run --json`'s model FLOP/s per GPU (Megatron-LM's count, "
            "full attention).", "", table(rows, results), "",
            f"Check rows replayed: {len(errors)} of {len(check)}; median |error| {100 * median:.1f}%, max "
            f"{100 * worst:.1f}%: the check {'holds' if passed else 'fails'} (median <= 10%, every row within "
            "+-25%)."]
    without = {r["id"]: best_without_cp(pipegrid, r, results[r["id"]]) for r in rows
               if r["gpus"] <= a.without_cp and "tflops" in results.get(r["id"], {})}
    if without:
        cross, first = crossover(rows, results, without)
        text += ["", "**Where CP starts to pay.** The published speedup of each row's CP configuration over the best "
                 "without CP (NeMo's, configurations not printed), beside pipegrid's: its best without CP is "
                 "`pipegrid search --cp 1`'s winner on the row's GPUs and batch, replayed in SimGrid.", "", cross, "",
                 f"The first length with a speedup above 1: published {first['published']}k, pipegrid "
                 f"{first['pipegrid']}k (rows on at most {a.without_cp} GPUs)."]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(text) + "\n")
    print(text[-1])
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
