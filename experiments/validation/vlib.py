"""Shared by run.py and calibrate.py: read the measurements, write the pipegrid experiment that
reproduces each row, run pipegrid (in parallel, cached by the file's contents) and convert its
throughput to the row's metric. See README.md in this folder for the rules."""
import concurrent.futures
import functools
import hashlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_PIPEGRID = os.path.join(ROOT, "build", "pipegrid")
MEASUREMENTS = os.path.join(HERE, "measurements.yaml")
SETS = ("calibration", "check")
PRECISIONS = ("fp32", "tf32", "amp", "fp16", "bf16", "amp-bf16")
METRICS = ("samples_per_s", "tokens_per_s", "tflops_per_gpu")
REQUIRED = ("id", "source", "url", "model", "gpu", "gpus", "precision", "batch_per_gpu", "metric", "value", "set")

MEGATRON_RUN = os.path.join(ROOT, "experiments", "megatron", "run.py")
# Megatron-LM's published multi-GPU runs (experiments/megatron/rows.yaml), in this suite as rows of
# model `megatron-gpt`: calibration and check as rows.yaml assigns them (fixed before any run).
MEGATRON_METRICS = {"tflops_per_gpu": "megatron_tflops_per_gpu", "iteration_s": "iteration_s",
                    "time_ms": "layer_ms"}

# Kernel classes a zoo model exercises (its compute-bound work), for calibration.
MODEL_CLASSES = {
    "resnet50": ("conv", "gemm"), "vgg16": ("conv", "gemm"),
    # The attention core's efficiency is fitted as one with gemm (device_spec). Fitted on its own
    # (the rows' sequence lengths tell it apart) it lowers the calibration error but predicts a
    # source left out worse (README.md, "Fitting it on its own was tried").
    "bert-large": ("gemm",), "gpt": ("gemm",), "gpt3-175b": ("gemm",), "megatron-gpt": ("gemm",),
    # GNMT's LSTMs run their per-time-step recurrent GEMMs as GEMMs (core/models/builder.cc, lstm):
    # no recurrent efficiency of their own since issue 29 (it had absorbed the per-step costs).
    "gnmt8": ("gemm",), "gnmt16": ("gemm",),
}
# The optimizer each model's published training runs use (a row's `optimizer` key overrides):
# the image models SGD with momentum, the Transformers Adam or LAMB (the same state: two tensors),
# GNMT Adam.
MODEL_OPTIMIZER = {"resnet50": "momentum", "vgg16": "momentum", "bert-large": "adam", "gpt": "adam",
                   "gpt3-175b": "adam", "gnmt8": "adam", "gnmt16": "adam"}
# Zoo defaults of the parameters the metric rules use (core/models/zoo.cc).
ZOO_DEFAULTS = {"bert-large": {"sequence": 512}, "gpt": {"sequence": 1024}, "gpt3-175b": {"sequence": 2048},
                "gnmt8": {"source_length": 25, "target_length": 25},
                "gnmt16": {"source_length": 25, "target_length": 25}}

