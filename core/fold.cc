#include "core/fold.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "core/huge_pages.h"

namespace pipegrid {

Result<ReplicaMap> map_replicas(const Partition& p, size_t devices) {
  ReplicaMap m{0, std::vector<int>(devices, -1), std::vector<int>(devices, -1)};
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    const int group = st.tensor_parallel * st.context_parallel, d = st.replicas();
    if (m.replicas == 0) m.replicas = d;
    if (d != m.replicas)
      return Error{fmt::format("stage {} has {} replicas and stage 0 {}", s, d, m.replicas)};
    for (size_t pos = 0; pos < st.devices.size(); ++pos) {
      const int dev = st.devices[pos], j = static_cast<int>(pos) / group;
      const int img = st.devices[pos % static_cast<size_t>(group)];
      if (m.replica[dev] == -1) {
        m.replica[dev] = j;
        m.image[dev] = img;
      } else if (m.replica[dev] != j || m.image[dev] != img) {
        return Error{
            fmt::format("device {} is not at the same place of the same replica in every stage", dev)};
      }
    }
  }
  if (m.replicas < 2) return Error{"one replica per stage"};
  return m;
}

namespace {

// A transfer's replica when it is a group flow inside one replica (tensor_only: a tensor-parallel
// flow; FoldLayout::tensor_only), else -1.
int intra_replica(const Task& t, const ReplicaMap& m, bool tensor_only = false) {
  if (t.kind != TaskKind::Transfer || !is_group_flow(t.transfer) || t.device < 0 || t.peer < 0) return -1;
  if (tensor_only && t.transfer != TransferKind::TensorParallel) return -1;
  const int j = m.replica[t.device];
  return j >= 0 && j == m.replica[t.peer] ? j : -1;
}

// Replica j's compute tasks take the times of their images' at the same place in the device order.
Status map_compute(const TaskGraph& g, const ReplicaMap& m, std::vector<int32_t>& rep) {
  for (size_t dev = 0; dev < g.device_order.size(); ++dev) {
    if (m.replica[dev] <= 0) continue;
    const auto& mine = g.device_order[dev];
    const auto& theirs = g.device_order[static_cast<size_t>(m.image[dev])];
    if (mine.size() != theirs.size())
      return Error{fmt::format("device {} runs {} tasks and its image {}", dev, mine.size(), theirs.size())};
    for (size_t i = 0; i < mine.size(); ++i) {
      const Task &a = g.tasks[mine[i]], &b = g.tasks[theirs[i]];
      if (a.kind != b.kind || a.stage != b.stage || a.micro_batch != b.micro_batch ||
          a.duration != b.duration)
        return Error{fmt::format("device {}'s task {} differs from its image's", dev, i)};
      rep[mine[i]] = theirs[i];
    }
  }
  return {};
}

// Which link channels carry only one replica's group flows: per replica, whether all its group
// flows stay on such channels of its own, and their routes.
struct Channels {
  static constexpr int32_t kUnused = -1, kShared = -2;
  std::vector<int32_t>
      owner;  // per channel: the replica whose group flows alone use it, or kUnused / kShared
  std::vector<int32_t> group_owner;  // the same over the group flows alone (other traffic not counted)
  std::vector<char> steady;          // per channel: other traffic on it besides the gradient collectives
                                     // (pipeline transfers run beside the passes, never only at other times)
  std::unordered_map<uint64_t, Route> routes;  // per group flow pair (device << 32 | peer)
  std::vector<std::vector<uint64_t>> pairs;    // per replica: its group flow pairs
  // The other traffic into each replica (pipeline, flows between replicas; not the gradient rings): per
  // (replica, the images of the pair's ends), the routes' signatures (hops, latency, bottleneck).
  std::map<std::tuple<int, int, int>, std::vector<std::tuple<size_t, double, double>>> incoming;
};

uint64_t pair_key(int a, int b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

// `each(visit)` calls visit(t) for every transfer of the graph (the folded lowering's adds replica j's
// group flows, not built, as replica 0's moved to replica j's devices).
template <class Each>
Result<Channels> route_channels(const Cluster& c, const ReplicaMap& m, Each&& each,
                                bool tensor_only = false) {
  std::unordered_set<uint64_t> other, seen, signed_pairs;
  Channels ch;
  ch.owner.assign(2 * c.links.size(), Channels::kUnused);
  ch.group_owner.assign(2 * c.links.size(), Channels::kUnused);
  ch.steady.assign(2 * c.links.size(), 0);
  ch.pairs.resize(static_cast<size_t>(m.replicas));
  const Router router(c);
  std::string failed;
  each([&](const Task& t) {
    if (!failed.empty() || t.kind != TaskKind::Transfer || t.device == t.peer) return;
    const int j = intra_replica(t, m, tensor_only);
    const uint64_t key = pair_key(t.device, t.peer);
    // The traffic into a replica, but a stage's own gradient ring (both ends the same image): its hops
    // may differ between replicas (some through a fat-tree's spine, some not) and still fold exactly,
    // the optimizer steps settled. A ring between two stages' devices (DualPipe's mirrored stages)
    // is compared.
    const bool ring =
        t.transfer == TransferKind::DataParallel && t.device >= 0 && m.image[t.device] == m.image[t.peer];
    const bool signed_pair = j < 0 && !ring && t.device >= 0 && m.replica[t.device] >= 0 &&
                             m.replica[t.peer] >= 0 && signed_pairs.insert(key).second;
    if (!(j >= 0 ? seen : other).insert(key).second && !signed_pair) return;
    Result<Route> r = router.route(t.device, t.peer);
    if (!r) {
      failed = r.error().message;
      return;
    }
    for (const Hop& h : r->hops) {
      int32_t& o = ch.owner[link_channel(c, h)];
      o = j < 0 || (o != Channels::kUnused && o != j) ? Channels::kShared : j;
      if (j < 0) {
        ch.steady[link_channel(c, h)] |= t.transfer != TransferKind::DataParallel;
        continue;
      }
      int32_t& g = ch.group_owner[link_channel(c, h)];
      g = g != Channels::kUnused && g != j ? Channels::kShared : j;
    }
    if (j >= 0) {
      ch.pairs[static_cast<size_t>(j)].push_back(key);
      ch.routes.emplace(key, std::move(*r));
    } else if (signed_pair) {
      ch.incoming[{m.replica[t.peer], m.image[t.device], m.image[t.peer]}].emplace_back(
          r->hops.size(), r->latency, r->bandwidth);
    }
  });
  if (!failed.empty()) return Error{failed};
  // A pair seen both as a group flow and as other traffic shares its channels.
  for (uint64_t key : other)
    if (auto it = ch.routes.find(key); it != ch.routes.end())
      for (const Hop& h : it->second.hops) {
        ch.owner[link_channel(c, h)] = Channels::kShared;
        ch.steady[link_channel(c, h)] = 1;
      }
  return ch;
}

// Whether replica j's group flows run on channels of their own that map one to one onto replica 0's,
// link for link alike.
// time_shared: the gradient collectives may use those channels too (check_time_shared times them).
bool alike_and_private(const Cluster& c, const ReplicaMap& m, const Channels& ch, int j,
                       bool time_shared = false) {
  const std::vector<int32_t>& owner = time_shared ? ch.group_owner : ch.owner;
  std::unordered_map<size_t, size_t> to0, from0;
  for (uint64_t key : ch.pairs[static_cast<size_t>(j)]) {
    const int a = int(key >> 32), b = int(uint32_t(key));
    const auto theirs = ch.routes.find(pair_key(m.image[a], m.image[b]));
    if (theirs == ch.routes.end()) return false;
    const Route& mine = ch.routes.at(key);
    if (mine.hops.size() != theirs->second.hops.size()) return false;
    for (size_t h = 0; h < mine.hops.size(); ++h) {
      const size_t x = link_channel(c, mine.hops[h]), y = link_channel(c, theirs->second.hops[h]);
      const Link &lx = c.links[mine.hops[h].link], &ly = c.links[theirs->second.hops[h].link];
      if (owner[x] != j || owner[y] != 0 || (time_shared && (ch.steady[x] || ch.steady[y])) ||
          lx.bandwidth != ly.bandwidth || lx.latency != ly.latency || lx.duplex != ly.duplex)
        return false;
      if (to0.emplace(x, y).first->second != y || from0.emplace(y, x).first->second != x) return false;
    }
  }
  return true;
}

// Ranks folded: whether replica 0's ring flows (every pair of neighbours in every tensor-parallel
// group; its channels already known to be its own and replica j's alike them) use no channel of
// another pair's, each route alike the first's hop for hop (bandwidth, latency, duplex).
bool rings_private(const Cluster& c, const Channels& ch) {
  std::unordered_map<size_t, uint64_t> user;  // channel -> the pair using it
  const Route* first = nullptr;
  for (uint64_t key : ch.pairs[0]) {
    const Route& r = ch.routes.at(key);
    if (!first) first = &r;
    if (r.hops.size() != first->hops.size()) return false;
    for (size_t h = 0; h < r.hops.size(); ++h) {
      const Link &a = c.links[r.hops[h].link], &b = c.links[first->hops[h].link];
      if (a.bandwidth != b.bandwidth || a.latency != b.latency || a.duplex != b.duplex) return false;
      if (user.emplace(link_channel(c, r.hops[h]), key).first->second != key) return false;
    }
  }
  return true;
}

// Whether every replica receives its other traffic over routes alike replica 0's (the same hops,
// latency and bottleneck for each class of pair); else the first difference.
std::string unlike_incoming(Channels& ch, const Cluster& c) {
  for (auto& [key, sigs] : ch.incoming) std::sort(sigs.begin(), sigs.end());
  for (const auto& [key, sigs] : ch.incoming) {
    const auto& [j, a, b] = key;
    if (j == 0) continue;
    const auto it = ch.incoming.find({0, a, b});
    if (it == ch.incoming.end() || it->second != sigs)
      return fmt::format("replica {}'s traffic like {} -> {} in replica 0 crosses routes unlike replica 0's",
                         j, c.devices[static_cast<size_t>(a)].name, c.devices[static_cast<size_t>(b)].name);
  }
  return "";
}

// The identity of a group flow up to its replica: kind, stages, micro-batch and the images of its ends.
struct FlowKey {
  TransferKind kind;
  int32_t stage, peer_stage, micro_batch, device, peer;
  int32_t replica = 0;  // only in the counters of map_group_flows
  bool operator==(const FlowKey&) const = default;
};
struct FlowKeyHash {
  size_t operator()(const FlowKey& k) const {
    size_t h = std::hash<int64_t>()((int64_t(k.device) << 32) ^ k.peer);
    for (int32_t x : {int32_t(k.kind), k.stage, k.peer_stage, k.micro_batch, k.replica})
      h = h * 1000003u ^ std::hash<int32_t>()(x);
    return h;
  }
};

// Replica j's group flows (j among `foldable`) take the times of replica 0's flow with the same key
// and the same rank among that key's flows; a replica with a flow that has none keeps its flows.
void map_group_flows(const TaskGraph& g, const ReplicaMap& m, std::vector<char>& foldable,
                     std::vector<int32_t>& rep) {
  std::unordered_map<FlowKey, std::vector<int32_t>, FlowKeyHash> of0;
  auto key_of = [&](const Task& t) {
    return FlowKey{t.transfer, t.stage, t.peer_stage, t.micro_batch, m.image[t.device], m.image[t.peer]};
  };
  for (size_t v = 0; v < g.tasks.size(); ++v)
    if (intra_replica(g.tasks[v], m) == 0) of0[key_of(g.tasks[v])].push_back(int32_t(v));
  std::unordered_map<FlowKey, size_t, FlowKeyHash> next;  // per replica and key: the next rank
  for (size_t v = 0; v < g.tasks.size(); ++v) {
    const Task& t = g.tasks[v];
    const int j = intra_replica(t, m);
    if (j <= 0 || !foldable[j]) continue;
    const FlowKey k = key_of(t);
    FlowKey counter = k;
    counter.replica = j;
    const size_t rank = next[counter]++;
    const auto it = of0.find(k);
    if (it == of0.end() || rank >= it->second.size() || g.tasks[it->second[rank]].bytes != t.bytes) {
      foldable[j] = 0;
      continue;
    }
    rep[v] = it->second[rank];
  }
  for (size_t v = 0; v < g.tasks.size(); ++v) {
    const int j = intra_replica(g.tasks[v], m);
    if (j > 0 && !foldable[j]) rep[v] = -1;
  }
}

// The replayed graph: the tasks without a representative, with their dependencies on copied tasks
// moved to the representatives; replica 0's device orders (and those of devices in no replica).
void build_folded(const TaskGraph& g, const ReplicaMap& m, const std::vector<int32_t>& rep, ReplicaFold& f) {
  const size_t n = g.tasks.size();
  assign_huge(f.folded_of, n, int32_t{-1});
  size_t kept = 0, deps = 0;
  for (size_t v = 0; v < n; ++v) kept += rep[v] < 0;
  for (size_t u = 0; u < n; ++u)
    for (int32_t v : g.successors(int32_t(u))) deps += rep[v] < 0;
  f.graph.reserve(kept, deps);
  f.original.reserve(kept);
  for (size_t v = 0; v < n; ++v)
    if (rep[v] < 0) {
      f.folded_of[v] = f.graph.add(g.tasks[v]);
      f.original.push_back(int32_t(v));
    }
  for (size_t v = 0; v < n; ++v)
    if (rep[v] >= 0) f.folded_of[v] = f.folded_of[rep[v]];
  for (size_t u = 0; u < n; ++u)
    for (int32_t v : g.successors(int32_t(u)))
      if (rep[v] < 0) f.graph.depend(f.folded_of[u], f.folded_of[v]);
  f.graph.device_order.resize(g.device_order.size());
  for (size_t dev = 0; dev < g.device_order.size(); ++dev)
    if (m.replica[dev] <= 0)
      for (int32_t v : g.device_order[dev]) f.graph.device_order[dev].push_back(f.folded_of[v]);
  f.graph.static_memory = g.static_memory;
  f.graph.samples_per_iteration = g.samples_per_iteration;
  f.graph.node_aggregated_all_to_all = g.node_aggregated_all_to_all;
  f.graph.nccl_picks = g.nccl_picks;
  f.graph.pack_dependencies();
}

}  // namespace

Result<ReplicaFold> fold_replicas(const Cluster& c, const Partition& p, const TaskGraph& g) {
  Result<ReplicaMap> m = map_replicas(p, g.device_order.size());
  if (!m) return m.error();
  std::vector<int32_t> rep;
  assign_huge(rep, g.tasks.size(), int32_t{-1});
  if (Status s = map_compute(g, *m, rep); !s) return s.error();
  Result<Channels> ch = route_channels(c, *m, [&](auto&& visit) {
    for (const Task& t : g.tasks) visit(t);
  });
  if (!ch) return ch.error();
  const std::string unlike = unlike_incoming(*ch, c);
  std::vector<char> foldable(static_cast<size_t>(m->replicas), 0);
  const bool private0 = alike_and_private(c, *m, *ch, 0);
  for (int j = 1; j < m->replicas; ++j) foldable[j] = private0 && alike_and_private(c, *m, *ch, j);
  map_group_flows(g, *m, foldable, rep);
  ReplicaFold f;
  f.replicas = m->replicas;
  f.unlike_routes = unlike;
  for (int j = 1; j < m->replicas; ++j) f.replicas_with_replayed_groups += !foldable[j];
  for (size_t v = 0; v < g.tasks.size(); ++v)
    if (rep[v] >= 0) ++(g.tasks[v].is_compute() ? f.copied_compute : f.copied_flows);
  build_folded(g, *m, rep, f);
  return f;
}

namespace {

// Replica j's device at the place of replica 0's device d (a stage and a position in its group).
class Counterparts {
 public:
  Counterparts(const Partition& p, size_t devices) : p_(p), place_(devices, {-1, -1}) {
    for (size_t s = 0; s < p.stage_count(); ++s) {
      const Stage& st = p.stage(s);
      const size_t group = static_cast<size_t>(st.tensor_parallel * st.context_parallel);
      for (size_t pos = 0; pos < group && pos < st.devices.size(); ++pos)
        if (place_[static_cast<size_t>(st.devices[pos])].first < 0)
          place_[static_cast<size_t>(st.devices[pos])] = {static_cast<int>(s), static_cast<int>(pos)};
    }
  }
  int operator()(int d, int j) const {
    const auto [s, pos] = place_[static_cast<size_t>(d)];
    const Stage& st = p_.stage(static_cast<size_t>(s));
    return st.devices[static_cast<size_t>(pos + j * st.tensor_parallel * st.context_parallel)];
  }

