#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora: SOURCE OUT -> OUT/<fuzzer>/<name>.

Seeds come from files in the repository (nothing beside the clone), never from a network:
  experiment  experiments/**/*.yaml, tests/tools/bad_inputs/*.yaml, the hostile corpus's exp.yaml
  cluster     topologies/clusters/*.yaml, bad_inputs/clusters/*.yaml, the hostile corpus's c.yaml
  platform    bad_inputs/clusters/*.xml, the hostile corpus's c.xml
  model       bad_inputs/models/*.yaml, the model files under experiments/, the corpus's m.yaml
  profile     workloads/profiles/{pipedream,dapple}/*.txt, bad_inputs/profiles, the corpus's p.txt
  schedule    bad_inputs/schedules/*.csv, the corpus's s.csv, and valid 1F1B/GPipe/interleaved CSVs
  jobs        the jobs and queue files under experiments/jobs/ and tests/tools/ (jobs_*.yaml,
              bad_jobs/*.yaml); their experiment paths resolve against the harness's made-up name
  sweep       the sweep files under experiments/ with their base experiment inlined (a base: path
              resolves against the harness's made-up name and is not found), and a few written here
              that reach every axis form, zip groups and the filter language
Files above 64 KiB are left out (the fuzzers run with -max_len 65536).

It also writes OUT/../dict/<fuzzer>.dict, libFuzzer dictionaries: the word-like string literals
(keys, kinds, units, element and attribute names, actions) of the sources that read each format.
"""
import glob
import importlib.util
import os
import re
import sys

MAX = 65536


def main():
    src, out = sys.argv[1:3]
    seeds = {k: {} for k in ("experiment", "cluster", "platform", "model", "profile", "schedule", "sweep", "jobs")}

    def add(kind, name, data):
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if len(data) <= MAX:
            seeds[kind][name] = data

    # Inputs that test the work-size limits (work_*.yaml, huge-*.xml) hold sizes just above them, and
    # their mutants (a digit dropped) build clusters of thousands of devices: seeds of those would
    # slow every fuzzer down a hundredfold for no new path.
    def add_files(kind, pattern, prefix):
        for path in sorted(glob.glob(pattern, recursive=True)):
            if os.path.basename(path).startswith(("work_", "huge-")):
                continue
            with open(path, "rb") as f:
                add(kind, prefix + os.path.relpath(path, os.path.dirname(pattern.split("*")[0])), f.read())

    bad = os.path.join(src, "tests/tools/bad_inputs")
    for path in sorted(glob.glob(os.path.join(src, "experiments/**/*.yaml"), recursive=True)):
        with open(path, "rb") as f:
            data = f.read()
        # Model files have a top-level `layers:` list; experiments have `workload:`.
        kind = "experiment" if b"workload:" in data else "model" if b"\nlayers:" in data or data.startswith(b"layers:") else None
        if kind:
            add(kind, "repo-" + os.path.relpath(path, src), data)
    add_files("experiment", os.path.join(bad, "*.yaml"), "bad-")
    add_files("cluster", os.path.join(src, "topologies/clusters/*.yaml"), "preset-")
    add_files("cluster", os.path.join(bad, "clusters/*.yaml"), "bad-")
    add_files("platform", os.path.join(bad, "clusters/*.xml"), "bad-")
    add_files("model", os.path.join(bad, "models/*.yaml"), "bad-")
    add_files("profile", os.path.join(src, "workloads/profiles/pipedream/*.txt"), "pipedream-")
    add_files("profile", os.path.join(src, "workloads/profiles/dapple/*.txt"), "dapple-")
    add_files("profile", os.path.join(bad, "profiles/*.txt"), "bad-")
    add_files("schedule", os.path.join(bad, "schedules/*.csv"), "bad-")
    # Valid schedules for the harness's plan (4 ranks, 4 micro-batches); the harness plans 2 chunks
    # per rank for an input of odd length, 1 for an even length.
    def even(t):
        return t if len(t) % 2 == 0 else t + "\n"

    def odd(t):
        return t if len(t) % 2 == 1 else t + "\n"

    add("schedule", "valid-gpipe.csv", even("".join(
        ",".join([f"{r}F{m}" for m in range(4)] + [f"{r}B{m}" for m in range(4)]) + "\n" for r in range(4))))
    add("schedule", "valid-1f1b.csv", even("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1F1,1F2,1B0,1F3,1B1,1B2,1B3\n"
        "2F0,2F1,2B0,2F2,2B1,2F3,2B2,2B3\n3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3\n"))
    add("schedule", "valid-interleaved.csv", odd("".join(
        ",".join([f"{r + 4 * c}F{m}" for c in range(2) for m in range(4)] +
                 [f"{r + 4 * c}B{m}" for c in (1, 0) for m in range(4)]) + "\n" for r in range(4))))
    # A V placement read from the rows (stages r and 7 - r on rank r) with an OVERLAP_F_B pair on rank 0.
    v_rows = [[f"{r}F{m}" for m in range(4)] + [f"{7 - r}F{m}" for m in range(4)] +
              [f"{7 - r}B{m}" for m in range(4)] + [f"{r}B{m}" for m in range(4)] for r in range(4)]
    v_rows[0][5] = "(7F1;7B0)OVERLAP_F_B"
    v_rows[0].remove("7B0")
    add("schedule", "valid-v-pair.csv", odd("".join(",".join(x) + "\n" for x in v_rows)))

    for path in sorted(glob.glob(os.path.join(src, "experiments/**/*.yaml"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        base = re.search(r"^base: *(\S+)", text, re.M)
        if not base or not re.search(r"^(grid|zip):", text, re.M):
            continue
        with open(os.path.join(os.path.dirname(path), base.group(1)), encoding="utf-8") as f:
            inline = "experiment:\n" + "".join("  " + line + "\n" for line in f.read().splitlines())
        add("sweep", "repo-" + os.path.relpath(path, src), text[:base.start()] + inline + text[base.end() + 1:])
    chain = ("experiment:\n  workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 1MiB,"
             " parameters: 1MiB}\n  cluster: {kind: switch, count: 4, bandwidth: 25GBps, latency: 1us}\n"
             "  strategy: {partitioner: uniform, schedule: 1f1b, micro_batches: 4}\n")
    add("sweep", "grid-where.yaml", chain + "grid:\n  strategy.micro_batches: [4, 8, 16]\n  cluster.count: [2, 4]\n"
        "where: \"cluster.count * strategy.micro_batches <= 32\"\n"
        "skip: [\"cluster.count == 2 and not (strategy.micro_batches > 4 or strategy.micro_batches / 2 < 1)\"]\n")
    add("sweep", "zip-groups.yaml", chain + "zip:\n  - cluster.bandwidth: [25GBps, 50GBps]\n"
        "    cluster.latency: [1us, 2us]\n  - strategy.schedule: [gpipe, 1f1b]\n    strategy.micro_batches: [4, 8]\n"
        "skip: \"strategy.schedule == 'gpipe' and cluster.bandwidth >= 50GBps - 1\"\n")
    add("sweep", "ranges.yaml", chain + "grid:\n  cluster.bandwidth: {from: 10GBps, to: 40GBps, times: 2}\n"
        "  cluster.latency: {from: 1us, to: 3us, step: 1us}\n  workload.forward: {scale: [0.5, 2]}\n"
        "  strategy.micro_batches: {values: [4, 8]}\n  workload.layers: {scale: [1, 2], of: 4}\n")
    for path in sorted(glob.glob(os.path.join(src, "experiments/jobs/*.yaml")) +
                       glob.glob(os.path.join(src, "tests/tools/jobs_*.yaml")) +
                       glob.glob(os.path.join(src, "tests/tools/bad_jobs/*.yaml"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if re.search(r"^(jobs|queue):", text, re.M):
            add("jobs", "repo-" + os.path.relpath(path, src), text)
    spec = importlib.util.spec_from_file_location("hostile_corpus", os.path.join(src, "tests/tools/hostile_corpus.py"))
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    kinds = {"exp.yaml": "experiment", "c.yaml": "cluster", "c.xml": "platform", "m.yaml": "model",
             "p.txt": "profile", "s.csv": "schedule"}
    for name, files, _argv, _located in corpus.all_cases():
        for fname, text in files.items():
            if fname in kinds:
                add(kinds[fname], "hostile-" + name, text)

    for kind, files in seeds.items():
        d = os.path.join(out, kind)
        os.makedirs(d, exist_ok=True)
        wanted = set()
        for name, data in files.items():
            fname = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
            wanted.add(fname)
            path = os.path.join(d, fname)
            if not os.path.exists(path) or open(path, "rb").read() != data:
                with open(path, "wb") as f:
                    f.write(data)
        for stale in set(os.listdir(d)) - wanted:
            os.remove(os.path.join(d, stale))
        print(f"{kind}: {len(files)} seeds")
    write_dictionaries(src, os.path.join(os.path.dirname(os.path.abspath(out)), "dict"))
    return 0


READERS = {
    "experiment": ["tools/input/*.cc", "core/units.cc", "core/registry.cc", "core/models/zoo.cc"],
    "cluster": ["tools/input/cluster_yaml.cc", "tools/input/device_yaml.cc", "tools/input/yaml_node.cc",
                "core/units.cc", "topologies/devices.yaml"],
    "platform": ["tools/input/simgrid_xml.cc"],
    "model": ["tools/input/model_yaml.cc", "tools/input/yaml_node.cc", "core/models/builder.cc", "core/units.cc"],
    "profile": ["core/models/pipedream_profile.cc"],
    "schedule": ["core/schedule.cc"],
    "sweep": ["tools/sweep/sweep.cc", "tools/input/*.cc", "core/units.cc", "core/registry.cc"],
    "jobs": ["tools/input/*.cc", "core/units.cc", "core/registry.cc", "core/jobs.cc"],
}
WORD = re.compile(r'"([A-Za-z_][A-Za-z0-9_:.+-]{0,30}=?)"')


def write_dictionaries(src, out):
    os.makedirs(out, exist_ok=True)
    for kind, patterns in READERS.items():
        words = set()
        for pattern in patterns:
            for path in glob.glob(os.path.join(src, pattern)):
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                words.update(WORD.findall(text))
                if path.endswith(".yaml"):  # the catalog: device names and keys
                    words.update(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_-]*):", text, re.M))
        if kind in ("experiment", "cluster", "model", "sweep", "jobs"):
            words.update(w + ":" for w in list(words) if not w.endswith("="))
            words.update(["{", "}", "[", "]", "- ", ": ", "&a", "*a", "---", "<<: "])
        elif kind == "platform":
            words.update(["<", ">", "/>", "</", "=\"", "<?xml version=\"1.0\"?>"])
        elif kind == "profile":
            words.update(["node", " -- ", "\t", "::", "[", "]", "; "])
        if kind == "sweep":
            words.update(["and", "or", "not", "==", "!=", "<=", ">=", "(", ")", "'", " * ", " / ",
                          "cluster.count", "strategy.micro_batches", "cluster.device.dsps", "workload.model"])
        elif kind == "schedule":
            words.update([",", "\n", "\r\n", "F", "B", "W", "I", "0F0", "1B2", "0W1"])
        with open(os.path.join(out, kind + ".dict"), "w") as f:
            for w in sorted(words):
                f.write('"' + "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "\\" + c if c in '"\\'
                                      else f"\\x{ord(c):02X}" for c in w) + '"\n')


if __name__ == "__main__":
    sys.exit(main())
