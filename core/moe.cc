#include "core/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pipegrid {

std::string_view to_string(MoeDispatcher d) {
  switch (d) {
    case MoeDispatcher::AllToAll:
      return "alltoall";
    case MoeDispatcher::AllGather:
      return "allgather";
    case MoeDispatcher::DeepEP:
      return "deepep";
  }
  return "alltoall";
}

std::optional<MoeDispatcher> parse_dispatcher(std::string_view name) {
  for (MoeDispatcher d : {MoeDispatcher::AllToAll, MoeDispatcher::AllGather, MoeDispatcher::DeepEP})
    if (to_string(d) == name) return d;
  return std::nullopt;
}

namespace {
// C(n, k) as a double (0 outside 0 <= k <= n).
double choose(int n, int k) {
  if (k < 0 || k > n) return 0;
  double c = 1;
  for (int i = 0; i < k; ++i) c = c * (n - i) / (i + 1);
  return c;
}
// None of k experts drawn uniformly without replacement from `pool` is one of `marked`.
double miss(int pool, int k, int marked) {
  double m = 1;
  for (int i = 0; i < k; ++i) m *= std::max(0.0, static_cast<double>(pool - marked - i)) / (pool - i);
  return m;
}
}  // namespace

RoutingDraw routing_draw(const MoeShape& m) {
  RoutingDraw r{static_cast<int>(m.experts), static_cast<int>(m.top_k)};
  if (m.groups > 1) {
    r.groups = static_cast<int>(m.groups);
    r.top_groups = static_cast<int>(m.top_groups);
  }
  return r;
}

bool aligned_with_groups(const RoutingDraw& r, int held) {
  if (!r.limited()) return true;
  const int size = r.experts / r.groups;
  return held > 0 && (size % held == 0 || held % size == 0);
}

double routed_hit_probability(const RoutingDraw& r, int held) {
  if (!r.limited()) return 1 - miss(r.experts, r.top_k, held);
  const int size = r.experts / r.groups, G = r.groups, M = r.top_groups;
  const int spanned = held <= size ? 1 : held / size, per_group = held <= size ? held : size;
  double none = 0;
  for (int j = 0; j <= std::min(spanned, M); ++j)
    none += choose(spanned, j) * choose(G - spanned, M - j) / choose(G, M) *
            miss(M * size, r.top_k, j * per_group);
  return 1 - none;
}

std::string_view to_string(CommGroup g) {
  switch (g) {
    case CommGroup::Tensor:
      return "tensor-parallel";
    case CommGroup::Expert:
      return "expert-parallel";
    case CommGroup::ExpertTensor:
      return "expert tensor-parallel";
    case CommGroup::ExpertAndTensor:
      return "expert and expert tensor-parallel";
    case CommGroup::Context:
      return "context-parallel";
  }
  return "?";
}

std::vector<double> zipf_shares(int experts, double exponent) {
  std::vector<double> s(static_cast<size_t>(std::max(0, experts)));
  for (size_t k = 0; k < s.size(); ++k) s[k] = 1 / std::pow(static_cast<double>(k + 1), exponent);
  const double total = std::accumulate(s.begin(), s.end(), 0.0);
  for (double& x : s) x /= total;
  return s;
}

std::vector<double> expert_loads(const MoeOptions& o, int experts, int ep) {
  std::vector<double> loads(static_cast<size_t>(std::max(1, ep)), 0.0);
  const bool balanced = o.expert_shares.empty();
  if (balanced && o.capacity_factor <= 0) {
    std::fill(loads.begin(), loads.end(), 1.0 / ep);
    return loads;
  }
  const double cap = o.capacity_factor > 0 ? o.capacity_factor / experts : 1.0;
  const int per_rank = experts / std::max(1, ep);
  for (int e = 0; e < experts; ++e) {
    const double share = balanced ? 1.0 / experts : o.expert_shares[static_cast<size_t>(e)];
    loads[static_cast<size_t>(std::min(ep - 1, e / std::max(1, per_rank)))] += std::min(share, cap);
  }
  return loads;
}

double kept_copy_share(const MoeOptions& o, int experts) {
  return expert_loads(o, experts, 1).front();
}

double routed_experts(const Workload& w) {
  for (size_t i = 0; i < w.layer_count(); ++i)
    if (w.layer(i).split.kind == TensorSplitKind::MoeBlock) return w.layer(i).split.moe.experts;
  return 0;
}

std::string eager_expert_work(const Workload& w) {
  bool bias = false, clamp = false;
  for (size_t i = 0; i < w.layer_count(); ++i) {
    const TensorSplit& s = w.layer(i).split;
    if (s.kind != TensorSplitKind::MoeBlock) continue;
    bias = bias || s.biases;
    clamp = clamp || (s.moe.clamp && s.gated);
  }
  return bias && clamp ? "fc2's bias and the GLU's clamp"
         : bias        ? "fc2's bias"
         : clamp       ? "the GLU's clamp"
                       : "";
}

bool compiled_expert_activation(const Workload& w) {
  for (size_t i = 0; i < w.layer_count(); ++i)
    if (w.layer(i).split.kind == TensorSplitKind::MoeBlock && w.layer(i).split.gated) return true;
  return false;
}

RoutingDraw moe_routing(const Workload& w) {
  for (size_t i = 0; i < w.layer_count(); ++i)
    if (w.layer(i).split.kind == TensorSplitKind::MoeBlock) return routing_draw(w.layer(i).split.moe);
  return {};
}

double load_imbalance(const std::vector<double>& loads) {
  if (loads.empty()) return 1;
  const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / static_cast<double>(loads.size());
  return mean > 0 ? *std::max_element(loads.begin(), loads.end()) / mean : 1;
}

