#!/usr/bin/env python3
"""ASTRA-sim's own example traces replayed in pipegrid (`pipegrid replay`), and, when an ASTRA-sim
binary is given, in ASTRA-sim: one row per trace and configuration with both times and the closed
forms that explain them.

    example_traces.py --astra-src DIR [--astra-bin PATH] [--out DIR]

DIR is an ASTRA-sim checkout (its examples/ folder; nothing is copied into this repository).
ASTRA-sim's examples hold no pipeline trace, only collectives; the pipeline comparison is run.py's
(results.md). Rows:

1. examples/workload/microbenchmarks/all_reduce/{4,8,16}npus_1MB (one COMM_COLL_NODE ALL_REDUCE of
   S = 1 MiB per rank: data parallelism's gradient all-reduce) on
   examples/network/analytical/Ring_{n}npus.yml (a ring, B = 50 GB/s per link with ASTRA-sim's
   GB = 2^30 B, a = 500 ns per hop), memory no_memory_expansion.json, under three ASTRA-sim system
   configurations: examples/system/native_collectives/Ring_4chunks.json as shipped; the same with
   one split ("1 chunk"); and "matched": one split, endpoint delay 1 ns (0 trips an assertion of
   the analytical backend's event queue) and local-mem-bw 1e9 GB/s (no reduction time), the
   closest ASTRA-sim gets to pipegrid's model. pipegrid: its ring all-reduce on a `ring` of n
   devices with the same links; and 4 chained all-reduces of S / 4 (a trace graph this script
   writes), which is what Ring_4chunks.json makes ASTRA-sim run.
2. The all_gather, reduce_scatter and all_to_all microbenchmarks with Ring_4chunks.json: ASTRA-sim
   runs them; pipegrid's `replay --chakra` rejects them (only all-reduce collectives), and the row
   says so with pipegrid's message.
3. examples/system/custom_collectives: ASTRA-sim's custom ring all-reduce (MSCCL-style, one .et
   per rank of sends, receives and 7 us reduction nodes) under custom_collective.json, run on the
   8-NPU all-reduce trace. pipegrid replays the custom algorithm's own .et files as a workload after
   two rewrites (docs/import-export.md explains why): the 14 transfers of each rank pair, all
   with comm_tag 0 (ASTRA-sim pairs them in order), get tags 0..13; and each receive's dependency
   on its rank's own preceding send is dropped (ASTRA-sim's sends are eager, pipegrid's transfers
   rendezvous: kept, the ring's dependencies form a cycle).

"ASTRA-sim closed form" is the time derived from its source (docs/import-export.md): with
t(m) = floor(a + m / B) per message of m bytes, d the endpoint delay and r(m) = 3 floor(m / M) the
reduction time (M = local-mem-bw), per chunk of c bytes and m = c / n: all-reduce
d + (n - 1)(t + d + r) + (n - 1)(t + d); reduce-scatter d + (n - 1)(t + d + r); all-gather (m = c)
d + (n - 1)(t + d); all-to-all d + n (n - 1) / 2 (t + d); chunks run one after another. Without
--astra-bin the ASTRA-sim column says "not run". Writes OUT/example_traces.md and
OUT/example_traces.json.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(REPO, "tools"))
import chakra  # noqa: E402  (tools/chakra.py: the wire format)

GB = 2 ** 30
S = 2 ** 20            # the examples' collective size, bytes
A_NS = 500.0           # Ring_{n}npus.yml latency per hop
B_BPNS = 50 * GB / 1e9  # Ring_{n}npus.yml bandwidth in B/ns (ASTRA-sim's bw_GBps_to_Bpns)


def pipegrid_binary():
    return os.environ.get("PIPEGRID", os.path.join(REPO, "build", "pipegrid"))


def experiment(out, n):
    exp = {"name": f"astra ring {n}",
           "workload": {"kind": "chain", "layers": 1, "forward": "1us", "backward": "1us", "activation": "0B",
                        "parameters": "0B"},
           "cluster": {"kind": "ring", "count": n, "device": {"name": "npu", "memory": "80GiB"},
                       "bandwidth": f"{50 * GB}Bps", "latency": "500ns"},
           "strategy": {"partitioner": "uniform", "schedule": "1f1b", "micro_batches": 1}}
    path = os.path.join(out, f"ring{n}.yaml")
    with open(path, "w") as f:
        json.dump(exp, f)
    return path


def pipegrid(exp, source):
    """(iteration time in s, None) or (None, pipegrid's message)."""
    r = subprocess.run([pipegrid_binary(), "replay", exp, *source, "--json"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        return None, f"exit {r.returncode}, {last}"
    return json.loads(r.stdout)["iteration_time_s"], None


def astra(args, workload, system, n):
    if not args.astra_bin:
        return None
    ex = os.path.join(args.astra_src, "examples")
    a = subprocess.run([os.path.abspath(args.astra_bin), f"--workload-configuration={workload}",
                        f"--system-configuration={system}",
                        f"--remote-memory-configuration={ex}/remote_memory/analytical/no_memory_expansion.json",
                        f"--network-configuration={ex}/network/analytical/Ring_{n}npus.yml"],
                       capture_output=True, text=True, cwd=args.out, timeout=300)  # it writes log/ there
    cycles = [int(c) for c in re.findall(r"finished, (\d+) cycles", a.stdout + a.stderr)]
    if a.returncode != 0 or len(cycles) < n:
        sys.exit(f"ASTRA-sim failed on {workload} ({system}), exit {a.returncode}: {(a.stdout + a.stderr)[-2000:]}")
    return max(cycles) * 1e-9  # cycles are ns


def system_config(args, out, name, splits, delay, mem_bw):
    with open(os.path.join(args.astra_src, "examples/system/native_collectives/Ring_4chunks.json")) as f:
        j = json.load(f)
    j.update({"preferred-dataset-splits": splits, "endpoint-delay": delay, "local-mem-bw": mem_bw})
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(j, f, indent=1)
    return path


def astra_closed(coll, n, splits, d, mem_bw_GBps):
    """ASTRA-sim's time in s for its ring `coll` of S bytes per rank (module docstring)."""
    c = S // splits
    m = c if coll == "all_gather" else c // n
    t = math.floor(A_NS + m / B_BPNS)
    r = 3 * math.floor(m / mem_bw_GBps)  # bytes / (GB/s) = ns with ASTRA-sim's GB = 1e9 here (Sys.cc)
    per_chunk = {"all_reduce": d + (n - 1) * (t + d + r) + (n - 1) * (t + d),
                 "reduce_scatter": d + (n - 1) * (t + d + r),
                 "all_gather": d + (n - 1) * (t + d),
                 "all_to_all": d + n * (n - 1) // 2 * (t + d)}[coll]
    return splits * per_chunk * 1e-9


def ring_closed(n, bytes_, count=1):
    """pipegrid's ring all-reduce (core/collectives.h), `count` of them one after another."""
    return count * (2 * (n - 1) * A_NS * 1e-9 + 2 * (n - 1) / n * bytes_ / (B_BPNS * 1e9))


def chained_allreduces(out, n, count):
    """A trace graph: on each of n ranks, `count` all-reduces of S / count bytes, each after the last
    (through a compute node of 0 s)."""
    nodes = []
    for r in range(n):
        for k in range(count):
            gid = r * 2 * count + 2 * k  # a collective may depend on compute nodes only: a 0 s one in between
            nodes.append({"id": gid, "rank": r, "name": f"chunk{k}", "type": "allreduce", "group": list(range(n)),
                          "bytes": S / count, "tag": k, "deps": [gid - 1] if k else []})
            nodes.append({"id": gid + 1, "rank": r, "name": f"after{k}", "type": "comp", "duration_s": 0.0,
                          "deps": [gid]})
    path = os.path.join(out, f"chained{count}_{n}.json")
    with open(path, "w") as f:
        json.dump({"format": "pipegrid-trace-graph", "version": 1, "ranks": n, "nodes": nodes}, f)
    return path


def custom_collective_graph(out, directory, prefix):
    """ASTRA-sim's custom all-reduce .et files as a pipegrid trace graph, rewritten (module docstring)."""
    ranks = {r: chakra.read_rank(p) for r, p in chakra.rank_files(directory, prefix).items()}
    g = chakra.ranks_to_graph(ranks)
    by_id = {x["id"]: x for x in g["nodes"]}
    seen = {}
    dropped = 0
    for x in g["nodes"]:
        if x["type"] not in ("send", "recv"):
            continue
        pair = (x["rank"], x["peer"]) if x["type"] == "send" else (x["peer"], x["rank"])
        x["tag"] = seen.get((x["type"], pair), 0)
        seen[(x["type"], pair)] = x["tag"] + 1
        if x["type"] == "recv":
            keep = [d for d in x["deps"] if by_id[d]["type"] != "send"]
            dropped += len(x["deps"]) - len(keep)
            x["deps"] = keep
    path = os.path.join(out, "custom_allreduce.json")
    with open(path, "w") as f:
        json.dump(g, f)
    return path, dropped


def us(x):
    return "not run" if x is None else f"{x * 1e6:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--astra-src", required=True)
    ap.add_argument("--astra-bin", help="AstraSim_Analytical_Congestion_Unaware (default: not run)")
    ap.add_argument("--out", default="example-traces-out")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    ex = os.path.join(os.path.abspath(args.astra_src), "examples")
    micro = os.path.join(ex, "workload/microbenchmarks")
    shipped = os.path.join(ex, "system/native_collectives/Ring_4chunks.json")
    configs = [("Ring_4chunks.json", shipped, 4, 10, 1600),
               ("1 chunk", system_config(args, args.out, "one_chunk.json", 1, 10, 1600), 1, 10, 1600),
               ("matched", system_config(args, args.out, "matched.json", 1, 1, 10 ** 9), 1, 1, 10 ** 9)]
    rows = []  # (trace, ASTRA-sim config, pipegrid run, pipegrid s or message, pipegrid closed form, astra s, astra closed form)
    for n in (4, 8, 16):
        exp = experiment(args.out, n)
        traces = os.path.join(micro, "all_reduce", f"{n}npus_1MB")
        pg, err = pipegrid(exp, ["--chakra", traces, "--prefix", "all_reduce"])
        if err:
            sys.exit(f"pipegrid replay failed: {err}")
        pg4, err = pipegrid(exp, ["--graph", chained_allreduces(args.out, n, 4)])
        if err:
            sys.exit(f"pipegrid replay failed: {err}")
        for name, path, splits, d, mem in configs:
            a = astra(args, f"{traces}/all_reduce", path, n)
            rows.append((f"all_reduce {n}npus_1MB", name, "the trace (1 all-reduce)", pg, ring_closed(n, S), a,
                         astra_closed("all_reduce", n, splits, d, mem)))
            if splits == 4:
                rows.append((f"all_reduce {n}npus_1MB", name, "4 chained all-reduces of S/4", pg4,
                             ring_closed(n, S / 4, 4), a, astra_closed("all_reduce", n, splits, d, mem)))
    for coll in ("all_gather", "reduce_scatter", "all_to_all"):
        for n in (4, 8, 16):
            exp = experiment(args.out, n)
            traces = os.path.join(micro, coll, f"{n}npus_1MB")
            pg, err = pipegrid(exp, ["--chakra", traces, "--prefix", coll])
            a = astra(args, f"{traces}/{coll}", shipped, n)
            if err is not None:  # "chakra.py: rank 0 node 0 (NAME): collective type K; only all-reduce is supported"
                err = err.split(", ", 1)[0] + ", " + err.rsplit("): ", 1)[-1]
            rows.append((f"{coll} {n}npus_1MB", "Ring_4chunks.json", "the trace", pg if err is None else err, None, a,
                         astra_closed(coll, n, 4, 10, 1600)))
    # The custom collective: its system file names the algorithm's traces relative to the checkout;
    # a copy names them by absolute path.
    custom_dir = os.path.join(ex, "system/custom_collectives/custom_ring_allreduce_8npus_1MB")
    with open(os.path.join(ex, "system/custom_collectives/custom_collective.json")) as f:
        j = json.load(f)
    j["all-reduce-implementation-custom"] = [os.path.join(os.path.abspath(args.astra_src), x)
                                             for x in j["all-reduce-implementation-custom"]]
    custom_json = os.path.join(args.out, "custom_collective.json")
    with open(custom_json, "w") as f:
        json.dump(j, f, indent=1)
    graph, dropped = custom_collective_graph(args.out, custom_dir, "custom_allreduce")
    pg, err = pipegrid(experiment(args.out, 8), ["--graph", graph])
    a = astra(args, os.path.join(micro, "all_reduce/8npus_1MB/all_reduce"), os.path.abspath(custom_json), 8)
    t8 = A_NS + S / 8 / B_BPNS
    rows.append(("all_reduce 8npus_1MB", "custom_collective.json",
                 f"custom_allreduce.*.et, retagged, {dropped} receive deps dropped", pg if err is None else err,
                 14 * t8 * 1e-9 + 7 * 7e-6, a, (14 * math.floor(t8) + 7 * 7000) * 1e-9))

    lines = ["| trace | ASTRA-sim system | pipegrid replays | pipegrid (us) | pipegrid closed form (us) | "
             "ASTRA-sim (us) | ASTRA-sim closed form (us) | ASTRA-sim / pipegrid |",
             "|---|---|---|---|---|---|---|---|"]
    for trace, cfg, what, pg, pgc, a, ac in rows:
        ratio = f"{a / pg:.3f}" if isinstance(pg, float) and a is not None else ""
        lines.append(f"| {trace} | {cfg} | {what} | {us(pg) if not isinstance(pg, str) else 'rejected: ' + pg} | "
                     f"{'' if pgc is None else us(pgc)} | {us(a)} | {us(ac)} | {ratio} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "example_traces.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "example_traces.json"), "w") as f:
        json.dump([dict(zip(("trace", "astra_system", "pipegrid_replays", "pipegrid_s", "pipegrid_closed_form_s",
                             "astra_s", "astra_closed_form_s"), r)) for r in rows], f, indent=1)
    print(text)
    bad = [r for r in rows if r[5] is not None and abs(r[5] - r[6]) > 0.5e-9]
    if bad:
        sys.exit(f"ASTRA-sim differs from its closed form: {bad}")


if __name__ == "__main__":
    main()
