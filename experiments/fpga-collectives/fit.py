#!/usr/bin/env python3
"""Fits the ACCL engine's three figures on the calibration sets of measurements.yaml.

The model is the simulator's ring all-reduce on a switch with an engine (docs/clusters.md, "FPGA
collective engines"): n boards, S bytes,

    t = call + 2 (n - 1) (step + 2 a) + 2 (n - 1) / n x S / bandwidth

where a is the latency of one link to the switch (0.5 us, assumed: no source states the switch),
call the engine's cost per call (here with the benchmark's Python call path and barrier), step
its cost per ring step, bandwidth its data rate in a step (below the 100 GbE link's 12.5 GB/s). The
model is linear in (call, step, 1 / bandwidth): a weighted least-squares fit of the relative
errors over every calibration row (no row, board or set has its own factor). Prints the figures
rounded as topologies/engines.yaml holds them (tests/experiments check that the two agree).
Usage: fit.py [--json]
"""
import json
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
LINK_LATENCY = 0.5e-6  # s per device-switch link [assumed]


def columns(n, size):
    """The model's coefficients of (call, step, 1/bandwidth) and its constant."""
    return [1.0, 2.0 * (n - 1), 2.0 * (n - 1) / n * size], 2.0 * (n - 1) * 2 * LINK_LATENCY


def solve(a, b):
    """Gaussian elimination with partial pivoting (3 x 3)."""
    m = [row[:] + [v] for row, v in zip(a, b)]
    k = len(m)
    for i in range(k):
        p = max(range(i, k), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        for r in range(i + 1, k):
            f = m[r][i] / m[i][i]
            m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    x = [0.0] * k
    for i in reversed(range(k)):
        x[i] = (m[i][k] - sum(m[i][j] * x[j] for j in range(i + 1, k))) / m[i][i]
    return x


def fit(sets):
    ata = [[0.0] * 3 for _ in range(3)]
    atb = [0.0] * 3
    rows = 0
    for s in sets:
        if s["role"] != "calibration":
            continue
        n = len(s["devices"])
        for row in s["rows"]:
            size, t = row[0], row[1] * 1e-6
            x, c = columns(n, size)
            w = 1.0 / t  # relative error: (model - t) / t
            xw = [v * w for v in x]
            y = (t - c) * w
            for i in range(3):
                atb[i] += xw[i] * y
                for j in range(3):
                    ata[i][j] += xw[i] * xw[j]
            rows += 1
    call, step, inv_bw = solve(ata, atb)
    return {"call_s": call, "step_s": step, "bandwidth_Bps": 1.0 / inv_bw, "rows": rows}


def rounded(f):
    """The catalog's figures: call and step to 0.1 us, bandwidth to 0.01 GB/s."""
    return {
        "call_us": round(f["call_s"] * 1e6, 1),
        "step_us": round(f["step_s"] * 1e6, 1),
        "bandwidth_GBps": round(f["bandwidth_Bps"] / 1e9, 2),
    }


def main():
    with open(os.path.join(HERE, "measurements.yaml")) as fh:
        sets = yaml.safe_load(fh)["sets"]
    f = fit(sets)
    r = rounded(f)
    if "--json" in sys.argv[1:]:
        print(json.dumps(r))
        return
    print(f"fitted on {f['rows']} calibration rows (sets: "
          + ", ".join(s["name"] for s in sets if s["role"] == "calibration") + ")")
    print(f"call {r['call_us']} us, step {r['step_us']} us, bandwidth {r['bandwidth_GBps']} GB/s "
          f"({r['bandwidth_GBps'] * 8:.1f} Gb/s)")


if __name__ == "__main__":
    main()
