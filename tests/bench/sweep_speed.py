#!/usr/bin/env python3
"""Sweep speed: points per second of `pipegrid sweep` and its scaling with -j (a measured script;
the figures go in docs/speed.md).

Two sweeps, each run from an empty database with -j 1, 2 and 4, REPEATS times, best time kept:
  - "chain": 48 points of a small synthetic chain (4-16 layers on 2-8 devices): the per-point
    overhead (fork/exec, reading the sweep and experiment, SQLite commit) dominates;
  - "fpga": 48 points of experiments/fpga-whatif (VGG-16/ResNet-50/GNMT-8 on 4-16 U280s, the
    balanced planner trying 7 micro-batch sizes): a real what-if point.

Usage: sweep_speed.py PIPEGRID [--repeats N]
"""
import argparse
import os
import shutil
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CHAIN = """workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 4MiB, parameters: 1MiB}
cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: 1us}
strategy: {micro_batches: 8}
"""
CHAIN_SWEEP = """base: chain.yaml
grid:
  workload.layers: [4, 8, 16]
  cluster.count: [2, 3, 4, 8]
  strategy.micro_batches: [4, 8, 16, 32]
"""
FPGA_SWEEP = f"""base: {ROOT}/experiments/fpga-whatif/ring-base.yaml
grid:
  workload.model: [vgg16, resnet50, gnmt8]
  cluster.device.model: [u280, u280-ddr]
  cluster.device.dsps: {{scale: [1, 2]}}
  cluster.count: [4, 8, 12, 16]
"""


def measure(pipegrid, sweep, jobs, repeats):
    best = float("inf")
    for _ in range(repeats):
        db = sweep + ".sqlite"
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                os.remove(db + suffix)
        t = time.perf_counter()
        subprocess.run([pipegrid, "sweep", sweep, "--db", db, "-j", str(jobs), "-q"], check=True)
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pipegrid")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jobs", default="1,2,4")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="pipegrid-sweep-speed-")
    try:
        with open(os.path.join(d, "chain.yaml"), "w") as f:
            f.write(CHAIN)
        sweeps = {}
        for name, text in (("chain", CHAIN_SWEEP), ("fpga", FPGA_SWEEP)):
            sweeps[name] = os.path.join(d, f"{name}.yaml")
            with open(sweeps[name], "w") as f:
                f.write(text)
        print(f"{os.cpu_count()} cores; best of {a.repeats}")
        print(f"{'sweep':<6} {'points':>6} {'-j':>3} {'seconds':>8} {'points/s':>9} {'speed-up':>8}")
        for name, sweep in sweeps.items():
            points = 48
            one = None
            for j in [int(x) for x in a.jobs.split(",")]:
                s = measure(os.path.abspath(a.pipegrid), sweep, j, a.repeats)
                one = one or s
                print(f"{name:<6} {points:>6} {j:>3} {s:>8.2f} {points / s:>9.1f} {one / s:>7.2f}x")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
