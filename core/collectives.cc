#include "core/collectives.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <string_view>

#include "core/nccl_tuning.h"

namespace pipegrid {
namespace {

int32_t add_flow(TaskGraph& g, int from, int to, double bytes, const FlowTag& tag, const Deps& after) {
  Task t;
  t.kind = TaskKind::Transfer;
  t.transfer = tag.kind;
  t.channel = tag.channel;
  t.stage = t.peer_stage = tag.stage;
  t.micro_batch = tag.micro_batch;
  t.device = from;
  t.peer = to;
  t.bytes = bytes;
  const int32_t id = g.add(t);
  for (int32_t d : after)
    if (d >= 0) g.depend(d, id);
  return id;
}

// A ring of `steps` steps of S / n among devices[0..n): in each step device j sends to j + 1 once
// it received the previous step's chunk from j - 1; the first `own_steps` steps also send the
// device's own data (they need ready[j]). Returns each device's last receive (empty for n = 1).
std::vector<Deps> stepped_ring(TaskGraph& g, const std::vector<int>& devices, const std::vector<Deps>& ready,
                               double bytes, int steps, int own_steps, const FlowTag& tag) {
  const int n = static_cast<int>(devices.size());
  std::vector<Deps> done(n);
  if (n < 2) return done;
  const double chunk = bytes / n;
  std::vector<int32_t> prev(n, -1);
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> cur(n);
    for (int j = 0; j < n; ++j) {
      Deps after;
      if (step < own_steps) after = ready[j];
      if (step > 0) after.push_back(prev[(j - 1 + n) % n]);
      cur[j] = add_flow(g, devices[j], devices[(j + 1) % n], chunk, tag, after);
    }
    prev = std::move(cur);
  }
  for (int j = 0; j < n; ++j) done[j] = {prev[(j - 1 + n) % n]};
  return done;
}

// The devices' machines (Cluster::machine_of) in order of first appearance, each as indices into
// `devices` in the order given (members[m][0] is the hierarchical all-reduce's leader).
std::vector<std::vector<size_t>> machines(const Cluster& c, const std::vector<int>& devices) {
  std::vector<std::vector<size_t>> members;
  std::map<std::string, size_t> machine;
  for (size_t j = 0; j < devices.size(); ++j) {
    auto [it, fresh] = machine.emplace(c.machine_of(devices[j]), members.size());
    if (fresh) members.emplace_back();
    members[it->second].push_back(j);
  }
  return members;
}

}  // namespace

std::string_view to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllReduce:
      return "all-reduce";
    case CollectiveKind::AllGather:
      return "all-gather";
    case CollectiveKind::ReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::AllToAll:
      return "all-to-all";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::SendRecv:
      return "send/receive";
  }
  return "?";
}

std::string_view to_string(AllReduceAlgorithm a) {
  switch (a) {
    case AllReduceAlgorithm::Ring:
      return "ring";
    case AllReduceAlgorithm::Hierarchical:
      return "hierarchical";
    case AllReduceAlgorithm::MultiRing:
      return "multi-ring";
    case AllReduceAlgorithm::Tree:
      return "tree";
    case AllReduceAlgorithm::Nccl:
      return "nccl";
  }
  return "ring";
}

std::optional<AllReduceAlgorithm> parse_allreduce(std::string_view name) {
  if (name == "ring") return AllReduceAlgorithm::Ring;
  if (name == "hierarchical") return AllReduceAlgorithm::Hierarchical;
  if (name == "multi-ring") return AllReduceAlgorithm::MultiRing;
  if (name == "tree") return AllReduceAlgorithm::Tree;
  if (name == "nccl") return AllReduceAlgorithm::Nccl;
  return std::nullopt;
}

double ring_flow_bytes(CollectiveKind k, double bytes, int t) {
  if (t < 2) return 0;
  const double steps = k == CollectiveKind::AllReduce ? 2.0 * (t - 1) : static_cast<double>(t - 1);
  return steps / t * bytes;
}

// ---- Flows ---------------------------------------------------------------------------------------

std::vector<Deps> append_ring_allreduce(TaskGraph& g, const std::vector<int>& devices,
                                        const std::vector<Deps>& ready, double bytes, const FlowTag& tag) {
  // The reduce-scatter steps and the first all-gather step send chunks that include the device's
  // own data: they need it as well as what arrived.
  const int n = static_cast<int>(devices.size());
  return stepped_ring(g, devices, ready, bytes, 2 * (n - 1), n, tag);
}

std::vector<Deps> append_ring_reduce_scatter(TaskGraph& g, const std::vector<int>& devices,
                                             const std::vector<Deps>& ready, double bytes,
                                             const FlowTag& tag) {
  const int n = static_cast<int>(devices.size());
  return stepped_ring(g, devices, ready, bytes, n - 1, n - 1, tag);
}

