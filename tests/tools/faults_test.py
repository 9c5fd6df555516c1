#!/usr/bin/env python3
"""ctest tools/faults: stragglers and degraded links inside one iteration (issue 53, item 1), against
hand counts. A chain of 1 ms forwards and 2 ms backwards, transfers free, 8 micro-batches of 1F1B
through 4 stages (one per device):
- healthy: (m + p - 1)(F + B) = 11 x 3 = 33 ms;
- gpu3 (the last stage) 2x slower (F 2, B 4): it runs F0 B0 F1 B1 ... back to back once the first
  activation arrives after the upstream forwards (3 x 1 ms), its inputs always ready (upstream is
  faster), and its last gradient goes back through 3 backwards (3 x 2 ms): 3 + 8 x 6 + 6 = 57 ms;
- gpu1 (stage 1) 2x slower: F0 of stage 0 ends at 1; stage 1 runs its p - s = 3 warm-up forwards
  (2 ms each) to 7; its first backward waits for the round trip of micro-batch 0 through stages 2
  and 3 (stage 2 F 3-4, stage 3 F 4-5 B 5-7, stage 2 B 7-9): idle 7-9; then it alternates with no
  gap (its F and B are the slowest) through 8 x 6 ms of work, and stage 0's last backward follows:
  1 + 6 + 2 + (48 - 6) + 2 = 53 ms.
A point-to-point transfer over a link at half bandwidth: two stages on two devices, one micro-batch,
25 MB activations, gpu0's link to the switch at 12.5 GB/s: F0 1 + (2 x 1 us + 25e6 / 12.5e9 = 2.002)
+ F1 1 + B1 2 + the gradient back (2.002) + B0 2 = 10.004 ms (healthy: 8.004).

A link down in a fat-tree (k = 4, devices gpu0-3 in pod 0: gpu0, gpu1 on edge0-0, gpu2, gpu3 on
edge0-1), two stages of two replicas, one micro-batch: gpu0 -> gpu2 climbs to agg0-(2 mod 2 = 0) and
gpu1 -> gpu3 to agg0-1 (destination-mod-k), 25 MB each over 4 links of 1 us at 25 GB/s: 1.004 ms
apart. With edge0-0 - agg0-0 down, gpu0 -> gpu2 is rerouted to the next aggregation switch, agg0-1,
and the two flows share edge0-0 - agg0-1 and agg0-1 - edge0-1: 4 us + 2 x 25e6 / 25e9 = 2.004 ms each
(the gradients back likewise). Iteration: F 1 + 1.004 + F 1 + B 2 + 1.004 + B 2 + the empty
all-reduce's 2 steps x 2 links x 1 us = 8.012 ms healthy, 10.012 ms with the link down. Both of
edge0-0's links up down: no route, exit status 2.

A ring all-reduce over 4 devices on a switch (25 GB/s, 1 us per link: 2 us a route) with gpu0's link
at half bandwidth: one stage of 4 replicas (F 1 ms, B 2 ms each), 64 MiB of gradients, chunks of
16,777,216 bytes. Each of the 2 (4 - 1) = 6 steps waits for the chunk ahead of it on its connection
and for the one it forwards, so every step is paced by the slow link (gpu0's sends and receives at
12.5 GB/s): 3 ms + 6 x (2 us + 16,777,216 / 12.5e9 s) = 3 + 6 x 1.34417728 = 11.06506368 ms (healthy:
3 + 6 x (2 us + 16,777,216 / 25e9 s) = 7.03853184 ms), the bottleneck form 2 (r - 1)(a + S / (r B)).

Usage: faults_test.py PIPEGRID"""
import json
import subprocess
import sys

