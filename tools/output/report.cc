#include "tools/output/report.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "core/backends.h"
#include "core/executor.h"
#include "core/fold.h"
#include "core/lower.h"
#include "core/schedule.h"
#include "core/units.h"
#include "tools/output/device_groups.h"
#include "tools/output/run_figures.h"

namespace pipegrid::output {
namespace {

std::string device_list(const Experiment& e, const Stage& st) {
  std::string out;
  for (int d : st.devices) out += fmt::format("{}{}", out.empty() ? "" : ",", e.cluster.devices[d].name);
  return out;
}

std::string percent(double x) {
  return fmt::format("{:.2f}%", 100 * x);
}

// What a bound host adds to the stages' compute per micro-batch (the cost model's stage times, every
// device of every stage), beyond the devices' own kernel time: the share of the answer that rests on
// the host's per-launch figure (kernel_dispatch). Empty when no host bounds a launch.
struct HostShare {
  double host_s = 0, compute_s = 0;
  double fraction() const { return host_s / compute_s; }
};
std::optional<HostShare> host_share(const Result<std::vector<std::vector<StageCost>>>& costs) {
  if (!costs) return std::nullopt;
  HostShare h;
  for (const std::vector<StageCost>& stage : *costs)
    for (const StageCost& sc : stage) {
      h.host_s += sc.times.host_forward_s + sc.times.host_backward_s;
      h.compute_s += sc.times.forward + sc.times.backward();
    }
  // Below a millionth of the compute it is the rounding of the stretched sums, not a host.
  if (h.compute_s <= 0 || h.host_s <= 1e-6 * h.compute_s) return std::nullopt;
  return h;
}

std::string_view task_category(const Task& t) {
  switch (t.kind) {
    case TaskKind::Forward:
      return "forward";
    case TaskKind::Backward:
      return "backward";
    case TaskKind::Weight:
      return "weight";
    case TaskKind::Optimizer:
      return "optimizer";
    case TaskKind::Transfer:
      return to_string(t.transfer);
  }
  return "task";
}

std::string task_name(const Task& t) {
  switch (t.kind) {
    case TaskKind::Forward:
      return to_string(Action{t.stage, Pass::Forward, t.micro_batch});
    case TaskKind::Backward:
      return to_string(Action{t.stage, Pass::Backward, t.micro_batch});
    case TaskKind::Weight:
      return to_string(Action{t.stage, Pass::Weight, t.micro_batch});
    case TaskKind::Optimizer:
      return "optimizer step";
    case TaskKind::Transfer:
      if (t.transfer == TransferKind::DataParallel) return fmt::format("all-reduce stage {}", t.stage);
      if (t.transfer == TransferKind::TensorParallel)
        return fmt::format("TP collective stage {} mb{}", t.stage, t.micro_batch);
      if (t.transfer == TransferKind::ExpertParallel)
        return fmt::format("EP collective stage {} mb{}", t.stage, t.micro_batch);
      if (t.transfer == TransferKind::ContextParallel)
        return fmt::format("CP K/V exchange stage {} mb{}", t.stage, t.micro_batch);
      return fmt::format("{} {}->{} mb{}", task_category(t), t.stage, t.peer_stage, t.micro_batch);
  }
  return "task";
}

}  // namespace

nlohmann::json breakdown_json(const TimeBreakdown& b, bool experts, bool context) {
  nlohmann::json j{{"compute_s", b.compute_s},   {"tensor_parallel_s", b.tensor_parallel_s},
                   {"pipeline_s", b.pipeline_s}, {"data_parallel_s", b.data_parallel_s},
                   {"bubble_s", b.bubble_s},     {"optimizer_s", b.optimizer_s}};
  if (experts) j["expert_parallel_s"] = b.expert_parallel_s;
  if (context) j["context_parallel_s"] = b.context_parallel_s;
  return j;
}

std::string context_note(const Experiment& e, const Partition& p) {
  const int cp = parallelism(p).context;
  if (cp <= 1) return "";
  return fmt::format("cp = {} (context, {}{})", cp, to_string(e.strategy.context.algorithm),
                     e.strategy.context.load_balance ? "" : ", contiguous split");
}

// DeepEP's de-duplication (core/collectives.h deduplicated_dispatch_bytes) as the first MoE stage's
// first expert-parallel group sits: how often a token reaches a device's and a node's experts.
std::string deepep_note(const Experiment& e, const Partition& p, int experts) {
  if (e.strategy.moe.dispatcher != MoeDispatcher::DeepEP) return "";
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    if (st.expert_parallel < 2) continue;
    std::vector<int> devices;
    for (int q :
         group_members(CommGroup::Expert, 0, st.tensor_parallel,
                       ExpertSizes{st.expert_parallel, st.expert_tensor_parallel}, st.context_parallel))
      devices.push_back(st.devices[static_cast<size_t>(q)]);
    const auto layout = node_layout(e.cluster, devices);
    if (!layout) return "";
    const RoutingDraw draw = moe_routing(e.workload);
    const int held = experts / st.expert_parallel;
    return fmt::format(
        "; deepep: a token goes once to each node holding one of its experts (p {:.3g} per node of {} "
        "devices{}), to the device at its sender's position, which forwards it once to each device holding "
        "one (p {:.3g}), both hops at once (balanced routing; docs/moe.md)",
        routed_hit_probability(draw, held * layout->second), layout->second,
        draw.limited() ? fmt::format(", its experts from {} of {} groups", draw.top_groups, draw.groups) : "",
        routed_hit_probability(draw, held));
  }
  return "";
}

// Whether the expert groups send flows of their own (ep or etp > 1): the breakdown's expert_parallel_s.
bool expert_traffic(const Parallelism& par) {
  return par.expert > 1 || par.expert_tensor > 1;
}

std::string expert_comm_label(const Experiment& e, const Parallelism& par) {
  if (par.expert <= 1) return "expert-TP collectives";
  return e.strategy.moe.dispatcher == MoeDispatcher::AllGather ? "EP all-gather and reduce-scatter"
                                                               : "EP all-to-all";
}

// Whether run's experts line and JSON appear: on every workload with MoE blocks (where the options
// leave the experts' work as its defaults too, the line says what those are).
bool reports_experts(const Experiment& e, const Parallelism& par) {
  return expert_traffic(par) || routed_experts(e.workload) > 0;
}

std::string moe_note(const Experiment& e, const Partition& p, bool node_aggregated) {
  const Parallelism par = parallelism(p);
  const int experts = static_cast<int>(routed_experts(e.workload));
  const std::vector<double> loads = expert_loads(e.strategy.moe, experts, par.expert);
  const double kept = kept_copy_share(e.strategy.moe, experts);
  std::string routing = e.strategy.moe.expert_shares.empty() ? "balanced routing"
                        : par.expert > 1 || e.strategy.moe.capacity_factor > 0
                            ? "routing as given"
                            : "routing as given (at ep 1 every device runs every expert: the skew moves "
                              "no work, and without a capacity factor drops nothing)";
  if (e.strategy.moe.capacity_factor > 0)
    routing += fmt::format(", capacity factor {:g} ({} of the token copies dropped)",
                           e.strategy.moe.capacity_factor, percent(1 - kept));
  else
    routing += ", dropless";
  const std::string flows =
      par.expert == 1 || e.strategy.moe.dispatcher != MoeDispatcher::AllToAll ? ""
      : node_aggregated
          ? fmt::format("; all-to-alls as two flows per device, node-aggregated ({}: docs/moe.md)",
                        e.strategy.moe.all_to_all == MoeOptions::AllToAllFlows::Auto
                            ? "above 2^22 flows; up to 0.3% slower measured"
                            : "as asked; up to 0.3% slower measured")
      : e.strategy.moe.all_to_all == MoeOptions::AllToAllFlows::ByNode
          ? "; all-to-alls as one flow per pair (by-node asked, not applied: it needs balanced routing and "
            "expert-parallel groups spread evenly over several nodes, where it sends fewer flows)"
          : "; all-to-alls as one flow per pair";
  const MoeOptions& o = e.strategy.moe;
  const std::string fusion =
      o.dispatcher != MoeDispatcher::AllToAll
          ? ""
          : fmt::format(" (router {}, permutation {})", o.router_fusion ? "fused" : "unfused",
                        o.permute_fusion ? "fused" : "unfused");
  const std::string eager = eager_expert_work(e.workload);
  const std::string mlp =
      o.fused_grouped_mlp
          ? fmt::format(", experts' MLP fused by Transformer Engine's op fuser (no eager bias or clamp){}",
                        e.workload.precision == Precision::AMP_MXFP8
                            ? ", their mxfp8 inputs quantized per grouped GEMM, not per expert"
                            : "")
      : !eager.empty() ? fmt::format(
                             ", {} in eager PyTorch kernels as Megatron-Core's TEGroupedMLP "
                             "runs them, those off its vectorised path of kernel class strided "
                             "(moe.fused_grouped_mlp: Transformer Engine's op fuser)",
                             eager)
                       : "";
  const std::string activation = !o.fused_grouped_mlp && compiled_expert_activation(e.workload)
                                     ? ", weighted activation by torch.compile (kernel class compiled)"
                                     : "";
  return fmt::format(
      "{} per device (ep {}, etp {}), {} dispatcher{}{}{}{}; {}; load imbalance {:.3g} (the busiest "
      "expert-parallel rank's tokens over the mean){}{}",
      experts / par.expert, par.expert, par.expert_tensor, to_string(e.strategy.moe.dispatcher), fusion, mlp,
      activation, e.strategy.moe_overlap ? ", all-to-alls overlapped with another micro-batch's compute" : "",
      routing, load_imbalance(loads), flows, deepep_note(e, p, experts));
}

