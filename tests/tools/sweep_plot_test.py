#!/usr/bin/env python3
"""tools/sweep_plot.py's geometry, checked by hand (no matplotlib needed): the Pareto front keeps
only points no other dominates, and a numeric line axis runs in increasing order."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import sweep_plot  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


# Two points at each memory: the slower of each pair is dominated by the faster at the same memory
# (this front kept all four until 2026-12-05: ties in memory came slowest first). At 30 MB the
# point is slower than the 26.2 MB one: dominated too.
points = [(17.8e6, 94.25), (17.8e6, 120.48), (26.2e6, 100.0), (26.2e6, 120.94), (30e6, 110.0), (40e6, 130.0)]
check(sweep_plot.pareto_front(points) == [(17.8e6, 120.48), (26.2e6, 120.94), (40e6, 130.0)],
      f"pareto front: {sweep_plot.pareto_front(points)}")
check(sweep_plot.pareto_front([]) == [], "an empty front")
check(sweep_plot.pareto_front([(1, 5), (1, 5)]) == [(1, 5)], "equal points: one on the front")

# An axis written 16, 4, 8 (the sweep's order) is drawn at 4, 8, 16; names keep their order.
rows = [{"axes": {"mb": v, "s": s}} for v, s in [(16, "gpipe"), (4, "1f1b"), (8, "gpipe"), (4, "gpipe")]]
check(sweep_plot.line_positions(rows, "mb") == ([4, 8, 16], True), f"{sweep_plot.line_positions(rows, 'mb')}")
check(sweep_plot.line_positions(rows, "s") == (["gpipe", "1f1b"], False), f"{sweep_plot.line_positions(rows, 's')}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("ok")
