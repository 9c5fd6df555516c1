#!/usr/bin/env python3
"""NeMo 24.07's published FP8 pre-training runs on DGX-H100 (nemo_h100_rows.yaml) replayed in pipegrid.

    experiments/megatron/nemo_h100.py [--pipegrid build/pipegrid] [-j 2] [--out nemo_h100.md]
    experiments/megatron/nemo_h100.py --validate [--pipegrid P]   # the rows (ctest); with P, the 8-GPU rows against nemo_h100.md

Each row becomes an experiment: the model at the row's sequence in fp8 (GPT3-5B/20B/175B as pipegrid's
`gpt` with NeMo's shapes, the Llama rows as the zoo's), DGX H100 nodes (NVLink 4, one 400 Gb/s NIC
per GPU, rail-optimised), the megatron partitioner with the row's TP, PP, CP and VP (interleaved
1F1B where VP > 1), d = GPUs / (TP PP CP), GBS / (d MBS) micro-batches of MBS, and what
nemo_h100_rows.yaml assumes from the launcher's configurations (sequence parallelism, the TP overlap,
the distributed optimizer with overlapped gradients in bf16, no recomputation). pipegrid's tokens/s
per GPU (GBS x sequence / iteration time / GPUs) against the table's; every row is a check row (the
H100's figures are measured kernel rates, never fitted to a training run). Writes nemo_h100.md.

--validate checks the transcription: every row's quote holds its printed columns, and the table's
"Model TFLOP / sec / GPU" over its "Tokens / sec / GPU" (the model FLOPs per token) equals Megatron's
count for the row's model within 1% (the printed TFLOP/s are integers).
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from h100 import dgx_h100  # noqa: E402  (Megatron-Core's H100 table: the same DGX H100 nodes)
# NeMo's gpt3 configurations (NeMo-Framework-Launcher 24.07, conf/training/gpt3/*.yaml): layers,
# hidden, heads; FFN 4h, multi-head attention, GPT-2's vocabulary.
GPT3 = {"gpt3-5b": (24, 4096, 32), "gpt3-20b": (44, 6144, 48), "gpt3-175b": (96, 12288, 96)}
GPT2_VOCAB = 50257
# The Llama zoo entries' shapes (core/models/zoo.cc; Meta's published configurations): layers, hidden,
# heads, KV groups, SwiGLU FFN, vocabulary.
LLAMA = {"llama2-7b": (32, 4096, 32, 32, 11008, 32000), "llama2-13b": (40, 5120, 40, 40, 13824, 32000),
         "llama2-70b": (80, 8192, 64, 8, 28672, 32000), "llama3-8b": (32, 4096, 32, 8, 14336, 128256),
         "llama3-70b": (80, 8192, 64, 8, 28672, 128256)}
# From each model's launcher configuration at tag 24.07 (nemo_h100_rows.yaml): sequence_parallel and
# ub_tp_comm_overlap.
SEQUENCE_PARALLEL = {"gpt3-20b", "gpt3-175b", "llama2-70b", "llama3-70b"}
TP_OVERLAP = {"gpt3-20b", "llama2-70b", "llama3-70b"}
PRINTED = ["gpus", "gbs", "mbs", "seq", "tp", "pp", "cp", "vp", "tokens_per_s_per_gpu", "tflops_per_gpu"]


def table(path=os.path.join(HERE, "nemo_h100_rows.yaml")):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def rows(t=None):
    t = t or table()
    return [dict(zip(t["columns"], v)) for v in t["rows"]]


def flops_per_token(r):
    """Megatron-LM's num_floating_point_operations per token, no recomputation: 12 l h^2 [(1 + g/a +
    s/h) + (f/h) (3/2 if SwiGLU) + V/(2 l h)] (kv channels h/a)."""
    s = r["seq"]
    if r["model"] in GPT3:
        l, h, a = GPT3[r["model"]]
        g, f, swiglu, v = a, 4 * h, False, 51200  # NeMo counts GPT3's vocabulary as 51,200 (checked by --validate)
    else:
        l, h, a, g, f, v = LLAMA[r["model"]]
        swiglu = True
    return 12 * l * h * h * ((1 + g / a + s / h) + f / h * (1.5 if swiglu else 1) + v / (2 * l * h))


def validate(t):
    """Problems (empty: none) with the rows' transcription."""
    problems = []
    for r in rows(t):
        cells = [c.strip() for c in r["quote"].strip().strip("|").split("|")]
        printed = [int(c.split("](")[0].lstrip("[")) if c.startswith("[") else int(c) for c in cells[1:11]]
        if printed != [r[k] for k in PRINTED]:
            problems.append(f"{r['id']}: quote {printed}, columns {[r[k] for k in PRINTED]}")
        if r["model"] not in GPT3 and r["model"] not in LLAMA:
            problems.append(f"{r['id']}: model {r['model']} has no shape here")
            continue
        per_token = r["tflops_per_gpu"] * 1e12 / r["tokens_per_s_per_gpu"]
        if abs(per_token / flops_per_token(r) - 1) > 0.01:
            problems.append(f"{r['id']}: printed TFLOP/s over tokens/s is {per_token:.4g} FLOP per token, "
                            f"Megatron's count {flops_per_token(r):.4g}")
        if r["gpus"] % (r["tp"] * r["pp"] * r["cp"]) or r["gbs"] % (replicas(r) * r["mbs"]):
            problems.append(f"{r['id']}: GPUs or GBS not divisible by the printed layout")
    return problems


