#!/usr/bin/env python3
"""Scale series of the replay: runs build/bench_scale one configuration per process (so that peak RSS
is that configuration's), --repeat rounds of every configuration (one run of each per round, so that
a slow spell of the machine does not fall on every run of one configuration: on this VM the same
binary drifts by 20-30% within an hour), keeps each configuration's run with the least CPU time
(CPU time is the figure to trust, wall time is printed too), prints a table and fits
CPU ~ activities^e over the 1F1B chains (least squares on logs).
With --end-to-end it also times `pipegrid run` on the 1F1B chains (process start to exit, peak RSS
from /usr/bin/time).

    tools/scale_series.py [--build build] [--repeat 2] [--max-activities 2e7] [--filter REGEX]
                          [--end-to-end] [--json OUT.json]
    tools/scale_series.py --chain P M > chain.yaml   # one chain's experiment, to profile it alone
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

CHAINS = [(64, 256), (128, 512), (128, 1024), (256, 1024), (128, 4096), (128, 8192), (512, 2048),
          (1024, 2048), (1024, 4096)]
OTHERS = ["Chain1F1BExecs/128/1024", "Chain1F1BExecs/512/2048", "FatTree1024", "GraphPipeMMT32", "DGX4096"]


def activities(p, m):
    return 2 * p * m + p + 2 * (p - 1) * m


def bench_binary(build):
    for path in (os.path.join(build, "tests", "bench_scale"), os.path.join(build, "bench_scale")):
        if os.path.exists(path):
            return path
    sys.exit(f"no bench_scale under {build}: cmake --build {build} --target bench_scale")


def bench(build, name):
    out = subprocess.run([bench_binary(build), f"--benchmark_filter=^{name}/iterations",
                          "--benchmark_format=json"], capture_output=True, text=True, check=True)
    b = json.loads(out.stdout)["benchmarks"][0]
    if "error_message" in b:
        sys.exit(f"{name}: {b['error_message']}")
    return {"name": name, "seconds": b["real_time"], "cpu_s": b["cpu_s"], "activities": b["activities"],
            "prepare_s": b["prepare_s"], "replay_s": b["replay_s"], "peak_rss_MB": b["peak_rss_MB"]}


def finish(best):
    best["activities/s"] = best["activities"] / best["seconds"]
    best["activities/cpu_s"] = best["activities"] / best["cpu_s"]
    best["bytes/activity"] = best["peak_rss_MB"] * (1 << 20) / best["activities"]
    return best


def chain_yaml(p, m):
    """The experiment of the 1F1B chain p, m: what --end-to-end runs and --chain prints."""
    return (f"name: scale\nworkload: {{kind: chain, layers: {p}, forward: 1ms, backward: 2ms, activation: 8MiB, "
            f"parameters: 64MiB}}\ncluster: {{kind: switch, count: {p}, device: {{name: gpu, memory: 80GiB}}, "
            f"bandwidth: 25GBps, latency: 1us}}\nstrategy: {{partitioner: uniform, schedule: 1f1b, "
            f"micro_batches: {m}}}\n")


def end_to_end(build, p, m):
    text = chain_yaml(p, m)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        out = subprocess.run(["/usr/bin/time", "-f", "%e %M", os.path.join(build, "pipegrid"), "run", f.name],
                             capture_output=True, text=True, check=True)
        wall, kb = out.stderr.strip().splitlines()[-1].split()
    finally:
        os.unlink(f.name)
    return {"name": f"pipegrid run p={p} m={m}", "seconds": float(wall), "peak_rss_MB": int(kb) / 1024,
            "activities": activities(p, m)}


def rounds(count, items, run, key):
    """Runs every item once per round, `count` rounds; keeps each item's run with the least `key`."""
    best = {}
    for k in range(count):
        for item in items:
            row = run(item)
            print(f"[round {k + 1}/{count}] {row['name']}: {row[key]:.2f} s", file=sys.stderr, flush=True)
            if item not in best or row[key] < best[item][key]:
                best[item] = row
    return [best[item] for item in items]


def fit(points):
    xs = [math.log(a) for a, _ in points]
    ys = [math.log(t) for _, t in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-activities", type=float, default=2e7)
    ap.add_argument("--filter", default="")
    ap.add_argument("--end-to-end", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--chain", nargs=2, type=int, metavar=("P", "M"),
                    help="print the experiment of the 1F1B chain P, M (for `pipegrid run`, perf) and exit")
    a = ap.parse_args()
    if a.chain:
        sys.stdout.write(chain_yaml(*a.chain))
        return
    names = [f"Chain1F1B/{p}/{m}" for p, m in CHAINS if activities(p, m) <= a.max_activities] + OTHERS
    names = [n for n in names if not a.filter or re.search(a.filter, n)]
    rows = [finish(r) for r in rounds(a.repeat, names, lambda n: bench(a.build, n), "cpu_s")]
    for r in rows:
        print(f"{r['name']:24} {r['activities']:>10.0f} activities {r['seconds']:8.2f} s wall "
              f"(prepare {r['prepare_s']:6.2f}, replay {r['replay_s']:7.2f}) {r['cpu_s']:8.2f} s CPU "
              f"{r['activities/cpu_s']:>9.0f} /CPU s {r['peak_rss_MB']:6.0f} MB "
              f"{r['bytes/activity']:5.0f} B/activity", flush=True)
    chains = [r for r in rows if r["name"].startswith("Chain1F1B/")]
    if len(chains) >= 2:
        lo, hi = chains[0]["activities"], chains[-1]["activities"]
        for key, what in (("cpu_s", "CPU time (both processes)"), ("seconds", "wall time, end to end"),
                          ("replay_s", "wall time of the replay loop")):
            e = fit([(r["activities"], r[key]) for r in chains])
            print(f"1F1B chains, {lo:.0f}..{hi:.0f} activities: {what} ~ activities^{e:.3f}")
        # The growth at one width (more micro-batches only) against the growth with the width.
        narrow = [r for r in chains if r["name"].startswith("Chain1F1B/128/")]
        if len(narrow) >= 2:
            e = fit([(r["activities"], r["cpu_s"]) for r in narrow])
            print(f"1F1B chains at p = 128 only ({len(narrow)} sizes): CPU time ~ activities^{e:.3f}")
    if a.end_to_end:
        points = [(p, m) for p, m in CHAINS if activities(p, m) <= a.max_activities]
        timed = rounds(a.repeat, points, lambda pm: end_to_end(a.build, *pm), "seconds")
        rows += timed
        for r in timed:
            print(f"{r['name']:24} {r['activities']:>10.0f} activities {r['seconds']:8.2f} s "
                  f"{r['peak_rss_MB']:7.0f} MB", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
