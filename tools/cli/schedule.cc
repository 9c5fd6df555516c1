// pipegrid schedule NAME --stages P --micro-batches M [--chunks V] [--file CSV] [--csv] [--moe-overlap]
// Prints the action grid of a registered schedule on P ranks (validated and checked for deadlock),
// or its torch-style CSV; with --moe-overlap, the order Megatron-Core runs under its MoE all-to-all
// overlap, the pairs in one cell.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "core/experiment.h"
#include "core/file_io.h"
#include "core/lower.h"
#include "core/models/chain.h"
#include "core/moe.h"
#include "core/strategy.h"
#include "core/topologies/generators.h"
#include "core/validate.h"
#include "tools/cli/cli.h"

namespace pipegrid::cli {
namespace {

struct ScheduleOptions {
  std::string name;
  int stages = 0;         // required
  int micro_batches = 0;  // required
  int chunks = 1;
  std::string file;
  bool csv = false;
  bool moe_overlap = false;  // Megatron-Core's --overlap-moe-expert-parallel-comm order
};

// The schedule Megatron-Core runs under its MoE all-to-all overlap (core/moe.h moe_overlap_refusal's
// rules, an expert-parallel all-to-all taken as there): interleaved-1f1b with one more warm-up forward
// and its steady state paired, or without a pipeline the combined order; validated and checked for
// deadlock as the plain one was.
Result<Schedule> moe_overlap_schedule(const ScheduleOptions& o, const ScheduleStrategy& s,
                                      const Experiment& e, const PreparedRun& run) {
  if (auto why = moe_overlap_refusal(2, MoeDispatcher::AllToAll, o.stages, o.name, o.micro_batches))
    return Error{"--moe-overlap: " + *why};
  Result<Schedule> paired = s.build({run.partition,
                                     e.cluster.devices.size(),
                                     o.micro_batches,
                                     o.chunks,
                                     {},
                                     {},
                                     /*a2a_overlap=*/true});
  if (!paired) return paired.error();
  pair_forward_backward(*paired);
  const std::vector<std::string> names = device_names(e.cluster);
  if (Status st = validate_schedule(*paired, run.partition, o.micro_batches, names); !st) return st.error();
  LoweringOptions lo;
  lo.micro_batches = o.micro_batches;
  Result<TaskGraph> g = lower(e.workload, e.cluster, run.partition, *paired, lo);
  if (!g) return g.error();
  if (Status st = check_deadlock_free(*g, *paired, names); !st) return st.error();
  return paired;
}

int run(const ScheduleOptions& o) {
  Result<const ScheduleStrategy*> s = find_schedule(o.name);
  if (!s) return bad_input(s.error().message);
  // The schedule table says what each takes (core/strategy.h), as the experiment parser reads it.
  std::vector<std::string_view> chunked;
  for (const ScheduleStrategy& x : schedule_strategies())
    if (x.takes_chunks) chunked.push_back(x.name);
  if (o.chunks > 1 && !(*s)->takes_chunks)
    return bad_input(fmt::format("--chunks {}: chunks need {} or {}, not {}", o.chunks,
                                 fmt::join(chunked.begin(), chunked.end() - 1, ", "), chunked.back(),
                                 o.name));
  if (o.chunks < 2 && (*s)->needs_chunks)
    return bad_input(
        fmt::format("{} needs --chunks, the model chunks per rank ({})", o.name,
                    o.name == "dualpipev" ? "2, in a V" : "at least 2; with 1 it is another schedule"));
  if (o.name == "dualpipev" && o.chunks != 2)
    return bad_input(fmt::format("--chunks {}: dualpipev runs 2 model chunks per rank, in a V", o.chunks));
  if (!o.file.empty() && !(*s)->reads_file)
    return bad_input(
        fmt::format("--file: {} does not read a schedule file (`pipegrid schedule file --file CSV` "
                    "does)",
                    o.name));
  // A chain of one layer per stage on P devices: only the order matters here.
  ChainSpec c;
  c.layers = o.stages * o.chunks;
  c.forward_s = 1e-3;
  c.backward_s = 2e-3;
  c.backward_weight_s = 1e-3;
  c.activation_bytes = 1;
  DeviceSpec d;
  d.memory_bytes = 1e15;
  Experiment e;
  e.workload = make_chain(c);
  e.cluster = make_switch_cluster(o.stages, "rank ", d, 1e15, 0);
  e.strategy.schedule = o.name;
  e.strategy.micro_batches = o.micro_batches;
  e.strategy.stages = o.stages;
  e.strategy.chunks = o.chunks;
  if ((*s)->reads_file) {
    if (o.file.empty()) return bad_input(fmt::format("schedule {} needs --file CSV", o.name));
    Result<std::string> text = read_input_file(o.file);
    if (!text) return bad_input(text.error().message);
    e.strategy.schedule_text = std::move(*text);
    e.strategy.schedule_source = o.file;
  }
  Result<PreparedRun> run = prepare(e);
  if (!run) return bad_input(run.error().message);
  Schedule shown = run->schedule;
  if (o.moe_overlap) {
    Result<Schedule> paired = moe_overlap_schedule(o, **s, e, *run);
    if (!paired) return bad_input(paired.error().message);
    shown = std::move(*paired);
  }
  if (o.csv)
    std::cout << to_csv(shown);
  else
    std::cout << to_grid(shown, device_names(e.cluster));
  return kOk;
}

}  // namespace

Command add_schedule_command(CLI::App& parent) {
  auto o = std::make_shared<ScheduleOptions>();
  CLI::App* app = parent.add_subcommand("schedule", "Print a schedule's action grid (or its CSV)");
  app->add_option("name", o->name, "Schedule name (see `pipegrid list`)")->required();
  app->add_option("--stages,-p", o->stages, "Pipeline ranks P")->required()->check(CLI::Range(1, 100000));
  app->add_option("--micro-batches,-m", o->micro_batches, "Micro-batches M")
      ->required()
      ->check(CLI::Range(1, 1000000));
  app->add_option("--chunks,-v", o->chunks, "Model chunks per rank (interleaved-1f1b)")
      ->check(CLI::Range(1, 1000));
  app->add_option("--file", o->file, "CSV schedule (for `file`)");
  app->add_flag("--csv", o->csv, "Print torch.distributed.pipelining's CSV (one row per rank) instead");
  app->add_flag("--moe-overlap", o->moe_overlap,
                "The order Megatron-Core runs under its MoE all-to-all overlap (interleaved-1f1b, or no "
                "pipeline): one more warm-up forward, the steady state's pairs in one cell");
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
