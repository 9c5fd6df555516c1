"""CUDA-event timing shared by the kernel scripts that run on a device machine (moe_experts_torch.py,
activation_torch.py): the median of `reps` timed calls after `warm` untimed ones, each call between
two CUDA events and synchronised alone, so that one call's time is its own."""
import statistics


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