std::vector<Deps> append_ring_allgather(TaskGraph& g, const std::vector<int>& devices,
                                        const std::vector<Deps>& ready, double bytes, const FlowTag& tag) {
  // Only the first step sends the device's own chunk; the others forward what arrived.
  const int n = static_cast<int>(devices.size());
  return stepped_ring(g, devices, ready, bytes, n - 1, 1, tag);
}

std::vector<Deps> append_multiring(TaskGraph& g, const Cluster& c, CollectiveKind kind,
                                   const std::vector<int>& devices, const std::vector<Deps>& ready,
                                   double bytes, const FlowTag& tag) {
  FlowTag own = tag;
  auto ring = [&](const std::vector<int>& order, const std::vector<Deps>& order_ready, double b) {
    return kind == CollectiveKind::ReduceScatter ? append_ring_reduce_scatter(g, order, order_ready, b, own)
                                                 : append_ring_allreduce(g, order, order_ready, b, own);
  };
  const std::vector<std::vector<size_t>> orders = multi_ring_orders(c, devices);
  if (orders.size() < 2) return ring(devices, ready, bytes);
  std::vector<Deps> done(devices.size());
  for (const std::vector<size_t>& index : orders) {
    // Each ring on its own connections, as NCCL's channels: rings that share a device pair would
    // otherwise queue their steps' flows one after another on it.
    ++own.channel;
    std::vector<int> order;
    std::vector<Deps> order_ready;
    for (size_t j : index) {
      order.push_back(devices[j]);
      order_ready.push_back(ready[j]);
    }
    std::vector<Deps> got = ring(order, order_ready, bytes / static_cast<double>(orders.size()));
    for (size_t i = 0; i < index.size(); ++i)
      done[index[i]].insert(done[index[i]].end(), got[i].begin(), got[i].end());
  }
  return done;
}

std::vector<Deps> append_merged_rings(TaskGraph& g, CollectiveKind kind, const std::vector<int>& devices,
                                      const std::vector<std::vector<size_t>>& orders,
                                      const std::vector<Deps>& ready, double bytes, const FlowTag& tag) {
  if (orders.size() < 2) return append_merged_ring(g, kind, devices, ready, bytes, tag);
  std::vector<Deps> done(devices.size());
  std::vector<int> order;
  std::vector<Deps> order_ready;
  FlowTag own = tag;  // each ring its own channel, as in append_multiring
  for (const std::vector<size_t>& index : orders) {
    ++own.channel;
    order.clear();
    order_ready.clear();
    for (size_t j : index) {
      order.push_back(devices[j]);
      order_ready.push_back(ready[j]);
    }
    std::vector<Deps> got =
        append_merged_ring(g, kind, order, order_ready, bytes / static_cast<double>(orders.size()), own);
    for (size_t i = 0; i < index.size(); ++i)
      done[index[i]].insert(done[index[i]].end(), got[i].begin(), got[i].end());
  }
  return done;
}

std::vector<Deps> append_hierarchical(TaskGraph& g, const Cluster& c, CollectiveKind kind,
                                      const std::vector<int>& devices, const std::vector<Deps>& ready,
                                      double bytes, const FlowTag& tag) {
  const bool scatter = kind == CollectiveKind::ReduceScatter;
  const std::vector<std::vector<size_t>> members = machines(c, devices);
  std::vector<Deps> done(devices.size());
  std::vector<int> leaders;
  std::vector<Deps> leader_ready;
  for (const auto& m : members) {
    const size_t lead = m[0];
    Deps reduced = ready[lead];
    for (size_t i = 1; i < m.size(); ++i)
      reduced.push_back(add_flow(g, devices[m[i]], devices[lead], bytes, tag, ready[m[i]]));
    leaders.push_back(devices[lead]);
    leader_ready.push_back(std::move(reduced));
  }
  std::vector<Deps> across = scatter ? append_ring_reduce_scatter(g, leaders, leader_ready, bytes, tag)
                                     : append_ring_allreduce(g, leaders, leader_ready, bytes, tag);
  // The leader sends the others of its machine the whole result (all-reduce) or their shard.
  const double out = scatter ? bytes / static_cast<double>(devices.size()) : bytes;
  for (size_t k = 0; k < members.size(); ++k) {
    const auto& m = members[k];
    // With one machine the leader's result is the reduction itself.
    Deps have = leaders.size() > 1 ? across[k] : leader_ready[k];
    if (m.size() > 1 || leaders.size() > 1) {
      done[m[0]] = have;
      done[m[0]].erase(std::remove(done[m[0]].begin(), done[m[0]].end(), -1), done[m[0]].end());
    }
    for (size_t i = 1; i < m.size(); ++i)
      done[m[i]] = {add_flow(g, devices[m[0]], devices[m[i]], out, tag, have)};
  }
  return done;
}

