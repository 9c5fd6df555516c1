#!/usr/bin/env python3
"""`pipegrid import` (tools/torch_import.py) against independent figures.

    torch_import_test.py PIPEGRID CASE     CASE: resnet50 | vgg16 | gpt | profile | errors

  resnet50, vgg16: torchvision's models import with their published parameter counts (25,557,032
      and 138,357,544: torchvision's model documentation), forward FLOPs within 2% of the zoo's
      (core/models/zoo.cc, built independently from the papers' shapes; `workload show --json`), and
      a 4-GPU pipeline of each simulates within 2% of the same pipeline of the zoo model;
  gpt: a GPT built from torch.nn layers (tests/tools/torch/models.py) imports with the parameters
      and forward FLOPs of the zoo's `gpt` with the same configuration (the zoo's closed form:
      12 h^2 + 13 h per block, V h + s h + 2 h; checked here by hand as well);
  profile: a small model's CPU-measured profile replays: one device, one micro-batch, so the
      iteration is the sum of the profile's forward and backward times (read from the file), and
      the custom layer (nn.Upsample) is listed in the report;
  errors: bad arguments (--kwargs, --threads, an input shape the model cannot run, an output that is
      an input or another output, a PIPEGRID_PYTHON that does not exist) are one-line errors, status 2.
Exit 77 (skipped) without PyTorch/torchvision."""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PIPEGRID, CASE = sys.argv[1], sys.argv[2]
PYTHON = os.environ.get("PIPEGRID_PYTHON", "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3")
os.environ["PIPEGRID_PYTHON"] = PYTHON
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += 0 if ok else 1


def need(module):
    if subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True).returncode != 0:
        print(f"skipped: {PYTHON} has no {module}")
        sys.exit(77)


def pipegrid(*args):
    r = subprocess.run([PIPEGRID, *args], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"pipegrid {' '.join(args)}: status {r.returncode}")
    return r


def show(what, *extra):
    return json.loads(pipegrid("workload", "show", what, "--json", *extra).stdout)


def simulate(tmp, workload, name):
    """Iteration time of a 4-GPU (A100) 1F1B pipeline, balanced stages, 4 micro-batches of 8."""
    exp = {"name": name, "workload": workload,
           "cluster": {"kind": "switch", "count": 4, "device": {"name": "gpu", "model": "a100", "memory": "80GiB"}, "bandwidth": "100GBps", "latency": "1us"},
           "strategy": {"partitioner": "balanced", "schedule": "1f1b", "micro_batch_size": 8, "micro_batches": 4}}
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        json.dump(exp, f)
    return json.loads(pipegrid("run", path, "--json").stdout)["iteration_time_s"]


def rel(a, b):
    return abs(a - b) / abs(b)


def refused(args, want, env=None):
    """`pipegrid import ARGS` exits 2 with exactly `want` on stderr (one line, no traceback)."""
    r = subprocess.run([PIPEGRID, "import", *args], capture_output=True, text=True,
                       env=dict(os.environ, **(env or {})))
    check(r.returncode == 2 and r.stderr == f"pipegrid import: {want}\n" and not r.stdout,
          f"import {' '.join(args)}: status {r.returncode}, {r.stderr.strip()!r}")


def run_errors(tmp):
    """Bad arguments: one line, status 2, and no output written over an input or another output (until
    2026-12-05 each gave a Python traceback with status 1, or overwrote the file)."""
    model = os.path.join(tmp, "m.py")
    text = "from torch import nn\nclass M(nn.Module):\n    def __init__(self, n=4):\n        super().__init__()\n" \
           "        self.l = nn.Linear(4, n)\n    def forward(self, x):\n        return self.l(x)\n"
    with open(model, "w") as f:
        f.write(text)
    base = ["--file", model, "--class", "M", "--input-shape", "4"]
    refused(base + ["--kwargs", "{bad"], "--kwargs: expected a JSON object like '{\"layers\": 4}', got '{bad' "
            "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))")
    refused(base + ["--kwargs", "[1,2]"], "--kwargs: expected a JSON object like '{\"layers\": 4}', got '[1,2]' (a list)")
    refused(base + ["--kwargs", '{"n": -1}'], f"{model}: M(**{{'n': -1}}): RuntimeError: Trying to create tensor "
            "with negative dimension -1: [-1, 4]")
    refused(["--torchvision", "resnet18", "--input-shape", "3,224,224", "--kwargs", '{"num_classes": -1}'],
            "--torchvision resnet18: resnet18(**{'num_classes': -1}): RuntimeError: Trying to create tensor with "
            "negative dimension -1: [-1, 512]")
    refused(["--torchvision", "resnet18", "--input-shape", "3,224"],
            "running resnet18 on an input of shape [2, 3, 224] (float) failed: RuntimeError: Given groups=1, weight "
            "of size [64, 3, 7, 7], expected input[1, 2, 3, 224] to have 3 channels, but got 2 channels instead")
    out = os.path.join(tmp, "out.yaml")
    refused(base + ["-o", out, "--profile", os.path.join(tmp, "p.yaml"), "--threads", "-1"],
            "--threads: expected 0 (torch's default) or a positive count, got -1")
    refused(base + ["-o", model], f"-o \"{model}\" is the --file model: an output must not overwrite an input")
    with open(model) as f:
        check(f.read() == text, "the --file model is unchanged")
    refused(base + ["-o", out, "--report", os.path.join(tmp, ".", "out.yaml")],
            f"-o \"{out}\" and --report \"{os.path.join(tmp, '.', 'out.yaml')}\" are the same file: each output "
            "needs its own")
    refused(base + ["-o", out, "--profile", out],
            f"-o \"{out}\" and --profile \"{out}\" are the same file: each output needs its own")
    check(not os.path.exists(out), "nothing written")
    # An interpreter chosen with PIPEGRID_PYTHON that does not exist is not replaced by another.
    r = subprocess.run([PIPEGRID, "import", *base], capture_output=True, text=True,
                       env=dict(os.environ, PIPEGRID_PYTHON="/nonexistent/python3"))
    check(r.returncode == 2 and 'PIPEGRID_PYTHON="/nonexistent/python3": it cannot be run' in r.stderr,
          f"PIPEGRID_PYTHON=/nonexistent/python3: status {r.returncode}, {r.stderr.strip()!r}")


