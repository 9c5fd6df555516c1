#!/usr/bin/env python3
"""experiments/moe/audit_recipes.py against a hand-made Megatron-Bridge: a git repository with two
tags in the layouts of v0.2.0 and v0.3.0 (WorkloadBaseConfig's defaults in utils.py; base configs
built by the constructor, by `replace` and by aliasing), and rows whose agreement with those
recipes is known by hand. A row that matches is reported as matching, one whose printed EP and PP
differ from its release's recipe is reported with both values, an alias resolves to its target's
fields, a release without a tag (26.08) is not audited, a row of another source is skipped, and
--bridge on a plain folder exits 2.

  audit_recipes_test.py REPO_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

UTILS = '''
from dataclasses import dataclass
@dataclass
class WorkloadBaseConfig:
    num_gpus: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int = 1
    global_batch_size: int = 1
    micro_batch_size: int = 1
    cuda_graph_scope: Optional[str] = None
    moe_flex_dispatcher_backend: Optional[str] = None
    moe_a2a_overlap: Optional[bool] = False
'''
OLD = '''
BASE_QWEN3_30B_A3B_CONFIG = WorkloadBaseConfig(expert_model_parallel_size=8, global_batch_size=512)
QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG = replace(
    BASE_QWEN3_30B_A3B_CONFIG, num_gpus=16, global_batch_size=1024, pipeline_model_parallel_size=2,
    virtual_pipeline_model_parallel_size=12, moe_a2a_overlap=True)
QWEN3_30B_A3B_B200_FP8_CS_BASE_CONFIG = replace(BASE_QWEN3_30B_A3B_CONFIG, num_gpus=8,
    cuda_graph_scope=["moe_router", "moe_preprocess"])
QWEN3_30B_A3B_B200_FP8_MX_BASE_CONFIG = QWEN3_30B_A3B_B200_FP8_CS_BASE_CONFIG
'''
NEW = '''
BASE_QWEN3_30B_A3B_CONFIG = WorkloadBaseConfig(expert_model_parallel_size=8, global_batch_size=512,
                                               moe_flex_dispatcher_backend="deepep")
QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 = replace(
    BASE_QWEN3_30B_A3B_CONFIG, num_gpus=16, global_batch_size=1024, expert_model_parallel_size=16)
'''


def row(id_, gpu, precision, gpus, pp, vp, ep, gbs, release, same=None):
    r = {"id": id_, "source": "megatron-bridge", "release": release, "model": "qwen3-30b-a3b", "gpu": gpu,
         "precision": precision, "gpus": gpus, "tp": 1, "pp": pp, "vp": vp, "ep": ep, "mbs": 1, "gbs": gbs,
         "value": 1000, "split": "check"}
    if same:
        r["same_config"] = same
    return r


def main():
    root = sys.argv[1]
    if shutil.which("git") is None:
        print("skipped: git is not installed (audit_recipes.py reads Megatron-Bridge with git show)")
        return 77
    script = os.path.join(root, "experiments", "moe", "audit_recipes.py")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "bridge")
        configs = os.path.join(src, "scripts", "performance", "configs", "qwen")
        os.makedirs(configs)
        os.makedirs(os.path.join(src, "scripts", "performance", "utils"))
        with open(os.path.join(src, "scripts", "performance", "utils", "utils.py"), "w") as f:
            f.write(UTILS)
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")

        def commit(text, tag):
            with open(os.path.join(configs, "qwen3_workload_base_configs.py"), "w") as f:
                f.write(text)
            for cmd in (["add", "-A"], ["commit", "-q", "-m", tag], ["tag", tag]):
                subprocess.run(["git", "-C", src] + cmd, check=True, env=env)

        subprocess.run(["git", "-C", src, "init", "-q"], check=True, env=env)
        commit(OLD, "v0.2.0")  # 25.11's recipes
        commit(NEW, "v0.3.1")  # 26.02.01's
        rows = [row("h100", "h100", "fp8", 16, 2, 12, 8, 1024, "26.02.01",
                    same=[{"release": "25.11", "value": 900}]),
                row("b200", "b200", "mxfp8", 8, 1, None, 8, 512, "25.11",
                    same=[{"release": "26.08", "value": 1100}]),
                dict(row("paper", "h100", "fp8", 16, 1, None, 8, 256, "25.11"), source="parallel-folding")]
        rows_path, out = os.path.join(tmp, "rows.yaml"), os.path.join(tmp, "out", "recipes.md")
        with open(rows_path, "w") as f:
            yaml.safe_dump({"rows": rows}, f)
        r = subprocess.run([sys.executable, script, "--bridge", src, "--rows", rows_path, "--out", out],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"exit status {r.returncode}: {r.stderr}")
        text = open(out).read() if os.path.exists(out) else ""
        lines = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): line
                 for line in text.splitlines() if line.startswith("| ")}
        expect = {
            # 26.02.01 -> v0.3.1: EP 16, PP 1, no VP; the deepep backend listed as unprinted.
            ("h100", "check", "26.02.01"): ["pp 2 printed, 1 in the recipe", "vp 12 printed, None in the recipe",
                                            "ep 8 printed, 16 in the recipe", "moe_flex_dispatcher_backend deepep"],
            # 25.11 -> v0.2.0: the replace()d config matches, its overlap listed.
            ("h100", "check", "25.11"): ["matches the printed configuration", "moe_a2a_overlap True"],
            # the alias resolves to the FP8_CS fields (GBS 512 from the base, 8 GPUs, the graph scope)
            ("b200", "check", "25.11"): ["QWEN3_30B_A3B_B200_FP8_MX_BASE_CONFIG", "matches the printed configuration",
                                         "cuda_graph_scope [moe_router, moe_preprocess]"],
            ("b200", "check", "26.08"): ["not audited"],
        }
        for key, wants in expect.items():
            line = lines.get(key, "")
            for w in wants:
                if w not in line:
                    failures.append(f"{key}: expected {w!r} in {line!r}")
        if any(k[0] == "paper" for k in lines):
            failures.append("a row of another source was audited")
        if "printings whose every recipe differs from the printed configuration: 1\n  - h100 (26.02.01)" not in text:
            failures.append("summary of mismatches wrong: " + text[-300:])
        r = subprocess.run([sys.executable, script, "--bridge", tmp, "--rows", rows_path, "--out", out],
                           capture_output=True, text=True)
        if r.returncode != 2 or "not a git clone" not in r.stderr:
            failures.append(f"--bridge on a plain folder: status {r.returncode}, {r.stderr!r}")
    for f in failures:
        print("FAIL", f)
    print(f"audit_recipes_test: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
