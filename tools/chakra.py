#!/usr/bin/env python3
"""Chakra execution traces: the wire format (written and read without generated code) and the
conversion between pipegrid's trace graph (tools/output/trace_graph.h) and one .et file per rank.

    chakra.py encode GRAPH.json DIR [--prefix NAME]   trace graph -> DIR/NAME.<rank>.et
    chakra.py decode DIR [--prefix NAME] [-o GRAPH.json]

`pipegrid export --chakra` and `pipegrid replay --chakra` run it; experiments/astra-sim's
chakra_traces.py imports its wire format. Documented in docs/import-export.md.

Wire format: a length-delimited (varint32 size) GlobalMetadata, then one length-delimited Node
per node. Field numbers (Chakra's schema/protobuf/et_def.proto, an interface fact):
GlobalMetadata.version = 1; Node.id = 1, name = 2, type = 3, data_deps = 5 (packed),
duration_micros = 7, attr = 10; AttributeProto.name = 1, double_val = 3, int32_val = 7,
int64_val = 9, bool_val = 27, string_val = 29; NodeType COMP_NODE = 4, COMM_SEND_NODE = 5,
COMM_RECV_NODE = 6, COMM_COLL_NODE = 7; CollectiveCommType ALL_REDUCE = 0.

Trace nodes written by `encode`: compute nodes (COMP_NODE, duration_micros rounded to whole
microseconds as Chakra stores them, and the exact time in the double attribute
`pipegrid_duration_s`); sends and receives (comm_src, comm_dst, comm_size in bytes, comm_tag);
all-reduces (COMM_COLL_NODE, comm_type ALL_REDUCE, comm_size, and the group in `pipegrid_group`,
e.g. "0,1,2,3", with `comm_tag` telling apart collectives of one group). Every dependency is a
data dependency (the ET feeder of ASTRA-sim resolves data_deps). `decode` reads any Chakra trace
with these node types; it takes `pipegrid_duration_s` when present, else duration_micros.
"""
import argparse
import json
import math
import os
import struct
import sys

COMP, SEND, RECV, COLL = 4, 5, 6, 7
ALL_REDUCE = 0
ATTR_FIELDS = {"double": 3, "int32": 7, "int64": 9, "bool": 27, "string": 29}
METADATA_VERSION = "0.0.4"


# --- protobuf wire format --------------------------------------------------------------------

def varint(n):
    out = bytearray()
    n = int(n)
    if n < 0:
        n &= (1 << 64) - 1
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(field, wire_type):
    return varint(field << 3 | wire_type)


def len_field(field, payload):
    return key(field, 2) + varint(len(payload)) + payload


def attr(name, kind, value):
    field = ATTR_FIELDS[kind]
    head = len_field(1, name.encode())
    if kind == "double":
        return head + key(field, 1) + struct.pack("<d", float(value))
    if kind == "string":
        return head + len_field(field, str(value).encode())
    return head + key(field, 0) + varint(int(value))


def encode_node(n):
    """n: {"id", "name", "type", "data": [deps], "duration_us", "attrs": {name: (kind, value)}}."""
    out = key(1, 0) + varint(n["id"]) + len_field(2, n["name"].encode()) + key(3, 0) + varint(n["type"])
    if n["data"]:
        out += len_field(5, b"".join(varint(d) for d in n["data"]))
    if n["duration_us"]:
        out += key(7, 0) + varint(n["duration_us"])
    for name, (kind, value) in n["attrs"].items():
        out += len_field(10, attr(name, kind, value))
    return out


def delimited(payload):
    return varint(len(payload)) + payload


def metadata():
    return delimited(len_field(1, METADATA_VERSION.encode()))


def write_rank(path, nodes):
    """Writes one rank's trace: the metadata, then its nodes."""
    with open(path, "wb") as f:
        f.write(metadata())
        f.write(b"".join(delimited(encode_node(n)) for n in nodes))


