#!/usr/bin/env python3
"""Draw pipegrid's timeline (Gantt) and memory-over-time figures from the CSVs of `pipegrid run`.

    plot_timeline.py --tasks tasks.csv --memory memory.csv --out DIR [--title TEXT]

Writes DIR/timeline.png, DIR/timeline.svg, DIR/memory.png and DIR/memory.svg. Needs matplotlib
(Debian: apt-get install python3-matplotlib); exits with status 3 when it is missing.
`pipegrid run ... --plot DIR` writes the CSVs and runs this script, with the experiment's `name:`
as the title.

Timeline: one row per device, labelled with the device and the stage(s) it runs; compute tasks
coloured by kind (forward, backward, weight gradient, optimizer), outgoing transfers as a thin
bar under the row. Memory: total and activation memory over time, one line per device coloured by
its stage, and each device's peak as a bar (devices on the axis); the stage legend sits outside
the plotting area, so it never covers a curve, for any number of devices.
"""
import argparse
import csv
import os
import sys

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "weight": "#8172B3",
    "optimizer": "#7F7F7F",
    "activation": "#55A868",
    "gradient": "#C44E52",
    "allreduce": "#937860",
    "tensor-parallel": "#DA8BC3",
    "expert-parallel": "#8C8C3C",
}
COMPUTE = ("forward", "backward", "weight", "optimizer")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def time_unit(end):
    """Milliseconds for iterations shorter than a second, seconds otherwise."""
    return (1e3, "ms") if end < 1.0 else (1.0, "s")


def device_stages(tasks):
    """{device: sorted stages of its compute tasks}, devices in order of their first stage."""
    stages, first_seen = {}, {}
    for i, r in enumerate(tasks):
        d = r["device"]
        first_seen.setdefault(d, i)
        s = stages.setdefault(d, set())
        if r["kind"] in COMPUTE and int(r["stage"]) >= 0:
            s.add(int(r["stage"]))
    order = sorted(stages, key=lambda d: (min(stages[d]) if stages[d] else 1 << 30, first_seen[d]))
    return {d: sorted(stages[d]) for d in order}


def stage_text(stages):
    if not stages:
        return "no stage"
    if len(stages) == 1:
        return f"stage {stages[0]}"
    return "stages " + ",".join(str(s) for s in stages)


def stage_colours(count, plt):
    """A colour per stage: tab10 up to 10 stages, tab20 up to 20, a continuous map beyond."""
    if count <= 10:
        cmap = plt.get_cmap("tab10")
        return [cmap(i) for i in range(count)]
    if count <= 20:
        cmap = plt.get_cmap("tab20")
        return [cmap(i) for i in range(count)]
    cmap = plt.get_cmap("turbo")
    return [cmap(0.05 + 0.9 * i / (count - 1)) for i in range(count)]


def row_font(rows):
    return 8 if rows <= 16 else 7 if rows <= 32 else 5.5


def save(fig, out, name):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{name}.{ext}"), dpi=150,
                    metadata={"Date": None} if ext == "svg" else {"Software": None})


def shade(colour, chunk, chunks):
    """The kind's colour for model chunk `chunk` of `chunks` (interleaved schedules): the first as it
    is, later ones mixed towards white, so two chunks on one device never share a colour."""
    if chunks <= 1 or chunk == 0:
        return colour
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    t = 0.55 * chunk / (chunks - 1)
    return "#%02X%02X%02X" % tuple(round(255 * (c + (1 - c) * t)) for c in (r, g, b))


