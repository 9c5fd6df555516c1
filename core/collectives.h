// Collectives as point-to-point transfers in a TaskGraph, so that they run on the simulated network
// with its contention like any other transfer. The reduction arithmetic itself takes no time.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/cluster.h"
#include "core/task_graph.h"

namespace pipegrid {

enum class AllReduceAlgorithm {
  // Ring all-reduce (reduce-scatter then all-gather): 2 (n - 1) steps; in each, device j sends a 1/n
  // chunk to device j + 1 (in the order given) once it has received the previous step's chunk
  // from j - 1. On a ring of links (bandwidth B, latency a): 2 (n - 1) a + 2 (n - 1)/n x S / B.
  Ring,
  // Hierarchical: devices are grouped by machine (Cluster::machine_of; the first device of a group is
  // its leader). Reduce inside each machine (every other device sends its S bytes to the leader,
  // all at once), ring all-reduce of S bytes among the leaders, then broadcast inside each machine
  // (the leader sends S bytes to every other device, all at once).
  Hierarchical,
  // NCCL-style rings over several network ports ("channels"): when the devices sit m to a machine
  // on two or more machines (every machine the same m >= 2), m rings run at once, each over S / m
  // bytes, ring k entering every machine at its k-th device and leaving it from its (k - 1)-th, so
  // that the machine-crossing hops of the m rings leave through m different devices' NICs (a DGX
  // node's 8 rails). Time, bandwidth-bound: 2 (n - 1) / n x S / (m B_nic) against the single ring's
  // 2 (n - 1) / n x S / B_nic. Otherwise (one machine, one device per machine, uneven machines):
  // the ring.
  MultiRing,
};

std::string_view to_string(AllReduceAlgorithm a);
std::optional<AllReduceAlgorithm> parse_allreduce(
    std::string_view name);  // "ring", "hierarchical", "multi-ring"

// Appends the transfers of an all-reduce of `bytes` among `devices` (distinct device indices) to g,
// as TransferKind::AllReduce tasks with stage = peer_stage = `stage` and micro-batch -1.
// ready[j] is the task after which devices[j] holds its input, or -1 for "from the start".
// Returns, for each j, the tasks after which devices[j] holds the result (empty when it receives
// nothing: a single device).
std::vector<std::vector<int32_t>> append_allreduce(TaskGraph& g, AllReduceAlgorithm algorithm,
                                                   const Cluster& c, const std::vector<int>& devices,
                                                   const std::vector<int32_t>& ready, double bytes,
                                                   int32_t stage = -1);

// The time of concurrent ring all-reduces (AllReduceAlgorithm::Ring), one of `bytes` per ring, all
// rings of the same size n >= 2 and ready at time 0, as the analytic evaluator (core/evaluate.h) runs
// their transfers, computed step by step without a task graph: in each of the 2 (n - 1) steps, device
// j sends a chunk of bytes / n to j + 1 once it has the previous step's chunk from j - 1 and its link
// has sent the previous step's bytes (FIFO); a flow takes its route's latency + the longest that one
// channel of its route is held in a step, where every flow of the step (over every ring) holds each
// channel of its route for chunk / its route's bandwidth (shared channels carry them in turn; for k
// flows of equal routes on a channel, k x chunk / B). For one ring of equal routes that share no channel:
// 2 (n - 1) (a + S / (n B)), the evaluator's time exactly; with shared channels it charges every flow
// the whole queue (the evaluator lets the first ones through earlier: an upper bound there). 0 for
// rings of one device. Fails when two devices of a ring are not connected.
Result<double> ring_allreduce_time(const Cluster& c, const Router& router,
                                   const std::vector<std::vector<int>>& rings, double bytes);

// The rings AllReduceAlgorithm::MultiRing runs over `devices`, as indices into `devices`: m rings
// (each to carry bytes / m) when the devices sit m >= 2 to a machine on two or more machines, ring k
// visiting the machines in order of first appearance and each machine's devices from its k-th;
// otherwise one ring, `devices` in the order given.
std::vector<std::vector<size_t>> multi_ring_orders(const Cluster& c, const std::vector<int>& devices);

}  // namespace pipegrid
