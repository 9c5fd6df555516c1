"""Matched workloads for the ASTRA-sim comparison: a synchronous 1F1B chain of p stages on p GPUs
behind one switch, written as Chakra execution traces (one file per rank) and as a pipegrid
experiment.

The chain (pipegrid's `chain` workload, one layer per stage, `uniform` partitioner, `1f1b`
schedule): every stage takes `forward_us` per forward, `backward_us` per backward and `step_us` for
its optimizer step after its last backward; every stage boundary carries one activation
(`activation_bytes`) forward and one gradient of the same size backward per micro-batch.

Per rank s (0-based) of p, the compute order is pipegrid's `1f1b` (core/schedules/graph_1f1b.cc on
a chain): min(m, p - s) forwards, then for each micro-batch b a backward B(b) followed by the next
forward while any is left, then the step. Trace nodes per rank, ids from 0 in this order:
  COMM_RECV F(j) from s - 1 (s > 0), COMM_RECV B(j) from s + 1 (s < p - 1), j = 0..m-1, first:
  no dependency (posted at the start; ASTRA-sim completes a receive when its message arrives)
  then in compute order:
  COMP  F(j)  duration forward_us;  deps: the previous COMP of the rank, RECV F(j)
  COMP  B(j)  duration backward_us; deps: the previous COMP, RECV B(j)
  each followed by COMM_SEND F(j) to s + 1 (s < p - 1), dep F(j), or COMM_SEND B(j) to s - 1
  (s > 0), dep B(j)
  COMP  step  duration step_us;     dep: the last B
Every dependency is a data dependency (Node.data_deps): the ET feeder of the pinned ASTRA-sim
(Chakra's src/feeder) resolves data_deps only; ctrl_deps would be ignored there.
Tags: 2 j for F(j)'s activation, 2 j + 1 for B(j)'s gradient (unique per pair and direction).
Counts per rank: 2 m + 1 COMP, m SEND and m RECV per neighbour.

Chakra's wire format is written by tools/chakra.py (shared with `pipegrid export --chakra`;
its docstring lists the field numbers, from Chakra's schema/protobuf/et_def.proto). run.py parses the files back with the
protobuf module and Chakra's own et_def.proto (compiled by protoc) before running ASTRA-sim;
test_traces.py parses them with a schema built from the numbers above.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import chakra  # noqa: E402  (tools/chakra.py: Chakra's wire format)

COMP, SEND, RECV = chakra.COMP, chakra.SEND, chakra.RECV


def one_f_one_b(p, m, s):
    """Compute order of stage s: [("F", j) | ("B", j)], pipegrid's `1f1b`."""
    order, f = [], 0
    while f < min(m, p - s):
        order.append(("F", f))
        f += 1
    for b in range(m):
        order.append(("B", b))
        if f < m:
            order.append(("F", f))
            f += 1
    return order


def rank_nodes(p, m, s, forward_us, backward_us, step_us, activation_bytes):
    """Nodes of rank s as dicts: id, name, type, data (dependencies), duration_us, attrs (name -> (kind, value))."""
    nodes = []

    def add(name, typ, data=(), duration_us=0, attrs=None):
        nodes.append({"id": len(nodes), "name": name, "type": typ, "data": list(data),
                      "duration_us": duration_us, "attrs": attrs or {}})
        return len(nodes) - 1

    def comm(src, dst, tag):
        return {"is_cpu_op": ("bool", False), "comm_src": ("int32", src), "comm_dst": ("int32", dst),
                "comm_size": ("int64", activation_bytes), "comm_tag": ("int32", tag)}

    recv = {}  # ("F"|"B", j) -> node id
    for j in range(m):
        if s > 0:
            recv[("F", j)] = add(f"recv_F{j}", RECV, attrs=comm(s - 1, s, 2 * j))
        if s < p - 1:
            recv[("B", j)] = add(f"recv_B{j}", RECV, attrs=comm(s + 1, s, 2 * j + 1))
    previous = None
    for pas, j in one_f_one_b(p, m, s):
        deps = ([previous] if previous is not None else []) + ([recv[(pas, j)]] if (pas, j) in recv else [])
        c = add(f"{pas}{j}", COMP, data=deps,
                duration_us=forward_us if pas == "F" else backward_us, attrs={"is_cpu_op": ("bool", False)})
        previous = c
        if pas == "F" and s < p - 1:
            add(f"send_F{j}", SEND, data=[c], attrs=comm(s, s + 1, 2 * j))
        if pas == "B" and s > 0:
            add(f"send_B{j}", SEND, data=[c], attrs=comm(s, s - 1, 2 * j + 1))
    add("step", COMP, data=[previous], duration_us=step_us, attrs={"is_cpu_op": ("bool", False)})
    return nodes


def write_traces(directory, prefix, p, m, forward_us, backward_us, step_us, activation_bytes):
    """Writes DIRECTORY/PREFIX.<rank>.et for every rank (ASTRA-sim's --workload-configuration is
    DIRECTORY/PREFIX). Returns the number of nodes written."""
    os.makedirs(directory, exist_ok=True)
    total = 0
    for s in range(p):
        nodes = rank_nodes(p, m, s, forward_us, backward_us, step_us, activation_bytes)
        chakra.write_rank(os.path.join(directory, f"{prefix}.{s}.et"), nodes)
        total += len(nodes)
    return total


