#!/usr/bin/env python3
"""The experts' grouped GEMMs at the per-device cuts of experiments/moe's rows, measured in PyTorch on
the machine it runs on (issue 50, item 8: "the expert GEMMs are grouped GEMMs with their own
efficiency class (cite or measure it)").

pipegrid costs a grouped GEMM as Transformer Engine's grouped linear runs it for Megatron-Core's
TEGroupedMLP (nvte_multi_tensor_gemm, v2.9): one cuBLAS GEMM per local expert, round-robin over 4
compute streams, each wave of 4 paying one kernel start-up, the FLOPs at the device's `gemm`
efficiency (core/block_kernels.cc). That efficiency was measured on dense tensor-parallel shapes
(experiments/kernels/results.md: 1,000+ rows, K and N of 1,024+); the fine-grained MoE models cut
each expert's GEMM far smaller (Qwen3-30B-A3B on EP 8: 2,048 rows of 2,048 x 1,536 per expert,
DeepSeek-V3 on EP 8: 1,024 rows). This measures, for each cut, the six GEMMs of one MoE layer's experts
(fc1 and fc2; forward, data gradient, weight gradient) over all local experts:

- `bf16`: torch.mm per expert into one output buffer (cuBLAS, bf16 in and out, fp32 accumulate), on
  4 streams round-robin as TE does, and on 1 stream;
- `fp8`: torch._scaled_mm per expert (cuBLASLt FP8, e4m3 operands with one scale per tensor, bf16 out:
  Transformer Engine's per-tensor scaling as the rows' `fp8` precision runs it), on 4 streams and
  1; each operand laid out as Hopper's FP8 GEMM takes it (TN), as TE's column-wise copies provide
  (the copies' quantization is not timed here: pipegrid costs it as its own kernels);
- `grouped`: torch._grouped_mm (one kernel for all experts, bf16) where PyTorch has it, for reference.

Each group is timed between two CUDA events (the median of REPS calls after WARM, each synchronised
alone, cuda_timing.py) and the host's time to issue it (perf_counter, no synchronisation inside).
Checked first, on every GEMM of every cut, the output poisoned with NaN before each: expert 0's bf16
result against a float32 reference (relative error < 1e-2), the 4-stream result against the 1-stream
one (< 1e-3), expert 0's fp8 result against the same reference (< 0.1, which reductions of 16,384 and
more miss: Hopper's FP8 accumulation, grouped.md); a failed check clears the record's `ok`.

Cuts (balanced routing; rows per local expert = EP x ETP x tokens per device x top-k / experts, tokens
per device = micro-batch x 4,096 / TP): see CUTS; shapes from the zoo (core/zoo_moe.cc, each cited).

    python3 experiments/kernels/grouped_gemm_torch.py OUT.json   # needs a GPU and PyTorch
    python3 experiments/kernels/grouped_gemm_torch.py --dry-run  # the cuts, GEMMs and FLOPs
"""
import platform
import traceback

from cuda_timing import command_line, host_ms, median_ms, record

REPS, WARM = 20, 5
# name, hidden h, expert FFN f (per device: f / ETP), gated, local experts, rows per local expert
CUTS = [
    ("qwen3-30b ep8 mbs1", 2048, 768, True, 16, 2048),
    ("qwen3-30b ep8 mbs2", 2048, 768, True, 16, 4096),
    ("qwen3-30b ep8 mbs4", 2048, 768, True, 16, 8192),
    ("qwen3-30b ep16 mbs1", 2048, 768, True, 8, 4096),
    ("qwen3-235b ep8 mbs1", 4096, 1536, True, 16, 2048),
    ("qwen3-235b ep32 tp2 mbs1", 4096, 1536, True, 4, 4096),
    ("qwen3-235b ep32 mbs1", 4096, 1536, True, 4, 8192),
    ("deepseek-v3 ep8 mbs1", 7168, 2048, True, 32, 1024),
    ("deepseek-v3 ep32 mbs1", 7168, 2048, True, 8, 4096),
    ("deepseek-v3 ep64 mbs1", 7168, 2048, True, 4, 8192),
    ("mixtral-8x22b tp4 ep8 etp4", 6144, 4096, True, 1, 8192),
    ("mixtral-8x22b tp2 ep8 etp1", 6144, 16384, True, 1, 4096),
    ("mixtral-8x22b tp2 ep4 etp2", 6144, 8192, True, 2, 4096),
    ("gpt-oss-120b ep8 mbs1", 2880, 2880, True, 16, 1024),
    ("gpt-oss-120b ep8 mbs4", 2880, 2880, True, 16, 4096),
    ("gpt-oss-120b ep64 mbs4", 2880, 2880, True, 2, 32768),
]


def gemms(h, f, gated, rows):
    """The six GEMMs of one expert as (name, M, N, K): Y[M, N] = X[M, K] W[K, N]."""
    n1 = (2 if gated else 1) * f
    return [("fc1 fwd", rows, n1, h), ("fc1 dgrad", rows, h, n1), ("fc1 wgrad", n1, h, rows),
            ("fc2 fwd", rows, h, f), ("fc2 dgrad", rows, f, h), ("fc2 wgrad", h, f, rows)]


def dry_run():
    for name, h, f, gated, local, rows in CUTS:
        flops = sum(2 * m * n * k for _, m, n, k in gemms(h, f, gated, rows)) * local
        print(f"{name}: h {h}, f {f}, {local} local experts x {rows} rows, "
              f"{flops / 1e9:.1f} GFLOP per layer (forward + backward)")