std::string plural(double count, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", count, count == 1 ? one : many);
}

std::string layer_list(const Workload& w, const std::vector<int>& layers) {
  if (layers.empty()) return "-";
  std::vector<int> sorted = layers;
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;  // sorted[i..j] are consecutive layers
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    const std::string& first = w.layer(sorted[i]).name;
    const std::string& last = w.layer(sorted[j]).name;
    if (!out.empty()) out += ", ";
    out += j == i ? first : j == i + 1 ? first + ", " + last : first + ".." + last;
    i = j + 1;
  }
  return sorted.size() == 1 ? out : fmt::format("{} ({} layers)", out, sorted.size());
}

std::string stage_edges(const Partition& p) {
  std::string out;
  for (size_t s = 0; s < p.stage_count(); ++s)
    for (int t : p.successors(static_cast<int>(s)))
      out += fmt::format("{}{}->{}", out.empty() ? "" : ", ", s, t);
  return out.empty() ? "none" : out;
}

namespace {

// The names of the devices of `c` that hold no stage of `p`, in device order.
std::vector<std::string> idle_devices(const Cluster& c, const Partition& p) {
  std::vector<char> used(c.devices.size(), 0);
  for (size_t s = 0; s < p.stage_count(); ++s)
    for (int d : p.stage(s).devices) used[static_cast<size_t>(d)] = 1;
  std::vector<std::string> idle;
  for (size_t d = 0; d < used.size(); ++d)
    if (!used[d]) idle.push_back(c.devices[d].name);
  return idle;
}

}  // namespace

std::string idle_devices_note(const Cluster& c, const Partition& p) {
  const std::vector<std::string> idle = idle_devices(c, p);
  if (idle.empty()) return "";
  const size_t shown = std::min<size_t>(idle.size(), 4);
  return fmt::format("{} of {} devices hold no stage ({}{})", idle.size(), c.devices.size(),
                     fmt::join(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                     idle.size() > shown ? ", ..." : "");
}

namespace {

// ZeRO-1 where no stage has a data-parallel (x context-parallel) group to shard over: the same run
// as without, which the key would otherwise suggest is not. Empty when it shards somewhere.
std::string zero_without_group(const Experiment& e, const Partition& p) {
  if (!e.memory.zero1) return "";
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    if (st.gradient_replicas() > 1 ||
        static_cast<int>(st.devices.size()) / (st.expert_parallel * st.expert_tensor_parallel) > 1)
      return "";
  }
  return "memory.zero: 1 changes nothing: ZeRO-1 shards the optimizer state over a stage's data-parallel (x "
         "context-parallel) replicas, and no stage has more than one";
}

// A planner (or the default planner's partitioner) that costs every device as the first one, on a
// plan that uses a device unlike it. Empty otherwise.
std::string unlike_devices_warning(const Experiment& e, const PreparedRun& run) {
  Result<const PlannerInfo*> planner = find_planner(run.planner);
  if (!planner) return "";
  const bool partitioner = (*planner)->runs_partitioner;
  Result<const PartitionStrategy*> cut = find_partitioner(e.strategy.partitioner);
  if (!(partitioner ? cut && (*cut)->assumes_identical_devices : (*planner)->assumes_identical_devices))
    return "";
  const Device& first = e.cluster.devices.front();
  for (size_t s = 0; s < run.partition.stage_count(); ++s)
    for (int d : run.partition.stage(s).devices)
      if (const Device& other = e.cluster.devices[static_cast<size_t>(d)];
          !same_device(other.spec, first.spec))
        return fmt::format(
            "{} {} plans as if every device were the first ({}, {}); {} ({}) differs, and the replay runs "
            "each "
            "device at its own speed, so the plan may not be the best for this cluster",
            partitioner ? "partitioner" : "planner", partitioner ? e.strategy.partitioner : run.planner,
            first.name, first.spec.kind, other.name, other.spec.kind);
  return "";
}

}  // namespace

// A fault's slow devices (Device::slowdown) are in the lowering, which the replay runs, and not in the
// costs the partitioners whose tables say blind_to_slow_devices search with.
std::string slow_devices_warning(const Experiment& e, const PreparedRun& run) {
  std::string slow;
  for (const Device& d : e.cluster.devices)
    if (d.slowdown != 1) slow += fmt::format("{}{} {:g}x", slow.empty() ? "" : ", ", d.name, d.slowdown);
  Result<const PlannerInfo*> planner = find_planner(run.planner);
  Result<const PartitionStrategy*> cut = find_partitioner(e.strategy.partitioner);
  if (slow.empty() || !planner || !(*planner)->runs_partitioner || !cut || !(*cut)->blind_to_slow_devices)
    return "";
  return fmt::format(
      "partitioner {} searches with every device at the first device's model speed: the fault's slow devices "
      "({}) are replayed slow but not in its estimate, so the plan may not be the best for them (partitioner "
      "balanced and planners bapipe, luo, dapple and piper search with them)",
      e.strategy.partitioner, slow);
}

// A fault's slow device that no stage runs on changes nothing in the run: said, so that a what-if of a
// straggler that the plan left idle does not read as "the straggler costs nothing".
std::string idle_fault_warning(const Experiment& e, const PreparedRun& run) {
  const std::vector<std::string> idle = idle_devices(e.cluster, run.partition);
  std::vector<std::string> names;
  for (const Device& d : e.cluster.devices)
    if (d.slowdown != 1 && std::find(idle.begin(), idle.end(), d.name) != idle.end())
      names.push_back(fmt::format("{} {:g}x", d.name, d.slowdown));
  if (names.empty()) return "";
  return fmt::format("the fault slows {} ({}) that no stage runs on: {} nothing in this run",
                     names.size() == 1 ? "a device" : "devices", fmt::join(names, ", "),
                     names.size() == 1 ? "it changes" : "they change");
}

// A schedule that splits the backward (zb-h1, zb-h2, DualPipe) on a workload none of whose layers has
// a weight-gradient part (a chain without backward_weight): its W actions take no time, and the run
// is the schedule's order without the split, which the schedule's name would hide.
std::string split_without_weight_part(const Experiment& e, const PreparedRun& run) {
  if (!run.schedule.split_backward) return "";
  for (size_t l = 0; l < e.workload.layer_count(); ++l) {
    const Layer& x = e.workload.layer(static_cast<int>(l));
    if (x.backward_weight_flops > 0 || (x.measured && x.measured->backward_weight_s > 0)) return "";
    for (const Kernel& k : x.kernels)
      if (k.backward_weight_flops > 0) return "";
  }
  return fmt::format(
      "schedule {} splits each backward into input and weight gradients, and no layer of the workload has "
      "a weight-gradient part (a chain's backward_weight): its W actions take no time",
      run.schedule_name);
}

std::string fractional_parameters_warning(const Workload& w) {
  std::vector<std::string> names;
  for (size_t i = 0; i < w.layer_count(); ++i) {
    const Layer& l = w.layer(i);
    if (l.measured && l.parameters != std::floor(l.parameters))
      names.push_back(fmt::format("{} ({} bytes)", l.name, l.parameter_bytes));
  }
  if (names.empty()) return {};
  return fmt::format(
      "{} of the profile's layers have a parameter_size that is not a multiple of 4 bytes ({}{}), so "
      "their fp32 parameter counts are fractional (parameter_size / 4); the bytes are used as given, and "
      "if the profile wrote them in another unit its weights' memory and gradient sizes are off by it",
      names.size(), names.front(), names.size() > 1 ? fmt::format(", ..., {}", names.back()) : "");
}

