#!/usr/bin/env python3
"""Checks measurements.yaml's DeepLearningExamples rows against their sources: each row's quoted
table line must occur in the README at the row's commit (whitespace and `*` aside), its value must
be a cell of that line, and the column the value sits in must name the row's precision. Run by hand
with a clone of NVIDIA/DeepLearningExamples (the rows of other sources are listed as not checked;
tests/tools/audit_quotes_test.py runs it on a hand-made source, no clone needed):

  experiments/validation/audit_quotes.py --dle PATH/TO/DeepLearningExamples [--measurements FILE]

Exit status 0 when every checked row passes, 1 when one fails, 2 on bad arguments.
"""
import argparse
import re
import shutil
import subprocess
import sys

import vlib

DLE = "NVIDIA/DeepLearningExamples"
# The words a column header uses for each precision (DLE's tables: "Throughput - mixed precision",
# "Throughput - TF32 + XLA", "Throughput - FP32(sequences/sec)", ...).
PRECISION_WORDS = {"amp": ("mixed precision", "fp16", "amp"), "tf32": ("tf32",), "fp32": ("fp32",)}


def norm(s):
    return re.sub(r"\s+", " ", s.replace("*", "")).strip()


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell):
    m = re.match(r"[0-9][0-9,]*(\.[0-9]+)?", cell)
    return float(m.group(0).replace(",", "")) if m else None


def header_of(lines, i, width):
    """The nearest line above table line i that starts a table (its header): the first line of the
    run of `|` lines containing i whose cell count is `width`."""
    j = i
    while j > 0 and lines[j - 1].lstrip().startswith("|"):
        j -= 1
    for k in range(j, i):
        if len(cells(lines[k])) == width and not re.fullmatch(r"[-:| ]+", lines[k].strip()):
            return cells(lines[k])
    return None


def audit(row, show):
    """(ok, message) for one row."""
    m = re.match(r"https://github.com/([^/]+/[^/]+)/blob/([0-9a-f]+)/(.+)", row.get("url", ""))
    if not m or m.group(1) != DLE:
        return None, "not a DeepLearningExamples row: not checked"
    text = show(m.group(2), m.group(3))
    if text is None:
        return False, f"{m.group(3)} not found at {m.group(2)[:10]}"
    lines = text.splitlines()
    flat = [norm(x) for x in lines]
    tables = [norm(p) for p in row["quote"].split("...") if "|" in p]
    if not tables:
        return False, "the quote has no table line"
    found = None
    for t in tables:
        t = t[t.index("|"):]
        hits = [k for k, x in enumerate(flat) if t in x]
        if not hits:
            return False, f"quoted line not in the source: {t[:80]}"
        found = hits[0]
    line = lines[found]
    value = float(row["value"])
    cols = [k for k, c in enumerate(cells(line)) if number(c) is not None and abs(number(c) - value) < 1e-9]
    if not cols:
        return False, f"value {row['value']} is not a cell of the quoted line"
    header = header_of(lines, found, len(cells(line)))
    if header is None:
        return False, "no header with the line's column count above it"
    words = PRECISION_WORDS.get(row["precision"], (row["precision"],))
    names = [header[k] for k in cols]
    if not any(any(w in n.lower() for w in words) for n in names):
        return False, f"value's column {names} does not name {row['precision']}"
    return True, f"column {names[0]!r}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dle", required=True, help="a git clone of NVIDIA/DeepLearningExamples")
    p.add_argument("--measurements", default=vlib.MEASUREMENTS)
    args = p.parse_args()
    cache = {}

    def show(commit, path):
        if (commit, path) not in cache:
            r = subprocess.run(["git", "-C", args.dle, "show", f"{commit}:{path}"], capture_output=True, text=True)
            cache[(commit, path)] = r.stdout if r.returncode == 0 else None
        return cache[(commit, path)]

    if shutil.which("git") is None:
        print("audit_quotes.py: git is not installed (it reads --dle with git show)", file=sys.stderr)
        return 2
    if subprocess.run(["git", "-C", args.dle, "rev-parse"], capture_output=True).returncode != 0:
        print(f"audit_quotes.py: --dle {args.dle}: not a git clone", file=sys.stderr)
        return 2
    checked = failed = 0
    for row in vlib.load_yaml(args.measurements):
        ok, msg = audit(row, show)
        print(f"{'ok  ' if ok else '-   ' if ok is None else 'FAIL'} {row['id']}: {msg}")
        checked += ok is not None
        failed += ok is False
    print(f"{checked} rows checked, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
