#!/usr/bin/env python3
"""Fused causal attention over heads per device, sequence and head size, on the machine it runs on.

The catalog's `attention` efficiency is one figure per device and precision (topologies/devices.yaml:
H100 0.30, H200 0.44), taken from the unfused batched GEMMs of experiments/kernels/results.md, while
pipegrid's default attention is the fused kernel (FlashAttention's work: half the scores under a
causal mask). results.md's cuDNN rows (GPT-3's 96 / t heads of 128 at sequence 2,048) look like
Hockney's form, a fixed time per call plus work at a rate, not one efficiency. This sweeps PyTorch's
scaled_dot_product_attention with the cuDNN backend forced (bf16, causal, micro-batch 1) over heads
4 to 64, sequence 2,048 to 65,536 and head sizes 64 and 128, forward and forward + backward, so that
both parameters can be read off per head size.

Useful FLOPs as results.md counts them: 2 s^2 d per head forward (half of the full 4 s^2 d), 3.5x that
forward + backward. Checked first at the smallest shape of each head size: the output against
PyTorch's math backend in float32 (relative error < 1e-2). Timing: cuda_timing.median_ms (the
median of REPS CUDA-event-timed calls after WARM, each synchronised alone).

    python3 experiments/kernels/attention_sweep_torch.py OUT.json   # needs a GPU and PyTorch
    python3 experiments/kernels/attention_sweep_torch.py --dry-run  # the grid and its FLOPs
"""
import platform
import traceback

from cuda_timing import command_line, median_ms, record

HEAD_DIMS = (64, 128)
HEADS = (4, 8, 16, 32, 64)
SEQUENCES = (2048, 4096, 8192, 16384, 32768, 65536)


def useful_flops(heads, s, d):
    return 2.0 * s * s * d * heads


def reps(flops):
    return (5, 2) if flops > 5e12 else (15, 3)


def dry_run():
    for d in HEAD_DIMS:
        for h in HEADS:
            print(f"d {d}, {h} heads: " + ", ".join(f"s {s} {useful_flops(h, s, d) / 1e9:.0f} GFLOP" for s in SEQUENCES))


def main(out_path):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(), "rows": []}
    for d in HEAD_DIMS:
        for h in HEADS:
            for s in SEQUENCES:
                rec = {"head_dim": d, "heads": h, "sequence": s, "useful_forward_flops": useful_flops(h, s, d)}
                try:
                    q, k, v = (torch.randn(1, h, s, d, device=dev, dtype=bf16, requires_grad=True) for _ in range(3))
                    g = torch.randn(1, h, s, d, device=dev, dtype=bf16)
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                        if s == SEQUENCES[0] and h == HEADS[0]:
                            with sdpa_kernel(SDPBackend.MATH):
                                ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
                            out = f().float()
                            rec["check_rel"] = float(((out - ref).norm() / ref.norm()).item())
                            assert rec["check_rel"] < 1e-2, rec

                        def both():
                            q.grad = k.grad = v.grad = None
                            f().backward(g)
                        n, w = reps(3.5 * rec["useful_forward_flops"])
                        rec["forward_ms"] = median_ms(torch, f, n, w)
                        rec["forward_backward_ms"] = median_ms(torch, both, n, w)
                    q = k = v = g = None
                except Exception:  # noqa: BLE001
                    rec["error"] = traceback.format_exc()[-800:]
                record(result, "rows", rec, out_path)


if __name__ == "__main__":
    command_line(__doc__, main, dry_run)