with tempfile.TemporaryDirectory() as tmp:
    if CASE in ("resnet50", "vgg16"):
        need("torchvision")
        published = {"resnet50": 25_557_032, "vgg16": 138_357_544}[CASE]
        model = os.path.join(tmp, CASE + ".yaml")
        r = pipegrid("import", "--torchvision", CASE, "--input-shape", "3,224,224", "-o", model)
        check("no custom layers" in r.stderr, f"{CASE}: every operation maps to a layer kind ({r.stderr.strip()})")
        imported, zoo = show(model), show(CASE)
        check(imported["parameters"] == published, f"{CASE}: {imported['parameters']:,} parameters, published {published:,}")
        f_i, f_z = imported["forward_flops_per_sample"], zoo["forward_flops_per_sample"]
        check(rel(f_i, f_z) < 0.02, f"{CASE}: forward {f_i / 1e9:.4f} GFLOP, zoo {f_z / 1e9:.4f} ({100 * rel(f_i, f_z):.3f}%)")
        t_i = simulate(tmp, {"file": model}, CASE + "-imported")
        t_z = simulate(tmp, {"model": CASE}, CASE + "-zoo")
        check(rel(t_i, t_z) < 0.02, f"{CASE}: simulated {t_i * 1e3:.4f} ms, zoo {t_z * 1e3:.4f} ms ({100 * rel(t_i, t_z):.3f}%)")
    elif CASE == "gpt":
        need("torch")
        L, h, heads, s, V = 2, 64, 4, 32, 1000
        model = os.path.join(tmp, "gpt.yaml")
        pipegrid("import", "--file", os.path.join(HERE, "torch", "models.py"), "--class", "TinyGPT",
                 "--kwargs", json.dumps({"layers": L, "hidden": h, "heads": heads, "sequence": s, "vocabulary": V}),
                 "--input-shape", str(s), "-o", model)
        imported = show(model)
        zoo = show("gpt", *[x for k, v in {"layers": L, "hidden": h, "heads": heads, "sequence": s,
                                           "vocabulary": V}.items() for x in ("--arg", f"{k}={v}")])
        by_hand = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h
        check(imported["parameters"] == zoo["parameters"] == by_hand,
              f"gpt: {imported['parameters']:,} parameters, zoo {zoo['parameters']:,}, by hand {by_hand:,}")
        f_i, f_z = imported["forward_flops_per_sample"], zoo["forward_flops_per_sample"]
        check(rel(f_i, f_z) < 1e-9, f"gpt: forward {f_i:,.0f} FLOP per sample, zoo {f_z:,.0f}")
    elif CASE == "profile":
        need("torch")
        model, profile, report = (os.path.join(tmp, n) for n in ("small.yaml", "profile.yaml", "report.txt"))
        pipegrid("import", "--file", os.path.join(HERE, "torch", "models.py"), "--class", "SmallNet",
                 "--input-shape", "3,16,16", "-o", model, "--profile", profile, "--batch", "4", "--repeat", "3",
                 "--report", report)
        text = open(report).read()
        check(re.search(r"^  up: module .*Upsample$", text, re.M) is not None, "profile: nn.Upsample listed as a custom layer")
        check("custom" in open(model).read(), "profile: the custom layer is in the model file")
        prof = open(profile).read()
        check(re.search(r"^# device: cpu: .+", prof, re.M) and "# precision: fp32; batch: 4" in prof,
              "profile: the header names the device, precision and batch")
        us = [float(x) for x in re.findall(r'(?:forward|backward): "([0-9.]+)us"', prof)]
        check(len(us) == 2 * 8 and all(u > 0 for u in us), f"profile: 8 layers timed forward and backward ({len(us)} times)")
        exp = {"name": "profile", "workload": {"file": profile},
               "cluster": {"kind": "switch", "count": 1, "device": {"name": "cpu", "memory": "16GiB"},
                           "bandwidth": "10GBps", "latency": "1us"},
               "strategy": {"partitioner": "uniform", "schedule": "1f1b", "micro_batch_size": 4, "micro_batches": 1}}
        path = os.path.join(tmp, "exp.yaml")
        with open(path, "w") as f:
            json.dump(exp, f)
        t = json.loads(pipegrid("run", path, "--json").stdout)["iteration_time_s"]
        want = sum(us) * 1e-6
        check(rel(t, want) < 1e-9, f"profile: replayed iteration {t * 1e6:.3f} us = sum of the measured times {want * 1e6:.3f} us")
    elif CASE == "errors":
        need("torchvision")
        run_errors(tmp)
    else:
        raise SystemExit(f"unknown case {CASE}")
print(f"{CASE}: {failures} failures")
sys.exit(1 if failures else 0)
