#include "core/models/builder.h"

#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "core/tensor_parallel.h"

namespace pipegrid {

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

ModelBuilder::ModelBuilder(std::string name, Precision precision) {
  w_.name = std::move(name);
  w_.precision = precision;
  w_.optimizer_step_s = -1;  // modelled from the parameters (device.h: optimizer_step_time)
}

double ModelBuilder::elems(const Shape& s) const {
  double n = 1;
  for (int64_t d : s) n *= static_cast<double>(d);
  return n;
}

namespace {

Kernel make_kernel(KernelClass cls, double fwd, double bwd_in, double bwd_w, double fwd_bytes,
                   double bwd_bytes, double weight_bytes = 0, double calls = 1) {
  return Kernel{cls, fwd, bwd_in, bwd_w, fwd_bytes, bwd_bytes, weight_bytes, calls};
}

// The layer's totals are its kernels' sums (weight traffic: the weights once, as stored).
void set_totals(Layer& l) {
  if (l.kernels.empty()) return;
  l.forward_flops = l.backward_input_flops = l.backward_weight_flops = 0;
  l.forward_bytes = l.backward_bytes = 0;
  for (const Kernel& k : l.kernels) {
    l.forward_flops += k.forward_flops;
    l.backward_input_flops += k.backward_input_flops;
    l.backward_weight_flops += k.backward_weight_flops;
    l.forward_bytes += k.forward_bytes;
    l.backward_bytes += k.backward_bytes;
  }
}

// A self-attention's kernels, as score_core and score_passes make them: the core (2 calls) directly
// followed by the passes over the scores (4 calls); use_attention recognises that pair.
constexpr double kCoreCalls = 2, kScorePassCalls = 4;

// The attention core's two batched GEMMs (Q K^T and scores x V, `flops` forward, twice backward),
// unfused: they read Q, K, V and write the output (4 s h elements), and write, then read, the scores
// (`scores` = heads x s x s elements per sample); backward twice the traffic.
Kernel score_core(double flops, double sh, double scores, double eb) {
  const double io = (4 * sh + 2 * scores) * eb;
  return make_kernel(KernelClass::Attention, flops, 2 * flops, 0, io, 2 * io, 0, kCoreCalls);
}

// The unfused element-wise passes over the scores, as frameworks without a fused attention run
// them, each a kernel that reads and writes every score (`scores` elements per sample, eb bytes
// each; dropout's mask 1 byte per score). Forward 4 kernels: scale, mask (add), softmax, dropout
// (which also writes its mask): 8 eb + 1 bytes per score. Backward: dropout (reads the gradient and
// the mask, writes), softmax (reads the gradient and its output, writes), scale (reads, writes);
// the additive mask has no gradient: 7 eb + 1 bytes per score.
Kernel score_passes(double scores, double eb) {
  return make_kernel(KernelClass::Elementwise, 0, 0, 0, (8 * eb + 1) * scores, (7 * eb + 1) * scores, 0,
                     kScorePassCalls);
}

// A decoder or MoE block's kernels, parameters, stash and selective recomputation fraction from its
// split (ModelBuilder::decoder_block; use_attention rebuilds them when the attention changes).
Status build_from_split(Layer& l, Precision p) {
  Result<TpLayer> tp = tensor_parallel_layer(l, 1, {}, p);
  if (!tp) return tp.error();
  l.kernels = transformer_kernels(l.split, p);
  l.parameters = tp->parameters;
  l.parameter_bytes = tp->parameter_bytes;
  l.weight_bytes = l.parameter_bytes;
  // One device holding every expert at balanced load.
  l.stash_bytes = tp->stash_none + tp->expert_stash;
  l.selective_stash_bytes = tp->stash_selective + tp->expert_stash;
  double core = 0, fwd = 0;
  for (const Kernel& k : l.kernels) {
    fwd += k.forward_flops;
    if (k.cls == KernelClass::Attention) core += k.forward_flops;
  }
  l.selective_recompute_fraction = fwd > 0 ? core / fwd : 0;
  set_totals(l);
  return {};
}

}  // namespace

Status use_attention(Workload& w, AttentionImpl impl) {
  int blocks = 0;
  // The MoE zoo's blocks (moe_block, and its dense decoder blocks) are built fused, Megatron-Core's
  // default; `unfused` rebuilds them with the score passes (Transformer Engine's
  // UnfusedDotProductAttention). Every other block is built unfused.
  const double eb = element_bytes(w.precision);
  for (size_t i = 0; i < w.layer_count(); ++i) {
    Layer& l = w.graph[i];
    const bool from_split = l.kind == "moe_block" || (l.kind == "decoder_block" && l.split.fused_attention);
    if (from_split) {  // rebuilt from its shape, as tensor parallelism builds it
      ++blocks;
      l.split.fused_attention = impl == AttentionImpl::Fused;
      (void)build_from_split(l, w.precision);  // built from this split before: cannot fail now
      continue;
    }
    if (l.kind != "transformer_block" && l.kind != "decoder_block" && l.kind != "attention") continue;
    ++blocks;
    if (impl == AttentionImpl::Unfused) continue;
    l.split.fused_attention = true;
    std::vector<Kernel>& ks = l.kernels;
    for (size_t j = 0; j + 1 < ks.size(); ++j) {
      const Kernel& core = ks[j];
      const Kernel& passes = ks[j + 1];
      if (core.cls != KernelClass::Attention || core.calls != kCoreCalls ||
          passes.cls != KernelClass::Elementwise || passes.calls != kScorePassCalls)
        continue;
      const double scores = passes.forward_bytes / (8 * eb + 1);  // score_passes' count, inverted
      // FlashAttention (Dao et al., NeurIPS 2022): one kernel per pass reads Q, K, V (and the output
      // and its gradient backward) and writes the output (the gradients of Q, K, V); the scores
      // never reach memory; the backward recomputes Q K^T, half the forward's FLOPs.
      Kernel f = core;
      f.forward_bytes -= 2 * scores * eb;
      f.backward_bytes -= 4 * scores * eb;
      f.backward_input_flops += core.forward_flops / 2;
      f.calls = 1;
      // A decoder's causal mask: FlashAttention skips the key blocks above the diagonal (Dao,
      // "FlashAttention-2", arXiv 2307.08691, section 3.1.1: "we can skip the computation of about half
      // of the blocks"), as block_kernels' attention_core does for the blocks it builds.
      if (l.kind == "decoder_block" || l.split.causal) {
        l.split.causal = true;
        f.forward_flops /= 2;
        f.backward_input_flops /= 2;
        f.backward_weight_flops /= 2;
      }
      ks[j] = f;
      ks.erase(ks.begin() + static_cast<std::ptrdiff_t>(j) + 1);  // the passes run inside it
      set_totals(l);
      // No score tensor is stashed: what selective recomputation keeps (Korthikanti et al.).
      if (l.selective_stash_bytes > 0) l.stash_bytes = l.selective_stash_bytes;
      break;
    }
  }
  if (blocks == 0 && impl == AttentionImpl::Fused)
    return Error{fmt::format(
        "fused attention rewrites attention cores (models gpt, llama, bert, the MoE zoo, ...); \"{}\" has "
        "none, and it would run as it is",
        w.name)};
  return {};
}

Status use_megatron_fusion(Workload& w) {
  int blocks = 0;
  for (size_t i = 0; i < w.layer_count(); ++i) {
    Layer& l = w.graph[i];
    if ((l.kind != "decoder_block" && l.kind != "transformer_block" && l.kind != "moe_block") ||
        !is_block(l.split.kind))
      continue;
    l.split.megatron_fusion = true;
    l.kernels = transformer_kernels(l.split, w.precision);  // keeps fused_attention (use_attention)
    set_totals(l);
    ++blocks;
  }
  if (blocks == 0)
    return Error{
        fmt::format("megatron fusion rewrites Transformer blocks (models gpt, llama, bert, ...); \"{}\" "
                    "has none, and its kernels would stay unfused",
                    w.name)};
  return {};
}

void use_unfused_elementwise(Workload& w) {
  for (size_t i = 0; i < w.layer_count(); ++i) {
    Layer& l = w.graph[i];
    if (!l.split.megatron_fusion || !is_block(l.split.kind)) continue;
    l.split.megatron_fusion = false;
    l.kernels = transformer_kernels(l.split, w.precision);  // keeps the attention's implementation
    set_totals(l);
  }
}

void use_moe_kernels(Workload& w, bool router_fusion, bool permute_fusion, bool fused_grouped_mlp) {
  for (size_t i = 0; i < w.layer_count(); ++i) {
    Layer& l = w.graph[i];
    if (l.split.kind != TensorSplitKind::MoeBlock) continue;
    l.kernels = transformer_kernels(l.split, w.precision, router_fusion, permute_fusion, fused_grouped_mlp);
    set_totals(l);
  }
}

Result<int> ModelBuilder::add_layer(Layer l, Shape out, const std::vector<int>& in) {
  if (w_.layer_count() >= static_cast<size_t>(kMaxLayers))
    return Error{
        fmt::format("the model has more than {} layers, pipegrid's limit (see docs/limits.md)", kMaxLayers)};
  return push_layer(std::move(l), std::move(out), in);
}

int ModelBuilder::push_layer(Layer l, Shape out, const std::vector<int>& in) {
  set_totals(l);
  // Kinds whose tensor-parallel split needs no shape: the input, and the element-wise and
  // normalisation layers every device of a group runs whole (or 1/t of with sequence parallelism).
  if (l.split.kind == TensorSplitKind::Undefined) {
    if (l.kind == "input") l.split.kind = TensorSplitKind::Input;
    if (l.kind == "layernorm" || l.kind == "rmsnorm" || l.kind == "add" || l.kind == "dropout" ||
        l.kind == "relu" || l.kind == "gelu")
      l.split.kind = TensorSplitKind::Replicated;
  }
  l.output_bytes = bytes(out);
  const int id = w_.add_layer(std::move(l));
  shapes_.push_back(std::move(out));
  for (int i : in) w_.add_edge(i, id);
  return id;
}

Error ModelBuilder::mismatch(const std::string& name, const std::string& expected, int in) const {
  return Error{fmt::format("layer \"{}\" expects {}, but \"{}\" produces {}", name, expected, this->name(in),
                           shape_text(shape(in)))};
}

int ModelBuilder::input(const std::string& name, Shape shape) {
  Layer l;
  l.name = name;
  l.kind = "input";
  return push_layer(std::move(l), std::move(shape), {});
}

Result<int> ModelBuilder::linear(const std::string& name, int in, int64_t in_features, int64_t out_features,
                                 bool bias, int tied_to) {
  const Shape& s = shape(in);
  if (s.empty() || s.back() != in_features)
    return mismatch(name, fmt::format("{} input features (last dimension)", in_features), in);
  Shape out = s;
  out.back() = out_features;
  const double rows = elems(s) / static_cast<double>(in_features);
  Layer l;
  l.name = name;
  l.kind = "linear";
  const double flops = 2.0 * rows * in_features * out_features;
  const double matrix = static_cast<double>(in_features) * out_features, biases = bias ? out_features : 0;
  const bool tied = tied_to >= 0;
  l.parameters = (tied ? 0 : matrix) + biases;
  l.tied_to = tied_to;
  l.tied_parameters = tied ? matrix : 0;
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = (matrix + biases) * element_bytes(w_.precision);  // read either way
  const double io = bytes(s) + bytes(out);
  l.kernels = {make_kernel(KernelClass::Gemm, flops, flops, flops, io, 2 * io, l.weight_bytes)};
  l.kernels[0].fp8 = true;  // a Transformer Engine Linear in an fp8 training
  l.kernels[0].fp8_in = elems(s);
  l.kernels[0].fp8_out = elems(out);
  l.stash_bytes = bytes(out);
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::conv2d(const std::string& name, int in, const Conv& c) {
  const Shape& s = shape(in);
  if (s.size() != 3 || s[0] != c.in_channels)
    return mismatch(name, fmt::format("[{}, H, W] (channels, height, width)", c.in_channels), in);
  if (c.groups < 1 || c.in_channels % c.groups || c.out_channels % c.groups)
    return Error{fmt::format("layer \"{}\": {} groups do not divide {} and {} channels", name, c.groups,
                             c.in_channels, c.out_channels)};
  // (A window larger than its padded input would give 0 or less: C++ division truncates toward 0.)
  const bool fits = s[1] + 2 * c.padding >= c.kernel && s[2] + 2 * c.padding >= c.kernel;
  const int64_t h = (s[1] + 2 * c.padding - c.kernel) / c.stride + 1;
  const int64_t w = (s[2] + 2 * c.padding - c.kernel) / c.stride + 1;
  if (!fits || h < 1 || w < 1)
    return Error{fmt::format("layer \"{}\": a {}x{} kernel does not fit its input {}", name, c.kernel,
                             c.kernel, shape_text(s))};
  Shape out{c.out_channels, h, w};
  Layer l;
  l.name = name;
  l.kind = "conv2d";
  const double macs =
      static_cast<double>(c.out_channels) * (c.in_channels / c.groups) * c.kernel * c.kernel * h * w;
  const double io = bytes(s) + bytes(out);
  l.parameters = static_cast<double>(c.out_channels) * (c.in_channels / c.groups) * c.kernel * c.kernel +
                 (c.bias ? c.out_channels : 0) + (c.batchnorm ? 2 * c.out_channels : 0);
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  // The convolution, then (as separate kernels, as frameworks run them in training) the BatchNorm -
  // two passes over its input forward (statistics: read; normalisation: read, write) and two
  // backward (reduction: read the gradient and the input; input gradient: read both, write) - and
  // the ReLU (read, write; backward: read the gradient and the output, write). Fused, the ReLU is
  // applied in the normalisation's write and its mask read in each backward pass (+1 read each):
  // 3 and 7 tensors' bytes in one kernel each way, against 3 + 2 and 5 + 3 in two.
  l.kernels = {make_kernel(KernelClass::Conv, 2 * macs, 2 * macs, 2 * macs, io, 2 * io, l.weight_bytes)};
  l.kernels[0].winograd = c.kernel == 3 && c.stride == 1 && c.groups == 1;
  const bool fused = c.fused_bn_relu && c.batchnorm && c.relu;
  if (c.batchnorm)
    l.kernels.push_back(
        make_kernel(KernelClass::Norm, 0, 0, 0, 3 * bytes(out), (fused ? 7 : 5) * bytes(out)));
  if (c.relu && !fused)
    l.kernels.push_back(make_kernel(KernelClass::Elementwise, 0, 0, 0, 2 * bytes(out), 3 * bytes(out)));
  l.stash_bytes = bytes(out) * (c.batchnorm ? 2 : 1);  // the BatchNorm input too
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::pool(const std::string& name, int in, int64_t kernel, int64_t stride,
                               int64_t padding) {
  const Shape& s = shape(in);
  if (s.size() != 3) return mismatch(name, "[C, H, W]", in);
  const bool fits = s[1] + 2 * padding >= kernel && s[2] + 2 * padding >= kernel;
  const int64_t h = (s[1] + 2 * padding - kernel) / stride + 1;
  const int64_t w = (s[2] + 2 * padding - kernel) / stride + 1;
  if (!fits || h < 1 || w < 1)
    return Error{fmt::format("layer \"{}\": a {}x{} window does not fit its input {}", name, kernel, kernel,
                             shape_text(s))};
  Shape out{s[0], h, w};
  Layer l;
  l.name = name;
  l.kind = "pool";
  l.kernels = {make_kernel(KernelClass::Elementwise, 0, 0, 0, bytes(s) + bytes(out), bytes(s) + bytes(out))};
  l.stash_bytes = bytes(out);
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::adaptive_pool(const std::string& name, int in, int64_t out_h, int64_t out_w) {
  const Shape& s = shape(in);
  if (s.size() != 3) return mismatch(name, "[C, H, W]", in);
  Shape out{s[0], out_h, out_w};
  Layer l;
  l.name = name;
  l.kind = "pool";
  l.kernels = {make_kernel(KernelClass::Elementwise, 0, 0, 0, bytes(s) + bytes(out), bytes(s) + bytes(out))};
  l.stash_bytes = 0;
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::norm(const std::string& name, int in, bool layernorm) {
  const Shape& s = shape(in);
  if (s.empty()) return mismatch(name, "a tensor", in);
  Layer l;
  l.name = name;
  l.kind = layernorm ? "layernorm" : "batchnorm";
  l.parameters = 2.0 * static_cast<double>(layernorm ? s.back() : s.front());
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  // LayerNorm: one fused pass each way; BatchNorm: statistics over the batch, then normalisation.
  l.kernels = {layernorm ? make_kernel(KernelClass::Norm, 0, 0, 0, 2 * bytes(s), 3 * bytes(s))
                         : make_kernel(KernelClass::Norm, 0, 0, 0, 3 * bytes(s), 5 * bytes(s))};
  l.stash_bytes = bytes(s);
  return add_layer(std::move(l), s, {in});
}

Result<int> ModelBuilder::elementwise(const std::string& name, const std::string& kind, int in) {
  const Shape& s = shape(in);
  Layer l;
  l.name = name;
  l.kind = kind;
  l.kernels = {make_kernel(KernelClass::Elementwise, 0, 0, 0, 2 * bytes(s), 2 * bytes(s))};
  l.stash_bytes = bytes(s);
  return add_layer(std::move(l), s, {in});
}

Result<int> ModelBuilder::add(const std::string& name, const std::vector<int>& in) {
  if (in.size() < 2)
    return Error{fmt::format("layer \"{}\" (add) needs at least 2 inputs, got {}", name, in.size())};
  for (int i : in)
    if (shape(i) != shape(in.front()))
      return mismatch(name, shape_text(shape(in.front())) + " like its first input", i);
  Layer l;
  l.name = name;
  l.kind = "add";
  const double io = static_cast<double>(in.size() + 1) * bytes(shape(in.front()));
  l.kernels = {make_kernel(KernelClass::Elementwise, 0, 0, 0, io, io)};
  return add_layer(std::move(l), shape(in.front()), in);
}

Result<int> ModelBuilder::batchnorm_add_relu(const std::string& name, int in, int residual) {
  const Shape& s = shape(in);
  if (s.empty()) return mismatch(name, "a tensor", in);
  if (shape(residual) != s) return mismatch(name, shape_text(s) + " like its first input", residual);
  Layer l;
  l.name = name;
  l.kind = "batchnorm_add_relu";
  l.parameters = 2.0 * static_cast<double>(s.front());
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  // Forward: statistics (read the input), then normalise, add and ReLU (read the input and the
  // residual, write): 4 tensors' bytes. Backward: reduction (read the gradient, the output for the
  // ReLU's mask and the input), then the gradients (read those three, write the input's and the
  // residual's): 8. Unfused (BatchNorm, add, a ReLU layer) the same work is 3 + 3 + 2 and 5 + 3 + 2.
  l.kernels = {make_kernel(KernelClass::Norm, 0, 0, 0, 4 * bytes(s), 8 * bytes(s))};
  l.stash_bytes = bytes(s);  // the output, for the ReLU's mask (the input is the convolution's)
  return add_layer(std::move(l), s, {in, residual});
}

Result<int> ModelBuilder::concat(const std::string& name, const std::vector<int>& in) {
  if (in.size() < 2)
    return Error{fmt::format("layer \"{}\" (concat) needs at least 2 inputs, got {}", name, in.size())};
  Shape out = shape(in.front());
  if (out.empty()) return mismatch(name, "a tensor", in.front());
  for (size_t k = 1; k < in.size(); ++k) {
    const Shape& s = shape(in[k]);
    if (s.size() != out.size() || !std::equal(s.begin(), s.end() - 1, out.begin()))
      return mismatch(name,
                      fmt::format("{} with any last dimension, like its first input",
                                  shape_text(Shape(out.begin(), out.end() - 1)) + "[..., *]"),
                      in[k]);
    out.back() += s.back();
  }
  Layer l;
  l.name = name;
  l.kind = "concat";
  l.kernels = {make_kernel(KernelClass::Elementwise, 0, 0, 0, 2 * bytes(out), 2 * bytes(out))};
  return add_layer(std::move(l), std::move(out), in);
}

Result<int> ModelBuilder::flatten(const std::string& name, int in) {
  Layer l;
  l.name = name;
  l.kind = "flatten";
  const double n = elems(shape(in));
  if (!(n <= kMaxElements))
    return Error{
        fmt::format("layer \"{}\": flattening {} gives {:.4g} elements per sample, more than a model "
                    "can hold ({:.0e})",
                    name, shape_text(shape(in)), n, kMaxElements)};
  return add_layer(std::move(l), Shape{static_cast<int64_t>(n)}, {in});
}

Result<int> ModelBuilder::lstm(const std::string& name, const std::vector<int>& in, int64_t hidden,
                               bool bidirectional) {
  if (in.empty()) return Error{fmt::format("layer \"{}\" (lstm) needs an input", name)};
  // Several inputs are concatenated along the features (GNMT's decoder: previous layer + context).
  const int64_t steps = shape(in.front()).empty() ? 0 : shape(in.front()).front();
  int64_t features = 0;
  for (int i : in) {
    const Shape& s = shape(i);
    if (s.size() != 2 || s[0] != steps)
      return mismatch(name, fmt::format("[{}, features] (steps, features)", steps), i);
    features += s[1];
  }
  const double dirs = bidirectional ? 2 : 1;
  Layer l;
  l.name = name;
  l.kind = "lstm";
  const double eb = element_bytes(w_.precision), T = static_cast<double>(steps),
               H = static_cast<double>(hidden);
  l.parameters = dirs * (4.0 * H * (features + H) + 8.0 * H);
  l.parameter_bytes = l.parameters * eb;
  l.weight_bytes = l.parameter_bytes;
  Shape out{steps, static_cast<int64_t>(dirs) * hidden};
  // As cuDNN runs it: the input projection of all steps is one GEMM (4 gates, 2 FLOP per MAC), and so
  // are the weight gradients of both matrices. Each time step then depends on the one before: per
  // step and direction, one GEMM of the previous hidden state by the recurrent weights (a GEMM like
  // any other, at the GEMM efficiency; it reads its 4 H x H weights at every step) and one
  // element-wise kernel for the gates and the cell, forward, and the same two backward (the gates'
  // gradient, then the hidden state's through the recurrent weights). Every one of these 2 T launches
  // per direction and pass waits for the one before: each pays the kernel startup, none overlaps.
  // Gate kernel traffic per step: forward reads the 4 H pre-activations and c_{t-1}, writes h and c;
  // backward reads dh, dc, the 4 gates and c, writes the 4 H gate gradients and dc.
  const double input_proj = dirs * 8.0 * H * features * T, recurrent = dirs * 8.0 * H * H * T;
  const double step_gemm_io = dirs * T * 5.0 * H * eb;  // reads h (H), writes 4 H pre-activations
  l.kernels = {make_kernel(KernelClass::Gemm, input_proj, input_proj, input_proj + recurrent,
                           dirs * T * (features + 4.0 * H) * eb, 2 * dirs * T * (features + 4.0 * H) * eb,
                           dirs * 4.0 * H * features * eb),
               make_kernel(KernelClass::Gemm, recurrent, recurrent, 0, step_gemm_io, step_gemm_io,
                           4.0 * H * H * eb, dirs * T),
               make_kernel(KernelClass::Elementwise, 0, 0, 0, dirs * T * 7.0 * H * eb,
                           dirs * T * 11.0 * H * eb, 0, dirs * T)};
  l.kernels[1].recurrent_step = true;  // one call per step: the library's per-step work on top
  l.stash_bytes = dirs * steps * 6.0 * hidden * element_bytes(w_.precision);  // 4 gates + cell + hidden
  return add_layer(std::move(l), std::move(out), in);
}

Result<int> ModelBuilder::attention(const std::string& name, const std::vector<int>& in, int64_t heads) {
  if (in.size() == 2) {
    // Additive (Bahdanau, normalised as in GNMT) attention of a query sequence over a memory.
    const Shape& q = shape(in[0]);
    const Shape& m = shape(in[1]);
    if (q.size() != 2) return mismatch(name, "a query [steps, hidden]", in[0]);
    if (m.size() != 2 || m[1] != q[1])
      return mismatch(name, fmt::format("a memory [steps, {}]", q[1]), in[1]);
    const double h = static_cast<double>(q[1]), tq = static_cast<double>(q[0]),
                 tm = static_cast<double>(m[0]);
    Layer l;
    l.name = name;
    l.kind = "attention";
    const double projections = 2 * tq * h * h + 2 * tm * h * h;
    const double eb = element_bytes(w_.precision);
    l.parameters = 2 * h * h + 2 * h + 1;  // query and key projections, score vector, bias, scale
    l.parameter_bytes = l.parameters * eb;
    l.weight_bytes = l.parameter_bytes;
    const double proj_io = 2 * (tq + tm) * h * eb;
    // The scores v^T tanh(W_q q_i + W_k k_j) need the sum of every query and key projection: a
    // tq x tm x h tensor per sample (GNMT at batch 128 and 50 x 50 tokens: 327.7 M elements).
    // Element-wise and memory-bound: forward the broadcast add writes it, tanh reads and writes it,
    // the product with v reads it (4 passes; its tq tm h multiply-adds and the context's count as the
    // attention kernel's FLOPs, as before); backward the product's gradient writes it, tanh's
    // reads it twice (gradient and output) and writes it, the two reductions back to the query and
    // key projections read it twice (6 passes). Then the softmax over the tm scores (2 passes
    // forward, 3 backward of tq x tm) and the context, a batched GEMM of the tq x tm weights by the
    // memory, which reads the weights.
    const double big = tq * tm * h, small = tq * tm;
    l.kernels = {make_kernel(KernelClass::Gemm, projections, projections, projections, proj_io, 2 * proj_io,
                             l.weight_bytes / 2, 2),
                 make_kernel(KernelClass::Elementwise, 0, 0, 0, (4 * big + 2 * small) * eb,
                             (6 * big + 3 * small) * eb, 0, 4),
                 make_kernel(KernelClass::Attention, 4 * small * h, 8 * small * h, 0,
                             (small + (tq + tm) * h) * eb, 2 * (small + (tq + tm) * h) * eb)};
    l.stash_bytes = (tq * h + tm * h + tq * tm + big) * eb;  // with the tanh output
    return add_layer(std::move(l), q, in);
  }
  if (in.size() != 1)
    return Error{fmt::format("layer \"{}\" (attention) needs 1 or 2 inputs, got {}", name, in.size())};
  const Shape& s = shape(in[0]);
  if (s.size() != 2) return mismatch(name, "[sequence, hidden]", in[0]);
  if (heads < 1 || s[1] % heads)
    return Error{fmt::format("layer \"{}\": {} heads do not divide the hidden size {}", name, heads, s[1])};
  const double seq = static_cast<double>(s[0]), h = static_cast<double>(s[1]);
  Layer l;
  l.name = name;
  l.kind = "attention";
  const double projections = 8 * seq * h * h;  // Q, K, V and output
  const double scores = 4 * seq * seq * h;     // Q K^T and attention x V
  const double eb = element_bytes(w_.precision);
  l.parameters = 4 * h * h + 4 * h;
  l.parameter_bytes = l.parameters * eb;
  l.weight_bytes = l.parameter_bytes;
  const double a = static_cast<double>(heads);
  // Projections (GEMMs), the attention core's batched GEMMs and the unfused passes over the scores.
  // Calls per pass: the fused QKV and the output projection; Q K^T and scores x V; scale, mask,
  // softmax, dropout.
  l.kernels = {make_kernel(KernelClass::Gemm, projections, projections, projections, 6 * seq * h * eb,
                           12 * seq * h * eb, l.weight_bytes / 2, 2),
               score_core(scores, seq * h, a * seq * seq, eb), score_passes(a * seq * seq, eb)};
  // Korthikanti et al. for the attention half of a block: 11 s h + 5 a s^2 bytes at 16 bits.
  l.stash_bytes = (11 * seq * h + 5 * heads * seq * seq) * eb / 2;
  l.selective_stash_bytes = 11 * seq * h * eb / 2;
  set_totals(l);  // forward_flops is the kernels' sum (it was 0 here: the fraction was infinite)
  l.selective_recompute_fraction = scores / l.forward_flops;
  return add_layer(std::move(l), s, in);
}

Result<int> ModelBuilder::transformer_block(const std::string& name, int in, int64_t heads, int64_t ffn) {
  const Shape& s = shape(in);
  if (s.size() != 2) return mismatch(name, "[sequence, hidden]", in);
  if (heads < 1 || s[1] % heads)
    return Error{fmt::format("layer \"{}\": {} heads do not divide the hidden size {}", name, heads, s[1])};
  const double seq = static_cast<double>(s[0]), h = static_cast<double>(s[1]), f = static_cast<double>(ffn);
  const double eb = element_bytes(w_.precision);
  Layer l;
  l.name = name;
  l.kind = "transformer_block";
  const double weighted = 8 * seq * h * h + 4 * seq * h * f;  // QKV, output projection, two MLP matrices
  const double scores = 4 * seq * seq * h;
  l.parameters = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h;  // attention, MLP, two LayerNorms
  l.parameter_bytes = l.parameters * eb;
  l.weight_bytes = l.parameter_bytes;
  const double a = static_cast<double>(heads);
  // The four GEMMs (each reads its input and writes its output), the attention core's batched
  // GEMMs, the unfused passes over the scores (scale, mask, softmax, dropout: score_passes), the
  // other element-wise work (GeLU, two dropouts, two residual additions) and two LayerNorms, as
  // separate kernels (no fusion assumed; `attention: fused` fuses the core, use_attention).
  const double gemm_io = (8 * seq * h + 2 * seq * f) * eb;
  const double ew_io = (10 * seq * h + 2 * seq * f) * eb;
  // Calls per pass (each pays the kernel startup): 4 GEMMs (fused QKV, output projection, two MLP
  // matrices), 2 batched GEMMs, 4 passes over the scores, 5 other element-wise kernels, 2 LayerNorms.
  l.kernels = {make_kernel(KernelClass::Gemm, weighted, weighted, weighted, gemm_io, 2 * gemm_io,
                           l.weight_bytes / 4, 4),
               score_core(scores, seq * h, a * seq * seq, eb), score_passes(a * seq * seq, eb),
               make_kernel(KernelClass::Elementwise, 0, 0, 0, ew_io, 1.5 * ew_io, 0, 5),
               make_kernel(KernelClass::Norm, 0, 0, 0, 4 * seq * h * eb, 6 * seq * h * eb, 0, 2)};
  set_totals(l);  // forward_flops is the kernels' sum (it was 0 here: the fraction was infinite)
  l.selective_recompute_fraction = scores / l.forward_flops;
  l.split = {
      TensorSplitKind::Transformer, seq, h, a, a, f, 0, /*gated=*/false, /*biases=*/true, /*rotary=*/false};
  // The stash from the split, as at t > 1 (core/tensor_parallel.cc): Korthikanti et al. 2022's s h
  // (34 + 5 a s / h) bytes at 16 bits where ffn = 4h (34 s h with selective recomputation of the
  // attention core), the MLP's own width otherwise, fp8's GEMM inputs at a byte. Until 2026-12-05 the
  // formula alone at t = 1, whatever ffn and precision.
  Result<TpLayer> tp = tensor_parallel_layer(l, 1, {}, w_.precision);
  if (!tp) return tp.error();
  l.stash_bytes = tp->stash_none;
  l.selective_stash_bytes = tp->stash_selective;
  return add_layer(std::move(l), s, {in});
}

Result<int> ModelBuilder::decoder_block(const std::string& name, int in, const TensorSplit& split) {
  const Shape& s = shape(in);
  if (s.size() != 2) return mismatch(name, "[sequence, hidden]", in);
  const bool moe = split.kind == TensorSplitKind::MoeBlock;
  if (split.heads < 1 ||
      (split.head_dim <= 0 && !split.mla.enabled() && std::fmod(split.hidden, split.heads) != 0) ||
      split.kv_heads < 1 || std::fmod(split.heads, split.kv_heads) != 0)
    return Error{
        fmt::format("layer \"{}\": {} heads must divide the hidden size {} and be a multiple of the {} "
                    "key-value heads",
                    name, split.heads, split.hidden, split.kv_heads)};
  Layer l;
  l.name = name;
  l.kind = moe ? "moe_block" : "decoder_block";
  l.split = split;
  l.split.kind = moe ? TensorSplitKind::MoeBlock : TensorSplitKind::Transformer;
  l.split.sequence = static_cast<double>(s[0]);
  l.split.hidden = static_cast<double>(s[1]);
  if (Status st = build_from_split(l, w_.precision); !st) return st.error();
  return add_layer(std::move(l), s, {in});
}

Result<int> ModelBuilder::embedding(const std::string& name, int in, int64_t vocabulary, int64_t dim,
                                    int tied_to) {
  const Shape& s = shape(in);
  if (s.size() != 1) return mismatch(name, "[tokens] (token ids)", in);
  Shape out{s[0], dim};
  Layer l;
  l.name = name;
  l.kind = "embedding";
  l.split = {TensorSplitKind::VocabEmbedding, static_cast<double>(s[0]), static_cast<double>(dim), 0, 0, 0,
             static_cast<double>(vocabulary)};
  l.parameters = tied_to >= 0 ? 0 : static_cast<double>(vocabulary) * dim;
  l.tied_to = tied_to;
  l.tied_parameters = tied_to >= 0 ? static_cast<double>(vocabulary) * dim : 0;
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  // Gather the rows and write the output; scatter-add the gradients.
  l.kernels = {make_kernel(KernelClass::Gather, 0, 0, 0, 2 * bytes(out), 2 * bytes(out))};
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::softmax_loss(const std::string& name, int in) {
  const Shape& s = shape(in);
  if (s.empty()) return mismatch(name, "logits", in);
  const double n = elems(s), eb = element_bytes(w_.precision), f32 = 4;
  Layer l;
  l.name = name;
  l.kind = "softmax_loss";
  // Forward: log_softmax reads the logits twice (max and sum, then normalise) and writes the
  // log-probabilities in fp32; the loss (with label smoothing, a mean over the vocabulary too) reads
  // them. Backward: one kernel reads the log-probabilities and writes the logits' gradient.
  l.kernels = {make_kernel(KernelClass::Elementwise, 0, 0, 0, n * (2 * eb + 2 * f32), n * (f32 + eb), 0, 2)};
  l.stash_bytes = n * f32;
  return add_layer(std::move(l), Shape{1}, {in});
}

Result<int> ModelBuilder::embedding_bag(const std::string& name, int in, int64_t rows, int64_t dim,
                                        int64_t bag, bool pooled) {
  Shape out{pooled ? dim : bag * dim};
  Layer l;
  l.name = name;
  l.kind = "embedding_bag";
  l.parameters = static_cast<double>(rows) * dim;
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  const double looked_up = static_cast<double>(bag) * dim * element_bytes(w_.precision);
  l.kernels = {make_kernel(KernelClass::Gather, 0, 0, 0, looked_up + bytes(out), looked_up + bytes(out))};
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::custom(const std::string& name, const std::vector<int>& in, const Layer& costs,
                                 Shape output) {
  Layer l = costs;
  l.name = name;
  if (l.kind.empty()) l.kind = "custom";
  const double given_output = l.output_bytes;
  Result<int> id = add_layer(std::move(l), std::move(output), in);
  if (id && given_output > 0) w_.graph[*id].output_bytes = given_output;
  return id;
}

Workload ModelBuilder::finish(double default_micro_batch_size) {
  w_.micro_batch_size = default_micro_batch_size;
  w_.input_bytes_per_sample = 0;
  for (size_t i = 0; i < w_.layer_count(); ++i)
    if (w_.layer(i).kind == "input") w_.input_bytes_per_sample += w_.layer(i).output_bytes;
  shapes_.clear();
  return std::move(w_);
}

}  // namespace pipegrid
