// The replica fold: one replay of a data-parallel replica's work stands for the d replicas that do
// the same work (docs/scale.md, "The replica fold").
//
// What is folded. Every stage has d >= 2 replicas; a device is replica j's at the same position of
// every stage it holds, and its image is replica 0's device at that position. Replica j's compute
// tasks take the times of its image's tasks at the same place in the device's order (same kind,
// stage, micro-batch and duration, or nothing is folded), and replica j's tensor-, expert- and
// context-parallel flows inside the replica take the times of replica 0's corresponding flows, when
// the links those flows cross carry nothing else (every link channel they use is used only by one
// replica's group flows) and replica j's links map one to one onto replica 0's with the same
// bandwidth, latency and duplex. Everything that shares links with other traffic stays in the replay:
// the pipeline transfers and the gradient collectives of every replica, and every flow between
// replicas (an expert-parallel group spanning replicas), each started when its representative's
// producer ends. So contention on shared links (a NIC carrying the pipeline's activations and the
// ring's gradients) is replayed as in the whole graph. Group flows whose channels the gradient
// collectives share too (an NVLink domain holding several replicas' groups) are copied only where the
// replay shows those collectives on them at other times (check_time_shared).
//
// Why it is exact. The replay's rules are local: a compute task starts once its predecessors ended
// and its device finished the task before; a flow starts once its predecessors ended and progresses
// at the max-min share of the flows on its links. The unfolded timeline satisfies the first rule
// for every task it copies (settle_unfolded measures it, to the last bit in practice); the replayed
// flows see every flow they share a link with; and a copied flow's links carry only its replica's
// group flows, which start when their representatives start (checked), on links isomorphic to theirs,
// so each ends when its representative does. The whole graph's replay is then the unfolded one.
// When settle_unfolded finds a task that would have started elsewhere (replicas that are not alike:
// routing skew, unequal routes), the fold is not exact and the caller replays the whole graph.
//
// The folded lowering (core/lower.h lower_folded) builds the fold without the whole graph and checks
// it with check_folded; it also folds tensor-parallel ranks onto rank 0 where their rings run on links
// of their own (FoldLayout::ranks_folded, fold_routes' ranks_private), and, where context- or
// expert-parallel flows share links, copies replica j's tensor-parallel flows alone
// (FoldLayout::tensor_only). docs/scale.md, "The folded lowering".
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/lower.h"
#include "core/partition.h"
#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid {

// Each device's data-parallel replica (-1: in no stage) and its image, replica 0's device at the same
// place of every stage it holds; an error where there is none (one replica, replicas of different
// sizes, a device at two places).
struct ReplicaMap {
  int replicas = 0;
  std::vector<int> replica, image;
};
Result<ReplicaMap> map_replicas(const Partition& p, size_t devices);

struct ReplicaFold {
  int replicas = 1;
  TaskGraph graph;                 // what is replayed: replica 0's tasks and every shared-link flow
  std::vector<int32_t> original;   // per task of `graph`: its task in the whole graph
  std::vector<int32_t> folded_of;  // per task of the whole graph: the task of `graph` it takes its times from
  size_t copied_compute = 0;       // whole-graph compute tasks not replayed
  size_t copied_flows = 0;         // group flows not replayed
  // Replicas whose group flows stay in the replay (their links are shared, or not alike replica 0's).
  int replicas_with_replayed_groups = 0;
  // Not empty when some replica receives its pipeline or cross-replica traffic over routes unlike
  // replica 0's: the fold is then unlikely to be exact, and the default rule does not try it
  // (settle_unfolded still decides under --fold). A stage's own gradient ring is not compared: rings
  // whose hops differ often fold exactly.
  std::string unlike_routes;

  bool replayed(int32_t whole_task) const { return original[folded_of[whole_task]] == whole_task; }
};

// The fold of `whole` (lowered from p on c), or why there is none: one replica, replicas of
// different sizes, a device in two replicas, or replicas whose device orders differ.
Result<ReplicaFold> fold_replicas(const Cluster& c, const Partition& p, const TaskGraph& whole);

// The whole graph's timeline from the folded graph's replay.
Timeline unfold(const ReplicaFold& f, const Timeline& folded);

// Settles the unfolded timeline against the replay's rules and says how far it is from them. A copied
// task nothing depends on (an optimizer step) is timed where the executor would start it: after its
// predecessors' last end (its replica's own gradient collective, replayed) and its device's previous
// task, with its representative's duration (`retimed` counts those that moved: replicas whose
// gradient collectives end at different times). For every other copied task, the deviation is the
// difference between its start and where the executor would start it; 0 when the replicas are alike.
struct FoldCheck {
  double max_deviation_s = 0;
  int32_t worst_task = -1;  // the whole graph's task with the largest deviation (-1: none)
  size_t retimed = 0;
};
FoldCheck settle_unfolded(const TaskGraph& whole, const ReplicaFold& f, Timeline& unfolded);

// The routes of a graph lowered folded (lower_folded): whether every replica's group flows run on
// link channels of their own alike replica 0's (then their copies are exact: lower_folded may fold
// them), and, as ReplicaFold::unlike_routes, whether every replica receives its other traffic over
// routes alike replica 0's. Replica j's group flows, when not built, are replica 0's moved to its
// devices.
// With ranks folded (FoldLayout::ranks_folded), ranks_private says whether every tensor-parallel
// ring's flows run on channels of their own, each pair of neighbours on its own, alike the others: then
// the ring's flows into and out of rank 0 stand for every rank's (docs/scale.md, "The rank fold").
struct FoldRoutes {
  bool groups_private = false;
  // Not private, but alike and each channel used by one replica's group flows besides the gradient
  // collectives (no pipeline transfer): copies are then exact where those use the channels at other
  // times than the group flows, which check_time_shared verifies after the replay.
  bool groups_time_shared = false;
  bool ranks_private = false;
  std::string unlike;
};
Result<FoldRoutes> fold_routes(const Cluster& c, const Partition& p, const FoldedGraph& f);

// How far the folded graph's replay is from the whole graph's, without the whole graph: each copied
// task would start at the latest end of its image's predecessors that replica j shares (replica 0's
// passes, folded group flows, the device's previous task) and of its crossings (replica j's own
// transfers into it); the deviation is the largest difference between that and its image's start.
// Where every copied task that receives a crossing starts with its image, every copy does (by
// induction over the rest, which replica j shares with replica 0).
FoldCheck check_folded(const TaskGraph& g, const FoldLayout& l, const Timeline& t);

// Where replica j's group flows were copied onto channels that other traffic uses too
// (FoldLayout::time_shared): the first replayed flow that uses such a channel while a group flow does
// (replica 0's, replayed, or a copy, timed as its representative), described; empty when none does.
// Then no flow shares a channel with a group flow at any instant, each group flow meets only its own
// replica's, alike replica 0's, and the copies are exact as where the channels are private.
std::string check_time_shared(const Cluster& c, const Partition& p, const TaskGraph& g, const FoldLayout& l,
                              const Timeline& t);

// Whether a check's deviation is within the fold's exactness bound, 1e-9 of the iteration
// (docs/scale.md): then the folded timeline is taken as the whole graph's.
inline bool fold_exact(const FoldCheck& check, double makespan) {
  return check.max_deviation_s <= 1e-9 * std::max(makespan, 1e-300);
}

// A plan is folded by default from this many tasks (docs/scale.md): below, the whole graph replays
// in a few seconds and its output stays as it was.
inline constexpr size_t kFoldThresholdTasks = size_t{1} << 20;

}  // namespace pipegrid
