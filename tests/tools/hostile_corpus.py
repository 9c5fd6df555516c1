#!/usr/bin/env python3
"""A generated corpus of hostile inputs (issue 16): every case must end with exit status 2, one
`pipegrid: ...` message on stderr that names the file position (FILE:LINE:COLUMN) when the bad
value is in a file, nothing on stdout, no signal and no hang.

The cases are mutations of valid inputs, each breaking one thing, over every input kind:
experiment YAML (each key x values that are wrong for it), cluster files (YAML and SimGrid XML),
model files, PipeDream profiles, schedule CSVs, YAML-level attacks (alias bombs, deep nesting,
duplicate keys, several documents, binary garbage) and command-line flags.

usage: hostile_corpus.py PIPEGRID [--list] [--keep DIR]
"""
import argparse
import concurrent.futures
import copy
import os
import re
import subprocess
import sys
import tempfile

import yaml

BASE = {
    "workload": {"kind": "chain", "layers": 8, "forward": "1ms", "backward": "2ms", "activation": "8MiB",
                 "parameters": "64MiB", "samples_per_micro_batch": 4},
    "cluster": {"kind": "switch", "count": 4, "device": {"name": "gpu", "memory": "16GiB"},
                "bandwidth": "25GBps", "latency": "1us"},
    "strategy": {"partitioner": "uniform", "schedule": "1f1b", "micro_batches": 8},
}

V100_CLUSTER = {"kind": "switch", "count": 4, "device": {"name": "gpu", "model": "v100"}, "bandwidth": "25GBps",
                "latency": "1us"}

# Values that are wrong for every key of a kind. Strings are written as YAML scalars.
BAD_TIME = ["-1ms", "1", "1GB", "nanms", "infms", "1e300h", "1e308s", "", "1 ms ms", [1], {"a": 1}, None]
BAD_BYTES = ["-1MiB", "8", "8s", "1e300TB", "nanB", "infGiB", "", ["8MiB"], None, "8MiBps"]
BAD_BANDWIDTH = ["0GBps", "-1GBps", "25", "25GB", "1e300TBps", "infGBps", "nanGBps", "25GHz", None, [1]]
BAD_COUNT = [0, -1, 1.5, "four", 1e12, 2147483648, None, [4], {"n": 4}, "nan", "inf", True]
BAD_NAME = [[], {}, None, ""]

EXPERIMENT_KEYS = {
    ("workload", "kind"): ["chains", 1, [], None, ""],
    ("workload", "layers"): BAD_COUNT,
    ("workload", "forward"): BAD_TIME,
    ("workload", "backward"): BAD_TIME,
    ("workload", "activation"): BAD_BYTES,
    ("workload", "parameters"): BAD_BYTES,
    ("workload", "samples_per_micro_batch"): [0, -4, "x", "nan", "inf", 1e300, None, []],
    ("workload", "precision"): ["fp64", 16, [], ""],
    ("cluster", "kind"): ["swtich", 3, [], None],
    ("cluster", "count"): BAD_COUNT,
    ("cluster", "device", "memory"): BAD_BYTES,
    ("cluster", "device", "name"): BAD_NAME,
    ("cluster", "device", "model"): ["v101", 3, []],
    ("cluster", "bandwidth"): BAD_BANDWIDTH,
    ("cluster", "latency"): BAD_TIME,
    ("cluster", "sharing"): ["fair", 1, []],
    ("strategy", "partitioner"): ["unifrom", 3, [], None],
    ("strategy", "schedule"): ["1f2b", 3, [], None],
    ("strategy", "micro_batches"): BAD_COUNT,
    ("strategy", "replicas"): [0, -2, 5, 1.5, "two"],
    ("strategy", "stages"): [0, -1, 1000, "x"],
    ("strategy", "allreduce"): ["tree2", 1],
    ("strategy", "planner"): ["lou", 7, []],
}

EXTRA_EXPERIMENT_KEYS = {  # keys that do not belong
    ("strategi",): {"micro_batches": 8},
    ("workload", "forwards"): "1ms",
    ("cluster", "bandwith"): "25GBps",
    ("strategy", "micro_batch"): 8,
}


def dump(doc):
    return yaml.safe_dump(doc, default_flow_style=False, sort_keys=False, allow_unicode=True)


