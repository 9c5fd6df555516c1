#include "core/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace pipegrid {

std::vector<int> Partition::predecessors(int s) const {
  std::vector<int> out;
  for (auto [it, end] = boost::in_edges(s, graph); it != end; ++it)
    out.push_back(static_cast<int>(boost::source(*it, graph)));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> Partition::successors(int s) const {
  std::vector<int> out;
  for (auto [it, end] = boost::out_edges(s, graph); it != end; ++it)
    out.push_back(static_cast<int>(boost::target(*it, graph)));
  std::sort(out.begin(), out.end());
  return out;
}

bool Partition::is_chain() const {
  const size_t n = stage_count();
  for (size_t s = 0; s < n; ++s) {
    std::vector<int> succ = successors(static_cast<int>(s));
    if (s + 1 < n ? (succ.size() != 1 || succ[0] != static_cast<int>(s + 1)) : !succ.empty()) return false;
  }
  return true;
}

int Partition::depth() const {
  const size_t n = stage_count();
  std::vector<int> longest(n, 1);  // longest path ending at s, in stages
  int best = n > 0 ? 1 : 0;
  for (size_t s = 0; s < n; ++s) {
    for (int p : predecessors(static_cast<int>(s))) longest[s] = std::max(longest[s], longest[p] + 1);
    best = std::max(best, longest[s]);
  }
  return best;
}

std::vector<TiedCopy> tied_copies(const Workload& w, const Partition& p) {
  std::vector<TiedCopy> out;
  std::map<int, std::vector<int>> holders;  // a tied layer's source -> the stages holding it
  for (size_t s = 0; s < p.stage_count(); ++s)
    for (int l : p.stage(s).layers)
      if (w.layer(static_cast<size_t>(l)).tied_to >= 0) holders[w.layer(static_cast<size_t>(l)).tied_to];
  if (holders.empty()) return out;
  for (size_t s = 0; s < p.stage_count(); ++s)
    for (int l : p.stage(s).layers)
      if (auto it = holders.find(l); it != holders.end()) it->second.push_back(static_cast<int>(s));
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    for (size_t i = 0; i < st.layers.size(); ++i) {
      const int source = w.layer(static_cast<size_t>(st.layers[i])).tied_to;
      if (source < 0 || holders[source].empty()) continue;  // a source in no stage: nothing to share with
      std::set<int> on;                                     // the devices holding the source
      for (int h : holders[source])
        on.insert(p.stage(static_cast<size_t>(h)).devices.begin(),
                  p.stage(static_cast<size_t>(h)).devices.end());
      TiedCopy c{static_cast<int>(s), static_cast<int>(i), holders[source].front(), {}};
      for (int d : st.devices) c.copies.push_back(!on.count(d));
      if (std::find(c.copies.begin(), c.copies.end(), true) != c.copies.end()) out.push_back(std::move(c));
    }
  }
  return out;
}

double tied_gradient_bytes(const Workload& w, const Layer& tied, double parameters, double reduce_bytes) {
  return reduce_bytes > 0 ? parameters * reduce_bytes : tied_bytes(w, tied, parameters);
}

void add_sequence_edges(Partition& p) {
  for (size_t s = 0; s + 1 < p.stage_count(); ++s)
    if (!boost::edge(s, s + 1, p.graph).second) boost::add_edge(s, s + 1, StageEdge{0}, p.graph);
}

Partition dualpipe_pipelines(const Partition& chain) {
  const size_t N = chain.stage_count();
  Partition out;
  out.plan = chain.plan;
  for (size_t s = 0; s < N; ++s) {
    Stage st = chain.stage(s);
    st.route = 1;
    st.mirror = static_cast<int>(N + s);
    boost::add_vertex(st, out.graph);
  }
  for (size_t j = 0; j < N; ++j) {
    Stage st = chain.stage(j);
    st.devices = chain.stage(N - 1 - j).devices;
    st.route = 2;
    st.mirror = static_cast<int>(j);
    boost::add_vertex(st, out.graph);
  }
  for (auto [it, end] = boost::edges(chain.graph); it != end; ++it) {
    const size_t a = boost::source(*it, chain.graph), b = boost::target(*it, chain.graph);
    boost::add_edge(a, b, chain.graph[*it], out.graph);
    boost::add_edge(N + a, N + b, chain.graph[*it], out.graph);
  }
  return out;
}