std::vector<std::string> plan_warnings(const Experiment& e, const PreparedRun& run) {
  std::vector<std::string> out;
  if (std::string w = fractional_parameters_warning(e.workload); !w.empty()) out.push_back(std::move(w));
  // The default stage count (one rank per device) is capped by the layers per chunk: say which
  // devices that leaves idle instead of letting a `gpu7 (unused)` row be the only sign.
  if (run.planner == kDefaultPlanner && e.strategy.stages == 0) {
    const std::vector<std::string> idle_names = idle_devices(e.cluster, run.partition);
    const size_t idle_count = idle_names.size();
    std::string idle;
    for (size_t i = 0; i < idle_count && i < 4; ++i)
      idle += fmt::format("{}{}", i ? ", " : "", idle_names[i]);
    const int chunks = std::max(1, e.strategy.chunks);
    if (idle_count > 0 && e.workload.layer_count() / static_cast<size_t>(chunks) <
                              e.cluster.devices.size() /
                                  static_cast<size_t>(std::max(1, e.strategy.replicas)) /
                                  static_cast<size_t>(std::max(1, e.strategy.tensor_parallel))) {
      const size_t ranks = e.workload.layer_count() / static_cast<size_t>(chunks);
      const std::string layers = plural(static_cast<double>(e.workload.layer_count()), "layer", "layers");
      out.push_back(fmt::format(
          "the workload's {}{} allow{} {}, so {} of {} devices {} left idle ({}{}); set strategy.stages{} to "
          "choose",
          layers, chunks > 1 ? fmt::format(" in {} chunks per rank", chunks) : "",
          chunks == 1 && e.workload.layer_count() == 1 ? "s" : "",
          plural(static_cast<double>(ranks), chunks > 1 ? "rank" : "stage", chunks > 1 ? "ranks" : "stages"),
          idle_count, e.cluster.devices.size(), idle_count == 1 ? "is" : "are", idle,
          idle_count > 4 ? ", ..." : "", chunks > 1 ? " or chunks" : ""));
    }
  }
  if (std::string w = zero_without_group(e, run.partition); !w.empty()) out.push_back(std::move(w));
  if (std::string w = unlike_devices_warning(e, run); !w.empty()) out.push_back(std::move(w));
  if (std::string w = split_without_weight_part(e, run); !w.empty()) out.push_back(std::move(w));
  if (std::string w = slow_devices_warning(e, run); !w.empty()) out.push_back(std::move(w));
  if (std::string w = idle_fault_warning(e, run); !w.empty()) out.push_back(std::move(w));
  // Recompute modules beyond Megatron's default: the planners with a memory model of their own
  // estimate selective recomputation as core_attn alone while they search; the plan they choose is
  // replayed with the modules.
  if (e.memory.recompute == Recompute::Selective && e.memory.modules != RecomputeModules{} &&
      run.planner != kDefaultPlanner && run.planner != "piper")
    out.push_back(fmt::format(
        "planner {} searches with selective recomputation of core_attn alone (its own memory model); the "
        "plan it chose is replayed with recompute_modules {}",
        run.planner, to_string(e.memory.modules)));
  // One warning per replica count, naming its stages as ranges ("stages 0..255"): a wide plan
  // would otherwise print the same line for every stage.
  std::vector<std::pair<size_t, std::vector<int>>> split;  // replica count, its stages in order
  for (size_t s = 0; s < run.partition.stage_count(); ++s) {
    const size_t r = static_cast<size_t>(run.partition.stage(s).replicas());
    const double slice = run.micro_batch_size / static_cast<double>(r);
    if (r < 2 || slice == std::floor(slice) || run.partition.stage(s).round_robin) continue;
    auto it = std::find_if(split.begin(), split.end(), [r](const auto& g) { return g.first == r; });
    if (it == split.end()) it = split.insert(split.end(), {r, {}});
    it->second.push_back(static_cast<int>(s));
  }
  // Synchronous data parallelism on GPUs with one micro-batch per iteration all-reduces after every
  // micro-batch: the kind of run whose published scaling pipegrid overstates (experiments/validation
  // results.md, in-server pairs; docs/accuracy.md, twelfth step). Said once, for the stages it concerns.
  if (run.micro_batches == 1) {
    size_t gpu_stages = 0;
    for (size_t s = 0; s < run.partition.stage_count(); ++s) {
      const Stage& st = run.partition.stage(s);
      if (st.replicas() >= 2 && std::any_of(st.devices.begin(), st.devices.end(), [&](int d) {
            return e.cluster.devices[static_cast<size_t>(d)].spec.family == "gpu";
          }))
        ++gpu_stages;
    }
    if (gpu_stages > 0)
      out.push_back(fmt::format(
          "{} the gradients of every micro-batch between GPU replicas (1 micro-batch per iteration): "
          "published runs of this kind scale worse from 1 to 8 GPUs than pipegrid predicts, since per-step "
          "costs of synchronous training (input pipeline, stragglers, host synchronisation) are not modelled "
          "(experiments/validation/results.md, in-server pairs; docs/accuracy.md)",
          run.partition.stage_count() == 1 ? "the stage all-reduces"
          : gpu_stages == 1                ? "1 stage all-reduces"
                                           : fmt::format("{} stages all-reduce", gpu_stages)));
  }
  for (const auto& [r, stages] : split) {
    std::string names;
    for (size_t i = 0; i < stages.size();) {
      size_t j = i;  // stages[i..j] are consecutive
      while (j + 1 < stages.size() && stages[j + 1] == stages[j] + 1) ++j;
      if (!names.empty()) names += ", ";
      names += j == i       ? std::to_string(stages[i])
               : j == i + 1 ? fmt::format("{}, {}", stages[i], stages[j])
                            : fmt::format("{}..{}", stages[i], stages[j]);
      i = j + 1;
    }
    const double slice = run.micro_batch_size / static_cast<double>(r);
    out.push_back(fmt::format(
        "{} {} {} each micro-batch of {} between {} replicas: {} per replica (costs scale with the "
        "fraction); a micro-batch size divisible by {} avoids this",
        stages.size() == 1 ? "stage" : "stages", names, stages.size() == 1 ? "splits" : "split",
        plural(run.micro_batch_size, "sample", "samples"), r, plural(slice, "sample", "samples"), r));
  }
  return out;
}

namespace {

// The per-device table and the INFEASIBLE line naming every device over its capacity.
void print_every_device(std::ostream& out, const Metrics& m) {
  fmt::print(out, "{:<10} {:>10} {:>10} {:>8} {:>12} {:>12} {:>12}\n", "device", "busy", "idle", "bubble",
             "peak mem", "activations", "capacity");
  for (const DeviceMetrics& d : m.devices) {
    if (!d.used) {
      fmt::print(out, "{:<10} (unused)\n", d.name);
      continue;
    }
    fmt::print(out, "{:<10} {:>10} {:>10} {:>8} {:>12} {:>12} {:>12}{}\n", d.name, format_time(d.busy_s),
               format_time(d.idle_s), percent(d.bubble_ratio), format_bytes(d.peak_memory_bytes),
               format_bytes(d.peak_activation_bytes), format_bytes(d.capacity_bytes),
               d.peak_memory_bytes > d.capacity_bytes ? "  OVER CAPACITY" : "");
  }
  if (!m.feasible()) {
    fmt::print(out, "\nINFEASIBLE: ");
    for (size_t i = 0; i < m.over_capacity.size(); ++i) {
      const DeviceMetrics& d = m.devices[m.over_capacity[i]];
      fmt::print(out, "{}{} needs {} but has {}", i ? "; " : "", d.name, format_bytes(d.peak_memory_bytes),
                 format_bytes(d.capacity_bytes));
    }
    fmt::print(out, "\n");
  }
}

// One row per group of devices alike (output::group_devices): the devices as ranges, how many, the
// busy, idle and bubble of its busiest device and the memory of its fullest; then the busiest and the
// fullest devices of the run, and one INFEASIBLE line per group over capacity.
void print_device_groups(std::ostream& out, const Experiment& e, const std::vector<DeviceGroup>& groups,
                         const Metrics& m) {
  std::vector<std::string> names;
  size_t w = 7;
  for (const DeviceGroup& g : groups) {
    names.push_back(device_ranges(e.cluster, g.devices, 3));
    w = std::max(w, names.back().size());
  }
  fmt::print(out, "{:<{}} {:>6} {:>10} {:>10} {:>8} {:>12} {:>12} {:>12}  {}\n", "devices", w, "count",
             "busy", "idle", "bubble", "peak mem", "activations", "capacity", "role");
  for (size_t i = 0; i < groups.size(); ++i) {
    const DeviceGroup& g = groups[i];
    const DeviceMetrics& busy = m.devices[static_cast<size_t>(g.busiest)];
    const DeviceMetrics& full = m.devices[static_cast<size_t>(g.most_memory)];
    if (g.stages.empty()) {
      fmt::print(out, "{:<{}} {:>6}  (unused)\n", names[i], w, g.devices.size());
      continue;
    }
    fmt::print(out, "{:<{}} {:>6} {:>10} {:>10} {:>8} {:>12} {:>12} {:>12}  {}{}\n", names[i], w,
               g.devices.size(), format_time(busy.busy_s), format_time(busy.idle_s),
               percent(busy.bubble_ratio), format_bytes(full.peak_memory_bytes),
               format_bytes(full.peak_activation_bytes), format_bytes(full.capacity_bytes), group_role(g),
               full.peak_memory_bytes > full.capacity_bytes ? "  OVER CAPACITY" : "");
  }
  fmt::print(out,
             "(devices alike grouped: busy, idle, bubble of a group's busiest, memory of its fullest; "
             "--devices all lists each)\n");
  int busiest = -1, fullest = -1;
  for (const DeviceGroup& g : groups) {
    if (g.stages.empty()) continue;
    if (busiest < 0 || m.devices[g.busiest].busy_s > m.devices[busiest].busy_s) busiest = g.busiest;
    if (fullest < 0 || m.devices[g.most_memory].peak_memory_bytes > m.devices[fullest].peak_memory_bytes)
      fullest = g.most_memory;
  }
  if (busiest >= 0) {
    const DeviceMetrics& b = m.devices[busiest];
    const DeviceMetrics& f = m.devices[fullest];
    fmt::print(out, "busiest device   {}: busy {}, idle {}\n", b.name, format_time(b.busy_s),
               format_time(b.idle_s));
    fmt::print(out, "most memory      {}: {} of {}\n", f.name, format_bytes(f.peak_memory_bytes),
               format_bytes(f.capacity_bytes));
  }
  if (m.feasible()) return;
  fmt::print(out, "\nINFEASIBLE: {} over capacity:",
             plural(static_cast<double>(m.over_capacity.size()), "device", "devices"));
  std::string sep = " ";
  for (const DeviceGroup& g : groups) {
    std::vector<int> over;
    for (int d : g.devices)
      if (m.devices[d].peak_memory_bytes > m.devices[d].capacity_bytes) over.push_back(d);
    if (over.empty()) continue;
    const DeviceMetrics& f = m.devices[static_cast<size_t>(g.most_memory)];
    fmt::print(out, "{}{} ({}) need{} up to {} but {} {}", sep, device_ranges(e.cluster, over, 3),
               group_role(g), over.size() == 1 ? "s" : "", format_bytes(f.peak_memory_bytes),
               over.size() == 1 ? "has" : "have", format_bytes(f.capacity_bytes));
    sep = "; ";
  }
  fmt::print(out, "\n");
}

}  // namespace