namespace {

// Device q sends `flow_bytes` to device q + 1 once both are ready; result[q] = {flow q, flow q - 1}.
std::vector<Deps> ring_of_flows(TaskGraph& g, const std::vector<int>& devices, const std::vector<Deps>& ready,
                                double flow_bytes, const FlowTag& tag) {
  const int n = static_cast<int>(devices.size());
  std::vector<Deps> done(n);
  if (n < 2) return done;
  std::vector<int32_t> flows(n);
  for (int q = 0; q < n; ++q) {
    flows[q] = add_flow(g, devices[q], devices[(q + 1) % n], flow_bytes, tag, ready[q]);
    for (int32_t d : ready[(q + 1) % n])
      if (d >= 0) g.depend(d, flows[q]);
  }
  for (int q = 0; q < n; ++q) done[q] = {flows[q], flows[(q - 1 + n) % n]};
  return done;
}

}  // namespace

std::vector<Deps> append_merged_ring(TaskGraph& g, CollectiveKind kind, const std::vector<int>& devices,
                                     const std::vector<Deps>& ready, double bytes, const FlowTag& tag) {
  const int n = static_cast<int>(devices.size());
  return ring_of_flows(g, devices, ready, n < 2 ? 0 : ring_flow_bytes(kind, bytes, n), tag);
}

std::vector<Deps> append_merged_ring_at(TaskGraph& g, CollectiveKind kind, const std::vector<int>& devices,
                                        const std::vector<Deps>& ready, double bytes, const FlowTag& tag,
                                        size_t q) {
  const size_t n = devices.size();
  std::vector<Deps> done(n);
  if (n < 2) return done;
  const double flow_bytes = ring_flow_bytes(kind, bytes, static_cast<int>(n));
  auto flow = [&](size_t from) {  // from -> from + 1 once both are ready, as ring_of_flows
    const int32_t f = add_flow(g, devices[from], devices[(from + 1) % n], flow_bytes, tag, ready[from]);
    for (int32_t d : ready[(from + 1) % n])
      if (d >= 0) g.depend(d, f);
    return f;
  };
  const size_t before = (q + n - 1) % n;
  // In ring_of_flows' order (flow 0 first), so that equal ends break ties alike.
  int32_t in = -1, out = -1;
  if (before < q) {
    in = flow(before);
    out = flow(q);
  } else {
    out = flow(q);
    in = flow(before);
  }
  done[q] = {out, in};
  return done;
}

std::vector<Deps> append_ring_shift(TaskGraph& g, const std::vector<int>& devices,
                                    const std::vector<Deps>& ready, double bytes, const FlowTag& tag) {
  return ring_of_flows(g, devices, ready, bytes, tag);
}

std::vector<Deps> append_all_to_all(TaskGraph& g, const std::vector<int>& devices,
                                    const std::vector<Deps>& ready,
                                    const std::vector<std::vector<double>>& bytes, const FlowTag& tag) {
  const size_t n = devices.size();
  std::vector<std::vector<int32_t>> flow(n, std::vector<int32_t>(n, -1));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      if (i == j || bytes[i][j] <= 0) continue;
      flow[i][j] = add_flow(g, devices[i], devices[j], bytes[i][j], tag, ready[i]);
      for (int32_t d : ready[j])
        if (d >= 0) g.depend(d, flow[i][j]);
    }
  std::vector<Deps> done(n);
  for (size_t j = 0; j < n; ++j) {
    for (size_t x = 0; x < n; ++x)
      if (flow[j][x] >= 0) done[j].push_back(flow[j][x]);
    for (size_t x = 0; x < n; ++x)
      if (flow[x][j] >= 0) done[j].push_back(flow[x][j]);
  }
  return done;
}

std::vector<std::vector<double>> deduplicated_dispatch_bytes(
    const std::vector<std::pair<int, int>>& node_position, int per_node, double token_bytes,
    double hit_device, double hit_node) {
  const size_t n = node_position.size();
  const double nodes = static_cast<double>(n) / std::max(1, per_node);
  std::vector<std::vector<double>> bytes(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      const auto [a, x] = node_position[i];
      const auto [b, y] = node_position[j];
      if (a == b && x != y) bytes[i][j] = token_bytes * hit_device * nodes;
      if (a != b && x == y) bytes[i][j] = token_bytes * hit_node;
    }
  return bytes;
}

std::optional<std::pair<std::vector<std::pair<int, int>>, int>> node_layout(const Cluster& c,
                                                                            const std::vector<int>& devices) {
  std::vector<std::string_view> nodes;
  std::vector<int> count;
  std::vector<std::pair<int, int>> where(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    const std::string_view node = c.devices[static_cast<size_t>(devices[i])].node;
    auto it = std::find(nodes.begin(), nodes.end(), node);
    const int k = static_cast<int>(it - nodes.begin());
    if (it == nodes.end()) {
      nodes.push_back(node);
      count.push_back(0);
    }
    where[i] = {k, count[static_cast<size_t>(k)]++};
  }
  for (int n : count)
    if (n != count.front()) return std::nullopt;
  return std::pair{std::move(where), count.front()};
}

