#!/usr/bin/env python3
"""Does the host's time add to the device's in an eager MoE layer, or hide under it? (issue 50, item 8)

experiments/moe/README.md found, in a published pair (Qwen3-30B-A3B on 8 B200s at micro-batch 1 and
4), a micro-batch time of F + V b with a fixed part F that is 85% of micro-batch 1: the host's work
adding to the device's, where pipegrid's HostStream (core/device.h) lets the host run ahead of the
device and drains its lead only once per block's forward, where the dropless dispatcher waits for the
token counts. This measures the same question on the machine it runs on, with a layer whose device
work and host work are both known: a stack of MoE transformer blocks at Qwen3-30B-A3B's per-device
cut on EP 8 (h 2,048; 32 query heads and 4 key-value heads of 128; 16 local experts of FFN 768,
SwiGLU; top-8 of the 16, so that each expert receives 2,048 rows per sample of 4,096 tokens, as on
EP 8), in eager PyTorch without Transformer Engine and without the all-to-all (one GPU):

  RMSNorm, a fused QKV projection, causal attention (scaled_dot_product_attention, the key-value heads repeated), the output
  projection and residual; RMSNorm, the router (a GEMM to 16 logits in fp32, softmax, top-8), the
  token counts per expert, the permutation (a stable sort by expert, a gather), the experts (per
  expert: fc1, SwiGLU, fc2; one stream), the routing weights, the un-permutation (index_add) and the
  residual; forward and backward (autograd), weights in bf16.

Routing is balanced by construction (the top-k's indices are replaced by a fixed balanced assignment,
the top-k still computed), so that two variants do the same device work:
  `sync`: the counts per expert are read by the host (`tolist()`, a device-to-host copy and a wait),
          as Megatron-Core's dropless dispatcher does once per block's forward;
  `nosync`: the host already knows the counts (as with a fixed capacity), no wait.

Per variant and micro-batch b (1, 2, 4 at sequence 4,096; and b = 1 at sequence 64, where the device
work is negligible, so that its wall time is the host's): the wall time of forward + backward of the
stack (synchronised before and after; median of REPS after WARM), and from one profiled iteration the
device's busy time (the union of its kernels' intervals) and the number of kernels.

    python3 experiments/kernels/moe_layer_torch.py OUT.json   # needs a GPU and PyTorch
    python3 experiments/kernels/moe_layer_torch.py --dry-run  # the configurations
"""
import platform
import statistics
import time
import traceback

from cuda_timing import command_line, record

H, HEADS, KV_HEADS, HEAD_DIM, LOCAL, TOPK, FFN = 2048, 32, 4, 128, 16, 8, 768
LAYERS, REPS, WARM = 4, 10, 3
CONFIGS = [(64, 1), (4096, 1), (4096, 2), (4096, 4)]  # sequence, micro-batch


def dry_run():
    for s, b in CONFIGS:
        rows = s * b * TOPK // LOCAL
        print(f"sequence {s}, micro-batch {b}: {s * b} tokens, {LOCAL} experts x {rows} rows, {LAYERS} blocks")


