#!/usr/bin/env python3
"""ctest: the validation suite (experiments/validation/run.py) runs every row of
measurements.yaml through pipegrid and reports them all: no row fails to map or to run, and the
summary counts every check and calibration row. Its accuracy target is reported by run.py's own
exit status and results.md (see the README), not asserted here."""
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # a python without PyYAML on PATH: Debian's python3 has it (tools/setup)
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pipegrid = sys.argv[1]
rows = yaml.safe_load(open(os.path.join(root, "experiments/validation/measurements.yaml")))
sets = {s: sum(1 for r in rows if r["set"] == s) for s in ("check", "calibration")}
with tempfile.TemporaryDirectory() as out:
    p = subprocess.run([sys.executable, os.path.join(root, "experiments/validation/run.py"), "--pipegrid",
                        pipegrid, "--out", out], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.exit(f"run.py failed ({p.returncode}):\n{p.stderr}")
    text = open(os.path.join(out, "results.md")).read()
    for s, n in sets.items():
        m = re.search(rf"^- {s} rows: (\d+), median", text, re.M)
        if not m or int(m.group(1)) != n:
            sys.exit(f"results.md does not report all {n} {s} rows:\n{text[-2000:]}")
    if re.search(r"more could not run|: pipegrid could not run", text):
        sys.exit("some rows could not run:\n" + text[-2000:])
    for f in ("figure.png", "figure.svg"):
        if os.path.getsize(os.path.join(out, f)) == 0:
            sys.exit(f"{f} is empty")
print(f"validation suite: {len(rows)} rows ran ({sets['check']} check, {sets['calibration']} calibration)")
