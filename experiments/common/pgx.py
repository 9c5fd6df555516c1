"""Helpers shared by the experiment scripts: write experiment files, run `pipegrid plan --json` on
each (one process per simulation, in parallel), tabulate, and find python3-matplotlib.

The pipegrid binary is build/pipegrid of this checkout, or $PIPEGRID."""
import concurrent.futures
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def binary():
    path = os.environ.get("PIPEGRID", os.path.join(ROOT, "build", "pipegrid"))
    if not os.path.exists(path):
        sys.exit(f"pipegrid is not built ({path}): run tools/setup first, or set PIPEGRID")
    return path


def check_catalog(pipegrid, devices=("v100", "a100")):
    """Exits with a message when `pipegrid`'s built-in device catalog (topologies/devices.yaml is
    compiled into the binary) differs from this checkout's file for `devices`: their compute
    efficiencies, kernel start-up and dispatch, recurrent step times, and Winograd precisions.
    Without it, a refit copied into devices.yaml but not rebuilt replays the old figures and every
    table looks plausible. Returns each device's `pipegrid device show NAME --json`, by name."""
    import yaml
    shown = {}
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    with open(os.path.join(ROOT, "topologies", "devices.yaml"), encoding="utf-8") as f:
        catalog = yaml.safe_load(f)
    for name in devices:
        p = subprocess.run([pipegrid, "device", "show", name, "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{pipegrid} device show {name}: {p.stderr.strip()}")
        built, entry = json.loads(p.stdout), catalog[name]
        shown[name] = built
        for prec, table in (entry.get("compute_efficiency") or {}).items():
            for cls, value in table.items():
                if abs(built["compute_efficiency"][prec][cls] - value) > 1e-9:
                    sys.exit(f"{pipegrid} was built with another topologies/devices.yaml ({name} {prec} {cls}: "
                             f"{built['compute_efficiency'][prec][cls]} built in, {value} in the file): rebuild it "
                             f"(cmake --build build --target pipegrid)")
        if sorted(built.get("winograd", [])) != sorted(entry.get("winograd") or []):
            sys.exit(f"{pipegrid} was built with another topologies/devices.yaml ({name} winograd: "
                     f"{built.get('winograd')} built in, {entry.get('winograd') or []} in the file): rebuild it "
                     f"(cmake --build build --target pipegrid)")
        for key in ("kernel_startup", "kernel_dispatch"):
            text = str(entry.get(key, "0s"))
            unit = next(u for u in ("ns", "us", "ms", "s") if text.endswith(u))
            value = float(text[:-len(unit)]) * units[unit]
            if abs(built.get(f"{key}_s", 0.0) - value) > 1e-12:
                sys.exit(f"{pipegrid} was built with another topologies/devices.yaml ({name} {key}: "
                         f"{built.get(key + '_s')} s built in, {text} in the file): rebuild it "
                         f"(cmake --build build --target pipegrid)")
        for prec, text in (entry.get("recurrent_step") or {}).items():
            text = str(text)
            unit = next(u for u in ("ns", "us", "ms", "s") if text.endswith(u))
            value = float(text[:-len(unit)]) * units[unit]
            if abs(built.get("recurrent_step_s", {}).get(prec, 0.0) - value) > 1e-12:
                sys.exit(f"{pipegrid} was built with another topologies/devices.yaml ({name} recurrent_step "
                         f"{prec}: {built.get('recurrent_step_s', {}).get(prec)} s built in, {text} in the file): "
                         f"rebuild it (cmake --build build --target pipegrid)")
    return shown


def compare_setup(doc, device="v100"):
    """The start of a compare.py against published kernel measurements: parses --check (fail if
    compare.md is not what the binary gives), finds the binary, checks its catalog against
    topologies/devices.yaml and returns (args, pipegrid, `device show DEVICE --json`)."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if compare.md is not what the binary gives")
    args = ap.parse_args()
    pipegrid = binary()
    return args, pipegrid, check_catalog(pipegrid, devices=(device,))[device]


def plan(experiment, path):
    """Writes `experiment` (a dict; JSON is valid YAML) to `path` and returns pipegrid plan's JSON,
    or {"error": message} when pipegrid refuses it (e.g. nothing fits memory)."""
    with open(path, "w") as f:
        json.dump(experiment, f, indent=1)
    p = subprocess.run([binary(), "plan", path, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip().replace(path + ": ", "")}
    return json.loads(p.stdout)


def run_all(jobs, workers=None):
    """jobs: list of (key, experiment dict, path). Returns {key: result}."""
    workers = workers or os.cpu_count() or 2
    out = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(plan, e, p): k for k, e, p in jobs}
        for done, f in enumerate(concurrent.futures.as_completed(futures), 1):
            out[futures[f]] = f.result()
            print(f"[{done}/{len(jobs)}] {futures[f]}", file=sys.stderr, flush=True)  # progress
    return out


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def matplotlib_pyplot():
    """pyplot with the Agg backend. When this interpreter lacks matplotlib (e.g. a pyenv python3
    ahead of Debian's on PATH), the script re-runs itself once under $PIPEGRID_PYTHON or
    /usr/bin/python3 (python3-matplotlib, which tools/setup --all installs); call this before any work.
    None (with a note) when no interpreter has it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        # Same inputs, same bytes: fixed SVG ids (the salt) and no dates (savefig's metadata).
        matplotlib.rcParams["svg.hashsalt"] = "pipegrid"
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        pass
    other = os.environ.get("PIPEGRID_PYTHON", "/usr/bin/python3")
    if not os.environ.get("PGX_REEXEC") and os.path.exists(other) and \
            os.path.realpath(other) != os.path.realpath(sys.executable):
        probe = subprocess.run([other, "-c", "import matplotlib"], capture_output=True)
        if probe.returncode == 0:
            os.environ["PGX_REEXEC"] = "1"
            os.execv(other, [other, os.path.abspath(sys.argv[0])] + sys.argv[1:])
    print("matplotlib is missing (Debian: apt-get install python3-matplotlib): no figure", file=sys.stderr)
    return None


def fmt_time(s):
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def fmt_gib(b):
    return f"{b / 2**30:.2f}"


def write_accuracy(path, header, rows, errors, name):
    """An accuracy.yaml as tools/output/cost_model_checks.cc reads it (experiments/moe's and
    experiments/blackwell-dense's): for each GPU and precision, the check rows among `rows` that have an
    error in `errors` (id -> pipegrid / published - 1): their count, median and max |error|, the worst
    row (its id and `name(row)`), how many pipegrid predicts faster than published, and the data's own
    floor, the releases of one configuration (max / min of a row's `value` and its `same_config`
    values, rows printed twice or more). `header`: the file's comment lines, without the "# "."""
    import statistics
    by = {}
    for r in rows:
        if r["split"] == "check" and r["id"] in errors:
            by.setdefault(r["gpu"], {}).setdefault(r["precision"], []).append(r)
    out = [f"# {line}" for line in header]
    for gpu in sorted(by):
        out.append(f"{gpu}:")
        for prec in sorted(by[gpu]):
            mine = by[gpu][prec]
            errs = sorted((abs(errors[r["id"]]), r["id"]) for r in mine)
            worst = next(r for r in mine if r["id"] == errs[-1][1])
            spreads = sorted(max(v) / min(v) for v in
                             ([r["value"]] + [x["value"] for x in r.get("same_config", [])] for r in mine) if len(v) > 1)
            faster = sum(errors[r["id"]] > 0 for r in mine)
            entry = (f"{{check_rows: {len(errs)}, median_error: {statistics.median(e for e, _ in errs):.4f}, "
                     f"max_error: {errs[-1][0]:.4f}, worst: {worst['id']}, worst_name: \"{name(worst)}\", "
                     f"faster: {faster}, spread_groups: {len(spreads)}")
            if spreads:
                entry += f", median_spread: {statistics.median(spreads):.4f}, max_spread: {spreads[-1]:.4f}"
            out.append(f"  {prec}: {entry}}}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
