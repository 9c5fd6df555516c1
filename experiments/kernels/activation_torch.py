#!/usr/bin/env python3
"""The memory-bound kernels of an MoE layer's experts as Megatron-Core runs them, measured as achieved
bandwidth in PyTorch on the machine it runs on (issue 50, item 8; beside moe_experts_torch.py).

1. The experts' fused activations (fusions/fused_bias_swiglu.py and fused_bias_geglu.py at
   core_v0.15.0): the routing-weighted SwiGLU of Qwen3 and DeepSeek-V3 and GPT-OSS's weighted
   quick-GEGLU (alpha 1.702, linear offset 1), forward and backward (the backward also sums the
   weights' gradient over the features), each as Megatron-Core's `jit_fuser` runs it:
   torch.compile by default. Three ways: eager; compiled at a fixed shape; and compiled as dropless
   training runs it, where the rows change from one call to the next, so that torch.compile's
   automatic dynamic shapes recompile it with the rows symbolic ("auto": called at two row counts
   before the timed one); and dynamic=True (every dimension symbolic) for comparison.
2. PyTorch eager's element-wise paths on the same tensors: a contiguous bf16 add (the vectorised
   path), a clamp of one half of the GLU's input (a strided view: the non-vectorised path), the
   concatenation of the two clamped halves, and `t + b * p` (bf16 rows, a bf16 bias broadcast, fp32
   probabilities: TEGroupedMLP._apply_bias's mixed-dtype broadcast).

Bytes per element as each kernel must move them (reads + writes, the stated dtypes); achieved GB/s =
bytes / median time (CUDA events, REPS calls after WARM). A copy's bandwidth (torch clone, read +
write) is measured beside them.

    python3 experiments/kernels/activation_torch.py OUT.json   # needs a GPU and PyTorch
"""
import json
import sys
import traceback

from cuda_timing import median_ms

ALPHA, OFFSET = 1.702, 1.0
REPS, WARM = 20, 3
SHAPES = [(65536, 768), (65536, 2048), (65536, 2880), (16384, 2880)]  # rows, expert FFN (one half)


def activation_functions(torch, F):
    """Megatron-Core's weighted expert activations, forward and backward (fusions/fused_bias_swiglu.py
    and fused_bias_geglu.py at core_v0.15.0, written here from their formulas): name -> (forward(y, w),
    backward(g, y, w) -> (dy, dw)); y holds the GLU's two halves, w the routing weights [rows, 1].
    moe_experts_torch.py takes the quick-GEGLU from here."""

    def swiglu(y):
        y1, y2 = torch.chunk(y, 2, -1)
        return F.silu(y1) * y2

    def wswiglu(y, w):
        return (swiglu(y) * w).to(y.dtype)

    def wswiglu_back(g, y, w):
        y1, y2 = torch.chunk(y, 2, -1)
        gw = g * w
        d = torch.cat((gw * torch.sigmoid(y1) * (1 + y1 * (1 - torch.sigmoid(y1))) * y2, gw * F.silu(y1)), -1)
        dw = torch.sum(swiglu(y) * g.to(w.dtype), dim=-1, keepdim=True)
        return d.to(y.dtype), dw.to(w.dtype)

    def qgeglu(y):
        y1, y2 = torch.chunk(y, 2, -1)
        return y1 * torch.sigmoid(ALPHA * y1) * (y2 + OFFSET)

    def wqgeglu(y, w):
        return (qgeglu(y) * w).to(y.dtype)

    def wqgeglu_back(g, y, w):
        y1, y2 = torch.chunk(y, 2, -1)
        gw = g * w
        s = torch.sigmoid(ALPHA * y1)
        d = torch.cat((gw * s * (1 + ALPHA * y1 * (1 - s)) * (y2 + OFFSET), gw * y1 * s), -1)
        dw = torch.sum(qgeglu(y) * g.to(w.dtype), dim=-1, keepdim=True)
        return d.to(y.dtype), dw.to(w.dtype)

    return {"weighted swiglu": (wswiglu, wswiglu_back), "weighted quick-geglu": (wqgeglu, wqgeglu_back)}


