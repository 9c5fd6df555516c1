#!/usr/bin/env python3
"""What the fourteenth step of docs/accuracy.md leaves open: the bandwidth PyTorch's eager kernels
reach on a BERT-Large encoder layer's memory-bound work (run once on an H200: h200/issue29/).

pipegrid costs each memory-bound kernel of an unfused `bert-large` block as its bytes over 0.83 of
the device's bandwidth (core/models/builder.cc: transformer_block, score_passes). Two probes on
the validation rows disagree on whether that holds. Substation's V100 layer times, with DeepBench's
GEMM rate, say the whole non-GEMM rest costs about 2x. The whole-model rows reject that, but are
fitted better when the passes over the s x s scores alone cost 1.65x. This measures, on the GPU it
runs on, each of those kernels at the rows' shapes, so that the two can be told apart:

- Over the scores [b x 16, s, s] (DLE's modeling.py at a07d20a): divide by sqrt(64), add the
  [b, 1, 1, s] mask, softmax, dropout(0.1); forward and backward.
- Over the hidden states [s, b, 1024] and [s, b, 4096]: LayerNorm, dropout, residual add, GeLU
  (tanh); forward and backward (the input's gradient: LayerNorm's weight gradients are not asked
  for, and an add's backward is no kernel).
- The layer's four weight GEMMs (forward, input gradient, weight gradient) and the core's two
  batched GEMMs, for their rate.
- A device-to-device copy of 1 GiB, the bandwidth reference.

Shapes: (b, s) = (32, 384) (DLE PyTorch's SQuAD rows), (8, 512) and (96, 128) (Substation's
layers). Precisions: fp16 (the model cast with .half(), as apex O2 and Substation ran it) and
tf32. Each kernel's bytes are counted as pipegrid counts them (listed by --dry-run). The result is
the achieved GB/s and its fraction of the copy's. Each time is the median of REPS CUDA-event timed
repetitions after warm-up.

    python3 experiments/kernels/bert_layer_torch.py OUT.json   # needs a GPU and PyTorch
    python3 experiments/kernels/bert_layer_torch.py --dry-run  # the ops, shapes and bytes; no torch
"""
import json
import math
import platform
import sys

REPS, WARM = 20, 5
H, F, HEADS = 1024, 4096, 16
SHAPES = [(32, 384), (8, 512), (96, 128)]


def ops(b, s, eb):
    """(name, input shape, forward bytes, backward bytes) of each memory-bound kernel, as pipegrid
    counts them (builder.cc: score_passes, transformer_block's element-wise and LayerNorm kernels)."""
    scores, sh, sf = HEADS * s * s * b, s * b * H, s * b * F
    return [
        ("scores / sqrt(d)", (b * HEADS, s, s), 2 * eb * scores, 2 * eb * scores),
        ("scores + mask", (b * HEADS, s, s), 2 * eb * scores, 0),
        ("softmax", (b * HEADS, s, s), 2 * eb * scores, 3 * eb * scores),
        ("dropout (scores)", (b * HEADS, s, s), (2 * eb + 1) * scores, (2 * eb + 1) * scores),
        ("layernorm", (s, b, H), 2 * eb * sh, 3 * eb * sh),
        ("dropout (hidden)", (s, b, H), 2 * eb * sh, 3 * eb * sh),
        # Backward: autograd passes the gradient through (pipegrid counts 1.5x the forward for the
        # five element-wise kernels together); the two branches' gradients meet in an add, timed as this.
        ("residual add", (s, b, H), 3 * eb * sh, 0),
        ("gelu", (s, b, F), 2 * eb * sf, 3 * eb * sf),
    ]


def dry_run():
    for prec, eb in (("fp16", 2), ("tf32", 4)):
        for b, s in SHAPES:
            for name, shape, fwd, bwd in ops(b, s, eb):
                print(f"{prec} b={b} s={s} {name:18s} {str(shape):18s} forward {fwd / 1e6:9.1f} MB "
                      f"backward {bwd / 1e6:9.1f} MB")