Status check_moe(const Layer& l, const ExpertSizes& e, const MoeOptions& o) {
  const MoeShape& m = l.split.moe;
  auto bad = [&](std::string what) { return Error{fmt::format("layer \"{}\": {}", l.name, what)}; };
  if (m.experts < 1 || m.experts != std::floor(m.experts))
    return bad(
        fmt::format("a mixture-of-experts block needs a whole number of experts, got {:g}", m.experts));
  if (m.top_k < 1 || m.top_k > m.experts || m.top_k != std::floor(m.top_k))
    return bad(
        fmt::format("top_k must be a whole number from 1 to the {:g} experts, got {:g}", m.experts, m.top_k));
  if (std::fmod(m.experts, e.ep) != 0)
    return bad(fmt::format("expert_parallel {} does not divide its {:g} experts (each device holds E / ep)",
                           e.ep, m.experts));
  if (m.groups > 0 && (m.groups != std::floor(m.groups) || std::fmod(m.experts, m.groups) != 0))
    return bad(fmt::format("router_groups {:g} does not divide its {:g} experts into equal groups", m.groups,
                           m.experts));
  if (m.groups > 0 &&
      (m.top_groups < 1 || m.top_groups > m.groups || m.top_groups != std::floor(m.top_groups) ||
       m.top_k > m.top_groups * m.experts / m.groups))
    return bad(
        fmt::format("router_group_topk must be a whole number from 1 to the {:g} groups whose experts "
                    "hold the top_k {:g}, got {:g}",
                    m.groups, m.top_k, m.top_groups));
  if (std::fmod(m.expert_ffn, e.etp) != 0)
    return bad(fmt::format("expert_tensor_parallel {} does not divide its expert FFN width {:g}", e.etp,
                           m.expert_ffn));
  if (!o.expert_shares.empty()) {
    if (o.expert_shares.size() != static_cast<size_t>(m.experts))
      return bad(fmt::format("the routing gives {} expert shares for {:g} experts", o.expert_shares.size(),
                             m.experts));
    double total = 0;
    for (double x : o.expert_shares) {
      if (!(x >= 0)) return bad(fmt::format("a routing share is {:g}; shares are fractions >= 0", x));
      total += x;
    }
    if (std::abs(total - 1) > 1e-6)
      return bad(fmt::format("the routing's expert shares sum to {:.6g}, not 1", total));
  }
  if (o.dispatcher == MoeDispatcher::DeepEP && !o.expert_shares.empty())
    return bad(
        "the deepep dispatcher models balanced routing only (its de-duplication assumes uniformly "
        "drawn experts); drop `routing` or use alltoall");
  if (o.dispatcher == MoeDispatcher::DeepEP && o.capacity_factor > 0 && o.capacity_factor < 1)
    return bad(
        fmt::format("the deepep dispatcher is modelled dropless; capacity_factor {:g} drops tokens "
                    "(use >= 1, or alltoall)",
                    o.capacity_factor));
  return {};
}

std::optional<std::string> moe_overlap_refusal(int ep, MoeDispatcher dispatcher, int stages,
                                               std::string_view schedule, int micro_batches) {
  if (schedule == "dualpipe" || schedule == "dualpipev")
    return fmt::format("{} pairs its forward and backward chunks itself (its overlap is built in)", schedule);
  if (ep <= 1)
    return "it overlaps the expert-parallel all-to-alls, and at ep 1 there are none (Megatron-Core requires "
           "expert_parallel > 1 with it)";
  if (dispatcher == MoeDispatcher::AllGather)
    return "Megatron-Core overlaps the alltoall and flex (deepep) dispatchers only, not allgather";
  if (micro_batches == 1)
    return "it pairs a micro-batch's forward with another's backward, and there is one micro-batch";
  if (stages <= 1 && (schedule == "zb-h1" || schedule == "zb-h2"))
    return fmt::format(
        "at p = 1 {} runs each micro-batch's forward, input-gradient and weight-gradient passes in turn, so "
        "no forward lies next to another micro-batch's backward to pair with (Megatron-Core's overlap "
        "without a pipeline pairs 1f1b's order)",
        schedule);
  if (stages > 1 && schedule != "interleaved-1f1b")
    return fmt::format(
        "with a pipeline (p = {}) Megatron-Core requires a virtual pipeline (interleaved-1f1b), got {}: "
        "pairing 1F1B's adjacent forward and backward would hold each forward's output until the "
        "backward ends",
        stages, schedule);
  return std::nullopt;
}

std::vector<int> group_members(CommGroup g, int r, int t, const ExpertSizes& e, int cp) {
  std::vector<int> out;
  switch (g) {
    case CommGroup::Tensor:
      for (int i = 0; i < t; ++i) out.push_back(r - r % t + i);
      break;
    case CommGroup::ExpertTensor:
      for (int i = 0; i < e.etp; ++i) out.push_back(r - r % e.etp + i);
      break;
    case CommGroup::Expert: {
      const int base = r % e.etp + (r / (e.etp * e.ep)) * e.etp * e.ep;
      for (int x = 0; x < e.ep; ++x) out.push_back(base + x * e.etp);
      break;
    }
    case CommGroup::ExpertAndTensor: {
      const int base = (r / (e.etp * e.ep)) * e.etp * e.ep;
      for (int x = 0; x < e.etp * e.ep; ++x) out.push_back(base + x);
      break;
    }
    case CommGroup::Context: {
      const int base = (r / (t * cp)) * t * cp + r % t;
      for (int c = 0; c < cp; ++c) out.push_back(base + c * t);
      break;
    }
  }
  return out;
}

}  // namespace pipegrid
