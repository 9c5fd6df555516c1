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
    # The data-consistency report (consistency.py, measurements only): ResNet-50 on one V100 in fp32
    # is published at 289 (PipeDream's profile), 367, 384 and 412 img/s, so its spread is 412 / 289 =
    # 1.426 and the floor (F - 1) / (F + 1) = 0.426 / 2.426 = 17.5%; BERT-Large SQuAD (61.5 seq/s x 384
    # tokens) against pre-training at 128 (317 seq/s x 128) on one A100 in tf32: rate ratio
    # 40,576 / 23,616 = 1.72, work ratio (24 + 4 x 384 / 1024) / (24 + 4 x 128 / 1024) = 1.041.
    p = subprocess.run([sys.executable, os.path.join(root, "experiments/validation/consistency.py"), "--out", out],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"consistency.py failed ({p.returncode}):\n{p.stderr}")
    text = open(os.path.join(out, "consistency.md")).read()
    for want in ("| resnet50 | v100 x 1 | fp32 | 289 samples/s", "| 1.43 | 18% |",
                 "| dle-pyt-bertl-pretrain-s128-a100-tf32-1gpu (calibration) | dle-pyt-bertl-squad-s384-a100-tf32-1gpu (check) | 1.72 | 1.041 |"):
        if want not in text:
            sys.exit(f"consistency.md lacks {want!r}:\n{text}")
print(f"validation suite: {len(rows)} rows ran ({sets['check']} check, {sets['calibration']} calibration)")
