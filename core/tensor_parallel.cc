#include "core/tensor_parallel.h"

#include <fmt/format.h>

#include <cmath>
#include <initializer_list>

#include "core/block_kernels.h"

namespace pipegrid {

namespace {

using blocks::kernel;
using blocks::scaled;

TpPiece compute(std::vector<Kernel> ks, bool expert_load = false) {
  TpPiece p{false, std::move(ks), CollectiveKind::AllReduce, 0};
  p.expert_load = expert_load;
  return p;
}
TpPiece collective(CollectiveKind k, double bytes, CommGroup group = CommGroup::Tensor,
                   bool expert_load = false) {
  TpPiece p{true, {}, k, bytes};
  p.group = group;
  p.expert_load = expert_load;
  return p;
}

// A linear layer's kernel as two backward GEMMs: its input gradient (with its share of the backward's
// bytes and the quantization of its output gradient) and its weight gradient (the rest); no forward.
Kernel input_gradient(const Kernel& k) {
  const double flops = k.backward_input_flops + k.backward_weight_flops;
  Kernel x = k;
  x.forward_flops = x.forward_bytes = x.fp8_in = 0;
  x.backward_weight_flops = 0;
  x.backward_bytes = flops > 0 ? k.backward_bytes * k.backward_input_flops / flops : k.backward_bytes;
  return x;
}
Kernel weight_gradient(const Kernel& k) {
  Kernel x = k;
  x.forward_flops = x.forward_bytes = x.fp8_in = x.fp8_out = 0;
  x.backward_input_flops = 0;
  x.backward_bytes = k.backward_bytes - input_gradient(k).backward_bytes;
  return x;
}

// The backward of kernels `before`, then of a column-parallel linear (`linear`, its kernels in
// backward order), then the group's collective of the linear's input gradient (an all-reduce; a
// reduce-scatter with sequence parallelism), as pieces that start and end with compute (the last
// empty, for the caller to continue). Without `wgrad_overlap` (TensorParallelOptions): [before,
// linear] collective []. With it, as Megatron-LM runs it:
//   no SP:  [before, linear's input gradient] all-reduce (beside) [its weight gradient] | []
//   SP:     [before] all-gather of its input (beside) [its input gradient] reduce-scatter (beside)
//           [its weight gradient] | []
// so that the all-gather gates the weight gradient, and the layer goes on once the input gradient's
// collective is done ('|': a boundary without flows).
std::vector<TpPiece> column_backward(std::vector<Kernel> before, const std::vector<Kernel>& linear, bool seq,
                                     double act, bool wgrad_overlap) {
  const CollectiveKind after = seq ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce;
  if (!wgrad_overlap) {
    before.insert(before.end(), linear.begin(), linear.end());
    return {compute(before), collective(after, act), compute({})};
  }
  auto beside = [](TpPiece p) {
    p.flags = kBesideNext;
    return p;
  };
  std::vector<Kernel> dgrad, wgrad;
  for (const Kernel& k : linear) {
    dgrad.push_back(input_gradient(k));
    wgrad.push_back(weight_gradient(k));
  }
  TpPiece boundary = collective(after, 0);
  boundary.flags = kNoFlows;
  std::vector<TpPiece> out;
  if (seq) {
    out = {compute(before), beside(collective(CollectiveKind::AllGather, act)), compute(dgrad)};
  } else {
    before.insert(before.end(), dgrad.begin(), dgrad.end());
    out = {compute(before)};
  }
  out.insert(out.end(), {beside(collective(after, act)), compute(wgrad), boundary, compute({})});
  return out;
}

// Kernels joined in order, skipping the empty ones (a fused attention's passes).
std::vector<Kernel> join(std::initializer_list<std::vector<Kernel>> parts) {
  std::vector<Kernel> out;
  for (const auto& part : parts)
    for (const Kernel& k : part)
      if (k.calls > 0) out.push_back(k);
  return out;
}

// The attention's kernels from QKV to the projection: before the core (QKV, rotary), the core's
// steps (each: core, softmax and dropout; one without context parallelism) and the projection; with
// what a context-parallel exchange moves per sample (core/context_parallel.h). A fused core's empty
// score passes are kept: they cost nothing.
struct CoreSplit {
  std::vector<Kernel> pre, pre_backward, post;
  std::vector<std::vector<Kernel>> steps;
  ContextRank rank;
  CpAlgorithm algorithm = CpAlgorithm::P2P;
  double kv = 0, qkv = 0, out = 0;
};

CoreSplit core_split(const blocks::Attention& k) {
  CoreSplit c;
  c.pre = k.qkv;
  c.pre.insert(c.pre.end(), k.rotary.begin(), k.rotary.end());
  c.pre_backward = k.rotary;
  c.pre_backward.insert(c.pre_backward.end(), k.qkv.rbegin(), k.qkv.rend());
  c.post = {k.proj};
  c.steps = {{k.core, k.softmax_dropout}};
  return c;
}

std::vector<Kernel> cat(std::initializer_list<std::vector<Kernel>> parts) {
  std::vector<Kernel> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}
std::vector<Kernel> reversed(const std::vector<Kernel>& ks) {
  return {ks.rbegin(), ks.rend()};
}

TpPiece exchange(CollectiveKind k, double bytes, unsigned char flags = 0) {
  TpPiece p = collective(k, bytes, CommGroup::Context);
  p.flags = flags;
  return p;
}

// The pieces from QKV to the projection, forward (core_forward) and backward (core_backward), as
// tensor_parallel_layer's contract lays them out; each list starts and ends with compute.
std::vector<TpPiece> core_forward(const CoreSplit& c) {
  const int cp = c.rank.cp;
  if (cp == 1) return {compute(cat({c.pre, c.steps[0], c.post}))};
  std::vector<TpPiece> out{compute(c.pre)};
  switch (c.algorithm) {
    case CpAlgorithm::P2P:
      for (int i = 0; i < cp; ++i) {
        out.push_back(
            i + 1 < cp ? exchange(CollectiveKind::SendRecv, c.kv, kBesideNext | (i > 0 ? kAfterPrevious : 0))
                       : exchange(CollectiveKind::SendRecv, 0, kNoFlows));
        out.push_back(compute(c.steps[static_cast<size_t>(i)]));
      }
      break;
    case CpAlgorithm::AllGather:
      out.push_back(exchange(CollectiveKind::AllGather, cp * c.kv));
      out.push_back(compute(c.steps[0]));
      break;
    case CpAlgorithm::AllToAll:
      out.push_back(exchange(CollectiveKind::AllToAll, c.qkv));
      out.push_back(compute(c.steps[0]));
      out.push_back(exchange(CollectiveKind::AllToAll, c.out));
      out.push_back(compute({}));
      break;
  }
  out.back().kernels.insert(out.back().kernels.end(), c.post.begin(), c.post.end());
  return out;
}

std::vector<TpPiece> core_backward(const CoreSplit& c) {
  const int cp = c.rank.cp;
  if (cp == 1) return {compute(cat({c.post, reversed(c.steps[0]), c.pre_backward}))};
  std::vector<TpPiece> out{compute(c.post)};
  switch (c.algorithm) {
    case CpAlgorithm::P2P:
      // Step 0 sends K/V, the middle steps K/V and the dK/dV so far, the last step none; after it the
      // dK/dV reach their owner.
      for (int i = 0; i < cp; ++i) {
        out.push_back(i == 0 ? exchange(CollectiveKind::SendRecv, c.kv, kBesideNext)
                      : i + 1 < cp
                          ? exchange(CollectiveKind::SendRecv, 2 * c.kv, kBesideNext | kAfterPrevious)
                          : exchange(CollectiveKind::SendRecv, 0, kNoFlows));
        out.push_back(compute(reversed(c.steps[static_cast<size_t>(i)])));
      }
      out.push_back(exchange(CollectiveKind::SendRecv, c.kv, kAfterPrevious));
      break;
    case CpAlgorithm::AllGather:
      out.push_back(exchange(CollectiveKind::AllGather, cp * c.kv));
      out.push_back(compute(reversed(c.steps[0])));
      out.push_back(exchange(CollectiveKind::ReduceScatter, cp * c.kv));
      break;
    case CpAlgorithm::AllToAll:
      out.push_back(exchange(CollectiveKind::AllToAll, c.out));
      out.push_back(compute(reversed(c.steps[0])));
      out.push_back(exchange(CollectiveKind::AllToAll, c.qkv));
      break;
  }
  out.push_back(compute(c.pre_backward));
  return out;
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

std::vector<Kernel> transformer_kernels(const TensorSplit& s, Precision precision, bool router_fusion,
                                        bool permute_fusion, bool fused_grouped_mlp) {
  const blocks::Attention a = blocks::attention(s, 1, false, precision);
  auto attention_forward = [&](const blocks::Attention& k) {
    return join({k.qkv, k.rotary, {k.core, k.softmax_dropout, k.proj}});
  };
  if (s.kind == TensorSplitKind::MoeBlock) {
    // The all-to-all dispatcher's launches, as a stage without expert parallelism runs them too.
    const blocks::Moe m =
        blocks::moe(s, 1, false, {}, precision, {router_fusion, permute_fusion, true, fused_grouped_mlp});
    std::vector<Kernel> shared;
    if (m.shared) shared = {m.shared_mlp.up, m.shared_mlp.act, m.shared_mlp.down};
    return join({{a.ln1},
                 attention_forward(a),
                 {a.dropout_residual, m.ln2, m.router, m.route, m.permute},
                 m.before_dispatch,
                 m.expert,
                 m.between,
                 {m.unpermute},
                 m.after_combine,
                 shared,
                 {m.dropout_residual}});
  }
  const blocks::Mlp m = blocks::mlp(s, s.ffn, 1, false, precision);
  return join(
      {{a.ln1}, attention_forward(a), {a.dropout_residual, m.ln2, m.up, m.act, m.down, m.dropout_residual}});
}

double block_parameters(const TensorSplit& s) {
  const double attention = blocks::attention(s, 1, false, Precision::FP32).parameters;
  if (s.kind != TensorSplitKind::MoeBlock)
    return attention + blocks::mlp(s, s.ffn, 1, false, Precision::FP32).parameters;
  const blocks::Moe m = blocks::moe(s, 1, false, {}, Precision::FP32);
  return attention + m.dense_parameters + m.expert_parameters;
}

double block_active_parameters(const TensorSplit& s) {
  if (s.kind != TensorSplitKind::MoeBlock) return block_parameters(s);
  const blocks::Moe m = blocks::moe(s, 1, false, {}, Precision::FP32);
  return blocks::attention(s, 1, false, Precision::FP32).parameters + m.dense_parameters +
         m.expert_parameters * s.moe.top_k / s.moe.experts;
}

double parameter_tensors(const Layer& l, int ep) {
  if (l.parameters <= 0) return 0;
  if (!is_block(l.split.kind)) return 1;
  const TensorSplit& s = l.split;
  const double b = s.biases ? 2 : 1;                   // a GEMM, with its bias where the block has biases
  const double n = s.biases && s.norm_biases ? 2 : 1;  // a norm, with LayerNorm's bias
  const MlaShape& mla = s.mla;
  // Attention: QKV (MLA: the queries' down projection, norm and up projection, or one projection;
  // the latent's down projection, norm and up projection), the output projection, the input norm,
  // GPT-OSS's sinks.
  const double attention = (mla.enabled() ? (mla.q_rank > 0 ? 3 : 1) + 3 : b) + b + n + s.attention_sinks;
  if (s.kind != TensorSplitKind::MoeBlock) return attention + 2 * b + n;  // the MLP's two GEMMs and norm
  const MoeShape& m = s.moe;
  const double local = m.experts / std::max(1, ep);
  return attention + n /* norm */ + b /* router */ + 2 * b * local + (m.shared_ffn > 0 ? 2 * b : 0);
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

double megatron_padded_vocabulary(double vocabulary, int t) {
  if (t <= 1) return vocabulary;
  const double multiple = 128.0 * t;
  return std::ceil(vocabulary / multiple) * multiple;
}

namespace {

// The attention part's pieces, forward and backward, around `mlp_forward` / `mlp_backward` (each
// starting and ending with compute), the core's as `core` splits it. With sequence parallelism each
// all-reduce is an all-gather before the column-parallel GEMMs and a reduce-scatter after the
// row-parallel ones, the norms, dropouts and residuals on 1/t of the sequence; at t = 1 no collective.
void attention_pieces(const blocks::Attention& k, const CoreSplit& core, int t, bool seq, double act,
                      bool wgrad_overlap, std::vector<TpPiece> mlp_forward, std::vector<TpPiece> mlp_backward,
                      TpLayer& out) {
  auto append = [](std::vector<TpPiece>& to, std::vector<TpPiece> from) {
    // The first piece of `from` continues the last of `to` (both compute).
    to.back().kernels.insert(to.back().kernels.end(), from.front().kernels.begin(),
                             from.front().kernels.end());
    to.insert(to.end(), std::make_move_iterator(from.begin() + 1), std::make_move_iterator(from.end()));
  };
  out.forward = {compute({k.ln1})};
  out.backward = std::move(mlp_backward);
  append(out.backward, {compute({k.dropout_residual})});
  if (t > 1 && seq) {
    out.forward.push_back(collective(CollectiveKind::AllGather, act));
    out.forward.push_back(compute({}));
    out.backward.push_back(collective(CollectiveKind::AllGather, act));
    out.backward.push_back(compute({}));
  }
  append(out.forward, core_forward(core));
  if (t > 1) {
    const CollectiveKind k_after = seq ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce;
    out.forward.push_back(collective(k_after, act));
    out.forward.push_back(compute({}));
    // The QKV projection is the column-parallel linear (MLA's projections: its down projections are
    // not split, so they stay before the collective as they are).
    const bool split_qkv = wgrad_overlap && k.up_proj.empty();
    CoreSplit without_qkv = core;
    if (split_qkv) without_qkv.pre_backward = k.rotary;
    append(out.backward, core_backward(without_qkv));
    append(out.backward,
           column_backward({}, split_qkv ? reversed(k.qkv) : std::vector<Kernel>{}, seq, act, split_qkv));
  } else {
    append(out.backward, core_backward(core));
  }
  append(out.forward, {compute({k.dropout_residual})});
  append(out.forward, std::move(mlp_forward));
  append(out.backward, {compute({k.ln1})});
}

// A dense MLP's pieces (from LN2 to the last residual): under t > 1 an all-reduce after the down
// GEMM's output (SP: all-gather before the up GEMM, reduce-scatter after the down GEMM); backward the
// mirror, the collective after the up GEMM's input gradient.
void mlp_pieces(const blocks::Mlp& m, int t, bool seq, double act, bool wgrad_overlap,
                std::vector<TpPiece>& fwd, std::vector<TpPiece>& bwd) {
  const std::vector<Kernel> up{m.up, m.act, m.down};
  if (t == 1) {
    fwd = {compute({m.ln2, m.up, m.act, m.down, m.dropout_residual})};
    bwd = {compute({m.dropout_residual, m.down, m.act, m.up, m.ln2})};
    return;
  }
  if (!seq) {
    fwd = {compute({m.ln2, m.up, m.act, m.down}), collective(CollectiveKind::AllReduce, act),
           compute({m.dropout_residual})};
    bwd = column_backward({m.dropout_residual, m.down, m.act}, {m.up}, false, act, wgrad_overlap);
  } else {
    fwd = {compute({m.ln2}), collective(CollectiveKind::AllGather, act), compute(up),
           collective(CollectiveKind::ReduceScatter, act), compute({m.dropout_residual})};
    bwd = {compute({m.dropout_residual}), collective(CollectiveKind::AllGather, act)};
    for (TpPiece& piece : column_backward({m.down, m.act}, {m.up}, true, act, wgrad_overlap))
      bwd.push_back(std::move(piece));
  }
  bwd.back().kernels.push_back(m.ln2);
}

// A block's stash by recomputation mode: everything (none), what `selective` keeps under the
// recompute modules, the layer's input (full: Table 2's 2 s b h L, whatever t).
void set_stash(TpLayer& out, const blocks::Stash& stash, const blocks::Stash& selective, int t, bool seq,
               Precision precision, double input_bytes) {
  out.stash_none = blocks::stash_bytes(stash, t, seq, precision);
  out.stash_selective = blocks::stash_bytes(selective, t, seq, precision);
  out.stash_full = input_bytes;
}

// What the attention's recompute modules discard from the block's selective stash and re-run
// (core/memory.h, RecomputeModules): core_attn the core (its scores, every context-parallel step's
// kernels), layernorm an LN1 that runs apart (MLA's; its output, 2 s h), mla_up_proj MLA's up
// projections and rotary embedding (Q, K and V).
void attention_modules(const blocks::Attention& a, const CoreSplit& core, const TensorSplit& sp,
                       const RecomputeModules& mods, blocks::Stash& selective, TpLayer& out) {
  if (mods.core_attn) {
    selective.scores = 0;
    for (const auto& step : core.steps) out.recompute.insert(out.recompute.end(), step.begin(), step.end());
  }
  if (mods.layernorm && a.norm_apart) {
    selective.unsplit -= 2 * sp.sequence * sp.hidden;  // the down projections' input
    selective.unsplit_fp8 -= 2 * sp.sequence * sp.hidden;
    out.recompute.push_back(a.ln1);
  }
  if (mods.mla_up_proj && !a.up_proj.empty()) {
    selective.split -= a.up_proj_stash;
    out.recompute.insert(out.recompute.end(), a.up_proj.begin(), a.up_proj.end());
  }
}

// A module recomputed from its input at t > 1 would re-run its tensor-parallel all-gather too.
Status check_mlp_module(const Layer& l, int t, std::string_view module) {
  if (t == 1) return {};
  return Error{fmt::format(
      "layer \"{}\": recompute_modules {} at tensor_parallel {} re-runs the MLP's all-gather in the "
      "backward, which is not modelled; use it at tensor_parallel 1",
      l.name, module, t)};
}

// The layer's shapes on one device of a context-parallel group of cp: s / cp tokens.
TensorSplit local_split(const TensorSplit& sp, int cp) {
  TensorSplit x = sp;
  x.sequence = sp.sequence / cp;
  return x;
}

// A block's attention on one device (its s / cp tokens) and its core as context-parallel rank `c`
// runs it: the steps' kernels are one unmasked block's (s / cp queries, s / cp keys) scaled by each
// step's work.
struct BlockAttention {
  blocks::Attention a;
  CoreSplit core;
};
BlockAttention block_attention(const TensorSplit& sp, int t, bool seq, Precision precision,
                               const ContextRank& c, const ContextParallelOptions& o) {
  const TensorSplit local = local_split(sp, c.cp);
  BlockAttention out{blocks::attention(local, t, seq, precision), {}};
  out.core = core_split(out.a);
  if (c.cp == 1) return out;
  TensorSplit unmasked = local;
  unmasked.causal = false;
  const blocks::Attention block = blocks::attention(unmasked, t, seq, precision);
  out.core.steps.clear();
  for (double w : attention_step_work(c, o, sp.causal))
    out.core.steps.push_back({blocks::scaled(block.core, w), blocks::scaled(block.softmax_dropout, w)});
  // An unfused core keeps its s / cp queries' scores against all s keys, masked or not (as without
  // context parallelism, where a causal mask does not shrink the stash either).
  out.a.stash.scores = block.stash.scores * c.cp;
  out.core.rank = c;
  out.core.algorithm = o.algorithm;
  const double eb = element_bytes(precision);
  out.core.kv = kv_block_bytes(sp, t, c.cp, eb);
  out.core.qkv = qkv_block_bytes(sp, t, c.cp, eb);
  out.core.out = output_block_bytes(sp, t, c.cp, eb);
  return out;
}

// What a block's layer takes from its attention beside the pieces: the context-parallel buffers the
// backward holds (per sample): p2p two [K/V; dK/dV] buffers (TE's), all_gather the gathered K/V and
// the whole dK/dV before the reduce-scatter, a2a the exchanged Q, K, V and output.
void set_core_extras(const CoreSplit& core, TpLayer& out) {
  const int cp = core.rank.cp;
  if (cp == 1) return;
  out.cp_workspace = core.algorithm == CpAlgorithm::P2P         ? 4 * core.kv
                     : core.algorithm == CpAlgorithm::AllGather ? 2 * cp * core.kv
                                                                : core.qkv + core.out;
}

// Whether activation_fp8_input_store applies to a block's MLPs (core/memory.h): Megatron-Core stores
// the input in fp8 only in its fused gated activations (bias_activation_fusion: bias_swiglu_impl and
// the weighted variants; mlp.py and experts.py), not in the unfused path kernel_fusion: none runs.
bool stores_fp8_input(const TensorSplit& sp, bool store) {
  return store && sp.gated && sp.megatron_fusion;
}

// What activation_fp8_input_store takes from a gated MLP's stash: its activation's input, 2 s f
// elements, at 1 byte instead of eb, in the Stash's units (2 per element of eb bytes).
double fp8_input_store_units(const TensorSplit& sp, double ffn, double eb, bool store) {
  return stores_fp8_input(sp, store) ? 2 * sp.sequence * ffn * 2 * (eb - 1) / eb : 0;
}

// The bytes per sample those units are on one device of t (split units: divided by t).
double fp8_input_store_bytes(double units, int t, double eb) {
  return units / t * eb / 2;
}

Result<TpLayer> transformer_layer(const Layer& l, int t, bool seq, Precision precision, const ContextRank& c,
                                  const ContextParallelOptions& o, const RecomputeModules& mods,
                                  bool wgrad_overlap, bool fp8_input_store) {
  const TensorSplit sp = local_split(l.split, c.cp);
  for (auto [value, what] : {std::pair{sp.heads, "attention heads"},
                             std::pair{sp.kv_heads > 0 ? sp.kv_heads : sp.heads, "key-value heads"},
                             std::pair{sp.ffn, "FFN width"}})
    if (Status st = divides(l, t, value, what); !st) return st.error();
  const double eb = element_bytes(precision);
  const BlockAttention ba = block_attention(l.split, t, seq, precision, c, o);
  const blocks::Attention& a = ba.a;
  blocks::Mlp m = blocks::mlp(sp, sp.ffn, t, seq, precision);
  const double stored = fp8_input_store_units(sp, sp.ffn, eb, fp8_input_store);
  m.stash.split -= stored;
  const double act = sp.sequence * sp.hidden * eb;  // s h per sample: what the collectives move
  TpLayer out;
  out.fp8_store_saved = fp8_input_store_bytes(stored, t, eb);
  out.fp8_store_saved_selective = mods.mlp ? 0 : out.fp8_store_saved;  // the checkpoint's input is bf16
  std::vector<TpPiece> mf, mb;
  mlp_pieces(m, t, seq, act, wgrad_overlap, mf, mb);
  attention_pieces(a, ba.core, t, seq, act, wgrad_overlap, std::move(mf), std::move(mb), out);
  set_core_extras(ba.core, out);
  out.parameters = a.parameters + m.parameters;
  out.parameter_bytes = out.parameters * eb;
  blocks::Stash stash = a.stash;
  stash += m.stash;
  blocks::Stash selective = stash;
  attention_modules(a, ba.core, sp, mods, selective, out);
  // mlp: the MLP checkpointed from its input (LN2 fused into the first GEMM): LN2's output and the
  // MLP's own tensors discarded, LN2 and the MLP re-run.
  if (mods.mlp) {
    if (Status st = check_mlp_module(l, t, "mlp"); !st) return st.error();
    selective.unsplit -= 2 * sp.sequence * sp.hidden;  // LN2's output, the first GEMM's input
    selective.unsplit_fp8 -= 2 * sp.sequence * sp.hidden;
    selective.split -= m.stash.split;
    selective.split_fp8 -= m.stash.split_fp8;
    out.recompute.insert(out.recompute.end(), {m.ln2, m.up, m.act, m.down});
  }
  set_stash(out, stash, selective, t, seq, precision, 2 * sp.sequence * sp.hidden * (eb / 2));
  return out;
}

// An MoE block's MLP pieces (from LN2 to the last residual), with the all-to-all dispatcher:
//   [LN2, router, top-k, permute] all-to-all (ep > 1) all-gather over etp (etp > 1) [experts]
//   reduce-scatter over etp (etp > 1) all-to-all (ep > 1) [un-permute] (shared experts as a dense MLP:
//   all-gather, [up, act, down], reduce-scatter over t) [residual];
// with the all-gather dispatcher the tokens are all-gathered over the ep x etp group after the router
// and the un-permuted outputs reduce-scattered back; DeepEP's as the all-to-all one, its two
// all-to-alls de-duplicated (TpPiece::deduplicates). Backward: the mirror, the shared experts' first
// GEMM a column-parallel linear (column_backward: with `wgrad_overlap`, its input re-gathered beside
// its input gradient and the reduce-scatter beside its weight gradient).
void moe_pieces(const blocks::Moe& m, const TensorSplit& sp, int t, const ExpertSizes& e, MoeDispatcher d,
                double act, bool wgrad_overlap, std::vector<TpPiece>& fwd, std::vector<TpPiece>& bwd) {
  const std::vector<Kernel> experts_b(m.expert.rbegin(), m.expert.rend());
  if (d == MoeDispatcher::AllGather) {
    const int n = e.ep * e.etp;
    const double all = n * m.token_bytes;
    auto gather = [&](std::vector<TpPiece>& to, CollectiveKind k) {
      if (n > 1) to.push_back(collective(k, all, CommGroup::ExpertAndTensor));
    };
    fwd = {compute({m.ln2, m.router, m.route})};
    gather(fwd, CollectiveKind::AllGather);
    fwd.push_back(compute({m.permute}));
    fwd.push_back(compute(m.expert, true));
    fwd.push_back(compute({m.unpermute}));
    gather(fwd, CollectiveKind::ReduceScatter);
    bwd = {compute({})};
    gather(bwd, CollectiveKind::AllGather);
    bwd.push_back(compute({m.unpermute}));
    bwd.push_back(compute(experts_b, true));
    bwd.push_back(compute({m.permute}));
    gather(bwd, CollectiveKind::ReduceScatter);
    bwd.push_back(compute({m.route, m.router, m.ln2}));
  } else {
    // Each device sends top_k copies of its tokens in all; the expert tensor-parallel group gathers
    // what its members received (etp x that, scaled by the rank's load).
    const double sent = sp.moe.top_k * m.token_bytes, gathered = e.etp * sent;
    const RoutingDraw dedup = d == MoeDispatcher::DeepEP ? routing_draw(sp.moe) : RoutingDraw{};
    auto around = [&](std::vector<TpPiece>& to, std::vector<Kernel> experts) {
      if (e.ep > 1) {
        to.push_back(collective(CollectiveKind::AllToAll, sent, CommGroup::Expert));
        to.back().deduplicates = dedup;
      }
      if (e.etp > 1)
        to.push_back(collective(CollectiveKind::AllGather, gathered, CommGroup::ExpertTensor, true));
      to.push_back(compute(std::move(experts), true));
      if (e.etp > 1)
        to.push_back(collective(CollectiveKind::ReduceScatter, gathered, CommGroup::ExpertTensor, true));
      if (e.ep > 1) {
        to.push_back(collective(CollectiveKind::AllToAll, sent, CommGroup::Expert));
        to.back().combine = true;
        to.back().deduplicates = dedup;
      }
    };
    // The dispatcher's other launches (blocks::MoeLaunches) beside the kernels they go with.
    fwd = {compute(cat({{m.ln2, m.router, m.route, m.permute}, m.before_dispatch}))};
    around(fwd, cat({m.expert, m.between}));
    fwd.push_back(compute(cat({{m.unpermute}, m.after_combine})));
    bwd = {compute(cat({m.after_combine, {m.unpermute}}))};
    around(bwd, cat({m.between, experts_b}));
    bwd.push_back(compute(cat({m.before_dispatch, {m.permute, m.route, m.router, m.ln2}})));
  }
  // Shared experts: a dense MLP on the layer's input, split over the tensor-parallel group.
  if (m.shared) {
    const blocks::Mlp& s = m.shared_mlp;
    auto tp = [&](std::vector<TpPiece>& to, CollectiveKind k) {
      if (t > 1) to.push_back(collective(k, act));
    };
    tp(fwd, CollectiveKind::AllGather);
    fwd.push_back(compute({s.up, s.act, s.down}));
    tp(fwd, CollectiveKind::ReduceScatter);
    std::vector<TpPiece> b{compute({})};
    if (t > 1) {
      tp(b, CollectiveKind::AllGather);
      for (TpPiece& piece : column_backward({s.down, s.act}, {s.up}, true, act, wgrad_overlap))
        b.push_back(std::move(piece));
    } else {
      b.push_back(compute({s.down, s.act, s.up}));
    }
    b.insert(b.end(), std::make_move_iterator(bwd.begin()), std::make_move_iterator(bwd.end()));
    bwd = std::move(b);
  }
  fwd.push_back(compute({m.dropout_residual}));
  bwd.front().kernels.insert(bwd.front().kernels.begin(), m.dropout_residual);
  // Consecutive compute pieces run as one (a piece between two collectives).
  for (std::vector<TpPiece>* v : {&fwd, &bwd}) {
    std::vector<TpPiece> merged;
    for (TpPiece& p : *v) {
      if (!merged.empty() && !p.collective && !merged.back().collective &&
          p.expert_load == merged.back().expert_load) {
        merged.back().kernels.insert(merged.back().kernels.end(), p.kernels.begin(), p.kernels.end());
        continue;
      }
      merged.push_back(std::move(p));
    }
    *v = std::move(merged);
  }
}

Result<TpLayer> moe_layer(const Layer& l, int t, const TensorParallelOptions& o, Precision precision,
                          const ExpertSizes& e, const ContextRank& c) {
  const TensorSplit sp = local_split(l.split, c.cp);
  if (Status st = check_moe(l, e, o.moe); !st) return st.error();
  for (auto [value, what] : {std::pair{sp.heads, "attention heads"},
                             std::pair{sp.kv_heads > 0 ? sp.kv_heads : sp.heads, "key-value heads"},
                             std::pair{sp.moe.shared_ffn, "shared experts' FFN width"}})
    if (value > 0)
      if (Status st = divides(l, t, value, what); !st) return st.error();
  if (t > 1 && !o.sequence_parallel)
    return Error{fmt::format(
        "layer \"{}\" is a mixture-of-experts block and tensor_parallel is {}: Megatron-Core requires "
        "sequence parallelism with MoE under tensor parallelism (set strategy.sequence_parallel: true)",
        l.name, t)};
  const bool seq = t > 1;
  const double eb = element_bytes(precision);
  const BlockAttention ba = block_attention(l.split, t, seq, precision, c, o.context);
  const blocks::Attention& a = ba.a;
  blocks::Moe m = blocks::moe(sp, t, seq, e, precision,
                              {o.moe.router_fusion, o.moe.permute_fusion,
                               o.moe.dispatcher == MoeDispatcher::AllToAll, o.moe.fused_grouped_mlp});
  // activation_fp8_input_store: the shared experts' activation input (an MLP of their own) and the
  // routed experts' (bytes per sample at the balanced load).
  const double shared_stored =
      m.shared ? fp8_input_store_units(sp, sp.moe.shared_ffn, eb, o.activation_fp8_input_store) : 0;
  m.shared_mlp.stash.split -= shared_stored;
  m.stash.split -= shared_stored;
  const double routed_stored =
      stores_fp8_input(sp, o.activation_fp8_input_store) ? m.expert_act_input_bytes * (eb - 1) / eb : 0;
  const double act = sp.sequence * sp.hidden * eb;
  TpLayer out;
  std::vector<TpPiece> mf, mb;
  moe_pieces(m, sp, t, e, o.moe.dispatcher, act, o.wgrad_overlap, mf, mb);
  attention_pieces(a, ba.core, t, seq, act, o.wgrad_overlap, std::move(mf), std::move(mb), out);
  set_core_extras(ba.core, out);
  out.expert_parameters = m.expert_parameters;
  out.expert_parameter_bytes = m.expert_parameters * eb;
  out.parameters = a.parameters + m.dense_parameters + m.expert_parameters;
  out.parameter_bytes = out.parameters * eb;
  blocks::Stash stash = a.stash;
  stash += m.stash;
  blocks::Stash selective = stash;
  const RecomputeModules& mods = o.recompute_modules;
  attention_modules(a, ba.core, sp, mods, selective, out);
  out.expert_stash = out.expert_stash_selective = m.expert_stash_bytes;
  // layernorm: the pre-MLP norm, apart from the router in a MoE block; moe_act: the experts'
  // activation (at the balanced load); shared_experts: the shared MLP from its input (LN2's output,
  // which the router keeps).
  if (mods.layernorm) {
    selective.unsplit -= 2 * sp.sequence * sp.hidden;
    out.recompute.push_back(m.ln2);
  }
  if (mods.moe_act) {
    out.expert_stash_selective -= m.expert_act_bytes;
    out.recompute.insert(out.recompute.end(), m.activation.begin(), m.activation.end());
  }
  out.expert_stash -= routed_stored;
  if (!mods.moe_act) out.expert_stash_selective -= routed_stored;  // else the checkpoint keeps it in bf16
  out.fp8_store_saved = fp8_input_store_bytes(shared_stored, t, eb) + routed_stored;
  out.fp8_store_saved_selective = (mods.shared_experts ? 0 : fp8_input_store_bytes(shared_stored, t, eb)) +
                                  (mods.moe_act ? 0 : routed_stored);
  if (mods.shared_experts && m.shared) {
    if (Status st = check_mlp_module(l, t, "shared_experts"); !st) return st.error();
    selective.split -= m.shared_mlp.stash.split;
    selective.split_fp8 -= m.shared_mlp.stash.split_fp8;
    out.recompute.insert(out.recompute.end(), {m.shared_mlp.up, m.shared_mlp.act, m.shared_mlp.down});
  }
  set_stash(out, stash, selective, t, seq, precision, 2 * sp.sequence * sp.hidden * (eb / 2));
  return out;
}

// A column-parallel linear whose output is gathered back (TensorSplitKind::ColumnGathered; Megatron-Core's
// MTP eh_proj: a ColumnParallelLinear, gather_from_tensor_model_parallel_region, then with sequence
// parallelism scatter_to_sequence_parallel_region, a split). Each rank computes 1/t of the columns.
//   forward:  [SP: all-gather of the input over the sequence] GEMM, all-gather of the output's columns
//   backward: [SP: all-gather of the output gradient over the sequence, the split's backward] then the
//             column-parallel backward (column_backward: the input gradient all-reduced or, with SP,
//             reduce-scattered; the input re-gathered beside it)
TpLayer column_gathered(const Layer& l, int t, bool seq, Precision precision, double cp, bool wgrad_overlap) {
  const TensorSplit& sp = l.split;
  TpLayer out;
  std::vector<Kernel> ks;
  for (const Kernel& k : layer_kernels(l)) ks.push_back(scaled(k, 1.0 / (t * cp)));
  const double in = l.stash_bytes / cp, act = sp.sequence * sp.hidden * element_bytes(precision) / cp;
  if (t > 1 && seq) out.forward.push_back(collective(CollectiveKind::AllGather, in));
  out.forward.push_back(compute(ks));
  if (t > 1) out.forward.push_back(collective(CollectiveKind::AllGather, act));
  if (t > 1) {
    if (seq) out.backward = {collective(CollectiveKind::AllGather, act)};
    std::vector<TpPiece> rest = column_backward({}, ks, seq, in, wgrad_overlap);
    out.backward.insert(out.backward.end(), rest.begin(), rest.end());
  } else {
    out.backward.push_back(compute(ks));
  }
  out.parameters = l.parameters / t;
  out.parameter_bytes = l.parameter_bytes / t;
  out.tied_parameters = l.tied_parameters / t;
  out.stash_none = out.stash_selective = out.stash_full = in / (seq ? t : 1);
  return out;
}

}  // namespace

Result<TpLayer> tensor_parallel_layer(const Layer& l, int t, const TensorParallelOptions& o,
                                      Precision precision, const ExpertSizes& e, const ContextRank& c) {
  const TensorSplit sp = local_split(l.split, c.cp);  // the device's s / cp tokens
  const bool seq = o.sequence_parallel;
  const double eb = element_bytes(precision);
  const double cp = c.cp;
  TpLayer out;
  if ((t > 1 || c.cp > 1) && l.measured)
    return Error{
        fmt::format("layer \"{}\" has measured times, which cannot be split between {} devices: "
                    "{} parallelism needs layers described by their shapes",
                    l.name, t > 1 ? t : c.cp, t > 1 ? "tensor" : "context")};
  if (Status st = check_context_parallel(l, t, c.cp, o.context); !st) return st.error();
  if (t > 1 && seq &&
      (is_block(sp.kind) || sp.kind == TensorSplitKind::VocabEmbedding ||
       sp.kind == TensorSplitKind::VocabHead))
    if (Status st = divides(l, t, sp.sequence, "sequence length (sequence parallelism splits it)"); !st)
      return st.error();
  switch (sp.kind) {
    case TensorSplitKind::Undefined:
      if (t > 1) return no_split(l, t);
      [[fallthrough]];
    case TensorSplitKind::Replicated: {
      const double share = (seq ? 1.0 / t : 1.0) / cp;
      std::vector<Kernel> ks;
      for (const Kernel& k : layer_kernels(l)) ks.push_back(scaled(k, share));
      out.forward.push_back(compute(ks));
      out.backward.push_back(compute(ks));
      out.parameters = l.parameters;
      out.parameter_bytes = l.parameter_bytes;
      out.tied_parameters = l.tied_parameters;
      out.stash_none = out.stash_selective = out.stash_full = l.stash_bytes * share;
      return out;
    }
    case TensorSplitKind::Input:
      return out;
    case TensorSplitKind::Transformer:
      return transformer_layer(l, t, seq, precision, c, o.context, o.recompute_modules, o.wgrad_overlap,
                               o.activation_fp8_input_store);
    case TensorSplitKind::MoeBlock:
      return moe_layer(l, t, o, precision, e, c);
    case TensorSplitKind::VocabEmbedding: {
      // Megatron's padded vocabulary: every rank holds vocabulary_padded / t whole rows.
      const double pad = sp.vocabulary > 0 ? megatron_padded_vocabulary(sp.vocabulary, t) / sp.vocabulary : 1;
      const double act = sp.sequence * sp.hidden * eb;
      std::vector<Kernel> ks = layer_kernels(l);
      if (c.cp > 1)
        for (Kernel& k : ks) k = scaled(k, 1 / cp);
      out.forward = {compute(ks)};
      if (t > 1)
        out.forward.push_back(
            collective(seq ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce, act));
      if (t > 1 && seq) out.backward.push_back(collective(CollectiveKind::AllGather, act));
      out.backward.push_back(compute(ks));
      out.parameters = l.parameters * pad / t;
      out.parameter_bytes = l.parameter_bytes * pad / t;
      out.tied_parameters = l.tied_parameters * pad / t;
      out.stash_none = out.stash_selective = out.stash_full = l.stash_bytes / (seq ? t : 1) / cp;
      return out;
    }
    case TensorSplitKind::ColumnGathered:
      return column_gathered(l, t, seq, precision, cp, o.wgrad_overlap);
    case TensorSplitKind::VocabHead: {
      // Megatron's padded vocabulary: the head's columns, logits and loss over vocabulary_padded / t.
      TensorSplit padded = sp;
      padded.vocabulary = megatron_padded_vocabulary(sp.vocabulary, t);
      const double pad = sp.vocabulary > 0 ? padded.vocabulary / sp.vocabulary : 1;
      const double s = sp.sequence, act = s * sp.hidden * eb, T = t;
      const std::vector<Kernel> k = vocab_head_kernels(padded, t, l.weight_bytes * pad, precision);
      const Kernel &gemm = k[0], &loss = k[1];
      if (t > 1 && seq) out.forward.push_back(collective(CollectiveKind::AllGather, act));
      out.forward.push_back(compute({gemm}));
      if (t > 1) out.forward.push_back(collective(CollectiveKind::AllReduce, 3 * 4 * s));
      out.forward.push_back(compute({loss}));
      if (t > 1)
        out.backward = column_backward({loss}, {gemm}, seq, act, o.wgrad_overlap);
      else
        out.backward.push_back(compute({loss, gemm}));
      out.parameters = l.parameters * pad / T;
      out.parameter_bytes = l.parameter_bytes * pad / T;
      out.tied_parameters = l.tied_parameters * pad / T;
      out.stash_none = out.stash_selective = out.stash_full = l.stash_bytes * pad / T / cp;
      return out;
    }
  }
  return no_split(l, t);
}

}  // namespace pipegrid