CHAIN = """workload: {kind: chain, layers: 4, forward: 1ms, backward: 2ms, activation: 0B, parameters: 0B}
cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: 0s}
strategy: {partitioner: uniform, schedule: 1f1b, micro_batches: 8}
"""
P2P = """workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, activation: 25MB, parameters: 0B}
cluster: {kind: switch, count: 2, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: 1us}
strategy: {partitioner: uniform, schedule: 1f1b, micro_batches: 1}
"""
TREE = """workload: {kind: chain, layers: 2, forward: 1ms, backward: 2ms, activation: 25MB, parameters: 0B}
cluster: {kind: fat-tree, k: 4, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: 1us}
strategy: {partitioner: uniform, schedule: 1f1b, stages: 2, replicas: 2, micro_batch_size: 1, micro_batches: 1}
"""
RING = """workload: {kind: chain, layers: 1, forward: 4ms, backward: 8ms, activation: 0B, parameters: 64MiB,
           samples_per_micro_batch: 4}
cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: 1us}
strategy: {partitioner: uniform, schedule: 1f1b, stages: 1, replicas: 4, micro_batches: 1}
"""
CASES = [
    ("a ring all-reduce, healthy", RING, 7.03853184e-3),
    ("a ring all-reduce with one device's link at half bandwidth",
     RING + "faults: {slow_links: [{between: [gpu0, switch], factor: 0.5}]}\n", 11.06506368e-3),
    ("1F1B healthy", CHAIN, 33e-3),
    ("1F1B, the last stage's device 2x slower", CHAIN + "faults: {slow_devices: [{device: gpu3, factor: 2}]}\n", 57e-3),
    ("1F1B, stage 1's device 2x slower", CHAIN + "faults: {slow_devices: [{device: gpu1, factor: 2}]}\n", 53e-3),
    ("a transfer, healthy", P2P, 8.004e-3),
    ("a transfer over a link at half bandwidth",
     P2P + "faults: {slow_links: [{between: [gpu0, switch], factor: 0.5}]}\n", 10.004e-3),
    ("a fat-tree, healthy", TREE, 8.012e-3),
    ("a fat-tree with edge0-0 - agg0-0 down (rerouted)", TREE + "faults: {down_links: [{between: [edge0-0, agg0-0]}]}\n",
     10.012e-3),
]


def main():
    pipegrid = sys.argv[1]
    failures = []
    for name, text, expected in CASES:
        r = subprocess.run([pipegrid, "run", "-", "--json"], input=text, capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{name}: exit {r.returncode}: {r.stderr}")
            continue
        j = json.loads(r.stdout)
        got = j["iteration_time_s"]
        if abs(got - expected) > 1e-9 * expected:
            failures.append(f"{name}: {got * 1e3:.6f} ms, by hand {expected * 1e3:.6f} ms")
        text_out = subprocess.run([pipegrid, "run", "-"], input=text, capture_output=True, text=True).stdout
        if "faults:" in text and "fault: " not in text_out:
            failures.append(f"{name}: the summary's assumptions do not state the fault")
    # Stragglers: round(fraction x machines) machines drawn by the seed, all their devices slower.
    every = CHAIN + "faults: {stragglers: {fraction: 1, factor: 2}}\n"
    quarter = CHAIN + "faults: {stragglers: {fraction: 0.25, factor: 2, seed: 7}}\n"
    healthy = json.loads(subprocess.run([pipegrid, "run", "-", "--json"], input=CHAIN, capture_output=True,
                                        text=True).stdout)["iteration_time_s"]
    doubled = json.loads(subprocess.run([pipegrid, "run", "-", "--json"], input=every, capture_output=True,
                                        text=True).stdout)["iteration_time_s"]
    if abs(doubled - 2 * healthy) > 1e-9 * healthy:
        failures.append(f"every machine 2x slower: {doubled} s, expected twice {healthy} s")
    q = json.loads(subprocess.run([pipegrid, "run", "-", "--json"], input=quarter, capture_output=True, text=True).stdout)
    notes = [f for f in q["assumptions"]["faults"] if f.startswith("stragglers: 1 of 4 machines 2x slower (seed 7: gpu")]
    if len(notes) != 1:
        failures.append(f"a quarter of 4 machines: {q['assumptions']['faults']}")
    both = TREE + "faults: {down_links: [{between: [edge0-0, agg0-0]}, {between: [edge0-0, agg0-1]}]}\n"
    r = subprocess.run([pipegrid, "run", "-"], input=both, capture_output=True, text=True)
    # Located at the key since 2026-12-05 (before: the fat-tree routing's unlocated "no up path").
    if r.returncode != 2 or "faults.down_links: these links down cut the cluster" not in r.stderr:
        failures.append(f"both of edge0-0's up links down: exit {r.returncode}, {r.stderr.strip()!r}")
    for f in failures:
        print("FAIL", f)
    print(f"faults: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
