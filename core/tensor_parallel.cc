#include "core/tensor_parallel.h"

#include <fmt/format.h>

#include <cmath>

namespace pipegrid {

namespace {

Kernel kernel(KernelClass cls, double fwd, double bwd_in, double bwd_w, double fwd_bytes, double bwd_bytes,
              double weight_bytes = 0, double calls = 1) {
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

TpPiece compute(std::vector<Kernel> ks) {
  return TpPiece{false, std::move(ks), CollectiveKind::AllReduce, 0};
}
TpPiece collective(CollectiveKind k, double bytes) {
  return TpPiece{true, {}, k, bytes};
}

// A transformer layer's kernels on one device of t (per sample), named by what they compute.
struct TransformerKernels {
  Kernel ln1, qkv, core, softmax_dropout, proj, dropout_residual1, ln2, up, act, down, dropout_residual2;
  std::vector<Kernel> rotary;  // empty without rotary embeddings
  double parameters = 0, parameter_bytes = 0;
  double stash_none = 0, stash_selective = 0, stash_full = 0;
};

TransformerKernels transformer(const TensorSplit& sp, int t, bool sequence_parallel, Precision precision) {
  const double eb = element_bytes(precision);
  const double s = sp.sequence, h = sp.hidden, a = sp.heads, f = sp.ffn, T = t;
  const double kv = sp.kv_heads > 0 ? sp.kv_heads : a;
  const double hd = h / a;
  const double qkv_out = h + 2 * kv * hd;
  const double g = sp.gated ? 2 : 1;                       // matrices of the MLP's first GEMM (gate and up)
  const double seq_share = sequence_parallel ? 1 / T : 1;  // norms, dropouts, residuals
  TransformerKernels k;
  // Weights (and biases) per device: the column- and row-parallel matrices split, the row-parallel
  // biases and the norms replicated.
  const double w_qkv = h * qkv_out / T + (sp.biases ? qkv_out / T : 0);
  const double w_proj = h * h / T;
  const double w_up = h * f * g / T + (sp.biases ? f * g / T : 0);
  const double w_down = f * h / T;
  const double replicated = (sp.biases ? 2 * h : 0) + (sp.biases ? 4 * h : 2 * h);  // row biases, norms
  k.parameters = w_qkv + w_proj + w_up + w_down + replicated;
  k.parameter_bytes = k.parameters * eb;
  auto gemm = [&](double flops, double io, double weights) {
    return kernel(KernelClass::Gemm, flops, flops, flops, io * eb, 2 * io * eb, weights * eb);
  };
  k.qkv = gemm(2 * s * h * qkv_out / T, s * h + s * qkv_out / T, w_qkv);
  k.proj = gemm(2 * s * h * h / T, s * h / T + s * h, w_proj);
  k.up = gemm(2 * s * h * f * g / T, s * h + s * f * g / T, w_up);
  k.down = gemm(2 * s * f * h / T, s * f / T + s * h, w_down);
  // The attention core on the device's a/t heads, as the builder costs it (core/models/builder.cc:
  // score_core, score_passes, use_attention): unfused, two batched GEMMs that write and read the
  // a s^2 / t scores, and four element-wise passes over them (scale, mask, softmax, dropout: 8 eb + 1
  // bytes per score forward, 7 eb + 1 backward); fused (FlashAttention), one kernel per pass, no score
  // traffic, the backward recomputing Q K^T.
  const double flops = 4 * s * s * h / T;
  const double scores = a * s * s / T;
  const double qkvo = (2 * s * h + 2 * s * kv * hd) / T;  // Q, K, V read and the output written
  const double core_io = (qkvo + 2 * scores) * eb;
  if (sp.fused_attention) {
    k.core = kernel(KernelClass::Attention, flops, 2.5 * flops, 0, qkvo * eb, 2 * qkvo * eb, 0, 1);
    k.softmax_dropout = kernel(KernelClass::Elementwise, 0, 0, 0, 0, 0, 0, 0);
  } else {
    k.core = kernel(KernelClass::Attention, flops, 2 * flops, 0, core_io, 2 * core_io, 0, 2);
    // Unfused: scale, mask, softmax and dropout, four kernels, 8 eb + 1 bytes per score forward
    // (dropout writes a 1-byte mask), 7 eb + 1 backward. Megatron-LM's FusedScaleMaskSoftmax: scale,
    // mask and softmax one kernel (reads the scores, writes the probabilities), then dropout: 4 eb + 1
    // forward; backward dropout (reads the gradient and the mask, writes) and the fused softmax (reads
    // the gradient and its output, writes): 5 eb + 1. Two kernels per pass.
    k.softmax_dropout =
        sp.megatron_fusion
            ? kernel(KernelClass::Elementwise, 0, 0, 0, (4 * eb + 1) * scores, (5 * eb + 1) * scores, 0, 2)
            : kernel(KernelClass::Elementwise, 0, 0, 0, (8 * eb + 1) * scores, (7 * eb + 1) * scores, 0, 4);
  }
  const double act = (sp.gated ? 3 : 2) * s * f / T * eb;
  k.act = kernel(KernelClass::Elementwise, 0, 0, 0, act, 1.5 * act, 0, 1);
  // Dropout (r + w) and residual add (2 r + w), two kernels; Megatron-LM's fused bias-dropout-add
  // one kernel reading the input and the residual and writing the sum (3 s h). Backward 1.5 times
  // the forward's traffic, as for every element-wise kernel here.
  const double dr = (sp.megatron_fusion ? 3 : 5) * s * h * seq_share * eb;
  k.dropout_residual1 =
      kernel(KernelClass::Elementwise, 0, 0, 0, dr, 1.5 * dr, 0, sp.megatron_fusion ? 1 : 2);
  k.dropout_residual2 = k.dropout_residual1;
  const double ln = 2 * s * h * seq_share * eb;
  k.ln1 = kernel(KernelClass::Norm, 0, 0, 0, ln, 1.5 * ln, 0, 1);
  k.ln2 = k.ln1;
  if (sp.rotary) {
    const double rot = 2 * s * (h + kv * hd) / T * eb;  // queries and keys, read and written
    k.rotary.push_back(kernel(KernelClass::Elementwise, 0, 0, 0, rot, rot, 0, 1));
  }
  // Activations kept for the backward, per sample, in 2-byte units (Korthikanti et al., section 4.1,
  // generalised to grouped-query attention and a gated MLP the same way): the unsplit part (the
  // inputs of the two norms, of QKV and of the MLP's first GEMM, two dropout masks) is 10 s h; the
  // split part is Q, K, V (2 s h + 4 s kv hd), the projection's input (2 s h), the activation's input
  // and the second GEMM's input (4 s f; gated: 6 s f), and the attention core's 5 a s^2.
  const double unsplit = 10 * s * h;
  const double split = 2 * s * h + 4 * s * kv * hd + 2 * s * h + (sp.gated ? 6 : 4) * s * f;
  double core_stash = 5 * a * s * s;
  const double half = eb / 2;
  if (sp.fused_attention) core_stash = 0;  // FlashAttention keeps no scores (Korthikanti et al.)
  if (sequence_parallel) {
    k.stash_none = (unsplit + split + core_stash) / T * half;
    k.stash_selective = (unsplit + split) / T * half;
  } else {
    k.stash_none = (unsplit + (split + core_stash) / T) * half;
    k.stash_selective = (unsplit + split / T) * half;
  }
  k.stash_full = 2 * s * h * half;  // the layer's input (Table 2: 2 s b h L, whatever t)
  return k;
}

Error no_split(const Layer& l, int t) {
  return Error{fmt::format(
      "layer \"{}\" (kind {}) has no tensor-parallel split, and tensor_parallel is {}: Megatron splits "
      "transformer blocks, vocabulary-parallel embeddings and heads, and runs norms and element-wise "
      "layers whole on every device; a model file can mark a layer `tensor_split: replicated`",
      l.name, l.kind, t)};
}

Status divides(const Layer& l, int t, double value, std::string_view what) {
  const double q = value / t;
  if (value > 0 && q == std::floor(q)) return {};
  return Error{
      fmt::format("layer \"{}\": tensor_parallel {} does not divide its {} ({:g})", l.name, t, what, value)};
}

}  // namespace

std::vector<Kernel> transformer_kernels(const TensorSplit& s, Precision precision) {
  TransformerKernels k = transformer(s, 1, false, precision);
  std::vector<Kernel> out{k.ln1, k.qkv};
  out.insert(out.end(), k.rotary.begin(), k.rotary.end());
  for (const Kernel& x : {k.core, k.softmax_dropout, k.proj, k.dropout_residual1, k.ln2, k.up, k.act, k.down,
                          k.dropout_residual2})
    if (x.calls > 0) out.push_back(x);
  return out;
}

std::vector<Kernel> vocab_head_kernels(const TensorSplit& s, int t, double weight_bytes,
                                       Precision precision) {
  const double eb = element_bytes(precision), T = t;
  const double flops = 2 * s.sequence * s.hidden * s.vocabulary / T;
  const double io = (s.sequence * s.hidden + s.sequence * s.vocabulary / T) * eb;
  const double ce = 3 * s.sequence * s.vocabulary / T * 4;
  return {kernel(KernelClass::Gemm, flops, flops, flops, io, 2 * io, weight_bytes / T),
          kernel(KernelClass::Elementwise, 0, 0, 0, ce, ce, 0, 2)};
}

Result<TpLayer> tensor_parallel_layer(const Layer& l, int t, const TensorParallelOptions& o,
                                      Precision precision) {
  const TensorSplit& sp = l.split;
  const bool seq = o.sequence_parallel;
  const double eb = element_bytes(precision);
  TpLayer out;
  if (t > 1 && l.measured)
    return Error{
        fmt::format("layer \"{}\" has measured times, which cannot be split between {} devices: "
                    "tensor parallelism needs layers described by their shapes",
                    l.name, t)};
  if (t > 1 && seq &&
      (sp.kind == TensorSplitKind::Transformer || sp.kind == TensorSplitKind::VocabEmbedding ||
       sp.kind == TensorSplitKind::VocabHead))
    if (Status st = divides(l, t, sp.sequence, "sequence length (sequence parallelism splits it)"); !st)
      return st.error();
  switch (sp.kind) {
    case TensorSplitKind::Undefined:
      if (t > 1) return no_split(l, t);
      [[fallthrough]];
    case TensorSplitKind::Replicated: {
      const double share = seq ? 1.0 / t : 1.0;
      std::vector<Kernel> ks;
      for (const Kernel& k : layer_kernels(l)) ks.push_back(scaled(k, share));
      out.forward.push_back(compute(ks));
      out.backward.push_back(compute(ks));
      out.parameters = l.parameters;
      out.parameter_bytes = l.parameter_bytes;
      out.stash_none = out.stash_selective = out.stash_full = l.stash_bytes * share;
      return out;
    }
    case TensorSplitKind::Input:
      return out;
    case TensorSplitKind::Transformer: {
      for (auto [value, what] : {std::pair{sp.heads, "attention heads"},
                                 std::pair{sp.kv_heads > 0 ? sp.kv_heads : sp.heads, "key-value heads"},
                                 std::pair{sp.ffn, "FFN width"}})
        if (Status st = divides(l, t, value, what); !st) return st.error();
      TransformerKernels k = transformer(sp, t, seq, precision);
      const double act = sp.sequence * sp.hidden * eb;  // s h per sample: what the collectives move
      std::vector<Kernel> attn{k.qkv};
      attn.insert(attn.end(), k.rotary.begin(), k.rotary.end());
      for (const Kernel& x : {k.core, k.softmax_dropout, k.proj}) attn.push_back(x);
      std::vector<Kernel> mlp{k.up, k.act, k.down};
      if (!seq) {
        std::vector<Kernel> a{k.ln1};
        a.insert(a.end(), attn.begin(), attn.end());
        std::vector<Kernel> m{k.dropout_residual1, k.ln2};
        m.insert(m.end(), mlp.begin(), mlp.end());
        out.forward = {compute(a), collective(CollectiveKind::AllReduce, act), compute(m),
                       collective(CollectiveKind::AllReduce, act), compute({k.dropout_residual2})};
        // Backward: the MLP (last residual, down, activation, up), the all-reduce of the up GEMM's
        // input gradient, then LN2, the first residual, the attention (projection .. QKV), the
        // all-reduce of QKV's input gradient, LN1.
        std::vector<Kernel> bm{k.dropout_residual2, k.down, k.act, k.up};
        std::vector<Kernel> ba{k.ln2, k.dropout_residual1, k.proj, k.softmax_dropout, k.core};
        ba.insert(ba.end(), k.rotary.begin(), k.rotary.end());
        ba.push_back(k.qkv);
        out.backward = {compute(bm), collective(CollectiveKind::AllReduce, act), compute(ba),
                        collective(CollectiveKind::AllReduce, act), compute({k.ln1})};
      } else {
        out.forward = {compute({k.ln1}),
                       collective(CollectiveKind::AllGather, act),
                       compute(attn),
                       collective(CollectiveKind::ReduceScatter, act),
                       compute({k.dropout_residual1, k.ln2}),
                       collective(CollectiveKind::AllGather, act),
                       compute(mlp),
                       collective(CollectiveKind::ReduceScatter, act),
                       compute({k.dropout_residual2})};
        std::vector<Kernel> ba{k.proj, k.softmax_dropout, k.core};
        ba.insert(ba.end(), k.rotary.begin(), k.rotary.end());
        ba.push_back(k.qkv);
        out.backward = {compute({k.dropout_residual2}),
                        collective(CollectiveKind::AllGather, act),
                        compute({k.down, k.act, k.up}),
                        collective(CollectiveKind::ReduceScatter, act),
                        compute({k.ln2, k.dropout_residual1}),
                        collective(CollectiveKind::AllGather, act),
                        compute(ba),
                        collective(CollectiveKind::ReduceScatter, act),
                        compute({k.ln1})};
      }
      out.recompute = {k.core, k.softmax_dropout};
      out.parameters = k.parameters;
      out.parameter_bytes = k.parameter_bytes;
      out.stash_none = k.stash_none;
      out.stash_selective = k.stash_selective;
      out.stash_full = k.stash_full;
      return out;
    }
    case TensorSplitKind::VocabEmbedding: {
      if (Status st = divides(l, t, sp.vocabulary, "vocabulary (Megatron pads it to a multiple of t)"); !st)
        return st.error();
      const double act = sp.sequence * sp.hidden * eb;
      const std::vector<Kernel> ks = layer_kernels(l);
      out.forward = {compute(ks)};
      if (t > 1)
        out.forward.push_back(
            collective(seq ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce, act));
      if (t > 1 && seq) out.backward.push_back(collective(CollectiveKind::AllGather, act));
      out.backward.push_back(compute(ks));
      out.parameters = l.parameters / t;
      out.parameter_bytes = l.parameter_bytes / t;
      out.stash_none = out.stash_selective = out.stash_full = l.stash_bytes / (seq ? t : 1);
      return out;
    }
    case TensorSplitKind::VocabHead: {
      if (Status st = divides(l, t, sp.vocabulary, "vocabulary (Megatron pads it to a multiple of t)"); !st)
        return st.error();
      const double s = sp.sequence, act = s * sp.hidden * eb, T = t;
      const std::vector<Kernel> k = vocab_head_kernels(sp, t, l.weight_bytes, precision);
      const Kernel &gemm = k[0], &loss = k[1];
      if (t > 1 && seq) out.forward.push_back(collective(CollectiveKind::AllGather, act));
      out.forward.push_back(compute({gemm}));
      if (t > 1) out.forward.push_back(collective(CollectiveKind::AllReduce, 3 * 4 * s));
      out.forward.push_back(compute({loss}));
      out.backward.push_back(compute({loss, gemm}));
      if (t > 1)
        out.backward.push_back(
            collective(seq ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce, act));
      out.parameters = l.parameters / T;
      out.parameter_bytes = l.parameter_bytes / T;
      out.stash_none = out.stash_selective = out.stash_full = l.stash_bytes / T;
      return out;
    }
  }
  return no_split(l, t);
}

}  // namespace pipegrid
