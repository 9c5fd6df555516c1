#!/usr/bin/env python3
"""pipegrid -> Chakra -> pipegrid: `pipegrid export --chakra` then `pipegrid replay --chakra` gives
the iteration time `pipegrid run` gives, for 1F1B, interleaved 1F1B, a data-parallel ring
all-reduce and both together, with all-reduces as collective nodes and as their ring's
send/receive pairs (--p2p); and for the group collectives (tensor, sequence, context and expert
parallelism, whose flows start once both ends reached them: the receive carries the receiver's
dependencies) and DualPipeV, whose rank reduces one stage's gradients after the other's (a
collective node after a collective node). Until 2026-12-05 every tensor-parallel export failed. The traces are read back with tools/chakra.py's decoder and checked
against closed forms: per rank 2 m / p_stage... compute nodes, one send and one receive per
activation and gradient, one all-reduce node per replicated stage and rank.

    chakra_round_trip_test.py PIPEGRID REPO
"""
import json
import os
import subprocess
import sys
import tempfile

PIPEGRID, REPO = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(REPO, "tools"))
import chakra  # noqa: E402

failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += 0 if ok else 1


def pipegrid(*args):
    r = subprocess.run([PIPEGRID, *args], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"pipegrid {' '.join(args)}: status {r.returncode}")
    return r


MiB = 2 ** 20


def experiment(layers, strategy):
    return {"name": "round trip",
            "workload": {"kind": "chain", "layers": layers, "forward": "1ms", "backward": "2ms",
                         "activation": "8MiB", "parameters": "64MiB", "optimizer_step": "0.5ms",
                         "samples_per_micro_batch": 4},
            "cluster": {"kind": "switch", "count": 4, "device": {"name": "gpu", "memory": "80GiB"},
                        "bandwidth": "25GBps", "latency": "1us"},
            "strategy": strategy}


CASES = {
    # name: (experiment, compute nodes per rank, sends per rank (total), all-reduce nodes per rank)
    "1f1b": (experiment(4, {"partitioner": "uniform", "schedule": "1f1b", "micro_batches": 8}),
             [2 * 8 + 1] * 4, 2 * 8 * 3, 0),
    "interleaved-1f1b": (experiment(8, {"partitioner": "uniform", "schedule": "interleaved-1f1b", "chunks": 2,
                                        "micro_batches": 8}),
                         [2 * 2 * 8 + 1] * 4, 2 * 8 * 7, 0),
    "data-parallel": (experiment(4, {"partitioner": "uniform", "stages": 1, "replicas": 4, "schedule": "1f1b",
                                     "micro_batches": 4}),
                      [2 * 4 + 1] * 4, 0, 1),
    "pipeline+data-parallel": (experiment(4, {"partitioner": "uniform", "stages": 2, "replicas": 2,
                                              "schedule": "1f1b", "micro_batches": 4}),
                               None, None, 1),
}
# The ring on four FPGAs' collective engine (ACCL over TCP): each step pays the engine's fixed time
# besides its bytes, which --p2p's sends carry (until 2026-12-05 they lost it: 277 us per iteration on
# eight boards).
ENGINE = experiment(4, {"partitioner": "uniform", "stages": 1, "replicas": 4, "schedule": "1f1b",
                        "micro_batches": 4})
ENGINE["cluster"] = {"kind": "switch", "count": 4, "device": {"name": "fpga", "model": "u280"},
                     "bandwidth": "12.5GBps", "latency": "1us", "collective_engine": "accl-tcp"}
CASES["data-parallel on a collective engine"] = (ENGINE, [2 * 4 + 1] * 4, 0, 1)
# NCCL's double binary tree: its two trees on channels 1 and 2, each its own connection in the replay;
# written as send / receive pairs (not a ring) carrying the channel. 2 trees x 64 chunks (128 MiB per
# tree, 512 KiB chunks, at most 64) x 2 (n - 1) = 768 sends. Until 2026-12-05 the channel was lost and
# both trees' flows shared one connection: replayed 37.848 ms against run's 34.277 ms.
TREE = experiment(4, {"partitioner": "uniform", "stages": 1, "replicas": 4, "schedule": "1f1b",
                      "micro_batches": 4, "allreduce": "tree"})
CASES["data-parallel tree all-reduce"] = (TREE, [2 * 4 + 1] * 4, 2 * 64 * 2 * 3, 0)
# ZeRO-1 with dp_overlap: two bucketed reduce-scatters of 128 MiB (the backward split in two: one more
# compute node per rank), 2 x (n - 1) n = 24 sends; not one ring all-reduce, so written as send / receive
# pairs. Until 2026-12-05 they were written as one all-reduce node: replayed 20.565 ms against 19.565 ms.
ZERO = experiment(4, {"partitioner": "uniform", "stages": 1, "replicas": 4, "schedule": "1f1b",
                      "micro_batches": 4, "dp_overlap": True})
ZERO["memory"] = {"zero": 1}
CASES["ZeRO-1 reduce-scatters with dp_overlap"] = (ZERO, [2 * 4 + 2] * 4, 2 * 3 * 4, 0)

