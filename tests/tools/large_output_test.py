#!/usr/bin/env python3
"""ctest tools/large_output: `run` on 16,384 devices reads in its first lines (issue 52, item 3): under 80
lines in all; the answer (iteration time, throughput, MFU, the breakdown, peak memory per device group)
within the first 20; stages alike share a row; the replay says it folded; the JSON leaves the
16,384 per-device entries out unless --devices all asks for them; and the Perfetto trace keeps one
representative per pipeline rank with --timeline-rows ranks.

Usage: large_output_test.py PIPEGRID EXPERIMENT"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    pipegrid, experiment = sys.argv[1], sys.argv[2]
    failures = []
    r = subprocess.run([pipegrid, "run", experiment], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    if r.returncode != 0:
        failures.append(f"run: exit {r.returncode}: {r.stderr}")
    if len(lines) >= 80:
        failures.append(f"run printed {len(lines)} lines (expected under 80)")
    head = "\n".join(lines[:20])
    for answer in ("iteration time", "throughput", "model FLOP/s", "MFU", "time per device", "peak memory"):
        if answer not in head:
            failures.append(f"'{answer}' is not in the first 20 lines")
    if not any(l.startswith("replay           folded:") for l in lines):
        failures.append("the replay line does not say it folded")
    if not any(l.startswith("1-30 ") and "(1 layer each)" in l for l in lines):
        failures.append("stages 1-30, alike, do not share a row")
    j = subprocess.run([pipegrid, "run", experiment, "--json"], capture_output=True, text=True)
    doc = json.loads(j.stdout)
    if "devices" in doc or "16384 devices, alike in" not in doc.get("devices_left_out", ""):
        failures.append("--json lists every device without --devices all")
    if len(doc.get("device_groups", [])) != 32:
        failures.append(f"--json has {len(doc.get('device_groups', []))} device groups (expected 32 pipeline ranks)")
    # The Perfetto trace keeps one representative per pipeline rank with --timeline-rows ranks (a small
    # run: Mixtral 8x7B on 64 H100s, p 4) and the window's micro-batches.
    mixtral = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(experiment)))),
                           "experiments", "zoo", "mixtral-8x7b-h100.yaml")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        t = subprocess.run([pipegrid, "run", mixtral, "--timeline-rows", "ranks", "--timeline-window", "0:1",
                            "--trace", path], capture_output=True, text=True)
        events = json.load(open(path))["traceEvents"] if t.returncode == 0 else []
        pids = {e["pid"] for e in events}
        batches = {e["args"]["micro_batch"] for e in events if e.get("ph") == "X" and "micro_batch" in e.get("args", {})}
        if len(pids) != 4 or not batches <= {0, 1}:
            failures.append(f"--trace with ranks and window 0:1: {len(pids)} devices (expected 4), micro-batches {sorted(batches)}")
    for f in failures:
        print("FAIL", f)
    print(f"large_output: {len(lines)} lines, {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
