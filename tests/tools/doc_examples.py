#!/usr/bin/env python3
"""ctest tools/doc_examples: every fenced ```yaml block of the documentation runs.

Usage: doc_examples.py PIPEGRID REPO_ROOT

The convention (docs/testing.md, "Documentation"):
  - a block whose first line is `# fragment` is a deliberately partial snippet: skipped;
  - a block with a top-level `workload:` is an experiment: `pipegrid run -` from the repository
    root (its paths resolve against the root);
  - a block with a top-level `layers:` list is a model file: `pipegrid workload show FILE`;
  - a block with a top-level `devices:` or `kind:` is a cluster file: `pipegrid cluster show FILE`;
  - a block with a top-level `jobs:` is a jobs file: `pipegrid jobs FILE`, from a scratch folder (so
    its jobs are written inline, with workload and strategy, not as experiment files);
  - anything else is an error (mark it `# fragment` if it is meant to be partial).
A failure names the file and the line of the block's opening fence, and pipegrid's message.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

import yaml

DOCS = ["README.md", "docs/*.md", "workloads/README.md", "topologies/README.md", "experiments/*/README.md"]


def blocks(path):
    """(line of the opening fence, text) of every ```yaml block of a Markdown file."""
    out, inside, start, lines = [], False, 0, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if not inside and stripped == "```yaml":
                inside, start, lines = True, number, []
            elif inside and stripped == "```":
                out.append((start, "".join(lines)))
                inside = False
            elif inside:
                lines.append(line)
    return out


def command(pipegrid, text, scratch):
    """The pipegrid command that checks a block, its standard input, or an error message."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return None, None, f"not valid YAML: {e}"
    if not isinstance(doc, dict):
        return None, None, "not a mapping (mark partial snippets with `# fragment` on their first line)"
    if "workload" in doc:
        return [pipegrid, "run", "-"], text, None
    if "jobs" in doc:
        path = os.path.join(scratch, "jobs.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return [pipegrid, "jobs", path], None, None
    path = os.path.join(scratch, "block.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    if isinstance(doc.get("layers"), list):
        return [pipegrid, "workload", "show", path], None, None
    if "devices" in doc or "kind" in doc:
        return [pipegrid, "cluster", "show", path], None, None
    return None, None, ("neither an experiment (workload:), a model file (layers:) nor a cluster file "
                        "(devices: or kind:); mark partial snippets with `# fragment` on their first line")


def main():
    pipegrid, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    failures, checked, skipped = [], 0, 0
    with tempfile.TemporaryDirectory(prefix="pipegrid-docs-") as scratch:
        for pattern in DOCS:
            for doc in sorted(glob.glob(os.path.join(root, pattern))):
                rel = os.path.relpath(doc, root)
                for line, text in blocks(doc):
                    if text.lstrip().startswith("# fragment"):
                        skipped += 1
                        continue
                    argv, stdin, error = command(pipegrid, text, scratch)
                    if argv:
                        r = subprocess.run(argv, input=stdin, cwd=root, capture_output=True, text=True)
                        if r.returncode != 0:
                            # pipegrid's file:line:column inside the block, as a place in the document
                            message = re.sub(r"(<stdin>|" + re.escape(os.path.join(scratch, "block.yaml")) + "|" +
                                             re.escape(os.path.join(scratch, "jobs.yaml")) + r"):(\d+):",
                                             lambda m: f"{rel}:{line + int(m.group(2))}:", r.stderr.strip())
                            error = f"`{' '.join(['pipegrid'] + argv[1:3])}` exit status {r.returncode}: {message}"
                    checked += 1
                    if error:
                        failures.append(f"{rel}:{line}: {error}")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"{checked} yaml blocks checked, {skipped} fragments skipped, {len(failures)} broken")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