namespace {

// The summary's parts, in the order of a small run; a large one (large_layout) puts the answer first.
void print_header(std::ostream& out, const RunReport& r, const Parallelism& par,
                  const Result<std::vector<std::vector<StageCost>>>& costs) {
  const Experiment& e = r.experiment;
  fmt::print(out, "{}\n", e.name.empty() ? "pipegrid run" : e.name);
  fmt::print(out, "  workload   {} ({}, {})\n", e.workload.name,
             plural(static_cast<double>(e.workload.layer_count()), "layer", "layers"),
             to_string(e.workload.precision));
  fmt::print(out, "  cluster    {} ({})\n", e.cluster.name.empty() ? "unnamed" : e.cluster.name,
             plural(static_cast<double>(e.cluster.devices.size()), "device", "devices"));
  fmt::print(out, "  strategy   {} + {}, {} of {}\n", strategy_label(e, r.run), r.run.schedule_name,
             plural(r.run.micro_batches, "micro-batch", "micro-batches"),
             plural(r.run.micro_batch_size, "sample", "samples"));
  fmt::print(out, "  batch      {}\n", batch_note(r.run));
  if (par.tensor > 1 || par.context > 1)
    fmt::print(out, "  parallel   t = {} (tensor{}{}), {}p = {} (pipeline stages{}), d = {} (data)\n",
               par.tensor, e.strategy.sequence_parallel ? ", sequence parallel" : "",
               e.strategy.tp_overlap ? ", overlapped" : "",
               par.context > 1 ? context_note(e, r.run.partition) + ", " : "", par.pipeline,
               par.chunks > 1 ? fmt::format(" of {} chunks", par.chunks) : "", par.data);
  if (costs)
    if (const std::string how = gradients_note(e, r.run.partition, *costs); !how.empty())
      fmt::print(out, "  gradients  {}\n", how);
  if (const std::string tied = tied_note(e, r.run.partition); !tied.empty())
    fmt::print(out, "  tied       {}\n", tied);
  fmt::print(out, "  assumes    {}\n", assumptions_note(e));
  if (const std::string picks = nccl_note(r.run.graph.nccl_picks); !picks.empty())
    fmt::print(out, "  nccl       {}\n", picks);
}

// The stage table; `collapse` merges consecutive stages alike (layer count, times, stash) into one
// row "1-30" (large runs), the devices as the union of their ranges.
void print_stage_table(std::ostream& out, const RunReport& r,
                       const Result<std::vector<std::vector<StageCost>>>& costs, bool collapse) {
  const Experiment& e = r.experiment;
  // A fault's slowest device of the stage: its times are the stage's as the replay runs them.
  const auto slowdown = [&](size_t s) {
    double x = 1;
    for (int d : r.run.partition.stage(s).devices)
      x = std::max(x, e.cluster.devices[static_cast<size_t>(d)].slowdown);
    return x;
  };
  std::vector<std::array<std::string, 6>> rows;
  for (size_t s = 0; s < r.run.partition.stage_count() && costs; ++s) {
    const Stage& st = r.run.partition.stage(s);
    const StageCost& sc = (*costs)[s].front();  // first replica: one micro-batch slice
    const double slow = slowdown(s);
    size_t last = s;
    std::vector<int> devices = st.devices;
    auto alike = [&](size_t t) {
      const StageCost& tc = (*costs)[t].front();
      return r.run.partition.stage(t).layers.size() == st.layers.size() && slowdown(t) == slow &&
             tc.times.forward == sc.times.forward && tc.times.backward() == sc.times.backward() &&
             tc.recompute_s == sc.recompute_s && tc.stash_bytes == sc.stash_bytes;
    };
    while (collapse && last + 1 < r.run.partition.stage_count() && alike(last + 1)) {
      ++last;
      const auto& more = r.run.partition.stage(last).devices;
      devices.insert(devices.end(), more.begin(), more.end());
    }
    std::sort(devices.begin(), devices.end());
    devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
    const bool merged = last > s;
    rows.push_back(
        {merged ? fmt::format("{}-{}", s, last) : std::to_string(s),
         merged ? fmt::format(
                      "{}..{} ({} each)", e.workload.layer(static_cast<size_t>(st.layers.front())).name,
                      e.workload.layer(static_cast<size_t>(r.run.partition.stage(last).layers.back())).name,
                      plural(static_cast<double>(st.layers.size()), "layer", "layers"))
                : layer_list(e.workload, st.layers),
         r.all_devices ? device_list(e, st) : device_ranges(e.cluster, devices, 3),
         // The backward as the replay runs it: with the forward it re-runs under recomputation.
         format_time(sc.times.forward * slow), format_time((sc.times.backward() + sc.recompute_s) * slow),
         format_bytes(sc.stash_bytes)});
    s = last;
  }
  size_t wl = 6, wd = 7;
  for (const auto& row : rows) {
    wl = std::max(wl, row[1].size());
    wd = std::max(wd, row[2].size());
  }
  fmt::print(out, "{:<6} {:<{}} {:<{}} {:>10} {:>10} {:>14}\n", "stage", "layers", wl, "devices", wd,
             "forward", r.experiment.memory.recompute == Recompute::None ? "backward" : "bwd+recomp",
             "stash/micro-b");
  for (const auto& row : rows)
    fmt::print(out, "{:<6} {:<{}} {:<{}} {:>10} {:>10} {:>14}\n", row[0], row[1], wl, row[2], wd, row[3],
               row[4], row[5]);
}

// `large`: a chain's edges go unsaid (the stage graph line says it is a chain).
void print_plan_lines(std::ostream& out, const RunReport& r, bool large) {
  const PlanNotes& plan = r.run.partition.plan;
  fmt::print(out, "stage graph      {}, depth {}{}\n",
             plural(static_cast<double>(r.run.partition.stage_count()), "stage", "stages"),
             r.run.partition.depth(), r.run.partition.is_chain() ? " (a chain)" : "");
  if (r.run.partition.stage_count() > 1 && !(large && r.run.partition.is_chain()))
    fmt::print(out, "stage edges      {}\n", stage_edges(r.run.partition));
  if (!plan.summary.empty()) fmt::print(out, "planner          {}\n", plan.summary);
  fmt::print(out, "planning time    {}\n", format_time(r.run.planning_seconds));
  if (!r.run.exploration.empty()) fmt::print(out, "                 {}\n", r.run.exploration);
}

// Each device group's peak memory in one line (large runs: the memory per stage among the answer).
void print_memory_line(std::ostream& out, const RunReport& r, const std::vector<DeviceGroup>& groups) {
  const Metrics& m = r.metrics;
  std::vector<std::string> peaks;
  size_t over = 0, used = 0;
  double capacity = 0;
  for (const DeviceGroup& g : groups) {
    if (g.stages.empty() || g.most_memory < 0) continue;
    const DeviceMetrics& d = m.devices[static_cast<size_t>(g.most_memory)];
    peaks.push_back(format_bytes(d.peak_memory_bytes));
    capacity = d.capacity_bytes;
    ++used;
    over += d.peak_memory_bytes > d.capacity_bytes;
  }
  std::vector<std::string> runs;  // equal neighbours once: "1.165 GiB x 15"
  for (size_t i = 0; i < peaks.size();) {
    size_t j = i;
    while (j < peaks.size() && peaks[j] == peaks[i]) ++j;
    runs.push_back(j - i > 1 ? fmt::format("{} x {}", peaks[i], j - i) : peaks[i]);
    i = j;
  }
  fmt::print(out, "peak memory      {} per device group (the device table's order), of {}{}\n",
             fmt::join(runs, ", "), format_bytes(capacity),
             over > 0 ? fmt::format(": {} of {} groups over capacity (INFEASIBLE)", over, used) : "");
}

void print_results(std::ostream& out, const RunReport& r, const Parallelism& par) {
  const Experiment& e = r.experiment;
  const Metrics& m = r.metrics;
  fmt::print(out, "iteration time   {}\n", format_time(m.iteration_time_s));
  // An iteration of no time (work costed at 0 s: the assumes line says why) has no rate; it printed 0.
  if (m.iteration_time_s > 0)
    fmt::print(out, "throughput       {:.6g} samples/s ({} per iteration)\n", m.throughput_samples_per_s,
               plural(m.samples_per_iteration, "sample", "samples"));
  else
    fmt::print(out, "throughput       none: the iteration takes no time ({} per iteration)\n",
               plural(m.samples_per_iteration, "sample", "samples"));
  fmt::print(out, "bubble ratio     {} (idle / (idle + busy), over the devices in use)\n",
             percent(m.bubble_ratio));
  if (const std::optional<TokenFigures> tf = token_figures(e, m, r.tokens))
    for (const std::string& line : token_lines(*tf)) fmt::print(out, "{}\n", line);
  if (!r.replay.empty()) fmt::print(out, "replay           {}\n", r.replay);
  if (par.tensor > 1 || expert_traffic(par) || par.context > 1) {
    const TimeBreakdown& b = m.breakdown;
    std::string ep = expert_traffic(par) ? fmt::format(", exposed {} {}", expert_comm_label(e, par),
                                                       format_time(b.expert_parallel_s))
                                         : "";
    if (par.context > 1)
      ep += fmt::format(", exposed CP communication {}", format_time(b.context_parallel_s));
    fmt::print(
        out,
        "time per device  compute {}, exposed TP {}{}, pipeline comm {}, data-parallel comm {}, bubble {}, "
        "optimizer {} (means over the devices in use)\n",
        format_time(b.compute_s), format_time(b.tensor_parallel_s), ep, format_time(b.pipeline_s),
        format_time(b.data_parallel_s), format_time(b.bubble_s), format_time(b.optimizer_s));
  }
}

void print_notes(std::ostream& out, const RunReport& r, const Parallelism& par,
                 const Result<std::vector<std::vector<StageCost>>>& costs) {
  const Experiment& e = r.experiment;
  if (reports_experts(e, par))
    fmt::print(out, "experts          {}\n",
               moe_note(e, r.run.partition, r.run.graph.node_aggregated_all_to_all));
  if (const std::optional<HostShare> h = host_share(costs))
    fmt::print(out,
               "host bound       {} of the stages' compute per micro-batch is the host's launches beyond the "
               "devices' own kernel time (cost model; the host figure is in `assumes`): that share of the "
               "answer rests on it\n",
               percent(h->fraction()));
  for (const CostModelCheck& c : cost_model_checks(e, r.run.partition))
    fmt::print(out, "cost model       {}\n", c.note);
}

}  // namespace