def replicas(r):
    return r["gpus"] // (r["tp"] * r["pp"] * r["cp"])


def workload(r):
    if r["model"] in GPT3:
        l, h, a = GPT3[r["model"]]
        pad = 128 * r["tp"]  # Megatron pads the vocabulary to a multiple of 128 x TP (make_vocab_size_divisible_by)
        return {"model": "gpt", "layers": l, "hidden": h, "heads": a, "sequence": r["seq"],
                "vocabulary": -(-GPT2_VOCAB // pad) * pad, "tied_embeddings": 1, "precision": "fp8",
                "attention": "fused", "kernel_fusion": "megatron"}
    return {"model": r["model"], "sequence": r["seq"], "precision": "fp8", "attention": "fused",
            "kernel_fusion": "megatron"}


def experiment(r):
    d, vp = replicas(r), r["vp"]
    strategy = {"partitioner": "megatron", "schedule": "interleaved-1f1b" if vp > 1 else "1f1b",
                "stages": r["pp"], "replicas": d, "tensor_parallel": r["tp"],
                "sequence_parallel": r["tp"] > 1 and r["model"] in SEQUENCE_PARALLEL,
                "tp_overlap": r["tp"] > 1 and r["model"] in TP_OVERLAP, "allreduce": "multi-ring",
                "dp_overlap": True, "gradient_reduce": "bf16", "micro_batch_size": r["mbs"],
                "micro_batches": r["gbs"] // (d * r["mbs"])}
    if vp > 1:
        strategy["chunks"] = vp
    if r["cp"] > 1:
        strategy["context_parallel"] = r["cp"]
    return {"name": r["id"], "workload": workload(r),
            "cluster": dgx_h100(r["gpus"]),
            "strategy": strategy,
            "memory": {"optimizer": "mixed-adam", "recompute": "none", "zero": 1}}


def replay(pipegrid, r):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, r["id"] + ".yaml")
        with open(path, "w") as f:
            yaml.safe_dump(experiment(r), f, sort_keys=False)
        p = subprocess.run([pipegrid, "run", path, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": ((p.stderr or p.stdout).strip().splitlines() or ["pipegrid failed"])[-1]}
    j = json.loads(p.stdout)
    return {"time": j["iteration_time_s"], "feasible": j["feasible"], "breakdown": j.get("breakdown", {}),
            "host": j.get("host_bound_fraction", 0.0)}


def tokens(r, time):
    return r["gbs"] * r["seq"] / time / r["gpus"]


def errors(all_rows, got):
    """[(row, pipegrid's tokens/s per GPU, error)] of the rows replayed."""
    out = []
    for r in all_rows:
        if "time" in got[r["id"]]:
            v = tokens(r, got[r["id"]]["time"])
            out.append((r, v, v / r["tokens_per_s_per_gpu"] - 1))
    return out


def markdown(t, all_rows, got, errs):
    lines = ["# NeMo 24.07's FP8 runs on DGX-H100, replayed (generated by nemo_h100.py)", "",
             "Command: `experiments/megatron/nemo_h100.py`. Catalog: topologies/devices.yaml's h100 as built into "
             "the binary (measured kernel rates and DeepGEMM's fp8 GEMM figure, never fitted to a training run). "
             f"Source: {t['source']} ({t['url']}). Printed values and assumptions: nemo_h100_rows.yaml; every row "
             "is a check row. error = pipegrid / published - 1 in tokens/s per GPU; \"earlier\": the same "
             "configuration in the table's two earlier printings (August 2024).", "",
             "| row | GPUs | TP | PP | CP | VP | MBS / GBS | published | earlier | pipegrid | error | "
             "exposed TP / DP / bubble per device |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    replayed = {r["id"]: (v, e) for r, v, e in errs}
    for r in all_rows:
        x = got[r["id"]]
        head = (f"| {r['id']} | {r['gpus']} | {r['tp']} | {r['pp']} | {r['cp']} | {r['vp']} | "
                f"{r['mbs']} / {r['gbs']} | {r['tokens_per_s_per_gpu']:,} | "
                f"{', '.join(f'{v:,}' for v in r['earlier'])} | ")
        if "error" in x:
            lines.append(head + f"error: {x['error']} | - | - |")
            continue
        v, e = replayed[r["id"]]
        b = x["breakdown"]
        lines.append(head + f"{v:,.0f}{'' if x['feasible'] else ' (over memory)'} | {100 * e:+.1f}% | "
                     f"{b.get('tensor_parallel_s', 0):.3g} / {b.get('data_parallel_s', 0):.3g} / "
                     f"{b.get('bubble_s', 0):.3g} s |")
    lines.append("")
    if errs:
        a = [abs(e) for _, _, e in errs]
        lines.append(f"- check rows replayed: {len(errs)} of {len(all_rows)}, median |error| "
                     f"{100 * statistics.median(a):.1f}%, max {100 * max(a):.1f}%; pipegrid faster on "
                     f"{sum(e > 0 for _, _, e in errs)} of {len(errs)}")
        for label, pick in (("pipelined rows (PP > 1)", lambda r: r["pp"] > 1), ("rows with PP >= 8", lambda r: r["pp"] >= 8)):
            sel = [e for r, _, e in errs if pick(r)]
            if sel:
                lines.append(f"- {label}: {len(sel)}, median |error| {100 * statistics.median(abs(e) for e in sel):.1f}%, "
                             f"errors {', '.join(f'{100 * e:+.1f}%' for e in sel)}")
        spread = [(max([r['tokens_per_s_per_gpu']] + r['earlier']) / min([r['tokens_per_s_per_gpu']] + r['earlier']) - 1)
                  for r in all_rows]
        lines.append(f"- the data's own spread across the table's three printings: median {100 * statistics.median(spread):.1f}%, "
                     f"max {100 * max(spread):.1f}%")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipegrid", default=None, help="the binary (default: build/pipegrid, or $PIPEGRID)")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "nemo_h100.md"))
    ap.add_argument("--validate", action="store_true", help="the rows' transcription only (and, with "
                    "--pipegrid, the 8-GPU rows replayed to a positive time)")
    a = ap.parse_args()
    t = table()
    problems = validate(t)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    all_rows = rows(t)
    if a.validate:
        if a.pipegrid:  # the 8-GPU rows replayed now give nemo_h100.md's figures (else: run nemo_h100.py)
            shown = {}
            for line in open(os.path.join(HERE, "nemo_h100.md"), encoding="utf-8"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if cells and cells[0].startswith("nemo-") and len(cells) > 9:
                    shown[cells[0]] = cells[9]
            for r in (r for r in all_rows if r["gpus"] <= 8):
                x = replay(a.pipegrid, r)
                got = f"{tokens(r, x['time']):,.0f}" if "time" in x else x
                if got != shown.get(r["id"]):
                    print(f"{r['id']}: replayed now {got}, nemo_h100.md {shown.get(r['id'])}: run nemo_h100.py",
                          file=sys.stderr)
                    return 1
        print(f"nemo_h100_rows.yaml: {len(all_rows)} rows valid")
        return 0
    sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
    import pgx  # noqa: E402
    a.pipegrid = a.pipegrid or pgx.binary()
    pgx.check_catalog(a.pipegrid, ("h100",))
    with concurrent.futures.ThreadPoolExecutor(a.j) as ex:
        got = dict(zip([r["id"] for r in all_rows], ex.map(lambda r: replay(a.pipegrid, r), all_rows)))
    errs = errors(all_rows, got)
    text = markdown(t, all_rows, got, errs)
    if os.path.dirname(a.out):
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    if len(errs) == len(all_rows) and os.path.abspath(a.out) == os.path.join(HERE, "nemo_h100.md"):
        worst = max(errs, key=lambda x: abs(x[2]))
        # The summary experiments/validation/run.py copies into accuracy.yaml (h100, megatron-lm, fp8).
        with open(os.path.join(HERE, "nemo_h100.yaml"), "w") as f:
            f.write("# Written by experiments/megatron/nemo_h100.py (its last full run, nemo_h100.md): NeMo 24.07's\n"
                    "# published FP8 runs on DGX-H100 as check rows; experiments/validation/run.py copies it into\n"
                    "# accuracy.yaml (h100, megatron-lm, fp8).\n")
            yaml.safe_dump({"check_rows": len(errs), "median_error": round(statistics.median(abs(e) for _, _, e in errs), 4),
                            "max_error": round(abs(worst[2]), 4), "worst": worst[0]["id"],
                            "faster": sum(e > 0 for _, _, e in errs)}, f, sort_keys=False)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
