#!/usr/bin/env python3
"""ctest docs/limits: docs/limits.md against the code (issue 55, item 17).

Usage: limits_doc_test.py PIPEGRID REPO_ROOT

  - every feature docs/limits.md lists as "Not modelled" has no key in the experiment parser and no
    name in `pipegrid list` (the keys each feature would bring are in FEATURES below; an item of the
    list without an entry there fails, so the list cannot grow unchecked);
  - no partitioner, schedule or planner of `pipegrid list --json` is named in that list, and each
    feature the page calls implemented is there (piper, the fp8 precisions, the MoE keys);
  - the validation's check-row median the page quotes is the README's (they disagreed: 20.1% and 8.8%).
"""
import glob
import json
import os
import re
import subprocess
import sys

# A "Not modelled" item (its first words) -> the strategy/memory keys or list names it would bring.
FEATURES = {
    "context parallelism": ["context_parallel", "context_parallel_size", "context_parallelism"],
    "offloading": ["offload", "cpu_offload", "offload_optimizer", "offload_activations"],
    "ZeRO stages 2 and 3": ["zero2", "zero3", "zero_stage"],
    "pipeline schedules beyond": ["bpipe", "chimera"],
    "asynchronous training": ["pipedream-2bw", "2bw", "async", "weight_stashing"],
}


def parser_keys(root):
    """Every key the input layer accepts: the string literals of its check_keys({...}) and
    with_common({...}) calls."""
    keys = set()
    for path in glob.glob(os.path.join(root, "tools", "input", "*.cc")):
        text = open(path, encoding="utf-8").read()
        for block in re.findall(r"(?:check_keys|with_common)\(\s*\{(.*?)\}", text, re.S):
            keys.update(re.findall(r'"([A-Za-z0-9_.-]+)"', block))
    return keys


def not_modelled(page):
    """The items of the "- Not modelled" bullet: {first words: text}."""
    m = re.search(r"^- Not modelled.*?\n((?:  .*\n)+)", page, re.M)
    if not m:
        return None
    items = re.findall(r"^  - (.*(?:\n    .*)*)", m.group(1), re.M)
    return {i.split("(")[0].strip().rstrip(";").strip(): i for i in items}


def main(pipegrid, root):
    failures = []
    page = open(os.path.join(root, "docs", "limits.md"), encoding="utf-8").read()
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    listing = json.loads(subprocess.run([pipegrid, "list", "--json"], capture_output=True, text=True,
                                        check=True).stdout)
    names = {s["name"] for sec in ("partitioners", "schedules", "planners") for s in listing[sec]}
    keys = parser_keys(root)
    if len(keys) < 50:
        failures.append(f"only {len(keys)} parser keys found: the check_keys pattern no longer matches")
    items = not_modelled(page)
    if not items:
        failures.append("docs/limits.md: no '- Not modelled' list")
        items = {}
    for head, text in items.items():
        feature = next((f for f in FEATURES if head.startswith(f)), None)
        if feature is None:
            failures.append(f"'{head}': listed as not modelled, but this test does not know its keys (add it)")
            continue
        for k in FEATURES[feature]:
            if k in keys or k in names:
                failures.append(f"'{feature}' is listed as not modelled, but '{k}' exists (update docs/limits.md)")
        for n in names:
            if re.search(rf"`{re.escape(n)}`", text):
                failures.append(f"'{n}' is in pipegrid list, but docs/limits.md lists it as not modelled")
    # What the page calls implemented is.
    if "piper" not in names:
        failures.append("docs/limits.md says planner piper is implemented; pipegrid list has none")
    for k in ("expert_parallel", "expert_tensor_parallel", "moe", "kernel_fusion", "attention"):
        if k not in keys:
            failures.append(f"docs/limits.md names key '{k}' as implemented; the parser has none")
    for p in ("fp8", "fp8-blockwise", "mxfp8"):
        r = subprocess.run([pipegrid, "workload", "show", "gpt", "--precision", p], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"docs/limits.md names precision {p}; `workload show gpt --precision {p}` fails")
    # One median for the check rows.
    med_readme = re.search(r"median (\d+\.\d+)% against a 10% target", readme)
    med_page = re.search(r"median (\d+\.\d+)% over (\d+) rows", page)
    if not med_readme or not med_page:
        failures.append("the check rows' median: not found in README.md or docs/limits.md")
    elif med_readme.group(1) != med_page.group(1):
        failures.append(f"check median: README {med_readme.group(1)}%, docs/limits.md {med_page.group(1)}%")
    for f in failures:
        print("FAIL", f)
    print(f"limits_doc_test: {len(items)} not-modelled items, {len(keys)} parser keys, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