std::vector<Deps> append_node_aggregated_all_to_all(TaskGraph& g, const std::vector<int>& devices,
                                                    const std::vector<std::pair<int, int>>& node_position,
                                                    int per_node, const std::vector<Deps>& ready,
                                                    double bytes, const FlowTag& tag) {
  const size_t n = devices.size();
  const int nodes = static_cast<int>(n) / per_node;
  std::map<std::pair<int, int>, size_t> at;
  for (size_t i = 0; i < n; ++i) at[node_position[i]] = i;
  std::vector<Deps> done(n);
  auto send = [&](size_t i, size_t j, double b) {
    Deps after = ready[i];
    after.insert(after.end(), ready[j].begin(), ready[j].end());
    const int32_t f = add_flow(g, devices[i], devices[j], b, tag, after);
    done[i].push_back(f);
    done[j].push_back(f);
  };
  for (size_t i = 0; i < n; ++i) {
    const auto [node, pos] = node_position[i];
    if (per_node > 1) send(i, at.at({node, (pos + 1) % per_node}), (per_node - 1) * bytes);
    if (nodes > 1) send(i, at.at({(node + 1) % nodes, pos}), (static_cast<int>(n) - per_node) * bytes);
  }
  return done;
}

std::vector<Deps> append_chain_broadcast(TaskGraph& g, const std::vector<int>& devices,
                                         const std::vector<Deps>& ready, double bytes, int chunks,
                                         const FlowTag& tag) {
  const size_t n = devices.size();
  std::vector<Deps> done(n);
  if (n < 2) return done;
  const int k_count = std::max(1, chunks);
  const double chunk = bytes / k_count;
  // left[j]: the flow of the previous chunk from device j; arrived[j]: this chunk's arrival at j.
  std::vector<int32_t> left(n, -1);
  for (int k = 0; k < k_count; ++k) {
    int32_t arrived = -1;
    for (size_t j = 0; j + 1 < n; ++j) {
      Deps after = j == 0 ? ready[0] : Deps{arrived};
      after.push_back(left[j]);
      arrived = left[j] = add_flow(g, devices[j], devices[j + 1], chunk, tag, after);
      if (k == k_count - 1) done[j + 1] = {arrived};
    }
  }
  done[0] = {left[0]};
  return done;
}

int32_t append_send(TaskGraph& g, int from, int to, double bytes, const Deps& after, const FlowTag& tag) {
  return add_flow(g, from, to, bytes, tag, after);
}

std::array<std::vector<int>, 2> double_binary_trees(int nodes) {
  std::array<std::vector<int>, 2> parent{std::vector<int>(static_cast<size_t>(std::max(nodes, 0)), -1),
                                         std::vector<int>(static_cast<size_t>(std::max(nodes, 0)), -1)};
  for (int i = 1; i < nodes; ++i) {
    const int low = i & -i;
    int up = (i & ~low) | (low << 1);
    if (up >= nodes) up = i & ~low;
    parent[0][static_cast<size_t>(i)] = up;
  }
  auto place = [&](int i) { return nodes % 2 == 0 ? nodes - 1 - i : (i + 1) % nodes; };
  for (int i = 0; i < nodes; ++i) {
    const int up = parent[0][static_cast<size_t>(i)];
    parent[1][static_cast<size_t>(place(i))] = up < 0 ? -1 : place(up);
  }
  return parent;
}

namespace {

int tree_chunks(double channel_tree_bytes, double chunk_bytes) {
  const double k = std::ceil(channel_tree_bytes / chunk_bytes);
  return static_cast<int>(std::clamp(k, 1.0, static_cast<double>(kMaxTreeChunks)));
}

// One tree of append_double_tree over devices[0..n) with parent[j] (-1: the root): `bytes` in
// `chunks` chunks. Adds each device's results to done[j].
void pipelined_tree(TaskGraph& g, const std::vector<int>& devices, const std::vector<int>& parent,
                    const std::vector<Deps>& ready, double bytes, int chunks, const FlowTag& tag,
                    std::vector<Deps>& done) {
  const size_t n = devices.size();
  std::vector<std::vector<size_t>> children(n);
  size_t root = 0;
  for (size_t j = 0; j < n; ++j)
    if (parent[j] < 0)
      root = j;
    else
      children[static_cast<size_t>(parent[j])].push_back(j);
  // Pre-order from the root: parents before children (down flows), reversed for the up flows.
  std::vector<size_t> order{root};
  for (size_t i = 0; i < order.size(); ++i)
    for (size_t ch : children[order[i]]) order.push_back(ch);
  const double chunk = bytes / chunks;
  std::vector<int32_t> up(n, -1), down(n, -1);  // the latest flow into j's parent / from j's parent
  for (int k = 0; k < chunks; ++k) {
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const size_t j = *it;
      if (parent[j] < 0) continue;
      Deps after = ready[j];
      after.push_back(up[j]);
      for (size_t ch : children[j]) after.push_back(up[ch]);
      up[j] = add_flow(g, devices[j], devices[static_cast<size_t>(parent[j])], chunk, tag, after);
    }
    for (size_t j : order)
      for (size_t ch : children[j]) {
        Deps after{down[ch]};
        if (parent[j] < 0) {
          after.insert(after.end(), ready[j].begin(), ready[j].end());
          for (size_t x : children[j]) after.push_back(up[x]);
        } else {
          after.push_back(down[j]);
        }
        down[ch] = add_flow(g, devices[j], devices[ch], chunk, tag, after);
      }
  }
  for (size_t j = 0; j < n; ++j) {
    if (parent[j] >= 0) done[j].push_back(down[j]);
    if (j == root)
      for (size_t ch : children[j]) done[j].push_back(up[ch]);
  }
}

