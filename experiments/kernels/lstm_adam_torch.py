#!/usr/bin/env python3
"""What issue 29's last unexplained rows need measured: the per-time-step cost of a cuDNN LSTM and
the per-call cost of an unfused optimizer loop, in PyTorch eager mode (run once on an H200: h200/issue29/).

pipegrid costs an LSTM time step as two launches per direction and pass (the recurrent GEMM of
[B, H] by [H, 4H], then the gates' element-wise kernel), each paying the device's kernel start-up
(core/models/builder.cc, ModelBuilder::lstm), and an optimizer step as memory traffic only
(core/device.cc, optimizer_step_time). Since the sixteenth session the V100's fp16 steps also pay
a measured `recurrent_step` (31 us, DeepBench's cuDNN LSTM: experiments/kernels/deepbench), which
took DLE's GNMT on one V100 in amp from +28% to +7%; the A100 has none (no measurement), and GNMT on
one A100 in amp stays -30% (docs/accuracy.md, known misses). This measures, on the machine it runs
on:

1. LSTM, GNMT's shapes (batch 128, hidden 1024, 50 steps; input 1024, and 2048 for the decoder's
   layers fed the attention context), fp16 and fp32, one unidirectional layer through torch.nn.LSTM
   (cuDNN): forward, and forward + backward, per time step; beside it the per-step recurrent GEMM
   alone (torch.mm, back to back) and the all-steps input projection, so that the per-step time can
   be set against GEMM + launch. Each LSTM is timed twice: as PyTorch calls it (its cuDNN heuristic,
   `get_algo` in aten/src/ATen/native/cudnn/RNN.cpp, picks the persistent algorithm for fp16 at
   these shapes on Volta with 40 steps or more, and on sm80 and later GPUs of 98 SMs or more, sm86
   excluded, at batches <= 128 that are multiples of 8) and with the
   input packed at equal lengths, which the heuristic always runs with the standard algorithm, the one
   DeepBench measured. The standard algorithm's per-step time, less the input projection's share
   (measured beside it) and the step's GEMM and gate kernels as pipegrid costs them
   (experiments/kernels/deepbench/compare.py), is the device's `recurrent_step`.
2. Optimizer steps over two models' parameter lists, as their scripts hold them: DLE's GNMT v2 with
   the shared embedding (44 tensors, 160.7 M parameters; docs/accuracy.md lists them) and BERT-Large
   with SQuAD's span head (393 tensors): torch.optim.Adam with foreach=False (the per-tensor loop of
   PyTorch 1.x), foreach=True and fused=True. Per step: the time, the number of GPU kernels (the
   profiler's count), and the bytes an fp32 loop moves (21 passes of 4 bytes per parameter, as
   core/device.h counts torch.optim's Adam); per-call cost = (time - bytes / copy bandwidth) / kernels.

Each figure is the median of REPS repetitions after warm-up. Run on the device machine:

    python3 experiments/kernels/lstm_adam_torch.py OUT.json          # needs a GPU and PyTorch
    python3 experiments/kernels/lstm_adam_torch.py --smoke           # tiny shapes on the CPU (no GPU)
    python3 experiments/kernels/lstm_adam_torch.py --check PIPEGRID  # the parameter lists against the zoo

The two parameter lists are written from the models' module structure; --check (a ctest) holds
their sums to pipegrid's zoo, counted independently by its builders: DLE's GNMT to `gnmt8
shared_embedding=1`, BERT-Large's to `bert-large` plus the span head (h x 2 + 2, which the zoo leaves
out).
"""
import json
import platform
import statistics
import sys
import time

REPS = 7


def gnmt_shapes(h=1024, vocab=32320):
    """DLE GNMT v2 (4 + 4 layers, shared embedding): 44 parameter tensors."""
    s = [(vocab, h)]  # the shared embedding
    lstm = lambda i: [(4 * h, i), (4 * h, h), (4 * h,), (4 * h,)]  # w_ih, w_hh, b_ih, b_hh
    s += lstm(h) + lstm(h)  # encoder layer 1, bidirectional
    s += lstm(2 * h) + lstm(h) + lstm(h)  # encoder layers 2-4
    s += lstm(h) + lstm(2 * h) + lstm(2 * h) + lstm(2 * h)  # decoder layers 1-4 (2-4 with the context)
    s += [(h, h), (h, h), (h,), (1,), (h,)]  # attention: query and key projections, v, scale, bias
    s += [(vocab, h), (vocab,)]  # classifier
    assert len(s) == 44
    return s


def bert_shapes(layers=24, h=1024, vocab=30522, positions=512):
    """BERT-Large with SQuAD's span head: 393 parameter tensors."""
    s = [(vocab, h), (positions, h), (2, h), (h,), (h,)]  # embeddings and their LayerNorm
    for _ in range(layers):
        s += [(h, h), (h,)] * 4 + [(h,), (h,)]  # Q, K, V, output; LayerNorm
        s += [(4 * h, h), (4 * h,), (h, 4 * h), (h,), (h,), (h,)]  # FFN; LayerNorm
    s += [(h, h), (h,), (2, h), (2,)]  # pooler, span head
    assert len(s) == 393
    return s


