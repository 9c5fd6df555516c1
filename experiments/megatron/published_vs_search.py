#!/usr/bin/env python3
"""Megatron-LM's published configurations against `pipegrid search`'s best (issue 28).

For every row of rows.yaml's Table 1 and Table 5 on at most --max-gpus GPUs: the row's model and
cluster as run.py writes them, `pipegrid search --global-batch B --top 0 --json` over every axis
(t, p, d, micro-batch, schedule, recomputation, SP, distributed optimizer), and the published
configuration's own estimate from the same ranking (t and p as printed, micro-batch 1, 1F1B, the
row's recomputation and SP, no distributed optimizer). Both times are the search's one-replica
estimate (docs/3d-search.md), not SimGrid replays. Writes published_vs_search.md.

    experiments/megatron/published_vs_search.py [--pipegrid build/pipegrid] [--max-gpus 1024]
"""
import argparse
import importlib.util
import json
import os
import subprocess
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
spec = importlib.util.spec_from_file_location("megatron_run", os.path.join(HERE, "run.py"))
mrun = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mrun)


def label(c):
    sched = c["schedule"] + (f" v{c['chunks']}" if c.get("chunks", 1) and c.get("chunks", 1) > 1 else "")
    return (f"t{c['t']} p{c['p']} d{c['d']} b{c['micro_batch_size']} {sched}, recompute {c['recompute']}"
            f"{', SP' if c['sequence_parallel'] else ''}{', dist. opt.' if c['distributed_optimizer'] else ''}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipegrid", default=os.path.join(ROOT, "build", "pipegrid"))
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--out", default=os.path.join(HERE, "published_vs_search.md"))
    a = ap.parse_args()
    lines = ["# Megatron-LM's published configurations against pipegrid's 3D search (generated)", "",
             f"Command: `experiments/megatron/published_vs_search.py --max-gpus {a.max_gpus}`. Both times are "
             "`pipegrid search`'s one-replica estimate with the catalog's A100 (not SimGrid replays); gap = published "
             "configuration's time / the best's - 1.", "",
             "| row | GPUs | published configuration | its time | search's best with the paper's features | time | gap | "
             "search's best overall | time | gap |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in mrun.rows():
        if r["table"] == "korthikanti2022_table4" or r["gpus"] > a.max_gpus:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "e.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(mrun.experiment(r), f)
            p = subprocess.run([a.pipegrid, "search", path, "--global-batch", str(r["batch"]), "--top", "0", "--json"],
                               capture_output=True, text=True)
        if p.returncode != 0:
            lines.append(f"| {r['id']} | {r['gpus']} | | | error: {(p.stderr or p.stdout).strip().splitlines()[-1]} | | |")
            continue
        j = json.loads(p.stdout)
        ranked = next((v for v in j.values() if isinstance(v, list) and v and isinstance(v[0], dict) and "t" in v[0]), [])
        key = "analytic_iteration_time_s" if ranked and "analytic_iteration_time_s" in ranked[0] else "iteration_time_s"
        pub = [c for c in ranked if c["t"] == r["t"] and c["p"] == r["p"] and c["micro_batch_size"] == 1
               and c["schedule"] == "1f1b" and c["recompute"] == r["recompute"]
               and c["sequence_parallel"] == bool(r["sequence_parallel"]) and not c["distributed_optimizer"]]
        best = ranked[0] if ranked else None
        # What the paper's software offered its runs: its recomputation mode, SP only where the row
        # uses it (2205.05198), no distributed optimizer (later than both papers), 1F1B or interleaved.
        same = [c for c in ranked if c["recompute"] == r["recompute"] and
                c["sequence_parallel"] == bool(r["sequence_parallel"]) and not c["distributed_optimizer"]
                and c["schedule"] in ("1f1b", "interleaved-1f1b")]
        if not best:
            lines.append(f"| {r['id']} | {r['gpus']} | | | no candidate fits | | | | | |")
            continue

        def cell(c):
            if not c:
                return "none fits | | "
            gap = f"{100 * (pub[0][key] / c[key] - 1):+.1f}%" if pub else ""
            return f"{label(c)} | {c[key]:.3g} s | {gap}"
        mine = f"{label(pub[0])} | {pub[0][key]:.3g} s" if pub else f"t{r['t']} p{r['p']}: not among those that fit |"
        lines.append(f"| {r['id']} | {r['gpus']} | {mine} | {cell(same[0] if same else None)} | {cell(best)} |")
        print(lines[-1], flush=True)
    open(a.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