// The channels of append_double_tree: per channel, each device's parent in each of the two trees
// (indices into `devices`).
std::vector<std::array<std::vector<int>, 2>> tree_channels(const Cluster& c,
                                                           const std::vector<int>& devices) {
  const std::vector<std::vector<size_t>> members = machines(c, devices);
  const size_t m = members.front().size();
  const bool per_nic =
      members.size() >= 2 && m >= 2 &&
      std::all_of(members.begin(), members.end(), [&](const auto& x) { return x.size() == m; });
  const std::array<std::vector<int>, 2> across = double_binary_trees(static_cast<int>(members.size()));
  std::vector<std::array<std::vector<int>, 2>> channels;
  for (size_t k = 0; k < (per_nic ? m : 1); ++k) {
    std::array<std::vector<int>, 2>& parent = channels.emplace_back();
    for (int t = 0; t < 2; ++t) {
      parent[static_cast<size_t>(t)].assign(devices.size(), -1);
      for (size_t i = 0; i < members.size(); ++i) {
        const std::vector<size_t>& mine = members[i];
        const size_t size = mine.size(), head = per_nic ? k : 0;
        const int up = across[static_cast<size_t>(t)][i];
        if (up >= 0)
          parent[static_cast<size_t>(t)][mine[head]] =
              static_cast<int>(members[static_cast<size_t>(up)][per_nic ? k : 0]);
        for (size_t q = 1; q < size; ++q)  // the chain below the head
          parent[static_cast<size_t>(t)][mine[(head + q) % size]] =
              static_cast<int>(mine[(head + q - 1) % size]);
      }
    }
  }
  return channels;
}

}  // namespace

std::vector<Deps> append_double_tree(TaskGraph& g, const Cluster& c, const std::vector<int>& devices,
                                     const std::vector<Deps>& ready, double bytes, const FlowTag& tag,
                                     double chunk_bytes) {
  std::vector<Deps> done(devices.size());
  if (devices.size() < 2) return done;
  const auto channels = tree_channels(c, devices);
  const double per_tree = bytes / (2.0 * static_cast<double>(channels.size()));
  const int chunks = tree_chunks(per_tree, chunk_bytes);
  FlowTag own = tag;  // each tree of each channel on its own connections, as NCCL's channels
  for (const auto& trees : channels)
    for (const std::vector<int>& parent : trees) {
      ++own.channel;
      pipelined_tree(g, devices, parent, ready, per_tree, chunks, own, done);
    }
  return done;
}

size_t double_tree_flows(const Cluster& c, const std::vector<int>& devices, double bytes,
                         double chunk_bytes) {
  if (devices.size() < 2) return 0;
  const size_t channels = tree_channels(c, devices).size();
  const double per_tree = bytes / (2.0 * static_cast<double>(channels));
  return 2 * channels * static_cast<size_t>(tree_chunks(per_tree, chunk_bytes)) * 2 * (devices.size() - 1);
}