def median_time(torch, fn, dev, reps=REPS, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def kernels_per_call(torch, fn, dev):
    """GPU kernels one call of fn launches (the profiler's device events); None on the CPU."""
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def lstm_part(torch, dev, dtype, B, H, I, T):
    lstm = torch.nn.LSTM(I, H).to(dev, dtype)
    x = torch.randn(T, B, I, device=dev, dtype=dtype, requires_grad=True)
    fwd = lambda: lstm(x)

    def fwd_bwd():
        y, _ = lstm(x)
        y.sum().backward()

    a, w = torch.randn(B, H, device=dev, dtype=dtype), torch.randn(H, 4 * H, device=dev, dtype=dtype)
    steps = lambda: [torch.mm(a, w) for _ in range(T)]
    xi, wi = torch.randn(T * B, I, device=dev, dtype=dtype), torch.randn(I, 4 * H, device=dev, dtype=dtype)
    proj = lambda: torch.mm(xi, wi)
    r = {"dtype": str(dtype).split(".")[-1], "batch": B, "hidden": H, "input": I, "steps": T}
    r["forward_per_step_s"] = median_time(torch, fwd, dev) / T
    r["forward_backward_per_step_s"] = median_time(torch, fwd_bwd, dev) / T
    # Packed input (every sequence T long): PyTorch never picks a persistent algorithm for packed
    # input, so this is cuDNN's standard algorithm at the same shape.
    pack = torch.nn.utils.rnn.pack_padded_sequence
    packed = lambda: pack(x, [T] * B)

    def fwd_bwd_packed():
        y, _ = lstm(packed())
        y.data.sum().backward()

    r["forward_per_step_packed_s"] = median_time(torch, lambda: lstm(packed()), dev) / T
    r["forward_backward_per_step_packed_s"] = median_time(torch, fwd_bwd_packed, dev) / T
    r["recurrent_gemm_s"] = median_time(torch, steps, dev) / T
    r["input_projection_per_step_s"] = median_time(torch, proj, dev) / T
    r["forward_kernels_per_step"] = (lambda k: k / T if k is not None else None)(kernels_per_call(torch, fwd, dev))
    return r


def copy_bandwidth(torch, dev, n):
    a = torch.empty(n, device=dev, dtype=torch.float32).uniform_()
    b = torch.empty_like(a)
    return 2 * 4 * n / median_time(torch, lambda: b.copy_(a), dev)


def optimizer_part(torch, dev, name, shapes, bandwidth):
    params = [torch.nn.Parameter(torch.randn(*s, device=dev, dtype=torch.float32) * 0.01) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    n = sum(p.numel() for p in params)
    out = []
    variants = [("foreach=False", {"foreach": False}), ("foreach=True", {"foreach": True})]
    if dev.type == "cuda":
        variants.append(("fused=True", {"fused": True}))
    for label, kw in variants:
        opt = torch.optim.Adam(params, lr=1e-4, **kw)
        t = median_time(torch, opt.step, dev)
        k = kernels_per_call(torch, opt.step, dev)
        moved = 21 * 4 * n  # core/device.h: torch.optim Adam's 21 passes over fp32 tensors
        r = {"model": name, "tensors": len(shapes), "parameters": n, "variant": label, "step_s": t,
             "kernels": k, "bytes_21_passes": moved, "memory_time_s": moved / bandwidth}
        if k:
            r["per_call_s"] = (t - moved / bandwidth) / k
        out.append(r)
        print(json.dumps(r), flush=True)
    return out


def check(pipegrid):
    import math
    import subprocess

    def zoo(*args):
        out = subprocess.run([pipegrid, "workload", "show", *args, "--json"], check=True, capture_output=True,
                             text=True).stdout
        return json.loads(out)["parameters"]

    cases = [("DLE GNMT v2, 44 tensors", sum(math.prod(t) for t in gnmt_shapes()),
              zoo("gnmt8", "--arg", "shared_embedding=1")),
             ("BERT-Large + span head, 393 tensors", sum(math.prod(t) for t in bert_shapes()),
              zoo("bert-large", "--arg", "sequence=512") + 2 * 1024 + 2)]
    bad = 0
    for name, listed, counted in cases:
        ok = listed == counted
        bad += not ok
        print(f"{'ok' if ok else 'FAIL'}   {name}: listed {listed:,}, zoo {counted:,}")
    return 1 if bad else 0


def main(argv):
    if argv[:1] == ["--check"]:
        return check(argv[1])
    import torch
    smoke = "--smoke" in argv
    if smoke:
        dev = torch.device("cpu")
        B, H, T, scale = 4, 16, 5, 16
    else:
        assert torch.cuda.is_available(), "needs a GPU (or --smoke for the CPU)"
        dev = torch.device("cuda")
        B, H, T, scale = 128, 1024, 50, 1
    info = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "reps": REPS, "smoke": smoke}
    print(json.dumps(info), flush=True)
    res = {"info": info, "lstm": [], "optimizer": []}
    for dtype in (torch.float16, torch.float32) if not smoke else (torch.float32,):
        for inp in (H, 2 * H):
            r = lstm_part(torch, dev, dtype, B, H, inp, T)
            print(json.dumps(r), flush=True)
            res["lstm"].append(r)
    bw = copy_bandwidth(torch, dev, (1 << 28) // scale ** 2)
    res["copy_bandwidth_Bps"] = bw
    res["optimizer"] += optimizer_part(torch, dev, "gnmt-dle", gnmt_shapes(H, 32320 // scale), bw)
    res["optimizer"] += optimizer_part(torch, dev, "bert-large-squad",
                                       bert_shapes(24, H, 30522 // scale, 512 // scale), bw)
    args = [a for a in argv if not a.startswith("--")]
    if args:
        with open(args[0], "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
