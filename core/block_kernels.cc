#include "core/block_kernels.h"

#include <algorithm>
#include <cmath>

namespace pipegrid::blocks {

Kernel kernel(KernelClass cls, double fwd, double bwd_in, double bwd_w, double fwd_bytes, double bwd_bytes,
              double weight_bytes, double calls) {
  return Kernel{cls, fwd, bwd_in, bwd_w, fwd_bytes, bwd_bytes, weight_bytes, calls};
}

Kernel scaled(Kernel k, double f) {
  k.forward_flops *= f;
  k.backward_input_flops *= f;
  k.backward_weight_flops *= f;
  k.forward_bytes *= f;
  k.backward_bytes *= f;
  return k;
}

namespace {

// One norm's parameters (replicated): its scale, and LayerNorm's bias where the block has biases.
double norm_parameters(const TensorSplit& sp) {
  return sp.biases && sp.norm_biases ? 2 * sp.hidden : sp.hidden;
}

// A linear layer's GEMM (in and out elements per sample): the backward's input- and weight-gradient
// GEMMs each as many FLOPs as the forward, twice its activation traffic. An fp8 training runs it in
// FP8 (Kernel::fp8).
Kernel gemm(double flops, double in, double out, double weights, double eb,
            KernelClass cls = KernelClass::Gemm) {
  Kernel k = kernel(cls, flops, flops, flops, (in + out) * eb, 2 * (in + out) * eb, weights * eb);
  k.fp8 = true;
  k.fp8_in = in;
  k.fp8_out = out;
  return k;
}

// Element-wise and normalisation passes: the backward moves 1.5 times the forward's bytes.
Kernel pass(KernelClass cls, double bytes, double calls = 1) {
  return kernel(cls, 0, 0, 0, bytes, 1.5 * bytes, 0, calls);
}

// The attention core over `scores` = heads x s^2 / t scores, its FLOPs and the bytes of Q, K, V and
// the output (core/models/builder.cc's score_core, score_passes, use_attention): unfused, two
// batched GEMMs that write and read the scores, and four element-wise passes over them (scale, mask,
// softmax, dropout: 8 eb + 1 bytes per score forward, 7 eb + 1 backward; Megatron's fusions two
// passes of 4 eb + 1 and 5 eb + 1); fused (FlashAttention), one kernel per pass, no score traffic, the
// backward recomputing Q K^T. A causal fused core skips the masked half of the FLOPs (unfused, every
// score is computed, then masked).
// Keys per query: a sliding window's when the core is fused (FlashAttention and cuDNN skip the keys
// outside it); unfused, every score of the s x s matrix is computed and the window applied as a mask
// (Transformer Engine's UnfusedDotProductAttention turns the window into an arbitrary mask).
double window_keys(const TensorSplit& sp) {
  return sp.window > 0 && sp.fused_attention ? std::min(sp.sequence, sp.window) : sp.sequence;
}

void attention_core(const TensorSplit& sp, double flops, double scores, double qkvo, double eb,
                    Attention& k) {
  if (sp.causal && sp.fused_attention && sp.window <= 0) flops /= 2;  // a window's keys all precede its query
  const double core_io = (qkvo + 2 * scores) * eb;
  if (sp.fused_attention) {
    k.core = kernel(KernelClass::Attention, flops, 2.5 * flops, 0, qkvo * eb, 2 * qkvo * eb, 0, 1);
    k.softmax_dropout = kernel(KernelClass::Elementwise, 0, 0, 0, 0, 0, 0, 0);
  } else {
    k.core = kernel(KernelClass::Attention, flops, 2 * flops, 0, core_io, 2 * core_io, 0, 2);
    k.softmax_dropout =
        sp.megatron_fusion
            ? kernel(KernelClass::Elementwise, 0, 0, 0, (4 * eb + 1) * scores, (5 * eb + 1) * scores, 0, 2)
            : kernel(KernelClass::Elementwise, 0, 0, 0, (8 * eb + 1) * scores, (7 * eb + 1) * scores, 0, 4);
  }
}

// Multi-head latent attention (DeepSeek-V2/V3): the down projections and their norms run whole on
// every device of the group (Megatron-Core builds them unsplit), the up projections and the output
// projection split by heads.
void latent_attention(const TensorSplit& sp, double T, double eb, Attention& k) {
  const double s = sp.sequence, h = sp.hidden, a = sp.heads;
  const double nope = sp.head_dim, rope = sp.mla.rope_dim, v = sp.mla.v_dim, qr = sp.mla.q_rank,
               kr = sp.mla.kv_rank;
  const double qk = a * (nope + rope);  // the queries' (and keys') width over all heads
  double replicated = 0, split = 0;
  if (qr > 0) {
    k.qkv.push_back(gemm(2 * s * h * qr, s * h, s * qr, h * qr, eb));
    k.qkv.push_back(pass(KernelClass::Norm, 2 * s * qr * eb));
    k.qkv.push_back(gemm(2 * s * qr * qk / T, s * qr, s * qk / T, qr * qk / T, eb));
    k.up_proj.push_back(k.qkv.back());
    replicated += h * qr + qr;
    split += qr * qk / T;
  } else {
    k.qkv.push_back(gemm(2 * s * h * qk / T, s * h, s * qk / T, h * qk / T, eb));
    split += h * qk / T;
  }
  k.qkv.push_back(gemm(2 * s * h * (kr + rope), s * h, s * (kr + rope), h * (kr + rope), eb));
  k.qkv.push_back(pass(KernelClass::Norm, 2 * s * kr * eb));
  const double kv_up = a * (nope + v);
  k.qkv.push_back(gemm(2 * s * kr * kv_up / T, s * kr, s * kv_up / T, kr * kv_up / T, eb));
  k.up_proj.push_back(k.qkv.back());
  replicated += h * (kr + rope) + kr;
  split += kr * kv_up / T;
  if (sp.rotary) {
    k.rotary.push_back(pass(KernelClass::Elementwise, 2 * s * (a * rope / T + rope) * eb));
    k.up_proj.push_back(k.rotary.back());
  }
  const double keys = window_keys(sp);
  const double flops = 2 * s * keys * (qk + a * v) / T;
  attention_core(sp, flops, a * s * keys / T, (2 * s * qk + s * a * v + s * a * v) / T, eb, k);
  k.proj = gemm(2 * s * a * v * h / T, s * a * v / T, s * h, a * v * h / T, eb);
  split += a * v * h / T;
  k.parameters = replicated + split + (sp.biases ? h : 0) + norm_parameters(sp);  // proj bias, LN1
  // Q and K (qk wide each), V and the projection's input (a v each); the latents and the down
  // projections' inputs whole on every device.
  k.stash.split = 2 * s * qk + 2 * s * qk + 2 * s * a * v + 2 * s * a * v;
  k.stash.replicated = 2 * s * (qr + kr + rope);
  // fp8 GEMM inputs: the down projections' (LN1's output), the up projections' (the normed latents)
  // and the output projection's.
  k.stash.unsplit_fp8 = 2 * s * h;
  k.stash.replicated_fp8 = 2 * s * (qr + kr);
  k.stash.split_fp8 = 2 * s * a * v;
  k.norm_apart = true;
  k.up_proj_stash = 2 * s * qk + 2 * s * qk + 2 * s * a * v;  // Q, K, V
}

}  // namespace

Attention attention(const TensorSplit& sp, int t, bool sequence_parallel, Precision precision) {
  const double eb = element_bytes(precision);
  const double s = sp.sequence, h = sp.hidden, a = sp.heads, T = t;
  const double seq_share = sequence_parallel ? 1 / T : 1;  // norms, dropouts, residuals
  Attention k;
  const double ln = 2 * s * h * seq_share * eb;
  k.ln1 = kernel(KernelClass::Norm, 0, 0, 0, ln, 1.5 * ln, 0, 1);
  // Dropout (r + w) and residual add (2 r + w), two kernels; Megatron-LM's fused bias-dropout-add
  // one kernel reading the input and the residual and writing the sum (3 s h).
  const double dr = (sp.megatron_fusion ? 3 : 5) * s * h * seq_share * eb;
  k.dropout_residual = kernel(KernelClass::Elementwise, 0, 0, 0, dr, 1.5 * dr, 0, sp.megatron_fusion ? 1 : 2);
  // The unsplit part: LN1's input, QKV's input, the dropout mask (5 s h).
  k.stash.unsplit = 5 * s * h;
  k.stash.scores = sp.fused_attention ? 0 : 5 * a * s * window_keys(sp);
  if (sp.mla.enabled()) {
    latent_attention(sp, T, eb, k);
    return k;
  }
  const double kv = sp.kv_heads > 0 ? sp.kv_heads : a;
  const double hd = sp.head_dim > 0 ? sp.head_dim : h / a;
  const double q = sp.head_dim > 0 ? a * hd : h;  // the queries' width (the core's output)
  const double qkv_out = q + 2 * kv * hd;
  // Weights (and biases) per device: QKV column-parallel, the projection row-parallel (its bias
  // replicated).
  const double w_qkv = h * qkv_out / T + (sp.biases ? qkv_out / T : 0);
  const double w_proj = q * h / T;
  k.qkv = {gemm(2 * s * h * qkv_out / T, s * h, s * qkv_out / T, w_qkv, eb)};
  k.proj = gemm(2 * s * q * h / T, s * q / T, s * h, w_proj, eb);
  const double qkvo = (2 * s * q + 2 * s * kv * hd) / T;  // Q, K, V read and the output written
  const double keys = window_keys(sp);                    // keys per query
  attention_core(sp, 4 * s * keys * q / T, a * s * keys / T, qkvo, eb, k);
  if (sp.qk_norm) {  // the local heads' queries, then keys: read and written, as LN1 (1.5x backward)
    for (const double width : {q, kv * hd}) {
      const double bytes = 2 * s * width / T * eb;
      k.rotary.push_back(kernel(KernelClass::Norm, 0, 0, 0, bytes, 1.5 * bytes, 0, 1));
    }
  }
  if (sp.rotary) {
    const double rot = 2 * s * (q + kv * hd) / T * eb;  // queries and keys, read and written
    k.rotary.push_back(kernel(KernelClass::Elementwise, 0, 0, 0, rot, rot, 0, 1));
  }
  k.parameters = w_qkv + w_proj + (sp.biases ? h : 0) + norm_parameters(sp);  // proj bias, LN1
  if (sp.attention_sinks) k.parameters += a / T;                              // a sink per local head
  if (sp.qk_norm) k.parameters += 2 * hd;  // q_norm and k_norm, whole on every rank
  // Q, K, V (2 s q + 4 s kv hd) and the projection's input (2 s q); with q/k norms their inputs too.
  k.stash.split = 2 * s * q + 4 * s * kv * hd + 2 * s * q + (sp.qk_norm ? 2 * s * (q + kv * hd) : 0);
  // fp8 GEMM inputs: QKV's (LN1's output, LayerNormLinear's ln_out) and the projection's.
  k.stash.unsplit_fp8 = 2 * s * h;
  k.stash.split_fp8 = 2 * s * q;
  return k;
}

Mlp mlp(const TensorSplit& sp, double f, int t, bool sequence_parallel, Precision precision) {
  const double eb = element_bytes(precision);
  const double s = sp.sequence, h = sp.hidden, T = t;
  const double g = sp.gated ? 2 : 1;  // matrices of the first GEMM (gate and up)
  const double seq_share = sequence_parallel ? 1 / T : 1;
  Mlp k;
  const double w_up = h * f * g / T + (sp.biases ? f * g / T : 0);
  const double w_down = f * h / T;
  k.up = gemm(2 * s * h * f * g / T, s * h, s * f * g / T, w_up, eb);
  k.down = gemm(2 * s * f * h / T, s * f / T, s * h, w_down, eb);
  const double act = (sp.gated ? 3 : 2) * s * f / T * eb;
  k.act = kernel(KernelClass::Elementwise, 0, 0, 0, act, 1.5 * act, 0, 1);
  const double dr = (sp.megatron_fusion ? 3 : 5) * s * h * seq_share * eb;
  k.dropout_residual = kernel(KernelClass::Elementwise, 0, 0, 0, dr, 1.5 * dr, 0, sp.megatron_fusion ? 1 : 2);
  const double ln = 2 * s * h * seq_share * eb;
  k.ln2 = kernel(KernelClass::Norm, 0, 0, 0, ln, 1.5 * ln, 0, 1);
  k.parameters = w_up + w_down + (sp.biases ? h : 0) + norm_parameters(sp);  // down bias, LN2
  // LN2's input, the MLP's input, the dropout mask (5 s h); the activation's input and the second
  // GEMM's input (4 s f; gated 6 s f).
  k.stash.unsplit = 5 * s * h;
  k.stash.split = (sp.gated ? 6 : 4) * s * f;
  k.stash.unsplit_fp8 = 2 * s * h;  // the first GEMM's input (LN2's output)
  k.stash.split_fp8 = 2 * s * f;    // the second's (the activation's output)
  return k;
}

namespace {

// Kernels that only launch (a byte each, no FLOPs): forward-only or backward-only (a pass with no work
// launches nothing), `launches` host launches for `calls` device calls.
Kernel forward_only(double calls, double launches) {
  Kernel k = kernel(KernelClass::Elementwise, 0, 0, 0, calls, 0, 0, calls);
  k.launches = launches;
  return k;
}
Kernel backward_only(double calls) {
  return kernel(KernelClass::Elementwise, 0, 0, 0, 0, calls, 0, calls);
}

// The all-to-all dispatcher's launches beyond route, permute and unpermute (MoeLaunches, with the
// counts), and the local-expert sort's memory traffic (`copies` x h elements of eb bytes, each way).
void dispatcher_launches(const MoeLaunches& l, double local, double copies_h, double eb, Moe& k) {
  if (!l.apply) return;
  const bool rf = l.router_fusion, pf = l.permute_fusion;
  k.route.calls = 1;                                        // the routing's first (or only) kernel
  const double before = (rf ? 0 : 10) + 6 + (pf ? 3 : 13);  // score and top-k, preprocessing, permutation
  k.before_dispatch = {forward_only(before, before + 4),    // + the 4 device-to-host copies
                       backward_only((rf ? 0 : 3) + 5 + (pf ? 0 : 5))};
  if (local > 1) {
    const double both = pf ? 2 : 3;
    k.between = {kernel(KernelClass::Gather, 0, 0, 0, 4 * copies_h * eb, 4 * copies_h * eb, 0, both)};
    if (pf) k.between.push_back(forward_only(3, 3));
  }
  if (!pf) k.after_combine = {forward_only(1, 1)};
}

// GPT-OSS's clamped GLU as Megatron-Core runs it (fusions/fused_bias_geglu.py,
// weighted_bias_quick_geglu_impl, core_v0.15 to v0.19): before the fused quick-GEGLU, eager PyTorch
// clamps the gate half from above and the linear half on both sides, then concatenates them, over
// `elements` = the experts' rows x fe per sample (each half). Forward: two clamps of strided views
// (r + w of a half each: strided) and the cat (r + w of both): 8 elements of eb bytes, 3 kernels.
// Backward (PyTorch's clamp_backward: `where(mask, grad, 0)` with a one-byte mask, on the strided
// halves and the cat's strided gradient views): the gate half le + where (3 eb + 2 bytes), the
// linear half ge, le, where (3 eb + 3) and a contiguous logical_and_ (3), the chunk's backward
// concatenating the two gradients (4 eb): 11 eb + 8 bytes, 7 kernels, 5 of them strided. Empty
// without the clamp.
std::vector<Kernel> clamp_kernels(bool clamp, double elements, double eb) {
  if (!clamp) return {};
  return {kernel(KernelClass::Strided, 0, 0, 0, 4 * elements * eb, 0, 0, 2),
          kernel(KernelClass::Elementwise, 0, 0, 0, 4 * elements * eb, 0, 0, 1),
          kernel(KernelClass::Strided, 0, 0, 0, 0, (7 * eb + 5) * elements, 0, 5),
          kernel(KernelClass::Elementwise, 0, 0, 0, 0, (4 * eb + 3) * elements, 0, 2)};
}

// fc2's bias as Megatron-Core's TEGroupedMLP adds it (moe/experts.py `_apply_bias`, core_v0.15 to
// v0.19: skip_bias_add on fc2, then per local expert `t + b * p` in fp32, torch.cat, `.to(dtype)`),
// over `elements` = the experts' output rows x h per sample. Forward: per expert b * p, a broadcast
// writing 4 bytes, and the add of mixed dtypes reading eb + 4 and writing 4 (both strided); the cat
// reads and writes 4, the cast reads 4 and writes eb: 2 eb + 24 bytes, 2 kernels per expert + 2.
// Backward: the cast's (eb + 4) and, per expert, the add's gradient back to t's dtype (4 + eb), b's
// and p's gradients (g * p and g * b, broadcasts with r + w of 4 each: strided; a sum reading 4
// each), the split's concatenation of t's gradients (2 eb): 4 eb + 32 bytes, 5 kernels per expert +
// 2, 2 per expert strided.
std::vector<Kernel> expert_bias_kernels(double local, double elements, double eb) {
  return {kernel(KernelClass::Strided, 0, 0, 0, (eb + 12) * elements, 0, 0, 2 * local),
          kernel(KernelClass::Elementwise, 0, 0, 0, (eb + 12) * elements, 0, 0, 2),
          kernel(KernelClass::Strided, 0, 0, 0, 0, 16 * elements, 0, 2 * local),
          kernel(KernelClass::Elementwise, 0, 0, 0, 0, (4 * eb + 16) * elements, 0, 3 * local + 2)};
}

}  // namespace

Moe moe(const TensorSplit& sp, int t, bool sequence_parallel, const ExpertSizes& e, Precision precision,
        const MoeLaunches& launches) {
  const double eb = element_bytes(precision);
  const MoeShape& m = sp.moe;
  const double s = sp.sequence, h = sp.hidden, T = t, E = m.experts, kk = m.top_k, f = m.expert_ffn;
  const double g = sp.gated ? 2 : 1;
  const double seq_share = sequence_parallel ? 1 / T : 1;
  const double tokens = s * seq_share;  // the device's tokens (per sample)
  Moe k;
  const double ln = 2 * s * h * seq_share * eb;
  k.ln2 = kernel(KernelClass::Norm, 0, 0, 0, ln, 1.5 * ln, 0, 1);
  const double dr = (sp.megatron_fusion ? 3 : 5) * s * h * seq_share * eb;
  k.dropout_residual = kernel(KernelClass::Elementwise, 0, 0, 0, dr, 1.5 * dr, 0, sp.megatron_fusion ? 1 : 2);
  // The router: a GEMM to E logits (replicated weights), then the scores and top-k in fp32.
  k.router = gemm(2 * tokens * h * E, tokens * h, tokens * E, h * E, eb);
  k.router.fp8 = false;  // Megatron's router is not a Transformer Engine layer
  k.route = pass(KernelClass::Elementwise, 3 * tokens * E * 4, 2);
  // Permutation: read the tokens, write top_k copies; un-permutation: read them back, write the sum.
  k.token_bytes = tokens * h * eb;
  k.permute = pass(KernelClass::Gather, (1 + kk) * k.token_bytes);
  k.unpermute = pass(KernelClass::Gather, (1 + kk) * k.token_bytes);
  // The experts: etp x top_k x tokens copies on the device (balanced), each expert 1 / etp wide.
  const double copies = e.etp * kk * tokens, fe = f / e.etp, local = E / e.ep;
  const double w1 = local * h * fe * g, w2 = local * fe * h;
  const bool eager_clamp = m.clamp && sp.gated && !launches.fused_grouped_mlp;
  k.activation = clamp_kernels(eager_clamp, copies * fe, eb);
  // The activation, weighted by the routing probabilities: torch.compile's kernels for the gated
  // ones (weighted_bias_swiglu_impl, weighted_bias_quick_geglu_impl), a Transformer Engine kernel
  // under the op fuser.
  const bool compiled = sp.gated && !launches.fused_grouped_mlp;
  k.activation.push_back(kernel(compiled ? KernelClass::Compiled : KernelClass::Elementwise, 0, 0, 0,
                                (sp.gated ? 3 : 2) * copies * fe * eb,
                                1.5 * (sp.gated ? 3 : 2) * copies * fe * eb, 0, 1));
  k.expert = {gemm(2 * copies * h * fe * g, copies * h, copies * fe * g, w1, eb, KernelClass::GroupedGemm)};
  k.expert.insert(k.expert.end(), k.activation.begin(), k.activation.end());
  k.expert.push_back(gemm(2 * copies * fe * h, copies * fe, copies * h, w2, eb, KernelClass::GroupedGemm));
  // Transformer Engine's grouped GEMM (v2.9, common/gemm/cublaslt_gemm.cu nvte_multi_tensor_gemm, as
  // Megatron-Core's TEGroupedMLP runs it): one cuBLAS call per local expert, round-robin over its 4
  // compute streams (CUTLASS's grouped kernel only on Hopper with NVTE_USE_CUTLASS_GROUPED_GEMM=1): the
  // device pays a start-up per wave of 4, the host a launch per expert; each wave reads its experts'
  // weights (weight_bytes is per call).
  // Transformer Engine's op fuser runs an MXFP8 grouped MLP as its fused CuTe kernels on Blackwell,
  // each GEMM's input quantized by one grouped kernel (ops/fused/grouped_mlp.py, group_quantize).
  const bool grouped_quantize = launches.fused_grouped_mlp && precision == Precision::AMP_MXFP8;
  for (Kernel* x : {&k.expert.front(), &k.expert.back()}) {
    x->calls = std::ceil(local / kGroupedGemmStreams);
    x->launches = local;
    x->weight_bytes /= x->calls;
    x->grouped_quantize = grouped_quantize;
  }
  if (sp.biases && !launches.fused_grouped_mlp) {
    const std::vector<Kernel> bias = expert_bias_kernels(local, copies * h, eb);
    k.expert.insert(k.expert.end(), bias.begin(), bias.end());
  }
  dispatcher_launches(launches, local, copies * h, eb, k);
  k.expert_parameters = w1 + w2 + (sp.biases ? local * (fe * g + h / e.etp) : 0);
  // The experts' stash: their input, the first GEMM's output, the second GEMM's input.
  const double qb = fp8_training(precision) ? fp8_saved_bytes(precision) : eb;  // their inputs, in fp8
  k.expert_stash_bytes = copies * h * qb + copies * fe * g * eb + copies * fe * qb;
  k.expert_act_bytes = copies * fe * qb;
  k.expert_act_input_bytes = copies * fe * g * eb;
  if (eager_clamp) {  // the clamped halves' concatenation, which the fused activation saves
    k.expert_stash_bytes += copies * fe * g * eb;
    k.expert_act_bytes += copies * fe * g * eb;
  }
  k.dense_parameters = h * E + (sp.biases ? E : 0) + norm_parameters(sp);  // router (and bias), LN2
  // LN2's input and output (the router's and the dispatch's input), the dropout mask, the router's
  // logits (fp32: 4 units per element). Not the expert outputs the combine sums: Megatron-Core applies
  // the routing probabilities in the experts' activation (TEGroupedMLP, weighted_bias_swiglu), so the
  // un-permutation is a plain sum whose backward saves nothing (docs/moe.md, "Memory").
  k.stash.unsplit = 5 * s * h + 4 * s * E;
  if (m.shared_ffn > 0) {
    k.shared = true;
    k.shared_mlp = mlp(sp, m.shared_ffn, t, sequence_parallel, precision);
    k.dense_parameters += k.shared_mlp.parameters - norm_parameters(sp);  // LN2 counted once
    k.stash.split += k.shared_mlp.stash.split;
    k.stash.split_fp8 += k.shared_mlp.stash.split_fp8;
  }
  return k;
}

double stash_bytes(const Stash& x, int t, bool sequence_parallel, Precision precision) {
  const double T = t, half = element_bytes(precision) / 2;
  const double T_unsplit = sequence_parallel ? T : 1;
  const double all = (x.unsplit / T_unsplit + (x.split + x.scores) / T + x.replicated) * half;
  if (!fp8_training(precision)) return all;
  // The fp8 parts at fp8_saved_bytes per element (2 units an element) instead of half per unit.
  const double fp8 = x.unsplit_fp8 / T_unsplit + x.split_fp8 / T + x.replicated_fp8;
  return all - fp8 * half + fp8 * fp8_saved_bytes(precision) / 2;
}

}  // namespace pipegrid::blocks