def main(out_path):
    import torch
    import torch.nn.functional as F
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 64
    dev = torch.device("cuda")
    bf16 = torch.bfloat16
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}

    def timed(fn):
        return median_ms(torch, fn, REPS, WARM)

    funcs = activation_functions(torch, F)
    modes = {"eager": None, "static": False, "auto": "auto", "dynamic": True}

    def variant(name, mode):
        """The pair (forward, backward) as `mode` runs it, from an empty compile cache (dynamo keys its
        cache on the code object, so one variant's graphs would otherwise serve another's calls)."""
        f, b = funcs[name]
        if modes[mode] is None:
            return f, b
        torch._dynamo.reset()
        if modes[mode] == "auto":
            return torch.compile(f), torch.compile(b)
        return torch.compile(f, dynamic=modes[mode]), torch.compile(b, dynamic=modes[mode])

    def record(**kw):
        out["rows"].append(kw)
        print(kw, flush=True)

    for rows, fe in SHAPES:
        a = rows * fe  # elements of one half
        y = (torch.rand(rows, 2 * fe, device=dev) * 8 - 4).to(bf16)
        w = torch.rand(rows, 1, device=dev)
        g = (torch.rand(rows, fe, device=dev) * 2 - 1).to(bf16)
        base = dict(rows=rows, ffn=fe)
        try:
            ms = timed(lambda: y.clone())
            record(**base, kernel="copy (clone)", mode="eager", pass_="-", ms=ms, gbps=2 * 2 * 2 * a / ms / 1e6)
            for name, mode in [(n, m) for n in funcs for m in modes]:
                try:
                    f, b = variant(name, mode)
                    if mode == "auto":  # two other row counts first: torch.compile then marks the rows dynamic
                        for r2 in (rows - 64, rows - 128):
                            f(y[:r2], w[:r2])
                            b(g[:r2], y[:r2], w[:r2])
                    fwd = timed(lambda: f(y, w))
                    bwd = timed(lambda: b(g, y, w))
                    # forward: y (2 halves, bf16) and w read, the output (bf16) written: 6 bytes per
                    # element of a half + 4 per row; backward: g, y, w read, dy (2 halves) and dw written.
                    record(**base, kernel=name, mode=mode, pass_="forward", ms=fwd, gbps=(6 * a + 4 * rows) / fwd / 1e6)
                    record(**base, kernel=name, mode=mode, pass_="backward", ms=bwd, gbps=(10 * a + 8 * rows) / bwd / 1e6)
                except Exception as e:  # noqa: BLE001
                    record(**base, kernel=name, mode=mode, error=repr(e)[:300])
            y1, y2 = y.chunk(2, -1)
            ms = timed(lambda: y1.clamp(max=7.0))
            record(**base, kernel="clamp of a half (strided view)", mode="eager", pass_="forward", ms=ms,
                   gbps=4 * a / ms / 1e6)
            c1, c2 = y1.contiguous(), y2.contiguous()
            ms = timed(lambda: c1.clamp(max=7.0))
            record(**base, kernel="clamp of a contiguous half", mode="eager", pass_="forward", ms=ms, gbps=4 * a / ms / 1e6)
            ms = timed(lambda: c1 + c2)
            record(**base, kernel="add, contiguous bf16", mode="eager", pass_="forward", ms=ms, gbps=6 * a / ms / 1e6)
            ms = timed(lambda: torch.cat((c1, c2), -1))
            record(**base, kernel="cat of two halves", mode="eager", pass_="forward", ms=ms, gbps=8 * a / ms / 1e6)
            ms = timed(lambda: y1 <= 7.0)
            record(**base, kernel="compare of a half (strided, bool out)", mode="eager", pass_="backward", ms=ms,
                   gbps=3 * a / ms / 1e6)
            bias = (torch.rand(fe, device=dev) * 0.1).to(bf16)
            ms = timed(lambda: bias * w)
            record(**base, kernel="b * p (broadcast, fp32 out)", mode="eager", pass_="forward", ms=ms, gbps=4 * a / ms / 1e6)
            bp = bias * w
            ms = timed(lambda: g + bp)
            record(**base, kernel="t + bp (bf16 + fp32, fp32 out)", mode="eager", pass_="forward", ms=ms,
                   gbps=10 * a / ms / 1e6)
            t32 = g + bp
            ms = timed(lambda: t32.to(bf16))
            record(**base, kernel="cast fp32 -> bf16", mode="eager", pass_="forward", ms=ms, gbps=6 * a / ms / 1e6)
        except Exception:  # noqa: BLE001
            record(**base, error=traceback.format_exc()[-800:])
        with open(out_path, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
