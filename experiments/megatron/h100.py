#!/usr/bin/env python3
"""Megatron-Core's published H100 weak-scaling runs (h100_rows.yaml) replayed in pipegrid.

Each row becomes an experiment: a GPT of the row's shape (sequence 4,096, vocabulary 131,072, bf16,
fused attention and element-wise kernels), DGX H100 nodes (topologies/clusters/dgx-h100-*.yaml's
NVLink 4 and NDR figures, rail-optimised), the megatron partitioner with the row's t, p and d,
micro-batch 1 per replica, the interleaved schedule with one layer per model chunk where p > 1
(1F1B at p = 1), untied embeddings, the distributed optimizer, the gradients reduced in fp32 and
overlapped with the backward (dp_overlap), sequence parallelism and overlapped TP communication
where t > 1 (h100_rows.yaml says what is printed and what is assumed). pipegrid's iteration time
becomes TFLOP/s per GPU by Megatron's formula and is compared with the table. Rows whose whole
graph is above pipegrid's task limit (or above --whole-max-gpus) are replayed TP-folded (`pipegrid
search --tp-folded`: exact where a TP group fills its node, t = 8 here). Writes h100.md (with
every row under each --what-if), h100.yaml (the summary experiments/validation/run.py copies into
accuracy.yaml) and h100.png / .svg (published against pipegrid, each assumption).

    experiments/megatron/h100.py [--pipegrid build/pipegrid] [--max-gpus 6144] [-j 2]
"""
import argparse
import concurrent.futures
import os
import statistics
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import run as megatron_run  # noqa: E402  (run.py: the TP-folded replay)
H100_PEAK_BF16 = 989e12  # dense, NVIDIA H100 SXM5 datasheet (topologies/devices.yaml)


def table():
    return yaml.safe_load(open(os.path.join(HERE, "h100_rows.yaml")))


def rows():
    t = table()
    out = []
    for values in t["rows"]:
        r = dict(zip(t["columns"], values))
        r.update(sequence=t["sequence"], vocabulary=t["vocabulary"], set="check", source=t["source"], url=t["url"])
        out.append(r)
    return out


def flops_per_iteration(r):
    """Megatron-Core r0.8.0's num_floating_point_operations for this GPT (no GQA, f = 4h, no SwiGLU):
    12 B s l h^2 (6 + s/h + V/(2 l h))."""
    B, s, l, h, V = r["batch"], r["sequence"], r["layers"], r["hidden"], r["vocabulary"]
    return 12 * B * s * l * h * h * (6 + s / h + V / (2 * l * h))


def chunks(r):
    """Model chunks per pipeline rank: one transformer layer each where p > 1 (h100_rows.yaml: the
    interleaved schedule, the only one with the pipeline overlap the README states); 1F1B at p = 1 or
    under --what-if 1f1b."""
    return r["layers"] // r["p"] if r["p"] > 1 and WHAT_IF != "1f1b" else 1


def micro_batches(r):
    if r["batch"] % r["d"] != 0:
        raise ValueError(f"{r['id']}: d {r['d']} does not divide the batch {r['batch']}")
    return r["batch"] // r["d"]  # micro-batch 1 per replica


WHAT_IF = None  # --what-if: a diagnostic variant of the assumptions (the table says so)


