#include "tools/input/experiment_yaml.h"

#include <fmt/format.h>

#include "core/models/chain.h"
#include "core/strategy.h"
#include "core/topologies/generators.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {
namespace {

constexpr long long kMaxCount = 1'000'000;

Workload parse_chain(const Node& n) {
  n.check_keys({"kind", "layers", "forward", "backward", "backward_weight", "activation", "parameters",
                "samples_per_micro_batch", "optimizer_step", "precision"});
  ChainSpec c;
  c.layers = static_cast<int>(n.need("layers", "a positive integer").integer(1, kMaxCount, "a positive integer"));
  c.forward_s = n.need("forward", describe(Dimension::Time, "non-negative")).quantity(Dimension::Time, Sign::NonNegative);
  c.backward_s = n.need("backward", describe(Dimension::Time, "non-negative")).quantity(Dimension::Time, Sign::NonNegative);
  if (auto bw = n.get("backward_weight")) {
    c.backward_weight_s = bw->quantity(Dimension::Time, Sign::NonNegative);
    if (c.backward_weight_s > c.backward_s)
      bw->fail(fmt::format("expected at most the whole backward ({}), got \"{}\"", format_time(c.backward_s),
                           bw->yaml().Scalar()));
  }
  c.activation_bytes =
      n.need("activation", describe(Dimension::Bytes, "non-negative")).quantity(Dimension::Bytes, Sign::NonNegative);
  c.parameter_bytes =
      n.need("parameters", describe(Dimension::Bytes, "non-negative")).quantity(Dimension::Bytes, Sign::NonNegative);
  if (auto s = n.get("samples_per_micro_batch"))
    c.samples_per_micro_batch = static_cast<double>(s->integer(1, kMaxCount, "a positive integer"));
  if (auto s = n.get("optimizer_step")) c.optimizer_step_s = s->quantity(Dimension::Time, Sign::NonNegative);
  if (auto p = n.get("precision")) c.precision = *parse_precision(p->choice({"fp32", "fp16", "bf16", "int8"}, "a precision"));
  return make_chain(c);
}

Workload parse_workload(const Node& n) {
  n.require_map("a mapping describing the workload");
  n.need("kind", "a workload kind (chain)").choice({"chain"}, "a workload kind");
  return parse_chain(n);
}

DeviceSpec parse_device(const Node& n, std::string* name) {
  n.require_map("a mapping with the device's name and memory");
  n.check_keys({"name", "memory", "flops"});
  *name = n.need("name", "a device name").string("a device name");
  DeviceSpec spec;
  spec.memory_bytes =
      n.need("memory", describe(Dimension::Bytes, "positive")).quantity(Dimension::Bytes, Sign::Positive);
  if (auto f = n.get("flops")) spec.peak_flops.fill(f->quantity(Dimension::FlopRate, Sign::Positive));
  return spec;
}

Cluster parse_cluster(const Node& n) {
  n.require_map("a mapping describing the cluster");
  n.need("kind", "a cluster kind (switch)").choice({"switch"}, "a cluster kind");
  n.check_keys({"kind", "count", "device", "bandwidth", "latency"});
  int count = static_cast<int>(n.need("count", "a positive integer").integer(1, kMaxCount, "a positive integer"));
  std::string name;
  DeviceSpec spec = parse_device(n.need("device", "a mapping with the device's name and memory"), &name);
  double bw = n.need("bandwidth", describe(Dimension::Bandwidth, "positive")).quantity(Dimension::Bandwidth, Sign::Positive);
  double lat = n.need("latency", describe(Dimension::Time, "non-negative")).quantity(Dimension::Time, Sign::NonNegative);
  return make_switch_cluster(count, name, spec, bw, lat);
}

std::vector<std::string_view> names_of(auto table) {
  std::vector<std::string_view> out;
  for (const auto& t : table) out.push_back(t.name);
  return out;
}

StrategySpec parse_strategy(const Node& n, const Workload& w, const Cluster& c) {
  n.require_map("a mapping describing the strategy");
  n.check_keys({"partitioner", "schedule", "micro_batches", "stages"});
  StrategySpec s;
  if (auto p = n.get("partitioner")) s.partitioner = p->choice(names_of(partition_strategies()), "a partitioner");
  if (auto p = n.get("schedule")) s.schedule = p->choice(names_of(schedule_strategies()), "a schedule");
  s.micro_batches = static_cast<int>(
      n.need("micro_batches", "a positive integer").integer(1, kMaxCount, "a positive integer"));
  if (auto st = n.get("stages")) {
    s.stages = static_cast<int>(st->integer(1, kMaxCount, "a positive integer"));
    if (static_cast<size_t>(s.stages) > c.devices.size())
      st->fail(fmt::format("expected at most {} stages (the cluster has {} devices), got {}", c.devices.size(),
                           c.devices.size(), s.stages));
    if (static_cast<size_t>(s.stages) > w.layer_count())
      st->fail(fmt::format("expected at most {} stages (the workload has {} layers), got {}", w.layer_count(),
                           w.layer_count(), s.stages));
  }
  return s;
}

MemoryOptions parse_memory(const Node& n) {
  n.require_map("a mapping describing the memory model");
  n.check_keys({"optimizer", "bytes_per_parameter"});
  MemoryOptions m;
  if (auto o = n.get("optimizer"))
    m.optimizer = *parse_optimizer(o->choice({"sgd", "momentum", "adam", "mixed-adam"}, "an optimizer"));
  if (auto b = n.get("bytes_per_parameter")) {
    double v = b->number("a non-negative number of bytes");
    if (v < 0) b->expected("a non-negative number of bytes");
    m.bytes_per_parameter = v;
  }
  return m;
}

Experiment parse_experiment(const Document& doc) {
  Node root = Node::root(doc);
  if (root.is_null()) root.fail("expected a mapping with keys workload, cluster, strategy, got an empty document");
  root.require_map("a mapping with keys workload, cluster, strategy");
  root.check_keys({"name", "workload", "cluster", "strategy", "memory"});
  Experiment e;
  if (auto n = root.get("name")) e.name = n->string("a name");
  e.workload = parse_workload(root.need("workload", "a mapping describing the workload"));
  e.cluster = parse_cluster(root.need("cluster", "a mapping describing the cluster"));
  e.strategy = parse_strategy(root.need("strategy", "a mapping describing the strategy"), e.workload, e.cluster);
  if (auto m = root.get("memory")) e.memory = parse_memory(*m);
  return e;
}

}  // namespace

Result<Experiment> load_experiment_file(const std::string& path) {
  try {
    return parse_experiment(load_document_file(path));
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

Result<Experiment> load_experiment_text(const std::string& text, const std::string& name) {
  try {
    return parse_experiment(load_document_text(text, name));
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

}  // namespace pipegrid::input