bool large_layout(const RunReport& r) {
  return (r.run.fold ? r.run.fold->whole_tasks : r.run.graph.tasks.size()) >= kFoldThresholdTasks;
}

void print_summary(std::ostream& out, const RunReport& r) {
  const Experiment& e = r.experiment;
  const Metrics& m = r.metrics;
  const Parallelism par = parallelism(r.run.partition);
  auto costs = stage_costs(e.workload, e.cluster, r.run.partition, r.run.micro_batch_size, e.memory.recompute,
                           tensor_parallel_options(e.strategy, e.memory));
  const std::vector<DeviceGroup> groups = group_devices(e.cluster, r.run.partition, m);
  const bool large = large_layout(r);
  print_header(out, r, par, costs);
  fmt::print(out, "\n");
  if (large) {  // the answer first: iteration time, throughput, MFU, breakdown, memory per group
    print_results(out, r, par);
    print_memory_line(out, r, groups);
    fmt::print(out, "\n");
  }
  print_stage_table(out, r, costs, large);
  fmt::print(out, "\n");
  print_plan_lines(out, r, large);
  fmt::print(out, "\n");
  if (!large) print_results(out, r, par);
  print_notes(out, r, par, costs);
  fmt::print(out, "\n");
  if (r.all_devices || !any_grouped(groups))
    print_every_device(out, m);
  else
    print_device_groups(out, e, groups, m);
}

nlohmann::json json_number(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::abs(x) <= 9007199254740992.0)  // 2^53
    return static_cast<long long>(x);
  return x;
}

nlohmann::json device_spec_json(const DeviceSpec& spec) {
  nlohmann::json peak, eff, mem, step, winograd = nlohmann::json::array();
  nlohmann::json runs_as = nlohmann::json::object();
  for (Precision p : kMathPrecisions) {
    // A rate the device lacks: fp8 none (fp8 trainings refuse the device), another the rate of the
    // precision it runs as, said in peak_runs_as (as `device show` prints "as fp32").
    const bool own = spec.peak_flops[static_cast<int>(p)] > 0;
    peak[std::string(to_string(p))] =
        own || p != Precision::FP8 ? json_number(spec.peak(p)) : nlohmann::json(nullptr);
    if (!own && p != Precision::FP8)
      runs_as[std::string(to_string(p))] = std::string(to_string(spec.runs_as(p)));
    step[std::string(to_string(p))] = spec.recurrent_step(p);
    if (spec.winograd[static_cast<int>(p)]) winograd.push_back(std::string(to_string(p)));
    for (KernelClass k : kComputeClasses)
      eff[std::string(to_string(p))][std::string(to_string(k))] = spec.compute_eff(p, k);
  }
  nlohmann::json startup, dispatch;
  for (KernelClass k : kKernelClasses) {
    mem[std::string(to_string(k))] = spec.memory_eff(k);
    startup[std::string(to_string(k))] = spec.startup(k);
    dispatch[std::string(to_string(k))] = spec.dispatch(k);
  }
  nlohmann::json j = {{"model", spec.kind},
                      {"family", spec.family},
                      {"memory_bytes", json_number(spec.memory_bytes)},
                      {"memory_bandwidth_Bps", json_number(spec.memory_bandwidth)},
                      {"peak_flops", peak},
                      {"peak_runs_as", runs_as},
                      {"efficiency", spec.efficiency},
                      {"compute_efficiency", eff},
                      {"memory_efficiency", mem},
                      {"kernel_startup_s", spec.kernel_startup_s},
                      {"kernel_startup_class_s", startup},
                      {"kernel_dispatch_s", spec.kernel_dispatch_s},
                      {"kernel_dispatch_class_s", dispatch},
                      {"layer_overhead_s", spec.layer_overhead_s},
                      {"recurrent_step_s", step},
                      {"winograd", winograd},
                      {"microscaling", spec.microscaling}};
  if (spec.fpga) {
    const FpgaSpec& f = *spec.fpga;
    nlohmann::json macs;
    for (Precision p : kMathPrecisions) macs[std::string(to_string(p))] = f.macs_per_dsp[static_cast<int>(p)];
    j["fpga"] = {{"dsps", json_number(f.dsps)},
                 {"clock_hz", json_number(f.clock_hz)},
                 {"macs_per_dsp", macs},
                 {"onchip_bytes", json_number(f.onchip_bytes)},
                 {"ports", f.ports},
                 {"port_bandwidth_Bps", json_number(f.port_bandwidth)}};
  }
  return j;
}

nlohmann::json hardware_json(const Cluster& c) {
  // Devices grouped by identical figures (compared through their JSON), in device order.
  std::vector<std::pair<nlohmann::json, nlohmann::json>> models;  // figures, {count, first, last}
  for (const Device& d : c.devices) {
    nlohmann::json figures = device_spec_json(d.spec);
    auto it = std::find_if(models.begin(), models.end(), [&](const auto& m) { return m.first == figures; });
    if (it == models.end()) {
      models.emplace_back(std::move(figures), nlohmann::json{{"count", 0}, {"first", d.name}});
      it = models.end() - 1;
    }
    it->second["count"] = it->second["count"].get<long long>() + 1;
    it->second["last"] = d.name;
  }
  nlohmann::json device_models = nlohmann::json::array();
  for (auto& [figures, where] : models) {
    nlohmann::json m = figures;
    m["count"] = where["count"];
    m["first_device"] = where["first"];
    m["last_device"] = where["last"];
    device_models.push_back(std::move(m));
  }
  std::vector<std::pair<std::tuple<double, double, int>, long long>> kinds;
  for (const Link& l : c.links) {
    const std::tuple<double, double, int> key{l.bandwidth, l.latency, l.duplex == Duplex::Full ? 0 : 1};
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == key; });
    if (it == kinds.end())
      kinds.emplace_back(key, 1);
    else
      ++it->second;
  }
  nlohmann::json links = nlohmann::json::array();
  for (const auto& [key, count] : kinds)
    links.push_back({{"bandwidth_Bps", json_number(std::get<0>(key))},
                     {"latency_s", std::get<1>(key)},
                     {"duplex", std::get<2>(key) == 0 ? "full" : "shared"},
                     {"count", count}});
  return {{"cluster", c.name},
          {"devices", c.devices.size()},
          {"switches", c.switches.size()},
          {"sharing", c.sharing == Sharing::Tcp ? "tcp" : "max-min"},
          {"device_models", device_models},
          {"links", links}};
}

std::string gradients_note(const Experiment& e, const Partition& p,
                           const std::vector<std::vector<StageCost>>& costs) {
  if (!e.strategy.dp_overlap && e.strategy.gradient_reduce_bytes <= 0) return "";
  const Stage& first = p.stage(0);
  std::string how = e.strategy.gradient_reduce_bytes > 0
                        ? fmt::format("reduced at {} bytes per parameter", e.strategy.gradient_reduce_bytes)
                        : "reduced at the workload's element size";
  if (e.strategy.dp_overlap && first.gradient_replicas() > 1 && !costs.empty()) {
    const StageCost& c = costs[0].front();
    const DpBuckets b = first_stage_buckets(c.parameters - c.expert_parameters, c.expert_parameters,
                                            first.gradient_replicas(), first.mirror >= 0);
    if (first.mirror >= 0)
      how += "; DualPipe: each stage's with its mirror's in one piece once both copies' last backwards ran";
    else if (b.expert > 1)
      how += fmt::format(
          "; stage 0's in {} during its last backward (--overlap-grad-reduce), its experts' in {} of their "
          "own over the expert data-parallel group",
          plural(b.dense, "bucket", "buckets"), plural(b.expert, "bucket", "buckets"));
    else
      how += fmt::format("; stage 0's in {} during its last backward (--overlap-grad-reduce)",
                         plural(b.dense, "bucket", "buckets"));
  }
  if (e.strategy.dp_overlap && e.memory.zero1)
    how += "; ZeRO-1: a reduce-scatter, the parameter all-gather taken as hidden behind the forward";
  if (e.strategy.dp_overlap && parallelism(p).data <= 1 && parallelism(p).context <= 1)
    how += "; no stage is replicated: nothing overlapped";
  return how;
}