def main(out_path):
    import torch
    import torch.nn.functional as fn

    dev = torch.device("cuda")

    def timed(f):
        for _ in range(WARM):
            f()
        torch.cuda.synchronize()
        times = []
        for _ in range(REPS):
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            z.record()
            z.synchronize()
            times.append(a.elapsed_time(z) * 1e-3)
        times.sort()
        return times[len(times) // 2]

    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(big)
    copy_bw = 2 * big.numel() / timed(lambda: dst.copy_(big))
    del big, dst
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda": torch.version.cuda, "python": platform.python_version(), "copy_Bps": copy_bw, "rows": []}
    for prec, dtype, eb in (("fp16", torch.float16, 2), ("tf32", torch.float32, 4)):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        torch.backends.cudnn.allow_tf32 = prec == "tf32"
        for b, s in SHAPES:
            mask = torch.zeros(b, 1, 1, s, dtype=dtype, device=dev)
            funcs = {
                "scores / sqrt(d)": lambda x: x / math.sqrt(H // HEADS),
                "scores + mask": lambda x: (x.view(b, HEADS, s, s) + mask).view(b * HEADS, s, s),
                "softmax": lambda x: fn.softmax(x, dim=-1),
                "dropout (scores)": lambda x: fn.dropout(x, 0.1, training=True),
                "layernorm": lambda x, ln=torch.nn.LayerNorm(H, eps=1e-12).to(dev, dtype): ln(x),
                "dropout (hidden)": lambda x: fn.dropout(x, 0.1, training=True),
                "residual add": lambda x, r=torch.randn(s, b, H, dtype=dtype, device=dev): x + r,
                "gelu": lambda x: fn.gelu(x, approximate="tanh"),
            }
            for name, shape, fwd_bytes, bwd_bytes in ops(b, s, eb):
                x = torch.randn(*shape, dtype=dtype, device=dev, requires_grad=True)
                f = funcs[name]
                t_fwd = timed(lambda: f(x))
                y = f(x)
                g = torch.randn_like(y)
                t_bwd = timed(lambda: torch.autograd.grad(y, x, g, retain_graph=True))
                row = {"precision": prec, "batch": b, "sequence": s, "op": name, "shape": list(shape),
                       "forward_s": t_fwd, "backward_s": t_bwd, "forward_bytes": fwd_bytes,
                       "backward_bytes": bwd_bytes,
                       "forward_of_copy": fwd_bytes / t_fwd / copy_bw,
                       "backward_of_copy": bwd_bytes / t_bwd / copy_bw if bwd_bytes else None}
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
                del x, y, g
            tokens = b * s
            for k_in, n_out in ((H, 3 * H), (H, H), (H, F), (F, H)):
                for label, (m, n, k) in (("forward", (tokens, n_out, k_in)), ("input gradient", (tokens, k_in, n_out)),
                                         ("weight gradient", (k_in, n_out, tokens))):
                    a_ = torch.randn(m, k, dtype=dtype, device=dev)
                    b_ = torch.randn(k, n, dtype=dtype, device=dev)
                    t = timed(lambda: a_ @ b_)
                    row = {"precision": prec, "batch": b, "sequence": s, "op": f"gemm {label}", "m": m, "n": n,
                           "k": k, "time_s": t, "flops_per_s": 2.0 * m * n * k / t}
                    result["rows"].append(row)
                    print(json.dumps(row), flush=True)
            q = torch.randn(b * HEADS, s, H // HEADS, dtype=dtype, device=dev)
            kt = torch.randn(b * HEADS, H // HEADS, s, dtype=dtype, device=dev)
            p = torch.randn(b * HEADS, s, s, dtype=dtype, device=dev)
            for label, fcore in (("bmm Q K^T", lambda: torch.bmm(q, kt)), ("bmm P V", lambda: torch.bmm(p, q))):
                t = timed(fcore)
                row = {"precision": prec, "batch": b, "sequence": s, "op": label, "time_s": t,
                       "flops_per_s": 2.0 * b * HEADS * s * s * (H // HEADS) / t}
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
            del q, kt, p
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--dry-run":
        dry_run()
    else:
        main(sys.argv[1])