def _read_varint(buf, i):
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        if shift >= 70:
            raise ValueError("a varint longer than 10 bytes")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf):
    """(field, wire type, value) of one message; values: int, bytes or float (fixed64 as double)."""
    i = 0
    while i < len(buf):
        k, i = _read_varint(buf, i)
        field, wt = k >> 3, k & 7
        if wt == 0:
            v, i = _read_varint(buf, i)
        elif wt == 2:
            n, i = _read_varint(buf, i)
            if i + n > len(buf):
                raise ValueError(f"field {field}: {n} bytes announced, {len(buf) - i} left (truncated)")
            v, i = buf[i:i + n], i + n
        elif wt in (1, 5):
            size = 8 if wt == 1 else 4
            if i + size > len(buf):
                raise ValueError(f"field {field}: a {size * 8}-bit value with {len(buf) - i} bytes left (truncated)")
            v, i = (struct.unpack("<d", buf[i:i + 8])[0] if wt == 1 else buf[i:i + 4]), i + size
        else:
            raise ValueError(f"field {field}: unsupported wire type {wt}")
        yield field, wt, v


def _signed(v, bits):
    """A varint as protobuf's int32 / int64 (two's complement over 64 bits)."""
    if v >= 1 << 63:
        v -= 1 << 64
    if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
        raise ValueError(f"{v} does not fit an int{bits}")
    return v


# The wire type of each field decode_node reads (Node, then AttributeProto); others are skipped.
NODE_WIRE = {1: (0,), 2: (2,), 3: (0,), 4: (0, 2), 5: (0, 2), 7: (0,), 10: (2,)}
ATTR_WIRE = {1: (2,), 3: (1,), 7: (0,), 9: (0,), 27: (0,), 29: (2,)}


def _check_wire(field, wt, expected, what):
    if field in expected and wt not in expected[field]:
        raise ValueError(f"{what} field {field}: wire type {wt}, expected {expected[field][0]}")


def _attr(buf):
    """(name, (kind, value)) of one AttributeProto; kind None for a type decode does not read."""
    kinds = {v: k for k, v in ATTR_FIELDS.items()}
    name, value, kind = None, None, None
    for f2, wt2, v2 in _fields(buf):
        _check_wire(f2, wt2, ATTR_WIRE, "attribute")
        if f2 == 1:
            name = v2.decode()
        elif f2 in kinds:
            kind = kinds[f2]
            value = (v2.decode() if kind == "string" else _signed(v2, 32) if kind == "int32"
                     else _signed(v2, 64) if kind == "int64" else bool(v2) if kind == "bool" else v2)
    return name, (kind, value)


def decode_node(buf):
    n = {"id": 0, "name": "", "type": 0, "data": [], "ctrl": [], "duration_us": 0, "attrs": {}}
    for field, wt, v in _fields(buf):
        _check_wire(field, wt, NODE_WIRE, "node")
        if field == 1:
            n["id"] = v
        elif field == 2:
            n["name"] = v.decode()
        elif field == 3:
            n["type"] = v
        elif field in (4, 5):  # ctrl_deps = 4, data_deps = 5 (packed or not)
            deps = [v] if wt == 0 else _unpack_varints(v)
            n["ctrl" if field == 4 else "data"] += deps
        elif field == 7:
            n["duration_us"] = v
        elif field == 10:
            name, value = _attr(v)
            if name is not None:
                n["attrs"][name] = value
    return n


def _unpack_varints(buf):
    out, i = [], 0
    while i < len(buf):
        v, i = _read_varint(buf, i)
        out.append(v)
    return out


def read_rank(path):
    """The nodes of one rank's trace (after its metadata). Errors name the file and the record."""
    with open(path, "rb") as f:
        buf = f.read()
    if not buf:
        raise ValueError(f"{path}: an empty file (a trace starts with its metadata)")
    nodes, i, record = [], 0, 0
    while i < len(buf):
        start = i
        try:
            n, i = _read_varint(buf, i)
            payload, i = buf[i:i + n], i + n
            if len(payload) != n:
                raise ValueError(f"{n} bytes announced, {len(payload)} left (truncated)")
            if record > 0:  # record 0: the GlobalMetadata
                nodes.append(decode_node(payload))
        except ValueError as e:  # UnicodeDecodeError too
            what = "the metadata" if record == 0 else f"node record {record} (after node id {nodes[-1]['id']})" \
                if nodes else f"node record {record} (the first node)"
            raise ValueError(f"{path}: {what}, at byte {start}: {e}") from None
        record += 1
    return nodes


# --- trace graph <-> per-rank nodes ----------------------------------------------------------