def astra_configs(directory, p, bandwidth_Bps, latency_s):
    """ASTRA-sim's network (one Switch of p NPUs), system and remote-memory configurations.

    Bandwidth: ASTRA-sim's analytical backend reads GB/s with 1 GB = 2^30 B (bw_GBps_to_Bpns in
    astra-network-analytical's common/NetworkFunction.cpp), so B/s / 2^30 is written. Latency: ns per
    hop; a Switch route has 2 hops (src -> switch -> dst), like pipegrid's `switch` cluster (two links,
    each with `latency`). Returns the three paths."""
    os.makedirs(directory, exist_ok=True)
    network = os.path.join(directory, "network.yml")
    with open(network, "w") as f:
        f.write("topology: [ Switch ]\n")
        f.write(f"npus_count: [ {p} ]\n")
        f.write(f"bandwidth: [ {bandwidth_Bps / 2**30!r} ]  # GB/s, 1 GB = 2^30 B: {bandwidth_Bps:g} B/s\n")
        f.write(f"latency: [ {latency_s * 1e9!r} ]  # ns per hop\n")
    system = os.path.join(directory, "system.json")
    with open(system, "w") as f:
        json.dump({"scheduling-policy": "LIFO", "endpoint-delay": 0, "active-chunks-per-dimension": 1,
                   "preferred-dataset-splits": 1, "all-reduce-implementation": ["ring"],
                   "all-gather-implementation": ["ring"], "reduce-scatter-implementation": ["ring"],
                   "all-to-all-implementation": ["ring"], "collective-optimization": "localBWAware",
                   "local-mem-bw": 1600, "boost-mode": 0}, f, indent=1)
    memory = os.path.join(directory, "memory.json")
    with open(memory, "w") as f:
        json.dump({"memory-type": "NO_MEMORY_EXPANSION"}, f)
    return network, system, memory


def pipegrid_experiment(p, m, forward_us, backward_us, step_us, activation_bytes, bandwidth_Bps, latency_s):
    """The same chain as a pipegrid experiment (a dict; JSON is valid YAML)."""
    return {
        "name": f"astra-chain-p{p}-m{m}",
        "workload": {"kind": "chain", "layers": p, "forward": f"{forward_us}us", "backward": f"{backward_us}us",
                     "activation": f"{activation_bytes}B", "parameters": "64MiB", "optimizer_step": f"{step_us}us"},
        "cluster": {"kind": "switch", "count": p, "device": {"name": "gpu", "memory": "80GiB"},
                    "bandwidth": f"{bandwidth_Bps:g}Bps", "latency": f"{latency_s * 1e6:g}us"},
        "strategy": {"partitioner": "uniform", "schedule": "1f1b", "micro_batches": m},
    }


def simulate(traces, delay):
    """Reference semantics of the traces as ASTRA-sim's analytical congestion-unaware backend runs
    them (our reading of astra-sim/workload/Workload.cc and HardwareResource.cc): a rank runs one COMP
    at a time and one SEND at a time, issuing dependency-free nodes in id order when the resource is
    free; a SEND takes `delay(size)` and its message then arrives; a RECV completes when its message has
    arrived and the RECV was posted. traces: {rank: nodes}; delay: a SEND's duration in us as a
    function of its size. Returns each rank's finish time in us.

    For small cases (test_traces.py): a plain event loop, not fast."""
    import heapq
    events = []  # (time, seq, kind, rank, node id)
    seq = 0
    state = {}
    for r, nodes in traces.items():
        by_id = {n["id"]: n for n in nodes}
        children = {i: [] for i in by_id}
        missing = {}
        for n in nodes:
            deps = set(n["data"])
            missing[n["id"]] = len(deps)
            for d in deps:
                children[d].append(n["id"])
        state[r] = {"nodes": by_id, "children": children, "missing": missing, "free": {i for i, k in missing.items() if k == 0},
                    "comp_busy": False, "send_busy": False, "end": 0.0}
    arrived, posted = {}, {}  # (src, dst, tag) -> time; -> (rank, node id)

    def push(t, kind, r, i):
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, r, i))
        seq += 1

    def finish(t, r, i):
        st = state[r]
        st["end"] = max(st["end"], t)
        for c in st["children"][i]:
            st["missing"][c] -= 1
            if st["missing"][c] == 0:
                st["free"].add(c)
        issue(t, r)

    def issue(t, r):
        st = state[r]
        for i in sorted(st["free"]):
            n = st["nodes"][i]
            a = n["attrs"]
            if n["type"] == COMP:
                if st["comp_busy"]:
                    continue
                st["comp_busy"] = True
                st["free"].discard(i)
                push(t + n["duration_us"], "comp", r, i)
            elif n["type"] == SEND:
                if st["send_busy"]:
                    continue
                st["send_busy"] = True
                st["free"].discard(i)
                push(t + delay(a["comm_size"][1]), "send", r, i)
            elif n["type"] == RECV:
                st["free"].discard(i)
                key = (a["comm_src"][1], a["comm_dst"][1], a["comm_tag"][1])
                if key in arrived:
                    push(t, "recv", r, i)
                else:
                    posted[key] = (r, i)

    t0 = 0.0
    for r in state:
        issue(t0, r)
    while events:
        t, _, kind, r, i = heapq.heappop(events)
        if kind == "comp":
            state[r]["comp_busy"] = False
        elif kind == "send":
            state[r]["send_busy"] = False
            a = state[r]["nodes"][i]["attrs"]
            key = (a["comm_src"][1], a["comm_dst"][1], a["comm_tag"][1])
            arrived[key] = t
            if key in posted:
                push(t, "recv", *posted.pop(key))
        finish(t, r, i)
    stuck = {r: len(st["nodes"]) for r, st in state.items() if any(k > 0 for k in st["missing"].values())}
    if stuck:
        raise RuntimeError(f"traces deadlock on ranks {sorted(stuck)}")
    return {r: st["end"] for r, st in state.items()}