def set_path(doc, path, value):
    d = doc
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def experiment_cases():
    yield "control-experiment", {"exp.yaml": dump(BASE)}, ["run", "exp.yaml"], None
    for path, values in EXPERIMENT_KEYS.items():
        for i, v in enumerate(values):
            doc = copy.deepcopy(BASE)
            set_path(doc, path, v)
            yield "exp-" + ".".join(path) + f"-{i}", {"exp.yaml": dump(doc)}, ["run", "exp.yaml"], True
    for path, v in EXTRA_EXPERIMENT_KEYS.items():
        doc = copy.deepcopy(BASE)
        set_path(doc, path, v)
        yield "exp-extra-" + ".".join(path), {"exp.yaml": dump(doc)}, ["run", "exp.yaml"], True
    for section in ("workload", "cluster", "strategy"):
        for i, v in enumerate([None, [], "x", 3]):
            doc = copy.deepcopy(BASE)
            doc[section] = v
            yield f"exp-{section}-not-a-map-{i}", {"exp.yaml": dump(doc)}, ["run", "exp.yaml"], True


ZOO = [("resnet50", "classes", 0), ("bert-large", "hidden", 0), ("gpt", "sequence", 0), ("dlrm", "width", 0),
       ("gpt", "layers", 0), ("vgg16", "image", 1), ("dlrm", "pooled", 2), ("gpt", "hidden", 10**12),
       ("gpt", "heads", 0), ("gpt", "heads", 7), ("mmt", "branches", -1), ("gnmt8", "layers", 1),
       ("candle-uno", "width", 1.5), ("resnet50", "image", "big")]


def zoo_cases():
    for model, key, value in ZOO:
        doc = copy.deepcopy(BASE)
        doc["workload"] = {"model": model, key: value}
        doc["cluster"] = V100_CLUSTER
        yield f"zoo-{model}-{key}-{value}", {"exp.yaml": dump(doc)}, ["run", "exp.yaml"], True


def yaml_attacks():
    base = dump(BASE)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 10):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        bomb += f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
    yield "yaml-alias-bomb", {"exp.yaml": bomb + base}, ["run", "exp.yaml"], True
    yield "yaml-alias-bomb-in-value", {"exp.yaml": bomb.replace("a: &a", "workload: &a", 1)}, ["run", "exp.yaml"], True
    yield "yaml-deep-lists", {"exp.yaml": "workload: " + "[" * 100000 + "]" * 100000 + "\n"}, ["run", "exp.yaml"], True
    yield "yaml-deep-maps", {"exp.yaml": "workload: " + "{a: " * 20000 + "1" + "}" * 20000 + "\n"}, ["run", "exp.yaml"], True
    yield "yaml-duplicate-key", {"exp.yaml": base + "strategy: {micro_batches: 2}\n"}, ["run", "exp.yaml"], True
    yield "yaml-two-documents", {"exp.yaml": base + "---\n" + base}, ["run", "exp.yaml"], True
    yield "yaml-unclosed-bracket", {"exp.yaml": "workload: {kind: chain\n"}, ["run", "exp.yaml"], True
    yield "yaml-tab-indent", {"exp.yaml": base.replace("  kind: chain", "\tkind: chain")}, ["run", "exp.yaml"], True
    yield "yaml-empty", {"exp.yaml": ""}, ["run", "exp.yaml"], False
    yield "yaml-only-comment", {"exp.yaml": "# nothing\n"}, ["run", "exp.yaml"], False
    yield "yaml-scalar-document", {"exp.yaml": "42\n"}, ["run", "exp.yaml"], True
    yield "yaml-list-document", {"exp.yaml": "- 1\n- 2\n"}, ["run", "exp.yaml"], True
    yield "yaml-binary", {"exp.yaml": "\x00\x01\x02\xff\xfe garbage"}, ["run", "exp.yaml"], False
    # A raw 0xFF byte (written through surrogateescape): not UTF-8.
    yield "yaml-bad-utf8-name", {"exp.yaml": base.replace("name: gpu", "name: gp\udcffu")}, ["run", "exp.yaml"], True
    yield "yaml-long-key", {"exp.yaml": base + "k" * 100000 + ": 1\n"}, ["run", "exp.yaml"], True
    yield "yaml-merge-key", {"exp.yaml": base.replace("strategy:\n", "strategy:\n  <<: {micro_batches: 1}\n")}, ["run", "exp.yaml"], True
    yield "yaml-tag", {"exp.yaml": base.replace("layers: 8", "layers: !!binary AAAA")}, ["run", "exp.yaml"], True


