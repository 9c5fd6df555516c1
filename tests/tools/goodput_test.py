#!/usr/bin/env python3
"""ctest tools/goodput: `pipegrid goodput` (issue 53) against closed forms computed here, independently:
Daly's expected time for the replayed iteration (the Monte Carlo's mean within its 99.9% interval, the
printed closed form to 1e-9), the interval rounded to whole iterations, the Llama 3 failure model's
MTBF (419 interruptions in 54 days on 16,384 GPUs, per GPU-day, times the job's GPUs), the checkpoint
write from the model state, and bad options refused with exit 2 before any replay.

Usage: goodput_test.py PIPEGRID REPO_ROOT"""
import json
import math
import os
import subprocess
import sys


def daly(work, tau, write, restart, mtbf):
    def segment(c):
        return mtbf * math.exp(restart / mtbf) * math.expm1((c + write) / mtbf) if c > 0 else 0.0
    full = math.floor(work / tau)
    return full * segment(tau) + segment(work - full * tau)


def main():
    pipegrid, root = sys.argv[1], sys.argv[2]
    exp = os.path.join(root, "experiments", "zoo", "gpt2-xl-dgx1.yaml")
    failures = []
    args = [pipegrid, "goodput", exp, "--iterations", "20000", "--mtbf", "3600s", "--checkpoint-interval", "600s",
            "--checkpoint-write", "30s", "--restart", "300s", "--trials", "4000", "--seed", "7", "--json"]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        return 1
    j = json.loads(r.stdout)
    it = j["iteration_time_s"]
    tau = max(1, round(600 / it)) * it
    if abs(j["checkpoint_interval_s"] - tau) > 1e-9 * tau:
        failures.append(f"interval {j['checkpoint_interval_s']} s, expected {tau} s (600 s in whole iterations)")
    expected = daly(20000 * it, tau, 30, 300, 3600)
    if abs(j["daly_time_s"] - expected) > 1e-9 * expected:
        failures.append(f"Daly's time {j['daly_time_s']} s, computed here {expected} s")
    if abs(j["expected_time_s"] - expected) > j["expected_time_ci95_s"] * 3.29 / 1.96:
        failures.append(f"Monte Carlo {j['expected_time_s']} +- {j['expected_time_ci95_s']} s vs Daly {expected} s")
    if abs(j["ettr"] - 20000 * it / j["expected_time_s"]) > 1e-12:
        failures.append("ETTR is not useful time / expected time")
    # The default failure model: Llama 3's 419 unexpected interruptions in 54 days on 16,384 GPUs.
    d = json.loads(subprocess.run([pipegrid, "goodput", exp, "--iterations", "1000", "--json"],
                                  capture_output=True, text=True).stdout)
    mtbf = 54 * 86400 * 16384 / (419 * d["gpus"])
    if abs(d["mtbf_s"] - mtbf) > 1e-9 * mtbf:
        failures.append(f"Llama 3 MTBF on {d['gpus']} GPUs: {d['mtbf_s']} s, expected {mtbf} s")
    # Meta's research clusters (Kokolis et al.): per node-day, on the job's machines.
    r2 = json.loads(subprocess.run([pipegrid, "goodput", exp, "--iterations", "1000", "--failures", "rsc2", "--json"],
                                   capture_output=True, text=True).stdout)
    if abs(r2["mtbf_s"] - 86400 / (r2["nodes"] * 2.34e-3)) > 1e-9 * r2["mtbf_s"]:
        failures.append(f"RSC-2 MTBF on {r2['nodes']} nodes: {r2['mtbf_s']} s")
    # Time lost by cause: Table 5's shares of rework + restarts (faulty GPUs 148 of 419).
    causes = dict(d["lost_by_cause_s"])
    lost = d["lost_s"]["rework"] + d["lost_s"]["restart"]
    if abs(sum(causes.values()) - lost) > 1e-9 * max(lost, 1) or abs(causes["faulty GPU"] - lost * 148 / 419) > 1e-9 * max(lost, 1):
        failures.append(f"lost by cause {causes} does not split {lost} s by Table 5's counts")
    # GPT-2 XL (1,557,611,200 parameters, Hugging Face's gpt2-xl) with mixed-precision Adam: 2 bytes of
    # fp16 weights + 4 of fp32 master weights + 8 of moments a parameter; gradients not saved.
    if abs(d["checkpoint_bytes"] - 1557611200 * 14) > 1:
        failures.append(f"GPT-2 XL's checkpoint: {d['checkpoint_bytes']} bytes, expected 1,557,611,200 x 14")
    if abs(d["checkpoint_write_s"] - d["checkpoint_bytes"] / 2e12) > 1e-12:
        failures.append("the write is not the state over the 2 TB/s default")
    for bad, message in ((["--mtbf", "-1s"], "--mtbf"), (["--failures", "lunar"], "--failures"),
                         (["--checkpoint-interval", "0s"], "--checkpoint-interval"), ([], "--tokens or --iterations")):
        b = subprocess.run([pipegrid, "goodput", exp] + bad
                           + ([] if not bad else ["--iterations", "10"]), capture_output=True, text=True)
        if b.returncode != 2 or message not in b.stderr:
            failures.append(f"{bad}: exit {b.returncode}, {b.stderr.strip()!r}")
    for f in failures:
        print("FAIL", f)
    print(f"goodput: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