AllReduceAlgorithm resolve_allreduce(AllReduceAlgorithm algorithm, CollectiveKind kind, const Cluster& c,
                                     const Router& router, const std::vector<int>& devices, double bytes) {
  if (algorithm != AllReduceAlgorithm::Tree && algorithm != AllReduceAlgorithm::Nccl) return algorithm;
  if (kind != CollectiveKind::AllReduce || devices.size() < 2) return AllReduceAlgorithm::MultiRing;
  if (algorithm == AllReduceAlgorithm::Tree) return algorithm;
  const std::vector<std::vector<size_t>> members = machines(c, devices);
  if (members.size() < 2) return AllReduceAlgorithm::MultiRing;  // NCCL: a ring inside one machine
  // The channels' bandwidth: a device to its counterpart in the next machine (both graphs' w); on two
  // machines the tree's may reach twice it, up to the route inside the machine.
  const std::vector<std::vector<size_t>> orders = multi_ring_orders(c, devices);
  const int from = devices[members[0][0]], to = devices[members[1][0]];
  Result<Route> inter = router.route(from, to);
  if (!inter) return AllReduceAlgorithm::MultiRing;
  NcclModelInput in;
  in.ranks = static_cast<int>(devices.size());
  in.nodes = static_cast<int>(members.size());
  in.channels = static_cast<int>(orders.size());
  in.channel_bw = inter->bandwidth;
  in.generation = gpu_generation(c.devices[static_cast<size_t>(from)].spec.kind);
  if (members.size() == 2 && members[0].size() >= 2) {
    Result<Route> intra = router.route(from, devices[members[0][1]]);
    if (intra) in.tree_channel_bw = std::min(intra->bandwidth, 2 * inter->bandwidth);
  }
  return nccl_allreduce_model(in, bytes).tree_wins() ? AllReduceAlgorithm::Tree
                                                     : AllReduceAlgorithm::MultiRing;
}

std::vector<Deps> append_data_parallel(TaskGraph& g, CollectiveKind kind, AllReduceAlgorithm algorithm,
                                       const Cluster& c, const std::vector<int>& devices,
                                       const std::vector<int32_t>& ready, double bytes, int32_t stage) {
  std::vector<Deps> ready_sets(devices.size());
  for (size_t j = 0; j < devices.size(); ++j) ready_sets[j] = {ready[j]};
  return append_data_parallel(g, kind, algorithm, c, devices, ready_sets, bytes, stage);
}

std::vector<Deps> append_data_parallel(TaskGraph& g, CollectiveKind kind, AllReduceAlgorithm algorithm,
                                       const Cluster& c, const std::vector<int>& devices,
                                       const std::vector<Deps>& ready_sets, double bytes, int32_t stage) {
  const FlowTag tag{TransferKind::DataParallel, stage, -1};
  if (algorithm == AllReduceAlgorithm::Nccl)
    algorithm = resolve_allreduce(algorithm, kind, c, Router(c), devices, bytes);
  if (algorithm == AllReduceAlgorithm::Tree && kind != CollectiveKind::AllReduce)
    algorithm = AllReduceAlgorithm::MultiRing;  // NCCL has no tree for a reduce-scatter
  const size_t first = g.tasks.size();
  std::vector<Deps> done;
  switch (algorithm) {
    case AllReduceAlgorithm::Ring:
      done = kind == CollectiveKind::ReduceScatter
                 ? append_ring_reduce_scatter(g, devices, ready_sets, bytes, tag)
                 : append_ring_allreduce(g, devices, ready_sets, bytes, tag);
      break;
    case AllReduceAlgorithm::MultiRing:
      done = append_multiring(g, c, kind, devices, ready_sets, bytes, tag);
      break;
    case AllReduceAlgorithm::Hierarchical:
      done = append_hierarchical(g, c, kind, devices, ready_sets, bytes, tag);
      break;
    case AllReduceAlgorithm::Tree:
      done = append_double_tree(g, c, devices, ready_sets, bytes, tag);
      break;
    case AllReduceAlgorithm::Nccl:  // resolved above
      break;
  }
  charge_engine(g, first, c, devices);
  return done;
}

std::vector<Deps> append_allreduce(TaskGraph& g, AllReduceAlgorithm algorithm, const Cluster& c,
                                   const std::vector<int>& devices, const std::vector<int32_t>& ready,
                                   double bytes, int32_t stage) {
  return append_data_parallel(g, CollectiveKind::AllReduce, algorithm, c, devices, ready, bytes, stage);
}

std::vector<std::vector<size_t>> group_ring_orders(const Cluster& c, const std::vector<int>& devices) {
  const bool gpus = std::all_of(devices.begin(), devices.end(), [&](int d) {
    return c.devices[static_cast<size_t>(d)].spec.family == "gpu";
  });
  if (gpus) return multi_ring_orders(c, devices);
  std::vector<std::vector<size_t>> one(1, std::vector<size_t>(devices.size()));
  for (size_t j = 0; j < devices.size(); ++j) one[0][j] = j;
  return one;
}

bool all_gpus(const Cluster& c) {
  return std::all_of(c.devices.begin(), c.devices.end(),
                     [](const Device& d) { return d.spec.family == "gpu"; });
}

