#!/usr/bin/env python3
"""pipegrid against ASTRA-sim's analytical backend on the same 1F1B chain (issue 14, item 3).

    experiments/astra-sim/run.py [--out DIR] [--astra-src DIR] [--points 64x256,128x1024]
                                 [--repeat N] [--activation BYTES] [--jobs N] [--no-install]
                                 [--skip-astra]

Run by hand (not by CI): it installs the Debian packages it needs when they are missing, clones
ASTRA-sim at a pinned commit with its submodules at their pinned commits (network access to the
git host), builds the analytical backend (congestion-unaware), writes matched Chakra traces and a
pipegrid experiment per point, runs both simulators as whole processes, checks that their
iteration times agree to 1e-6 relative, and writes DIR/results.md and DIR/results.json. See
README.md beside this script.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import chakra_traces as ct  # noqa: E402

# ASTRA-sim, pinned: the newest master commit whose submodules could all be checked out and built
# here (README.md, "Which ASTRA-sim").
ASTRA_URL = "https://github.com/astra-sim/astra-sim.git"
ASTRA_COMMIT = "c459ab61193bdb5b663ab61d2e923314dae8a77f"
# The submodules the analytical backend needs (ns-3 and htsim are not fetched).
SUBMODULES = ["extern/graph_frontend/chakra", "extern/network_backend/analytical",
              "extern/remote_memory_backend/analytical", "extern/helper/fmt", "extern/helper/spdlog"]
# What the build and this script need, Debian 12 names.
PACKAGES = ["git", "cmake", "make", "g++", "protobuf-compiler", "libprotobuf-dev", "python3-protobuf"]
BINARY = "build/astra_analytical/build/bin/AstraSim_Analytical_Congestion_Unaware"

# The matched chain (tests/bench/scale_bench.cc's Chain1F1B, with the optimizer step made explicit):
FORWARD_US, BACKWARD_US, STEP_US = 1000, 2000, 1000
ACTIVATION_BYTES = 8 * 2**20
BANDWIDTH_BPS, LATENCY_S = 25e9, 1e-6


def say(msg):
    print(f"[astra-sim] {msg}", file=sys.stderr, flush=True)


def reexec_with_protobuf():
    """python3-protobuf is Debian's; a pyenv python3 ahead of /usr/bin on PATH lacks it."""
    try:
        import google.protobuf  # noqa: F401
        return
    except ImportError:
        pass
    other = os.environ.get("PIPEGRID_PYTHON", "/usr/bin/python3")
    if not os.environ.get("ASTRA_REEXEC") and os.path.exists(other) and \
            os.path.realpath(other) != os.path.realpath(sys.executable):
        os.environ["ASTRA_REEXEC"] = "1"
        os.execv(other, [other, os.path.abspath(sys.argv[0])] + sys.argv[1:])


def install(packages):
    missing = [p for p in packages if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True).stdout.find("install ok installed") < 0]
    if not missing:
        return
    say(f"installing {' '.join(missing)}")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing, check=True,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def get_source(args):
    if args.astra_src:
        src = os.path.abspath(args.astra_src)
        if not os.path.exists(os.path.join(src, "build/astra_analytical/build.sh")):
            sys.exit(f"--astra-src {src}: not an ASTRA-sim checkout (no build/astra_analytical/build.sh)")
        head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0 and head.stdout.strip() != ASTRA_COMMIT:
            say(f"note: {src} is at {head.stdout.strip()}, not the pinned {ASTRA_COMMIT}")
        return src
    src = os.path.join(args.out, "astra-sim")

    def git(*cmd):
        if subprocess.run(["git"] + list(cmd)).returncode != 0:
            sys.exit(f"`git {' '.join(cmd)}` failed (see above); use --astra-src DIR with a checkout made by hand")

    if not os.path.exists(os.path.join(src, ".git")):
        say(f"cloning ASTRA-sim into {src}")
        git("clone", ASTRA_URL, src)
    git("-C", src, "checkout", "-q", ASTRA_COMMIT)
    say("checking out the submodules at their pinned commits")
    git("-C", src, "submodule", "update", "--init", "--recursive", *SUBMODULES)
    return src


