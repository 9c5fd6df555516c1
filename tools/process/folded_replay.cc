#include "tools/process/folded_replay.h"

#include <fmt/format.h>

#include "core/executor.h"
#include "core/fold.h"
#include "core/units.h"
#include "tools/process/isolated_replay.h"

namespace pipegrid::process {
namespace {

std::string millions(size_t n) {
  return n >= 100000 ? fmt::format("{:.1f} M", static_cast<double>(n) / 1e6) : fmt::format("{}", n);
}

Result<ChosenReplay> whole(const Cluster& c, const TaskGraph& g, const sim::ReplayOptions& o,
                           ReplayMode mode) {
  Result<sim::Replay> r = sim::replay(c, g, o);
  if (!r) return r.error();
  mode.folded = false;
  mode.whole_tasks = mode.replayed_tasks = g.tasks.size();
  return ChosenReplay{std::move(*r), std::move(mode)};
}

}  // namespace

std::string describe(const ReplayMode& m) {
  if (!m.folded) return fmt::format("whole graph ({} tasks): {}", millions(m.whole_tasks), m.whole_because);
  std::string groups;
  if (m.copied_flows == 0)
    groups = ", every replica's group flows replayed (their links are shared)";
  else if (m.tensor_only)
    groups = ", every replica's context- and expert-parallel flows replayed (their links are shared)";
  else if (m.time_shared)
    groups = ", the group flows copied on links the gradient collectives use only at other times (checked)";
  if (m.tensor_only && m.time_shared)
    groups +=
        ", the tensor-parallel ones copied on links the gradient collectives use only at other times "
        "(checked)";
  else if (m.replicas_with_replayed_groups > 0)
    groups = fmt::format(", the group flows of {} replicas replayed (links shared or unlike replica 0's)",
                         m.replicas_with_replayed_groups);
  const std::string ranks =
      m.ranks_folded > 1
          ? fmt::format(", each tensor-parallel group of {} as its rank 0 (rings on links of their own),",
                        m.ranks_folded)
          : "";
  return fmt::format(
      "folded: replica 0 of {}{} replayed with every replica's {}pipeline and gradient flows ({} of {} "
      "tasks){}; the others copied, checked exact (largest deviation {}{}; --whole replays every task)",
      m.replicas, ranks, m.ranks_folded > 1 ? "and rank's " : "", millions(m.replayed_tasks),
      millions(m.whole_tasks), groups, format_time(m.deviation_s),
      m.retimed > 0
          ? fmt::format("; the gradient collectives end at different times, {} optimizer steps timed from "
                        "their own",
                        m.retimed)
          : "");
}

Result<FoldMode> parse_fold_mode(const std::string& s) {
  if (s == "auto") return FoldMode::Auto;
  if (s == "fold") return FoldMode::Fold;
  if (s == "whole") return FoldMode::Whole;
  return Error{fmt::format("expected auto, fold or whole, got \"{}\"", s)};
}

Result<ChosenReplay> replay_chosen(const Cluster& c, const Partition& p, const TaskGraph& g,
                                   const sim::ReplayOptions& o, FoldMode mode) {
  ReplayMode m;
  if (mode == FoldMode::Whole) {
    m.whole_because = "--whole";
    return whole(c, g, o, m);
  }
  if (mode == FoldMode::Auto && g.tasks.size() < kFoldThresholdTasks) return whole(c, g, o, m);
  Result<ReplicaFold> f = fold_replicas(c, p, g);
  if (!f) {
    m.whole_because = "no replica fold (" + f.error().message + ")";
    return whole(c, g, o, m);
  }
  if (mode == FoldMode::Auto && !f->unlike_routes.empty()) {
    m.whole_because = "no replica fold: " + f->unlike_routes + " (--fold tries it anyway)";
    return whole(c, g, o, m);
  }
  Result<sim::Replay> r = replay_isolated(c, f->graph, o);
  if (!r) return r.error();
  Timeline t = unfold(*f, r->timeline);
  const FoldCheck check = settle_unfolded(g, *f, t);
  m.replicas = f->replicas;
  m.whole_tasks = g.tasks.size();
  m.replayed_tasks = f->graph.tasks.size();
  m.copied_flows = f->copied_flows;
  m.replicas_with_replayed_groups = f->replicas_with_replayed_groups;
  m.deviation_s = check.max_deviation_s;
  m.retimed = check.retimed;
  if (!fold_exact(check, t.makespan())) {
    m.whole_because = fmt::format("the replica fold was not exact ({} {} off: replicas not alike)",
                                  describe_task(g.tasks[check.worst_task], device_names(c)),
                                  format_time(check.max_deviation_s));
    return whole(c, g, o, m);
  }
  m.folded = true;
  sim::Replay out{std::move(t), r->wall_seconds};
  return ChosenReplay{std::move(out), std::move(m)};
}

GraphForm form_for(FoldMode mode, bool every_task) {
  if (every_task || mode == FoldMode::Whole) return GraphForm::Whole;
  return mode == FoldMode::Fold ? GraphForm::Folded : GraphForm::FoldedIfLarge;
}

Result<ChosenReplay> replay_prepared(const Experiment& e, PreparedRun& run, const sim::ReplayOptions& o,
                                     FoldMode mode) {
  if (!run.fold) {  // where prepare said why there is no fold, the whole graph without trying again
    if (run.whole_because.empty()) return replay_chosen(e.cluster, run.partition, run.graph, o, mode);
    ReplayMode m;
    m.whole_because = run.whole_because;
    return whole(e.cluster, run.graph, o, m);
  }
  Result<sim::Replay> r = replay_isolated(e.cluster, run.graph, o);
  if (!r) return r.error();
  const FoldCheck check = check_folded(run.graph, *run.fold, r->timeline);
  ReplayMode m;
  m.replicas = run.fold->replicas;
  m.ranks_folded = run.fold->ranks_folded;
  m.tensor_only = run.fold->tensor_only;
  m.time_shared = run.fold->time_shared;
  m.whole_tasks = run.fold->whole_tasks;
  m.replayed_tasks = run.graph.tasks.size();
  m.copied_flows = run.fold->copied_flows;
  m.deviation_s = check.max_deviation_s;
  if (!fold_exact(check, r->timeline.makespan())) {
    m.whole_because = fmt::format(
        "the replica fold ({} of {} tasks) was not exact (a copy of {} {} off: replicas not alike)",
        millions(run.graph.tasks.size()), millions(run.fold->whole_tasks),
        describe_task(run.graph.tasks[check.worst_task], device_names(e.cluster)),
        format_time(check.max_deviation_s));
    if (Status s = lower_whole(e, run); !s) return s.error();
    return whole(e.cluster, run.graph, o, m);
  }
  if (run.fold->time_shared) {
    if (const std::string clash =
            check_time_shared(e.cluster, run.partition, run.graph, *run.fold, r->timeline);
        !clash.empty()) {
      m.whole_because = fmt::format("the replica fold ({} of {} tasks) was not exact ({})",
                                    millions(run.graph.tasks.size()), millions(run.fold->whole_tasks), clash);
      if (Status s = lower_whole(e, run); !s) return s.error();
      return whole(e.cluster, run.graph, o, m);
    }
  }
  m.folded = true;
  return ChosenReplay{std::move(*r), std::move(m)};
}

}  // namespace pipegrid::process