def main(out_path):
    import torch
    import torch.nn.functional as F

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "python": platform.python_version(), "layers": LAYERS, "reps": REPS, "runs": []}

    def param(*shape, scale):
        return (torch.randn(*shape, device=dev) * scale).to(bf16).requires_grad_()

    qkv_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    blocks = [{"ln1": torch.ones(H, device=dev, dtype=bf16, requires_grad=True),
               "qkv": param(qkv_out, H, scale=H ** -0.5), "proj": param(H, HEADS * HEAD_DIM, scale=H ** -0.5),
               "ln2": torch.ones(H, device=dev, dtype=bf16, requires_grad=True),
               "router": (torch.randn(LOCAL, H, device=dev) * H ** -0.5).requires_grad_(),
               "w1": param(LOCAL, 2 * FFN, H, scale=H ** -0.5), "w2": param(LOCAL, H, FFN, scale=FFN ** -0.5)}
              for _ in range(LAYERS)]
    params = [p for blk in blocks for p in blk.values()]

    def block(x, p, b, s, sync):
        t = b * s
        y = F.rms_norm(x, (H,), p["ln1"])
        q, k, v = F.linear(y, p["qkv"]).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q = q.view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = k.view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        rep = HEADS // KV_HEADS  # key-value heads repeated, so that every fused backend takes the call
        a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                           is_causal=True)
        x = x + F.linear(a.transpose(1, 2).reshape(b, s, HEADS * HEAD_DIM), p["proj"])
        y = F.rms_norm(x, (H,), p["ln2"]).view(t, H)
        logits = F.linear(y.float(), p["router"])
        probs, _ = torch.topk(torch.softmax(logits, -1), TOPK, -1)
        probs = probs / probs.sum(-1, keepdim=True)
        # Balanced by construction: token i's j-th choice is expert (i + 2j) mod 16 (each expert gets
        # t x 8 / 16 copies), so that both variants run the same kernels on the same rows.
        idx = (torch.arange(t, device=dev)[:, None] + 2 * torch.arange(TOPK, device=dev)[None, :]) % LOCAL
        flat = idx.reshape(-1)
        if sync:  # the dispatcher's token counts, read by the host (a device-to-host copy and a wait)
            counts = torch.bincount(flat, minlength=LOCAL).tolist()
        else:
            counts = [t * TOPK // LOCAL] * LOCAL
        order = torch.argsort(flat, stable=True)
        tokens = order // TOPK
        xp = y.index_select(0, tokens)
        pp = probs.reshape(-1).index_select(0, order).to(bf16)
        outs, start = [], 0
        for e, n in enumerate(counts):
            h1 = F.linear(xp[start:start + n], p["w1"][e])
            outs.append(F.linear(F.silu(h1[:, :FFN]) * h1[:, FFN:], p["w2"][e]))
            start += n
        z = torch.cat(outs) * pp[:, None]
        moe = torch.zeros(t, H, device=dev, dtype=bf16).index_add(0, tokens, z)
        return x + moe.view(b, s, H)

    def step(b, s, sync, x, g):
        for prm in params:
            prm.grad = None
        out = x
        for p in blocks:
            out = block(out, p, b, s, sync)
        out.backward(g)

    def busy(b, s, sync, x, g):
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(b, s, sync, x, g)
            torch.cuda.synchronize()
        iv = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                    if str(getattr(e, "device_type", "")).endswith("CUDA"))
        total, end = 0.0, None
        for a, z in iv:  # the union of the kernels' intervals
            if end is None or a > end:
                total += z - a
                end = z
            elif z > end:
                total += z - end
                end = z
        return total / 1e3, len(iv)

    for s, b in CONFIGS:
        for sync in (True, False):
            rec = {"sequence": s, "micro_batch": b, "variant": "sync" if sync else "nosync"}
            try:
                x = torch.randn(b, s, H, device=dev, dtype=bf16, requires_grad=True)
                g = torch.randn(b, s, H, device=dev, dtype=bf16)
                for _ in range(WARM):
                    step(b, s, sync, x, g)
                ts = []
                for _ in range(REPS):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    step(b, s, sync, x, g)
                    torch.cuda.synchronize()
                    ts.append((time.perf_counter() - t0) * 1e3)
                rec["wall_ms"] = statistics.median(ts)
                rec["wall_all_ms"] = ts
                rec["device_busy_ms"], rec["kernels"] = busy(b, s, sync, x, g)
                x = g = None
            except Exception:  # noqa: BLE001
                rec["error"] = traceback.format_exc()[-1500:]
            record(result, "runs", rec, out_path, {k: v for k, v in rec.items() if k != "wall_all_ms"})


if __name__ == "__main__":
    command_line(__doc__, main, dry_run)
