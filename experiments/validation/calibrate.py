#!/usr/bin/env python3
"""Fit the cost model's compute-efficiency table on the CALIBRATION rows of measurements.yaml.

Parameters: one efficiency per (device, precision, kernel class) that at least one calibration
row exercises (resnet50/vgg16: conv, gemm; bert/gpt and gnmt: gemm, with attention and recurrent
tied to it), set in each generated experiment as a device override
`compute_efficiency: {precision: {class: value}}`. With a pipegrid that only knows the scalar
`efficiency:` of a device, one parameter per (device, precision) (class `all`). Minimises the sum
of squared log ratios (pipegrid / published) by coordinate descent in log space (golden-section
search per coordinate), each value in [0.05, 1]. The check rows are never read. Writes
calibration.yaml (the table and the calibration rows' residuals) and prints it. Run by hand.

    experiments/validation/calibrate.py [--pipegrid build/pipegrid] [-j 2]
"""
import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vlib  # noqa: E402

LO, HI = 0.01, 1.0
GOLDEN = (math.sqrt(5) - 1) / 2


def parse_args(doc=__doc__, out_what="calibration.yaml", extra=None):
    """calibrate.py's options (crossval.py's too: the same fit, another output)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See experiments/validation/README.md")
    vlib.add_common_args(p, out_what)
    p.add_argument("--megatron-max-gpus", type=int, default=512,
                   help="fit on Megatron-LM's calibration rows (experiments/megatron/rows.yaml) on at most this "
                        "many GPUs too (default 512: the larger ones take a minute each; 0: none)")
    p.add_argument("--fit-startup", nargs="*", default=["a100"], metavar="GPU",
                   help="devices whose kernel start-up (Hockney's t0, every kernel call pays it) is fitted too, "
                        "in [1, 60] us (default: a100; none: the catalog's)")
    p.add_argument("--fit-dispatch", nargs="*", default=[], metavar="GPU",
                   help="devices whose kernel dispatch (host time per kernel call, overlapped with the GPU: a call "
                        "takes max(dispatch, start-up + work)) is fitted too, in [1, 100] us (default: none)")
    p.add_argument("--fit-startup-compute", nargs="*", default=[], metavar="GPU",
                   help="devices whose compute-bound kernels (gemm, conv, attention, recurrent, grouped_gemm) get "
                        "a start-up of their own, fitted in [1, 60] us, the memory-bound ones keeping kernel_startup "
                        "(default: none: one start-up for every class)")
    p.add_argument("--fit-layer-overhead", nargs="*", default=[], metavar="GPU",
                   help="devices whose layer_overhead (a fixed time per layer and pass) is fitted too, in [1, 2000] us "
                        "(default: none: the catalog's)")
    p.add_argument("--fit-recurrent", nargs="*", default=[], metavar="GPU",
                   help="devices whose recurrent_step (the RNN library's time per LSTM time step, direction and pass "
                        "beyond the step's kernels, per math precision) is fitted too on their GNMT rows, in [1, 300] "
                        "us (default: none: the catalog's, measured where it has one)")
    p.add_argument("--only", nargs="*", metavar="GPU",
                   help="fit only these devices' parameters (the others keep their start values: rows of "
                        "different devices share no parameter, so their fit is not affected)")
    p.add_argument("--start", metavar="FILE",
                   help="start from a calibration.yaml's values (default: the catalog's)")
    p.add_argument("--sweeps", type=int, default=4, help="coordinate-descent sweeps at most (default 4)")
    p.add_argument("--tolerance", type=float, default=0.005,
                   help="golden-section stops when the bracket is this narrow in ln(efficiency) (default 0.005)")
    if extra:
        extra(p)
    return p.parse_args()


STARTUP = "kernel_startup_us"
DISPATCH = "kernel_dispatch_us"
STARTUP_COMPUTE = "kernel_startup_compute_us"
LAYER = "layer_overhead_us"
# Per-device parameters in microseconds: (search range, the catalog's key in `device show --json`,
# first value when the catalog has none).
DEVICE_PARAMS = {STARTUP: ((1.0, 60.0), "kernel_startup_s", 5.0),
                 DISPATCH: ((1.0, 100.0), "kernel_dispatch_s", 10.0),
                 STARTUP_COMPUTE: ((1.0, 60.0), "kernel_startup_compute_s", 5.0),
                 LAYER: ((1.0, 2000.0), "layer_overhead_s", 5.0)}
# Per device and math precision, on the rows whose model has LSTMs: (range, first value) in us.
RECURRENT = "recurrent_step_us"
RECURRENT_RANGE, RECURRENT_FIRST = (1.0, 300.0), 20.0
NOT_EFFICIENCY = set(DEVICE_PARAMS) | {RECURRENT}


def recurrent(row):
    return row["model"].startswith("gnmt")


class Fit:
    def __init__(self, pg, rows, startup_gpus=(), dispatch_gpus=(), recurrent_gpus=(), startup_compute_gpus=(),
                 layer_gpus=()):
        self.pg, self.rows = pg, rows
        self.by_class = pg.class_efficiency()
        self.values = {}  # (gpu, math precision, class) -> efficiency; starts at the catalog's
        catalog = {}
        for r in rows:
            if r["gpu"] not in catalog:
                catalog[r["gpu"]] = pg.device(r["gpu"])
            d, prec = catalog[r["gpu"]], vlib.math_precision(r["precision"])
            for c in self.classes(r):
                start = d.get("compute_efficiency", {}).get(prec, {}).get(c, d.get("efficiency", 0.5))
                self.values[(r["gpu"], prec, c)] = min(HI, max(LO, start))
            # Hockney's t0 of the device (every kernel call pays it) and the host's dispatch per call
            for param, gpus in ((STARTUP, startup_gpus), (DISPATCH, dispatch_gpus),
                                (STARTUP_COMPUTE, startup_compute_gpus), (LAYER, layer_gpus)):
                if r["gpu"] in gpus:
                    _, key, first = DEVICE_PARAMS[param]
                    value = (d.get("kernel_startup_class_s", {}).get("gemm", 0) if param == STARTUP_COMPUTE
                             else d.get(key, 0))
                    self.values[(r["gpu"], "*", param)] = round(1e6 * value, 4) or first
            if r["gpu"] in recurrent_gpus and recurrent(r):
                measured = d.get("recurrent_step_s", {}).get(prec, 0)
                self.values[(r["gpu"], prec, RECURRENT)] = round(1e6 * measured, 4) or RECURRENT_FIRST

    def classes(self, row):
        return vlib.MODEL_CLASSES.get(row["model"], ("gemm",)) if self.by_class else ("all",)

    def efficiency_of(self, values):
        def of(r):
            e = {c: values[(r["gpu"], vlib.math_precision(r["precision"]), c)] for c in self.classes(r)}
            for param in DEVICE_PARAMS:
                if (r["gpu"], "*", param) in values:
                    e[param] = values[(r["gpu"], "*", param)]
            step = (r["gpu"], vlib.math_precision(r["precision"]), RECURRENT)
            if recurrent(r) and step in values:
                e[RECURRENT] = values[step]
            return e
        return of

    def residuals(self, values, rows=None):
        """{id: ln(pipegrid / published) or None (error)} for `rows` (default all); values None:
        the catalog's efficiencies (no overrides)."""
        res = vlib.predict(self.pg, rows or self.rows, self.efficiency_of(values) if values else None)
        return {i: (None if "error" in x else math.log(x["ratio"])) for i, x in res.items()}

    def cost(self, values, rows=None):
        return sum(v * v for v in self.residuals(values, rows).values() if v is not None)

    def line_search(self, key, tol):
        """Golden-section search over ln(value) in [ln LO, ln HI] for the coordinate `key`, re-running
        only the rows that use it (the others do not change)."""
        if key[2] in DEVICE_PARAMS:
            rows = [r for r in self.rows if r["gpu"] == key[0]]
            lo, hi = DEVICE_PARAMS[key[2]][0]
        elif key[2] == RECURRENT:
            rows = [r for r in self.rows
                    if recurrent(r) and (r["gpu"], vlib.math_precision(r["precision"])) == key[:2]]
            lo, hi = RECURRENT_RANGE
        else:
            rows = [r for r in self.rows if (r["gpu"], vlib.math_precision(r["precision"])) == key[:2] and key[2] in self.classes(r)]
            lo, hi = LO, HI

        def f(logv):
            v = dict(self.values)
            v[key] = round(math.exp(logv), 4)
            return self.cost(v, rows)

        a, b = math.log(lo), math.log(hi)
        c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
        fc, fd = f(c), f(d)
        while b - a > tol:
            if fc <= fd:
                b, d, fd = d, c, fc
                c = b - GOLDEN * (b - a)
                fc = f(c)
            else:
                a, c, fc = c, d, fd
                d = a + GOLDEN * (b - a)
                fd = f(d)
        best = min(((f(x), round(math.exp(x), 4)) for x in (a, (a + b) / 2, b)), key=lambda t: t[0])
        current = f(math.log(self.values[key]))
        if best[0] < current:
            self.values[key] = best[1]
        return min(best[0], current)