std::vector<std::vector<size_t>> multi_ring_orders(const Cluster& c, const std::vector<int>& devices) {
  const std::vector<std::vector<size_t>> members = machines(c, devices);
  const size_t m = members.empty() ? 0 : members[0].size();
  const bool uniform =
      std::all_of(members.begin(), members.end(), [&](const auto& x) { return x.size() == m; });
  std::vector<std::vector<size_t>> orders;
  if (members.size() < 2 || m < 2 || !uniform) {
    orders.emplace_back(devices.size());
    for (size_t j = 0; j < devices.size(); ++j) orders[0][j] = j;
    return orders;
  }
  // Ring k visits every machine's devices starting at its k-th, so it leaves machine i from the
  // (k - 1)-th device and enters machine i + 1 at the k-th: each device's NIC carries the crossings
  // of exactly one ring.
  for (size_t k = 0; k < m; ++k) {
    std::vector<size_t>& order = orders.emplace_back();
    for (const auto& x : members)
      for (size_t i = 0; i < m; ++i) order.push_back(x[(k + i) % m]);
  }
  return orders;
}

// ---- Closed forms --------------------------------------------------------------------------------

Result<LinkCost> ring_link_cost(const Router& router, const std::vector<int>& devices) {
  LinkCost cost;
  const size_t n = devices.size();
  if (n < 2) return cost;
  const Cluster& c = router.cluster();
  for (size_t i = 0; i < n; ++i) {
    const int from = devices[i], to = devices[(i + 1) % n];
    Result<Route> r = router.route(from, to);
    if (!r) return r.error();
    add_ring_hop(cost, c, from, to, *r);
  }
  return cost;
}

void add_ring_hop(LinkCost& cost, const Cluster& c, int from, int to, const Route& route) {
  // A hop between two devices on the collective engine pays its step and runs at most at its rate,
  // as charge_engine and Cluster::engine_rate cost the flow; a hop with a GPU at either end does not.
  if (c.on_engine(from) && c.on_engine(to)) {
    cost.add_hop(route.latency + c.engine->step, std::min(route.bandwidth, c.engine->bandwidth));
    cost.call = c.engine->call;
  } else {
    cost.add_hop(route.latency, route.bandwidth);
  }
}

void charge_engine(TaskGraph& g, size_t first, const Cluster& c, const std::vector<int>& devices) {
  if (!c.engine || std::none_of(devices.begin(), devices.end(), [&](int d) { return c.on_engine(d); }))
    return;
  // The host invokes the engine on every board when the collective starts: its call delays the flows
  // that wait on no other flow of the collective (a ring's first step, each tree's leaves, a
  // hierarchical group's reduce), in parallel; a flow that waits on another starts after a call
  // already paid (a board's data comes from a board that paid it). Charged on the first flow in task
  // order instead, a tree's root paid it again before its down flow, a hierarchical leader before
  // its ring (2026-12-05).
  const std::vector<char> waits = g.waits_within(first);
  for (size_t t = first; t < g.tasks.size(); ++t) {
    Task& task = g.tasks[t];
    // The engine's figures apply where both ends of a flow are on it (as its rate does, per flow:
    // Cluster::engine_rate): in a collective over GPUs and FPGAs, the FPGA-to-FPGA flows.
    if (task.is_compute() || !c.on_engine(task.device) || !c.on_engine(task.peer)) continue;
    task.duration = c.engine->step + (waits[t - first] ? 0 : c.engine->call);
  }
}

namespace closed_form {

double ring_allreduce(int n, double bytes, const LinkCost& hop) {
  if (n < 2) return 0;
  return hop.call + 2.0 * (n - 1) * hop.latency + 2.0 * (n - 1) / n * bytes / hop.bandwidth;
}

double ring_reduce_scatter(int n, double bytes, const LinkCost& hop) {
  if (n < 2) return 0;
  return hop.call + (n - 1.0) * hop.latency + (n - 1.0) / n * bytes / hop.bandwidth;
}

double ring_allgather(int n, double bytes, const LinkCost& hop) {
  return ring_reduce_scatter(n, bytes, hop);
}

double merged_ring(CollectiveKind kind, int n, double bytes, const LinkCost& hop) {
  if (n < 2) return 0;
  return hop.call + hop.latency + ring_flow_bytes(kind, bytes, n) / hop.bandwidth;
}

double multiring_allreduce(int machines, int per_machine, double bytes, const LinkCost& intra,
                           const LinkCost& inter) {
  const int n = machines * per_machine;
  if (machines < 2 || per_machine < 2) {
    LinkCost slower = intra;
    slower.add_hop(inter.latency, inter.bandwidth);
    return ring_allreduce(n, bytes, machines < 2 ? intra : slower);
  }
  const double c = bytes / (static_cast<double>(per_machine) * n);
  const double step =
      std::max(intra.latency + (per_machine - 1) * c / intra.bandwidth, inter.latency + c / inter.bandwidth);
  return std::max(intra.call, inter.call) + 2.0 * (n - 1) * step;
}

double hierarchical_allreduce(int machines, int per_machine, double bytes, const LinkCost& leader,
                              const LinkCost& inter) {
  const double gather = per_machine > 1 ? leader.latency + (per_machine - 1) * bytes / leader.bandwidth : 0;
  return 2 * gather + ring_allreduce(machines, bytes, inter);
}

double all_to_all(int n, double bytes_per_pair, const LinkCost& port) {
  if (n < 2 || bytes_per_pair <= 0) return 0;
  return port.call + port.latency + (n - 1) * bytes_per_pair / port.bandwidth;
}

double all_to_all(int machines, int per_machine, double bytes_per_pair, const LinkCost& intra,
                  const LinkCost& inter) {
  const double inside = all_to_all(per_machine, bytes_per_pair, intra);
  if (machines < 2 || bytes_per_pair <= 0) return inside;
  const double across =
      inter.call + inter.latency + (machines - 1.0) * per_machine * bytes_per_pair / inter.bandwidth;
  return std::max(inside, across);
}

double deduplicated_all_to_all(int machines, int per_machine, double token_bytes, double hit_device,
                               double hit_node, const LinkCost& intra, const LinkCost& inter) {
  const double inside = per_machine > 1 && token_bytes > 0
                            ? intra.call + intra.latency +
                                  (per_machine - 1.0) * machines * token_bytes * hit_device / intra.bandwidth
                            : 0.0;
  if (machines < 2 || token_bytes <= 0) return inside;
  return std::max(inside,
                  inter.call + inter.latency + (machines - 1.0) * token_bytes * hit_node / inter.bandwidth);
}

double chain_broadcast(int n, double bytes, int chunks, const LinkCost& hop) {
  if (n < 2) return 0;
  const int k = std::max(1, chunks);
  return hop.call + (n - 2.0 + k) * (hop.latency + bytes / k / hop.bandwidth);
}

double send(double bytes, const LinkCost& hop) {
  return hop.latency + bytes / hop.bandwidth;
}

double ring_shift(int n, double bytes, const LinkCost& hop) {
  return n < 2 ? 0 : hop.call + send(bytes, hop);
}

}  // namespace closed_form

