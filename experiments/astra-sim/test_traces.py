#!/usr/bin/env python3
"""ctest experiments/astra-sim_traces: the Chakra trace generator of run.py, without network or
ASTRA-sim. The files are parsed back with the protobuf module (python3-protobuf) through a schema
built here from Chakra's field numbers (chakra_traces.py's docstring), and compared with:
  1. p = 2, m = 2, written out by hand below (ids, names, types, dependencies, durations,
     attributes);
  2. the closed-form counts for p = 5, m = 7 (per rank 2 m + 1 COMP, m SEND and m RECV per
     neighbour) and the pairing of every SEND with exactly one RECV across ranks;
  3. iteration times of the traces under ASTRA-sim's rules (chakra_traces.simulate) against values
     computed by hand or by an independent list simulation of the same traces (written apart from
     chakra_traces.simulate).
Exit 0 on success, 1 with a message on the first mismatch, 77 (skipped) without python3-protobuf."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.internal.decoder import _DecodeVarint32
except ImportError:
    other = os.environ.get("PIPEGRID_PYTHON", "/usr/bin/python3")
    if not os.environ.get("ASTRA_REEXEC") and os.path.exists(other) and \
            os.path.realpath(other) != os.path.realpath(sys.executable):
        os.environ["ASTRA_REEXEC"] = "1"
        os.execv(other, [other, os.path.abspath(__file__)] + sys.argv[1:])
    print("python3-protobuf is missing (tools/setup --all installs it): skipped")
    sys.exit(77)

import chakra_traces as ct  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def schema():
    """Node, AttributeProto and GlobalMetadata with the fields the generator writes (proto3)."""
    f = descriptor_pb2.FileDescriptorProto(name="chakra_subset.proto", package="chakra_subset", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def message(name, fields):
        m = f.message_type.add(name=name)
        for fname, number, typ, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=typ, label=label)
            if type_name:
                fd.type_name = type_name
        return m

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    attr = message("AttributeProto", [("name", 1, T.TYPE_STRING, opt, None), ("int32_val", 7, T.TYPE_INT32, opt, None),
                                      ("int64_val", 9, T.TYPE_INT64, opt, None), ("bool_val", 27, T.TYPE_BOOL, opt, None)])
    attr.oneof_decl.add(name="value")
    for fd in attr.field[1:]:
        fd.oneof_index = 0
    message("GlobalMetadata", [("version", 1, T.TYPE_STRING, opt, None)])
    message("Node", [("id", 1, T.TYPE_UINT64, opt, None), ("name", 2, T.TYPE_STRING, opt, None),
                     ("type", 3, T.TYPE_INT32, opt, None), ("data_deps", 5, T.TYPE_UINT64, rep, None),
                     ("duration_micros", 7, T.TYPE_UINT64, opt, None),
                     ("attr", 10, T.TYPE_MESSAGE, rep, ".chakra_subset.AttributeProto")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    try:
        from google.protobuf.message_factory import GetMessageClass  # protobuf >= 4.22
    except ImportError:
        from google.protobuf.message_factory import MessageFactory
        GetMessageClass = MessageFactory(pool).GetPrototype
    return {n: GetMessageClass(pool.FindMessageTypeByName(f"chakra_subset.{n}")) for n in ("GlobalMetadata", "Node")}


MSG = schema()


def read(path):
    """[(id, name, type, data_deps, duration_us, {attr: value})] of one .et file; checks the metadata."""
    data = open(path, "rb").read()
    size, pos = _DecodeVarint32(data, 0)
    meta = MSG["GlobalMetadata"]()
    meta.ParseFromString(data[pos:pos + size])
    check(meta.version == "0.0.4", f"{path}: metadata version {meta.version!r}")
    pos += size
    nodes = []
    while pos < len(data):
        size, pos = _DecodeVarint32(data, pos)
        n = MSG["Node"]()
        n.ParseFromString(data[pos:pos + size])
        pos += size
        attrs = {a.name: getattr(a, a.WhichOneof("value")) for a in n.attr}
        nodes.append((n.id, n.name, n.type, list(n.data_deps), n.duration_micros, attrs))
    return nodes


COMP, SEND, RECV = 4, 5, 6
SIZE = 8 * 2**20
CPU = {"is_cpu_op": False}


def comm(src, dst, tag):
    return {"is_cpu_op": False, "comm_src": src, "comm_dst": dst, "comm_size": SIZE, "comm_tag": tag}


# 1. p = 2, m = 2, F = 1000 us, B = 2000 us, step = 1000 us. 1F1B: stage 0 warms up with
# min(m, p - 0) = 2 forwards: F0 F1 B0 B1; stage 1 with min(2, 1) = 1: F0 B0 F1 B1. Receives first
# (ids 0, 1), then each compute node followed by its send; tags 2 j (activation of j), 2 j + 1
# (gradient of j).
EXPECTED = {
    0: [(0, "recv_B0", RECV, [], 0, comm(1, 0, 1)),
        (1, "recv_B1", RECV, [], 0, comm(1, 0, 3)),
        (2, "F0", COMP, [], 1000, CPU),
        (3, "send_F0", SEND, [2], 0, comm(0, 1, 0)),
        (4, "F1", COMP, [2], 1000, CPU),
        (5, "send_F1", SEND, [4], 0, comm(0, 1, 2)),
        (6, "B0", COMP, [4, 0], 2000, CPU),
        (7, "B1", COMP, [6, 1], 2000, CPU),
        (8, "step", COMP, [7], 1000, CPU)],
    1: [(0, "recv_F0", RECV, [], 0, comm(0, 1, 0)),
        (1, "recv_F1", RECV, [], 0, comm(0, 1, 2)),
        (2, "F0", COMP, [0], 1000, CPU),
        (3, "B0", COMP, [2], 2000, CPU),
        (4, "send_B0", SEND, [3], 0, comm(1, 0, 1)),
        (5, "F1", COMP, [3, 1], 1000, CPU),
        (6, "B1", COMP, [5], 2000, CPU),
        (7, "send_B1", SEND, [6], 0, comm(1, 0, 3)),
        (8, "step", COMP, [6], 1000, CPU)],
}

with tempfile.TemporaryDirectory() as tmp:
    n = ct.write_traces(tmp, "chain", 2, 2, 1000, 2000, 1000, SIZE)
    check(n == 18, f"p=2 m=2: {n} nodes written, expected 18")
    check(sorted(os.listdir(tmp)) == ["chain.0.et", "chain.1.et"], f"files {sorted(os.listdir(tmp))}")
    for rank, want in EXPECTED.items():
        got = read(os.path.join(tmp, f"chain.{rank}.et"))
        check(got == want, f"p=2 m=2 rank {rank}:\n got  {got}\n want {want}")

    # 2. p = 5, m = 7: counts from the closed form, dependencies earlier in the file, sends paired.
    p, m = 5, 7
    ct.write_traces(tmp, "big", p, m, 1000, 2000, 1000, SIZE)
    sends, recvs = [], []
    for s in range(p):
        nodes = read(os.path.join(tmp, f"big.{s}.et"))
        count = {t: sum(1 for x in nodes if x[2] == t) for t in (COMP, SEND, RECV)}
        neighbours = (s > 0) + (s < p - 1)
        check(count == {COMP: 2 * m + 1, SEND: neighbours * m, RECV: neighbours * m}, f"rank {s}: counts {count}")
        check([x[0] for x in nodes] == list(range(len(nodes))), f"rank {s}: ids not 0..n-1 in order")
        check(all(d < x[0] for x in nodes for d in x[3]), f"rank {s}: a dependency on a later node")
        comps = [x for x in nodes if x[2] == COMP]
        # every compute node but the first depends on the one before it (the device runs them in order)
        check(all(comps[i - 1][0] in comps[i][3] for i in range(1, len(comps))), f"rank {s}: compute chain broken")
        order = [x[1] for x in comps[:-1]]
        check(order == [f"{a}{j}" for a, j in ct.one_f_one_b(p, m, s)] and comps[-1][1] == "step",
              f"rank {s}: compute order {order}")
        # warm-up: min(m, p - s) forwards before the first backward (closed-forms.md, 1F1B row)
        check(order.index("B0") == min(m, p - s), f"rank {s}: {order.index('B0')} forwards before B0")
        for x in nodes:
            key = (x[5].get("comm_src"), x[5].get("comm_dst"), x[5].get("comm_tag"))
            (sends if x[2] == SEND else recvs if x[2] == RECV else []).append(key)
    check(sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends) == 2 * (p - 1) * m,
          f"sends and receives do not pair one to one ({len(sends)} sends, {len(recvs)} receives)")

    # pipegrid's own 1f1b order, when the binary is there (PIPEGRID or build/pipegrid)
    binary = os.environ.get("PIPEGRID", os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "pipegrid"))
    if os.path.exists(binary):
        out = subprocess.run([binary, "schedule", "1f1b", "--stages", str(p), "--micro-batches", str(m), "--csv"],
                             capture_output=True, text=True).stdout.split()
        # one CSV row per device, actions "<stage><F|B><micro-batch>"
        want = [",".join(f"{s}{a}{j}" for a, j in ct.one_f_one_b(p, m, s)) for s in range(p)]
        check(out == want, f"`pipegrid schedule 1f1b --csv` gives {out}, the generator {want}")
    else:
        print(f"note: {binary} not built, the order is not compared with pipegrid's")


# 3. Iteration times of the traces under ASTRA-sim's rules.
def iteration(p, m, f, b, step, c):
    traces = {s: ct.rank_nodes(p, m, s, f, b, step, SIZE) for s in range(p)}
    return max(ct.simulate(traces, lambda size: c).values())


# p = 2, m = 2 by hand (c: one transfer): stage 0 F0 [0, 1], F1 [1, 2] ms; stage 1 F0 [1 + c, 2 + c],
# B0 [2 + c, 4 + c], F1 [4 + c, 5 + c] (its activation arrived at 2 + c), B1 [5 + c, 7 + c]; stage 0
# B0 [4 + 2c, 6 + 2c], B1 at max(6 + 2c, 7 + 2c) = 7 + 2c to 9 + 2c, step to 10 + 2c ms.
# c = 2 us + 8 MiB / 25e9 B/s = 337.54432 us.
c = 2 + SIZE / 25e9 * 1e6
check(abs(iteration(2, 2, 1000, 2000, 1000, c) - (10000 + 2 * c)) < 1e-9, "p=2 m=2: iteration != 10 ms + 2c")
# closed-forms.md's independent list simulation (no optimizer step): T_F = 1, T_BW = 2, p = 4, m = 8,
# c = 0.5: 41; p = 3, m = 6, T_F = T_BW = 1, c = 0.3: 19.0 (units of 1 ms here)
check(abs(iteration(4, 8, 1000, 2000, 0, 500) - 41000) < 1e-9, "p=4 m=8 c=0.5: iteration != 41")
check(abs(iteration(3, 6, 1000, 1000, 0, 300) - 19000) < 1e-9, "p=3 m=6 c=0.3: iteration != 19")

print(f"{3 + len(EXPECTED)} groups checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
