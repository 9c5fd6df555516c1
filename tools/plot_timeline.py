#!/usr/bin/env python3
"""Draw pipegrid's timeline (Gantt) and memory-over-time figures from the CSVs of `pipegrid run`.

    plot_timeline.py --tasks tasks.csv --memory memory.csv --out DIR [--title TEXT]

Writes DIR/timeline.png, DIR/timeline.svg, DIR/memory.png and DIR/memory.svg. Needs matplotlib
(Debian: apt-get install python3-matplotlib). `pipegrid run ... --plot DIR` writes the CSVs and
runs this script.
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
}
COMPUTE = ("forward", "backward", "weight", "optimizer")
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "workspace")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def time_unit(end):
    """Milliseconds for iterations shorter than a second, seconds otherwise."""
    return (1e3, "ms") if end < 1.0 else (1.0, "s")


def device_order(rows):
    seen = []
    for r in rows:
        if r["device"] not in seen:
            seen.append(r["device"])
    return seen


def gantt(tasks, out, title, plt):
    devices = device_order(tasks)
    end = max(float(r["end_s"]) for r in tasks) if tasks else 1.0
    scale, unit = time_unit(end)
    height = max(2.5, 0.55 * len(devices) + 1.2)
    fig, ax = plt.subplots(figsize=(12, height))
    row = {d: i for i, d in enumerate(devices)}
    fig_width_px = fig.get_figwidth() * fig.dpi * 0.8  # plot area, roughly
    for r in tasks:
        start, stop = float(r["start_s"]), float(r["end_s"])
        if stop <= start:
            continue
        kind = r["kind"]
        y = row[r["device"]]
        if kind in COMPUTE:
            ax.barh(y, (stop - start) * scale, left=start * scale, height=0.62, color=COLOURS[kind],
                    edgecolor="white", linewidth=0.4)
            label = r["micro_batch"] if kind != "optimizer" else "opt"
            width_px = (stop - start) / end * fig_width_px
            if int(r["micro_batch"]) >= 0 or kind == "optimizer":
                if width_px > 7 * len(label) + 4:
                    ax.text((start + stop) / 2 * scale, y, label, ha="center", va="center", fontsize=7,
                            color="white")
        else:
            # Outgoing transfers: a thin bar under the device's compute row.
            ax.barh(y + 0.42, (stop - start) * scale, left=start * scale, height=0.14, color=COLOURS[kind],
                    alpha=0.8, linewidth=0)
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels(devices)
    ax.set_ylim(len(devices) - 0.4, -0.6)
    ax.set_xlim(0, end * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or "pipegrid timeline")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in COLOURS]
    present = {r["kind"] for r in tasks if float(r["end_s"]) > float(r["start_s"])}
    keep = [(h, k) for h, k in zip(handles, COLOURS) if k in present]
    if keep:
        ax.legend([h for h, _ in keep], [k for _, k in keep], loc="upper center", bbox_to_anchor=(0.5, -0.18),
                  ncol=len(keep), frameon=False, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"timeline.{ext}"), dpi=150)
    plt.close(fig)


def memory(rows, out, title, plt, end_time):
    devices = device_order(rows)
    end = max([float(r["time_s"]) for r in rows] + [end_time, 1e-12])
    scale, unit = time_unit(end)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True)
    gib = float(1 << 30)
    for d in devices:
        pts = [r for r in rows if r["device"] == d]
        xs = [float(r["time_s"]) * scale for r in pts] + [end * scale]
        tot = [float(r["total"]) / gib for r in pts]
        act = [(float(r["activations"]) + float(r["workspace"])) / gib for r in pts]
        top.step(xs, tot + tot[-1:], where="post", label=d, linewidth=1.2)
        bottom.step(xs, act + act[-1:], where="post", label=d, linewidth=1.2)
    top.set_ylabel("total memory (GiB)")
    bottom.set_ylabel("activations + workspace (GiB)")
    bottom.set_xlabel(f"time ({unit})")
    top.set_title(title or "pipegrid memory over time")
    if len(devices) <= 16:
        top.legend(loc="upper right", fontsize=8, ncol=2)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"memory.{ext}"), dpi=150)
    plt.close(fig)


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
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_timeline.py: matplotlib is missing (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 3
    os.makedirs(a.out, exist_ok=True)
    tasks = read_csv(a.tasks)
    gantt(tasks, a.out, a.title, plt)
    end_time = max((float(r["end_s"]) for r in tasks), default=0.0)
    memory(read_csv(a.memory), a.out, a.title, plt, end_time)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
