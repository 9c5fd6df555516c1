// PipeDream's planner (Narayanan et al., SOSP'19; optimizer/optimizer_graph_hierarchical.py in
// msr-fiddle/pipedream), re-implemented from its published behaviour to give the same answers.
//
// The layer DAG (without its "Input" sources, whose metadata PipeDream zeroes and removes, and
// without "__getitem__" sinks) becomes a DAG of antichain states reachable from the first source;
// state s stands for every layer that precedes or is in its (augmented) antichain, with their
// summed compute time, activation and parameter bytes, and the activations crossing the cut. A
// dynamic programme over (state range, machines) chooses the last stage's start state and replica
// count: a stage of compute T and parameters W replicated on r machines costs
// (T + 4 (r - 1) W / (B r)) / r, with B the level's bandwidth; with an activation compression ratio,
// the stage's input and output transfers 2 a / (B r ratio) bound it too; straight pipelines forbid
// replication; an optional memory constraint bounds each stage's stashed data. Levels of a
// hierarchy are solved one after another, each level's best times becoming the next level's
// compute. The result is "time per stage in pipeline": the bottleneck per mini-batch.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

struct PipeDreamLevel {
  int machines = 1;        // workers at this level (GPUs in a server, then servers, ...)
  double bandwidth = 1e9;  // bytes/s between them
};

struct PipeDreamOptions {
  std::vector<PipeDreamLevel> levels;                        // innermost first, as PipeDream's -n/-b lists
  bool straight = false;                                     // no replication
  std::optional<double> activation_compression_ratio = 1.0;  // none: no transfer terms
  bool memory_constraint = false;
  double memory_bytes = 16e9;  // per machine, with memory_constraint
  // Plan on the linearised graph: the states are the prefixes of one topological order (a subset
  // of PipeDream's antichain states), as GraphPipe's PipeDream baseline does. Also used, and
  // reported, when the antichain DAG has more than `max_states` states (Inception-v3 has 221,564;
  // NASNet more: PipeDream's own planner does not finish on them).
  bool linearize = false;
  // When > 0, a stage's replica count at each level must divide this micro-batch size (whole samples
  // per replica; pipegrid's replicas split each micro-batch). 0: PipeDream's own search, any count.
  double whole_samples_of = 0;
  size_t max_states = 5000;
  // The search stops with an error after this many inner steps (one machine count m tried for one
  // candidate last stage): the work depends on how much the candidates prune, so it is counted as
  // it goes rather than estimated. 2^35: about 80 s at the 2.3-2.5 ns per step measured (a
  // 48-layer chain on 1,024 and 2,048 machines: 5.1e8 and 2.1e9 steps, 1.2 and 5.1 s).
  double max_steps = 34359738368.0;
};

struct PipeDreamStage {
  std::vector<int> layers;              // workload layer indices (Input layers go to the first stage)
  std::vector<int> devices;             // machine ids (innermost level fastest), replicas of the stage
  int replicas = 1;                     // machines at the innermost level
  std::vector<int> replicas_per_level;  // the stage's replication at every level, innermost first
  double time = 0;                      // its time per mini-batch, as PipeDream reports it
};

struct PipeDreamPlan {
  double time_per_stage = 0;           // PipeDream's "Time per stage in pipeline" (s per mini-batch)
  double single_stage_time = 0;        // "Time taken by single-stage pipeline"
  double data_parallel_time = 0;       // its data-parallel estimate with every machine
  std::vector<PipeDreamStage> stages;  // in pipeline order
  size_t states = 0;                   // states planned over
  bool linearized = false;             // planned on the linearised graph
  std::string note;                    // why, when it was not asked for
};

// `time_s[l]` is layer l's forward + backward time (per mini-batch), `activation_bytes[l]` its
// output for the mini-batch; parameters come from the workload.
Result<PipeDreamPlan> plan_pipedream(const Workload& w, const std::vector<double>& time_s,
                                     const std::vector<double>& activation_bytes, const PipeDreamOptions& o);

}  // namespace pipegrid
