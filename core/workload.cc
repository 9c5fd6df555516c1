#include "core/workload.h"

#include <fmt/format.h>

#include <queue>

namespace pipegrid {

double element_bytes(Precision p) {
  switch (p) {
    case Precision::FP32:
      return 4;
    case Precision::TF32:
      return 4;
    case Precision::FP16:
      return 2;
    case Precision::BF16:
      return 2;
    case Precision::INT8:
      return 1;
    case Precision::AMP:
      return 2;
    case Precision::AMP_BF16:
      return 2;
    case Precision::FP8:
      return 1;
    case Precision::AMP_FP8:
    case Precision::AMP_FP8_BLOCKWISE:
    case Precision::AMP_MXFP8:
      return 2;
  }
  return 4;
}

double fp8_saved_bytes(Precision p) {
  switch (p) {
    case Precision::AMP_FP8:
      return 1;
    case Precision::AMP_FP8_BLOCKWISE:
      return 1 + 4.0 / 128;
    case Precision::AMP_MXFP8:
      return 1 + 1.0 / 32;
    default:
      return element_bytes(p);
  }
}

bool fp8_training(Precision p) {
  return p == Precision::AMP_FP8 || p == Precision::AMP_FP8_BLOCKWISE || p == Precision::AMP_MXFP8;
}

double fp8_cast_bytes(Precision p) {
  if (p == Precision::AMP_FP8) return 5;
  return fp8_training(p) ? 3 : 0;
}

double fp8_quantize_kernels(Precision p) {
  if (p == Precision::AMP_FP8) return 3;
  return fp8_training(p) ? 1 : 0;
}

double fp8_gemm_rate(Precision p) {
  return p == Precision::AMP_MXFP8 ? 6.812 / 7.161 : 1.0;
}

Precision math_precision(Precision p) {
  if (p == Precision::AMP) return Precision::FP16;
  if (p == Precision::AMP_BF16 || fp8_training(p)) return Precision::BF16;
  return p;
}

bool mixed_precision(Precision p) {
  return p == Precision::AMP || p == Precision::AMP_BF16 || fp8_training(p);
}

std::string_view to_string(TensorSplitKind k) {
  switch (k) {
    case TensorSplitKind::Undefined:
      return "none";
    case TensorSplitKind::Input:
      return "input";
    case TensorSplitKind::Replicated:
      return "replicated";
    case TensorSplitKind::Transformer:
      return "transformer";
    case TensorSplitKind::VocabEmbedding:
      return "vocabulary-parallel embedding";
    case TensorSplitKind::VocabHead:
      return "vocabulary-parallel head";
    case TensorSplitKind::MoeBlock:
      return "mixture-of-experts block";
    case TensorSplitKind::ColumnGathered:
      return "column-parallel linear, output gathered";
  }
  return "?";
}

std::string_view to_string(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::FP16:
      return "fp16";
    case Precision::BF16:
      return "bf16";
    case Precision::INT8:
      return "int8";
    case Precision::AMP:
      return "amp";
    case Precision::AMP_BF16:
      return "amp-bf16";
    case Precision::FP8:      // the arithmetic format (devices' rates)
    case Precision::AMP_FP8:  // the training (workloads)
      return "fp8";
    case Precision::AMP_FP8_BLOCKWISE:
      return "fp8-blockwise";
    case Precision::AMP_MXFP8:
      return "mxfp8";
  }
  return "fp32";
}

std::optional<Precision> parse_precision(std::string_view s) {
  for (Precision p : kPrecisions)
    if (to_string(p) == s) return p;
  return std::nullopt;
}

std::vector<std::string_view> precision_names() {
  std::vector<std::string_view> out;
  for (Precision p : kPrecisions) out.push_back(to_string(p));
  return out;
}

std::string precision_choices() {
  std::string out;
  for (size_t i = 0; i < kPrecisions.size(); ++i)
    out += fmt::format("{}{}",
                       i == 0                        ? ""
                       : i + 1 == kPrecisions.size() ? " or "
                                                     : ", ",
                       to_string(kPrecisions[i]));
  return out;
}

std::string_view to_string(KernelClass k) {
  switch (k) {
    case KernelClass::Gemm:
      return "gemm";
    case KernelClass::Conv:
      return "conv";
    case KernelClass::Attention:
      return "attention";
    case KernelClass::Recurrent:
      return "recurrent";
    case KernelClass::Gather:
      return "gather";
    case KernelClass::Elementwise:
      return "elementwise";
    case KernelClass::Norm:
      return "norm";
    case KernelClass::GroupedGemm:
      return "grouped-gemm";
    case KernelClass::Strided:
      return "strided";
    case KernelClass::Compiled:
      return "compiled";
  }
  return "gemm";
}

std::optional<KernelClass> parse_kernel_class(std::string_view s) {
  for (KernelClass k : kKernelClasses)
    if (to_string(k) == s) return k;
  return std::nullopt;
}

