#!/usr/bin/env python3
"""Reads, for every Megatron-Bridge row of rows.yaml and every release it was printed in
(`same_config`), the performance recipe of that release: the workload base configurations
(scripts/performance/configs/*/*workload_base_configs.py) at the Megatron-Bridge tag the release's
container ships. It compares the recipe's parallel sizes and batch with the printed configuration and
lists what the recipe sets that the page does not print (flex dispatcher backend, all-to-all overlap,
CUDA graphs, recomputation). Run by hand with a clone of NVIDIA-NeMo/Megatron-Bridge
(tests/tools/audit_recipes_test.py runs it on a hand-made repository, no clone needed):

  experiments/moe/audit_recipes.py --bridge PATH/TO/Megatron-Bridge [--rows rows.yaml] [--out recipes.md]

It reads the base configurations only, not the functions that apply them (which may override a
field: e.g. v0.3.1 sets the dispatcher type in the per-GPU functions), and it does not change any row
or assumption: a mismatch is a finding about the source, written down. Exit status 0 (findings are
not failures), 2 on bad arguments or when --bridge is not a git clone.
"""
import argparse
import ast
import os
import re
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

# The Megatron-Bridge tag of each release's container. Documented (docs/releases/software-versions.md
# at 067f987df: "NeMo Framework 25.11 ... Megatron-Bridge 0.2.0", 26.02 -> 0.3.0, 26.04 -> 0.4.0,
# 26.06 -> 0.5.0). Patch releases, inferred (no document maps them): the tag published just before the
# commit that added the release's table to docs/performance-summary.md: 26.02.01 -> v0.3.1 (tag
# 2026-03-20, table cfeddcd94 2026-03-21), 26.04.01 -> v0.4.1 (2026-05-06; table 17a381f95 2026-05-16;
# v0.4.2 is dated 2026-05-28), 26.06.01 -> v0.5.1 (2026-07-20; table 381d0b825 2026-07-21).
# 26.08 is not audited: its table (4ab94dfad, 2026-08-11) precedes v0.6.0 (2026-08-19), and the recipes
# of that time are functions (src/megatron/bridge/perf_recipes/), which run.py's rules read.
RELEASE_TAGS = {"25.11": ("v0.2.0", "documented"), "26.02": ("v0.3.0", "documented"),
                "26.02.01": ("v0.3.1", "inferred"), "26.04": ("v0.4.0", "documented"),
                "26.04.01": ("v0.4.1", "inferred"), "26.06": ("v0.5.0", "documented"),
                "26.06.01": ("v0.5.1", "inferred")}
# Recipe names: v0.2.x `QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG`, later `..._PRETRAIN_CONFIG_H100_FP8_CS_V1`.
MODEL_PREFIX = {"qwen3-30b-a3b": "QWEN3_30B_A3B", "qwen3-235b-a22b": "QWEN3_235B_A22B",
                "gpt-oss-120b": "GPT_OSS_120B", "deepseek-v3": "DEEPSEEK_V3"}
