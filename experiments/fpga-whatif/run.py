#!/usr/bin/env python3
"""What limits training on hypothetical FPGA clusters: BaPipe's question as a pipegrid sweep.

VGG-16, ResNet-50 and GNMT-8 (fp16, mixed-precision Adam, 8 samples per board: mini-batch 32 to
512, planned by the BaPipe-style planner with 1F1B, every micro-batch size tried) on U280-class boards: 0.5x to 4x the U280's DSPs, its
HBM2 or its DDR4, 2 QSFP ports (ring) or 4 (2-D torus), 100/200/400 Gb/s links, 4 to 64 boards:
510 points, two sweep files (ring.yaml, torus.yaml) run with `pipegrid sweep`. Writes results.md
(tables, conclusions) and three figures (dsp.png, boards.png, links.png, and .svg) next to this
script, or into --out DIR; the databases and CSVs go to DIR/out/ (out/ here by default; not committed).
--quick runs the points up to 16 boards only (4, 8, 16 on the ring; 2x2, 4x4 on the torus: 360 of the
510) into out/quick/ unless --out says where, never over the committed results; its report leaves out
the 64-board figure.

    experiments/fpga-whatif/run.py [-j N] [--out DIR] [--quick] [--report-only]   (after tools/setup --all)
"""
import argparse
import csv
import io
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import pgx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {"vgg16": "VGG-16", "resnet50": "ResNet-50", "gnmt8": "GNMT-8"}
MEMORY = {"u280": "HBM", "u280-ddr": "DDR"}
DSPS = [4512, 9024, 36096]  # 0.5x, 1x, 4x in every figure (2x runs only up to 16 boards)
DSPS_16 = [4512, 9024, 18048, 36096]  # the 16-board figure's, 2x included
QUICK_SKIP = "strategy.global_batch > 128"  # --quick: up to 16 boards (8 samples per board)
LINKS = ["100Gbps", "200Gbps", "400Gbps"]
RING_BOARDS = [4, 8, 16, 32, 64]
TORUS_DIMS = ["[2, 2]", "[2, 4]", "[4, 4]", "[4, 8]", "[8, 8]"]
REFERENCE_BOARDS = 16


def sweep_file(topology, out, quick):
    """The sweep file of a topology: this folder's, or for --quick a copy in `out` limited to 16 boards."""
    path = os.path.join(HERE, f"{topology}.yaml")
    if not quick:
        return path
    text = open(path).read().replace(f"base: {topology}-base.yaml",
                                     f"base: {os.path.join(HERE, topology + '-base.yaml')}")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("skip:"):
            if line.strip() == "skip:":  # a block list follows
                lines.insert(i + 1, f'  - "{QUICK_SKIP}"')
            else:  # a flow list: [a, b]
                lines[i] = line.rstrip().rstrip("]") + f', "{QUICK_SKIP}"]'
            break
    quick_path = os.path.join(out, f"{topology}-quick.yaml")
    with open(quick_path, "w") as f:
        f.write("# --quick: " + path + " up to 16 boards\n" + "\n".join(lines) + "\n")
    return quick_path


def run_sweep(sweep, db, jobs):
    t = time.time()
    p = subprocess.run([pgx.binary(), "sweep", sweep, "--db", db, "-j", str(jobs)], text=True)
    # Status 2 with a database: some points failed; they are recorded and reported in results.md.
    if p.returncode != 0 and not (p.returncode == 2 and os.path.exists(db)):
        sys.exit(f"pipegrid sweep {sweep} failed (status {p.returncode})")
    return time.time() - t


def load(db):
    p = subprocess.run([pgx.binary(), "sweep", "export", db, "--jsonl"], capture_output=True, text=True, check=True)
    return [json.loads(line) for line in p.stdout.splitlines()]


def key(r, topology):
    a = r["axes"]
    boards = a["cluster.count"] if topology == "ring" else eval_dims(a["cluster.dims"])
    return (a["workload.model"], topology, a["cluster.device.model"], a["cluster.device.dsps"],
            a["cluster.qsfp.bandwidth"], boards)


