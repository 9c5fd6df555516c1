#!/usr/bin/env python3
"""ctest tools/plot_timeline: the figures of `pipegrid run --plot` are readable (issue 15, item 5).

Usage: plot_timeline_test.py PIPEGRID REPO_ROOT

Runs pipegrid on two experiments written here, draws them with tools/plot_timeline.py (imported,
so the figures can be inspected before they are saved) and checks, against facts derived from
the experiment files rather than from the script:
  - the built-in example (8 layers, 4 GPUs, uniform): device gpuK runs stage K (8 / 4 = 2 layers
    each, in order), so its timeline row reads "gpuK  stage K";
  - 64 devices (16 stages x 4 replicas, uniform over 32 layers): every timeline row names its
    stage (gpu 4s..4s+3 run stage s: the partitioner places replicas on consecutive devices),
    every device is labelled on the memory figure's device axis, each stage gets its own colour
    (16 distinct ones) shared by its 4 replicas, and no legend overlaps any plotting area (the
    rectangles of the drawn figure: geometry, independent of how the script places them);
  - `pipegrid run --plot` titles the figures with the experiment's name, and says when the file
    has none;
  - a tensor-parallel and an expert-parallel run draw, their collectives in the legend.
Exits 77 (skipped) when matplotlib is missing.
"""
import csv
import importlib.util
import os
import subprocess
import sys
import tempfile

FAILURES = []
CHECKS = [0]


