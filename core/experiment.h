// An experiment (workload + cluster + strategy) and the core pipeline that prepares it for replay:
// partition -> schedule -> validation -> lowering -> deadlock check. No SimGrid here.
#pragma once

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/collectives.h"
#include "core/memory.h"
#include "core/partition.h"
#include "core/result.h"
#include "core/schedule.h"
#include "core/strategy.h"
#include "core/task_graph.h"
#include "core/workload.h"

namespace pipegrid {

struct StrategySpec {
  std::string partitioner = "uniform";
  std::string schedule = "1f1b";
  bool schedule_given = false;  // set by the file; bapipe explores gpipe and 1f1b otherwise
  int micro_batches = 1;
  int stages = 0;  // pipeline ranks; 0: one per device, at most one per layer (per chunk)
  int chunks = 1;  // model chunks per rank (interleaved-1f1b): ranks x chunks stages
  // Data-parallel replicas per stage (uniform, balanced): stage i on devices i r .. i r + r - 1;
  // the default stage count becomes devices / r.
  int replicas = 1;
  AllReduceAlgorithm allreduce = AllReduceAlgorithm::Ring;  // gradients of replicated stages
  // Samples per iteration. When set, every micro-batch size that divides it is tried (m = mini_batch
  // / size) and the plan the analytic evaluator finds fastest (among those that fit memory, if any
  // does) is kept; `micro_batches` and the workload's micro-batch size are then ignored.
  int mini_batch = 0;
  PlannerOptions planner;       // straight, hierarchy, activation_compression_ratio, memory_constraint
  std::string schedule_text;    // `file` schedule: the CSV text
  std::string schedule_source;  // `file` schedule: its path, for messages
};

struct Experiment {
  std::string name;
  Workload workload;
  Cluster cluster;
  StrategySpec strategy;
  MemoryOptions memory;
  double micro_batch_size = 0;  // samples per micro-batch; 0: the workload's default
};

struct PreparedRun {
  Partition partition;
  Schedule schedule;
  TaskGraph graph;
  double micro_batch_size = 1;
  int micro_batches = 1;
  std::string schedule_name;  // the schedule that runs (bapipe chooses it)
  std::string sweep;  // what was explored (micro-batch sizes, bapipe's candidates) and the analytic times
  double planning_seconds = 0;  // wall time in the partitioner (summed over the sizes tried)
};

std::vector<std::string> device_names(const Cluster& c);

// Judges candidate plans during an exploration (bapipe; mini_batch sweeps) more precisely than the
// analytic evaluator, e.g. by replaying them in SimGrid (sim/judge.h). Returns the iteration time.
class PlanJudge {
 public:
  virtual ~PlanJudge() = default;
  virtual Result<double> iteration_time(const Cluster& c, const TaskGraph& g) const = 0;
  virtual std::string_view name() const = 0;
};

// Partitions, schedules, validates and lowers the experiment. When it explores (bapipe, or
// strategy.mini_batch), candidates are ranked by the analytic evaluator and, with a judge, the
// best few (and, for bapipe, the uniform baselines) are judged again; plans that fit memory win
// over plans that do not, then the fastest.
Result<PreparedRun> prepare(const Experiment& e, const PlanJudge* judge = nullptr);

}  // namespace pipegrid