CLUSTER = {
    "devices": [{"name": "gpu0", "model": "v100"}, {"name": "gpu1", "model": "v100"}],
    "switches": [{"name": "sw"}],
    "links": [{"between": ["gpu0", "sw"], "bandwidth": "25GBps", "latency": "1us"},
              {"between": ["gpu1", "sw"], "bandwidth": "25GBps", "latency": "1us"}],
}


def cluster_cases():
    exp = dump({"workload": BASE["workload"], "cluster": {"file": "c.yaml"}, "strategy": BASE["strategy"]})
    yield "control-cluster", {"exp.yaml": exp, "c.yaml": dump(CLUSTER)}, ["run", "exp.yaml"], None
    muts = []
    for i, v in enumerate(BAD_BANDWIDTH):
        muts.append((f"link-bandwidth-{i}", ("links", 0, "bandwidth"), v))
    for i, v in enumerate(BAD_TIME):
        muts.append((f"link-latency-{i}", ("links", 1, "latency"), v))
    for i, v in enumerate([["gpu0"], ["gpu0", "gpu0"], ["gpu0", "nowhere"], "gpu0", [], None, ["gpu0", "sw", "gpu1"]]):
        muts.append((f"link-between-{i}", ("links", 0, "between"), v))
    for i, v in enumerate(["v101", 3, [], None, ""]):
        muts.append((f"device-model-{i}", ("devices", 0, "model"), v))
    for i, v in enumerate(BAD_NAME + ["gpu1", "sw"]):
        muts.append((f"device-name-{i}", ("devices", 0, "name"), v))
    for i, v in enumerate([None, [], "x", 1]):
        muts.append((f"devices-{i}", ("devices",), v))
    for i, v in enumerate([None, "x", 1, [{"between": ["gpu0", "sw"]}]]):
        muts.append((f"links-{i}", ("links",), v))
    for name, path, v in muts:
        doc = copy.deepcopy(CLUSTER)
        set_path(doc, path, v)
        yield "cluster-" + name, {"exp.yaml": exp, "c.yaml": dump(doc)}, ["run", "exp.yaml"], True
    # Semantic errors with a location: a disconnected device, a duplicate link.
    doc = copy.deepcopy(CLUSTER)
    doc["devices"].append({"name": "gpu2", "model": "v100"})
    yield "cluster-disconnected", {"exp.yaml": exp, "c.yaml": dump(doc)}, ["run", "exp.yaml"], True
    doc = copy.deepcopy(CLUSTER)
    doc["links"].append(copy.deepcopy(doc["links"][0]))
    yield "cluster-duplicate-link", {"exp.yaml": exp, "c.yaml": dump(doc)}, ["run", "exp.yaml"], True


XML_HEAD = '<?xml version="1.0"?>\n<platform version="4.1">\n'
XML_OK = (XML_HEAD + '<zone id="z" routing="Full">\n'
          '<host id="gpu0" speed="1Gf"/>\n<host id="gpu1" speed="1Gf"/>\n'
          '<link id="l" bandwidth="25GBps" latency="1us"/>\n'
          '<route src="gpu0" dst="gpu1"><link_ctn id="l"/></route>\n</zone>\n</platform>\n')


