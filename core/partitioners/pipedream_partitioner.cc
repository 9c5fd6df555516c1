// pipedream: PipeDream's planner (core/partitioners/pipedream.h) as a pipegrid partitioner. Layer
// times are the cost model's for one micro-batch on the first device (a PipeDream profile's own
// measurements when the micro-batch is the profiled batch), activations for the micro-batch.
// Machines map to devices in order: with a hierarchy (innermost first, e.g. 4 GPUs per server,
// then 8 servers) a level-l machine is a block of consecutive devices; without one, one level of
// every device at the bandwidth of the route between the first two devices (or of each node's
// devices and then the nodes, when the cluster groups devices into equal nodes).
#include <fmt/format.h>

#include <chrono>

#include "core/partitioners/pipedream.h"
#include "core/strategy.h"
#include "core/units.h"

namespace pipegrid {
namespace {

Result<std::vector<PipeDreamLevel>> default_levels(const Cluster& c) {
  const int D = static_cast<int>(c.devices.size());
  if (D == 1) return std::vector<PipeDreamLevel>{{1, 1e9}};
  Router router(c);
  // Equal nodes of several devices: a two-level hierarchy.
  std::vector<std::string> nodes;
  for (const Device& d : c.devices)
    if (nodes.empty() || nodes.back() != d.node) nodes.push_back(d.node);
  const int per_node = D / static_cast<int>(nodes.size());
  bool grouped = !c.devices.front().node.empty() && nodes.size() > 1 && per_node > 1 &&
                 per_node * static_cast<int>(nodes.size()) == D;
  for (int d = 0; grouped && d < D; ++d) grouped = c.devices[d].node == nodes[d / per_node];
  if (grouped) {
    Result<Route> inside = router.route(0, 1);
    Result<Route> across = router.route(0, per_node);
    if (!inside) return inside.error();
    if (!across) return across.error();
    return std::vector<PipeDreamLevel>{{per_node, inside->bandwidth}, {D / per_node, across->bandwidth}};
  }
  Result<Route> r = router.route(0, 1);
  if (!r) return r.error();
  return std::vector<PipeDreamLevel>{{D, r->bandwidth}};
}

}  // namespace

Result<Partition> partition_pipedream(const PartitionRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const Workload& w = r.workload;
  const DeviceSpec& spec = r.cluster.devices.front().spec;
  std::vector<double> time(w.layer_count()), act(w.layer_count());
  for (size_t l = 0; l < w.layer_count(); ++l) {
    Result<PassTimes> t = layer_times(w.layer(l), w.precision, spec, r.micro_batch_size);
    if (!t) return Error{fmt::format("pipedream: {}", t.error().message)};
    time[l] = t->forward + t->backward();
    act[l] = w.layer(l).output_bytes * r.micro_batch_size;
  }
  PipeDreamOptions o;
  o.straight = r.options.straight;
  o.activation_compression_ratio = r.options.activation_compression_ratio;
  o.memory_constraint = r.options.memory_constraint;
  o.linearize = r.options.linearize;
  o.memory_bytes = spec.usable_memory();
  // Split replicas take whole samples of a micro-batch; round-robin ones (PipeDream's own mode) take
  // whole micro-batches, so any count is allowed.
  o.whole_samples_of = r.options.round_robin ? 0 : r.micro_batch_size;
  if (r.options.hierarchy.empty()) {
    Result<std::vector<PipeDreamLevel>> levels = default_levels(r.cluster);
    if (!levels) return levels.error();
    o.levels = std::move(*levels);
  } else {
    for (auto [machines, bw] : r.options.hierarchy) o.levels.push_back({machines, bw});
  }
  long long machines = 1;
  for (const PipeDreamLevel& l : o.levels) machines *= l.machines;
  if (machines > static_cast<long long>(r.cluster.devices.size()))
    return Error{fmt::format("pipedream: the hierarchy has {} machines, the cluster {} devices", machines,
                             r.cluster.devices.size())};
  Result<PipeDreamPlan> plan = plan_pipedream(w, time, act, o);
  if (!plan) return plan.error();
  // Over several levels a stage's replicas multiply (2 x 2 on micro-batches of 2): refused, not split.
  for (size_t s = 0; s < plan->stages.size(); ++s)
    if (const int c = static_cast<int>(plan->stages[s].devices.size());
        !r.options.round_robin && !whole_samples_per_replica(r.micro_batch_size, c))
      return Error{
          fmt::format("pipedream: stage {} would have {} replicas over {} levels, splitting each micro-batch "
                      "of {} samples "
                      "into {} samples each; use a micro-batch size divisible by {} (or global_batch)",
                      s, c, o.levels.size(), r.micro_batch_size, r.micro_batch_size / c, c)};
  std::vector<int> stage_of(w.layer_count(), -1);
  std::vector<std::vector<int>> devices;
  for (size_t s = 0; s < plan->stages.size(); ++s) {
    for (int l : plan->stages[s].layers) stage_of[l] = static_cast<int>(s);
    devices.push_back(plan->stages[s].devices);
  }
  Result<Partition> p = make_partition(w, stage_of, devices, r.cluster.devices.size());
  if (!p) return Error{fmt::format("pipedream: {}", p.error().message)};
  add_sequence_edges(*p);
  p->plan.predicted_time_per_stage_s = plan->time_per_stage;
  for (const PipeDreamStage& st : plan->stages)
    p->plan.predicted_stage_time_s.push_back(st.time / st.replicas);
  p->plan.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string levels;
  for (const PipeDreamLevel& l : o.levels)
    levels +=
        fmt::format("{}{} x {}", levels.empty() ? "" : ", then ", l.machines, format_bandwidth(l.bandwidth));
  std::string reps;
  for (const PipeDreamStage& st : plan->stages)
    reps += fmt::format("{}{}", reps.empty() ? "" : ",", st.replicas);
  p->plan.summary = fmt::format(
      "pipedream: time per stage in pipeline {:.9g} s ({} {} states; machines {}{}; replicas per stage {}){}",
      plan->time_per_stage, plan->states, plan->linearized ? "linearised" : "antichain", levels,
      o.straight ? "; straight" : "", reps, plan->note.empty() ? "" : "; " + plan->note);
  return p;
}

}  // namespace pipegrid