def _comm_attrs(src, dst, size, tag):
    a = {"is_cpu_op": ("bool", False), "comm_src": ("int32", src), "comm_dst": ("int32", dst),
         "comm_size": ("int64", round(size)), "comm_tag": ("int32", tag)}
    if size != round(size):
        a["pipegrid_bytes"] = ("double", size)
    return a


def graph_to_ranks(graph):
    """{rank: [nodes]} from a trace graph (ids renumbered from 0 per rank, in the graph's order)."""
    ranks = {r: [] for r in range(graph["ranks"])}
    local = {}  # graph id -> (rank, local id)
    for g in graph["nodes"]:
        r = g["rank"]
        nodes = ranks.setdefault(r, [])
        lid = len(nodes)
        local[g["id"]] = (r, lid)
        deps = []
        for d in g["deps"]:
            dr, dl = local[d]
            if dr != r:
                raise ValueError(f"node {g['id']} depends on node {d} of rank {dr}")
            deps.append(dl)
        node = {"id": lid, "name": g.get("name", ""), "data": sorted(set(deps)), "duration_us": 0, "attrs": {}}
        t = g["type"]
        if t == "comp":
            node["type"] = COMP
            node["duration_us"] = round(g["duration_s"] * 1e6)
            node["attrs"] = {"is_cpu_op": ("bool", False), "pipegrid_duration_s": ("double", g["duration_s"])}
        elif t in ("send", "recv"):
            node["type"] = SEND if t == "send" else RECV
            src, dst = (r, g["peer"]) if t == "send" else (g["peer"], r)
            node["attrs"] = _comm_attrs(src, dst, g["bytes"], g["tag"])
            if t == "send" and g.get("duration_s", 0) > 0:  # a fixed time besides the bytes (an engine's step)
                node["attrs"]["pipegrid_duration_s"] = ("double", g["duration_s"])
            if g.get("channel", 0):  # a collective's connection (NCCL's trees), its own in the replay
                node["attrs"]["pipegrid_channel"] = ("int32", g["channel"])
        elif t == "allreduce":
            node["type"] = COLL
            node["attrs"] = {"is_cpu_op": ("bool", False), "comm_type": ("int64", ALL_REDUCE),
                             "comm_size": ("int64", round(g["bytes"])), "comm_tag": ("int32", g.get("tag", 0)),
                             "pipegrid_group": ("string", ",".join(str(x) for x in g["group"]))}
            if g["bytes"] != round(g["bytes"]):
                node["attrs"]["pipegrid_bytes"] = ("double", g["bytes"])
        else:
            raise ValueError(f"node {g['id']}: unknown type {t}")
        nodes.append(node)
    return ranks


def _number(a, key, where, default=None, kinds=("int32", "int64", "double")):
    """Attribute `key` of a node's attributes `a` ({name: (kind, value)}): a finite number; `default`
    when absent (None: required)."""
    if key not in a:
        if default is None:
            raise ValueError(f"{where}: no attribute {key}")
        return default
    kind, value = a[key]
    if kind not in kinds:
        raise ValueError(f"{where}: attribute {key} is {kind or 'of a type chakra.py does not read'}, "
                         f"expected {' or '.join(kinds)}")
    if not math.isfinite(value):
        raise ValueError(f"{where}: attribute {key} is {value}, expected a finite number")
    return value


def _size(a, where):
    """A send's, receive's or collective's bytes: pipegrid_bytes (exact), else comm_size; at least 0."""
    size = _number(a, "pipegrid_bytes", where, _number(a, "comm_size", where, 0, ("int64", "int32")), ("double",))
    if size < 0:
        raise ValueError(f"{where}: a size of {size} bytes")
    return size


