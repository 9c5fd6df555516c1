#!/usr/bin/env python3
"""Plots of a pipegrid sweep's results database (run by `pipegrid sweep plot`; needs matplotlib).

  --kind line     a metric against one axis (--x), a line per value of other axes (--lines A[,B...])
  --kind heatmap  a metric over two axes (--x, --y), each cell labelled, a labelled colour bar
  --kind pareto   throughput against peak memory: every feasible point, the Pareto front drawn

Where more axes vary than the plot shows, each mark is the best point over the others (highest
throughput, lowest time, memory or bubble), and the title says so. Points over memory (infeasible)
and points that failed are marked where they would be (an x, a grey cell), never dropped silently.
--baseline AXIS=VALUE[,AXIS=VALUE...] plots the speed-up against that point (its metric over the
point's for times, the point's over its for throughput). Axis key paths are shown as words
(`strategy.schedule` as "schedule"); --title, --xlabel, --ylabel, --legend-title and --size WxH
(inches) replace the defaults; the format follows the output's extension (.png, .svg, .pdf).
"""
import argparse
import json
import os
import sqlite3
import sys
import textwrap

LOWER_IS_BETTER = {"iteration_time_s", "bubble_ratio", "peak_memory_bytes"}
LABELS = {"throughput_samples_per_s": "throughput (samples/s)", "iteration_time_s": "iteration time (s)",
          "bubble_ratio": "bubble ratio", "peak_memory_bytes": "peak memory (GiB)"}
# Words for the key paths sweeps use most; others are their last key with spaces.
AXIS_WORDS = {
    "strategy.schedule": "schedule", "strategy.micro_batches": "micro-batches", "strategy.mini_batch": "mini-batch",
    "strategy.global_batch": "global batch", "strategy.micro_batch_size": "micro-batch size per replica",
    "strategy.chunks": "chunks per rank", "strategy.stages": "pipeline stages", "strategy.replicas": "replicas",
    "strategy.planner": "planner", "strategy.partitioner": "partitioner", "cluster.count": "devices",
    "cluster.dims": "torus shape", "cluster.bandwidth": "link bandwidth", "cluster.latency": "link latency",
    "cluster.device": "device", "cluster.device.model": "device", "cluster.device.dsps": "DSPs per device",
    "cluster.device.clock": "clock", "cluster.device.memory": "device memory",
    "cluster.qsfp.bandwidth": "link bandwidth (QSFP)", "cluster.preset": "cluster", "workload.model": "model",
    "workload.micro_batch_size": "micro-batch size", "workload.precision": "precision",
}


def fail(message):
    sys.exit(f"pipegrid: sweep plot: {message}; see `pipegrid sweep plot --help`")


def words(axis):
    if axis in AXIS_WORDS:
        return AXIS_WORDS[axis]
    return axis.split(".")[-1].replace("_", " ")


