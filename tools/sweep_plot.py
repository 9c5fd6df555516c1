#!/usr/bin/env python3
"""Plots of a pipegrid sweep's results database (run by `pipegrid sweep plot`; needs matplotlib).

  --kind line     a metric against one axis (--x), a line per value of another (--lines)
  --kind heatmap  a metric over two axes (--x, --y)
  --kind pareto   throughput against peak memory: every feasible point, the Pareto front drawn

Where more axes vary than the plot shows, each mark is the best point over the others (highest
throughput, lowest time, memory or bubble), and the title says so. Only points with status ok count.
"""
import argparse
import json
import sqlite3
import sys

LOWER_IS_BETTER = {"iteration_time_s", "bubble_ratio", "peak_memory_bytes"}
LABELS = {"throughput_samples_per_s": "throughput (samples/s)", "iteration_time_s": "iteration time (s)",
          "bubble_ratio": "bubble ratio", "peak_memory_bytes": "peak memory (GiB)"}


def load(db, metric):
    con = sqlite3.connect(db)
    meta = dict(con.execute("SELECT key, value FROM meta"))
    axes = json.loads(meta.get("axes", "[]"))
    cols = {"iteration_time_s", "throughput_samples_per_s", "bubble_ratio", "peak_memory_bytes"}
    if metric not in cols:
        sys.exit(f"pipegrid sweep plot: unknown metric \"{metric}\" (metrics: {', '.join(sorted(cols))})")
    rows = []
    for point, ax, status, it, tp, bubble, peak in con.execute(
            "SELECT point, axes, status, iteration_time_s, throughput_samples_per_s, bubble_ratio, peak_memory_bytes "
            "FROM points ORDER BY point"):
        if status != "ok":
            continue
        rows.append({"point": point, "axes": json.loads(ax), "iteration_time_s": it, "throughput_samples_per_s": tp,
                     "bubble_ratio": bubble, "peak_memory_bytes": peak})
    con.close()
    return meta, axes, rows


def value(r, metric):
    v = r[metric]
    return v / 2**30 if metric == "peak_memory_bytes" else v


def best(values, metric):
    return min(values) if metric in LOWER_IS_BETTER else max(values)


def ordered(rows, axis):
    """The axis's values in the sweep's order (first appearance by point number)."""
    seen = []
    for r in rows:
        v = r["axes"].get(axis)
        if v not in seen:
            seen.append(v)
    return seen


def check_axis(axes, axis, flag):
    if not axis:
        sys.exit(f"pipegrid sweep plot: {flag} is needed (axes: {', '.join(axes)})")
    if axis not in axes:
        sys.exit(f"pipegrid sweep plot: {flag} {axis} is not an axis of the sweep (axes: {', '.join(axes)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", default="line", choices=["line", "heatmap", "pareto"])
    ap.add_argument("--metric", default="throughput_samples_per_s")
    ap.add_argument("--x")
    ap.add_argument("--lines")
    ap.add_argument("--y")
    ap.add_argument("--title")
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "pipegrid"
    import matplotlib.pyplot as plt

    meta, axes, rows = load(a.db, a.metric)
    if not rows:
        sys.exit(f"pipegrid sweep plot: {a.db} has no point with status ok")
    title = a.title or meta.get("name") or meta.get("sweep", a.db)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if a.kind == "line":
        check_axis(axes, a.x, "--x")
        if a.lines:
            check_axis(axes, a.lines, "--lines")
        shown = {a.x, a.lines}
        others = [x for x in axes if x not in shown]
        xs = ordered(rows, a.x)
        numeric = all(isinstance(x, (int, float)) for x in xs)
        groups = ordered(rows, a.lines) if a.lines else [None]
        for g in groups:
            pts = []
            for i, x in enumerate(xs):
                vals = [value(r, a.metric) for r in rows if r["axes"][a.x] == x and
                        (g is None or r["axes"][a.lines] == g)]
                if vals:
                    pts.append((x if numeric else i, best(vals, a.metric)))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=f"{a.lines} = {g}" if g is not None else None)
        if not numeric:
            ax.set_xticks(range(len(xs)))
            ax.set_xticklabels([str(x) for x in xs])
        elif len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(a.x)
        ax.set_ylabel(LABELS.get(a.metric, a.metric))
        if a.lines:
            ax.legend(fontsize=8)
        if others:
            title += f"\n(best over {', '.join(others)})"
    elif a.kind == "heatmap":
        check_axis(axes, a.x, "--x")
        check_axis(axes, a.y, "--y")
        xs, ys = ordered(rows, a.x), ordered(rows, a.y)
        grid = [[float("nan")] * len(xs) for _ in ys]
        for j, yv in enumerate(ys):
            for i, xv in enumerate(xs):
                vals = [value(r, a.metric) for r in rows if r["axes"][a.x] == xv and r["axes"][a.y] == yv]
                if vals:
                    grid[j][i] = best(vals, a.metric)
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        fig.colorbar(im, ax=ax, label=LABELS.get(a.metric, a.metric))
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels([str(x) for x in xs], rotation=30, ha="right")
        ax.set_yticks(range(len(ys)))
        ax.set_yticklabels([str(y) for y in ys])
        ax.set_xlabel(a.x)
        ax.set_ylabel(a.y)
        for j in range(len(ys)):
            for i in range(len(xs)):
                if grid[j][i] == grid[j][i]:
                    ax.text(i, j, f"{grid[j][i]:.3g}", ha="center", va="center", fontsize=7, color="white")
        others = [x for x in axes if x not in (a.x, a.y)]
        if others:
            title += f"\n(best over {', '.join(others)})"
    else:
        pts = sorted((value(r, "peak_memory_bytes"), r["throughput_samples_per_s"]) for r in rows)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, alpha=0.5, label="points")
        front, top = [], -1.0
        for mem, tp in pts:  # by memory ascending: a point is on the front if it beats every cheaper one
            if tp > top:
                front.append((mem, tp))
                top = tp
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="C3", marker="o",
                label="Pareto front")
        ax.set_xlabel(LABELS["peak_memory_bytes"])
        ax.set_ylabel(LABELS["throughput_samples_per_s"])
        ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, metadata={"Date": None} if a.out.endswith(".svg") else None)
    print(f"pipegrid: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