# Group collectives: name -> (experiment, ranks, expert all-to-all sends by closed form or None).
GROUPED = {
    "tensor, sequence and context parallel": (
        {"workload": {"model": "llama3-8b", "layers": 2, "sequence": 4096, "precision": "amp-bf16",
                      "attention": "fused"},
         "cluster": {"preset": "dgx-h100-8"},
         "strategy": {"partitioner": "megatron", "tensor_parallel": 2, "context_parallel": 2,
                      "sequence_parallel": True, "stages": 2, "replicas": 1, "micro_batch_size": 1,
                      "micro_batches": 4}}, 8, None),
    # One MoE block per stage, 8 devices per all-to-all: per block, pass and micro-batch a dispatch and
    # a combine of 8 x 7 flows: 2 x 56 x 2 passes x 2 micro-batches x 2 stages = 896.
    "expert parallel, skewed routing": (
        {"workload": {"model": "mixtral-8x7b", "layers": 2, "sequence": 1024, "precision": "amp-bf16"},
         "cluster": {"preset": "dgx-h100-8", "nodes": 2},
         "strategy": {"partitioner": "megatron", "stages": 2, "replicas": 8, "expert_parallel": 8,
                      "micro_batch_size": 1, "micro_batches": 2, "moe": {"routing": {"zipf": 1.2}}}},
        16, 2 * 56 * 2 * 2 * 2),
    "DualPipeV, DeepEP": (
        {"workload": {"model": "deepseek-v2-lite", "layers": 4, "precision": "amp-bf16"},
         "cluster": {"preset": "dgx-h100-8"},
         "strategy": {"partitioner": "megatron", "schedule": "dualpipev", "chunks": 2, "stages": 2,
                      "replicas": 4, "expert_parallel": 4, "micro_batch_size": 1, "micro_batches": 4,
                      "moe": {"dispatcher": "deepep"}}}, 8, None),
}

EXPORT_NOTES = {}  # (name, mode) -> what export said besides chakra.py's line


def round_trips(tmp, name, exp):
    """Writes `exp`, exports it with collective nodes and with --p2p, yields (mode, the traces by
    rank) for the caller's checks, then checks that replaying them gives `pipegrid run`'s time."""
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        json.dump(exp, f)
    want = json.loads(pipegrid("run", path, "--json").stdout)["iteration_time_s"]
    for mode in ("collectives", "p2p"):
        d = os.path.join(tmp, f"{name}-{mode}")
        r = pipegrid("export", path, "--chakra", d, *(["--p2p"] if mode == "p2p" else []))
        EXPORT_NOTES[(name, mode)] = [line for line in r.stderr.splitlines() if not line.startswith("chakra.py:")]
        yield mode, {r: chakra.read_rank(p) for r, p in chakra.rank_files(d, "pipegrid").items()}
        got = json.loads(pipegrid("replay", path, "--chakra", d, "--json").stdout)["iteration_time_s"]
        check(abs(got - want) <= 1e-9 * want,
              f"{name} ({mode}): replayed {got * 1e3:.9f} ms, pipegrid run {want * 1e3:.9f} ms")