namespace {

// Per copy of a tied weight: its stage, the tied layer's and the source's names, the source's stage
// and the parameters of a device that keeps it.
struct TiedRow {
  int stage, source_stage;
  std::string layer, source;
  double parameters;
};
std::vector<TiedRow> tied_rows(const Experiment& e, const Partition& p) {
  std::vector<TiedRow> out;
  for (const TiedCopy& c : tied_copies(e.workload, p)) {
    const Stage& st = p.stage(static_cast<size_t>(c.stage));
    const Layer& l = e.workload.layer(static_cast<size_t>(st.layers[static_cast<size_t>(c.index)]));
    const Result<double> n =
        tied_copy_parameters(e.workload, st, c.index, tensor_parallel_options(e.strategy, e.memory));
    out.push_back({c.stage, c.source_stage, l.name, e.workload.layer(static_cast<size_t>(l.tied_to)).name,
                   n ? *n : l.tied_parameters});
  }
  return out;
}

}  // namespace

std::string tied_note(const Experiment& e, const Partition& p) {
  std::vector<std::string> parts;
  for (const TiedRow& r : tied_rows(e, p))
    parts.push_back(
        fmt::format("stage {} keeps a copy of the weight {} takes from {} ({:.4g} M parameters per "
                    "device) and all-reduces its gradient with stage {}'s",
                    r.stage, r.layer, r.source, r.parameters / 1e6, r.source_stage));
  if (parts.empty()) return "";
  return fmt::format(
      "{} (Megatron-Core's shared-weight copy: the output layer's, or a multi-token-prediction "
      "module's embedding)",
      fmt::join(parts, "; "));
}

nlohmann::json tied_json(const Experiment& e, const Partition& p) {
  nlohmann::json out = nlohmann::json::array();
  for (const TiedRow& r : tied_rows(e, p))
    out.push_back({{"stage", r.stage},
                   {"layer", r.layer},
                   {"source_layer", r.source},
                   {"source_stage", r.source_stage},
                   {"parameters_per_device", json_number(r.parameters)}});
  return out;
}

namespace {

// A stage property with the same value on every stage, or 0 where the stages differ.
int same_on_every_stage(const Partition& p, int (*of)(const Stage&)) {
  int value = 0;
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const int v = of(p.stage(s));
    if (s > 0 && v != value) return 0;
    value = v;
  }
  return value;
}
int replicas_of(const Stage& st) {
  return st.replicas();
}
int tensor_of(const Stage& st) {
  return st.tensor_parallel;
}

// "d = 4", or "d = 1 to 4 by stage" where the stages differ.
std::string degree(const Partition& p, std::string_view name, int (*of)(const Stage&)) {
  if (const int v = same_on_every_stage(p, of); v > 0) return fmt::format("{} = {}", name, v);
  int lo = of(p.stage(0)), hi = lo;
  for (size_t s = 1; s < p.stage_count(); ++s) {
    lo = std::min(lo, of(p.stage(s)));
    hi = std::max(hi, of(p.stage(s)));
  }
  return fmt::format("{} = {} to {} by stage", name, lo, hi);
}

// Whether some replicated stage takes whole micro-batches in turn (Stage::round_robin).
bool round_robin(const Partition& p) {
  for (size_t s = 0; s < p.stage_count(); ++s)
    if (p.stage(s).round_robin && p.stage(s).replicas() > 1) return true;
  return false;
}

}  // namespace

std::string batch_note(const PreparedRun& run) {
  const Partition& p = run.partition;
  const double global = run.micro_batch_size * run.micro_batches;
  const std::string m = plural(run.micro_batches, "micro-batch", "micro-batches");
  const int cp = parallelism(p).context;
  const std::string degrees =
      fmt::format("{}{}, p = {}, {}", degree(p, "t", tensor_of), cp > 1 ? fmt::format(", cp = {}", cp) : "",
                  parallelism(p).pipeline, degree(p, "d", replicas_of));
  const int d = same_on_every_stage(p, replicas_of);
  if (round_robin(p))
    return fmt::format(
        "global batch {} = {} x {}, each taken whole by a stage's replicas in turn "
        "(round-robin); {}",
        global, m, plural(run.micro_batch_size, "sample", "samples"), degrees);
  if (d == 0)
    return fmt::format("global batch {} = {} x {}, split between each stage's replicas; {}", global, m,
                       plural(run.micro_batch_size, "sample", "samples"), degrees);
  return fmt::format("global batch {} = {} x {} x {} per replica; {}", global, m,
                     plural(d, "replica", "replicas"), plural(run.micro_batch_size / d, "sample", "samples"),
                     degrees);
}

nlohmann::json batch_json(const PreparedRun& run) {
  const Partition& p = run.partition;
  const int d = same_on_every_stage(p, replicas_of), t = same_on_every_stage(p, tensor_of);
  const auto or_null = [](int v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(); };
  const bool rr = round_robin(p);
  return {{"global_batch", json_number(run.micro_batch_size * run.micro_batches)},
          {"micro_batch_size_per_replica", rr      ? json_number(run.micro_batch_size)
                                           : d > 0 ? json_number(run.micro_batch_size / d)
                                                   : nlohmann::json()},
          {"replica_mode", rr ? "round-robin" : "split"},
          {"micro_batches", run.micro_batches},
          {"tensor_parallel", or_null(t)},
          {"pipeline_parallel", parallelism(p).pipeline},
          {"data_parallel", or_null(d)}};
}

std::string plan_shape(const Partition& p) {
  size_t most = 0;
  for (size_t s = 0; s < p.stage_count(); ++s) most = std::max(most, p.stage(s).devices.size());
  if (p.stage_count() == 1) {
    // One stage: the groups its devices form (t x cp x d), not "data-parallel" for all of them.
    const Stage& st = p.stage(0);
    std::vector<std::string> kinds;
    if (st.tensor_parallel > 1) kinds.emplace_back("tensor");
    if (st.context_parallel > 1) kinds.emplace_back("context");
    if (st.replicas() > 1) kinds.emplace_back("data");
    if (kinds.empty()) return most > 1 ? "data-parallel" : "one device";
    return fmt::format("{}-parallel", fmt::join(kinds, " x "));
  }
  const std::string kind = static_cast<size_t>(p.depth()) < p.stage_count() ? "stage DAG" : "pipeline";
  return most > 1 ? kind + " of replicated stages" : kind;
}

nlohmann::json plan_json(const Experiment& e, const PreparedRun& run) {
  const Partition& p = run.partition;
  nlohmann::json per_stage_devices = nlohmann::json::array(), replicas = nlohmann::json::array(),
                 samples = nlohmann::json::array(), tensor = nlohmann::json::array();
  std::vector<char> used(e.cluster.devices.size(), 0);
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    for (int d : st.devices) used[static_cast<size_t>(d)] = 1;
    per_stage_devices.push_back(st.devices.size());
    replicas.push_back(st.replicas());  // data-parallel replicas: groups of tensor_parallel devices
    tensor.push_back(st.tensor_parallel);
    samples.push_back(json_number(
        st.round_robin ? run.micro_batch_size : run.micro_batch_size / static_cast<double>(st.replicas())));
  }
  nlohmann::json tried = nlohmann::json::array();
  for (const TriedPlan& t : run.tried) {
    nlohmann::json x = {{"what", t.what},
                        {"micro_batch_size", json_number(t.micro_batch_size)},
                        {"micro_batches", t.micro_batches},
                        {"stages", t.stages},
                        {"fits", t.fits},
                        {"outcome", t.outcome}};
    x["analytic_iteration_time_s"] = t.analytic_s >= 0 ? nlohmann::json(t.analytic_s) : nlohmann::json();
    x["judged_iteration_time_s"] = t.judged_s >= 0 ? nlohmann::json(t.judged_s) : nlohmann::json();
    tried.push_back(std::move(x));
  }
  return {{"planner", run.planner},
          {"partitioner", run.partitioner},
          {"schedule", run.schedule_name},
          {"chunks", std::max(1, e.strategy.chunks)},
          {"shape", plan_shape(p)},
          {"stages", p.stage_count()},
          {"depth", p.depth()},
          {"devices_per_stage", per_stage_devices},
          {"replicas_per_stage", replicas},
          {"tensor_parallel_per_stage", tensor},
          {"devices_used", static_cast<size_t>(std::count(used.begin(), used.end(), 1))},
          {"devices_total", e.cluster.devices.size()},
          {"micro_batch_size", json_number(run.micro_batch_size)},
          {"micro_batches", run.micro_batches},
          {"samples_per_replica", samples},
          {"tried", tried}};
}

namespace {

// Each group of devices alike (output::group_devices): devices (ranges, every one), count, stages, the
// busiest device and its busy seconds, the fullest device and its peak.
nlohmann::json device_groups_json(const Experiment& e, const PreparedRun& run, const Metrics& m) {
  nlohmann::json out = nlohmann::json::array();
  for (const DeviceGroup& g : group_devices(e.cluster, run.partition, m)) {
    const DeviceMetrics& busy = m.devices[static_cast<size_t>(g.busiest)];
    const DeviceMetrics& full = m.devices[static_cast<size_t>(g.most_memory)];
    out.push_back({{"devices", device_ranges(e.cluster, g.devices)},
                   {"count", g.devices.size()},
                   {"stages", g.stages},
                   {"busiest_device", busy.name},
                   {"busy_s", busy.busy_s},
                   {"fullest_device", full.name},
                   {"peak_memory_bytes", json_number(full.peak_memory_bytes)},
                   {"capacity_bytes", json_number(full.capacity_bytes)}});
  }
  return out;
}

}  // namespace

