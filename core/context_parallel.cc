#include "core/context_parallel.h"

#include <fmt/format.h>

#include <cmath>

namespace pipegrid {

std::string_view to_string(CpAlgorithm a) {
  switch (a) {
    case CpAlgorithm::P2P:
      return "p2p";
    case CpAlgorithm::AllGather:
      return "all_gather";
    case CpAlgorithm::AllToAll:
      return "a2a";
  }
  return "?";
}

std::optional<CpAlgorithm> parse_cp_algorithm(std::string_view name) {
  for (CpAlgorithm a : {CpAlgorithm::P2P, CpAlgorithm::AllGather, CpAlgorithm::AllToAll})
    if (name == to_string(a)) return a;
  return std::nullopt;
}

std::vector<double> attention_step_work(const ContextRank& r, const ContextParallelOptions& o, bool causal) {
  const int cp = r.cp;
  std::vector<double> steps(static_cast<size_t>(cp), causal ? 0.5 : 1.0);
  if (causal && !o.load_balance && o.algorithm != CpAlgorithm::AllToAll)
    // Step i holds the K/V of rank r - i (mod cp): all visible when it came from an earlier rank.
    for (int i = 1; i < cp; ++i) steps[static_cast<size_t>(i)] = i <= r.rank ? 1.0 : 0.0;
  if (o.algorithm == CpAlgorithm::P2P) return steps;
  double total = 0;
  for (double w : steps) total += w;
  return {total};
}

namespace {

// Widths per token on one device of t: the queries' (and the output's) and one of K or V.
double query_width(const TensorSplit& sp) {
  if (sp.mla.enabled()) return sp.heads * (sp.head_dim + sp.mla.rope_dim);
  return sp.head_dim > 0 ? sp.heads * sp.head_dim : sp.hidden;
}
double kv_width(const TensorSplit& sp) {
  if (sp.mla.enabled()) return sp.heads * (sp.head_dim + sp.mla.rope_dim + sp.mla.v_dim) / 2;
  const double hd = sp.head_dim > 0 ? sp.head_dim : sp.hidden / sp.heads;
  return (sp.kv_heads > 0 ? sp.kv_heads : sp.heads) * hd;
}

}  // namespace

double kv_block_bytes(const TensorSplit& sp, int t, int cp, double element_bytes) {
  return 2 * sp.sequence / cp * kv_width(sp) / t * element_bytes;
}

double qkv_block_bytes(const TensorSplit& sp, int t, int cp, double element_bytes) {
  return sp.sequence / cp * query_width(sp) / t * element_bytes + kv_block_bytes(sp, t, cp, element_bytes);
}

double output_block_bytes(const TensorSplit& sp, int t, int cp, double element_bytes) {
  const double width = sp.mla.enabled() ? sp.heads * sp.mla.v_dim : query_width(sp);
  return sp.sequence / cp * width / t * element_bytes;
}

Status check_context_parallel(const Layer& l, int t, int cp, const ContextParallelOptions& o) {
  const TensorSplit& sp = l.split;
  if (cp <= 1) return {};
  auto bad = [&](const std::string& why) {
    return Error{fmt::format("layer \"{}\": context_parallel {} {}", l.name, cp, why)};
  };
  if (sp.kind == TensorSplitKind::Undefined)
    return bad(
        "splits a transformer's sequence, and this layer has no defined split (a convolution, a recurrent or "
        "custom layer); expected transformer layers");
  if (!is_block(sp.kind)) return {};
  if (sp.window > 0)
    return bad("with sliding-window attention is not modelled (the window's K/V exchange is not TE's ring)");
  const bool chunks = o.load_balance && o.algorithm != CpAlgorithm::AllToAll;
  const int parts = chunks ? 2 * cp : cp;
  if (std::fmod(sp.sequence, parts) != 0)
    return bad(fmt::format("does not split its sequence of {:g} tokens into {} {} (cp_algorithm {}{})",
                           sp.sequence, parts, chunks ? "chunks of the load-balanced split" : "equal parts",
                           to_string(o.algorithm), chunks ? ": Megatron needs s divisible by 2 cp" : ""));
  if (o.algorithm == CpAlgorithm::AllToAll) {
    const double kv = sp.kv_heads > 0 ? sp.kv_heads : sp.heads;
    for (auto [value, what] : {std::pair{sp.heads, "attention heads"}, std::pair{kv, "key-value heads"}})
      if (std::fmod(value / t, cp) != 0)
        return bad(
            fmt::format("does not divide its {} per device ({:g} / tensor_parallel {}): cp_algorithm a2a "
                        "scatters them over the context-parallel group",
                        what, value, t));
  }
  return {};
}

}  // namespace pipegrid
