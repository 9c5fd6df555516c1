#!/usr/bin/env python3
"""ctest tools/experiments_self_contained: what the experiments and tests read is in the repository,
and the experiments run as their READMEs show (issue 30, item 2).

Usage: experiments_test.py REPO_ROOT

  - every experiments/*/run.py (and every other script a README runs directly) is committed with its
    run bit (`experiments/fpga-whatif/run.py` was not: "Permission denied" as its README ran it);
  - no experiment script, test or CMake file reads DAPPLE's or PipeDream's profiles from ../shared
    (they are in workloads/profiles/, each folder with its licence and SOURCE.md);
  - every profile file those folders hold is named in no other place than there (no stray copies),
    and each folder has its licence and source note;
  - `experiments/fpga-whatif/run.py --report-only` without databases exits non-zero and writes
    nothing (it used to exit 0 and overwrite the committed results and figures with empty ones).
"""
import glob
import os
import re
import subprocess
import sys
import tempfile


def main():
    root = os.path.abspath(sys.argv[1])
    failures = []
    # Run bits as git records them (a clone gets these modes, whatever this checkout has).
    modes = {}
    r = subprocess.run(["git", "-C", root, "ls-files", "-s", "experiments", "tools", "tests"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        for line in r.stdout.splitlines():
            mode, _, _, path = line.split(None, 3)
            modes[path] = mode
    scripts = sorted(glob.glob(os.path.join(root, "experiments", "*", "run.py")))
    for readme in glob.glob(os.path.join(root, "experiments", "*", "README.md")):
        for m in re.finditer(r"^\s*(experiments/[\w./-]+\.py)", open(readme, encoding="utf-8").read(), re.M):
            scripts.append(os.path.join(root, m.group(1)))
    for s in sorted(set(scripts)):
        rel = os.path.relpath(s, root)
        if not os.path.exists(s):
            failures.append(f"{rel}: named by a README, does not exist")
        elif modes.get(rel, "100755") != "100755" or not os.access(s, os.X_OK):
            failures.append(f"{rel}: not executable (its README runs it as a command)")
    # Nothing reads the profiles from ../shared.
    pattern = re.compile(r"shared/reference/(dapple|pipedream)|PIPEGRID_SHARED_DIR\)?\s*/\s*\"reference")
    for path in (glob.glob(os.path.join(root, "experiments", "**", "*.py"), recursive=True) +
                 glob.glob(os.path.join(root, "tests", "**", "*.cc"), recursive=True) +
                 glob.glob(os.path.join(root, "tests", "**", "*.py"), recursive=True) +
                 glob.glob(os.path.join(root, "tests", "**", "CMakeLists.txt"), recursive=True)):
        for number, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
            if pattern.search(line) and "experiments_test.py" not in path:
                failures.append(f"{os.path.relpath(path, root)}:{number}: reads ../shared: {line.strip()}")
    for folder, licence in (("dapple", "LICENSE.md"), ("pipedream", "LICENSE")):
        d = os.path.join(root, "workloads", "profiles", folder)
        for needed in (licence, "SOURCE.md"):
            if not os.path.exists(os.path.join(d, needed)):
                failures.append(f"workloads/profiles/{folder}/{needed}: missing")
        if len(glob.glob(os.path.join(d, "*.txt"))) < 10:
            failures.append(f"workloads/profiles/{folder}: fewer than 10 profiles")
    # --report-only without databases: refused, nothing written.
    script = os.path.join(root, "experiments", "fpga-whatif", "run.py")
    with tempfile.TemporaryDirectory(prefix="pipegrid-exp-") as out:
        env = dict(os.environ)
        out_dir = os.path.join(root, "experiments", "fpga-whatif", "out")
        if not (os.path.exists(os.path.join(out_dir, "ring.sqlite")) and
                os.path.exists(os.path.join(out_dir, "torus.sqlite"))):
            r = subprocess.run([sys.executable, script, "--report-only", "--out", out], capture_output=True,
                               text=True, env=env, timeout=120)
            if r.returncode == 0 or os.listdir(out):
                failures.append(f"fpga-whatif --report-only without databases: exit {r.returncode}, "
                                f"wrote {os.listdir(out)}")
    for f in failures:
        print(f)
    print(f"experiments: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