# Systems: how the row's machine is built. A DGX is the `dgx` generator (one NVSwitch per node,
# one InfiniBand NIC per GPU); the A100 and H100 figures are those of the presets dgx-a100-16/-4 and
# dgx-h100-32-switch (written out as generators because presets take no device overrides: the row's
# memory size and the calibrated efficiencies go into the device). DGX-1 (V100, hybrid cube-mesh
# NVLink: 6 links of 25 GB/s per GPU) is approximated by a switch at the GPU's 150 GB/s per
# direction, DGX-2 (NVSwitch, 16 GPUs) likewise; V100 systems get EDR (100 Gb/s) per GPU.
SYSTEMS = {
    "DGX-1": {"gpu": "v100", "gpus_per_node": 8, "nvlink": "150GBps", "infiniband": "100Gbps",
              "like": "dgx generator (no preset: DGX-1's cube mesh as a 150 GB/s switch)"},
    "DGX-2": {"gpu": "v100", "gpus_per_node": 16, "nvlink": "150GBps", "infiniband": "100Gbps",
              "like": "dgx generator (no preset)"},
    "DGX A100": {"gpu": "a100", "gpus_per_node": 8, "nvlink": "300GBps", "infiniband": "200Gbps",
                 "like": "preset dgx-a100-16/-4 (same generator and figures)"},
    "DGX H100": {"gpu": "h100", "gpus_per_node": 8, "nvlink": "450GBps", "infiniband": "400Gbps",
                 "like": "preset dgx-h100-32-switch (same generator and figures)"},
}
# A row's (gpu, gpu_memory) -> the catalog entry of that part, where the memory size is a different
# part with its own bandwidth (topologies/devices.yaml: A100 SXM4 40 GB 1,555 GB/s, 80 GB 2,039 GB/s).
# The row's `gpu` (the chip) still keys the calibration: both parts share the chip's efficiencies.
PARTS = {("a100", "40GB"): "a100-40gb", ("a100", "80GB"): "a100-80gb"}
NVLINK = {"v100": "150GBps", "a100": "300GBps", "h100": "450GBps"}  # per GPU and direction (hardware.md)
INFINIBAND = {"v100": "100Gbps", "a100": "200Gbps", "h100": "400Gbps"}  # one NIC per GPU (hardware.md)