def build(src, jobs):
    """What build/astra_analytical/build.sh -t congestion_unaware does (compile_chakra_et, then
    cmake and cmake --build), with the parallelism given and at low priority."""
    binary = os.path.join(src, BINARY)
    if os.path.exists(binary):
        say(f"ASTRA-sim already built: {binary}")
        return binary
    proto = os.path.join(src, "extern/graph_frontend/chakra/schema/protobuf")
    for lang in ("--cpp_out", "--python_out"):
        if subprocess.run(["protoc", "et_def.proto", f"--proto_path={proto}", f"{lang}={proto}"]).returncode:
            sys.exit(f"protoc failed on {proto}/et_def.proto")
    b = os.path.join(src, "build/astra_analytical/build")
    os.makedirs(b, exist_ok=True)
    say(f"building ASTRA-sim's analytical backend (congestion_unaware, -j{jobs}); log in {b}/build.log")
    t0 = time.monotonic()
    with open(os.path.join(b, "build.log"), "w") as log:
        for cmd in (["cmake", "..", "-DBUILDTARGET=congestion_unaware"],
                    ["nice", "-n", "10", "cmake", "--build", ".", "-j", str(jobs)]):
            if subprocess.run(cmd, cwd=b, stdout=log, stderr=subprocess.STDOUT).returncode:
                sys.exit(f"ASTRA-sim's build failed ({' '.join(cmd)}): see {b}/build.log")
    say(f"built in {time.monotonic() - t0:.0f} s")
    return binary


def official_schema(src, out):
    """Chakra's et_def.proto compiled for python (protoc), from the ASTRA-sim checkout."""
    proto = os.path.join(src, "extern/graph_frontend/chakra/schema/protobuf")
    d = os.path.join(out, "et_def_py")
    os.makedirs(d, exist_ok=True)
    if subprocess.run(["protoc", "et_def.proto", f"--proto_path={proto}", f"--python_out={d}"]).returncode:
        sys.exit(f"protoc failed on {proto}/et_def.proto")
    sys.path.insert(0, d)
    import et_def_pb2
    return et_def_pb2


def check_traces(pb, directory, p, m):
    """Parses ranks 0, 1 and p - 1 with Chakra's schema and checks them against the generator's
    closed form: 2 m + 1 COMP nodes, m SEND and m RECV per neighbour, dependencies in range."""
    from google.protobuf.internal.decoder import _DecodeVarint32
    for s in sorted({0, min(1, p - 1), p - 1}):
        data = open(os.path.join(directory, f"chain.{s}.et"), "rb").read()
        pos, first, counts, ids = 0, True, {}, []
        while pos < len(data):
            size, pos = _DecodeVarint32(data, pos)
            msg = pb.GlobalMetadata() if first else pb.Node()
            msg.ParseFromString(data[pos:pos + size])
            pos += size
            if not first:
                counts[msg.type] = counts.get(msg.type, 0) + 1
                assert all(d < msg.id for d in msg.data_deps), f"rank {s} node {msg.id}: a dependency after it"
                ids.append(msg.id)
            first = False
        neighbours = (s > 0) + (s < p - 1)
        want = {pb.COMP_NODE: 2 * m + 1, pb.COMM_SEND_NODE: neighbours * m, pb.COMM_RECV_NODE: neighbours * m}
        want = {k: v for k, v in want.items() if v}
        if counts != want or ids != list(range(len(ids))):
            sys.exit(f"rank {s}: node counts {counts}, expected {want} (ids 0..n-1 in order)")


def timed(cmd, stdout_path, cwd=None):
    """Runs cmd with its standard output in stdout_path (a file, not a pipe: a pipe would fill up
    while we wait); returns (stdout text, wall s, CPU s of it and its children, peak RSS bytes)."""
    with open(stdout_path, "w+") as out, open(stdout_path + ".err", "w+") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code
        out.seek(0)
        err.seek(0)
        if code != 0:
            sys.exit(f"{' '.join(cmd)} failed ({code}):\n{err.read()[-2000:]}")
        return out.read(), wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024


