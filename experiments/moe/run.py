#!/usr/bin/env python3
"""Published MoE training throughputs (rows.yaml) replayed in pipegrid (issue 50, item 8).

Each row becomes an experiment: the zoo model at sequence 4,096 in the row's precision, DGX nodes of
8 GPUs (the dgx-h100 / dgx-b200 presets' NVLink and NDR figures, written out as the `dgx` generator so
that the device can take the fit's overrides; rail-optimised across nodes), the megatron partitioner
with the row's TP, PP, VP (interleaved 1F1B) and EP, d = GPUs / (TP PP) replicas, the row's micro-batch
and global batch, and what rows.yaml assumes per source (dispatcher, ETP, overlap, gradients,
optimizer). pipegrid's iteration time becomes the row's metric (tokens/s/GPU = global batch x
sequence / time / GPUs; MFU by Megatron-LM's FLOP count, rows.yaml) and is compared with the
published value. Writes results.md; exits 1 when the check rows fail (median |error| <= 10%, every
|error| <= 25%).

    experiments/moe/run.py [--pipegrid build/pipegrid] [-j 2] [--max-gpus 256] [--out results.md]
    experiments/moe/run.py --recipe-dispatchers --out results-recipe-dispatchers.md   # flex rows as deepep
    experiments/moe/run.py --fit [--sweeps 3]   # fit the MoE/fp8 efficiencies on the calibration rows
    experiments/moe/run.py --validate            # rows.yaml's schema and split only (ctest)

--fit minimises the sum over calibration rows of ln(pipegrid / published)^2 by coordinate descent in
ln(efficiency) (golden-section search over [0.05, 1] per parameter, values rounded to 3 digits),
over the experts' grouped-GEMM efficiency per device and precision, which no dense validation uses
(FIT_PARAMETERS); it writes fit.yaml (the values, each calibration row before and after).
`--with-fit fit.yaml` replays with them as device overrides; copied into topologies/devices.yaml (and
rebuilt), run.py reports with them as the catalog (README.md says why they are not there).
"""
import argparse
import concurrent.futures
import hashlib
import json
import math
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

# The DGX presets' figures (topologies/clusters/dgx-h100-8.yaml, dgx-b200-8.yaml, dgx-b300-8.yaml, the
# gb200-nvl72 and gb300-nvl72 presets).
SYSTEMS = {"DGX-H100": ("h100", "450GBps"), "DGX-B200": ("b200", "900GBps"), "DGX-GB200": ("gb200", "900GBps"),
           "DGX-B300": ("b300", "900GBps"), "DGX-GB300": ("gb300", "900GBps")}
NVL72 = ("DGX-GB200", "DGX-GB300")  # NVL72 racks: NVLink domains are the launcher's Slurm segments
PF_PEAK = 989.5e12  # the Parallel Folding paper's "peak half-precision throughput of 989.5 TFLOP/s"
# What the fit may move: the MoE experts' grouped GEMMs, per device and precision (fp8: the fp8
# trainings' expert GEMMs). The dense bf16 figures are fitted on the dense validation and stay; the
# fp8 dense GEMM stays at DeepGEMM's published figure (0.68): with one to four calibration rows per
# device and precision, all of one or two models, the fp8 gemm and grouped-gemm figures cannot be told
# apart.
FIT_PARAMETERS = [("h100", "bf16", "grouped-gemm"), ("h100", "fp8", "grouped-gemm"),
                  ("b200", "bf16", "grouped-gemm"), ("b200", "fp8", "grouped-gemm")]
# With --fit-dispatch, the host's time per kernel launch (kernel_dispatch, in us) per device too: the
# rows' stack (Megatron-Core and Transformer Engine in eager mode) against the catalog's PyTorch
# eager torch.nn.Linear figure. Rows run under a full-iteration CUDA graph do not use it.
DISPATCH = "kernel_dispatch_us"
DISPATCH_PARAMETERS = [("h100", "*", DISPATCH), ("b200", "*", DISPATCH), ("gb200", "*", DISPATCH)]
DISPATCH_RANGE = (5.0, 400.0)
# The host's time per expert GEMM of Transformer Engine's grouped linear (kernel_dispatch's grouped-gemm
# class), per host CPU: the DGX H100's, H200's and B200's Xeons ("xeon"), the GB200's Grace:
# --fit-grouped-dispatch.
GROUPED_DISPATCH = "grouped_gemm_dispatch_us"
GROUPED_DISPATCH_PARAMETERS = [("xeon", "*", GROUPED_DISPATCH), ("gb200", "*", GROUPED_DISPATCH)]
# --fit-grouped-dispatch-by-precision: the same host figure per host CPU and training precision (a
# what-if): Transformer Engine's grouped linear quantizes each expert's input in an fp8 training
# (per-tensor scales, or MXFP8's 32-element blocks) and not in bf16, so its host work per expert may
# differ by recipe. The precisions the eager rows run on each host.
GROUPED_DISPATCH_BY_PRECISION = [("xeon", "fp8", GROUPED_DISPATCH), ("xeon", "mxfp8", GROUPED_DISPATCH),
                                 ("xeon", "amp-bf16", GROUPED_DISPATCH), ("gb200", "mxfp8", GROUPED_DISPATCH),
                                 ("gb200", "amp-bf16", GROUPED_DISPATCH)]
HOSTS = {"xeon": ("h100", "h200", "b200", "b300")}
HOST_PARAMETERS = (DISPATCH, GROUPED_DISPATCH)
KERNEL_CLASSES = ["attention", "conv", "elementwise", "gather", "gemm", "grouped-gemm", "norm", "recurrent"]
REQUIRED = ["id", "source", "release", "table", "quote", "model", "system", "gpu", "gpus", "printed_precision",
            "precision", "tp", "pp", "ep", "etp", "cp", "vp", "mbs", "gbs", "seq", "metric", "value", "split"]