def add_common_args(p, out_what):
    """The options run.py and calibrate.py share."""
    p.add_argument("--out", default=HERE, help=f"folder for {out_what} (default: this script's)")
    p.add_argument("--pipegrid", default=DEFAULT_PIPEGRID, help="the pipegrid binary (default: build/pipegrid)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="pipegrid processes in parallel (default 2)")
    p.add_argument("--measurements", default=MEASUREMENTS, help="the measurements (default: measurements.yaml here)")


def calibrated(path):
    """efficiency_of(row) for predict() from a calibration.yaml: the fitted entries of the row's
    device and math precision (tf32 rows set the fp32 entries alike), or None without one."""
    fitted = load_yaml(path) or {}
    table = fitted.get("compute_efficiency", {})
    per_device = {k: fitted.get(k, {}) for k in ("kernel_startup_us", "kernel_dispatch_us",
                                                   "kernel_startup_compute_us", "layer_overhead_us")}

    def efficiency_of(row):
        e = dict(table.get(row["gpu"], {}).get(math_precision(row["precision"])) or {})
        for key, values in per_device.items():
            if row["gpu"] in values:
                e[key] = values[row["gpu"]]
        return e or None
    return efficiency_of


# pipegrid's kernel classes (core/workload.h): compute-bound ones, and memory-bound ones.
COMPUTE_CLASSES = ("gemm", "conv", "attention", "recurrent", "grouped-gemm")
MEMORY_CLASSES = ("gather", "elementwise", "norm")


class MappingError(Exception):
    """A row pipegrid cannot reproduce: reported as an error row."""


def load_yaml(path):
    import yaml
    with open(path) as f:
        return yaml.safe_load(f)


def load_rows(path, which="all"):
    """The measurement rows (a YAML list), checked; `which`: calibration | check | all."""
    if not os.path.exists(path):
        raise SystemExit(f"no measurements: {path} (pass --measurements FILE)")
    rows = load_yaml(path) or []
    if not isinstance(rows, list):
        raise SystemExit(f"{path}: expected a YAML list of measurements")
    seen = set()
    for i, r in enumerate(rows):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise SystemExit(f"{path}: row {i + 1} ({r.get('id', '?')}) lacks {', '.join(missing)}")
        if r["id"] in seen:
            raise SystemExit(f"{path}: duplicate id {r['id']}")
        seen.add(r["id"])
    if which != "all":
        rows = [r for r in rows if r["set"] == which]
    return rows


@functools.lru_cache(maxsize=None)
def megatron_module():
    """experiments/megatron/run.py as a module (its rows, experiments and FLOP formula), loaded once."""
    spec = importlib.util.spec_from_file_location("megatron_run", MEGATRON_RUN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_megatron_rows(which="all", max_gpus=4096):
    """Megatron-LM's rows (experiments/megatron/rows.yaml) on at most max_gpus GPUs, as suite rows:
    gpu a100 (80 GB, Selene), precision amp (fp16), the published metric (Table 1's TFLOP/s per GPU by
    its formula, or Table 5's iteration time), the row itself under `megatron`."""
    out = []
    for r in megatron_module().rows():
        if r["gpus"] > max_gpus or (which != "all" and r["set"] != which):
            continue
        metric = "tflops_per_gpu" if "tflops_per_gpu" in r else "time_ms" if "time_ms" in r else "iteration_s"
        out.append({"id": "megatron-" + r["id"], "source": r["source"].split(",")[0] + " (" +
                    r["source"].split("(")[-1].split(")")[0] + ")",
                    "url": "https://arxiv.org/abs/" + r["source"].split("arXiv ")[1].split(")")[0],
                    "model": "megatron-gpt", "gpu": "a100", "gpus": r["gpus"], "precision": "amp",
                    "batch_per_gpu": "-", "metric": MEGATRON_METRICS[metric], "value": r[metric],
                    "set": r["set"], "megatron": r,
                    # the third batch of rows added to the suite; Table 2 of 2104.04473 the fourth
                    "batch": 4 if r["table"] == "narayanan2021_table2" else 3,
                    "model_params": {"layers": r.get("layers", 1), "hidden": r["hidden"], "heads": r["heads"],
                                     "t": r["t"], "p": r["p"]}})
    return out


# ------------------------------------------------------------------------------------- pipegrid

class Pipegrid:
    """Runs `pipegrid run FILE --json`, caching the answers (in memory) by the file's contents."""

    def __init__(self, path, jobs=2):
        self.path = os.path.abspath(path)
        self.jobs = jobs
        self.cache = {}
        self.lock = threading.Lock()
        self.tmp = tempfile.TemporaryDirectory(prefix="pipegrid-validation-")
        self.runs = 0
        self._class_efficiency = None

    def _wait_for_binary(self):
        # The binary may be rebuilt under us: wait for it to come back (up to 10 minutes).
        for _ in range(600):
            if os.path.exists(self.path):
                return
            time.sleep(1)
        raise SystemExit(f"pipegrid is not there: {self.path} (build it, or pass --pipegrid)")

    def _exec(self, args):
        for attempt in range(30):
            self._wait_for_binary()
            try:
                return subprocess.run([self.path] + args, capture_output=True, text=True, timeout=900)
            except (FileNotFoundError, PermissionError, OSError):
                time.sleep(2)  # replaced between the check and the exec ("text file busy")
        raise SystemExit(f"cannot run {self.path}")

    def run(self, experiment):
        """pipegrid's JSON for the experiment (a dict), or {"error": message}."""
        text = json.dumps(experiment, indent=1, sort_keys=True) + "\n"
        key = hashlib.sha256(text.encode()).hexdigest()
        with self.lock:
            if key in self.cache:
                return self.cache[key]
        path = os.path.join(self.tmp.name, key[:16] + ".yaml")
        with open(path, "w") as f:
            f.write(text)  # JSON is YAML
        p = self._exec(["run", path, "--json"])
        if p.returncode != 0:
            out = {"error": (p.stderr.strip() or p.stdout.strip()).replace(path + ":", "").strip()}
        else:
            out = json.loads(p.stdout)
        with self.lock:
            self.cache[key] = out
            self.runs += 1
        return out

    def run_all(self, experiments, progress=None):
        """experiments: list of (key, dict or MappingError). Returns {key: result}; calls
        progress(key, result) as each finishes."""
        out = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = {}
            for k, e in experiments:
                if isinstance(e, MappingError):
                    out[k] = {"error": str(e)}
                    if progress:
                        progress(k, out[k])
                else:
                    futures[pool.submit(self.run, e)] = k
            for f in concurrent.futures.as_completed(futures):
                k = futures[f]
                out[k] = f.result()
                if progress:
                    progress(k, out[k])
        return out

    def device(self, name):
        """`pipegrid device show NAME --json` (the catalog entry), or {}."""
        p = self._exec(["device", "show", name, "--json"])
        return json.loads(p.stdout) if p.returncode == 0 else {}

    def class_efficiency(self):
        """Whether a device takes `compute_efficiency: {precision: {class: x}}`."""
        if self._class_efficiency is None:
            e = {"workload": {"kind": "chain", "layers": 1, "forward": "1ms", "backward": "2ms",
                              "activation": "1MiB", "parameters": "1MiB"},
                 "cluster": {"kind": "switch", "count": 1, "bandwidth": "1GBps", "latency": "1us",
                             "device": {"name": "gpu", "model": "v100",
                                        "compute_efficiency": {"fp16": {"gemm": 0.5}}}},
                 "strategy": {"partitioner": "dp", "micro_batches": 1}}
            self._class_efficiency = "error" not in self.run(e)
        return self._class_efficiency


# ------------------------------------------------------------------------------ row -> experiment

def math_precision(precision):
    """The arithmetic format a precision's math runs in, which pipegrid's per-precision device
    figures (peak, compute_efficiency) are keyed by: amp -> fp16, amp-bf16 -> bf16."""
    return {"amp": "fp16", "amp-bf16": "bf16"}.get(precision, precision)


def memory_section(row):
    """The optimizer by model (a row's `optimizer` overrides; with amp/amp-bf16 pipegrid adds the
    fp32 master weights and fp32 state itself) and a row's `recompute`."""
    optimizer = row.get("optimizer") or MODEL_OPTIMIZER.get(row["model"], "adam")
    if optimizer not in ("sgd", "momentum", "adam"):
        raise MappingError(f"optimizer {optimizer!r}: expected sgd, momentum or adam")
    m = {"optimizer": optimizer}
    if row.get("optimizer_kernels"):  # fused (default) | unfused: how the step runs (core/device.h)
        if row["optimizer_kernels"] not in ("fused", "unfused"):
            raise MappingError(f"optimizer_kernels {row['optimizer_kernels']!r}: expected fused or unfused")
        m["optimizer_kernels"] = row["optimizer_kernels"]
    if row.get("optimizer_passes"):  # an unfused loop's passes, counted from the row's script (notes)
        if row.get("optimizer_kernels") != "unfused":
            raise MappingError("optimizer_passes needs optimizer_kernels: unfused")
        m["optimizer_passes"] = int(row["optimizer_passes"])
    if row.get("recompute"):  # activation checkpointing, when a row says so: none | full | selective
        m["recompute"] = row["recompute"]
    return m


def device_spec(row, efficiency=None):
    """The row's GPU as a catalog entry with overrides: its memory size and, for calibration,
    efficiencies ({class: value}, or {"all": value} for a pipegrid without per-class efficiency)."""
    memory = str(row.get("gpu_memory") or "").replace(" ", "")
    part = PARTS.get((row["gpu"], memory))
    d = {"model": part or row["gpu"]}
    if not part and re.fullmatch(r"[0-9.]+[KMGT]i?B", memory):  # else (e.g. "unknown") the catalog's
        d["memory"] = memory
    for key in ("kernel_startup", "kernel_dispatch", "layer_overhead"):  # per-device parameters in microseconds
        if efficiency and f"{key}_us" in efficiency:
            efficiency = dict(efficiency)
            d[key] = f"{round(efficiency.pop(key + '_us'), 4)}us"
    if efficiency and "kernel_startup_compute_us" in efficiency:  # the compute classes' own start-up
        efficiency = dict(efficiency)
        compute = f"{round(efficiency.pop('kernel_startup_compute_us'), 4)}us"
        memory = d.pop("kernel_startup", None)
        d["kernel_startup"] = {c: compute for c in COMPUTE_CLASSES}
        if memory:
            d["kernel_startup"].update({c: memory for c in MEMORY_CLASSES})
    if efficiency and "recurrent_step_us" in efficiency:  # per math precision (calibrate.py --fit-recurrent)
        efficiency = dict(efficiency)
        d["recurrent_step"] = {math_precision(row["precision"]): f"{round(efficiency.pop('recurrent_step_us'), 4)}us"}
    if efficiency:
        if "all" in efficiency:
            d["efficiency"] = round(efficiency["all"], 6)
        else:
            table = {k: round(v, 6) for k, v in sorted(efficiency.items())}
            if "gemm" in table:
                table["attention"] = table["gemm"]  # tied (see MODEL_CLASSES)
                table["recurrent"] = table["gemm"]  # likewise (a layer of kind lstm without kernels)
            table = dict(sorted(table.items()))
            prec = math_precision(row["precision"])
            d["compute_efficiency"] = {prec: table}
            if prec == "tf32":  # a device without a TF32 rate runs tf32 at its fp32 rate and entries
                d["compute_efficiency"]["fp32"] = table
    return d


def cluster_section(row, device):
    gpus, gpu, system = int(row["gpus"]), row["gpu"], str(row.get("system") or "")
    if gpus < 1:
        raise MappingError(f"gpus {gpus}: expected at least 1")
    if gpus == 1:  # one device; the link is never used
        return {"kind": "switch", "count": 1, "device": dict(device, name="gpu"),
                "bandwidth": NVLINK.get(gpu, "150GBps"), "latency": "1us"}
    s = SYSTEMS.get(system)
    if s is None:
        if gpus <= 8:  # an unknown 8-GPU server: an NVSwitch-like switch at the GPU's NVLink figure
            return {"kind": "switch", "count": gpus, "device": dict(device, name="gpu"),
                    "bandwidth": NVLINK.get(gpu, "150GBps"), "latency": "0.5us"}
        raise MappingError(f"system {system!r} with {gpus} GPUs: no cluster for it (known: {', '.join(SYSTEMS)})")
    if s["gpu"] != gpu:
        raise MappingError(f"system {system!r} has {s['gpu']} GPUs, the row says {gpu}")
    per = s["gpus_per_node"]
    nodes, per_node = (1, gpus) if gpus <= per else (gpus // per, per)
    if nodes * per_node != gpus:
        raise MappingError(f"{gpus} GPUs are not whole {system} nodes of {per}")
    return {"kind": "dgx", "nodes": nodes, "gpus_per_node": per_node, "gpu": device,
            "nvlink": {"bandwidth": s["nvlink"], "latency": "0.5us"},
            "infiniband": {"bandwidth": s["infiniband"], "latency": "1us"}}


def experiment(row, efficiency=None):
    """The pipegrid experiment reproducing the row: the zoo model with its parameters and the row's
    precision, micro-batch = batch_per_gpu x gpus (dp gives each GPU batch_per_gpu), one micro-batch (`accumulation_steps` micro-batches if
    the row says so), pure data parallelism over the row's GPUs."""
    if row["model"] == "megatron-gpt":
        return megatron_module().experiment(row["megatron"], device_spec(row, efficiency))
    if row["model"] not in MODEL_CLASSES:
        raise MappingError(f"model {row['model']!r} is not one the validation knows ({', '.join(MODEL_CLASSES)})")
    if row["precision"] not in PRECISIONS:
        raise MappingError(f"precision {row['precision']!r}: expected one of {', '.join(PRECISIONS)}")
    if row["metric"] not in METRICS:
        raise MappingError(f"metric {row['metric']!r}: expected one of {', '.join(METRICS)}")
    workload = {"model": row["model"], "precision": row["precision"]}
    for k, v in sorted((row.get("model_params") or {}).items()):
        workload[k] = v
    if row.get("computed_sequence"):
        # The length the source's GPUs compute each sequence at, on average, where its data loader
        # pads a batch only to the batch's longest sequence (README.md, "computed_sequence").
        if row["model"] not in ("bert-large", "gpt", "gpt3-175b"):
            raise MappingError(f"computed_sequence: {row['model']} has no sequence length")
        workload["sequence"] = int(row["computed_sequence"])
    return {"name": f"validation {row['id']}",
            "workload": workload,
            "cluster": cluster_section(row, device_spec(row, efficiency)),
            # dp: every GPU is a replica, so the micro-batch per replica is the batch per GPU.
            "strategy": {"partitioner": "dp", "schedule": "1f1b", "allreduce": "multi-ring",
                         "micro_batch_size": int(row["batch_per_gpu"]),
                         "micro_batches": int(row.get("accumulation_steps", 1))},
            "memory": memory_section(row)}


# --------------------------------------------------------------------------------------- metrics

def model_param(row, key):
    return (row.get("model_params") or {}).get(key, ZOO_DEFAULTS.get(row["model"], {}).get(key))


def tokens_per_sample(row):
    """Tokens per sample as the sources count them: BERT and GPT the sequence length; GNMT source +
    target tokens (NVIDIA's GNMT counts both); a row's `tokens_per_sample` overrides."""
    if row.get("tokens_per_sample"):
        return float(row["tokens_per_sample"])
    m = row["model"]
    if m in ("bert-large", "gpt", "gpt3-175b"):
        return float(model_param(row, "sequence"))
    if m in ("gnmt8", "gnmt16"):
        return float(model_param(row, "source_length") + model_param(row, "target_length"))
    raise MappingError(f"tokens_per_s for {m}: no tokens-per-sample rule")


def flops_experiment(row):
    """A one-GPU run of the row's model (one sample) on an ideal device (1 TFLOP/s in every
    precision, efficiency 1, no overheads, no memory limit): its busy time x 1e12 is pipegrid's
    model FLOPs per sample, forward + backward (3 x forward for weighted layers)."""
    e = experiment(row)
    e["name"] = f"validation {row['id']}: FLOPs per sample"
    e["strategy"]["micro_batch_size"] = 1
    e["strategy"]["micro_batches"] = 1
    e["cluster"] = {"kind": "switch", "count": 1, "bandwidth": "1TBps", "latency": "0us",
                    "device": {"name": "gpu", "flops": "1TFLOPS", "efficiency": 1, "memory": "1000TB",
                               "memory_bandwidth": "1000000TBps", "layer_overhead": "0s"}}
    return e


def flops_per_sample(result):
    return result["devices"][0]["busy_s"] * 1e12


def samples_per_unit(row, flops=None):
    """Samples/s that one unit of the row's metric stands for (published samples/s = value x this;
    pipegrid's value in the row's metric = its samples/s / this)."""
    if row["metric"] == "samples_per_s":
        return 1.0
    if row["metric"] == "tokens_per_s":
        return 1.0 / tokens_per_sample(row)
    if flops is None:
        raise MappingError("tflops_per_gpu needs the model's FLOPs per sample")
    # tflops_per_gpu = FLOPs per sample (fwd + bwd) x samples/s / gpus / 1e12
    return 1e12 * int(row["gpus"]) / flops


def predict(pg, rows, efficiency_of=None, progress=None):
    """Runs every row; returns {id: {"pipegrid": value in the row's metric, "samples_per_s",
    "published_samples_per_s", "ratio", "feasible"} or {"error": ...}}. efficiency_of(row) gives
    the row's efficiency overrides (calibration)."""
    jobs = []
    probes = {}
    for r in rows:
        if r["model"] == "megatron-gpt" and r["metric"] == "layer_ms":  # two probe runs (megatron/run.py)
            probes[r["id"]] = megatron_module().layer_time(
                pg.path, r["megatron"], device_spec(r, efficiency_of(r) if efficiency_of else None))
            pg.runs += 2
            continue
        try:
            jobs.append((("run", r["id"]), experiment(r, efficiency_of(r) if efficiency_of else None)))
            if r["metric"] == "tflops_per_gpu":
                jobs.append((("flops", r["id"]), flops_experiment(r)))
        except MappingError as e:
            jobs.append((("run", r["id"]), e))
    res = pg.run_all(jobs, progress)
    out = {}
    for r in rows:
        x = probes.get(r["id"]) or res[("run", r["id"])]
        if "error" in x and r["model"] == "megatron-gpt" and "too large to simulate" in x["error"]:
            # Above the task limit as a whole graph: replayed TP-folded (megatron/run.py, exact where a
            # TP group fills its node).
            f = megatron_module().replay_folded(pg.path, r["megatron"], why=x["error"],
                                                gpu=device_spec(r, efficiency_of(r) if efficiency_of else None))
            pg.runs += 1
            if "error" not in f:
                x = {"iteration_time_s": f["time"], "feasible": True, "breakdown": f["breakdown"], "folded": True}
        if "error" in x:
            out[r["id"]] = {"error": x["error"]}
            continue
        if r["model"] == "megatron-gpt":
            m = r["megatron"]
            time_s = x["time"] if r["metric"] == "layer_ms" else x["iteration_time_s"]
            ratio = (megatron_module().flops_per_iteration(m) / (time_s * m["gpus"]) / 1e12 / float(r["value"])
                     if r["metric"] == "megatron_tflops_per_gpu" else
                     float(r["value"]) / 1000 / time_s if r["metric"] == "layer_ms" else float(r["value"]) / time_s)
            sps = m["batch"] / time_s
            out[r["id"]] = {"samples_per_s": sps, "pipegrid": float(r["value"]) * (ratio if r["metric"] == "megatron_tflops_per_gpu" else 1 / ratio),
                            "published_samples_per_s": sps / ratio, "ratio": ratio,
                            "feasible": x.get("feasible", True), "breakdown": x.get("breakdown", {}),
                            "folded": x.get("folded", False)}
            continue
        try:
            flops = None
            if r["metric"] == "tflops_per_gpu":
                f = res[("flops", r["id"])]
                if "error" in f:
                    raise MappingError(f["error"])
                flops = flops_per_sample(f)
            unit = samples_per_unit(r, flops)
        except MappingError as e:
            out[r["id"]] = {"error": str(e)}
            continue
        sps = x["throughput_samples_per_s"]
        out[r["id"]] = {"samples_per_s": sps, "pipegrid": sps / unit,
                        "published_samples_per_s": float(r["value"]) * unit,
                        "ratio": sps / unit / float(r["value"]), "feasible": x.get("feasible", True)}
    return out


SCALING = os.path.join(HERE, "scaling.yaml")


def load_scaling(path=SCALING):
    """The multi-node scaling series (scaling.yaml), or [] without the file."""
    if not os.path.exists(path):
        return []
    series = load_yaml(path) or []
    for s in series:
        nodes = [p["nodes"] for p in s.get("points", [])]
        if 1 not in nodes or len(nodes) < 2:
            raise SystemExit(f"{path}: series {s.get('id')} needs a 1-node point and another")
    return series


def scaling_row(series, point):
    """A measurement row for one point of a scaling series (the series' fields, the point's
    nodes, accumulation and value)."""
    r = {k: v for k, v in series.items() if k not in ("points", "table")}
    per_node = SYSTEMS[series["system"]]["gpus_per_node"]
    r.update(id=f"{series['id']}@{point['nodes']}", gpus=per_node * int(point["nodes"]),
             accumulation_steps=int(point["accumulation_steps"]), value=point["value"], set="scaling")
    return r


def predict_scaling(pg, series, efficiency_of=None):
    """For every series and point: published and pipegrid scaling, each the per-GPU rate at the
    point's node count over the rate at 1 node. Returns [(series, point, published, pipegrid or
    None, error message or None)]."""
    rows = [scaling_row(s, p) for s in series for p in s["points"]]
    res = predict(pg, rows, efficiency_of)
    out = []
    for s in series:
        one = scaling_row(s, next(p for p in s["points"] if int(p["nodes"]) == 1))
        base = res[one["id"]]
        for p in s["points"]:
            r = scaling_row(s, p)
            x = res[r["id"]]
            published = (float(r["value"]) / r["gpus"]) / (float(one["value"]) / one["gpus"])
            if "error" in x or "error" in base:
                out.append((s, p, published, None, (x.get("error") or base.get("error")).splitlines()[0]))
                continue
            mine = (x["samples_per_s"] / r["gpus"]) / (base["samples_per_s"] / one["gpus"])
            out.append((s, p, published, mine, None))
    return out


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def fmt_value(v):
    """A throughput as the tables print it: thousands separated, three significant figures or more."""
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}" if v >= 10 else f"{v:.2f}"


def summary(label, errors):
    """`label rows: N, median |error| X%, 90th percentile Y%, max Z%` for a list of errors
    (pipegrid/published - 1)."""
    a = [abs(e) for e in errors]
    if not a:
        return f"{label} rows: 0"
    return (f"{label} rows: {len(a)}, median |error| {100 * statistics.median(a):.1f}%, "
            f"90th percentile {100 * percentile(a, 0.9):.1f}%, max {100 * max(a):.1f}%")
