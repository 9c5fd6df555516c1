#!/usr/bin/env python3
"""Two GPT jobs on two pods joined at 1:7 (issue 54, docs/jobs.md): packed (each job in its own pod),
spread (half of each job in each pod) and random placements (three seeds), 10 iterations each, from
`pipegrid jobs --json`; then, spread, job B's start delayed in steps of 5 ms (CASSINI's idea of
shifting a job's communication phases, as an offset sweep). Writes placement.png / placement.svg
(slowdown per job and placement; the spread run's timeline, one lane per job) and placement.json
beside this script.

    experiments/jobs/placement.py [--figure-only]

Each point is one `pipegrid jobs` call (one shared replay and one replay of each job alone, 1.2 s
here, median of 5 with farm-bench on 2026-12-02, for spread.yaml)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
import pgx  # noqa: E402

SEEDS = [1, 2, 3]
OFFSETS_MS = list(range(0, 60, 5))


def jobs_file(placement_a, placement_b="", seed=None, start_b_ms=0):
    """A jobs file like packed.yaml, with the placements, seed and job B's start given."""
    with open(os.path.join(HERE, "packed.yaml")) as f:
        text = f.read()
    head = text[: text.index("jobs:")]
    extra = f", seed: {seed}" if seed is not None else ""
    b = placement_b or placement_a
    return (head + "jobs:\n"
            f"  - {{name: gpt-a, experiment: {os.path.join(HERE, 'gpt-a.yaml')}, devices: 32, "
            f"placement: {placement_a}{extra}}}\n"
            f"  - {{name: gpt-b, experiment: {os.path.join(HERE, 'gpt-b.yaml')}, devices: 32, "
            f"placement: {b}{extra}, start: {start_b_ms}ms}}\n")


def run(pipegrid, text):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        p = subprocess.run([pipegrid, "jobs", path, "--json"], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        sys.exit(f"pipegrid jobs failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)


def measure(pipegrid):
    out = {"placements": {}, "offsets": []}
    out["placements"]["packed"] = run(pipegrid, jobs_file("packed"))
    out["placements"]["spread"] = run(pipegrid, jobs_file("spread"))
    for s in SEEDS:
        out["placements"][f"random {s}"] = run(pipegrid, jobs_file("random", seed=s))
    for ms in OFFSETS_MS:
        j = run(pipegrid, jobs_file("spread", start_b_ms=ms))
        out["offsets"].append({"start_b_ms": ms, "slowdown": [x["slowdown"] for x in j["jobs"]],
                               "worst_s": [x["worst_s"] for x in j["jobs"]]})
    return out


def draw(results, plt):
    fig, (ax, lanes) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.35]})
    placements = list(results["placements"])
    packed = results["placements"]["packed"]["jobs"]
    width = 0.38
    for k, name in enumerate(["gpt-a", "gpt-b"]):
        base = packed[k]["alone_s"]
        xs = [i + (k - 0.5) * width for i in range(len(placements))]
        means = [results["placements"][p]["jobs"][k]["mean_s"] / base for p in placements]
        worst = [results["placements"][p]["jobs"][k]["worst_s"] / base for p in placements]
        alone = [results["placements"][p]["jobs"][k]["alone_s"] / base for p in placements]
        bars = ax.bar(xs, means, width, label=f"{name}: mean of 10 iterations")
        ax.plot(xs, worst, "v", color=bars.patches[0].get_facecolor(), markersize=6,
                label=f"{name}: worst iteration")
        ax.plot(xs, alone, "_", color="black", markersize=14, mew=2, label="alone on the same devices" if k else None)
    ax.set_xticks(range(len(placements)))
    ax.set_xticklabels(placements)
    top = max(max(results["placements"][p]["jobs"][k]["worst_s"] / packed[k]["alone_s"] for p in placements)
              for k in range(2))
    ax.set_ylim(0.95, top + 0.25)  # room above the data for the legend
    ax.set_ylabel("iteration time / time alone, packed")
    ax.set_xlabel("placement of both jobs")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.grid(True, axis="y", alpha=0.3)
    spread = results["placements"]["spread"]["jobs"]
    for k, job in enumerate(spread):
        y = len(spread) - 1 - k
        start = job["start_s"]
        for i, t in enumerate(job["iteration_times_s"]):
            lanes.broken_barh([(1e3 * start, 1e3 * t)], (y - 0.35, 0.7), facecolors="C%d" % k,
                              alpha=0.25 if i % 2 else 0.4, edgecolor="white")
            start += t
        busy = [(1e3 * a, 1e3 * (b - a)) for a, b in job["on_shared_links"]]
        lanes.broken_barh(busy, (y - 0.12, 0.24), facecolors="black")
    lanes.set_yticks(range(len(spread)))
    lanes.set_yticklabels([j["name"] for j in reversed(spread)])
    lanes.set_xlabel("time (ms)")
    lanes.set_title("spread: iterations (shaded, alternating) and flows on shared links (black)", fontsize=9)
    lanes.grid(True, axis="x", alpha=0.3)
    fig.suptitle("Two GPT jobs on two pods of 4 DGX H100 nodes joined at 1:7", fontsize=10)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(HERE, f"placement.{ext}"), dpi=150)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--figure-only", action="store_true", help="redraw from placement.json")
    a = ap.parse_args()
    plt = pgx.matplotlib_pyplot()
    path = os.path.join(HERE, "placement.json")
    if a.figure_only:
        with open(path) as f:
            results = json.load(f)
    else:
        results = measure(pgx.binary())
        slim = json.loads(json.dumps(results))
        for j in slim["placements"].values():  # the per-device reports are not drawn
            for job in j["jobs"]:
                job.pop("first_iteration", None)
        with open(path, "w") as f:
            json.dump(slim, f, indent=1)
            f.write("\n")
        results = slim
    draw(results, plt)
    for p, j in results["placements"].items():
        print(f"{p:10s} " + "  ".join(f"{x['name']}: mean {1e3 * x['mean_s']:.2f} ms, worst {1e3 * x['worst_s']:.2f} ms,"
                                      f" alone {1e3 * x['alone_s']:.2f} ms" for x in j["jobs"]))
    for o in results["offsets"]:
        print(f"spread, gpt-b starts at {o['start_b_ms']:2d} ms: slowdown "
              + ", ".join(f"{s:.3f}" for s in o["slowdown"]))


if __name__ == "__main__":
    main()
