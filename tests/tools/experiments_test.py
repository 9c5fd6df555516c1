#!/usr/bin/env python3
"""ctest tools/experiments_self_contained: what the experiments and tests read is in the repository,
and the experiments run as their READMEs show (issue 30, item 2).

Usage: experiments_test.py REPO_ROOT

  - every experiments/*/run.py (and every other script a README runs directly) is committed with its
    run bit (`experiments/fpga-whatif/run.py` was not: "Permission denied" as its README ran it);
  - no experiment script, test or CMake file reads DAPPLE's or PipeDream's profiles from ../shared
    (they are in workloads/profiles/, each folder with its licence and SOURCE.md);
  - no CMake file, C++ test or fuzz script needs ../shared (PIPEGRID_SHARED_DIR) either: the project
    needs nothing beside the clone, and from a plain tree (no .git, no git) the run bits are checked
    on the files alone;
  - every experiments/*/run.py that takes --out creates the folder (the collage script did not);
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


def git_modes(root):
    """{path: mode} as git records them, or {} (with a note) where root is no git work tree or git is
    not installed."""
    try:
        r = subprocess.run(["git", "-C", root, "ls-files", "-s", "experiments", "tools", "tests"],
                           capture_output=True, text=True)
    except OSError:
        r = None
    if r is None or r.returncode != 0 or not r.stdout:
        print("note: not a git work tree (or no git): run bits checked on the files only")
        return {}
    modes = {}
    for line in r.stdout.splitlines():
        mode, _, _, path = line.split(None, 3)
        modes[path] = mode
    return modes


def main():
    root = os.path.abspath(sys.argv[1])
    failures = []
    # Run bits as git records them (a clone gets these modes, whatever this checkout has); from a plain
    # tree (a release tarball, or no git installed) the files' own modes alone are checked.
    modes = git_modes(root)
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
    # Nothing beside the clone at all (issue 55, item 15): no build or test file names ../shared.
    beside = re.compile(r"PIPEGRID_SHARED_DIR|\.\./shared")
    for path in ([os.path.join(root, "CMakeLists.txt")] +
                 glob.glob(os.path.join(root, "*", "**", "CMakeLists.txt"), recursive=True) +
                 glob.glob(os.path.join(root, "tests", "**", "*.cc"), recursive=True) +
                 glob.glob(os.path.join(root, "tests", "fuzz", "*.py")) + [os.path.join(root, "tools", "fuzz")]):
        if "/build" in os.path.relpath(path, root) or not os.path.isfile(path):
            continue
        for number, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
            if beside.search(line):
                failures.append(f"{os.path.relpath(path, root)}:{number}: needs ../shared: {line.strip()}")
    # Every experiment that takes --out creates the folder (collage's wrote into a missing one).
    for s in sorted(glob.glob(os.path.join(root, "experiments", "*", "run.py"))):
        text = open(s, encoding="utf-8").read()
        if '"--out"' in text and "makedirs(" not in text:
            failures.append(f"{os.path.relpath(s, root)}: takes --out but never creates the folder")
    for folder, licence in (("dapple", "LICENSE.md"), ("pipedream", "LICENSE")):
        d = os.path.join(root, "workloads", "profiles", folder)
        for needed in (licence, "SOURCE.md"):
            if not os.path.exists(os.path.join(d, needed)):
                failures.append(f"workloads/profiles/{folder}/{needed}: missing")
        if len(glob.glob(os.path.join(d, "*.txt"))) < 10:
            failures.append(f"workloads/profiles/{folder}: fewer than 10 profiles")
    # --report-only without databases (they live in --out's out/, empty here): refused, nothing written.
    script = os.path.join(root, "experiments", "fpga-whatif", "run.py")
    with tempfile.TemporaryDirectory(prefix="pipegrid-exp-") as out:
        env = dict(os.environ)
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