def pipegrid_binary():
    path = os.environ.get("PIPEGRID", os.path.join(ROOT, "build", "pipegrid"))
    if not os.path.exists(path):
        sys.exit(f"pipegrid is not built ({path}): run tools/setup first, or set PIPEGRID")
    return path


def run_point(args, p, m, binary, pb):
    d = os.path.join(args.out, f"p{p}-m{m}" + ("" if args.activation == ACTIVATION_BYTES else f"-a{args.activation}"))
    os.makedirs(d, exist_ok=True)
    say(f"p = {p}, m = {m}: writing traces and configurations in {d}")
    nodes = ct.write_traces(os.path.join(d, "traces"), "chain", p, m, FORWARD_US, BACKWARD_US, STEP_US,
                            args.activation)
    network, system, memory = ct.astra_configs(d, p, BANDWIDTH_BPS, LATENCY_S)
    experiment = os.path.join(d, "experiment.yaml")
    with open(experiment, "w") as f:
        json.dump(ct.pipegrid_experiment(p, m, FORWARD_US, BACKWARD_US, STEP_US, args.activation,
                                         BANDWIDTH_BPS, LATENCY_S), f, indent=1)
    if pb is not None:
        check_traces(pb, os.path.join(d, "traces"), p, m)
    row = {"p": p, "m": m, "compute_tasks": 2 * p * m + p, "transfers": 2 * (p - 1) * m, "trace_nodes": nodes}
    row["activities"] = row["compute_tasks"] + row["transfers"]
    best = {}
    for rep in range(args.repeat):
        say(f"p = {p}, m = {m}: pipegrid run ({rep + 1}/{args.repeat})")
        text, wall, cpu, rss = timed([pipegrid_binary(), "run", experiment, "--json"],
                                      os.path.join(d, "pipegrid.json"))
        result = json.loads(text)
        if "pipegrid" not in best or cpu < best["pipegrid"]["cpu_s"]:
            best["pipegrid"] = {"iteration_time_s": result["iteration_time_s"], "wall_s": wall, "cpu_s": cpu,
                                "peak_rss_bytes": rss}
        if binary:
            say(f"p = {p}, m = {m}: ASTRA-sim ({rep + 1}/{args.repeat})")
            cmd = [binary, f"--workload-configuration={os.path.join(d, 'traces', 'chain')}",
                   f"--system-configuration={system}", f"--remote-memory-configuration={memory}",
                   f"--network-configuration={network}"]
            text, wall, cpu, rss = timed(cmd, os.path.join(d, "astra-sim.out"), cwd=d)
            finished = [int(x) for x in re.findall(r"sys\[\d+\] finished, (\d+) cycles", text)]
            if len(finished) != p:
                sys.exit(f"ASTRA-sim reported {len(finished)} finished ranks of {p}: see {d}/astra-sim.out")
            if "astra" not in best or cpu < best["astra"]["cpu_s"]:
                best["astra"] = {"iteration_time_s": max(finished) * 1e-9, "wall_s": wall, "cpu_s": cpu,
                                 "peak_rss_bytes": rss}
    row.update(best)
    if binary:
        a, g = row["astra"]["iteration_time_s"], row["pipegrid"]["iteration_time_s"]
        row["relative_difference"] = abs(a - g) / g
        row["wall_ratio"] = row["astra"]["wall_s"] / row["pipegrid"]["wall_s"]
        row["cpu_ratio"] = row["astra"]["cpu_s"] / row["pipegrid"]["cpu_s"]
        say(f"p = {p}, m = {m}: iteration {g:.9f} s (pipegrid) vs {a:.9f} s (ASTRA-sim), "
            f"difference {row['relative_difference']:.1e}; wall {row['pipegrid']['wall_s']:.2f} s vs "
            f"{row['astra']['wall_s']:.2f} s ({row['wall_ratio']:.1f}x)")
    return row