def show(v):
    """A value as a tick or legend label."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, list):
        return " x ".join(show(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {show(x)}" for k, x in v.items())
    return str(v)


def cell(v):
    """A heat-map cell: 3 significant figures, thousands with separators, no exponent below 1e7."""
    a = abs(v)
    if a >= 1e7 or (0 < a < 1e-3):
        return f"{v:.2e}"
    if a >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def load(db, metric):
    con = sqlite3.connect(db)
    meta = dict(con.execute("SELECT key, value FROM meta"))
    axes = json.loads(meta.get("axes", "[]"))
    cols = {"iteration_time_s", "throughput_samples_per_s", "bubble_ratio", "peak_memory_bytes"}
    if metric not in cols:
        fail(f"unknown metric \"{metric}\" (metrics: {', '.join(sorted(cols))})")
    rows = []
    for point, ax, status, it, tp, bubble, peak in con.execute(
            "SELECT point, axes, status, iteration_time_s, throughput_samples_per_s, bubble_ratio, peak_memory_bytes "
            "FROM points ORDER BY point"):
        rows.append({"point": point, "axes": json.loads(ax), "status": status, "iteration_time_s": it,
                     "throughput_samples_per_s": tp, "bubble_ratio": bubble, "peak_memory_bytes": peak})
    con.close()
    return meta, axes, rows


def value(r, metric):
    v = r[metric]
    if v is None:
        return None
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


def line_positions(rows, axis):
    """A line plot's x values and whether they are numbers: numbers are positions on the axis, sorted
    (a line through them in the sweep's order, e.g. 16, 4, 8, would double back); other values keep
    the sweep's order, one slot each."""
    xs = ordered(rows, axis)
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    return (sorted(xs) if numeric else xs), numeric


def pareto_front(points):
    """The (memory, throughput) points no other point dominates (no more memory and more throughput,
    or less memory and as much), by memory ascending: a point is on the front only if it beats every
    point that needs no more memory; among equal memory only the fastest can be."""
    front, top = [], None
    for mem, tp in sorted(points, key=lambda p: (p[0], -p[1])):
        if top is None or tp > top:
            front.append((mem, tp))
            top = tp
    return front


def check_axis(axes, axis, flag):
    if not axis:
        fail(f"{flag} is needed (axes: {', '.join(axes)})")
    if axis not in axes:
        fail(f"{flag} {axis} is not an axis of the sweep (axes: {', '.join(axes)})")


def parse_baseline(text, axes):
    want = {}
    for part in text.split(","):
        if "=" not in part:
            fail(f"--baseline {text}: expected AXIS=VALUE[,AXIS=VALUE...]")
        k, v = part.split("=", 1)
        k = k.strip()
        check_axis(axes, k, "--baseline")
        want[k] = v.strip()
    return want


def matches(r, want):
    return all(show(r["axes"].get(k)) == v for k, v in want.items())


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
    ap.add_argument("--xlabel")
    ap.add_argument("--ylabel")
    ap.add_argument("--legend-title")
    ap.add_argument("--size")
    ap.add_argument("--baseline")
    a = ap.parse_args()
    size = (7.0, 4.5)
    if a.size:
        try:
            w, h = (float(x) for x in a.size.lower().split("x"))
            if not (0 < w <= 50 and 0 < h <= 50):
                raise ValueError
            size = (w, h)
        except ValueError:
            fail(f"--size {a.size}: expected WxH in inches, each in (0, 50], like 7x4.5")
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "pipegrid"
    import matplotlib.pyplot as plt

    meta, axes, rows = load(a.db, a.metric)
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        fail(f"{a.db} has no point with status ok")
    metric_label = LABELS.get(a.metric, a.metric)
    base_value = None
    if a.baseline:
        want = parse_baseline(a.baseline, axes)
        vals = [value(r, a.metric) for r in ok if matches(r, want)]
        if not vals:
            fail(f"--baseline {a.baseline}: no point with status ok has these values")
        base_value = best(vals, a.metric)
        metric_label = f"speed-up over {', '.join(f'{words(k)} {v}' for k, v in want.items())}"

    def shown_value(v):
        if base_value is None or v is None:
            return v
        return base_value / v if a.metric in LOWER_IS_BETTER else v / base_value

    title = a.title or meta.get("name") or os.path.basename(meta.get("sweep", a.db))
    fig, ax = plt.subplots(figsize=size)
    legend_outside = False
    if a.kind == "line":
        check_axis(axes, a.x, "--x")
        line_axes = [x.strip() for x in a.lines.split(",")] if a.lines else []
        for la in line_axes:
            check_axis(axes, la, "--lines")
        shown = {a.x, *line_axes}
        others = [x for x in axes if x not in shown]
        xs, numeric = line_positions(rows, a.x)
        groups = [None]
        if line_axes:
            groups = []
            for r in rows:
                g = tuple(show(r["axes"].get(la)) for la in line_axes)
                if g not in groups:
                    groups.append(g)

        def in_group(r, g):
            return g is None or tuple(show(r["axes"].get(la)) for la in line_axes) == g

        bad_x, bad_y, bad_kind = [], [], []
        for k, g in enumerate(groups):
            pts = []
            for i, x in enumerate(xs):
                sel = [r for r in rows if r["axes"].get(a.x) == x and in_group(r, g)]
                vals = [shown_value(value(r, a.metric)) for r in sel if r["status"] == "ok"]
                pos = x if numeric else i
                if vals:
                    pts.append((pos, best(vals, a.metric if base_value is None else "throughput_samples_per_s")))
                elif sel:  # none ok: over memory, or failed
                    over = [shown_value(value(r, a.metric)) for r in sel if r["status"] == "infeasible"]
                    over = [v for v in over if v is not None]
                    bad_x.append(pos)
                    bad_y.append(over[0] if over else None)
                    bad_kind.append("infeasible" if over else "error")
            if pts:
                label = ", ".join(g) if g is not None else None  # the legend's title names the axes
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{k % 10}", label=label)
        if not numeric:
            labels = ["\n".join(textwrap.wrap(show(x), 14)) or "-" for x in xs]
            ax.set_xticks(range(len(xs)))
            rotate = len(xs) > 4 or max(len(s) for s in labels) > 8
            ax.set_xticklabels(labels, rotation=30 if rotate else 0, ha="right" if rotate else "center",
                               fontsize=8 if len(xs) <= 12 else 6)
        elif len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([show(x) for x in xs])
        # Points without a result are marked, not dropped: at their value when over memory, on the axis
        # when they failed.
        if bad_x:
            ymin = ax.get_ylim()[0]
            inf = [(x, y) for x, y, k in zip(bad_x, bad_y, bad_kind) if k == "infeasible"]
            err = [x for x, k in zip(bad_x, bad_kind) if k == "error"]
            if inf:
                ax.scatter([p[0] for p in inf], [p[1] for p in inf], marker="x", color="0.3", zorder=3,
                           label="over memory (infeasible)")
            if err:
                ax.scatter(err, [ymin] * len(err), marker="v", color="C3", zorder=3, clip_on=False,
                           label="failed (see sweep export)")
        ax.set_xlabel(a.xlabel or words(a.x))
        ax.set_ylabel(a.ylabel or metric_label)
        if base_value is not None:
            ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle="--")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8, title=a.legend_title or (", ".join(words(la) for la in line_axes) or None),
                      title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
            legend_outside = True
        if others:
            title += f"\n(each mark: the best over {', '.join(words(o) for o in others)})"
    elif a.kind == "heatmap":
        check_axis(axes, a.x, "--x")
        check_axis(axes, a.y, "--y")
        xs, ys = ordered(rows, a.x), ordered(rows, a.y)
        nan = float("nan")
        grid = [[nan] * len(xs) for _ in ys]
        state = [[None] * len(xs) for _ in ys]  # None: no point; "infeasible"; "error"
        for j, yv in enumerate(ys):
            for i, xv in enumerate(xs):
                sel = [r for r in rows if r["axes"].get(a.x) == xv and r["axes"].get(a.y) == yv]
                vals = [shown_value(value(r, a.metric)) for r in sel if r["status"] == "ok"]
                if vals:
                    grid[j][i] = best(vals, a.metric if base_value is None else "throughput_samples_per_s")
                elif sel:
                    state[j][i] = "infeasible" if any(r["status"] == "infeasible" for r in sel) else "error"
        import matplotlib.colors as mcolors
        cmap = matplotlib.colormaps["viridis"].copy()
        cmap.set_bad("0.85")
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap=cmap)
        bar = fig.colorbar(im, ax=ax)
        bar.set_label(a.ylabel or metric_label, fontsize=8)
        ax.set_xticks(range(len(xs)))
        rotate = len(xs) > 4 or max(len(show(x)) for x in xs) > 8
        ax.set_xticklabels(["\n".join(textwrap.wrap(show(x), 14)) for x in xs], rotation=30 if rotate else 0,
                           ha="right" if rotate else "center", fontsize=8)
        ax.set_yticks(range(len(ys)))
        ax.set_yticklabels([show(y) for y in ys], fontsize=8)
        ax.set_xlabel(a.xlabel or words(a.x))
        ax.set_ylabel(words(a.y))
        norm = mcolors.Normalize(*im.get_clim())
        for j in range(len(ys)):
            for i in range(len(xs)):
                v = grid[j][i]
                if v == v:
                    r_, g_, b_, _ = cmap(norm(v))
                    dark = 0.299 * r_ + 0.587 * g_ + 0.114 * b_ < 0.5
                    ax.text(i, j, cell(v), ha="center", va="center", fontsize=7, color="white" if dark else "black")
                elif state[j][i]:
                    ax.text(i, j, "over\nmemory" if state[j][i] == "infeasible" else "failed", ha="center",
                            va="center", fontsize=6, color="0.25")
        others = [x for x in axes if x not in (a.x, a.y)]
        if others:
            title += f"\n(each cell: the best over {', '.join(words(o) for o in others)})"
    else:
        pts = sorted((value(r, "peak_memory_bytes"), r["throughput_samples_per_s"]) for r in ok)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, alpha=0.5, label="points")
        over = [(value(r, "peak_memory_bytes"), r["throughput_samples_per_s"]) for r in rows
                if r["status"] == "infeasible" and r["peak_memory_bytes"] is not None]
        if over:
            ax.scatter([p[0] for p in over], [p[1] for p in over], s=14, marker="x", color="0.4",
                       label="over memory (infeasible)")
        front = pareto_front(pts)
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="C3", marker="o",
                label="Pareto front")
        ax.set_xlabel(a.xlabel or LABELS["peak_memory_bytes"])
        ax.set_ylabel(a.ylabel or LABELS["throughput_samples_per_s"])
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        legend_outside = True
    ax.set_title(title, fontsize=9)
    if a.kind != "heatmap":
        ax.grid(alpha=0.3)
    fig.tight_layout()
    if legend_outside:
        fig.tight_layout(rect=(0, 0, 0.98, 1))
    fig.savefig(a.out, dpi=150, bbox_inches="tight",
                metadata={"Date": None} if a.out.endswith(".svg") else None)
    print(f"pipegrid: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