def xml_cases():
    exp = dump({"workload": BASE["workload"], "cluster": {"file": "c.xml", "device": {"model": "v100"}},
                "strategy": BASE["strategy"]})
    yield "control-xml", {"exp.yaml": exp, "c.xml": XML_OK}, ["run", "exp.yaml"], None
    muts = [
        ("speed-negative", 'speed="1Gf"', 'speed="-1Gf"'),
        ("speed-inf", 'speed="1Gf"', 'speed="infGf"'),
        ("speed-huge", 'speed="1Gf"', 'speed="1e300Gf"'),
        ("speed-unit", 'speed="1Gf"', 'speed="1GB"'),
        ("bandwidth-zero", 'bandwidth="25GBps"', 'bandwidth="0GBps"'),
        ("bandwidth-unit", 'bandwidth="25GBps"', 'bandwidth="25us"'),
        ("latency-negative", 'latency="1us"', 'latency="-1us"'),
        ("latency-huge", 'latency="1us"', 'latency="1e300h"'),
        ("route-unknown-link", '<link_ctn id="l"/>', '<link_ctn id="nope"/>'),
        ("route-unknown-host", 'src="gpu0"', 'src="gpu9"'),
        ("duplicate-host", '<host id="gpu1"', '<host id="gpu0"'),
        ("routing-unknown", 'routing="Full"', 'routing="Magic"'),
        ("unknown-element", "</zone>", "<frobnicate/></zone>"),
        ("unknown-attribute", '<host id="gpu0"', '<host colour="red" id="gpu0"'),
        ("not-platform", "<platform", "<plattform"),
        ("bad-version", 'version="4.1"', 'version="9"'),
        ("unclosed", "</platform>", ""),
        # An internal entity used as a value: never expanded, so "&a;" is not a speed.
        ("entity", XML_HEAD + '<zone id="z" routing="Full">\n<host id="gpu0" speed="1Gf"/>',
         '<?xml version="1.0"?>\n<!DOCTYPE p [<!ENTITY a "1Gf">]>\n<platform version="4.1">\n'
         '<zone id="z" routing="Full">\n<host id="gpu0" speed="&a;"/>'),
        # Semantic errors found once the whole platform is read, located at the element they are
        # about: the <host> no route reaches (before: the file's name only, from the run).
        ("no-route", '<route src="gpu0" dst="gpu1"><link_ctn id="l"/></route>', ""),
        ("unreached-host", '<host id="gpu1" speed="1Gf"/>\n',
         '<host id="gpu1" speed="1Gf"/>\n<host id="gpu2" speed="1Gf"/>\n'),
    ]
    for name, old, new in muts:
        assert old in XML_OK, name
        yield "xml-" + name, {"exp.yaml": exp, "c.xml": XML_OK.replace(old, new, 1)}, ["run", "exp.yaml"], True


MODEL = {"name": "m", "layers": [
    {"name": "x", "kind": "input", "shape": [3, 32, 32]},
    {"name": "conv", "kind": "conv2d", "in_channels": 3, "out_channels": 16, "kernel": 3, "padding": 1},
    {"name": "pool", "kind": "maxpool", "kernel": 2},
    {"name": "flat", "kind": "flatten"},
    {"name": "fc", "kind": "linear", "in_features": 4096, "out_features": 10},
]}


def model_cases():
    exp = dump({"workload": {"file": "m.yaml"}, "cluster": V100_CLUSTER, "strategy": BASE["strategy"]})
    yield "control-model", {"exp.yaml": exp, "m.yaml": dump(MODEL)}, ["run", "exp.yaml"], None
    muts = []
    for i, v in enumerate([[], [0, 32, 32], [-3, 32, 32], [3, 32], "3x32x32", None, [1e12, 1e12, 1e12], [3.5, 32, 32]]):
        muts.append((f"shape-{i}", (0, "shape"), v))
    for i, v in enumerate([0, -1, 2, 1e12, "three", None]):
        muts.append((f"conv-in-{i}", (1, "in_channels"), v))
    for i, v in enumerate([0, -1, 64, 1e9, None]):
        muts.append((f"conv-kernel-{i}", (1, "kernel"), v))
    for i, v in enumerate([0, -1, 3, 100]):
        muts.append((f"conv-groups-{i}", (1, "groups"), v))
    for i, v in enumerate([0, -1, 40, "x"]):
        muts.append((f"pool-kernel-{i}", (2, "kernel"), v))
    for i, v in enumerate([0, -1, 4095, 4097, None]):
        muts.append((f"fc-in-{i}", (4, "in_features"), v))
    for i, v in enumerate([0, -10, "ten"]):
        muts.append((f"fc-out-{i}", (4, "out_features"), v))
    for i, v in enumerate(["conv3d", 1, None, ""]):
        muts.append((f"kind-{i}", (3, "kind"), v))
    for i, v in enumerate([["nowhere"], ["fc"], "x", [3], [None]]):
        muts.append((f"inputs-{i}", (2, "inputs"), v))
    for i, v in enumerate(["conv", "", None, [5]]):
        muts.append((f"name-{i}", (2, "name"), v))
    for name, (idx, key), v in muts:
        doc = copy.deepcopy(MODEL)
        doc["layers"][idx][key] = v
        yield "model-" + name, {"exp.yaml": exp, "m.yaml": dump(doc)}, ["run", "exp.yaml"], True
    for i, v in enumerate([None, [], "x", [1, 2]]):
        doc = copy.deepcopy(MODEL)
        doc["layers"] = v
        yield f"model-layers-{i}", {"exp.yaml": exp, "m.yaml": dump(doc)}, ["run", "exp.yaml"], True