def _node_to_graph(r, n, gid, ranks):
    """Node n of rank r as a trace graph node."""
    where = f"rank {r} node {n['id']} ({n['name']})"
    a = n["attrs"]
    missing = [d for d in n["data"] + n["ctrl"] if (r, d) not in gid]
    if missing:
        raise ValueError(f"{where}: depends on missing nodes {missing}")
    g = {"id": gid[(r, n["id"])], "rank": r, "name": n["name"],
         "deps": sorted({gid[(r, d)] for d in n["data"] + n["ctrl"]})}
    t = n["type"]
    if t == COMP:
        g["type"] = "comp"
        g["duration_s"] = _number(a, "pipegrid_duration_s", where, n["duration_us"] * 1e-6, ("double",))
    elif t in (SEND, RECV):
        g["type"] = "send" if t == SEND else "recv"
        g["peer"] = _number(a, "comm_dst" if t == SEND else "comm_src", where, kinds=("int32", "int64"))
        g["bytes"] = _size(a, where)
        g["tag"] = _number(a, "comm_tag", where, 0, ("int32", "int64"))
        if t == SEND and "pipegrid_duration_s" in a:
            g["duration_s"] = _number(a, "pipegrid_duration_s", where, kinds=("double",))
        if "pipegrid_channel" in a:
            g["channel"] = _number(a, "pipegrid_channel", where, kinds=("int32",))
    elif t == COLL:
        ctype = _number(a, "comm_type", where, ALL_REDUCE, ("int64", "int32"))
        if ctype != ALL_REDUCE:
            raise ValueError(f"{where}: collective type {ctype}; only all-reduce is supported")
        g["type"] = "allreduce"
        group = a.get("pipegrid_group", (None, None))[1]
        try:
            g["group"] = [int(x) for x in group.split(",")] if group else sorted(ranks)
        except (ValueError, AttributeError):
            raise ValueError(f"{where}: pipegrid_group {group!r}, expected ranks like \"0,1,2,3\"") from None
        g["bytes"] = _size(a, where)
        g["tag"] = _number(a, "comm_tag", where, 0, ("int32", "int64"))
    else:
        raise ValueError(f"{where}: node type {t} is not supported "
                         f"(compute, send, receive and all-reduce nodes are)")
    return g


def ranks_to_graph(ranks):
    """A trace graph from {rank: [nodes]} (global ids: rank-major)."""
    gid, first = {}, {}
    for r in sorted(ranks):
        for n in ranks[r]:
            if (r, n["id"]) in gid:
                raise ValueError(f"rank {r} node {n['id']} ({n['name']}): a second node with id {n['id']} "
                                 f"(the first: {first[(r, n['id'])]})")
            gid[(r, n["id"])] = len(gid)
            first[(r, n["id"])] = n["name"]
    out = [_node_to_graph(r, n, gid, ranks) for r in sorted(ranks) for n in ranks[r]]
    return {"format": "pipegrid-trace-graph", "version": 1, "ranks": len(ranks), "nodes": out}


def rank_files(directory, prefix):
    """{rank: path} of DIR/PREFIX.<rank>.et."""
    files = {}
    for name in os.listdir(directory):
        if name.startswith(prefix + ".") and name.endswith(".et"):
            middle = name[len(prefix) + 1:-3]
            if middle.isdigit():
                files[int(middle)] = os.path.join(directory, name)
    if not files or sorted(files) != list(range(len(files))):
        raise ValueError(f"{directory}: expected {prefix}.0.et, {prefix}.1.et, ... (found ranks {sorted(files)})")
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(prog="chakra.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    enc = sub.add_parser("encode")
    enc.add_argument("graph")
    enc.add_argument("directory")
    enc.add_argument("--prefix", default="pipegrid")
    dec = sub.add_parser("decode")
    dec.add_argument("directory")
    dec.add_argument("--prefix", default="pipegrid")
    dec.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    try:
        if args.command == "encode":
            with open(args.graph) as f:
                graph = json.load(f)
            os.makedirs(args.directory, exist_ok=True)
            ranks = graph_to_ranks(graph)
            for r, nodes in ranks.items():
                write_rank(os.path.join(args.directory, f"{args.prefix}.{r}.et"), nodes)
            print(f"chakra.py: wrote {len(ranks)} traces, {sum(len(n) for n in ranks.values())} nodes, "
                  f"to {args.directory}/{args.prefix}.<rank>.et", file=sys.stderr)
        else:
            ranks = {r: read_rank(p) for r, p in rank_files(args.directory, args.prefix).items()}
            text = json.dumps(ranks_to_graph(ranks), allow_nan=False)
            if args.output:
                with open(args.output, "w") as f:
                    f.write(text)
            else:
                print(text)
    except (OSError, ValueError, KeyError) as e:
        print(f"chakra.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
