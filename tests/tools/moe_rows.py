#!/usr/bin/env python3
"""ctest: the MoE validation's rows (experiments/moe/rows.yaml) and run.py's arithmetic.

1. rows.yaml is valid (run.py's validate: every field present, quotes non-empty and holding the
   value, split calibration or check, GBS a multiple of d x MBS) and its split is the stated rule:
   by (gpu, precision), sorted by id, odd positions calibration, even check.
2. The metrics by hand: tokens/s/GPU of a 1-second iteration is GBS x seq / GPUs; Megatron-LM's FLOP
   count for Mixtral 8x22B at one sequence equals 12 L h^2 s [(1 + 8/48 + 4096/6144) + 8 + 32000 /
   (2 L h)], written out.
3. accuracy.yaml agrees with results.md's check table. EP overlap on exactly the rows whose recipe sets it (listed by hand); the GB200 rows' NVLink domains follow Megatron-Bridge's launcher rule, worked by hand.
4. The 8-GPU rows replay (one DGX-B200 node or GB200 domain: a few seconds) to a positive time.
"""
import os
import sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pipegrid = sys.argv[1]
sys.path.insert(0, os.path.join(root, "experiments", "moe"))
import run  # noqa: E402

rows = run.load_rows()
problems = run.validate(rows)
if problems:
    sys.exit("rows.yaml: " + "; ".join(problems))
groups = {}
for r in rows:
    groups.setdefault((r["gpu"], r["precision"]), []).append(r)
for key, members in groups.items():
    for i, r in enumerate(sorted(members, key=lambda x: x["id"])):
        want = "calibration" if i % 2 == 0 else "check"
        if r["split"] != want:
            sys.exit(f"{r['id']}: split {r['split']}, the rule gives {want}")

r = next(x for x in rows if x["metric"] == "tokens_per_s_per_gpu")
if abs(run.predicted(r, 1.0) - r["gbs"] * r["seq"] / r["gpus"]) > 1e-9:
    sys.exit("tokens/s/GPU of a 1 s iteration is not GBS x seq / GPUs")
L, h, s = 56, 6144, 4096
by_hand = 12 * L * h * h * s * ((1 + 8 / 48 + 4096 / 6144) + 16384 / 6144 * 2 * 1.5 + 32000 / (2 * L * h))
if abs(run.megatron_flops("mixtral-8x22b", 1, s) / by_hand - 1) > 1e-12:
    sys.exit(f"Megatron FLOPs {run.megatron_flops('mixtral-8x22b', 1, s)} != {by_hand}")

# The GB200 rows' NVLink domains by hand from the launcher's rule (trays of 4; one Slurm segment up to
# 18 trays, else the largest divisor <= 18 of the tray count): 8 GPUs = 2 trays, one domain; 64 = 16
# trays, one domain; 128 = 32 trays -> 16 (32 = 2 x 16) -> 64; 256 = 64 trays -> 16 -> 64; 144 = 36 -> 18 -> 72.
for gpus, want in ((8, 8), (64, 64), (128, 64), (256, 64), (144, 72)):
    got = run.nvlink_domain({"system": "DGX-GB200", "gpus": gpus})
    if got != want:
        sys.exit(f"NVLink domain of {gpus} GB200 GPUs: {got}, by hand {want}")
if run.nvlink_domain({"system": "DGX-B200", "gpus": 256}) != 8:
    sys.exit("a DGX-B200 node is not 8 GPUs")
# GB300 NVL72 racks take the GB200's rule (the same launcher); a DGX-B300 node is 8 GPUs.
if run.nvlink_domain({"system": "DGX-GB300", "gpus": 256}) != 64 or run.nvlink_domain({"system": "DGX-GB300", "gpus": 8}) != 8:
    sys.exit("GB300 NVLink domains are not the GB200's")
if run.nvlink_domain({"system": "DGX-B300", "gpus": 256}) != 8:
    sys.exit("a DGX-B300 node is not 8 GPUs")

# EP overlap exactly where a recipe of the row's configuration sets it (rows.yaml; read by hand at
# Megatron-Bridge 067f987, helpers followed): the rows whose printed configuration one of them describes.
want = {"mb-qwen3-235b-a22b-h100-fp8-256gpu-gbs8192", "mb-qwen3-30b-a3b-b200-mxfp8-8gpu-mbs4",
        "mb-deepseek-v3-b200-mxfp8-256gpu-pp8-vp2-ep32", "mb-gpt-oss-120b-gb200-bf16-64gpu-mbs4",
        "mb-gpt-oss-120b-gb200-mxfp8-64gpu", "mb-deepseek-v3-gb200-mxfp8-256gpu-pp4",
        "mb-qwen3-30b-a3b-gb200-mxfp8-8gpu", "mb-qwen3-235b-a22b-gb200-mxfp8-256gpu-vp3",
        # B300 and GB300 (2026-12-05; their MXFP8 recipes' full-iteration helpers set it, GPT-OSS on B300
        # excepted; a row matches only where its printed configuration is the recipe's)
        "mb-qwen3-30b-a3b-b300-mxfp8-8gpu", "mb-qwen3-30b-a3b-gb300-mxfp8-8gpu-mbs8",
        "mb-qwen3-235b-a22b-gb300-mxfp8-256gpu-vp12", "mb-deepseek-v3-gb300-mxfp8-256gpu-mbs1-vp8",
        "mb-gpt-oss-120b-gb300-mxfp8-64gpu"}