double replica_overlap(int i, int n, int j, int m) {
  const double lo = std::max(static_cast<double>(i) / n, static_cast<double>(j) / m);
  const double hi = std::min(static_cast<double>(i + 1) / n, static_cast<double>(j + 1) / m);
  return std::max(0.0, hi - lo);
}

Result<Partition> make_partition(const Workload& w, const std::vector<int>& stage_of_layer,
                                 const std::vector<std::vector<int>>& devices_of_stage, size_t device_count) {
  const size_t n = w.layer_count();
  const size_t stages = devices_of_stage.size();
  if (stage_of_layer.size() != n)
    return Error{
        fmt::format("the partition assigns {} layers, the workload has {}", stage_of_layer.size(), n)};
  Partition p;
  for (size_t s = 0; s < stages; ++s) boost::add_vertex(Stage{{}, devices_of_stage[s]}, p.graph);
  for (int layer : topological_order(w)) {
    int s = stage_of_layer[layer];
    if (s < 0 || static_cast<size_t>(s) >= stages)
      return Error{
          fmt::format("layer \"{}\" is assigned to stage {}, which does not exist", w.layer(layer).name, s)};
    p.graph[s].layers.push_back(layer);
  }
  for (size_t s = 0; s < stages; ++s) {
    if (p.graph[s].layers.empty()) return Error{fmt::format("stage {} has no layer", s)};
    if (p.graph[s].devices.empty()) return Error{fmt::format("stage {} has no device", s)};
    for (int d : p.graph[s].devices)
      if (d < 0 || static_cast<size_t>(d) >= device_count)
        return Error{fmt::format("stage {} is placed on device {}, which does not exist", s, d)};
  }
  // Edge bytes: each producer layer counted once per consumer stage.
  std::map<std::pair<int, int>, double> bytes;
  for (size_t u = 0; u < n; ++u) {
    std::set<int> consumers;
    for (auto [it, end] = boost::out_edges(u, w.graph); it != end; ++it) {
      int t = stage_of_layer[boost::target(*it, w.graph)];
      if (t != stage_of_layer[u]) consumers.insert(t);
    }
    for (int t : consumers) bytes[{stage_of_layer[u], t}] += w.layer(u).output_bytes;
  }
  for (const auto& [st, b] : bytes) {
    if (st.first > st.second)
      return Error{fmt::format("stage {} feeds stage {}: stages must be numbered in dependency order",
                               st.first, st.second)};
    boost::add_edge(st.first, st.second, StageEdge{b}, p.graph);
  }
  return p;
}

Parallelism parallelism(const Partition& p) {
  Parallelism out;
  // The distinct device lists (pipeline ranks); a set, as a list searched once per stage was quadratic
  // (131,072 one-device stages: 77 s of a GPipe chain's 135 s).
  std::set<std::vector<int>> ranks;
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    out.tensor = std::max(out.tensor, st.tensor_parallel);
    out.data = std::max(out.data, st.replicas());
    out.expert = std::max(out.expert, st.expert_parallel);
    out.expert_tensor = std::max(out.expert_tensor, st.expert_tensor_parallel);
    out.context = std::max(out.context, st.context_parallel);
    ranks.insert(st.devices);
  }
  out.pipeline = std::max<int>(1, static_cast<int>(ranks.size()));
  out.chunks = std::max<int>(1, static_cast<int>(p.stage_count()) / out.pipeline);
  return out;
}

}  // namespace pipegrid