PROFILE = ("node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
           "activation_size=602112.0, parameter_size=0.000\n"
           "node2 -- Conv2d(3, 64) -- forward_compute_time=1.500, backward_compute_time=3.000, "
           "activation_size=12845056.0, parameter_size=7168.000\n"
           "node3 -- ReLU() -- forward_compute_time=0.250, backward_compute_time=0.500, "
           "activation_size=12845056.0, parameter_size=0.000\n"
           "\tnode1 -- node2\n\tnode2 -- node3\n")


def profile_cases():
    exp = dump({"workload": {"profile": "p.txt", "batch": 32, "device": "v100"}, "cluster": V100_CLUSTER,
                "strategy": {"partitioner": "uniform", "schedule": "1f1b", "micro_batches": 4}})
    yield "control-profile", {"exp.yaml": exp, "p.txt": PROFILE}, ["run", "exp.yaml"], None
    muts = [
        ("forward-negative", "forward_compute_time=1.500", "forward_compute_time=-1.500"),
        ("forward-inf", "forward_compute_time=1.500", "forward_compute_time=inf"),
        ("forward-nan", "forward_compute_time=1.500", "forward_compute_time=nan"),
        ("forward-huge", "forward_compute_time=1.500", "forward_compute_time=1e308"),
        ("forward-text", "forward_compute_time=1.500", "forward_compute_time=fast"),
        ("activation-negative", "activation_size=12845056.0", "activation_size=-1"),
        ("activation-huge", "activation_size=12845056.0", "activation_size=1e300"),
        ("parameter-inf", "parameter_size=7168.000", "parameter_size=infinity"),
        ("missing-field", ", parameter_size=7168.000", ""),
        ("edge-unknown", "\tnode2 -- node3", "\tnode2 -- node9"),
        ("edge-self", "\tnode2 -- node3", "\tnode2 -- node2"),
        ("cycle", "\tnode2 -- node3\n", "\tnode2 -- node3\n\tnode3 -- node2\n"),
        ("duplicate-node", "node3 -- ReLU()", "node2 -- ReLU()"),
        ("garbage-line", "\tnode1 -- node2\n", "\tnode1 -- node2\nthis is not a profile line\n"),
        ("no-separator", "node3 -- ReLU() -- ", "node3 ReLU() "),
    ]
    for name, old, new in muts:
        assert old in PROFILE, name
        yield "profile-" + name, {"exp.yaml": exp, "p.txt": PROFILE.replace(old, new, 1)}, ["run", "exp.yaml"], True
    yield "profile-empty", {"exp.yaml": exp, "p.txt": ""}, ["run", "exp.yaml"], False  # no line to name


SCHEDULE = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"  # one line per rank: stage, F/B, micro-batch


def schedule_cases():
    doc = copy.deepcopy(BASE)
    doc["cluster"]["count"] = 2
    doc["strategy"] = {"partitioner": "uniform", "schedule": "file", "schedule_file": "s.csv", "micro_batches": 2}
    exp = dump(doc)
    yield "control-schedule", {"exp.yaml": exp, "s.csv": SCHEDULE}, ["run", "exp.yaml"], None
    muts = [
        ("unknown-action", "0F1,", "0X1,"),
        ("negative-mb", "0F1,", "0F-1,"),
        ("mb-out-of-range", "0F1,", "0F7,"),
        ("stage-out-of-range", "1F0,", "5F0,"),
        ("stage-text", "1F0,", "oneF0,"),
        ("missing-mb", "0F0,0F1,0B0,0B1", "0F0,0B0,0B1"),
        ("duplicate", "0F1,", "0F1,0F1,"),
        ("backward-before-forward", "0F0,0F1,0B0", "0B0,0F0,0F1"),
        ("too-many-ranks", "1B1\n", "1B1\n0F0\n"),
        ("other-stage", "1F0,", "0F0,"),
        # Rank 0 waits for 1B0 before its F1; rank 1 waits for 0F1 before its B0.
        ("deadlock", SCHEDULE, "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n"),
    ]
    for name, old, new in muts:
        assert old in SCHEDULE, name
        yield "schedule-" + name, {"exp.yaml": exp, "s.csv": SCHEDULE.replace(old, new, 1)}, ["run", "exp.yaml"], True