def dgx_h100(gpus):
    """DGX H100 nodes as topologies/clusters/dgx-h100-*.yaml give them: 8 GPUs on NVLink 4, one 400 Gb/s
    NIC per GPU, rail-optimised across nodes."""
    return {"kind": "dgx", "nodes": max(1, gpus // 8), "gpu": "h100",
            "nvlink": {"bandwidth": "450GBps", "latency": "0.5us"},
            "infiniband": {"bandwidth": "400Gbps", "latency": "1us"},
            "fabric": "rail" if gpus > 8 else "switch"}


def experiment(r):
    t, p, d = r["t"], r["p"], r["d"]
    e = {
        "name": r["id"],
        "workload": {"model": "gpt", "layers": r["layers"], "hidden": r["hidden"], "heads": r["heads"],
                     "sequence": r["sequence"], "vocabulary": r["vocabulary"], "precision": "amp-bf16",
                     "kernel_fusion": "megatron", "attention": "fused",
                     "tied_embeddings": 0},
        "cluster": dgx_h100(r["gpus"]),
        "strategy": {"partitioner": "megatron", "schedule": "interleaved-1f1b" if chunks(r) > 1 else "1f1b",
                     "stages": p, "replicas": d,
                     "allreduce": "multi-ring", "tensor_parallel": t, "sequence_parallel": t > 1,
                     "tp_overlap": t > 1, "dp_overlap": True, "gradient_reduce": "fp32",
                     "micro_batch_size": 1, "micro_batches": micro_batches(r)},
        "memory": {"optimizer": "mixed-adam", "recompute": "none", "zero": 1},
    }
    if chunks(r) > 1:
        e["strategy"]["chunks"] = chunks(r)
    if WHAT_IF == "no-dp-overlap":
        e["strategy"]["dp_overlap"] = False

    elif WHAT_IF == "bf16-gradients":
        e["strategy"]["gradient_reduce"] = "bf16"
    return e


def replay_folded(pipegrid, r, why):
    """The row replayed TP-folded (run.py's folded_search): the candidate with the distributed
    optimizer and, at t > 1, sequence parallelism is the row's."""
    return megatron_run.folded_search(pipegrid, experiment(r), r["batch"], r["t"], r["p"], 1, "none", chunks(r),
                                      lambda c: c["distributed_optimizer"] and c["sequence_parallel"] == (r["t"] > 1),
                                      why)


def simulate(pipegrid, r, whole_max_gpus):
    if r["gpus"] > whole_max_gpus:
        return replay_folded(pipegrid, r, f"above --whole-max-gpus {whole_max_gpus}")
    return megatron_run.run_whole(pipegrid, experiment(r), lambda why: replay_folded(pipegrid, r, why))


WHAT_IFS = {"1f1b": "the pipelined rows in non-interleaved 1F1B (Megatron-LM's example script)",
            "no-dp-overlap": "the gradients all-reduced after the backward (no dp_overlap)",
            "bf16-gradients": "the gradients reduced in bf16 instead of fp32"}


def sensitivity(a, all_rows, by_what_if):
    """The table's lines for each --what-if: one assumption changed at a time, every row re-run;
    each what-if's errors (pipegrid / published - 1, None: an error) into by_what_if."""
    global WHAT_IF
    lines = ["", "What each assumption carries (`--what-if`, one changed at a time; the error of every row, "
             "then the median and max |error|):", "", "| what-if | " + " | ".join(r["id"] for r in all_rows)
             + " | median | max |", "|---|" + "---|" * (len(all_rows) + 2)]
    for name, what in WHAT_IFS.items():
        WHAT_IF = name
        try:
            with concurrent.futures.ThreadPoolExecutor(a.j) as ex:
                res = list(ex.map(lambda r: simulate(a.pipegrid, r, a.whole_max_gpus), all_rows))
        finally:
            WHAT_IF = None
        errs = [None if "error" in x else flops_per_iteration(r) / (x["time"] * r["gpus"]) / 1e12 / r["tflops_per_gpu"] - 1
                for r, x in zip(all_rows, res)]
        ok = [abs(e) for e in errs if e is not None]
        lines.append(f"| {name}: {what} | " + " | ".join("error" if e is None else f"{100 * e:+.1f}%" for e in errs)
                     + f" | {100 * statistics.median(ok):.1f}% | {100 * max(ok):.1f}% |")
        by_what_if[name] = errs
    return lines


def plot(plt, out, all_rows, errors):
    """h100.png / .svg: published TFLOP/s per GPU against pipegrid's (the table's assumptions, and
    each --what-if), one group of markers per row."""
    fig, ax = plt.subplots(figsize=(10, 5.6))
    x = list(range(len(all_rows)))
    ax.plot(x, [r["tflops_per_gpu"] for r in all_rows], "s", color="black", ms=7, label="published (Megatron-Core r0.8.0)")
    styles = {"main": ("o", "tab:blue", "pipegrid: interleaved where p > 1 (the table's assumption)"),
              "1f1b": ("^", "tab:orange", "pipegrid: 1F1B where p > 1 (--what-if 1f1b)"),
              "no-dp-overlap": ("x", "tab:red", "pipegrid: no data-parallel overlap"),
              "bf16-gradients": ("+", "tab:green", "pipegrid: gradients reduced in bf16")}
    for name, (marker, color, label) in styles.items():
        errs = errors.get(name)
        if errs:
            ax.plot(x, [None if e is None else r["tflops_per_gpu"] * (1 + e) for r, e in zip(all_rows, errs)],
                    marker, color=color, ms=7, mfc="none" if marker in "o^" else color, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['model_size']}\n{r['gpus']:,}\nt{r['t']} p{r['p']}" for r in all_rows], fontsize=9)
    ax.set_ylabel("TFLOP/s per GPU (Megatron's formula)")
    ax.set_xlabel("model, GPUs, tensor (t) and pipeline (p) parallelism; d = 48 throughout")
    ax.set_ylim(250, 650)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("Megatron-Core r0.8.0 on H100s: published and pipegrid's (catalog H100, never fitted)", fontsize=11)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=2, fontsize=9, frameon=False)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"h100.{ext}"), dpi=120, metadata={"Date": None} if ext == "svg" else {})
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipegrid", default=os.environ.get("PIPEGRID", os.path.join(ROOT, "build", "pipegrid")))
    ap.add_argument("--max-gpus", type=int, default=6144, help="rows on more GPUs are not simulated")
    ap.add_argument("--whole-max-gpus", type=int, default=192,
                    help="rows on more GPUs are replayed TP-folded (default 192: the t = 8 rows)")
    ap.add_argument("--only", nargs="*", help="row ids")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--out", default=HERE, help="folder for h100.md and h100.yaml")
    ap.add_argument("--what-if", choices=["no-dp-overlap", "bf16-gradients", "1f1b"],
                    help="a diagnostic: the gradients all-reduced after the backward, or in bf16, or the p > 1 "
                         "rows in non-interleaved 1F1B (writes no h100.yaml; h100.md says so)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)  # a new folder is made, not a crash after the runs
    global WHAT_IF
    WHAT_IF = a.what_if
    sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
    import pgx  # noqa: E402
    full = not a.what_if and not a.only and a.max_gpus >= max(r["gpus"] for r in rows())
    plt = pgx.matplotlib_pyplot() if full else None  # first: may re-run this script under another python
    pgx.check_catalog(a.pipegrid, ("h100",))  # the catalog's H100 is what this run reports
    all_rows = rows()
    todo = [r for r in all_rows if r["gpus"] <= a.max_gpus and (not a.only or r["id"] in a.only)]
    with concurrent.futures.ThreadPoolExecutor(a.j) as ex:
        results = dict(zip([r["id"] for r in todo], ex.map(lambda r: simulate(a.pipegrid, r, a.whole_max_gpus), todo)))
    t = table()
    lines = ["# Megatron-Core's published H100 runs, replayed (generated by h100.py)", "",
             f"Command: `experiments/megatron/h100.py --max-gpus {a.max_gpus} --whole-max-gpus {a.whole_max_gpus}"
             + (f" --what-if {a.what_if}`. WHAT-IF: not the assumptions of h100_rows.yaml. " if a.what_if else "`. ")
             +
             "Catalog: topologies/devices.yaml's h100 as it stands (measured kernel rates, never fitted to a "
             "training run). Source: " + t["source"] + f" ({t['url']}). Printed values and assumptions: "
             "h100_rows.yaml; every row is a check row.", "",
             "| row | t | p | d | micro-batches (interleaved: v chunks) | GPUs | published TFLOP/s per GPU | pipegrid | error | "
             "exposed TP / DP / bubble per device | replay | wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errs = []
    for r in all_rows:
        v = chunks(r)
        cfg = f"{r['t']} | {r['p']} | {r['d']} | {micro_batches(r)}{f', v {v}' if v > 1 else ''} | {r['gpus']}"
        x = results.get(r["id"])
        if x is None:
            lines.append(f"| {r['id']} | {cfg} | {r['tflops_per_gpu']} | not simulated | | | | |")
            continue
        if "error" in x:
            lines.append(f"| {r['id']} | {cfg} | {r['tflops_per_gpu']} | error: {x['error']} | | | | |")
            continue
        value = flops_per_iteration(r) / (x["time"] * r["gpus"]) / 1e12
        err = value / r["tflops_per_gpu"] - 1
        errs.append((abs(err), r["id"]))
        b = x["breakdown"]
        lines.append(f"| {r['id']} | {cfg} | {r['tflops_per_gpu']} | {value:.1f}"
                     f"{'' if x['feasible'] else ' (over memory)'} | {100 * err:+.1f}% | "
                     f"{b.get('tensor_parallel_s', 0):.3g} / {b.get('data_parallel_s', 0):.3g} / "
                     f"{b.get('bubble_s', 0):.3g} s | {'TP-folded' if x.get('folded') else 'whole graph'} | "
                     f"{x['wall']:.0f} s |")
    lines.append("")
    summary = {}
    if errs:
        e = sorted(errs)
        summary = {"check_rows": len(e), "median_error": round(statistics.median(x for x, _ in e), 4),
                   "max_error": round(e[-1][0], 4), "worst": e[-1][1]}
        lines.append(f"- check rows simulated: {len(e)} of {len(all_rows)}, median |error| "
                     f"{100 * summary['median_error']:.1f}%, max {100 * summary['max_error']:.1f}% ({e[-1][1]})")
    if len(errs) == len(all_rows) and not a.what_if:
        errors = {"main": [flops_per_iteration(r) / (results[r["id"]]["time"] * r["gpus"]) / 1e12 / r["tflops_per_gpu"] - 1
                           for r in all_rows]}
        lines += sensitivity(a, all_rows, errors)
        if plt:
            plot(plt, a.out, all_rows, errors)
            lines += ["", "![published against pipegrid](h100.png)"]
    open(os.path.join(a.out, "h100.md"), "w").write("\n".join(lines) + "\n")
    if len(errs) == len(all_rows) and not a.what_if:  # the summary stands for every row only
        with open(os.path.join(a.out, "h100.yaml"), "w") as f:
            f.write("# Written by experiments/megatron/h100.py (its last full run, h100.md): Megatron-Core's\n"
                    "# published H100 runs as check rows; experiments/validation/run.py copies it into\n"
                    "# accuracy.yaml (h100, megatron-lm, amp-bf16).\n")
            yaml.safe_dump(summary, f, sort_keys=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