def gantt(tasks, title, plt):
    from matplotlib.collections import PolyCollection

    stages = device_stages(tasks)
    # A device's model chunks (interleaved-1f1b: stages s and s + p on one rank): its k-th stage.
    chunk_of = {(d, s): k for d, ss in stages.items() for k, s in enumerate(ss)}
    chunks = max((len(ss) for ss in stages.values()), default=1)
    devices = list(stages)
    row = {d: i for i, d in enumerate(devices)}
    end = max((float(r["end_s"]) for r in tasks), default=1.0) or 1.0
    scale, unit = time_unit(end)
    row_height = 0.5 if len(devices) <= 16 else 0.28 if len(devices) <= 32 else 0.2
    fig, ax = plt.subplots(figsize=(12, max(2.8, row_height * len(devices) + 1.6)))
    # One PolyCollection per kind (not one artist per task): thousands of tasks draw in milliseconds.
    boxes = {(k, c): [] for k in COLOURS for c in range(max(1, chunks))}
    labels = []
    fig_width_px = fig.get_figwidth() * fig.dpi * 0.75  # plot area, roughly
    for r in tasks:
        start, stop = float(r["start_s"]), float(r["end_s"])
        if stop <= start:
            continue
        kind = r["kind"]
        y = row[r["device"]]
        x0, x1 = start * scale, stop * scale
        if kind in COMPUTE:
            y0, y1 = y - 0.31, y + 0.31
            label = r["micro_batch"] if kind != "optimizer" else "opt"
            if (int(r["micro_batch"]) >= 0 or kind == "optimizer") and len(devices) <= 32 and \
                    (stop - start) / end * fig_width_px > 7 * len(label) + 4:
                labels.append(((x0 + x1) / 2, y, label))
        else:
            y0, y1 = y + 0.35, y + 0.49  # outgoing transfers: a thin bar under the compute row
        chunk = chunk_of.get((r["device"], int(r["stage"])), 0) if kind in ("forward", "backward", "weight") else 0
        boxes[(kind, chunk)].append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
    for (kind, chunk), polys in boxes.items():
        if polys:
            ax.add_collection(PolyCollection(polys, facecolors=shade(COLOURS[kind], chunk, chunks),
                                             edgecolors="white", linewidths=0.3 if kind in COMPUTE else 0,
                                             alpha=1.0 if kind in COMPUTE else 0.8))
    for x, y, label in labels:
        ax.text(x, y, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels([f"{d}  {stage_text(stages[d])}" for d in devices], fontsize=row_font(len(devices)))
    ax.set_ylim(len(devices) - 0.4, -0.6)
    ax.set_xlim(0, end * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("device and its stage(s)")
    ax.set_title(f"Timeline: {title}" if title else "Timeline")
    present = [(k, c) for (k, c), polys in boxes.items() if polys]
    if present:
        handles = [plt.Rectangle((0, 0), 1, 1, color=shade(COLOURS[k], c, chunks)) for k, c in present]
        names = [(f"{k}, chunk {c}" if chunks > 1 and k in ("forward", "backward", "weight") else k)
                 if k in COMPUTE else f"{k} (send)" for k, c in present]
        ax.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, -0.6 / (row_height * len(devices) + 1.6)),
                  ncol=min(len(present), 6), frameon=False, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def memory(rows, stages, title, plt, end_time):
    """stages: {device: [stage, ...]} from the timeline (devices without compute get none)."""
    by_device = {}
    for r in rows:
        by_device.setdefault(r["device"], []).append(r)
    devices = [d for d in stages if d in by_device] + [d for d in by_device if d not in stages]
    # A colour per set of stages a device runs (one stage, or its chunks' stages 0 and 8 when
    # interleaved): the legend lists exactly the colours the lines use.
    groups = sorted({tuple(stages.get(d, [])) for d in devices if stages.get(d)})
    stage_ids = list(range(len(groups)))
    colour_of_group = dict(zip(groups, stage_colours(len(groups), plt)))

    def colour(d):
        s = tuple(stages.get(d, []))
        return colour_of_group[s] if s else "#7F7F7F"

    end = max([float(r["time_s"]) for r in rows] + [end_time, 1e-12])
    scale, unit = time_unit(end)
    gib = float(1 << 30)
    fig = plt.figure(figsize=(12, 8.5))
    grid = fig.add_gridspec(3, 1, height_ratios=(1, 1, 0.9), hspace=0.45)
    top = fig.add_subplot(grid[0])
    middle = fig.add_subplot(grid[1], sharex=top)
    bottom = fig.add_subplot(grid[2])
    peaks = []
    for d in devices:
        pts = by_device[d]
        xs = [float(r["time_s"]) * scale for r in pts] + [end * scale]
        tot = [float(r["total"]) / gib for r in pts]
        act = [(float(r["activations"]) + float(r["workspace"])) / gib for r in pts]
        top.step(xs, tot + tot[-1:], where="post", color=colour(d), linewidth=1.1, alpha=0.85)
        middle.step(xs, act + act[-1:], where="post", color=colour(d), linewidth=1.1, alpha=0.85)
        peaks.append(max(tot))
    top.set_ylabel("total (GiB)")
    middle.set_ylabel("activations +\nworkspace (GiB)")
    middle.set_xlabel(f"time ({unit})")
    top.set_xlim(0, end * scale)
    top.set_title(f"Memory over time: {title}" if title else "Memory over time")
    for ax in (top, middle):
        ax.grid(alpha=0.3)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # zero-based, with headroom above the highest step
    bottom.bar(range(len(devices)), peaks, color=[colour(d) for d in devices], width=0.8)
    bottom.set_xticks(range(len(devices)))
    bottom.set_xticklabels(devices, rotation=90 if len(devices) > 8 else 0, fontsize=row_font(len(devices)))
    bottom.set_xlim(-0.6, len(devices) - 0.4)
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("peak (GiB)")
    bottom.set_xlabel("device")
    bottom.grid(axis="y", alpha=0.3)
    # The stage legend, outside the axes on the right: it can cover nothing. Past 20 stages a
    # colour bar replaces it.
    if groups and len(groups) <= 20:
        handles = [plt.Line2D([], [], color=colour_of_group[g], linewidth=3) for g in groups]
        fig.legend(handles, [stage_text(list(g)) for g in groups], loc="upper left", bbox_to_anchor=(0.86, 0.88),
                   fontsize=8, frameon=False, title="line colour")
        fig.subplots_adjust(left=0.08, right=0.85, top=0.94, bottom=0.12)
    elif stage_ids:
        from matplotlib.colors import ListedColormap, BoundaryNorm
        cmap = ListedColormap([colour_of_group[g] for g in groups])
        norm = BoundaryNorm([s - 0.5 for s in stage_ids] + [stage_ids[-1] + 0.5], cmap.N)
        fig.subplots_adjust(left=0.08, right=0.88, top=0.94, bottom=0.12)
        cax = fig.add_axes([0.9, 0.4, 0.015, 0.5])
        bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax)
        bar.set_label("stage")
    else:
        fig.subplots_adjust(left=0.08, right=0.97, top=0.94, bottom=0.12)
    return fig


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", required=True)
    p.add_argument("--memory", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="")
    a = p.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        matplotlib.rcParams["svg.hashsalt"] = "pipegrid"  # same data, same SVG bytes
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_timeline.py: matplotlib is missing (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 3
    os.makedirs(a.out, exist_ok=True)
    tasks = read_csv(a.tasks)
    fig = gantt(tasks, a.title, plt)
    save(fig, a.out, "timeline")
    plt.close(fig)
    end_time = max((float(r["end_s"]) for r in tasks), default=0.0)
    fig = memory(read_csv(a.memory), device_stages(tasks), a.title, plt, end_time)
    save(fig, a.out, "memory")
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
