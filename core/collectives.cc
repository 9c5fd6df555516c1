#include "core/collectives.h"

#include <algorithm>
#include <map>
#include <string>

namespace pipegrid {
namespace {

using Deps = std::vector<int32_t>;

int32_t add_transfer(TaskGraph& g, int from, int to, double bytes, int32_t stage, const Deps& after) {
  Task t;
  t.kind = TaskKind::Transfer;
  t.transfer = TransferKind::AllReduce;
  t.stage = t.peer_stage = stage;
  t.device = from;
  t.peer = to;
  t.bytes = bytes;
  const int32_t id = g.add(t);
  for (int32_t d : after)
    if (d >= 0) g.depend(d, id);
  return id;
}

// Ring all-reduce among devices[0..n): returns each device's last receive (empty for n = 1).
std::vector<Deps> ring(TaskGraph& g, const std::vector<int>& devices, const std::vector<Deps>& ready,
                       double bytes, int32_t stage) {
  const int n = static_cast<int>(devices.size());
  std::vector<Deps> done(n);
  if (n < 2) return done;
  const double chunk = bytes / n;
  std::vector<int32_t> prev(n, -1);
  for (int step = 0; step < 2 * (n - 1); ++step) {
    std::vector<int32_t> cur(n);
    for (int j = 0; j < n; ++j) {
      Deps after;
      // The reduce-scatter steps and the first all-gather step send chunks that include the
      // device's own data: they need it as well as what arrived.
      if (step < n) after = ready[j];
      if (step > 0) after.push_back(prev[(j - 1 + n) % n]);
      cur[j] = add_transfer(g, devices[j], devices[(j + 1) % n], chunk, stage, after);
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

std::string_view to_string(AllReduceAlgorithm a) {
  switch (a) {
    case AllReduceAlgorithm::Ring:
      return "ring";
    case AllReduceAlgorithm::Hierarchical:
      return "hierarchical";
    case AllReduceAlgorithm::MultiRing:
      return "multi-ring";
  }
  return "ring";
}

std::optional<AllReduceAlgorithm> parse_allreduce(std::string_view name) {
  if (name == "ring") return AllReduceAlgorithm::Ring;
  if (name == "hierarchical") return AllReduceAlgorithm::Hierarchical;
  if (name == "multi-ring") return AllReduceAlgorithm::MultiRing;
  return std::nullopt;
}

Result<double> ring_allreduce_time(const Cluster& c, const Router& router,
                                   const std::vector<std::vector<int>>& rings, double bytes) {
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
  for (const auto& ring : rings)
    for (size_t j = 0; j < n; ++j) {
      Result<Route> r = router.route(ring[j], ring[(j + 1) % n]);
      if (!r) return r.error();
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
    for (size_t step = 0; step < 2 * (n - 1); ++step) {
      for (size_t j = 0; j < n; ++j) {
        const double start = std::max(received[j], free_at[j]);
        free_at[j] = start + hold[j];
        sent[j] = start + latency[j] + hold[j];  // arrives at j + 1
      }
      for (size_t j = 0; j < n; ++j) received[(j + 1) % n] = sent[j];
    }
    for (double t : received) longest = std::max(longest, t);
  }
  return longest;
}

std::vector<std::vector<int32_t>> append_allreduce(TaskGraph& g, AllReduceAlgorithm algorithm,
                                                   const Cluster& c, const std::vector<int>& devices,
                                                   const std::vector<int32_t>& ready, double bytes,
                                                   int32_t stage) {
  const size_t n = devices.size();
  std::vector<Deps> ready_sets(n);
  for (size_t j = 0; j < n; ++j) ready_sets[j] = {ready[j]};
  if (algorithm == AllReduceAlgorithm::Ring) return ring(g, devices, ready_sets, bytes, stage);

  if (algorithm == AllReduceAlgorithm::MultiRing) {
    const std::vector<std::vector<size_t>> orders = multi_ring_orders(c, devices);
    if (orders.size() < 2) return ring(g, devices, ready_sets, bytes, stage);
    std::vector<Deps> done(n);
    for (const std::vector<size_t>& index : orders) {
      std::vector<int> order;
      std::vector<Deps> order_ready;
      for (size_t j : index) {
        order.push_back(devices[j]);
        order_ready.push_back(ready_sets[j]);
      }
      std::vector<Deps> got = ring(g, order, order_ready, bytes / static_cast<double>(orders.size()), stage);
      for (size_t i = 0; i < index.size(); ++i)
        done[index[i]].insert(done[index[i]].end(), got[i].begin(), got[i].end());
    }
    return done;
  }
  const std::vector<std::vector<size_t>> members = machines(c, devices);
  std::vector<Deps> done(n);
  std::vector<int> leaders;
  std::vector<Deps> leader_ready;
  for (const auto& m : members) {
    const size_t lead = m[0];
    Deps reduced = ready_sets[lead];
    for (size_t i = 1; i < m.size(); ++i)
      reduced.push_back(add_transfer(g, devices[m[i]], devices[lead], bytes, stage, ready_sets[m[i]]));
    leaders.push_back(devices[lead]);
    leader_ready.push_back(std::move(reduced));
  }
  std::vector<Deps> across = ring(g, leaders, leader_ready, bytes, stage);
  for (size_t k = 0; k < members.size(); ++k) {
    const auto& m = members[k];
    // With one machine the leader's result is the reduction itself.
    Deps have = leaders.size() > 1 ? across[k] : leader_ready[k];
    if (m.size() > 1 || leaders.size() > 1) {
      done[m[0]] = have;
      done[m[0]].erase(std::remove(done[m[0]].begin(), done[m[0]].end(), -1), done[m[0]].end());
    }
    for (size_t i = 1; i < m.size(); ++i)
      done[m[i]] = {add_transfer(g, devices[m[0]], devices[m[i]], bytes, stage, have)};
  }
  return done;
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

}  // namespace pipegrid
