#!/usr/bin/env python3
"""ctest tools/readme_tour: the README's front door holds (issue 30, item 8).

Usage: readme_test.py PIPEGRID REPO_ROOT

Checks, against the files themselves (no output of pipegrid is taken on trust):
  - README.md is under 300 lines and opens with the two set-up commands, verbatim, before any prose;
  - every ```console block of README.md runs: each `$ pipegrid ...` line is run (from a scratch folder
    that sees the repository's experiments/, workloads/ and topologies/), exits 0, and every output
    line shown under it (but `...`) appears, whole, in what it printed;
  - every relative link of README.md and docs/*.md names a file that exists (and a `#anchor` into a
    Markdown file names one of its headings);
  - no typed count of tests in README.md or docs/install.md (`ctest -N` prints it; such counts drifted);
  - docs/cost-model.md's table of calibrated efficiencies and start-ups equals topologies/devices.yaml
    (it drifted once: every refit changes both).
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

TWO_COMMANDS = [
    "tools/setup && build/pipegrid run                                  # set up, build, simulate the built-in example",
    "tools/setup --all && ctest --test-dir build --output-on-failure -j2  # set up, build everything, run every test",
]


def console_blocks(text):
    """(line, [(command, [expected lines])]) of every ```console block."""
    out, inside, start, cmds = [], False, 0, []
    for number, line in enumerate(text.split("\n"), 1):
        s = line.rstrip()
        if not inside and s == "```console":
            inside, start, cmds = True, number, []
        elif inside and s == "```":
            out.append((start, cmds))
            inside = False
        elif inside and s.startswith("$ "):
            cmds.append((s[2:], []))
        elif inside and cmds and s != "...":
            cmds[-1][1].append(s)
    return out


def anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    result = set()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"#+ (.*)", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            result.add(a)
    return result


def calibrated_table(root):
    """docs/cost-model.md's rows `| device | precision | gemm | conv | attention | recurrent | start-up
    | calibrated ... |` against topologies/devices.yaml (3 decimals; start-up in us)."""
    import yaml
    catalog = yaml.safe_load(open(os.path.join(root, "topologies", "devices.yaml"), encoding="utf-8"))
    doc = os.path.join("docs", "cost-model.md")
    out, seen = [], 0
    for number, line in enumerate(open(os.path.join(root, doc), encoding="utf-8"), 1):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) != 8 or not c[7].startswith("calibrated") or c[0] not in catalog:
            continue
        seen += 1
        d = catalog[c[0]]
        precision = {"fp16 / amp": "fp16", "tf32": "tf32", "fp32 (and tf32)": "fp32"}.get(c[1], c[1])
        table = (d.get("compute_efficiency") or {}).get(precision, {})
        for column, cls in zip(c[2:6], ("gemm", "conv", "attention", "recurrent")):
            if column != f"{table.get(cls, -1):.3f}":
                out.append(f"{doc}:{number}: {c[0]} {precision} {cls} is {column}, topologies/devices.yaml "
                           f"says {table.get(cls)}")
        startup = str(d.get("kernel_startup", ""))
        if c[6] != startup:
            out.append(f"{doc}:{number}: {c[0]} start-up is {c[6]}, topologies/devices.yaml says {startup}")
    if seen < 4:
        out.append(f"{doc}: {seen} calibrated rows found in its efficiency table (expected 4)")
    return out


def main():
    pipegrid, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    failures = []
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    lines = readme.split("\n")
    if len(lines) >= 300:
        failures.append(f"README.md: {len(lines)} lines, the front door must stay under 300 (move the rest to docs/)")
    if lines[2:6] != ["```sh"] + TWO_COMMANDS + ["```"]:
        failures.append("README.md: lines 3-6 must be the two set-up commands, verbatim, in a ```sh block")

    with tempfile.TemporaryDirectory(prefix="pipegrid-readme-") as scratch:
        for d in ("experiments", "workloads", "topologies"):
            os.symlink(os.path.join(root, d), os.path.join(scratch, d))
        bindir = os.path.join(scratch, "bin")
        os.mkdir(bindir)
        os.symlink(pipegrid, os.path.join(bindir, "pipegrid"))
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        ran = 0
        for start, cmds in console_blocks(readme):
            for cmd, expected in cmds:
                if not cmd.startswith("pipegrid"):
                    failures.append(f"README.md:{start}: `{cmd}`: tour commands start with pipegrid")
                    continue
                r = subprocess.run(shlex.split(cmd), cwd=scratch, env=env, capture_output=True, text=True,
                                   timeout=300)
                ran += 1
                got = {l.rstrip() for l in (r.stdout + r.stderr).split("\n")}
                if r.returncode != 0:
                    failures.append(f"README.md:{start}: `{cmd}` exited {r.returncode}: {r.stderr.strip()}")
                for e in expected:
                    if e not in got:
                        failures.append(f"README.md:{start}: `{cmd}` did not print the line shown:\n    {e}")
        if ran < 4:
            failures.append(f"README.md: only {ran} tour commands found (expected at least 4)")

    for doc in ["README.md"] + sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
        path = os.path.join(root, doc)
        text = open(path, encoding="utf-8").read()
        rel = os.path.relpath(path, root)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            line = text.count("\n", 0, m.start()) + 1
            if not os.path.exists(full):
                failures.append(f"{rel}:{line}: link to {target}: no such file")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                failures.append(f"{rel}:{line}: link to {target}: no heading with that anchor")
    for doc in ("README.md", "docs/install.md"):
        text = open(os.path.join(root, doc), encoding="utf-8").read()
        for m in re.finditer(r"\b\d[\d,]* tests\b", text):
            failures.append(f"{doc}:{text.count(chr(10), 0, m.start()) + 1}: a typed test count "
                            f"(\"{m.group(0)}\"): say `ctest --test-dir build -N` instead")
    failures += calibrated_table(root)
    for f in failures:
        print(f)
    print(f"readme: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