Result<double> concurrent_ring_time(const Cluster& c, const Router& router,
                                    const std::vector<std::vector<int>>& rings, double bytes,
                                    CollectiveKind kind) {
  size_t n = 0;
  for (const auto& ring : rings) n = std::max(n, ring.size());
  if (n < 2) return 0.0;
  for (const auto& ring : rings)
    if (ring.size() != n) return Error{"internal error: rings of different sizes"};
  // One step's flows: device j of each ring to device j + 1; their routes, and the flows per channel.
  // A flow holds every channel of its route for chunk / the route's bandwidth (as the evaluator
  // runs a transfer); load = a channel's time held per step, over every ring's flow.
  const double chunk = bytes / static_cast<double>(n);
  std::vector<Route> routes;
  std::map<size_t, double> load;
  // The flows between two devices on the collective engine, with its costs (charge_engine's).
  std::vector<char> engine;
  for (const auto& ring : rings)
    for (size_t j = 0; j < n; ++j) {
      Result<Route> r = router.route(ring[j], ring[(j + 1) % n]);
      if (!r) return r.error();
      engine.push_back(c.on_engine(ring[j]) && c.on_engine(ring[(j + 1) % n]));
      if (engine.back()) r->bandwidth = std::min(r->bandwidth, c.engine->bandwidth);
      for (const Hop& h : r->hops) load[link_channel(c, h)] += chunk / r->bandwidth;
      routes.push_back(std::move(*r));
    }
  double longest = 0;
  std::vector<double> latency(n), hold(n), received(n), sent(n), free_at(n);
  for (size_t q = 0; q < rings.size(); ++q) {
    for (size_t j = 0; j < n; ++j) {
      const Route& r = routes[q * n + j];
      double busy = 0;  // the most any of its channels is held in one step
      for (const Hop& h : r.hops) busy = std::max(busy, load[link_channel(c, h)]);
      latency[j] = r.hops.empty() ? 0 : r.latency;
      hold[j] = busy;
    }
    // The evaluator's ring: device j sends step s once it received step s - 1 from j - 1 and its
    // link is free (FIFO: the previous step's bytes have left); a flow takes latency + hold.
    std::fill(received.begin(), received.end(), 0.0);
    std::fill(free_at.begin(), free_at.end(), 0.0);
    const size_t steps = kind == CollectiveKind::AllReduce ? 2 * (n - 1) : n - 1;
    for (size_t step = 0; step < steps; ++step) {
      for (size_t j = 0; j < n; ++j) {
        const double wait = engine[q * n + j] ? c.engine->step + (step == 0 ? c.engine->call : 0.0) : 0.0;
        const double start = std::max(received[j] + wait, free_at[j]);
        free_at[j] = start + hold[j];
        sent[j] = start + latency[j] + hold[j];  // arrives at j + 1
      }
      for (size_t j = 0; j < n; ++j) received[(j + 1) % n] = sent[j];
    }
    for (double t : received) longest = std::max(longest, t);
  }
  return longest;
}

}  // namespace pipegrid