# Zoo parameters that differ from Megatron's run of the model (none: every row runs the zoo shape).
MODELS = {"qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "deepseek-v3", "mixtral-8x22b"}


def load_rows(path=os.path.join(HERE, "rows.yaml")):
    return yaml.safe_load(open(path))["rows"]


def validate(rows):
    """Problems with rows.yaml (empty: none): required fields, quotes, split, arithmetic."""
    problems, ids = [], set()
    for r in rows:
        rid = r.get("id", "?")
        problems += [f"{rid}: no `{k}`" for k in REQUIRED if k not in r]
        if problems:
            continue
        if rid in ids:
            problems.append(f"{rid}: duplicate id")
        ids.add(rid)
        if not str(r["quote"]).strip() or any(not str(s.get("quote", "")).strip() for s in r.get("same_config", [])):
            problems.append(f"{rid}: empty quote")
        if r["split"] not in ("calibration", "check"):
            problems.append(f"{rid}: split {r['split']!r}")
        if r["system"] not in SYSTEMS or SYSTEMS[r["system"]][0] != r["gpu"] or r["model"] not in MODELS:
            problems.append(f"{rid}: unknown system, gpu or model")
        if r["cp"] != 1 or r["gpus"] % (r["tp"] * r["pp"]) or r["gpus"] % 8:
            problems.append(f"{rid}: CP > 1, or GPUs not whole nodes of TP x PP groups")
        elif r["gbs"] % (replicas(r) * micro_batch(r)):
            problems.append(f"{rid}: GBS {r['gbs']} not a multiple of d x MBS")
        if r["metric"] == "tokens_per_s_per_gpu" and str(r["value"]) not in r["quote"]:
            problems.append(f"{rid}: value {r['value']} not in its quote")
        if r["metric"] == "mfu" and f"{100 * r['value']:.1f}%" not in r["quote"]:
            problems.append(f"{rid}: MFU {r['value']} not in its quote")
    return problems


def nvlink_domain(r):
    """GPUs per NVLink domain: a DGX node's 8, or on DGX-GB200 and DGX-GB300 the Slurm segment Megatron-Bridge's
    launcher asks for (scripts/performance/utils/executors.py at 067f987: trays of 4 GPUs, every tray in
    one segment up to 18 trays, else the largest divisor of the tray count up to 18; rows.yaml)."""
    if r["system"] not in NVL72:
        return 8
    trays = r["gpus"] // 4
    return 4 * (trays if trays <= 18 else max(s for s in range(1, 19) if trays % s == 0))


def replicas(r):
    return r["gpus"] // (r["tp"] * r["pp"])


def micro_batch(r):
    return r["mbs"] or 1  # rows.yaml: MBS 1 where not printed (Parallel Folding)


# The recipes' flex dispatchers (rows.yaml: HybridEP for Qwen3-30B on H100, DeepEP for DeepSeek-V3 on
# B200), replayed as pipegrid's `deepep` under --recipe-dispatchers (a what-if: the rows' fixed
# assumption is alltoall). Not applied to the GB200 rows: their EP groups sit inside one NVLink domain
# of 8 or 64 GPUs, where HybridEP sends what the all-to-all sends, less per-device duplicates.
FLEX_DISPATCHER = {("qwen3-30b-a3b", "h100"), ("deepseek-v3", "b200")}
RECIPE_DISPATCHERS = False


# The B300 and GB300 recipes (2026-12-05) that set both EP overlap and a full-iteration CUDA graph: every
# MXFP8 recipe but GPT-OSS's on B300, through its full-iteration helper (qwen/common.py
# _enable_hybridep_full_iteration_mxfp8, deepseek/common.py, gpt_oss/common.py); none in BF16.
ULTRA_FULL_ITERATION = {
    ("qwen3-30b-a3b", "DGX-B300", "mxfp8", 1, 1, None, 8, 8, 512),  # qwen/b300 8gpu_b300_fp8mx
    ("qwen3-235b-a22b", "DGX-B300", "mxfp8", 1, 8, 3, 8, 2, 8192),  # qwen/b300 256gpu_b300_fp8mx
    ("deepseek-v3", "DGX-B300", "mxfp8", 1, 8, 2, 8, 1, 4096),  # deepseek/b300 256gpu_b300_fp8mx
    ("qwen3-30b-a3b", "DGX-GB300", "mxfp8", 1, 1, None, 8, 8, 512),  # qwen/gb300 8gpu_gb300_fp8mx
    ("qwen3-235b-a22b", "DGX-GB300", "mxfp8", 1, 4, 12, 32, 2, 8192),  # qwen/gb300 256gpu_gb300_fp8mx
    ("deepseek-v3", "DGX-GB300", "mxfp8", 1, 2, 8, 32, 1, 4096),  # deepseek/gb300 256gpu_gb300_fp8mx
    ("gpt-oss-120b", "DGX-GB300", "mxfp8", 1, 1, None, 16, 4, 1280),  # gpt_oss/gb300 64gpu_gb300_fp8mx
}


# The configurations whose Megatron-Bridge recipe (src/megatron/bridge/perf_recipes at 067f987, every
# helper it calls followed) sets comm_overlap.overlap_moe_expert_parallel_comm = True:
# (model, system, precision, TP, PP, VP, EP, MBS, GBS). A row gets EP overlap only where its printed
# configuration is one of them (rows.yaml); a configuration no recipe at that commit describes gets none.
RECIPE_EP_OVERLAP = {
    ("qwen3-235b-a22b", "DGX-H100", "fp8", 2, 8, 4, 32, 1, 8192),  # qwen/h100 256gpu_h100_fp8cs
    ("qwen3-30b-a3b", "DGX-B200", "mxfp8", 1, 1, None, 8, 4, 512),  # qwen/b200 8gpu_b200_fp8mx
    ("qwen3-235b-a22b", "DGX-B200", "mxfp8", 1, 8, 3, 8, 1, 8192),  # qwen/b200 256gpu_b200_fp8mx
    ("deepseek-v3", "DGX-B200", "mxfp8", 1, 8, 2, 32, 1, 4096),  # deepseek/b200 256gpu_b200_fp8mx
    ("gpt-oss-120b", "DGX-GB200", "amp-bf16", 1, 1, None, 64, 4, 1280),  # gpt_oss/gb200 64gpu_gb200_bf16
    ("gpt-oss-120b", "DGX-GB200", "mxfp8", 1, 1, None, 64, 4, 1280),  # gpt_oss/gb200 ..._fp8mx (helper)
    ("deepseek-v3", "DGX-GB200", "mxfp8", 1, 4, 4, 64, 1, 4096),  # deepseek/gb200 ..._fp8mx (helper)
    ("qwen3-30b-a3b", "DGX-GB200", "mxfp8", 1, 1, None, 8, 4, 512),  # qwen/gb200 8gpu_gb200_fp8mx (helper)
    ("qwen3-235b-a22b", "DGX-GB200", "mxfp8", 1, 8, 3, 32, 1, 8192),  # qwen/gb200 256gpu_gb200_fp8mx (helper)
} | ULTRA_FULL_ITERATION


# Configurations whose recipe at the commit above captures the whole iteration in one CUDA graph
# (cuda_graph_impl = "full_iteration": perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8,
# deepseek/common.py, gpt_oss/common.py _apply_gpt_oss_120b_full_iter_fp8mx_configs), by the same key.
# The recipes gained it on 2026-06-09/10 (Megatron-Bridge 5f98743d5, 55443cbfb, afb5dd47c), so a row
# runs without host dispatch (`kernel_dispatch: 0`) where its value is of release 26.06 or later;
# every other row pays the catalog's per-launch host time (PyTorch eager; the recipes' partial CUDA
# graph scopes, e.g. attn, moe_router, moe_preprocess, are not modelled: those rows' host time is an
# upper bound).
FULL_ITERATION_CUDA_GRAPH = {
    ("qwen3-235b-a22b", "DGX-B200", "mxfp8", 1, 8, 3, 8, 1, 8192),  # qwen/b200 256gpu_b200_fp8mx
    ("qwen3-235b-a22b", "DGX-GB200", "mxfp8", 1, 8, 3, 32, 1, 2048),  # qwen/gb200 64gpu_gb200_fp8mx
    ("qwen3-235b-a22b", "DGX-GB200", "mxfp8", 1, 8, 3, 32, 1, 8192),  # qwen/gb200 256gpu_gb200_fp8mx
    ("qwen3-30b-a3b", "DGX-GB200", "mxfp8", 1, 1, None, 8, 4, 512),  # qwen/gb200 8gpu_gb200_fp8mx
    ("deepseek-v3", "DGX-GB200", "mxfp8", 1, 4, 4, 64, 1, 4096),  # deepseek/gb200 256gpu_gb200_fp8mx
    ("gpt-oss-120b", "DGX-GB200", "mxfp8", 1, 1, None, 64, 4, 1280),  # gpt_oss/gb200 64gpu_gb200_fp8mx
} | ULTRA_FULL_ITERATION


def release(r):
    """The row's release as a tuple of numbers: '26.04.01' -> (26, 4, 1)."""
    return tuple(int(x) for x in str(r["release"]).split("."))


def full_iteration_cuda_graph(r):
    """The row's run captured the whole iteration in a CUDA graph: its recipe does, and its release
    is 26.06 or later (FULL_ITERATION_CUDA_GRAPH)."""
    if r["source"] != "megatron-bridge" or recipe_key(r) not in FULL_ITERATION_CUDA_GRAPH:
        return False
    return release(r) >= (26, 6)


# The full-iteration recipes also run the experts through Transformer Engine's op fuser
# (use_transformer_engine_op_fuser beside the full-iteration graph: perf_recipes/gpt_oss/common.py
# _apply_gpt_oss_120b_full_iter_fp8mx_configs, qwen/common.py _enable_hybridep_full_iteration_mxfp8,
# deepseek/common.py, Megatron-Bridge v0.6.0; scripts/performance/configs/gpt_oss at v0.5.0;
# Megatron-Core core_v0.18's fused grouped MLP): GPT-OSS's fc2 bias and clamped GLU inside its kernels,
# and in MXFP8 on Blackwell its fused CuTe grouped MLP (TE ops/fused/grouped_mlp.py, SwiGLU and
# ScaledClampedQGeGLU) quantizes each grouped GEMM's input in one kernel (`moe: {fused_grouped_mlp:
# true}`). Every such row is MXFP8.
def fused_grouped_mlp(r):
    return full_iteration_cuda_graph(r)


def recipe_key(r):
    return (r["model"], r["system"], r["precision"], r["tp"], r["pp"], r["vp"], r["ep"], r["mbs"], r["gbs"])


def assumed(r):
    """rows.yaml's per-source assumptions for what the row does not print."""
    if r["source"] == "parallel-folding":
        return {"etp": r["etp"] or r["tp"], "overlap": False, "gradient_reduce": "fp32",
                "capacity_factor": r.get("capacity_factor"), "dispatcher": "alltoall"}
    # Megatron-Bridge: ETP 1; EP overlap where the configuration's recipe sets it; bf16 gradients.
    overlap = recipe_key(r) in RECIPE_EP_OVERLAP
    flex = RECIPE_DISPATCHERS and (r["model"], r["gpu"]) in FLEX_DISPATCHER
    return {"etp": r["etp"] or 1, "overlap": overlap, "gradient_reduce": "bf16", "capacity_factor": None,
            "dispatcher": "deepep" if flex else "alltoall"}


def recompute_modules(r):
    """The recipes' module recomputation (rows.yaml; Megatron-Bridge perf_recipes at 067f987):
    GPT-OSS [layernorm, moe_act] (gpt_oss/h100, b200, gb200 in BF16; none in GB200's MXFP8, none on B300 and
    GB300), DeepSeek-V3 on B200 [mla_up_proj], with mlp at EP 32 (the MXFP8 PP8 VP2 EP32 recipe), on GB200
    and B300 [mla_up_proj], on GB300 [moe_act] in BF16 and none in MXFP8; none for Qwen3 and the paper's rows."""
    if r["source"] != "megatron-bridge":
        return None
    if r["model"] == "gpt-oss-120b" and r["gpu"] in ("b300", "gb300"):
        return None  # gpt_oss/b300, gb300: recompute_granularity and modules None
    if r["model"] == "deepseek-v3" and r["gpu"] == "b300":
        return ["mla_up_proj"]  # deepseek/b300's BF16, FP8-CS and MXFP8 recipes
    if r["model"] == "deepseek-v3" and r["gpu"] == "gb300":
        return ["moe_act"] if r["precision"] == "amp-bf16" else None  # deepseek/gb300 bf16; fp8mx clears it
    if r["model"] == "gpt-oss-120b":
        # GB200's MXFP8 recipe clears them under its full-iteration CUDA graph (gpt_oss/gb200).
        return None if (r["gpu"], r["precision"]) == ("gb200", "mxfp8") else ["layernorm", "moe_act"]
    if r["model"] == "deepseek-v3" and r["gpu"] == "b200":
        return ["mla_up_proj", "mlp"] if r["ep"] == 32 else ["mla_up_proj"]
    if r["model"] == "deepseek-v3" and r["gpu"] == "gb200":
        return ["mla_up_proj"]  # deepseek/gb200's BF16 and MXFP8 recipes
    return None


# Transformer blocks per zoo model (pipegrid workload show): Megatron's split needs them to be a
# multiple of PP x VP.
BLOCKS = {"qwen3-30b-a3b": 48, "qwen3-235b-a22b": 94, "gpt-oss-120b": 36, "deepseek-v3": 61, "mixtral-8x22b": 56}


# Megatron-Bridge's DeepSeek-V3 pipeline layouts by (PP, VP), in Megatron-Core's --pipeline-model-
# parallel-layout notation (docs/3d-parallelism.md): set_deepseek_v3_pipeline_model_parallel_layout's
# map, the same from v0.2.0 (2025-11-26) through 067f987 (2026-08-22), the last stage taking one `m` per
# MTP module before the loss; (2, 8) is the GB300 configurations' own pp_layout, "Et*4|(t*4|)*14tmL".
DEEPSEEK_V3_LAYOUTS = {(4, 1): "Et*16|t*16|t*16|t*13{}L", (8, 1): "Et*8|(t*8|)*6t*5{}L",
                       (4, 2): "Et*8|(t*8|)*6t*5{}L", (16, 1): "Et*4|(t*4|)*14t{}L",
                       (8, 2): "Et*4|(t*4|)*14t{}L", (4, 4): "Et*4|(t*4|)*14t{}L", (2, 8): "Et*4|(t*4|)*14t{}L"}


def recipe_layout(r):
    """The row's pipeline layout where its recipe's is known (DeepSeek-V3 at a (PP, VP) of the map above),
    else None."""
    layout = DEEPSEEK_V3_LAYOUTS.get((r["pp"], r["vp"] or 1)) if r["model"] == "deepseek-v3" else None
    return layout.format("m" * mtp_layers(r)) if layout else None


def accounted_split(r):
    """Whether the row's recipe counts the embedding and the loss as one block each in an even split
    (Megatron-Core's --account-for-embedding/loss-in-pipeline-split): Qwen3-235B-A22B's pre-training
    recipe sets both in every release here (recipes/qwen/qwen3_moe.py, qwen3_235b_a22b_pretrain_config,
    v0.2.0 through 067f987), 94 + 2 = 96 slots, which every row's PP x VP divides."""
    return r["model"] == "qwen3-235b-a22b" and (BLOCKS[r["model"]] + 2) % (r["pp"] * (r["vp"] or 1)) == 0


def partitioner(r):
    """Megatron's split: the recipe's layout or its embedding and loss accounting where known
    (recipe_layout, accounted_split), equal runs of blocks where the blocks divide the PP x VP stages;
    otherwise `balanced` (contiguous stages, the slowest stage's compute minimised), standing for the
    uneven split Megatron-Bridge runs there (DeepSeek-V3 at a (PP, VP) outside its layout map)."""
    if recipe_layout(r) or accounted_split(r) or BLOCKS[r["model"]] % (r["pp"] * (r["vp"] or 1)) == 0:
        return "megatron"
    return "balanced"


def device(r, efficiencies):
    """The row's GPU: the catalog's, with those of `efficiencies` {(gpu, precision, class): value}
    that the row runs at overriding (only those, so that the replay cache keys on what matters), and
    no host dispatch where the row ran under a full-iteration CUDA graph."""
    mine = {(p, c): v for (g, p, c), v in (efficiencies or {}).items() if uses(r, (g, p, c))}
    if len([c for (p, c) in mine if c == GROUPED_DISPATCH]) > 1:
        raise SystemExit(f"{r['id']}: more than one grouped-gemm host figure applies")
    graph = full_iteration_cuda_graph(r)
    dispatch = mine.pop(("*", DISPATCH), None)
    grouped = next((mine.pop(k) for k in list(mine) if k[1] == GROUPED_DISPATCH), None)
    if not mine and not graph and dispatch is None and grouped is None:
        return r["gpu"]
    spec = {"model": r["gpu"]}
    if graph:
        spec["kernel_dispatch"] = "0us"
    elif grouped is not None and dispatch is not None:
        spec["kernel_dispatch"] = {c: f"{dispatch}us" for c in KERNEL_CLASSES} | {"grouped-gemm": f"{grouped}us"}
    elif grouped is not None:
        spec["kernel_dispatch"] = {"grouped-gemm": f"{grouped}us"}
    elif dispatch is not None:
        spec["kernel_dispatch"] = f"{dispatch}us"
    table = {}
    for (p, c), v in sorted(mine.items()):
        table.setdefault(p, {})[c] = v
    if table:
        spec["compute_efficiency"] = table
    return spec


def mtp_layers(r):
    """The multi-token-prediction modules a row ran with (rows.yaml, "Assumptions"): what its quote prints
    ("w/ MTP" 1, "w/o MTP" 0: Megatron-Bridge's DeepSeekV3 rows of 25.11); where it prints neither, the
    recipe's: a DeepSeek-V3 row of 26.02 or later 1 (every DeepSeek-V3 performance config from
    Megatron-Bridge v0.3.0, 2026-02-26, the tag nearest 26.02, on builds on the pre-training recipe,
    whose mtp_num_layers is 1, and its pipeline layouts carry the module, `m`), any other row 0."""
    quote = " ".join(str(r["quote"]).split())
    if "w/ MTP" in quote or "w/o MTP" in quote:
        return 1 if "w/ MTP" in quote else 0
    return 1 if r["model"] == "deepseek-v3" and release(r) >= (26, 2) else 0


def experiment(r, efficiencies=None):
    a, d, b = assumed(r), replicas(r), micro_batch(r)
    strategy = {"partitioner": partitioner(r), "schedule": "interleaved-1f1b" if r["vp"] else "1f1b",
                "stages": r["pp"], "replicas": d, "allreduce": "multi-ring", "tensor_parallel": r["tp"],
                "sequence_parallel": r["tp"] > 1, "dp_overlap": True, "gradient_reduce": a["gradient_reduce"],
                "expert_parallel": r["ep"], "expert_tensor_parallel": a["etp"],
                "moe": {"dispatcher": a["dispatcher"], "overlap": a["overlap"]},
                "micro_batch_size": b, "micro_batches": r["gbs"] // (d * b)}
    if r["vp"]:
        strategy["chunks"] = r["vp"]
    if recipe_layout(r):
        strategy["layout"] = recipe_layout(r)
    if accounted_split(r):
        strategy["account_for_embedding"] = strategy["account_for_loss"] = True
    if a["capacity_factor"]:
        strategy["moe"]["capacity_factor"] = a["capacity_factor"]
    if fused_grouped_mlp(r):
        strategy["moe"]["fused_grouped_mlp"] = True
    gpu, nvlink = SYSTEMS[r["system"]]
    memory = {"optimizer": "mixed-adam", "recompute": "none", "zero": 1}
    if r["model"] == "deepseek-v3" and r["source"] == "megatron-bridge":
        # Megatron-Bridge's DeepSeek-V3 recipe (src/megatron/bridge/recipes/deepseek/deepseek_v3.py,
        # v0.2.0 to v0.5.0): the precision-aware optimizer with AdamW's moments in bf16.
        memory["optimizer_moments"] = "bf16"
    if r["source"] == "megatron-bridge" and r["precision"] == "amp-bf16":
        # Megatron-Bridge's performance scripts turn the precision-aware optimizer on for bf16 runs
        # (scripts/performance/utils/helpers.py at v0.2.0, overrides.py at v0.4.0), and Megatron-Core
        # passes Transformer Engine's FusedAdam store_param_remainders (default true, TE >= 2.1).
        memory["master_weights"] = "remainders"
    modules = recompute_modules(r)
    if modules:
        memory.update(recompute="selective", recompute_modules=modules)
    workload = {"model": r["model"], "sequence": r["seq"], "precision": r["precision"]}
    if mtp_layers(r):
        workload["mtp_layers"] = mtp_layers(r)
    return {"name": r["id"],
            "workload": workload,
            "cluster": {"kind": "dgx", "nodes": r["gpus"] // nvlink_domain(r), "gpus_per_node": nvlink_domain(r),
                        "gpu": device(r, efficiencies),
                        "nvlink": {"bandwidth": nvlink, "latency": "0.5us"},
                        "infiniband": {"bandwidth": "400Gbps", "latency": "1us"},
                        "fabric": "rail" if r["gpus"] > nvlink_domain(r) else "switch"},
            "strategy": strategy,
            "memory": memory}


_CACHE = {}


def simulate(pipegrid, exp):
    """`pipegrid run --json` of `exp`: {"time", "feasible", "breakdown"} or {"error"}; cached by content."""
    text = json.dumps(exp, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()
    if key in _CACHE:
        return _CACHE[key]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, exp["name"] + ".yaml")
        with open(path, "w") as f:
            f.write(text)
        p = subprocess.run([pipegrid, "run", path, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        out = {"error": ((p.stderr or p.stdout).strip().splitlines() or ["pipegrid failed"])[-1]}
    else:
        j = json.loads(p.stdout)
        out = {"time": j["iteration_time_s"], "feasible": j["feasible"], "breakdown": j.get("breakdown", {}),
               "host": j.get("host_bound_fraction", 0.0)}
    _CACHE[key] = out
    return out


# Megatron-LM's model FLOPs (megatron/training/training.py at 8a5521ac4226, 2025-02), the zoo shapes.
SHAPES = {"mixtral-8x22b": dict(layers=56, hidden=6144, heads=48, groups=8, kv_channels=128, ffn=16384, topk=2,
                                vocab=32000, swiglu=True)}


def megatron_flops(model, batch, seq):
    m = SHAPES[model]
    L, h = m["layers"], m["hidden"]
    q_ratio = m["kv_channels"] * m["heads"] / h
    attention = (1 + m["groups"] / m["heads"] + seq / h) * q_ratio
    mlp = m["ffn"] / h * m["topk"] * (1.5 if m["swiglu"] else 1)
    return 12 * batch * seq * L * h * h * (attention + mlp + m["vocab"] / (2 * L * h))


def predicted(r, time_s):
    """The row's metric from pipegrid's iteration time."""
    if r["metric"] == "tokens_per_s_per_gpu":
        return r["gbs"] * r["seq"] / time_s / r["gpus"]
    return megatron_flops(r["model"], r["gbs"], r["seq"]) / (time_s * r["gpus"] * PF_PEAK)


def run_rows(pipegrid, rows, jobs, max_gpus, efficiencies=None):
    """{id: result with "predicted" and "error" (pipegrid / published - 1), or "skipped" / "failed"}."""
    def one(r):
        if r["gpus"] > max_gpus:
            return {"skipped": f"not simulated: {r['gpus']} GPUs > --max-gpus {max_gpus}"}
        out = dict(simulate(pipegrid, experiment(r, efficiencies)))
        if "error" in out:
            return {"failed": out["error"]}
        out["predicted"] = predicted(r, out["time"])
        out["error"] = out["predicted"] / r["value"] - 1
        return out
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return dict(zip([r["id"] for r in rows], pool.map(one, rows)))


def spread(r):
    """The published data's own spread for the configuration: (n, min, max) over its releases."""
    values = [r["value"]] + [s["value"] for s in r.get("same_config", [])]
    return len(values), min(values), max(values)


def fmt_value(r, v):
    return f"{100 * v:.1f}% MFU" if r["metric"] == "mfu" else f"{v:,.0f}"


def config(r):
    a = assumed(r)
    parts = [f"{r['gpus']} {r['gpu'].upper()}", r["precision"], f"TP{r['tp']} PP{r['pp']}"]
    parts += [f"VP{r['vp']}"] if r["vp"] else []
    parts += [f"EP{r['ep']} ETP{a['etp']}", f"MBS{micro_batch(r)}{'' if r['mbs'] else '*'} GBS{r['gbs']}"]
    parts += ["a2a overlap"] if a["overlap"] else []
    parts += [a["dispatcher"]] if a["dispatcher"] != "alltoall" else []
    parts += ["full-iteration CUDA graph"] if full_iteration_cuda_graph(r) else []
    parts += ["TE op fuser"] if fused_grouped_mlp(r) else []
    return ", ".join(parts)


def table_lines(rows, results, split):
    mine = [r for r in rows if r["split"] == split]
    lines = ["| row | source | configuration | published | releases (n, min-max) | pipegrid | host share | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in mine:
        x, (n, lo, hi) = results[r["id"]], spread(r)
        rel = f"{n}, {lo:,}-{hi:,} ({100 * (hi - lo) / statistics.median([lo, hi]):.0f}%)" if n > 1 else "1"
        if "predicted" in x:
            got = fmt_value(r, x["predicted"]) + ("" if x["feasible"] else " (over memory)")
            err, host = f"{100 * x['error']:+.1f}%", f"{100 * x.get('host', 0):.1f}%"
        else:
            got, err, host = x.get("skipped") or "error: " + x["failed"], "-", "-"
        lines.append(f"| {r['id']} | {r['source']} {r['release']} | {config(r)} | {fmt_value(r, r['value'])} | "
                     f"{rel} | {got} | {host} | {err} |")
    return lines


def host_note(rows, results):
    """The host share (what pipegrid's host adds to the stages' compute, `pipegrid run`'s `host bound`)
    against the error, over every replayed row of both sets: does pipegrid miss more where its own
    host matters more?"""
    pairs = [(results[r["id"]].get("host", 0.0), results[r["id"]]["error"]) for r in rows
             if "error" in results[r["id"]]]
    if not pairs:
        return ""
    from scipy.stats import spearmanr  # python3-scipy (tools/setup --all); only this note needs it
    rho = spearmanr([h for h, _ in pairs], [e for _, e in pairs]).statistic
    return f"host share against error, every replayed row ({len(pairs)}): Spearman's rho {rho:+.2f}"


def summary(rows, results, split):
    """(n, median |error|, max |error|, not replayed) over the split's rows."""
    errs = [abs(results[r["id"]]["error"]) for r in rows if r["split"] == split and "error" in results[r["id"]]]
    missing = [r["id"] for r in rows if r["split"] == split and "error" not in results[r["id"]]]
    if not errs:
        return 0, float("nan"), float("nan"), missing
    return len(errs), statistics.median(errs), max(errs), missing


def verdict(rows, results):
    n, med, mx, missing = summary(rows, results, "check")
    ok = n > 0 and not missing and med <= 0.10 and mx <= 0.25
    text = (f"check rows: {n} replayed, median |error| {100 * med:.1f}%, max {100 * mx:.1f}%"
            + (f", {len(missing)} not replayed ({', '.join(missing)})" if missing else "")
            + (": PASS" if ok else ": FAIL (median <= 10% and every row within 25% required)"))
    return ok, text


def write_results(path, rows, results, args):
    ok, text = verdict(rows, results)
    n, med, mx, _ = summary(rows, results, "calibration")
    lines = ["# MoE training throughput: published against pipegrid", "",
             "Written by `experiments/moe/run.py` (rows, sources, quotes and assumptions: rows.yaml; README.md). "
             "error = pipegrid / published - 1. MBS marked * is assumed (not printed). \"releases\": the same "
             "configuration in other releases of the page (their spread, (max - min) / mid). Catalog: "
             + ("topologies/devices.yaml as built into the binary." if not args.with_fit else
                f"the binary's, with {os.path.relpath(args.with_fit, HERE)}'s values as device overrides (a what-if).")
             + (" Dispatchers as the recipes set them (--recipe-dispatchers, a what-if): deepep where the recipe "
                "runs a flex dispatcher (HybridEP or DeepEP)." if RECIPE_DISPATCHERS else "")
             + " host share: what pipegrid's host adds to the stages' compute per micro-batch beyond the "
             "devices' own kernel time (`pipegrid run`'s `host bound`, docs/cost-model.md).", "",
             "## Check rows", ""] + table_lines(rows, results, "check") + ["", text, "",
             "## Calibration rows", ""] + table_lines(rows, results, "calibration") + [
             "", f"calibration rows: {n} replayed, median |error| {100 * med:.1f}%, max {100 * mx:.1f}%", "",
             "- " + host_note(rows, results), ""]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return ok, text


MODEL_NAMES = {"qwen3-30b-a3b": "Qwen3-30B-A3B", "qwen3-235b-a22b": "Qwen3-235B-A22B", "gpt-oss-120b": "GPT-OSS-120B",
               "deepseek-v3": "DeepSeek-V3", "mixtral-8x22b": "Mixtral-8x22B"}


def row_name(r):
    """A check row as `pipegrid run` names it: model, GPUs, precision, layout and release."""
    layout = f"TP{r['tp']} PP{r['pp']}" + (f" VP{r['vp']}" if r["vp"] else "") + f" EP{r['ep']}"
    return (f"{MODEL_NAMES[r['model']]} on {r['gpus']} {r['gpu'].upper()}s, {r['precision']}, {layout} "
            f"({r['source']} {r['release']})")


def write_accuracy(path, rows, results):
    """accuracy.yaml: the check rows by GPU and precision, which `pipegrid run` prints for an MoE
    workload on those catalog GPUs (pgx.write_accuracy)."""
    pgx.write_accuracy(path, [
        "Written by experiments/moe/run.py (its last full run, results.md): the MoE check rows (published",
        "training runs, never fitted on) by GPU and precision, |error| = |pipegrid / published - 1|;",
        "faster: rows pipegrid predicts faster than published; spread: the releases of one configuration",
        "(rows.yaml's same_config), max / min. `pipegrid run` prints the entry of each catalog GPU and",
        "precision an MoE workload uses; tests/tools/moe_rows.py checks it against results.md."],
        rows, {i: x["error"] for i, x in results.items() if "error" in x}, row_name)


def objective(rows, results):
    return sum(math.log(1 + results[r["id"]]["error"]) ** 2 for r in rows if "error" in results[r["id"]])


def golden(f, lo, hi, steps=10):
    """Minimum of f over [lo, hi] in ln space by golden-section search (f cached by the caller)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = math.log(lo), math.log(hi)
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(steps):
        if f(round(math.exp(c), 3)) < f(round(math.exp(d), 3)):
            b, d = d, c
            c = b - g * (b - a)
        else:
            a, c = c, d
            d = a + g * (b - a)
    return round(math.exp((a + b) / 2), 3)


def uses(r, parameter):
    gpu, precision, what = parameter
    if what in HOST_PARAMETERS:
        return (r["gpu"] in HOSTS.get(gpu, (gpu,)) and not full_iteration_cuda_graph(r)
                and precision in ("*", r["precision"]))
    fp8 = r["precision"] in ("fp8", "fp8-blockwise", "mxfp8")
    return r["gpu"] == gpu and (precision == "fp8") == fp8


def fit(args, rows, start):
    """Coordinate descent over FIT_PARAMETERS on the calibration rows; returns (values, before, after)."""
    cal = [r for r in rows if r["split"] == "calibration" and r["gpus"] <= args.max_gpus]
    values = dict(start)
    before = run_rows(args.pipegrid, cal, args.j, args.max_gpus, values)
    best = objective(cal, before)
    for sweep in range(args.sweeps):
        gained = 0.0
        for p in values:
            mine = [r for r in cal if uses(r, p)]
            if not mine:
                continue
            def f(v):
                return objective(mine, run_rows(args.pipegrid, mine, args.j, args.max_gpus, {**values, p: v}))
            v = golden(f, *(DISPATCH_RANGE if p[2] in HOST_PARAMETERS else (0.05, 1.0)))
            if f(v) < f(values[p]):
                values[p] = v
            new = objective(cal, run_rows(args.pipegrid, cal, args.j, args.max_gpus, values))
            gained += best - new
            best = new
            print(f"sweep {sweep + 1}: {p} = {values[p]} (objective {best:.4f})", file=sys.stderr, flush=True)
        if gained < 1e-4:
            break
    return values, before, run_rows(args.pipegrid, cal, args.j, args.max_gpus, values)


def catalog_start(pipegrid, dispatch=False, grouped=None):
    """The catalog's current values of FIT_PARAMETERS (grouped_gemm falls back to gemm), and of
    DISPATCH_PARAMETERS (in us) when `dispatch`, and of the grouped host parameters `grouped` (a list)."""
    out = {}
    params = FIT_PARAMETERS + (DISPATCH_PARAMETERS if dispatch else []) + (grouped or [])
    for gpu in sorted({g for g, _, _ in params}):
        shown = json.loads(subprocess.run([pipegrid, "device", "show", HOSTS.get(gpu, (gpu,))[0], "--json"],
                                          capture_output=True,
                                          text=True, check=True).stdout)
        for g, p, c in params:
            if g == gpu:
                out[(g, p, c)] = (round(1e6 * shown["kernel_dispatch_s"], 3) if c == DISPATCH else
                                  round(1e6 * shown["kernel_dispatch_class_s"]["grouped-gemm"], 3)
                                  if c == GROUPED_DISPATCH else
                                  shown["compute_efficiency"][p].get(c) or shown["compute_efficiency"][p]["gemm"])
    return out


def load_fit(path):
    """A fit file's values as {(gpu, precision, class): efficiency}, or {(gpu, "*", kernel_dispatch_us): us}."""
    return {tuple(k.split()): v for k, v in yaml.safe_load(open(path))["values"].items()}


def write_fit(path, values, before, after, rows, how="--fit"):
    doc = {"fitted_by": f"experiments/moe/run.py {how} (calibration rows of experiments/moe/rows.yaml)",
           "values": {f"{g} {p} {c}": v for (g, p, c), v in values.items()},
           "calibration_rows": {r["id"]: {"before": round(1 + before[r["id"]]["error"], 4) if "error" in before[r["id"]] else None,
                                          "after": round(1 + after[r["id"]]["error"], 4) if "error" in after[r["id"]] else None}
                                for r in rows if r["id"] in after}}
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipegrid", default=None, help="the pipegrid binary (default build/pipegrid)")
    ap.add_argument("-j", type=int, default=2, help="pipegrid processes in parallel")
    ap.add_argument("--max-gpus", type=int, default=256, help="rows on more GPUs are not simulated")
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--validate", action="store_true", help="check rows.yaml only")
    ap.add_argument("--fit", action="store_true", help="fit FIT_PARAMETERS on the calibration rows (fit.yaml)")
    ap.add_argument("--fit-dispatch", action="store_true",
                    help="fit DISPATCH_PARAMETERS alone (the host's time per launch per device; the grouped GEMMs "
                         "at the catalog's) on the calibration rows (fit-dispatch.yaml)")
    ap.add_argument("--fit-grouped-dispatch-by-precision", action="store_true",
                    help="fit GROUPED_DISPATCH_BY_PRECISION alone (the same host figure per host CPU and training "
                         "precision, a what-if) on the calibration rows (fit-grouped-dispatch-by-precision.yaml)")
    ap.add_argument("--fit-grouped-dispatch", action="store_true",
                    help="fit GROUPED_DISPATCH_PARAMETERS alone (the host's time per expert GEMM of the grouped "
                         "linear, per device) on the calibration rows (fit-grouped-dispatch.yaml)")
    ap.add_argument("--fit-without-model", metavar="MODEL",
                    help="leave MODEL's calibration rows out of the fit (a what-if; the check replays every row)")
    ap.add_argument("--fit-out", metavar="YAML", help="where the fit is written (default: by the fit's kind)")
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--rows", nargs="*", help="only these row ids")
    ap.add_argument("--recipe-dispatchers", action="store_true",
                    help="replay the rows whose recipes run a flex dispatcher with deepep (a what-if)")
    ap.add_argument("--with-fit", metavar="FIT_YAML",
                    help="apply a fit's values as device overrides (a what-if before they enter the catalog)")
    args = ap.parse_args()
    global RECIPE_DISPATCHERS
    RECIPE_DISPATCHERS = args.recipe_dispatchers
    rows = load_rows()
    problems = validate(rows)
    if problems or args.validate:
        print("\n".join(problems) or f"rows.yaml: {len(rows)} rows, valid")
        return 1 if problems else 0
    if args.rows:
        rows = [r for r in rows if r["id"] in args.rows]
    args.pipegrid = args.pipegrid or pgx.binary()
    by_precision = args.fit_grouped_dispatch_by_precision
    if args.fit or args.fit_dispatch or args.fit_grouped_dispatch or by_precision:
        grouped = (GROUPED_DISPATCH_BY_PRECISION if by_precision else
                   GROUPED_DISPATCH_PARAMETERS if args.fit_grouped_dispatch else None)
        start = catalog_start(args.pipegrid, dispatch=args.fit_dispatch, grouped=grouped)
        host = DISPATCH if args.fit_dispatch else GROUPED_DISPATCH if grouped else None
        if host:
            start = {p: v for p, v in start.items() if p[2] == host}
        fitted = [r for r in rows if r["model"] != args.fit_without_model]
        values, before, after = fit(args, fitted, start)
        how = ("--fit-dispatch" if args.fit_dispatch else "--fit-grouped-dispatch-by-precision" if by_precision
               else "--fit-grouped-dispatch" if host else "--fit")
        if args.fit_without_model:
            how += f" --fit-without-model {args.fit_without_model}"
        write_fit(args.fit_out or os.path.join(HERE, how.split()[0][2:] + ".yaml"), values, before, after, rows,
                  how)
        print(yaml.safe_dump({f"{g} {p} {c}": v for (g, p, c), v in values.items()}))
        return 0
    pgx.check_catalog(args.pipegrid, devices=("h100", "b200", "gb200", "b300", "gb300"))
    overrides = load_fit(args.with_fit) if args.with_fit else None
    results = run_rows(args.pipegrid, rows, args.j, args.max_gpus, overrides)
    ok, text = write_results(args.out, rows, results, args)
    full = not (args.rows or args.with_fit or RECIPE_DISPATCHERS) and all("error" in results[r["id"]] for r in rows)
    if full and os.path.abspath(args.out) == os.path.join(HERE, "results.md"):
        write_accuracy(os.path.join(HERE, "accuracy.yaml"), rows, results)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