def eval_dims(d):
    x, y = json.loads(d) if isinstance(d, str) else d
    return x * y


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", help="folder for results.md and the figures, the databases in its out/ "
                    "(default: this script's folder; with --quick its out/quick)")
    ap.add_argument("--quick", action="store_true", help="only the points up to 16 boards (360 of 510)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2, help="points run at once")
    ap.add_argument("--report-only", action="store_true", help="tabulate the databases in out/ as they are, run nothing")
    args = ap.parse_args()
    if args.out is None:
        args.out = os.path.join(HERE, "out", "quick") if args.quick else HERE
    plt = pgx.matplotlib_pyplot()
    out = os.path.join(args.out, "out")  # the databases and CSVs
    results, seconds, counts = {}, {}, {}
    if args.report_only:
        # Nothing to tabulate is an error, not empty results written over the committed ones.
        absent = [t for t in ("ring", "torus") if not os.path.exists(os.path.join(out, f"{t}.sqlite"))]
        if absent:
            sys.exit(f"--report-only: no results database for {', '.join(absent)} in {out} "
                     "(run without --report-only first); nothing written")
    os.makedirs(out, exist_ok=True)
    for topology in ("ring", "torus"):
        db = os.path.join(out, f"{topology}.sqlite")
        sweep = sweep_file(topology, out, args.quick)
        seconds[topology] = 0 if args.report_only else run_sweep(sweep, db, args.jobs)
        if not os.path.exists(db):
            continue
        # The points the sweep file selects now (a database keeps rows of points a filter dropped later).
        listed = subprocess.run([pgx.binary(), "sweep", sweep, "--list"],
                                capture_output=True, text=True, check=True).stdout
        selected = {int(line.split()[0]) for line in listed.splitlines()}
        rows = [r for r in load(db) if r["point"] in selected]
        counts[topology] = len(rows)
        for r in rows:
            results[key(r, topology)] = r
        with open(os.path.join(out, f"{topology}.csv"), "w") as f:
            f.write(subprocess.run([pgx.binary(), "sweep", "export", db, "--csv"], capture_output=True, text=True,
                                   check=True).stdout)

    def tp(m, topo, mem, dsps, link, boards):
        r = results.get((m, topo, mem, dsps, link, boards))
        return r["throughput_samples_per_s"] if r and r["status"] == "ok" else None

    def why(m, topo, mem, dsps, link, boards):
        """What stands in a table instead of a number."""
        r = results.get((m, topo, mem, dsps, link, boards))
        return "-" if r is None else {"infeasible": "over memory"}.get(r["status"], r["status"])

    statuses = {}
    for r in results.values():
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    errors = [r for r in results.values() if r["status"] == "error"]

    lines = ["# What limits training on hypothetical FPGA clusters", "",
             "Generated by `experiments/fpga-whatif/run.py` (see README.md for the set-up and the conclusions).", "",
             f"{len(results)} points ({', '.join(f'{v} {k}' for k, v in sorted(statuses.items()))}); " +
             ("tabulated from out/ring.sqlite and out/torus.sqlite (README.md gives the sweeps' wall time)."
              if args.report_only else
              f"sweep wall time on this machine: ring {seconds['ring']:.0f} s, torus {seconds['torus']:.0f} s "
              f"(-j {args.jobs})."), ""]
    if args.quick:
        lines += ["**--quick**: the points up to 16 boards only; the 32- and 64-board columns are empty.", ""]

    # 1. Sensitivity at the reference point: 16 boards, 1x DSPs, HBM, 100 Gb/s, ring.
    ref = ("ring", "u280", 9024, "100Gbps", REFERENCE_BOARDS)
    lines += [f"## Speed-up from each resource, one at a time (reference: {REFERENCE_BOARDS} U280s, HBM, "
              "9,024 DSPs, 100 Gb/s ring)", "",
              "Throughput of the changed cluster / throughput of the reference (samples/s in the first column).", ""]
    header = ["model", "reference (samples/s)", "DSPs 0.5x", "DSPs 4x", "DDR instead of HBM",
              "200 Gb/s", "400 Gb/s", "torus (4 ports)", "torus + 400 Gb/s + 4x DSPs"]
    rows = []
    for m, name in MODELS.items():
        base = tp(m, *ref)
        if not base:
            rows.append([name, why(m, *ref)] + [""] * (len(header) - 2))
            continue

        def ratio(*k):
            v = tp(m, *k)
            return f"{v / base:.2f}x" if v else why(m, *k)
        rows.append([name, f"{base:.1f}",
                     ratio("ring", "u280", 4512, "100Gbps", REFERENCE_BOARDS),
                     ratio("ring", "u280", 36096, "100Gbps", REFERENCE_BOARDS),
                     ratio("ring", "u280-ddr", 9024, "100Gbps", REFERENCE_BOARDS),
                     ratio("ring", "u280", 9024, "200Gbps", REFERENCE_BOARDS),
                     ratio("ring", "u280", 9024, "400Gbps", REFERENCE_BOARDS),
                     ratio("torus", "u280", 9024, "100Gbps", REFERENCE_BOARDS),
                     ratio("torus", "u280", 36096, "400Gbps", REFERENCE_BOARDS)])
    lines += [pgx.markdown_table(header, rows), ""]

    # 2. Scaling with boards, per model, at 1x DSPs and HBM.
    lines += ["## Throughput (samples/s) against board count, 9,024 DSPs, HBM", ""]
    header = ["model", "topology", "link"] + [str(b) for b in RING_BOARDS]
    rows = []
    for m, name in MODELS.items():
        for topo in ("ring", "torus"):
            for link in ("100Gbps", "400Gbps"):
                cells = []
                for b in RING_BOARDS:
                    v = tp(m, topo, "u280", 9024, link, b)
                    cells.append(f"{v:.1f}" if v else why(m, topo, "u280", 9024, link, b))
                rows.append([name, topo, link] + cells)
    lines += [pgx.markdown_table(header, rows), ""]

    # 3. The best configuration per model and board count.
    lines += ["## Best point per model and board count", ""]
    header = ["model", "boards", "samples/s", "topology", "memory", "DSPs", "link", "micro-batch", "stages"]
    rows = []
    for m, name in MODELS.items():
        for b in RING_BOARDS:
            cands = [(r["throughput_samples_per_s"], k, r) for k, r in results.items()
                     if k[0] == m and k[5] == b and r["status"] == "ok"]
            if not cands:
                continue
            v, k, r = max(cands, key=lambda c: c[0])
            res = r["result"]
            rows.append([name, b, f"{v:.1f}", k[1], MEMORY[k[2]], f"{k[3]:,}", k[4],
                         f"{res['micro_batch_size']} x {res['micro_batches']}", len(res["stages"])])
    lines += [pgx.markdown_table(header, rows), ""]
    if errors:
        lines += ["## Points that failed", ""] + [f"- point {r['point']} {r['axes']}: {r['message']}" for r in errors[:20]]
        lines.append("")
    infeasible = [r for r in results.values() if r["status"] == "infeasible"]
    if infeasible:
        lines += [f"{len(infeasible)} points exceed a board's memory (status infeasible), e.g. "
                  f"{infeasible[0]['axes']}: {infeasible[0]['message']}", ""]
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines))

    if plt is None:
        return
    colors = {"vgg16": "C0", "resnet50": "C1", "gnmt8": "C2"}
    # Figure 1: speed-up against DSP count (0.5x, 1x, 2x, 4x), HBM (solid) and DDR (dashed), 16-board ring,
    # 100 Gb/s. Both axes log2, so that speed-up proportional to the DSPs is the dotted diagonal (a linear
    # y over a log2 x bends proportional scaling into a curve that looks super-linear).
    fig, ax = plt.subplots(figsize=(7, 4.4))
    scale = [d / 9024 for d in DSPS_16]
    ax.plot(scale, scale, ":", color="0.5", label="proportional to DSPs")
    for m, name in MODELS.items():
        base = tp(m, *ref)
        for mem, style in (("u280", "-"), ("u280-ddr", "--")):
            pts = [(d / 9024, tp(m, "ring", mem, d, "100Gbps", REFERENCE_BOARDS)) for d in DSPS_16]
            pts = [(x, y) for x, y in pts if y]
            if base and pts:
                ax.plot([x for x, _ in pts], [y / base for _, y in pts], style, marker="o", color=colors[m],
                        label=f"{name}, {MEMORY[mem]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ticks = [0.25, 0.5, 1, 2, 4]
    ax.set_xticks(scale)
    ax.set_xticklabels([f"{x:g}x" for x in scale])
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{y:g}x" for y in ticks])
    ax.set_ylim(0.2, 5)
    ax.set_xlabel("DSPs (x the U280's 9,024)", fontsize=11)
    ax.set_ylabel("throughput / (1x DSPs, HBM)", fontsize=11)
    ax.set_title(f"Compute: {REFERENCE_BOARDS}-board ring, 100 Gb/s links", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # off the data
    fig.tight_layout()
    save(fig, args.out, "dsp")
    # Figure 2: throughput against boards, ring vs torus, 100 and 400 Gb/s (1x DSPs, HBM).
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for ax, (m, name) in zip(axes, MODELS.items()):
        # The torus ties the ring at several points: its markers are hollow and larger, so that both
        # show where they coincide.
        for topo, style, size, face in (("ring", "-", 5, None), ("torus", "--", 10, "none")):
            for link, marker in (("100Gbps", "o"), ("400Gbps", "s")):
                pts = [(b, tp(m, topo, "u280", 9024, link, b)) for b in RING_BOARDS]
                pts = [p for p in pts if p[1]]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=marker, markersize=size,
                        markerfacecolor=face, markeredgewidth=1.5,
                        label=f"{topo}, {link.replace('Gbps', ' Gb/s')}")
        # Log-log: weak scaling proportional to the boards is a straight line of slope 1.
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(RING_BOARDS)
        ax.set_xticklabels([str(b) for b in RING_BOARDS])
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:,.0f}"))
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("boards", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("samples/s (9,024 DSPs, HBM), log scale", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)  # below, off the data
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    save(fig, args.out, "boards")
    if args.quick:  # the heat maps are of 64 boards
        print(f"wrote {os.path.join(args.out, 'results.md')}, dsp and boards (--quick: no 64-board heat maps)",
              file=sys.stderr)
        return
    # Figure 3: link speed x DSPs heat maps (speed-up over 1x DSPs at 100 Gb/s), 64-board ring, HBM.
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.6))
    for ax, (m, name) in zip(axes, MODELS.items()):
        base = tp(m, "ring", "u280", 9024, "100Gbps", 64)
        grid = [[(tp(m, "ring", "u280", d, link, 64) or float("nan")) / (base or float("nan")) for d in DSPS]
                for link in LINKS]
        im = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
        norm = plt.Normalize(*im.get_clim())
        for j in range(len(LINKS)):
            for i in range(len(DSPS)):
                r_, g_, b_, _ = plt.get_cmap("viridis")(norm(grid[j][i]))
                dark = 0.299 * r_ + 0.587 * g_ + 0.114 * b_ < 0.5  # legible on every cell
                ax.text(i, j, f"{grid[j][i]:.2f}x", ha="center", va="center", color="white" if dark else "black",
                        fontsize=10)
        ax.set_xticks(range(len(DSPS)))
        ax.set_xticklabels(["0.5x", "1x", "4x"])
        ax.set_yticks(range(len(LINKS)))
        ax.set_yticklabels([link.replace("Gbps", " Gb/s") for link in LINKS])
        ax.set_xlabel("DSPs (x the U280's 9,024)", fontsize=10)
        ax.set_ylabel("QSFP link (per direction)", fontsize=10)
        ax.set_title(f"{name}, 64-board ring, HBM", fontsize=11)
        fig.colorbar(im, ax=ax).set_label("speed-up over 1x DSPs, 100 Gb/s", fontsize=9)
    fig.tight_layout()
    save(fig, args.out, "links")
    print(f"wrote {os.path.join(args.out, 'results.md')} and the figures", file=sys.stderr)


def save(fig, dest, name):
    fig.savefig(os.path.join(dest, f"{name}.png"), dpi=110)
    fig.savefig(os.path.join(dest, f"{name}.svg"), metadata={"Date": None})


if __name__ == "__main__":
    main()