KernelClass kernel_class_of_kind(std::string_view kind, bool has_flops) {
  if (kind == "conv2d") return KernelClass::Conv;
  if (kind == "lstm") return KernelClass::Recurrent;
  if (kind == "attention") return KernelClass::Attention;
  if (kind == "embedding" || kind == "embedding_bag") return KernelClass::Gather;
  if (kind == "batchnorm" || kind == "layernorm") return KernelClass::Norm;
  return has_flops ? KernelClass::Gemm : KernelClass::Elementwise;
}

std::vector<Kernel> layer_kernels(const Layer& l) {
  if (!l.kernels.empty()) return l.kernels;
  Kernel k;
  k.forward_flops = l.forward_flops;
  k.backward_input_flops = l.backward_input_flops;
  k.backward_weight_flops = l.backward_weight_flops;
  k.forward_bytes = l.forward_bytes;
  k.backward_bytes = l.backward_bytes;
  k.weight_bytes = l.weight_bytes;
  const bool has_flops = l.forward_flops > 0 || l.backward_input_flops > 0 || l.backward_weight_flops > 0;
  k.cls = kernel_class_of_kind(l.kind, has_flops);
  return {k};
}

Status check_acyclic(const Workload& w, std::pair<int, int>* closing_edge) {
  // Iterative DFS with colours; on a back edge, walk the parent chain to print the cycle.
  const size_t n = w.layer_count();
  std::vector<int> colour(n, 0), parent(n, -1);
  for (size_t root = 0; root < n; ++root) {
    if (colour[root] != 0) continue;
    std::vector<std::pair<int, LayerGraph::out_edge_iterator>> stack;
    colour[root] = 1;
    stack.emplace_back(static_cast<int>(root), boost::out_edges(root, w.graph).first);
    while (!stack.empty()) {
      auto& [u, it] = stack.back();
      if (it == boost::out_edges(u, w.graph).second) {
        colour[u] = 2;
        stack.pop_back();
        continue;
      }
      int v = static_cast<int>(boost::target(*it, w.graph));
      ++it;
      if (colour[v] == 1) {
        std::vector<int> cycle{v};
        for (int x = u; x != v; x = parent[x]) cycle.push_back(x);
        // cycle = v, u, parent(u), ..., child of v: the path runs v -> child ... -> u -> v.
        std::string text = w.layer(v).name;
        for (size_t k = cycle.size() - 1; k >= 1; --k) text += " -> " + w.layer(cycle[k]).name;
        text += " -> " + w.layer(v).name;
        if (closing_edge) *closing_edge = {u, v};
        return Error{fmt::format("the layer graph has a cycle: {}", text)};
      }
      if (colour[v] == 0) {
        colour[v] = 1;
        parent[v] = u;
        stack.emplace_back(v, boost::out_edges(v, w.graph).first);
      }
    }
  }
  return {};
}

std::vector<int> topological_order(const Workload& w) {
  const size_t n = w.layer_count();
  std::vector<int> indeg(n, 0);
  for (size_t v = 0; v < n; ++v) indeg[v] = static_cast<int>(boost::in_degree(v, w.graph));
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (size_t v = 0; v < n; ++v)
    if (indeg[v] == 0) ready.push(static_cast<int>(v));
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    int u = ready.top();
    ready.pop();
    order.push_back(u);
    for (auto [it, end] = boost::out_edges(u, w.graph); it != end; ++it) {
      int v = static_cast<int>(boost::target(*it, w.graph));
      if (--indeg[v] == 0) ready.push(v);
    }
  }
  return order;
}

void add_layer_totals(Layer& into, const Layer& from) {
  into.forward_flops += from.forward_flops;
  into.backward_input_flops += from.backward_input_flops;
  into.backward_weight_flops += from.backward_weight_flops;
  into.forward_bytes += from.forward_bytes;
  into.backward_bytes += from.backward_bytes;
  into.stash_bytes += from.stash_bytes;
  into.parameters += from.parameters;
  into.parameter_bytes += from.parameter_bytes;
  into.weight_bytes += from.weight_bytes;
}

double total_parameters(const Workload& w) {
  double s = 0;
  for (size_t i = 0; i < w.layer_count(); ++i) s += w.layer(i).parameters;
  return s;
}

double tied_bytes(const Workload& w, const Layer& tied, double parameters) {
  const Layer& source = w.layer(static_cast<size_t>(tied.tied_to));
  return parameters *
         (source.parameters > 0 ? source.parameter_bytes / source.parameters : element_bytes(w.precision));
}

double total_parameter_bytes(const Workload& w) {
  double s = 0;
  for (size_t i = 0; i < w.layer_count(); ++i) s += w.layer(i).parameter_bytes;
  return s;
}

double total_forward_flops(const Workload& w) {
  double s = 0;
  for (size_t i = 0; i < w.layer_count(); ++i) s += w.layer(i).forward_flops;
  return s;
}

}  // namespace pipegrid
