#!/usr/bin/env python3
"""ASTRA-sim's own example traces replayed in pipegrid (`pipegrid replay --chakra`), and, when an
ASTRA-sim binary is given, in ASTRA-sim: one row per trace with both iteration times.

    example_traces.py --astra-src DIR [--astra-bin PATH] [--out DIR]

DIR is an ASTRA-sim checkout (its examples/ folder; nothing is copied into this repository). The
traces: examples/workload/microbenchmarks/all_reduce/{4,8,16}npus_1MB (one COMM_COLL_NODE
ALL_REDUCE of 1 MiB per rank: data parallelism's gradient all-reduce). ASTRA-sim's repository has
no pipeline example trace; the pipeline comparison is run.py's (results.md). Networks:
examples/network/analytical/Ring_{N}npus.yml (a ring of N NPUs, 50 GB/s per link with ASTRA-sim's
GB = 2^30 B, 500 ns per hop), system examples/system/native_collectives/Ring_4chunks.json,
memory examples/remote_memory/analytical/no_memory_expansion.json. pipegrid's cluster: a `ring`
of N devices, links of 50 x 2^30 B/s and 500 ns; pipegrid's ring all-reduce (core/collectives.h).
Without --astra-bin the ASTRA-sim column says "not run". Writes OUT/example_traces.md.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..")
GB = 2 ** 30


def pipegrid_binary():
    return os.environ.get("PIPEGRID", os.path.join(REPO, "build", "pipegrid"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--astra-src", required=True)
    ap.add_argument("--astra-bin", help="AstraSim_Analytical_Congestion_Unaware (default: not run)")
    ap.add_argument("--out", default="example-traces-out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for n in (4, 8, 16):
        traces = os.path.join(args.astra_src, "examples/workload/microbenchmarks/all_reduce", f"{n}npus_1MB")
        exp = {"name": f"astra ring {n}",
               "workload": {"kind": "chain", "layers": 1, "forward": "1us", "backward": "1us", "activation": "0B",
                            "parameters": "0B"},
               "cluster": {"kind": "ring", "count": n, "device": {"name": "npu", "memory": "80GiB"},
                           "bandwidth": f"{50 * GB}Bps", "latency": "500ns"},
               "strategy": {"partitioner": "uniform", "schedule": "1f1b", "micro_batches": 1}}
        path = os.path.join(args.out, f"ring{n}.yaml")
        with open(path, "w") as f:
            json.dump(exp, f)
        r = subprocess.run([pipegrid_binary(), "replay", path, "--chakra", traces, "--prefix", "all_reduce", "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"pipegrid replay failed: {r.stderr}")
        pg = json.loads(r.stdout)["iteration_time_s"]
        closed = 2 * (n - 1) * 500e-9 + 2 * (n - 1) / n * 2 ** 20 / (50 * GB)
        astra = None
        if args.astra_bin:
            ex = os.path.join(args.astra_src, "examples")
            a = subprocess.run([args.astra_bin, f"--workload-configuration={traces}/all_reduce",
                                f"--system-configuration={ex}/system/native_collectives/Ring_4chunks.json",
                                f"--remote-memory-configuration={ex}/remote_memory/analytical/no_memory_expansion.json",
                                f"--network-configuration={ex}/network/analytical/Ring_{n}npus.yml"],
                               capture_output=True, text=True)
            cycles = [int(c) for c in re.findall(r"finished, (\d+) cycles", a.stdout + a.stderr)]
            astra = max(cycles) * 1e-9 if cycles else None
        rows.append((n, pg, closed, astra))
    lines = ["| trace | pipegrid (us) | ring closed form (us) | ASTRA-sim (us) |", "|---|---|---|---|"]
    for n, pg, closed, astra in rows:
        lines.append(f"| all_reduce {n}npus_1MB | {pg * 1e6:.3f} | {closed * 1e6:.3f} | "
                     f"{'not run' if astra is None else f'{astra * 1e6:.3f}'} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "example_traces.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