with tempfile.TemporaryDirectory() as tmp:
    for name, (exp, comps, sends, colls) in CASES.items():
        for mode, ranks in round_trips(tmp, name, exp):
            count = {t: [sum(1 for n in ranks[r] if n["type"] == t) for r in sorted(ranks)]
                     for t in (chakra.COMP, chakra.SEND, chakra.RECV, chakra.COLL)}
            check(len(ranks) == 4, f"{name} ({mode}): 4 traces")
            if comps is not None:
                check(count[chakra.COMP] == comps, f"{name} ({mode}): compute nodes per rank {count[chakra.COMP]}, "
                                                   f"closed form {comps}")
            if mode == "collectives" and sends is not None:
                check(sum(count[chakra.SEND]) == sends == sum(count[chakra.RECV]),
                      f"{name}: {sum(count[chakra.SEND])} sends and {sum(count[chakra.RECV])} receives, closed form {sends}")
            if mode == "collectives":
                check(count[chakra.COLL] == [colls] * 4, f"{name}: all-reduce nodes per rank {count[chakra.COLL]}")
                if colls:
                    sizes = {n["attrs"]["comm_size"][1] for r in ranks for n in ranks[r] if n["type"] == chakra.COLL}
                    layers_per_stage = 4 if name.startswith("data-parallel") else 2
                    check(sizes == {layers_per_stage * 64 * MiB},
                          f"{name}: all-reduce of {sizes} bytes, the stage's {layers_per_stage} x 64 MiB")
            else:
                check(count[chakra.COLL] == [0] * 4, f"{name} (p2p): no collective nodes")
            if name.startswith("data-parallel tree"):
                channels = {n["attrs"]["pipegrid_channel"][1] for r in ranks for n in ranks[r]
                            if "pipegrid_channel" in n["attrs"]}
                check(channels == {1, 2}, f"{name} ({mode}): the flows' channels {channels}, the two trees' 1 and 2")
    for (name, mode), notes in sorted(EXPORT_NOTES.items()):
        want = []
        if mode == "collectives" and name.startswith(("ZeRO-1", "data-parallel tree")):
            flows = 24 if name.startswith("ZeRO-1") else 768
            want = [f"pipegrid export: stage 0's gradient reduction ({flows} flows) is not one ring all-reduce (a "
                    f"tree, hierarchical or multi-ring all-reduce, a reduction per group, or the distributed "
                    f"optimizer's reduce-scatters): written as its send/receive pairs"]
        check(notes == want, f"{name} ({mode}): export says {notes}")
    for name, (exp, ranks_wanted, ep_sends) in GROUPED.items():
        for mode, ranks in round_trips(tmp, name, exp):
            check(len(ranks) == ranks_wanted, f"{name} ({mode}): {len(ranks)} traces, the cluster's {ranks_wanted}")
            if ep_sends is not None:
                ep = [n for r in ranks for n in ranks[r] if n["name"].startswith("ep ")]
                sends = sum(1 for n in ep if n["type"] == chakra.SEND)
                waiting = sum(1 for n in ep if n["type"] == chakra.RECV and n["data"])
                check(sends == ep_sends == waiting,
                      f"{name} ({mode}): {sends} all-to-all sends, {waiting} receives after their rank's work, "
                      f"closed form {ep_sends}")
    # A foreign trace's error is located: a receive without its send.
    d = os.path.join(tmp, "broken")
    os.makedirs(d)
    chakra.write_rank(os.path.join(d, "pipegrid.0.et"), [
        {"id": 0, "name": "recv", "type": chakra.RECV, "data": [], "duration_us": 0,
         "attrs": {"comm_src": ("int32", 1), "comm_dst": ("int32", 0), "comm_size": ("int64", 8), "comm_tag": ("int32", 5)}}])
    chakra.write_rank(os.path.join(d, "pipegrid.1.et"), [
        {"id": 0, "name": "c", "type": chakra.COMP, "data": [], "duration_us": 10, "attrs": {}}])
    path = os.path.join(tmp, "1f1b.yaml")
    r = subprocess.run([PIPEGRID, "replay", path, "--chakra", d], capture_output=True, text=True)
    check(r.returncode == 2 and "receive from rank 1 to rank 0 (tag 5) has no matching send" in r.stderr,
          f"a receive without its send: status {r.returncode}, {r.stderr.strip()}")
    # The decoder's errors: status 2 and one line naming the file and record or the rank and node (until
    # 2026-12-05 a truncated double was a struct.error traceback with status 1, a receive without comm_src
    # "chakra.py: 'comm_src'", comm_size -5 was read as 2^64 - 5 and a NaN duration gave "not a trace graph").
    C, S, R = chakra.COMP, chakra.SEND, chakra.RECV

    def comm(i, t, size=8, src=True):
        attrs = {"comm_src": ("int32", 0), "comm_dst": ("int32", 1), "comm_size": ("int64", size),
                 "comm_tag": ("int32", 7)}
        if not src:
            del attrs["comm_src"]
        return {"id": i, "name": f"n{i}", "type": t, "data": [], "duration_us": 0, "attrs": attrs}

    def decoded(name, rank0, rank1, want):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        if isinstance(rank0, bytes):
            with open(os.path.join(d, "pipegrid.0.et"), "wb") as f:
                f.write(rank0)
        else:
            chakra.write_rank(os.path.join(d, "pipegrid.0.et"), rank0)
        chakra.write_rank(os.path.join(d, "pipegrid.1.et"), rank1)
        r = subprocess.run([PIPEGRID, "replay", path, "--chakra", d], capture_output=True, text=True)
        want = want.format(d=d)
        check(r.returncode == 2 and r.stderr == want + "\n", f"{name}: status {r.returncode}, {r.stderr.strip()!r}")

    truncated = chakra.key(1, 0) + chakra.varint(0) + chakra.key(3, 0) + chakra.varint(C) + chakra.len_field(
        10, chakra.len_field(1, b"pipegrid_duration_s") + chakra.key(3, 1) + b"\x00\x00")
    decoded("truncated double", chakra.metadata() + chakra.delimited(truncated), [comm(0, R)],
            "chakra.py: {d}/pipegrid.0.et: node record 1 (the first node), at byte 8: field 3: a 64-bit value "
            "with 2 bytes left (truncated)")
    decoded("receive without comm_src", [comm(0, S)], [comm(0, R, src=False)],
            "chakra.py: rank 1 node 0 (n0): no attribute comm_src")
    decoded("negative size", [comm(0, S, size=-5)], [comm(0, R, size=-5)],
            "chakra.py: rank 0 node 0 (n0): a size of -5 bytes")
    nan = {"id": 0, "name": "nan", "type": C, "data": [], "duration_us": 0,
           "attrs": {"pipegrid_duration_s": ("double", float("nan"))}}
    decoded("NaN duration", [nan], [], "chakra.py: rank 0 node 0 (nan): attribute pipegrid_duration_s is nan, "
            "expected a finite number")
print(f"{failures} failures")
sys.exit(1 if failures else 0)