got = {x["id"] for x in rows if run.assumed(x)["overlap"]}
if got != want:
    sys.exit(f"EP overlap on {sorted(got ^ want)} differs from the recipes")

# No host time per launch exactly where the row ran under a full-iteration CUDA graph: its recipe at
# Megatron-Bridge 067f987 sets cuda_graph_impl = "full_iteration" (read by hand, helpers followed) and
# its release is 26.06 or later (the recipes' commits of 2026-06-09/10). Those rows' devices carry
# kernel_dispatch 0; every other row runs the catalog's device (PyTorch eager's host time).
want = {"mb-deepseek-v3-gb200-mxfp8-256gpu-pp4", "mb-gpt-oss-120b-gb200-mxfp8-64gpu",
        "mb-qwen3-235b-a22b-gb200-mxfp8-256gpu-vp3", "mb-qwen3-30b-a3b-gb200-mxfp8-8gpu",
        # B300 and GB300: the same five recipes, every row of release 26.06 or 26.08
        "mb-qwen3-30b-a3b-b300-mxfp8-8gpu", "mb-qwen3-30b-a3b-gb300-mxfp8-8gpu-mbs8",
        "mb-qwen3-235b-a22b-gb300-mxfp8-256gpu-vp12", "mb-deepseek-v3-gb300-mxfp8-256gpu-mbs1-vp8",
        "mb-gpt-oss-120b-gb300-mxfp8-64gpu"}
got = {x["id"] for x in rows if run.full_iteration_cuda_graph(x)}
if got != want:
    sys.exit(f"full-iteration CUDA graph on {sorted(got ^ want)} differs from the recipes and releases")
for x in rows:
    gpu = run.experiment(x)["cluster"]["gpu"]
    graph = isinstance(gpu, dict) and gpu.get("kernel_dispatch") == "0us"
    if graph != (x["id"] in want):
        sys.exit(f"{x['id']}: device {gpu}, full-iteration CUDA graph {x['id'] in want}")
# Recomputation as the B300 and GB300 recipes set it (read by hand at 067f987): DeepSeek-V3 [mla_up_proj] on
# B300, [moe_act] in BF16 and none in MXFP8 on GB300; GPT-OSS none on either.
for rid, mods in (("mb-deepseek-v3-b300-mxfp8-256gpu-mbs2", ["mla_up_proj"]),
                  ("mb-deepseek-v3-gb300-bf16-256gpu", ["moe_act"]), ("mb-deepseek-v3-gb300-mxfp8-256gpu-mbs2", None),
                  ("mb-gpt-oss-120b-b300-bf16-64gpu-ep8", None), ("mb-gpt-oss-120b-gb300-bf16-64gpu-mbs4", None)):
    if run.recompute_modules(next(x for x in rows if x["id"] == rid)) != mods:
        sys.exit(f"{rid}: recomputation {run.recompute_modules(next(x for x in rows if x['id'] == rid))}, the recipe {mods}")
# The same configuration in an eager release (26.04.01) pays the host.
eager = dict(next(x for x in rows if x["id"] == "mb-qwen3-30b-a3b-gb200-mxfp8-8gpu"), release="26.04.01")
if run.full_iteration_cuda_graph(eager):
    sys.exit("a 26.04.01 release is taken as running the full-iteration CUDA graph of 26.06")

# accuracy.yaml (what `pipegrid run` prints for an MoE workload) against results.md's check table,
# recomputed here from the table's error column: per (gpu, precision) the rows, the median and max
# |error|, the worst row and how many are positive (pipegrid faster).
import statistics  # noqa: E402
import yaml  # noqa: E402
acc = yaml.safe_load(open(os.path.join(root, "experiments", "moe", "accuracy.yaml")))
table, section = {}, None
for line in open(os.path.join(root, "experiments", "moe", "results.md")):
    section = "check" if line.startswith("## Check") else "other" if line.startswith("## ") else section
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if section == "check" and line.startswith("| ") and cells[0] in {x["id"] for x in rows}:
        table[cells[0]] = float(cells[-1].rstrip("%")) / 100
by_id = {x["id"]: x for x in rows}
groups = {}
for rid, err in table.items():
    groups.setdefault((by_id[rid]["gpu"], by_id[rid]["precision"]), []).append((abs(err), rid, err))
got = {(g, p) for g in acc for p in acc[g]}
if got != set(groups):
    sys.exit(f"accuracy.yaml's groups {sorted(got)} are not results.md's {sorted(groups)}")
for (g, p), errs in groups.items():
    e = acc[g][p]
    errs.sort()
    want = {"check_rows": len(errs), "worst": errs[-1][1], "faster": sum(x > 0 for _, _, x in errs)}
    have = {"check_rows": e["check_rows"], "worst": e["worst"], "faster": e["faster"]}
    # results.md prints tenths of a per cent.
    median = statistics.median(x for x, _, _ in errs)
    if want != have or abs(e["median_error"] - median) > 0.0011 or abs(e["max_error"] - errs[-1][0]) > 0.0006:
        sys.exit(f"accuracy.yaml {g} {p}: {e}, results.md gives {want}, median {median}, max {errs[-1][0]}")

small = [x for x in rows if x["gpus"] <= 8]
if not small:
    sys.exit("no 8-GPU row to replay")
results = run.run_rows(pipegrid, small, 2, 8)
for x in small:
    got = results[x["id"]]
    if "predicted" not in got or not got["time"] > 0:
        sys.exit(f"{x['id']}: {got}")
print(f"rows.yaml: {len(rows)} rows valid, split by the rule; {len(small)} 8-GPU rows replayed")