 private:
  const Partition& p_;
  std::vector<std::pair<int, int>> place_;
};

}  // namespace

Result<FoldRoutes> fold_routes(const Cluster& c, const Partition& p, const FoldedGraph& f) {
  const FoldLayout& l = f.layout;
  // The replicas' map (with ranks folded, the layout's images are ranks 0: not the place in replica 0).
  Result<ReplicaMap> mapped = map_replicas(p, l.replica.size());
  if (!mapped) return mapped.error();
  const ReplicaMap& m = *mapped;
  const Counterparts counterpart(p, l.replica.size());
  Result<Channels> ch = route_channels(
      c, m,
      [&](auto&& visit) {
        std::set<std::tuple<int, int, TransferKind>> group0;  // replica 0's group flows' pairs
        for (const Task& t : f.graph.tasks) {
          visit(t);
          if (l.groups_folded && intra_replica(t, m, l.tensor_only) == 0)
            group0.emplace(t.device, t.peer, t.transfer);
        }
        if (l.ranks_folded > 1) {  // every ring's flows, lowered (into and out of rank 0) or not
          Task x;
          x.kind = TaskKind::Transfer;
          x.transfer = TransferKind::TensorParallel;
          const size_t t = static_cast<size_t>(l.ranks_folded);
          for (size_t s = 0; s < p.stage_count(); ++s)
            for (size_t first = 0; first < p.stage(s).devices.size(); first += t)
              for (size_t q = 0; q < t; ++q) {
                x.device = p.stage(s).devices[first + q];
                x.peer = p.stage(s).devices[first + (q + 1) % t];
                visit(x);
              }
          return;
        }
        for (int j = 1; j < l.replicas; ++j)
          for (const auto& [a, b, kind] : group0) {
            Task x;
            x.kind = TaskKind::Transfer;
            x.transfer = kind;
            x.device = counterpart(a, j);
            x.peer = counterpart(b, j);
            visit(x);
          }
      },
      l.tensor_only);
  if (!ch) return ch.error();
  FoldRoutes out;
  out.unlike = unlike_incoming(*ch, c);
  out.groups_private = alike_and_private(c, m, *ch, 0);
  for (int j = 1; out.groups_private && j < l.replicas; ++j)
    out.groups_private = alike_and_private(c, m, *ch, j);
  out.groups_time_shared = !out.groups_private && l.groups_folded && alike_and_private(c, m, *ch, 0, true);
  for (int j = 1; out.groups_time_shared && j < l.replicas; ++j)
    out.groups_time_shared = alike_and_private(c, m, *ch, j, true);
  if (l.ranks_folded > 1) out.ranks_private = out.groups_private && rings_private(c, *ch);
  return out;
}

FoldCheck check_folded(const TaskGraph& g, const FoldLayout& l, const Timeline& t) {
  FoldCheck check;
  std::vector<int32_t> slot(g.tasks.size(), -1);  // per task receiving crossings: its row in `shared`
  int32_t rows = 0;
  for (const Crossing& x : l.crossings)
    if (slot[x.to] < 0) slot[x.to] = rows++;
  // What a copy shares with its image: the ends of replica 0's passes and folded group flows before it,
  // and of the device's previous task.
  auto shared_by_copies = [&](const Task& u) {
    if (u.is_compute()) return true;
    return l.folds(u.transfer) && l.replica[static_cast<size_t>(u.device)] == 0 &&
           l.replica[static_cast<size_t>(u.peer)] == 0;
  };
  std::vector<double> shared(static_cast<size_t>(rows), 0.0);
  for (size_t u = 0; u < g.tasks.size(); ++u)
    if (shared_by_copies(g.tasks[u]))
      for (int32_t v : g.successors(static_cast<int32_t>(u)))
        if (slot[v] >= 0) shared[slot[v]] = std::max(shared[slot[v]], t.end[u]);
  for (const auto& order : g.device_order)
    for (size_t i = 1; i < order.size(); ++i)
      if (const int32_t v = order[i]; slot[v] >= 0)
        shared[slot[v]] = std::max(shared[slot[v]], t.end[order[i - 1]]);
  std::vector<uint32_t> by(l.crossings.size());
  std::iota(by.begin(), by.end(), 0u);
  std::sort(by.begin(), by.end(), [&](uint32_t a, uint32_t b) {
    const Crossing &x = l.crossings[a], &y = l.crossings[b];
    return std::pair(x.copy, x.to) < std::pair(y.copy, y.to);
  });
  for (size_t i = 0; i < by.size();) {
    const Crossing& first = l.crossings[by[i]];
    double expected = shared[slot[first.to]];
    for (; i < by.size() && l.crossings[by[i]].copy == first.copy && l.crossings[by[i]].to == first.to; ++i)
      expected = std::max(expected, t.end[l.crossings[by[i]].from]);
    if (const double dev = std::abs(t.start[first.to] - expected); dev > check.max_deviation_s) {
      check.max_deviation_s = dev;
      check.worst_task = first.to;
    }
  }
  return check;
}

Timeline unfold(const ReplicaFold& f, const Timeline& folded) {
  Timeline t;
  for (std::vector<double>* v : {&t.start, &t.end}) {
    reserve_huge(*v, f.folded_of.size());
    v->resize(f.folded_of.size());
  }
  for (size_t v = 0; v < f.folded_of.size(); ++v) {
    t.start[v] = folded.start[f.folded_of[v]];
    t.end[v] = folded.end[f.folded_of[v]];
  }
  return t;
}

FoldCheck settle_unfolded(const TaskGraph& g, const ReplicaFold& f, Timeline& t) {
  const size_t n = g.tasks.size();
  std::vector<double> ready;
  assign_huge(ready, n, 0.0);
  for (size_t u = 0; u < n; ++u)
    for (int32_t v : g.successors(int32_t(u))) ready[v] = std::max(ready[v], t.end[u]);
  FoldCheck check;
  auto measure = [&](int32_t v, double expected) {
    if (const double dev = std::abs(t.start[v] - expected); dev > check.max_deviation_s) {
      check.max_deviation_s = dev;
      check.worst_task = v;
    }
  };
  for (const auto& order : g.device_order) {
    double previous_end = 0;
    for (int32_t v : order) {
      if (!f.replayed(v)) {
        const double expected = std::max(ready[v], previous_end);
        if (g.successors(v).empty()) {  // a sink (the optimizer step): timed where it would start
          if (expected != t.start[v]) ++check.retimed;
          t.end[v] = expected + (t.end[v] - t.start[v]);
          t.start[v] = expected;
        } else {
          measure(v, expected);
        }
      }
      previous_end = t.end[v];
    }
  }
  for (size_t v = 0; v < n; ++v)
    if (!g.tasks[v].is_compute() && !f.replayed(int32_t(v))) measure(int32_t(v), ready[v]);
  return check;
}

std::string check_time_shared(const Cluster& c, const Partition& p, const TaskGraph& g, const FoldLayout& l,
                              const Timeline& t) {
  Result<ReplicaMap> mapped = map_replicas(p, l.replica.size());
  if (!mapped) return mapped.error().message;
  const ReplicaMap& m = *mapped;
  const Counterparts counterpart(p, l.replica.size());
  const Router router(c);
  std::unordered_map<uint64_t, std::vector<size_t>> routes;  // per pair: its route's channels
  std::string failed;
  auto route = [&](int a, int b) -> const std::vector<size_t>& {
    auto [it, fresh] = routes.try_emplace(pair_key(a, b));
    if (!fresh) return it->second;
    Result<Route> r = router.route(a, b);
    if (!r)
      failed = r.error().message;
    else
      for (const Hop& h : r->hops) it->second.push_back(link_channel(c, h));
    return it->second;
  };
  // Replica 0's group flows: when each channel is busy with them (merged), and every replica's group
  // channels mapped onto replica 0's, hop for hop (fold_routes found the routes alike).
  std::unordered_map<size_t, std::vector<std::pair<double, double>>> busy;
  std::unordered_map<size_t, size_t> to0;
  std::set<std::pair<int, int>> pairs0;
  for (size_t i = 0; i < g.tasks.size(); ++i) {
    const Task& x = g.tasks[i];
    if (intra_replica(x, m, l.tensor_only) != 0) continue;
    for (size_t ch : route(x.device, x.peer)) busy[ch].emplace_back(t.start[i], t.end[i]);
    pairs0.emplace(x.device, x.peer);
  }
  for (auto& [ch, iv] : busy) {
    std::sort(iv.begin(), iv.end());
    size_t k = 0;
    for (const auto& x : iv)
      if (k > 0 && x.first < iv[k - 1].second)
        iv[k - 1].second = std::max(iv[k - 1].second, x.second);
      else
        iv[k++] = x;
    iv.resize(k);
  }
  for (const auto& [a, b] : pairs0) {
    const std::vector<size_t> r0 = route(a, b);
    for (size_t ch : r0) to0[ch] = ch;
    for (int j = 1; j < l.replicas; ++j) {
      const std::vector<size_t>& rj = route(counterpart(a, j), counterpart(b, j));
      for (size_t h = 0; h < rj.size() && h < r0.size(); ++h) to0[rj[h]] = r0[h];
    }
  }
  // Every other replayed flow: none on a group channel while that channel's group flows run.
  for (size_t i = 0; i < g.tasks.size() && failed.empty(); ++i) {
    const Task& x = g.tasks[i];
    if (x.kind != TaskKind::Transfer || x.device < 0 || x.peer < 0 || x.device == x.peer ||
        intra_replica(x, m, l.tensor_only) >= 0 || t.end[i] <= t.start[i])
      continue;
    for (size_t ch : route(x.device, x.peer)) {
      const auto y = to0.find(ch);
      const auto b = y == to0.end() ? busy.end() : busy.find(y->second);
      if (b == busy.end()) continue;
      const auto& iv = b->second;
      const auto at =
          std::upper_bound(iv.begin(), iv.end(), t.start[i],
                           [](double v, const std::pair<double, double>& b) { return v < b.second; });
      if (at != iv.end() && at->first < t.end[i])
        return fmt::format("{} -> {} at {:.6g} s uses a link of the group flows while they run",
                           c.devices[static_cast<size_t>(x.device)].name,
                           c.devices[static_cast<size_t>(x.peer)].name, t.start[i]);
    }
  }
  return failed;
}

}  // namespace pipegrid
