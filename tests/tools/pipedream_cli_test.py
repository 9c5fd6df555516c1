#!/usr/bin/env python3
"""ctest tools/pipedream_cli: `partitioner: pipedream` through the CLI against 164 answers of PipeDream's
own planner (tests/core/data/pipedream_reference.tsv: msr-fiddle/pipedream's
optimizer_graph_hierarchical.py run unmodified on workloads/profiles/pipedream). Each row becomes an
experiment file (the profile at its own batch; a switch of the row's devices; the row's hierarchy,
straight pipeline, activation compression and memory constraint with the device's memory at -s and no
reserve) run by `pipegrid plan --json`: the planner's time per stage equals PipeDream's to 1e-6, and on
one level its stage count too (with several levels PipeDream's stage count follows Python's randomised
set order). Replicated stages take whole micro-batches in turn (round-robin, the default with this
partitioner), so PipeDream's replica counts are kept whether or not they divide the micro-batch (issue
55, item 13); with `replica_mode: split` only counts that divide the 128-sample micro-batch are
allowed, and the replicated answers whose counts do not divide it are slower, never faster.

usage: pipedream_cli_test.py PIPEGRID SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

BIN, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
PROFILES = os.path.join(SRC, "workloads", "profiles", "pipedream")


def experiment(args, mode):
    a = args.split()
    machines, bandwidths, strategy = [], [], {"partitioner": "pipedream", "schedule": "1f1b"}
    memory = None
    strategy["activation_compression_ratio"] = "none"
    i = 0
    while i < len(a):
        if a[i] == "-f":
            profile = a[i + 1]
            i += 1
        elif a[i] in ("-n", "-b"):
            key = a[i]
            while i + 1 < len(a) and not a[i + 1].startswith("-"):
                (machines if key == "-n" else bandwidths).append(a[i + 1])
                i += 1
        elif a[i] == "--straight_pipeline":
            strategy["straight"] = "true"
        elif a[i] == "--activation_compression_ratio":
            strategy["activation_compression_ratio"] = a[i + 1]
            i += 1
        elif a[i] == "--use_memory_constraint":
            strategy["memory_constraint"] = "true"
        elif a[i] == "-s":
            memory = a[i + 1]
            i += 1
        i += 1
    devices = 1
    for n in machines:
        devices *= int(n)
    levels = ", ".join(f"{{workers: {n}, bandwidth: {b}Bps}}" for n, b in zip(machines, bandwidths))
    strategy["hierarchy"] = f"[{levels}]"
    strategy["micro_batches"] = str(max(devices, 2))
    if mode:
        strategy["replica_mode"] = mode
    device = "{name: gpu, model: v100" + (f", memory: {memory}B" if memory else "") + "}"
    return (f"workload: {{profile: {os.path.join(PROFILES, profile)}}}\n"
            f"cluster: {{kind: switch, count: {devices}, device: {device}, bandwidth: {bandwidths[0]}Bps, "
            "latency: 0s}\n"
            "strategy: {" + ", ".join(f"{k}: {v}" for k, v in strategy.items()) + "}\n")


def plan(text, folder, n):
    path = os.path.join(folder, f"row{n}.yaml")
    with open(path, "w") as f:
        f.write(text)
    r = subprocess.run([BIN, "plan", path, "--json", "--memory-margin", "0"], capture_output=True, text=True)
    return r


def main():
    rows = []
    with open(os.path.join(SRC, "tests", "core", "data", "pipedream_reference.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            profile, args, time, stages, replicas = line.rstrip("\n").split("\t")
            rows.append((args, float(time), int(stages), replicas))
    assert len(rows) == 164, len(rows)
    failures, replicated, not_dividing, split_slower = [], 0, 0, 0
    with tempfile.TemporaryDirectory() as folder:
        for n, (args, want, stages, replicas) in enumerate(rows):
            r = plan(experiment(args, None), folder, n)
            if r.returncode != 0:
                failures.append(f"{args}: exit {r.returncode}: {r.stderr.strip()[:300]}")
                continue
            j = json.loads(r.stdout)
            got = j["predicted_time_per_stage_s"]
            if abs(got - want) > 1e-6 * want:
                failures.append(f"{args}: time per stage {got!r}, PipeDream {want!r}")
            if j["assumptions"]["replica_mode"] != "round-robin":
                failures.append(f"{args}: replica mode {j['assumptions']['replica_mode']}")
            if max(s["replicas"] for s in j["stages"]) > 1 and j["batch"]["replica_mode"] != "round-robin":
                failures.append(f"{args}: batch says {j['batch']['replica_mode']}")
            one_level = args.count("-b ") == 1 and len(args.split("-n ")[1].split("-")[0].split()) == 1
            if one_level and len(j["stages"]) != stages:
                failures.append(f"{args}: {len(j['stages'])} stages, PipeDream {stages}")
            counts = [s["replicas"] for s in j["stages"]]
            if max(counts) > 1:
                replicated += 1
            if any(128 % c for c in counts):
                not_dividing += 1
                # Split replicas cannot take these counts: the planner's answer with them is slower.
                s = plan(experiment(args, "split"), folder, n)
                if s.returncode == 0:
                    split_time = json.loads(s.stdout)["predicted_time_per_stage_s"]
                    if split_time < got * (1 - 1e-9):
                        failures.append(f"{args}: split replicas {split_time!r} beat round-robin {got!r}")
                    split_slower += split_time > got * (1 + 1e-9)
    print(f"{len(rows)} rows; {replicated} plans replicate a stage, {not_dividing} with counts that do not "
          f"divide 128 (split mode slower on {split_slower} of them)")
    for f in failures:
        print("FAIL", f)
    if not_dividing == 0:
        print("FAIL: no plan with a replica count that does not divide the micro-batch: the test is vacuous")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