def write_results(out, rows, meta):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = ["# pipegrid against ASTRA-sim's analytical backend (congestion-unaware)", "",
             f"Generated by `experiments/astra-sim/run.py` on {meta['date']} ({meta['machine']}); "
             f"ASTRA-sim {meta['astra_commit']}. Each cell is the run with the least CPU time of "
             f"{meta['repeat']}. Chain: forward 1 ms, backward 2 ms, optimizer step 1 ms, "
             f"{meta['chain']['activation_bytes']} B per activation and per gradient, one switch, links 25 GB/s "
             f"and 1 us. Times are whole processes: wall, and CPU (user + system, children included).",
             "",
             "| p | m | activities | trace nodes | iteration pipegrid (s) | iteration ASTRA-sim (s) | rel. diff. "
             "| wall pipegrid (s) | wall ASTRA-sim (s) | wall ratio | CPU pipegrid (s) | CPU ASTRA-sim (s) "
             "| CPU ratio | peak RSS pipegrid (MiB) | peak RSS ASTRA-sim (MiB) |",
             "|" + "---|" * 15]
    for r in rows:
        g, a = r["pipegrid"], r.get("astra")

        def both(key, spec):
            return f"{g[key]:{spec}}", (f"{a[key]:{spec}}" if a else "-")

        it, wall, cpu = both("iteration_time_s", ".9f"), both("wall_s", ".2f"), both("cpu_s", ".2f")
        rss = (f"{g['peak_rss_bytes'] / 2**20:.0f}", f"{a['peak_rss_bytes'] / 2**20:.0f}" if a else "-")
        diff = f"{r['relative_difference']:.1e}" if a else "-"
        ratios = (f"{r['wall_ratio']:.1f}x", f"{r['cpu_ratio']:.1f}x") if a else ("-", "-")
        cells = [r["p"], r["m"], f"{r['activities']:,}", f"{r['trace_nodes']:,}", *it, diff, *wall, ratios[0], *cpu,
                 ratios[1], *rss]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Writes OUT/results.md and OUT/results.json; see README.md.")
    ap.add_argument("--out", default=os.path.join(HERE, "out"), help="working folder (default: %(default)s)")
    ap.add_argument("--astra-src", help="an existing ASTRA-sim checkout with its submodules (no clone)")
    ap.add_argument("--points", default="64x256,128x1024", help="PxM,... (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per simulator and point; the least CPU time "
                    "is kept (default: %(default)s)")
    ap.add_argument("--activation", type=int, default=ACTIVATION_BYTES,
                    help="bytes per activation and per gradient (default: %(default)s, 8 MiB)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel jobs of ASTRA-sim's build (default: %(default)s)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    ap.add_argument("--skip-astra", action="store_true", help="write the traces and run pipegrid only")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    points = []
    for item in args.points.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)", item.strip())
        if not m or int(m.group(1)) < 2 or int(m.group(2)) < 1:
            ap.error(f"--points: {item!r} is not PxM with P >= 2 and M >= 1")
        points.append((int(m.group(1)), int(m.group(2))))
    if args.repeat < 1 or args.jobs < 1 or args.activation < 1:
        ap.error("--repeat, --jobs and --activation take a positive number")
    if not args.skip_astra:  # --skip-astra needs nothing beyond python3 and pipegrid
        if not args.no_install:
            install(PACKAGES)
        reexec_with_protobuf()
    os.makedirs(args.out, exist_ok=True)
    binary, pb, src = None, None, None
    if not args.skip_astra:
        src = get_source(args)
        binary = build(src, args.jobs)
        pb = official_schema(src, args.out)
    rows = [run_point(args, p, m, binary, pb) for p, m in points]
    uname = os.uname()
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {uname.machine}",
            "astra_commit": (subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True,
                                            text=True).stdout.strip() or f"at {src} (not a git checkout)")
            if src else "not run",
            "repeat": args.repeat,
            "chain": {"forward_us": FORWARD_US, "backward_us": BACKWARD_US, "step_us": STEP_US,
                      "activation_bytes": args.activation, "bandwidth_Bps": BANDWIDTH_BPS, "latency_s": LATENCY_S}}
    write_results(args.out, rows, meta)
    say(f"wrote {args.out}/results.md")
    bad = [r for r in rows if r.get("relative_difference", 0) > 1e-6]
    if bad:
        say("iteration times differ by more than 1e-6 on " + ", ".join(f"p={r['p']} m={r['m']}" for r in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