def fmt_yaml(fit, before, after, rows, sweeps_done, cost0, cost1):
    lines = ["# Fitted by experiments/validation/calibrate.py on the calibration rows of measurements.yaml",
             "# (never the check rows). Copy into topologies/devices.yaml as each device's compute_efficiency.",
             "# Keyed by pipegrid's math precisions: amp rows fit fp16, amp-bf16 rows bf16. tf32 rows set the fp32",
             "# entries alike (what pipegrid uses for tf32 on a device without a TF32 rate).",
             f"# pipegrid mode: {'per kernel class' if fit.by_class else 'scalar efficiency (class all)'}.",
             "# Rows: measurements.yaml's calibration rows and Megatron-LM's (experiments/megatron/rows.yaml, ids"
             " megatron-*) on at most --megatron-max-gpus GPUs.",
             f"# objective (sum of squared ln ratios): {cost0:.4f} with the catalog's efficiencies -> {cost1:.4f} "
             f"after {sweeps_done} sweep(s) over {len(rows)} rows",
             "compute_efficiency:"]
    for gpu in sorted({k[0] for k in fit.values if k[2] not in NOT_EFFICIENCY}):
        lines.append(f"  {gpu}:")
        for prec in sorted({k[1] for k in fit.values if k[0] == gpu and k[2] not in NOT_EFFICIENCY}):
            items = ", ".join(f"{c}: {fit.values[(gpu, prec, c)]:.4f}" for c in sorted(
                k[2] for k in fit.values if k[:2] == (gpu, prec) and k[2] not in NOT_EFFICIENCY))
            lines.append(f"    {prec}: {{{items}}}")
    for param, what in ((STARTUP, "Hockney's t0 per device (kernel_startup)"),
                        (DISPATCH, "host time per kernel call (kernel_dispatch)"),
                        (STARTUP_COMPUTE, "the compute-bound classes' own kernel_startup"),
                        (LAYER, "fixed time per layer and pass (layer_overhead)")):
        fitted = {k[0]: v for k, v in fit.values.items() if k[2] == param}
        if fitted:
            lines.append(f"{param}:  # {what}, fitted with the efficiencies")
            lines += [f"  {gpu}: {v:.4f}" for gpu, v in sorted(fitted.items())]
    steps = {k[:2]: v for k, v in fit.values.items() if k[2] == RECURRENT}
    if steps:
        lines.append(f"{RECURRENT}:  # recurrent_step per device and math precision, fitted on its GNMT rows")
        lines += [f"  {gpu}: {{{prec}: {v:.4f}}}" for (gpu, prec), v in sorted(steps.items())]
    lines.append("residuals:  # pipegrid / published with the catalog's efficiencies (before) and the fitted ones (after)")
    for r in sorted(rows, key=lambda r: r["id"]):
        b, a = before.get(r["id"]), after.get(r["id"])
        show = (lambda x: "error" if x is None else f"{math.exp(x):.3f}")
        lines.append(f"  - {{id: {r['id']}, before: {show(b)}, after: {show(a)}}}")
    errs = [math.exp(a) - 1 for a in after.values() if a is not None]
    lines.append(f"# {vlib.summary('calibration', errs)}")
    return "\n".join(lines) + "\n"