namespace {

// Each stage: its layers, devices, replicas, t (and cp), successors and, where placed, backends.
nlohmann::json stages_json(const Experiment& e, const PreparedRun& run) {
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < run.partition.stage_count(); ++s) {
    const Stage& st = run.partition.stage(s);
    nlohmann::json layers = nlohmann::json::array(), devices = nlohmann::json::array();
    nlohmann::json backends = nlohmann::json::array();
    bool placed = false;
    for (int l : st.layers) {
      layers.push_back(e.workload.layer(l).name);
      backends.push_back(placed_backend(e.workload.layer(l)));
      placed = placed || !backends.back().get<std::string>().empty();
    }
    for (int d : st.devices) devices.push_back(e.cluster.devices[d].name);
    stages.push_back({{"index", s},
                      {"layers", layers},
                      {"devices", devices},
                      {"replicas", st.replicas()},
                      {"tensor_parallel", st.tensor_parallel},
                      {"successors", run.partition.successors(static_cast<int>(s))}});
    if (st.context_parallel > 1) stages.back()["context_parallel"] = st.context_parallel;
    // Backend placement (core/backends.h): each layer's backend, beside `layers`.
    if (placed) stages.back()["backends"] = backends;
  }
  return stages;
}

// t, p, v, d and the strategy's TP and DP options; the context- and expert-parallel groups where used.
nlohmann::json parallelism_json(const Experiment& e, const PreparedRun& run, const Parallelism& par) {
  nlohmann::json j = {{"tensor", par.tensor},
                      {"pipeline", par.pipeline},
                      {"chunks", par.chunks},
                      {"data", par.data},
                      {"sequence_parallel", e.strategy.sequence_parallel},
                      {"tp_overlap", e.strategy.tp_overlap},
                      {"tp_wgrad_overlap", e.strategy.tp_wgrad_overlap},
                      {"dp_overlap", e.strategy.dp_overlap},
                      {"dp_buckets", 1},
                      // the reduce's bytes per parameter: the option's, else the workload's gradients'
                      {"gradient_reduce_bytes", json_number(e.strategy.gradient_reduce_bytes > 0
                                                                ? e.strategy.gradient_reduce_bytes
                                                                : element_bytes(e.workload.precision))}};
  if (e.strategy.dp_overlap && run.partition.stage(0).gradient_replicas() > 1)
    if (auto costs = stage_costs(e.workload, e.cluster, run.partition, run.micro_batch_size,
                                 e.memory.recompute, tensor_parallel_options(e.strategy, e.memory))) {
      const StageCost& c = (*costs)[0].front();
      const DpBuckets b =
          first_stage_buckets(c.parameters - c.expert_parameters, c.expert_parameters,
                              run.partition.stage(0).gradient_replicas(), run.partition.stage(0).mirror >= 0);
      j["dp_buckets"] = b.dense;
      if (c.expert_parameters > 0) j["expert_dp_buckets"] = b.expert;
    }
  // At cp 1 too (its size, algorithm and balance null), so that a reader finds the key in every run.
  j["context"] = {
      {"context_parallel", par.context},
      {"algorithm", par.context > 1 ? nlohmann::json(std::string(to_string(e.strategy.context.algorithm)))
                                    : nlohmann::json()},
      {"load_balance", par.context > 1 ? nlohmann::json(e.strategy.context.load_balance) : nlohmann::json()}};
  if (reports_experts(e, par))
    j["experts"] = {
        {"expert_parallel", par.expert},
        {"expert_tensor_parallel", par.expert_tensor},
        {"dispatcher", std::string(to_string(e.strategy.moe.dispatcher))},
        {"capacity_factor", e.strategy.moe.capacity_factor},
        {"router_fusion", e.strategy.moe.router_fusion},
        {"permute_fusion", e.strategy.moe.permute_fusion},
        {"fused_grouped_mlp", e.strategy.moe.fused_grouped_mlp},
        {"eager_expert_work", e.strategy.moe.fused_grouped_mlp ? "" : eager_expert_work(e.workload)},
        {"overlap", e.strategy.moe_overlap},
        {"all_to_all_flows", run.graph.node_aggregated_all_to_all ? "node-aggregated" : "pairwise"},
        {"load_imbalance", load_imbalance(expert_loads(
                               e.strategy.moe, static_cast<int>(routed_experts(e.workload)), par.expert))}};
  return j;
}

// Every device's figures (the JSON keeps them all; `run` decides whether to print them).
nlohmann::json devices_json(const Experiment& e, const Metrics& m, const Parallelism& par) {
  nlohmann::json devices = nlohmann::json::array();
  for (size_t i = 0; i < m.devices.size(); ++i) {
    const DeviceMetrics& d = m.devices[i];
    devices.push_back(
        {{"name", d.name},
         {"model", i < e.cluster.devices.size() ? e.cluster.devices[i].spec.kind : ""},
         {"used", d.used},
         {"busy_s", d.busy_s},
         {"idle_s", d.idle_s},
         {"bubble_ratio", d.bubble_ratio},
         {"peak_memory_bytes", json_number(d.peak_memory_bytes)},
         {"peak_activation_bytes", json_number(d.peak_activation_bytes)},
         {"static_memory_bytes", json_number(d.static_bytes)},
         {"capacity_bytes", json_number(d.capacity_bytes)},
         {"memory_reserve_bytes",
          json_number(i < e.cluster.devices.size() ? e.cluster.devices[i].spec.memory_reserve_bytes : 0)},
         {"breakdown", breakdown_json(d.breakdown, expert_traffic(par), par.context > 1)}});
  }
  return devices;
}

}  // namespace

nlohmann::json common_json(std::string_view command, const Experiment& e, const PreparedRun& run,
                           const Metrics& m) {
  nlohmann::json j;
  j["schema_version"] = kJsonSchemaVersion;
  j["pipegrid_version"] = PIPEGRID_VERSION;
  j["command"] = command;
  j["experiment"] = e.name;
  j["hardware"] = hardware_json(e.cluster);
  j["planner"] = run.planner;
  j["partitioner"] = run.partitioner.empty() ? e.strategy.partitioner : run.partitioner;
  j["schedule"] = run.schedule_name;
  j["micro_batch_size"] = json_number(run.micro_batch_size);
  j["micro_batches"] = run.micro_batches;
  j["batch"] = batch_json(run);
  j["samples_per_iteration"] = json_number(m.samples_per_iteration);
  j["depth"] = run.partition.depth();
  j["cost_model_checks"] = cost_model_checks_json(cost_model_checks(e, run.partition));
  j["stages"] = stages_json(e, run);
  const Parallelism par = parallelism(run.partition);  // once: it walks every stage
  j["parallelism"] = parallelism_json(e, run, par);
  j["breakdown"] = breakdown_json(m.breakdown, expert_traffic(par), par.context > 1);
  j["iteration_time_s"] = m.iteration_time_s;
  j["throughput_samples_per_s"] =
      m.iteration_time_s > 0 ? nlohmann::json(m.throughput_samples_per_s) : nlohmann::json(nullptr);
  j["bubble_ratio"] = m.bubble_ratio;
  double peak = 0;
  for (const DeviceMetrics& d : m.devices) peak = std::max(peak, d.peak_memory_bytes);
  j["peak_memory_bytes"] = json_number(peak);
  j["feasible"] = m.feasible();
  nlohmann::json infeasible = nlohmann::json::array();
  for (int d : m.over_capacity)
    infeasible.push_back({{"device", m.devices[d].name},
                          {"peak_memory_bytes", json_number(m.devices[d].peak_memory_bytes)},
                          {"capacity_bytes", json_number(m.devices[d].capacity_bytes)}});
  j["infeasible"] = infeasible;
  const PlanNotes& plan = run.partition.plan;
  j["planner_summary"] = plan.summary;
  j["predicted_time_per_stage_s"] = plan.predicted_time_per_stage_s;
  j["predicted_stage_time_s"] = plan.predicted_stage_time_s;
  j["exploration"] = run.exploration;
  j["added_dependencies"] = plan.added_dependencies;
  j["planning_seconds"] = run.planning_seconds;
  j["devices"] = devices_json(e, m, par);
  j["device_groups"] = device_groups_json(e, run, m);
  j["plan"] = plan_json(e, run);
  j["assumptions"] = assumptions_json(e);
  j["tied_weights"] = tied_json(e, run.partition);
  j["warnings"] = plan_warnings(e, run);  // what run and plan print on standard error, for a JSON reader
  if (nlohmann::json picks = nccl_json(run.graph.nccl_picks); !picks.is_null()) j["nccl_allreduces"] = picks;
  j["model_flops"] = token_json(token_figures(e, m));
  return j;
}

nlohmann::json to_json(const RunReport& r) {
  nlohmann::json j = common_json("run", r.experiment, r.run, r.metrics);
  const Experiment& e = r.experiment;
  const std::optional<HostShare> h =
      host_share(stage_costs(e.workload, e.cluster, r.run.partition, r.run.micro_batch_size,
                             e.memory.recompute, tensor_parallel_options(e.strategy, e.memory)));
  if (h) j["host_bound_fraction"] = h->fraction();
  if (r.tokens > 0) j["model_flops"] = token_json(token_figures(r.experiment, r.metrics, r.tokens));
  if (!r.replay.empty()) j["replay"] = r.replay;
  // Large runs (large_layout) keep the groups and leave out the per-device list unless asked for it.
  if (large_layout(r) && !r.all_devices) {
    j["devices_left_out"] =
        fmt::format("{} devices, alike in {} groups (device_groups); --devices all lists each",
                    j["devices"].size(), j["device_groups"].size());
    j.erase("devices");
  }
  return j;
}

