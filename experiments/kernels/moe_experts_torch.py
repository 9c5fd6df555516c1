#!/usr/bin/env python3
"""GPT-OSS-120B's expert path and attention kernels as Megatron-Core runs them without Transformer
Engine's op fuser, measured in PyTorch on the machine it runs on (issue 50, item 8).

experiments/moe's GPT-OSS rows are 1.3-2.1x slower than pipegrid on every GPU and release that runs
the experts unfused (experiments/moe/README.md, "GPT-OSS's eager expert work"): GPU work linear in
the tokens that pipegrid does not cost. This measures the pieces pipegrid costs, one by one, at the
rows' per-device shapes, so that each can be set against pipegrid's figure for the same device:

1. The experts (TEGroupedMLP's forward and backward, moe/experts.py at core_v0.15.0): fc1 and fc2
   as one cuBLAS GEMM per local expert into one output buffer (as Transformer Engine's grouped
   linear does: nvte_multi_tensor_gemm), on 1 stream and round-robin over 4 (TE's default), and as
   PyTorch's grouped GEMM (torch._grouped_mm) where present; fc1's bias in the GEMM; GPT-OSS's
   clamped GLU (the two halves clamped at 7 and concatenated in eager PyTorch, then the weighted
   quick-GEGLU with linear offset 1 and alpha 1.702 under torch.compile, as Megatron-Core's
   jit_fuser compiles it); fc2's bias added per expert in fp32 (`t + b * p`, a concatenation, a
   cast). Weights, inputs and gradients are random bf16; the routing probabilities fp32.
   Each piece is timed alone (CUDA events, forward and forward + backward), the whole path together,
   the host's time to issue the forward (perf_counter around the call, no synchronisation inside),
   and one profiled forward + backward lists every kernel with its device time.
2. Attention at GPT-OSS's shapes (64 query heads and 8 key-value heads of 64, causal, bf16) through
   PyTorch's scaled_dot_product_attention with the cuDNN and FlashAttention backends forced, beside
   the same FLOPs in heads of 128 (32 heads, 4 key-value heads), forward and forward + backward.
   The sinks and the sliding window are not there (SDPA has neither).

Shapes: tokens per device T = micro-batch x sequence, top-4 of 128 experts, h = 2880, expert FFN
2880 (gated: fc1 writes 5760). Balanced routing: T x 4 rows reach a device's L local experts, T x 4 / L
each. Configurations as experiments/moe's GPT-OSS rows cut them (rows.yaml): EP 8 (16 local
experts) and EP 64 (2), micro-batch 1 and 4 at sequence 4,096, and micro-batch 1 at 8,192.

Checked first: the per-expert GEMM path against a float32 reference on a slice, the 4-stream and
grouped paths against the 1-stream one (bf16 tolerance); a failed check marks the configuration.

    python3 experiments/kernels/moe_experts_torch.py OUT.json     # needs a GPU and PyTorch
    python3 experiments/kernels/moe_experts_torch.py --dry-run    # the configurations and sizes
"""
import platform
import traceback

from activation_torch import activation_functions
from cuda_timing import command_line, host_ms, median_ms, save

H, FFN, EXPERTS, TOPK = 2880, 2880, 128, 4
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 64
CLAMP = 7.0  # GPT-OSS's clamp of the GLU halves (activation_torch.py holds alpha and the offset)
REPS, WARM = 10, 3
CONFIGS = [  # name, micro-batch x sequence (tokens per device), local experts
    ("ep8-mbs1-s4096", 4096, 16),
    ("ep8-mbs4-s4096", 16384, 16),
    ("ep64-mbs4-s4096", 16384, 2),
    ("ep64-mbs1-s8192", 8192, 2),
]
ATTENTION = [(1, 4096), (1, 8192), (4, 4096)]  # micro-batch, sequence


def rows(tokens, local):
    return tokens * TOPK, tokens * TOPK // local


def dry_run():
    for name, tokens, local in CONFIGS:
        r, n = rows(tokens, local)
        fl = 2 * r * H * FFN * 3  # fc1 (gated: 2 FFN) and fc2
        print(f"{name}: {r} rows, {local} experts of {n}, expert GEMM forward {fl / 1e12:.3f} TFLOP")


