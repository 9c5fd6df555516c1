"""What the kernel scripts that run on a device machine share (moe_experts_torch.py, activation_torch.py,
grouped_gemm_torch.py, moe_layer_torch.py, attention_sweep_torch.py): CUDA-event timing, the median
of `reps` timed calls after `warm` untimed ones, each call between two CUDA events and synchronised
alone, so that one call's time is its own; saving the results as each record comes; the command line; the host's time to issue
a call."""
import json
import statistics
import sys
import time


def median_ms(torch, fn, reps, warm):
    """Median milliseconds of fn over `reps` CUDA-event-timed calls after `warm` untimed ones."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def host_ms(torch, fn, reps):
    """Median milliseconds the host takes to issue fn (perf_counter; no synchronisation inside it)."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(ts)


def save(result, out_path):
    """The whole result so far, written again after each record (a run cut short keeps what it did)."""
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)


def record(result, key, rec, out_path, shown=None):
    """Prints one record (or its `shown` part) as a JSON line, appends it to result[key] and saves."""
    print(json.dumps(rec if shown is None else shown), flush=True)
    result[key].append(rec)
    save(result, out_path)


def command_line(doc, main, dry_run):
    """`SCRIPT OUT.json` runs main(OUT.json) on the GPU; `SCRIPT --dry-run` lists what it would
    measure without one; anything else prints the script's docstring and exits non-zero."""
    if sys.argv[1:] == ["--dry-run"]:
        dry_run()
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(doc)
