// Several jobs on one cluster (docs/jobs.md): each job's plan is lowered on the cluster seen from
// its own devices (job_cluster), and the jobs' task graphs are joined into one graph on the shared
// cluster's devices, a number of iterations each (join_jobs), so that one replay puts every job's
// flows on the one network. Each job keeps its own tasks, so its metrics are its own.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/cluster.h"
#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid {

// The shared cluster seen from a job: `devices` (indices of c.devices, distinct) become devices
// 0 .. k-1 in that order and the cluster's other devices become switches, so that the network's
// nodes, links and routes are the shared cluster's (a route that crosses another job's device, as on
// an FPGA ring, still does). Switches keep their node indices. Fails on a torus (its dimension-order
// routing numbers the torus's points as the first devices).
Result<Cluster> job_cluster(const Cluster& c, std::span<const int> devices);

// How a job given a device count gets its devices (the jobs file's `placement`):
//  - packed: the first free devices in index order (the generators number devices machine by
//    machine and pod by pod, so a job takes the fewest machines, switches and pods);
//  - spread: whole free machines at an even stride over the free machines, as far apart as the
//    cluster allows (a job spans every pod it can);
//  - random: whole free machines drawn by a seed.
enum class JobPlacement { Packed, Spread, Random };
std::string_view to_string(JobPlacement p);

// `count` devices of c that `taken` does not mark, by `placement`; fails when the free devices (or,
// for spread and random, the whole free machines) are too few, saying how many there are.
Result<std::vector<int>> place_job(const Cluster& c, const std::vector<bool>& taken, int count,
                                   JobPlacement placement, uint64_t seed);

// One job of a shared replay.
struct JobRun {
  const TaskGraph* graph = nullptr;  // one iteration, lowered on job_cluster(shared, devices)
  std::vector<int> devices;          // the shared cluster's device of each of the job's devices
  int iterations = 1;
  double start_s = 0;  // when the job's first iteration may start
};

// The jobs joined: job j's tasks are graph.tasks[begin[j] .. begin[j + 1]): an optional start task
// (a compute task of start_s seconds on the job's first device that every first task of iteration 0
// waits for), then each iteration's copy of the job's graph (iteration i at first[j][i]), with a
// zero-length barrier task between two iterations: it waits for every task of iteration i that
// nothing else waits for, and every task of iteration i + 1 that waits for nothing waits for it.
// Megatron's training step synchronises all ranks once per iteration (the gradient norm's
// all-reduce before the optimizer step, the loss's reduction); the barrier stands for it, at no cost.
struct JobsGraph {
  TaskGraph graph;
  std::vector<int32_t> begin;               // per job, and the end
  std::vector<std::vector<int32_t>> first;  // per job, per iteration: its first task
  std::vector<int32_t> size;                // per job: tasks of one iteration
  std::vector<double> start_s;              // per job
  int job_of(int32_t task) const;
};

// Fails on a job without devices, with a device outside the shared cluster's `device_count` or in
// two jobs, or whose graph uses more devices than it has.
Result<JobsGraph> join_jobs(size_t device_count, std::span<const JobRun> jobs);

// Each iteration's time of job j: iteration i runs from its start (start_s for the first, the end of
// iteration i - 1 after) to the end of its last task.
std::vector<double> iteration_times(const JobsGraph& g, const Timeline& t, int job);

// The timeline of job j's iteration i alone (indexed like the job's own graph), its times counted
// from the iteration's start.
Timeline iteration_timeline(const JobsGraph& g, const Timeline& t, int job, int iteration);

// A link direction that flows of two or more jobs crossed.
struct SharedLink {
  int link = -1;
  bool reverse = false;       // the direction b -> a (a shared-duplex link: both directions)
  std::vector<double> bytes;  // per job, over the whole replay
  double together_s = 0;      // time with flows of two or more jobs in flight on it
};
// Where the jobs met: the link directions that carried flows of two or more jobs, by bytes (largest
// first; at most `top` of them, 0: all), and per job the times its flows were on any of those links
// (merged intervals, in time order).
struct SharedTraffic {
  std::vector<SharedLink> links;
  std::vector<std::vector<std::pair<double, double>>> busy;
};
Result<SharedTraffic> shared_links(const Cluster& c, const JobsGraph& g, const Timeline& t, size_t top);

}  // namespace pipegrid