PRECISION_NAME = {"amp-bf16": "BF16", "fp8": "FP8_CS", "mxfp8": "FP8_MX"}
GPU_NAME = {"h100": "H100", "b200": "B200", "gb200": "GB200"}
# Printed field -> WorkloadBaseConfig field.
COMPARED = [("gpus", "num_gpus"), ("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
            ("vp", "virtual_pipeline_model_parallel_size"), ("ep", "expert_model_parallel_size"),
            ("mbs", "micro_batch_size"), ("gbs", "global_batch_size")]
UNPRINTED = ["moe_flex_dispatcher_backend", "moe_a2a_overlap", "cuda_graph_impl", "cuda_graph_scope",
             "recompute_modules"]
UNKNOWN = object()  # a value the audit cannot read statically


def git(bridge, *args):
    return subprocess.run(["git", "-C", bridge, *args], check=True, capture_output=True, text=True).stdout


def literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return UNKNOWN


def dataclass_defaults(source):
    """WorkloadBaseConfig's field defaults (scripts/performance/utils/utils.py)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "WorkloadBaseConfig":
            return {a.target.id: literal(a.value) if a.value is not None else None
                    for a in node.body if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
    return {}


def configs(source, defaults):
    """Every module-level NAME = WorkloadBaseConfig(...) | replace(OTHER, ...) | OTHER, as a dict."""
    out = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name, v = node.targets[0].id, node.value
        if isinstance(v, ast.Name) and v.id in out:
            out[name] = dict(out[v.id])
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name):
            if v.func.id == "WorkloadBaseConfig":
                base = dict(defaults)
            elif v.func.id == "replace" and v.args and isinstance(v.args[0], ast.Name) and v.args[0].id in out:
                base = dict(out[v.args[0].id])
            else:
                continue
            base.update({k.arg: literal(k.value) for k in v.keywords if k.arg})
            out[name] = base
    return out


def recipe_files(bridge, tag):
    names = git(bridge, "ls-tree", "-r", "--name-only", tag, "scripts/performance").split()
    utils = "scripts/performance/utils/utils.py"
    defaults = dataclass_defaults(git(bridge, "show", f"{tag}:{utils}")) if utils in names else {}
    found = {}
    for path in names:
        if path.endswith("workload_base_configs.py"):
            found.update(configs(git(bridge, "show", f"{tag}:{path}"), defaults))
    return found


def candidates(all_configs, r):
    if r["model"] not in MODEL_PREFIX or r["gpu"] not in GPU_NAME or r["precision"] not in PRECISION_NAME:
        return {}
    pat = re.compile(rf"^{MODEL_PREFIX[r['model']]}_(PRETRAIN_CONFIG_)?{GPU_NAME[r['gpu']]}_"
                     rf"{PRECISION_NAME[r['precision']]}(_BASE_CONFIG|_V\d+)$")
    return {n: c for n, c in sorted(all_configs.items()) if pat.match(n)}


def printed(r, key):
    v = r.get(key)
    return None if key == "vp" and v in (None, 1) else v


def differences(r, c):
    out = []
    for key, field in COMPARED:
        want, got = printed(r, key), c.get(field, UNKNOWN)
        if field == "virtual_pipeline_model_parallel_size" and got == 1:
            got = None
        if got is UNKNOWN:
            out.append(f"{key}: not readable")
        elif want != got:
            out.append(f"{key} {want} printed, {got} in the recipe")
    return out


def show(v):
    if v is UNKNOWN:
        return "(not readable)"
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def audit(bridge, rows):
    """One line per (row, release): the findings, as a list of dicts."""
    cache, lines = {}, []
    for r in rows:
        if r.get("source") != "megatron-bridge":
            continue
        printings = [{"release": r["release"], "value": r["value"]}] + list(r.get("same_config") or [])
        for p in printings:
            line = {"id": r["id"], "release": str(p["release"]), "value": p["value"], "split": r["split"]}
            tag = RELEASE_TAGS.get(line["release"])
            if tag is None:
                line["finding"] = "not audited (no release tag with base configurations; see the header)"
                lines.append(line)
                continue
            line["tag"] = f"{tag[0]} ({tag[1]})"
            if tag[0] not in cache:
                cache[tag[0]] = recipe_files(bridge, tag[0])
            found = candidates(cache[tag[0]], r)
            if not found:
                line["finding"] = "no recipe for this model, GPU and precision at the tag"
            for name, c in found.items():
                d = differences(r, c)
                lines.append(dict(line, recipe=name, finding="matches the printed configuration" if not d
                                  else "; ".join(d), unprinted=", ".join(
                                      f"{k} {show(c.get(k))}" for k in UNPRINTED if c.get(k) not in (None, False))))
            if not found:
                lines.append(line)
    return lines


def write(path, lines, bridge_head):
    with open(path, "w") as f:
        f.write("# Megatron-Bridge rows against their release's performance recipe (generated by audit_recipes.py)\n\n")
        f.write(f"Command: `experiments/moe/audit_recipes.py --bridge PATH` on a clone at {bridge_head}. "
                "For each row of rows.yaml and each release that printed its configuration (the row's own "
                "and its `same_config` lines), the workload base configurations at the release's "
                "Megatron-Bridge tag (audit_recipes.py's RELEASE_TAGS: documented or inferred) whose name "
                "is the row's model, GPU and precision; the printed GPUs, TP, PP, VP, EP, MBS and GBS "
                "against the recipe's, and what the recipe sets beyond them. The base configurations only: "
                "the functions that apply them may override a field. Nothing here changes a row or an "
                "assumption of run.py.\n\n")
        f.write("| row | set | release | tag | published | recipe | against the printed configuration | "
                "the recipe also sets |\n|---|---|---|---|---|---|---|---|\n")
        for x in lines:
            f.write(f"| {x['id']} | {x['split']} | {x['release']} | {x.get('tag', '-')} | {x['value']:,} | "
                    f"{x.get('recipe', '-')} | {x['finding']} | {x.get('unprinted') or '-'} |\n")
        differ = sorted({(x["id"], x["release"]) for x in lines
                         if "recipe" in x and x["finding"] != "matches the printed configuration"})
        matched = {(x["id"], x["release"]) for x in lines if x.get("finding") == "matches the printed configuration"}
        f.write(f"\n- printings audited: {len({(x['id'], x['release']) for x in lines if 'tag' in x})}; "
                f"with a recipe matching the printed configuration: {len(matched)}\n")
        only_differ = [k for k in differ if k not in matched]
        f.write(f"- printings whose every recipe differs from the printed configuration: {len(only_differ)}"
                + ("".join(f"\n  - {i} ({rel})" for i, rel in only_differ)) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bridge", required=True, help="a clone of NVIDIA-NeMo/Megatron-Bridge (git, with tags)")
    ap.add_argument("--rows", default=os.path.join(HERE, "rows.yaml"))
    ap.add_argument("--out", default=os.path.join(HERE, "recipes.md"))
    args = ap.parse_args()
    try:
        head = git(args.bridge, "rev-parse", "--short=9", "HEAD").strip()
    except (subprocess.CalledProcessError, FileNotFoundError, NotADirectoryError):
        print(f"audit_recipes.py: --bridge {args.bridge}: not a git clone of Megatron-Bridge", file=sys.stderr)
        return 2
    with open(args.rows) as f:
        rows = yaml.safe_load(f)["rows"]
    lines = audit(args.bridge, rows)
    if os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
    write(args.out, lines, head)
    print(f"wrote {args.out}: {len(lines)} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
