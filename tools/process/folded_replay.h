// The one rule that picks a whole-graph or a replica-folded replay (core/fold.h) for `run`, `plan`
// and `search` (docs/scale.md, "The replica fold").
#pragma once

#include <string>

#include "core/cluster.h"
#include "core/experiment.h"
#include "core/partition.h"
#include "core/result.h"
#include "core/task_graph.h"
#include "sim/replay.h"

namespace pipegrid::process {

enum class FoldMode {
  Auto,   // fold from kFoldThresholdTasks tasks when the plan folds; the whole graph below
  Fold,   // fold whenever the plan folds (--fold)
  Whole,  // never fold (--whole)
};

// What a replay was, for the outputs.
struct ReplayMode {
  bool folded = false;
  int replicas = 1;          // the plan's data-parallel replicas
  int ranks_folded = 1;      // the tensor-parallel ranks each group was replayed as one of (1: not folded)
  bool tensor_only = false;  // only the tensor-parallel flows of other replicas copied (FoldLayout)
  bool time_shared = false;  // copied group flows on links that other traffic uses at other times
  size_t whole_tasks = 0, replayed_tasks = 0;
  size_t copied_flows = 0;  // group flows of other replicas taken from replica 0's
  int replicas_with_replayed_groups = 0;
  double deviation_s = 0;  // settle_unfolded's largest deviation (folded replays)
  size_t retimed = 0;      // optimizer steps timed from their own replica's collective
  // Why the whole graph was replayed where a fold was asked for or the threshold reached; empty when
  // folded, or below the threshold in Auto mode (nothing to say).
  std::string whole_because;
  bool stated() const { return folded || !whole_because.empty(); }
};

// "folded: 1 of 8 replicas replayed (1.7 M of 7.2 M tasks), ..." or "whole graph: ...".
std::string describe(const ReplayMode& m);

struct ChosenReplay {
  sim::Replay replay;  // the whole graph's timeline, unfolded when folded
  ReplayMode mode;
};

// Replays g (lowered from p on c) whole or folded, by `mode`. A folded replay runs in a forked child
// and is checked (settle_unfolded: every copied task within 1e-9 of the iteration of where the
// executor would start it); when the check fails the whole graph is replayed in this process, and
// `whole_because` says why. The whole graph's replay runs in this process (call this once per
// process, like sim::replay).
Result<ChosenReplay> replay_chosen(const Cluster& c, const Partition& p, const TaskGraph& g,
                                   const sim::ReplayOptions& o, FoldMode mode);

// Replays run, prepared with GraphForm form_for(mode, ...): a folded graph (run.fold) in a forked child,
// checked by check_folded (1e-9 of the iteration); where that fails, the whole graph is lowered into
// run.graph and replayed in this process, `whole_because` saying why. A whole graph as replay_chosen.
Result<ChosenReplay> replay_prepared(const Experiment& e, PreparedRun& run, const sim::ReplayOptions& o,
                                     FoldMode mode);
// The graph prepare should lower for `mode`: folded (Auto: from the threshold) unless `every_task` (the
// outputs need every task's times: --trace, --tasks, --memory, --plot).
GraphForm form_for(FoldMode mode, bool every_task);

// Parses --fold / --whole style names: "auto", "fold", "whole".
Result<FoldMode> parse_fold_mode(const std::string& s);

}  // namespace pipegrid::process