def run_fit(pg, rows, sweeps, tolerance, log=print, start=None, startup_gpus=(), only=None, start_file=None,
            startup_start=None, dispatch_gpus=(), recurrent_gpus=(), startup_compute_gpus=(), layer_gpus=()):
    """Coordinate descent on `rows` (calibration rows only): the fitted Fit, the residuals with the
    catalog's efficiencies (before) and the fitted ones (after), the costs and the sweeps done.
    start: every efficiency's first value, startup_start every start-up's in us (default: the catalog's)."""
    fit = Fit(pg, rows, startup_gpus, dispatch_gpus, recurrent_gpus, startup_compute_gpus, layer_gpus)
    catalog = dict(fit.values)
    if start is not None:
        fit.values = {k: (v if k[2] in NOT_EFFICIENCY else start) for k, v in fit.values.items()}
    if startup_start is not None:
        fit.values = {k: (startup_start if k[2] == STARTUP else v) for k, v in fit.values.items()}
    if start_file:
        y = vlib.load_yaml(start_file) or {}
        for (gpu, prec, c) in list(fit.values):
            v = (y.get(c, {}).get(gpu) if c in DEVICE_PARAMS else
                 y.get("compute_efficiency", {}).get(gpu, {}).get(prec, {}).get(c))
            if v is not None:
                fit.values[(gpu, prec, c)] = v
    log(f"{len(rows)} calibration rows, {len(fit.values)} parameters "
        f"({'per kernel class' if fit.by_class else 'scalar efficiency per device and precision'})")
    before = fit.residuals(None)
    cost0 = cost = sum(v * v for v in before.values() if v is not None)
    log(f"start: cost {cost0:.4f}")
    if fit.values != catalog:  # a start other than the catalog's: the sweeps must beat its cost, not cost0
        cost = fit.cost(fit.values)
        log(f"start values: cost {cost:.4f}")
    done = 0
    for sweep in range(sweeps):
        done += 1
        for key in sorted(fit.values):
            if only is not None and key[0] not in only:
                continue
            fit.line_search(key, tolerance)
            log(f"sweep {sweep + 1}: {'/'.join(key)} = {fit.values[key]:.4f} ({pg.runs} pipegrid runs)")
        new = fit.cost(fit.values)
        log(f"sweep {sweep + 1}: cost {new:.4f}")
        if cost - new < 1e-4:
            cost = new
            break
        cost = new
    return fit, before, fit.residuals(fit.values), cost0, cost, done


def main():
    args = parse_args()
    rows = vlib.load_rows(args.measurements, "calibration") + vlib.load_megatron_rows("calibration", args.megatron_max_gpus)
    # The check rows stay unseen: only calibration rows were kept, and nothing else is read.
    assert rows and all(r["set"] == "calibration" for r in rows), "calibration needs calibration rows only"
    pg = vlib.Pipegrid(args.pipegrid, args.jobs)
    fit, before, after, cost0, cost, sweeps = run_fit(pg, rows, args.sweeps, args.tolerance, start=None,
                                                      startup_gpus=args.fit_startup, only=args.only,
                                                      dispatch_gpus=args.fit_dispatch,
                                                      recurrent_gpus=args.fit_recurrent,
                                                      startup_compute_gpus=args.fit_startup_compute,
                                                      layer_gpus=args.fit_layer_overhead,
                                                      start_file=args.start,
                                                      log=lambda m: print(m, flush=True))
    text = fmt_yaml(fit, before, after, rows, sweeps, cost0, cost)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "calibration.yaml"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