def main(out_path):
    import torch

    dev = torch.device("cuda")
    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "python": platform.python_version(), "reps": REPS, "warm": WARM, "cuts": []}
    streams = [torch.cuda.Stream() for _ in range(4)]

    def per_expert(local, nstreams, gemm):
        """gemm(i) for each local expert, round-robin over `nstreams` streams (1: the current one), each
        stream waiting for the work queued before and the current stream for all of them."""
        cur = torch.cuda.current_stream()
        if nstreams == 1:
            for i in range(local):
                gemm(i)
            return
        ev = torch.cuda.Event()
        ev.record(cur)
        for i in range(local):
            s = streams[i % nstreams]
            s.wait_event(ev)
            with torch.cuda.stream(s):
                gemm(i)
        for s in streams[:min(nstreams, local)]:  # only the streams given work (a CUDA graph's capture
            cur.wait_stream(s)                     # rejects a join with an idle stream)

    one = torch.ones((), device=dev, dtype=torch.float32)
    # Warm the chip as kbench does before its GEMMs (the power-capped steady rate, README.md).
    a = torch.randn(8192, 8192, device=dev, dtype=bf16)
    for _ in range(200):
        torch.mm(a, a)
    torch.cuda.synchronize()
    a = None
    for name, h, f, gated, local, rows in CUTS:
        for gname, m, n, k in gemms(h, f, gated, rows):
            rec = {"cut": name, "gemm": gname, "local": local, "m": m, "n": n, "k": k,
                   "flops": 2.0 * m * n * k * local}
            try:
                # Operands per expert: A[M, K] row-major, B as W[N, K] row-major used transposed (TN).
                A = (torch.rand(local, m, k, device=dev) * 2 - 1).to(bf16)
                Bt = ((torch.rand(local, n, k, device=dev) * 2 - 1) / k ** 0.5).to(bf16)
                C = torch.empty(local, m, n, device=dev, dtype=bf16)
                A8, B8 = A.to(e4m3), Bt.to(e4m3)
                bf = lambda i: torch.mm(A[i], Bt[i].t(), out=C[i])  # noqa: E731
                f8 = lambda i: torch._scaled_mm(A8[i], B8[i].t(), one, one, out_dtype=bf16, out=C[i])  # noqa: E731
                # Transformer Engine's FP8 recipes run the forward GEMM with fast accumulation
                # (use_split_accumulator off) and the two gradients' GEMMs without it.
                f8fast = lambda i: torch._scaled_mm(A8[i], B8[i].t(), one, one, out_dtype=bf16, out=C[i],  # noqa: E731
                                                    use_fast_accum=True)
                ref = (A[0].float() @ Bt[0].float().t())
                C.fill_(float("nan"))  # poisoned before each check
                per_expert(local, 4, bf)
                torch.cuda.synchronize()
                rec["check_bf16_rel"] = float(((C[0].float() - ref).norm() / ref.norm()).item())
                c4 = C.clone()
                C.fill_(float("nan"))
                per_expert(local, 1, bf)
                rec["check_4streams_rel"] = float(((C.float() - c4.float()).norm() / c4.float().norm()).item())
                C.fill_(float("nan"))
                per_expert(local, 4, f8)
                rec["check_fp8_rel"] = float(((C[0].float() - ref).norm() / ref.norm()).item())
                rec["ok"] = (rec["check_bf16_rel"] < 1e-2 and rec["check_4streams_rel"] < 1e-3
                             and rec["check_fp8_rel"] < 0.1)
                for label, g in (("bf16", bf), ("fp8", f8), ("fp8fast", f8fast)):
                    for ns in (4, 1):
                        fn = lambda g=g, ns=ns: per_expert(local, ns, g)  # noqa: E731
                        rec[f"{label}_{ns}s_ms"] = median_ms(torch, fn, REPS, WARM)
                        rec[f"{label}_{ns}s_host_ms"] = host_ms(torch, fn, REPS)
                    # The same 4-stream launches captured in a CUDA graph and replayed: the device's
                    # time without the host's (the events above see whichever of the two is longer).
                    graph = torch.cuda.CUDAGraph()
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        per_expert(local, 4, g)  # warm-up outside the capture, as torch.cuda.graphs asks
                    torch.cuda.current_stream().wait_stream(side)
                    with torch.cuda.graph(graph):
                        per_expert(local, 4, g)
                    rec[f"{label}_4s_graph_ms"] = median_ms(torch, graph.replay, REPS, WARM)
                    graph = None
                if hasattr(torch, "_grouped_mm"):
                    if gname.endswith("wgrad"):  # each expert's rows are the reduction: offsets along K
                        G = A.transpose(1, 2).reshape(local * k, m).t()  # dY^T of all experts, [M, E K]
                        R = Bt.transpose(1, 2).reshape(local * k, n)  # X of all experts, [E K, N]
                        offs = torch.arange(1, local + 1, device=dev, dtype=torch.int32) * k
                        fn = lambda: torch._grouped_mm(G, R, offs=offs)  # noqa: E731
                    else:  # offsets along M
                        X = A.reshape(local * m, k)
                        W = Bt.transpose(1, 2)  # [E, K, N]
                        offs = torch.arange(1, local + 1, device=dev, dtype=torch.int32) * m
                        fn = lambda: torch._grouped_mm(X, W, offs=offs)  # noqa: E731
                    try:
                        rec["grouped_ms"] = median_ms(torch, fn, REPS, WARM)
                    except Exception as e:  # noqa: BLE001
                        rec["grouped_error"] = repr(e)[:300]
                A = Bt = C = A8 = B8 = None
            except Exception:  # noqa: BLE001
                rec["error"] = traceback.format_exc()[-1500:]
            record(result, "cuts", rec, out_path)


if __name__ == "__main__":
    command_line(__doc__, main, dry_run)
