#!/usr/bin/env python3
"""How often to checkpoint Llama 3 405B on 16,384 H100s, for a given storage (issue 53, item 3): the
expected effective training time ratio (ETTR) against the checkpoint interval, from `pipegrid goodput
--json` (Daly's closed form over the replayed iteration, the Llama 3 failure model, 10-minute
restarts), for Llama 3's storage (2 TB/s sustained, arXiv 2407.21783, section 3.3.1) and for storage
ten and a hundred times slower; each curve's best interval marked. Writes interval.png, interval.svg
and interval.json beside this script, and lost.png / lost.svg: where the run's time goes at each
storage's best interval (useful training, checkpoint writes, rework, restarts) and the time failures
cost by cause (Llama 3's Table 5 classes, at 2 TB/s).

    experiments/goodput/interval.py [--figure-only]

Each storage is one `pipegrid goodput` call, one replay of the 16,384-GPU iteration (about a minute
and 4.5 GB here)."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
import pgx  # noqa: E402

EXPERIMENT = os.path.join(ROOT, "experiments", "megatron", "llama3-405b-uneven.yaml")
SETS = ["strategy.replicas=128", "cluster.nodes=2048", "strategy.global_batch=2048"]
STORAGES = ["2TBps", "200GBps", "20GBps"]
TOKENS = "15.6e12"


def run(pipegrid, storage):
    cmd = [pipegrid, "goodput", EXPERIMENT, "--tokens", TOKENS, "--storage-bandwidth", storage, "--json"]
    for s in SETS:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)


def draw(results, plt):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for storage, j in results.items():
        xs = [c["interval_s"] / 60 for c in j["interval_curve"]]
        ys = [100 * c["ettr"] for c in j["interval_curve"]]
        label = storage.replace("TBps", " TB/s").replace("GBps", " GB/s")
        line, = ax.plot(xs, ys, label=f"{label}: write {j['checkpoint_write_s']:.3g} s")
        best = j["checkpoint_interval_s"] / 60
        ax.plot([best], [100 * j["ettr"]], "o", color=line.get_color())
        ax.annotate(f"{best:.1f} min, {100 * j['ettr']:.1f}%", (best, 100 * j["ettr"]), textcoords="offset points",
                    xytext=(4, 6), fontsize=8, color=line.get_color())
    ax.set_xscale("log")
    ax.set_ylim(0, 100)
    ax.set_xlabel("checkpoint interval (minutes, log scale)")
    ax.set_ylabel("expected ETTR (%)")
    any_j = next(iter(results.values()))
    ax.set_title(f"Llama 3 405B on 16,384 H100s: MTBF {any_j['mtbf_s'] / 3600:.2f} h, restart "
                 f"{any_j['restart_s'] / 60:.0f} min", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="checkpoint storage", fontsize=8, title_fontsize=8, loc="lower center", framealpha=0.9)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(HERE, f"interval.{ext}"), dpi=150)


def draw_lost(results, plt):
    """Where the time goes (days, at each storage's best interval), and what failures cost by cause."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1, 1.3]})
    parts = [("useful training", None, "C2"), ("checkpoint writes", "checkpoint", "C0"),
             ("rework after failures", "rework", "C1"), ("restarts", "restart", "C3")]
    names = [s.replace("TBps", " TB/s").replace("GBps", " GB/s") for s in results]
    for i, j in enumerate(results.values()):
        useful = j["expected_time_s"] - sum(j["lost_s"].values())
        left = 0.0
        for label, key, color in parts:
            days = (useful if key is None else j["lost_s"][key]) / 86400
            ax.barh(i, days, left=left, color=color, label=label if i == 0 else None)
            left += days
        ax.text(left + 1, i, f"{left:.1f} d, ETTR {100 * j['ettr']:.1f}%", va="center", fontsize=9)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.set_ylabel("checkpoint storage", fontsize=10)
    ax.set_xlabel("days to 15.6T tokens (expected, at the best interval)", fontsize=10)
    ax.set_xlim(0, max(j["expected_time_s"] for j in results.values()) / 86400 * 1.35)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    ax.set_title("Where the run's time goes", fontsize=11)
    first = next(iter(results.values()))
    causes = [(c, v / 3600) for c, v in first["lost_by_cause_s"]]
    bx.barh(range(len(causes)), [h for _, h in causes], color="C4")
    bx.set_yticks(range(len(causes)))
    bx.set_yticklabels([c for c, _ in causes], fontsize=9)
    bx.invert_yaxis()
    bx.set_xlabel("hours of rework and restarts (expected)", fontsize=10)
    bx.set_title(f"What failures cost, by cause ({names[0]}: {first['failures']:.0f} failures)", fontsize=11)
    bx.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(HERE, f"lost.{ext}"), dpi=130)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--figure-only", action="store_true", help="redraw from interval.json")
    args = ap.parse_args()
    plt = pgx.matplotlib_pyplot()
    path = os.path.join(HERE, "interval.json")
    if args.figure_only:
        with open(path) as f:
            results = json.load(f)
    else:
        pipegrid = pgx.binary()
        results = {s: run(pipegrid, s) for s in STORAGES}
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    for storage, j in results.items():
        print(f"{storage}: write {j['checkpoint_write_s']:.3g} s, best interval {j['checkpoint_interval_s'] / 60:.2f} min, "
              f"ETTR {100 * j['ettr']:.2f}%, expected {j['expected_time_s'] / 86400:.2f} days")
    if plt:
        draw(results, plt)
        draw_lost(results, plt)


if __name__ == "__main__":
    main()