def cli_cases():
    exp = dump(BASE)
    flags = [
        ["run", "exp.yaml", "--frobnicate"],
        ["run", "exp.yaml", "--trace"],
        ["run", "exp.yaml", "--trace", "exp.yaml"],
        ["run", "exp.yaml", "--trace", "t.json", "--tasks", "t.json"],
        ["run", "exp.yaml", "--trace", "nodir/t.json"],
        ["run", "missing.yaml"],
        ["run", "."],
        ["run", ""],
        ["schedule", "1f1b", "-p", "0", "-m", "4"],
        ["schedule", "1f1b", "-p", "4", "-m", "-1"],
        ["schedule", "1f1b", "-p", "nan", "-m", "4"],
        ["schedule", "1f2b", "-p", "4", "-m", "4"],
        ["workload", "show", "resnet51"],
        ["workload", "show", "vgg16", "-b", "0"],
        ["workload", "show", "vgg16", "-b", "nan"],
        ["workload", "show", "vgg16", "--precision", "fp64"],
        ["workload", "show", "p.txt", "--profile-batch", "inf"],
        ["device", "show", "v101"],
        ["cluster", "show", "nopreset"],
        ["cluster", "bench", "dgx-a100-16", "--sizes", "1e300B"],
        ["cluster", "bench", "dgx-a100-16", "--sizes", "-1MiB"],
        ["cluster", "bench", "dgx-a100-16", "--devices", "0"],
        ["cluster", "bench", "dgx-a100-16", "--op", "broadcast"],
        ["plan", ""],
        ["list", "nothing"],
        ["frobnicate"],
    ]
    for i, argv in enumerate(flags):
        yield f"cli-{i}-" + "-".join(a for a in argv[:2] if a), {"exp.yaml": exp, "p.txt": PROFILE}, argv, False


def all_cases():
    for gen in (experiment_cases, zoo_cases, yaml_attacks, cluster_cases, xml_cases, model_cases, profile_cases, schedule_cases,
                cli_cases):
        yield from gen()


LOCATED = re.compile(r"^pipegrid: [^\n]*\.(yaml|xml|txt|csv):\d+(:\d+)?: ")


def check(pipegrid, case, keep):
    name, files, argv, located = case
    with tempfile.TemporaryDirectory(prefix="pipegrid-hostile-") as tmp:
        for fname, text in files.items():
            with open(os.path.join(tmp, fname), "wb") as f:
                f.write(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
        try:
            r = subprocess.run([pipegrid] + argv, cwd=tmp, capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            return name, "hung (60 s)"
        if keep:
            d = os.path.join(keep, name)
            os.makedirs(d, exist_ok=True)
            for fname, text in files.items():
                with open(os.path.join(d, fname), "w", errors="surrogateescape") as f:
                    f.write(text)
        err = r.stderr.decode("utf-8", "replace")
        if located is None:  # a control: the unmutated input must run
            return name, None if r.returncode == 0 else f"control failed, exit {r.returncode}: {err[-300:]}"
        if r.returncode < 0:
            return name, f"killed by signal {-r.returncode}: {err[-300:]}"
        if r.returncode != 2:
            return name, f"exit {r.returncode} (expected 2): {err[-300:]}"
        if not err.startswith("pipegrid: "):
            return name, f"message does not start with 'pipegrid: ': {err[:300]!r}"
        if r.stdout:
            return name, f"printed on stdout: {r.stdout[:200]!r}"
        if located and not LOCATED.match(err):
            return name, f"no FILE:LINE:COLUMN: {err[:300]!r}"
    return name, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pipegrid")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--keep", help="also write every case's files to DIR/NAME/")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    cases = list(all_cases())
    names = [c[0] for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    if a.list:
        print("\n".join(names))
        return 0
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.j) as pool:
        for name, problem in pool.map(lambda c: check(a.pipegrid, c, a.keep), cases):
            if problem:
                failures.append((name, problem))
    for name, problem in failures:
        print(f"FAIL {name}: {problem}")
    print(f"{len(cases)} hostile cases, {len(cases) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
