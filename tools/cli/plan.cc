// pipegrid plan EXPERIMENT.yaml [--json]: what the planner chose (stages, layers, devices, replicas,
// predicted stage times and memory), what it predicted, and what the event simulation measures.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/fold.h"
#include "core/lower.h"
#include "core/metrics.h"
#include "core/units.h"
#include "sim/replay.h"
#include "tools/cli/cli.h"
#include "tools/cli/progress.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/device_groups.h"
#include "tools/output/report.h"
#include "tools/output/run_figures.h"
#include "tools/process/folded_replay.h"
#include "tools/process/isolated_replay.h"

namespace pipegrid::cli {
namespace {

struct PlanOptions {
  std::string file;
  bool json = false;
  std::string devices = "groups";      // --devices: "groups" (ranges) or "all" (every name)
  std::string memory_margin;           // --memory-margin: memory.reserve
  bool fold = false, whole = false;    // --fold, --whole (docs/scale.md)
  std::vector<std::string> overrides;  // --set KEY=VALUE
};

// Per stage: index, layers, devices, replicas, the planner's time per micro-batch (its own stage time
// when it has one, else F + B of a micro-batch slice) and the predicted peak memory.
nlohmann::json stage_rows(const Experiment& e, const PreparedRun& run, const Metrics& predicted,
                          const std::vector<std::vector<StageCost>>& costs) {
  const Partition& p = run.partition;
  const PlanNotes& notes = p.plan;
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    nlohmann::json layers = nlohmann::json::array(), devices = nlohmann::json::array();
    for (int l : st.layers) layers.push_back(e.workload.layer(l).name);
    double peak = 0;
    for (int d : st.devices) {
      devices.push_back(e.cluster.devices[d].name);
      peak = std::max(peak, predicted.devices[d].peak_memory_bytes);
    }
    const double t = s < notes.predicted_stage_time_s.size()
                         ? notes.predicted_stage_time_s[s]
                         : costs[s].front().times.forward + costs[s].front().times.backward();
    stages.push_back({{"index", s},
                      {"layers", layers},
                      {"devices", devices},
                      {"replicas", st.replicas()},
                      {"tensor_parallel", st.tensor_parallel},
                      {"successors", p.successors(static_cast<int>(s))},
                      {"predicted_time_s", t},
                      {"predicted_peak_memory_bytes", peak}});
    if (st.context_parallel > 1) stages.back()["context_parallel"] = st.context_parallel;
  }
  return stages;
}

// The readable plan: its shape, what chose it, the batch, the stages, the predictions and the
// simulated time.
void print_plan(const PlanOptions& o, const Experiment& e, const PreparedRun& run,
                const nlohmann::json& stages, const std::vector<std::vector<StageCost>>& costs,
                const Metrics& predicted, const Metrics& simulated) {
  const Partition& p = run.partition;
  const PlanNotes& notes = p.plan;
  fmt::print("{}\n", e.name.empty() ? o.file : e.name);
  std::string per_stage;  // "2 2 2 2" devices per stage
  for (size_t s = 0; s < p.stage_count(); ++s)
    per_stage += fmt::format("{}{}", s ? " " : "", p.stage(s).devices.size());
  fmt::print("plan        {} ({}, depth {}; devices per stage {}), {} of {}\n", output::plan_shape(p),
             output::plural(static_cast<double>(p.stage_count()), "stage", "stages"), p.depth(), per_stage,
             output::plural(run.micro_batches, "micro-batch", "micro-batches"),
             output::plural(run.micro_batch_size, "sample", "samples"));
  fmt::print("chosen by   planner {}; stages by {}; schedule {}{}\n", run.planner,
             run.partitioner.empty() ? e.strategy.partitioner : run.partitioner, run.schedule_name,
             e.strategy.chunks > 1 ? fmt::format(", {} chunks per rank", e.strategy.chunks) : "");
  fmt::print("batch       {}\n", output::batch_note(run));
  if (const Parallelism par = parallelism(p); par.tensor > 1 || par.context > 1)
    fmt::print("parallel    t = {}{}, {}p = {}{}, d = {}\n", par.tensor,
               e.strategy.sequence_parallel ? " (sequence parallel)" : "",
               par.context > 1 ? output::context_note(e, p) + ", " : "", par.pipeline,
               par.chunks > 1 ? fmt::format(" ({} chunks each)", par.chunks) : "", par.data);
  if (const std::string how = output::gradients_note(e, p, costs); !how.empty())
    fmt::print("gradients   {}\n", how);
  if (const std::string tied = output::tied_note(e, p); !tied.empty()) fmt::print("tied        {}\n", tied);
  if (output::reports_experts(e, parallelism(p)))
    fmt::print("experts     {}\n", output::moe_note(e, p, run.graph.node_aggregated_all_to_all));
  fmt::print("assumes     {}\n", output::assumptions_note(e));
  if (const std::string picks = output::nccl_note(run.graph.nccl_picks); !picks.empty())
    fmt::print("nccl        {}\n", picks);
  if (p.stage_count() > 1) fmt::print("stage edges {}\n", output::stage_edges(p));
  if (const std::string idle = output::idle_devices_note(e.cluster, p); !idle.empty())
    fmt::print("unused      {}\n", idle);
  if (!notes.summary.empty()) fmt::print("planner     {}\n", notes.summary);
  if (!run.exploration.empty()) fmt::print("explored    {}\n", run.exploration);
  fmt::print("search      {}\n\n", format_time(run.planning_seconds));
  fmt::print("{:<6} {:<8} {:>12} {:>12}  {}\n", "stage", "replicas", "time/micro-b", "peak memory",
             "devices | layers");
  for (const auto& s : stages) {
    std::string devs;
    if (o.devices == "all") {
      for (const auto& d :
           s["devices"]) {  // not `a + b` into devs: GCC 12's -Wrestrict misfires (bug 105329)
        if (!devs.empty()) devs += ',';
        devs += d.get<std::string>();
      }
    } else {
      devs = output::device_ranges(e.cluster, p.stage(s["index"].get<size_t>()).devices, 3);
    }
    const std::string layers = output::layer_list(e.workload, p.stage(s["index"].get<size_t>()).layers);
    fmt::print("{:<6} {:<8} {:>12} {:>12}  {} | {}\n", s["index"].get<int>(), s["replicas"].get<int>(),
               format_time(s["predicted_time_s"].get<double>()),
               format_bytes(s["predicted_peak_memory_bytes"].get<double>()), devs, layers);
  }
  if (notes.predicted_time_per_stage_s > 0)
    fmt::print("\nplanner's predicted time per stage   {}\n", format_time(notes.predicted_time_per_stage_s));
  fmt::print("analytic iteration (FIFO links)     {}\n", format_time(predicted.iteration_time_s));
  fmt::print("simulated iteration (SimGrid)       {}  ({:+.1f}% vs analytic)\n",
             format_time(simulated.iteration_time_s),
             100 * (simulated.iteration_time_s / predicted.iteration_time_s - 1));
  fmt::print("simulated throughput                {:.6g} samples/s\n", simulated.throughput_samples_per_s);
  if (output::expert_traffic(parallelism(p)))
    fmt::print("{:<36}{} per device (mean over the devices in use)\n",
               "exposed " + output::expert_comm_label(e, parallelism(p)),
               format_time(simulated.breakdown.expert_parallel_s));
  if (parallelism(p).context > 1)
    fmt::print("exposed CP communication            {} per device (mean over the devices in use)\n",
               format_time(simulated.breakdown.context_parallel_s));
  for (const output::CostModelCheck& c : output::cost_model_checks(e, p))
    fmt::print("cost model                          {}\n", c.note);
  if (!simulated.feasible()) fmt::print("INFEASIBLE: the plan exceeds a device's memory\n");
}

// The analytic evaluator's metrics of run's graph. A folded graph's timeline is checked as its replay
// is (check_folded); where it is not exact the whole graph is lowered and evaluated instead.
Result<Metrics> analytic_metrics(const Experiment& e, PreparedRun& run) {
  Result<Timeline> analytic = evaluate(run.graph, e.cluster);
  if (!analytic) return analytic.error();
  if (run.fold) {
    if (!fold_exact(check_folded(run.graph, *run.fold, *analytic), analytic->makespan()) ||
        (run.fold->time_shared &&
         !check_time_shared(e.cluster, run.partition, run.graph, *run.fold, *analytic).empty())) {
      if (Status s = lower_whole(e, run); !s) return s.error();
      run.whole_because = "the replica fold was not exact in the analytic evaluator";
      analytic = evaluate(run.graph, e.cluster);
      if (!analytic) return analytic.error();
    }
  }
  return compute_metrics(e.cluster, run.graph, *analytic, run.fold ? &*run.fold : nullptr);
}

int run(const PlanOptions& o) {
  const std::vector<std::string> overrides = with_memory_margin(o.overrides, o.memory_margin);
  Result<Experiment> exp = input::load_experiment_file(o.file, overrides);
  if (!exp) return bad_input(margin_message(exp.error().message, o.memory_margin));
  const process::SimGridJudge judge;
  Progress progress(fmt::format(
      "planning with {}", exp->strategy.planner.empty() ? exp->strategy.partitioner : exp->strategy.planner));
  const process::FoldMode fold = o.whole  ? process::FoldMode::Whole
                                 : o.fold ? process::FoldMode::Fold
                                          : process::FoldMode::Auto;
  Result<PreparedRun> run = prepare(*exp, &judge, true, process::form_for(fold, false));
  progress.done();
  if (!run) return bad_input(fmt::format("{}: {}", o.file, run.error().message));
  for (const std::string& w : output::plan_warnings(*exp, *run))
    fmt::print(std::cerr, "pipegrid: warning: {}\n", w);
  Result<Metrics> analytic = analytic_metrics(*exp, *run);
  if (!analytic) return bad_input(fmt::format("{}: {}", o.file, analytic.error().message));
  const Metrics& predicted = *analytic;
  const bool analytic_folded = run->fold.has_value();
  Progress replaying("simulating the plan");
  Result<process::ChosenReplay> replay = process::replay_prepared(*exp, *run, {}, fold);
  replaying.done();
  if (!replay) return bad_input(fmt::format("{}: {}", o.file, replay.error().message));
  const Metrics simulated =
      compute_metrics(exp->cluster, run->graph, replay->replay.timeline, run->fold ? &*run->fold : nullptr);
  std::string replay_note = replay->mode.stated() ? process::describe(replay->mode) : "";
  if (analytic_folded)
    replay_note +=
        "; the analytic estimate from the folded graph too (its FIFO links may take the replicas' flows in "
        "another order than the whole graph's; docs/scale.md measures the difference)";
  auto costs = stage_costs(exp->workload, exp->cluster, run->partition, run->micro_batch_size,
                           exp->memory.recompute, tensor_parallel_options(exp->strategy, exp->memory));
  if (!costs) return bad_input(costs.error().message);

  const nlohmann::json stages = stage_rows(*exp, *run, predicted, *costs);
  // The shared vocabulary (output::common_json) on the simulated run, plus the planner's predictions.
  nlohmann::json j = output::common_json("plan", *exp, *run, simulated);
  for (size_t s = 0; s < stages.size(); ++s) {
    j["stages"][s]["predicted_time_s"] = stages[s]["predicted_time_s"];
    j["stages"][s]["predicted_peak_memory_bytes"] =
        output::json_number(stages[s]["predicted_peak_memory_bytes"].get<double>());
  }
  j["analytic_iteration_time_s"] = predicted.iteration_time_s;
  if (!replay_note.empty()) j["replay"] = replay_note;
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return kOk;
  }
  print_plan(o, *exp, *run, stages, *costs, predicted, simulated);
  if (!replay_note.empty()) fmt::print("replay                              {}\n", replay_note);
  return kOk;
}

}  // namespace

Command add_plan_command(CLI::App& parent) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* app =
      parent.add_subcommand("plan", "Plan an experiment: chosen stages, predicted and simulated times");
  app->add_option("experiment", o->file, "Experiment file (YAML)")->required()->check(kNonEmpty);
  app->add_flag("--json", o->json, "Print one JSON object");
  add_devices_option(*app, o->devices);
  add_memory_margin_option(*app, o->memory_margin);
  add_fold_options(*app, o->fold, o->whole);
  add_set_option(*app, o->overrides);
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