def check(ok, what):
    CHECKS[0] += 1
    if not ok:
        FAILURES.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def run(pipegrid, args, stdin=None):
    p = subprocess.run([pipegrid] + args, input=stdin, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"pipegrid {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def overlaps(a, b):
    """Two display-space Bbox rectangles share an area (touching edges do not count)."""
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


def legends_clear(fig, name):
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    check(legends or name == "none", f"{name}: has a legend")
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            check(not overlaps(box, ax.get_window_extent(renderer)), f"{name}: a legend covers a plotting area")


def main(pipegrid, root):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # A python3 without matplotlib ahead of Debian's on PATH (pyenv): run under Debian's.
        debian = "/usr/bin/python3"
        if os.path.exists(debian) and os.path.realpath(debian) != os.path.realpath(sys.executable):
            return subprocess.run([debian] + sys.argv).returncode
        print("skipped: matplotlib is missing (apt-get install python3-matplotlib)")
        return 77
    spec = importlib.util.spec_from_file_location("plot_timeline", os.path.join(root, "tools", "plot_timeline.py"))
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)

    with tempfile.TemporaryDirectory() as tmp:
        # The built-in example: 4 stages of 2 layers on gpu0..gpu3.
        tasks, memory = os.path.join(tmp, "t4.csv"), os.path.join(tmp, "m4.csv")
        run(pipegrid, ["run", "--tasks", tasks, "--memory", memory])
        rows = pt.read_csv(tasks)
        fig = pt.gantt(rows, "example", plt)
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        check(labels == [f"gpu{k}  stage {k}" for k in range(4)], f"4-device rows: {labels}")
        legends_clear(fig, "4-device timeline")
        plt.close(fig)
        fig = pt.memory(pt.read_csv(memory), pt.device_stages(rows), "example", plt, 1.0)
        legends_clear(fig, "4-device memory")
        plt.close(fig)

        # 64 devices: 16 stages x 4 replicas over 32 layers (2 layers a stage).
        experiment = (
            "name: sixty-four devices\n"
            "workload: {kind: chain, layers: 32, forward: 1ms, backward: 2ms, activation: 8MiB,\n"
            "           parameters: 16MiB, samples_per_micro_batch: 4}\n"
            "cluster: {kind: switch, count: 64, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps,\n"
            "          latency: 1us}\n"
            "strategy: {partitioner: uniform, replicas: 4, schedule: 1f1b, micro_batches: 16}\n")
        path = os.path.join(tmp, "e64.yaml")
        with open(path, "w") as f:
            f.write(experiment)
        tasks, memory = os.path.join(tmp, "t64.csv"), os.path.join(tmp, "m64.csv")
        run(pipegrid, ["run", path, "--tasks", tasks, "--memory", memory])
        rows = pt.read_csv(tasks)
        fig = pt.gantt(rows, "sixty-four devices", plt)
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        expected = [f"gpu{d}  stage {d // 4}" for d in range(64)]
        check(sorted(labels) == sorted(expected), f"64-device rows: {labels[:6]}...")
        legends_clear(fig, "64-device timeline")
        plt.close(fig)
        fig = pt.memory(pt.read_csv(memory), pt.device_stages(rows), "sixty-four devices", plt, 1.0)
        bottom = fig.axes[2]
        names = [t.get_text() for t in bottom.get_xticklabels()]
        check(sorted(names) == sorted(f"gpu{d}" for d in range(64)), f"64 devices on the axis: {names[:6]}...")
        colours = {}
        for name, patch in zip(names, bottom.patches):
            colours.setdefault(int(name[3:]) // 4, set()).add(tuple(patch.get_facecolor()))
        check(all(len(c) == 1 for c in colours.values()), "a stage's replicas share one colour")
        check(len({next(iter(c)) for c in colours.values()}) == 16, "16 stages, 16 colours")
        legends_clear(fig, "64-device memory")
        plt.close(fig)

        # Interleaved 1F1B, 2 chunks on 4 GPUs (8 stages: gpu k runs stages k and k + 4): the two chunks
        # of a device are drawn in two colours, and the memory legend lists the 4 colours the 4 lines
        # use (stages 0,4 ... 3,7), not 8 stages for 4 lines (issue 30).
        inter = os.path.join(tmp, "inter.yaml")
        with open(inter, "w") as f:
            f.write("workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}\n"
                    "cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 25GBps, latency: 1us}\n"
                    "strategy: {schedule: interleaved-1f1b, chunks: 2, micro_batches: 8}\n")
        tasks, memory = os.path.join(tmp, "ti.csv"), os.path.join(tmp, "mi.csv")
        run(pipegrid, ["run", inter, "--tasks", tasks, "--memory", memory])
        rows = pt.read_csv(tasks)
        fig = pt.gantt(rows, "interleaved", plt)
        forward_colours = set()
        for coll in fig.axes[0].collections:
            for c in coll.get_facecolors():
                forward_colours.add(tuple(round(x, 3) for x in c))
        check(len(forward_colours) >= 4, f"two chunks, two shades of forward and backward: {len(forward_colours)} colours")
        names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        check("forward, chunk 0" in names and "forward, chunk 1" in names, f"chunk legend: {names}")
        legends_clear(fig, "interleaved timeline")
        plt.close(fig)
        fig = pt.memory(pt.read_csv(memory), pt.device_stages(rows), "interleaved", plt, 1.0)
        entries = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        check(entries == ["stages 0,4", "stages 1,5", "stages 2,6", "stages 3,7"], f"memory legend: {entries}")
        plt.close(fig)

        # Titles through `pipegrid run --plot` (svg text is searchable).
        out = os.path.join(tmp, "named")
        # The user's own files of the intermediate files' names stay as they were: until 2026-12-05
        # pipegrid wrote its tasks.csv, memory.csv and plot_timeline.py over them and then removed them.
        os.makedirs(out)
        mine = {"tasks.csv": "precious\n", "memory.csv": "mine\n", "plot_timeline.py": "# mine\n"}
        for name, text in mine.items():
            with open(os.path.join(out, name), "w") as f:
                f.write(text)
        run(pipegrid, ["run", path, "--plot", out])
        with open(os.path.join(out, "timeline.svg")) as f:
            check("Timeline: sixty-four devices" in f.read(), "the title is the experiment's name")
        for name, text in mine.items():
            with open(os.path.join(out, name)) as f:
                check(f.read() == text, f"--plot left the folder's own {name} as it was")
        unnamed = os.path.join(tmp, "unnamed.yaml")
        with open(unnamed, "w") as f:
            f.write(experiment.replace("name: sixty-four devices\n", ""))
        out = os.path.join(tmp, "unnamed")
        run(pipegrid, ["run", unnamed, "--plot", out])
        with open(os.path.join(out, "memory.svg")) as f:
            check(f"unnamed experiment ({unnamed})" in f.read(), "an unnamed experiment's title says so")

        # Collectives of the newer kinds draw (issue 55, item 1: a tensor-parallel run ended in a
        # KeyError): a GPT with t = 2, p = 2 and a mixture of experts with ep = 2, each on 4 GPUs.
        for name, text, kind in (
                ("tp", "workload: {model: gpt, layers: 4, hidden: 256, heads: 8, sequence: 128, vocabulary: 1024,"
                       " precision: amp}\n"
                       "cluster: {kind: switch, count: 4, device: {name: gpu, model: a100}, bandwidth: 100GBps,"
                       " latency: 1us}\n"
                       "strategy: {partitioner: megatron, tensor_parallel: 2, stages: 2, micro_batches: 4}\n",
                 "tensor-parallel"),
                ("moe", "workload: {model: mixtral-8x7b, layers: 2, hidden: 256, heads: 8, kv_heads: 8, ffn: 512,"
                        " expert_ffn: 512, experts: 4, sequence: 128, vocabulary: 1024, precision: amp-bf16}\n"
                        "cluster: {kind: switch, count: 4, device: {name: gpu, model: h100}, bandwidth: 100GBps,"
                        " latency: 1us}\n"
                        "strategy: {partitioner: megatron, stages: 1, replicas: 4, expert_parallel: 2,"
                        " micro_batch_size: 1, micro_batches: 2}\n",
                 "expert-parallel")):
            exp = os.path.join(tmp, name + ".yaml")
            with open(exp, "w") as f:
                f.write(text)
            out = os.path.join(tmp, name + "-plot")
            run(pipegrid, ["run", exp, "--plot", out, "--plot-data"])  # keep the CSVs to read them
            kinds = {r["kind"] for r in pt.read_csv(os.path.join(out, "tasks.csv"))}
            check(kind in kinds, f"{name}: the tasks hold {kind} transfers: {sorted(kinds)}")
            with open(os.path.join(out, "timeline.svg")) as f:
                check(f"{kind} (send)" in f.read(), f"{name}: the legend names {kind} transfers")
    print(f"{CHECKS[0] - len(FAILURES)} passed, {len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