void write_chrome_trace(std::ostream& out, const RunReport& r) {
  const Cluster& c = r.experiment.cluster;
  const TaskGraph& g = r.run.graph;
  const Timeline& tl = r.timeline;
  constexpr int kComputeTid = 1;
  constexpr int kSendTid = 2;  // send lanes are kSendTid + lane
  bool first = true;
  auto emit = [&](const nlohmann::json& ev) {
    out << (first ? "\n" : ",\n") << ev.dump();
    first = false;
  };
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  // Outgoing transfers of a device may overlap: give each a lane where it does not.
  std::vector<std::vector<double>> lane_free(c.devices.size());
  std::vector<int> lane_of(g.tasks.size(), 0);
  std::vector<int32_t> transfers;
  for (size_t t = 0; t < g.tasks.size(); ++t)
    if (!g.tasks[t].is_compute() && g.tasks[t].device != g.tasks[t].peer)
      transfers.push_back(static_cast<int32_t>(t));
  std::sort(transfers.begin(), transfers.end(),
            [&](int32_t a, int32_t b) { return tl.start[a] < tl.start[b]; });
  for (int32_t t : transfers) {
    auto& lanes = lane_free[g.tasks[t].device];
    size_t lane = 0;
    while (lane < lanes.size() && lanes[lane] > tl.start[t]) ++lane;
    if (lane == lanes.size()) lanes.push_back(0);
    lanes[lane] = tl.end[t];
    lane_of[t] = static_cast<int>(lane);
  }
  for (size_t d = 0; d < c.devices.size(); ++d) {
    if (!r.view.keeps_device(static_cast<int>(d))) continue;  // --timeline-rows ranks: representatives only
    const int pid = static_cast<int>(d) + 1;
    emit({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", c.devices[d].name}}}});
    emit({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", d}}}});
    emit({{"ph", "M"},
          {"name", "thread_name"},
          {"pid", pid},
          {"tid", kComputeTid},
          {"args", {{"name", "compute"}}}});
    for (size_t lane = 0; lane < lane_free[d].size(); ++lane)
      emit({{"ph", "M"},
            {"name", "thread_name"},
            {"pid", pid},
            {"tid", kSendTid + static_cast<int>(lane)},
            {"args", {{"name", lane == 0 ? std::string("send") : fmt::format("send {}", lane)}}}});
  }
  // Backend placement: per stage, how many of its layers run on each backend ("cudnn 3, tvm 5").
  std::vector<std::string> stage_backends(r.run.partition.stage_count());
  for (size_t s = 0; s < stage_backends.size(); ++s) {
    std::map<std::string, int> count;
    for (int l : r.run.partition.stage(s).layers)
      if (std::string b = placed_backend(r.experiment.workload.layer(l)); !b.empty()) ++count[b];
    for (const auto& [b, n] : count)
      stage_backends[s] += fmt::format("{}{} {}", stage_backends[s].empty() ? "" : ", ", b, n);
  }
  for (size_t t = 0; t < g.tasks.size(); ++t) {
    const Task& task = g.tasks[t];
    const double dur = tl.end[t] - tl.start[t];
    if (task.is_compute() ? dur <= 0 : task.device == task.peer) continue;
    if (!r.view.keeps(task, r.run.micro_batches)) continue;
    nlohmann::json args = {{"stage", task.stage}};
    if (task.is_compute() && task.stage >= 0 && task.stage < static_cast<int>(stage_backends.size()) &&
        !stage_backends[task.stage].empty())
      args["backends"] = stage_backends[task.stage];
    if (task.micro_batch >= 0) args["micro_batch"] = task.micro_batch;
    if (!task.is_compute()) {
      args["bytes"] = task.bytes;
      args["to"] = c.devices[task.peer].name;
    }
    emit({{"ph", "X"},
          {"name", task_name(task)},
          {"cat", task_category(task)},
          {"pid", task.device + 1},
          {"tid", task.is_compute() ? kComputeTid : kSendTid + lane_of[t]},
          {"ts", tl.start[t] * 1e6},
          {"dur", dur * 1e6},
          {"args", args}});
  }
  // Flow arrows: from the transfer (on the sender's send lane) to the compute task it feeds.
  uint64_t flow = 0;
  for (int32_t t : transfers) {
    const Task& task = g.tasks[t];
    if (is_collective(task.transfer) || !r.view.keeps(task, r.run.micro_batches)) continue;
    for (int32_t consumer : g.successors(t)) {
      if (!g.tasks[consumer].is_compute() || !r.view.keeps(g.tasks[consumer], r.run.micro_batches)) continue;
      ++flow;
      emit({{"ph", "s"},
            {"id", flow},
            {"name", task_category(task)},
            {"cat", "flow"},
            {"pid", task.device + 1},
            {"tid", kSendTid + lane_of[t]},
            {"ts", tl.start[t] * 1e6}});
      emit({{"ph", "f"},
            {"bp", "e"},
            {"id", flow},
            {"name", task_category(task)},
            {"cat", "flow"},
            {"pid", g.tasks[consumer].device + 1},
            {"tid", kComputeTid},
            {"ts", tl.start[consumer] * 1e6}});
    }
  }
  const std::vector<MemoryTrace> traces = memory_traces(g, tl);
  for (size_t d = 0; d < traces.size(); ++d) {
    if (!r.view.keeps_device(static_cast<int>(d))) continue;
    for (const MemoryPoint& p : traces[d]) {
      nlohmann::json args;
      for (int k = 0; k < kMemoryCategoryCount; ++k)
        args[std::string(to_string(static_cast<MemoryCategory>(k)))] = p.bytes[k];
      emit({{"ph", "C"},
            {"name", "memory (bytes)"},
            {"pid", static_cast<int>(d) + 1},
            {"ts", p.time * 1e6},
            {"args", args}});
    }
  }
  out << "\n]}\n";
}

bool TimelineView::keeps(const Task& t, int micro_batches) const {
  if (!keeps_device(t.device)) return false;
  if (t.micro_batch < 0) return last_micro_batch < 0 || last_micro_batch >= micro_batches - 1;
  return (first_micro_batch < 0 || t.micro_batch >= first_micro_batch) &&
         (last_micro_batch < 0 || t.micro_batch <= last_micro_batch);
}

std::vector<char> rank_representatives(const Cluster& c, const Partition& p) {
  std::vector<char> keep(c.devices.size(), 0);
  for (size_t s = 0; s < p.stage_count(); ++s)
    if (!p.stage(s).devices.empty()) keep[static_cast<size_t>(p.stage(s).devices.front())] = 1;
  return keep;
}

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_tasks_csv(std::ostream& out, const RunReport& r) {
  const Cluster& c = r.experiment.cluster;
  const TaskGraph& g = r.run.graph;
  out << "device,stage,kind,micro_batch,start_s,end_s,peer,bytes\n";
  for (size_t t = 0; t < g.tasks.size(); ++t) {
    const Task& task = g.tasks[t];
    if (!r.view.keeps(task, r.run.micro_batches)) continue;
    const bool transfer = !task.is_compute();
    fmt::print(out, "{},{},{},{},{:.12g},{:.12g},{},{}\n", csv_field(c.devices[task.device].name), task.stage,
               task_category(task), task.micro_batch, r.timeline.start[t], r.timeline.end[t],
               transfer ? csv_field(c.devices[task.peer].name) : "",
               transfer ? fmt::format("{:.12g}", task.bytes) : "");
  }
}

void write_memory_csv(std::ostream& out, const RunReport& r) {
  const Cluster& c = r.experiment.cluster;
  const TaskGraph& g = r.run.graph;
  // The window's times: from the first kept task's start to the last one's end (all of them without one).
  double from = -std::numeric_limits<double>::infinity(), to = std::numeric_limits<double>::infinity();
  if (r.view.first_micro_batch >= 0 || r.view.last_micro_batch >= 0) {
    std::swap(from, to);
    for (size_t t = 0; t < g.tasks.size(); ++t)
      if (r.view.keeps(g.tasks[t], r.run.micro_batches)) {
        from = std::min(from, r.timeline.start[t]);
        to = std::max(to, r.timeline.end[t]);
      }
  }
  out << "device,time_s";
  for (int k = 0; k < kMemoryCategoryCount; ++k) out << ',' << to_string(static_cast<MemoryCategory>(k));
  out << ",total\n";
  const std::vector<MemoryTrace> traces = memory_traces(g, r.timeline);
  auto row = [&](size_t d, double time, const MemoryBytes& bytes) {
    fmt::print(out, "{},{:.12g}", csv_field(c.devices[d].name), time);
    for (double b : bytes) fmt::print(out, ",{:.12g}", b);
    fmt::print(out, ",{:.12g}\n", total(bytes));
  };
  for (size_t d = 0; d < traces.size(); ++d) {
    if (!r.view.keeps_device(static_cast<int>(d))) continue;
    for (size_t i = 0; i < traces[d].size(); ++i) {
      const MemoryPoint& p = traces[d][i];
      // The state at the window's start: the last point before it, moved to the start.
      if (p.time < from) {
        if (i + 1 == traces[d].size() || traces[d][i + 1].time > from) row(d, from, p.bytes);
        continue;
      }
      if (p.time > to) break;
      row(d, p.time, p.bytes);
    }
  }
}

}  // namespace pipegrid::output