def main(out_path):
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    bf16 = torch.bfloat16
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda": torch.version.cuda, "python": platform.python_version(),
              "cpu": platform.processor() or platform.machine(), "reps": REPS, "configs": {}, "attention": []}

    def events_time(fn):
        return median_ms(torch, fn, REPS, WARM)

    def kernels(fn):
        """Every device kernel of one call: name -> [count, total us]."""
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        out = {}
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                us = e.time_range.elapsed_us()
                c = out.setdefault(e.name[:120], [0, 0.0])
                c[0] += 1
                c[1] += us
        return out

    streams = [torch.cuda.Stream() for _ in range(4)]

    def per_expert(counts, nstreams, gemm):
        """gemm(i, start, n) for each expert, round-robin over `nstreams` streams (1: the current one),
        each stream waiting for the work queued before and the current stream for all of them (as
        Transformer Engine's multi-stream grouped GEMM)."""
        cur = torch.cuda.current_stream()
        if nstreams > 1:
            ev = torch.cuda.Event()
            ev.record(cur)
        start = 0
        for i, n in enumerate(counts):
            s = streams[i % nstreams] if nstreams > 1 else cur
            if nstreams > 1:
                s.wait_event(ev)
            with torch.cuda.stream(s):
                gemm(i, start, n)
            start += n
        if nstreams > 1:
            for s in streams[:nstreams]:
                cur.wait_stream(s)

    def grouped_gemm(x, w, counts, nstreams, out_cols, transpose_w):
        """One cuBLAS GEMM per expert into one buffer: y_e = x_e @ w_e (w_e [K, N]) or x_e @ w_e^T."""
        y = torch.empty(x.shape[0], out_cols, device=dev, dtype=bf16)
        per_expert(counts, nstreams, lambda i, a, n: torch.mm(x[a:a + n], w[i].t() if transpose_w else w[i],
                                                              out=y[a:a + n]))
        return y

    def wgrad(x, g, counts, nstreams, shape):
        """Per expert dW_e = x_e^T g_e into [L, K, N]."""
        dw = torch.empty(shape, device=dev, dtype=bf16)
        per_expert(counts, nstreams, lambda i, a, n: torch.mm(x[a:a + n].t(), g[a:a + n], out=dw[i]))
        return dw

    class GroupedLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, counts, nstreams):
            ctx.save_for_backward(x, w)
            ctx.counts, ctx.nstreams = counts, nstreams
            return grouped_gemm(x, w, counts, nstreams, w.shape[2], False)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            dx = grouped_gemm(g.contiguous(), w, ctx.counts, ctx.nstreams, w.shape[1], True)
            dw = wgrad(x, g.contiguous(), ctx.counts, ctx.nstreams, w.shape)
            return dx, dw, None, None

    class TorchGrouped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, offs):
            ctx.save_for_backward(x, w, offs)
            return torch._grouped_mm(x, w, offs=offs)

        @staticmethod
        def backward(ctx, g):
            x, w, offs = ctx.saved_tensors
            g = g.contiguous()
            dx = torch._grouped_mm(g, w.contiguous().transpose(-2, -1), offs=offs)
            dw = torch._grouped_mm(x.t(), g, offs=offs)
            return dx, dw, None

    wqg_fwd, wqg_back = activation_functions(torch, F)["weighted quick-geglu"]

    compiled = {"fwd": wqg_fwd, "back": wqg_back, "mode": "eager"}
    try:
        compiled["fwd"] = torch.compile(wqg_fwd, dynamic=True)
        compiled["back"] = torch.compile(wqg_back, dynamic=True)
        compiled["mode"] = "torch.compile"
    except Exception:  # noqa: BLE001 - recorded below
        traceback.print_exc()

    class WeightedQuickGeglu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, p):
            ctx.save_for_backward(y, p)
            return compiled["fwd"](y, p)

        @staticmethod
        def backward(ctx, g):
            y, p = ctx.saved_tensors
            return compiled["back"](g, y, p)

    def clamp_cat(y):
        a, b = y.chunk(2, -1)
        return torch.cat((a.clamp(min=None, max=CLAMP), b.clamp(min=-CLAMP, max=CLAMP)), -1)

    def apply_bias(t, b2, counts, p):
        return torch.cat([u + bb * pp for u, bb, pp in zip(torch.split(t, counts), b2, torch.split(p, counts))]
                         ).to(t.dtype)

    for name, tokens, local in CONFIGS:
        rec = {"tokens": tokens, "local_experts": local}
        result["configs"][name] = rec
        try:
            r, n = rows(tokens, local)
            counts = [n] * local
            rec.update(rows=r, rows_per_expert=n)
            x = (torch.rand(r, H, device=dev) * 2 - 1).to(bf16).requires_grad_()
            w1 = ((torch.rand(local, H, 2 * FFN, device=dev) * 2 - 1) / H ** 0.5).to(bf16).requires_grad_()
            b1 = (torch.rand(2 * FFN, device=dev) * 0.1).to(bf16)
            w2 = ((torch.rand(local, FFN, H, device=dev) * 2 - 1) / FFN ** 0.5).to(bf16).requires_grad_()
            b2 = [(torch.rand(H, device=dev) * 0.1).to(bf16).requires_grad_() for _ in range(local)]
            p = torch.rand(r, 1, device=dev).requires_grad_()
            offs = torch.tensor([n * (i + 1) for i in range(local)], device=dev, dtype=torch.int32)

            # Checks: the per-expert GEMM against float32 on expert 0's first 64 rows, and every path
            # against the 1-stream one.
            y1 = GroupedLinear.apply(x, w1, counts, 1)
            ref = x[:64].float() @ w1[0].float()
            rec["check_fc1_rel"] = float(((y1[:64].float() - ref).norm() / ref.norm()).item())
            y4 = GroupedLinear.apply(x, w1, counts, 4)
            rec["check_4streams_rel"] = float(((y4.float() - y1.float()).norm() / y1.float().norm()).item())
            has_grouped = hasattr(torch, "_grouped_mm")
            if has_grouped:
                try:
                    w1t = w1.detach().transpose(-2, -1).contiguous().transpose(-2, -1)
                    yg = torch._grouped_mm(x.detach(), w1t, offs=offs)
                    rec["check_grouped_rel"] = float(((yg.float() - y1.float()).norm() / y1.float().norm()).item())
                except Exception as e:  # noqa: BLE001
                    rec["grouped_error"] = repr(e)[:300]
                    has_grouped = False
            ok = rec["check_fc1_rel"] < 1e-2 and rec["check_4streams_rel"] < 1e-3
            rec["checks_ok"] = ok
            del y1, y4

            def path(nstreams, with_bias=True, with_clamp=True):
                h1 = GroupedLinear.apply(x, w1, counts, nstreams) + b1
                a = WeightedQuickGeglu.apply(clamp_cat(h1) if with_clamp else h1, p)
                h2 = GroupedLinear.apply(a, w2, counts, nstreams)
                return apply_bias(h2, b2, counts, p) if with_bias else h2

            leaves = [x, w1, w2, p] + b2
            grads = {}

            def fb(f):
                def run():
                    for t in leaves + [h1s, h2s, a2]:
                        t.grad = None
                    y = f()
                    if y.shape not in grads:
                        grads[y.shape] = (torch.rand(y.shape, device=dev) * 2 - 1).to(y.dtype)
                    y.backward(grads[y.shape])
                return run

            pieces = {}
            h1s = (torch.rand(r, 2 * FFN, device=dev) * 8 - 4).to(bf16).requires_grad_()
            h2s = (torch.rand(r, H, device=dev) * 2 - 1).to(bf16).requires_grad_()
            a2 = (torch.rand(r, FFN, device=dev) * 2 - 1).to(bf16).requires_grad_()
            # The GEMMs alone.
            for ns in (1, 4):
                pieces[f"fc1 gemm, {ns} stream(s)"] = (lambda ns=ns: GroupedLinear.apply(x, w1, counts, ns))
                pieces[f"fc2 gemm, {ns} stream(s)"] = (lambda ns=ns: GroupedLinear.apply(a2, w2, counts, ns))
            if has_grouped:
                w1g = w1.detach().transpose(-2, -1).contiguous().transpose(-2, -1).requires_grad_()
                w2g = w2.detach().transpose(-2, -1).contiguous().transpose(-2, -1).requires_grad_()
                leaves += [w1g, w2g]
                pieces["fc1 torch._grouped_mm"] = lambda: TorchGrouped.apply(x, w1g, offs)
                pieces["fc2 torch._grouped_mm"] = lambda: TorchGrouped.apply(a2, w2g, offs)
            pieces["fc1 bias add"] = lambda: h1s + b1
            pieces["clamp + cat"] = lambda: clamp_cat(h1s)
            pieces["weighted quick-geglu (" + compiled["mode"] + ")"] = lambda: WeightedQuickGeglu.apply(h1s, p)
            pieces["fc2 bias (_apply_bias)"] = lambda: apply_bias(h2s, b2, counts, p)
            pieces["whole path, 1 stream"] = lambda: path(1)
            pieces["whole path, 4 streams"] = lambda: path(4)
            pieces["whole path, 4 streams, no clamp, no fc2 bias"] = lambda: path(4, False, False)
            out = {}
            for k, f in pieces.items():
                try:
                    fwd = events_time(f)
                    both = events_time(fb(f))
                    out[k] = {"forward_ms": fwd, "forward_backward_ms": both, "host_forward_ms": host_ms(torch, f, REPS)}
                except Exception as e:  # noqa: BLE001
                    out[k] = {"error": repr(e)[:300]}
                print(name, k, out[k], flush=True)
            rec["pieces"] = out
            rec["gemm_tflops_fwd_4streams"] = 2 * r * H * FFN * 3 / (out["fc1 gemm, 4 stream(s)"]["forward_ms"]
                                                                    + out["fc2 gemm, 4 stream(s)"]["forward_ms"]) / 1e9
            try:
                rec["kernels_whole_path_4streams"] = kernels(fb(lambda: path(4)))
            except Exception as e:  # noqa: BLE001
                rec["kernels_error"] = repr(e)[:300]
            pieces = grads = None  # free the closures (the tensors go with the next configuration)
            torch.cuda.empty_cache()
            save(result, out_path)
        except Exception:  # noqa: BLE001
            rec["error"] = traceback.format_exc()[-1500:]
            print(rec["error"], flush=True)
    result["activation_mode"] = compiled["mode"]

    from torch.nn.attention import SDPBackend, sdpa_kernel
    for b, s in ATTENTION:
        for heads, kv, hd in ((HEADS, KV_HEADS, HEAD_DIM), (HEADS // 2, KV_HEADS // 2, 2 * HEAD_DIM)):
            # The key-value heads repeated to the query heads (the kernels' FLOPs are the same; GQA
            # only reads fewer bytes), so that every backend takes the same call.
            q = torch.randn(b, heads, s, hd, device=dev, dtype=bf16, requires_grad=True)
            k = torch.randn(b, kv, s, hd, device=dev, dtype=bf16).repeat_interleave(heads // kv, 1).requires_grad_()
            v = torch.randn(b, kv, s, hd, device=dev, dtype=bf16).repeat_interleave(heads // kv, 1).requires_grad_()
            g = torch.randn(b, heads, s, hd, device=dev, dtype=bf16)
            useful = 2 * 2 * b * heads * s * s * hd / 2  # causal: half of Q K^T and P V
            for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
                rec = {"batch": b, "sequence": s, "heads": heads, "kv_heads": kv, "head_dim": hd, "backend": backend}
                try:
                    with sdpa_kernel(getattr(SDPBackend, backend)):
                        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)

                        def both():
                            q.grad = k.grad = v.grad = None
                            f().backward(g)
                        rec["forward_ms"] = events_time(f)
                        rec["forward_backward_ms"] = events_time(both)
                    rec["forward_tflops"] = useful / rec["forward_ms"] / 1e9
                    rec["forward_backward_tflops"] = 3.5 * useful / rec["forward_backward_ms"] / 1e9
                except Exception as e:  # noqa: BLE001
                    rec["error"] = repr(e)[:300]
                print(rec, flush=True)
                result["attention"].append(rec)
            q = k = v = g = None
            save(result, out_path)
    save(result, out_path)


if __name__ == "__main__":
    command_line(__doc__, main, dry_run)
