// The collectives module: every collective pipegrid simulates, one function per algorithm, each in
// two views of one definition:
//  (a) the flows it appends to a TaskGraph between given devices (point-to-point transfers, so that
//      they run on the simulated network with its routes and contention like any other transfer;
//      the reduction arithmetic itself takes no time), and
//  (b) its closed-form time on an uncontended network, in namespace closed_form.
// Tests hold (a) to (b) per algorithm on a ring of links, a switch and a two-node DGX
// (tests/sim/collectives_test.cc). Data-parallel gradients, the distributed optimizer, tensor-parallel
// groups and every planner's cost model use these functions; no other file writes a collective's
// flows or formula.
//
// Flow granularity (what one Task is), and where the flows are exact:
//  - step rings (ring all-reduce, reduce-scatter, all-gather; multi-ring and hierarchical, which are
//    built of them): one flow per device per step, each step's flow waiting for the previous step's
//    arrival. Exact for the algorithm as NCCL's ring runs it with one chunk in flight per step;
//    NCCL's pipelining of a step's chunk into slices is not modelled (it hides latency, not
//    bandwidth).
//  - merged rings (tensor-parallel collectives): one flow per device to the next device of the ring,
//    carrying what that device sends over all the ring's steps (ring_flow_bytes). On a ring of equal
//    links it takes the bandwidth time of the stepped ring exactly and one latency instead of one per
//    step; used where a collective sits inside every pass (thousands per iteration), to keep the
//    graph small.
//  - all-to-all: one flow per ordered pair with bytes to send, all at once (NCCL's grouped
//    send/receive, as Megatron-Core's all-to-all dispatcher issues it). Exact for that algorithm.
//  - broadcast: a pipelined chain from the root in `chunks` chunks (NCCL's ring broadcast); exact.
//  - send/receive: one flow.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid {

// What a collective computes.
enum class CollectiveKind : unsigned char {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  SendRecv
};
std::string_view to_string(CollectiveKind k);  // "all-reduce", "all-gather", ...

// How a data-parallel all-reduce runs (strategy `allreduce`).
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
  // NCCL's double binary tree (Sanders, Speck and Traeff 2009; NCCL 2.4 and later): two binary trees
  // over the machines (double_binary_trees), each reducing half the data up to its root and
  // broadcasting it down, pipelined in chunks; inside a machine a chain of its devices hangs below
  // the one that joins the tree. One pair of trees per NIC where the devices sit m >= 2 to a machine
  // (channel k's trees join at each machine's k-th device, its chain runs on from there), each pair
  // over S / m. append_double_tree. Only an all-reduce: a reduce-scatter runs MultiRing.
  Tree,
  // What NCCL picks for each all-reduce (core/nccl_tuning.h: NCCL 2.21.5's own model of its ring and
  // its tree, at their best protocol): Tree or MultiRing, per call and size. A reduce-scatter (the
  // distributed optimizer's) runs MultiRing, as NCCL has no tree for it. The default on clusters of
  // GPUs.
  Nccl,
};
std::string_view to_string(AllReduceAlgorithm a);
std::optional<AllReduceAlgorithm> parse_allreduce(
    std::string_view name);  // "ring", "hierarchical", "multi-ring", "tree", "nccl"

// The tasks after which something holds: a device's input is ready, or it holds the result.
using Deps = std::vector<int32_t>;

// How a collective's flows are labelled in the task graph (and so in the breakdown and the trace).
struct FlowTag {
  TransferKind kind = TransferKind::DataParallel;
  int32_t stage = -1;        // Task::stage and Task::peer_stage
  int32_t micro_batch = -1;  // -1: once per iteration
  uint16_t channel = 0;      // Task::channel (the trees number theirs from 1)
};

// ---- (a) Flows -------------------------------------------------------------------------------
// Common contract: `devices` are distinct device indices, in the algorithm's order (a ring's order);
// ready[j] lists the tasks after which devices[j] holds its input (empty, or -1 entries: from the
// start). The result has one entry per device: the tasks after which devices[j] holds its result
// (empty when it receives nothing, e.g. a group of one).

// Ring all-reduce, 2 (n - 1) steps of S / n.
std::vector<Deps> append_ring_allreduce(TaskGraph& g, const std::vector<int>& devices,
                                        const std::vector<Deps>& ready, double bytes, const FlowTag& tag);
// Ring reduce-scatter of S bytes (each device ends with its reduced S / n): n - 1 steps of S / n.
std::vector<Deps> append_ring_reduce_scatter(TaskGraph& g, const std::vector<int>& devices,
                                             const std::vector<Deps>& ready, double bytes,
                                             const FlowTag& tag);
// Ring all-gather of S bytes (each device starts with S / n): n - 1 steps of S / n.
std::vector<Deps> append_ring_allgather(TaskGraph& g, const std::vector<int>& devices,
                                        const std::vector<Deps>& ready, double bytes, const FlowTag& tag);
// AllReduceAlgorithm::MultiRing: multi_ring_orders' rings, each a ring all-reduce of S / m (or, with
// kind ReduceScatter, a ring reduce-scatter of S / m).
std::vector<Deps> append_multiring(TaskGraph& g, const Cluster& c, CollectiveKind kind,
                                   const std::vector<int>& devices, const std::vector<Deps>& ready,
                                   double bytes, const FlowTag& tag);
// AllReduceAlgorithm::Hierarchical. With kind ReduceScatter: the reduce to each machine's leader,
// a ring reduce-scatter of S among the leaders, then each leader sends each other device of its
// machine that device's S / n.
std::vector<Deps> append_hierarchical(TaskGraph& g, const Cluster& c, CollectiveKind kind,
                                      const std::vector<int>& devices, const std::vector<Deps>& ready,
                                      double bytes, const FlowTag& tag);
// A merged-ring collective (AllReduce, AllGather or ReduceScatter of S bytes, the whole tensor):
// device j sends one flow of ring_flow_bytes(kind, S, n) to device j + 1 once both of them are ready
// (ready[j] and ready[j + 1]); device j holds the result once its flows out and in are done:
// result[j] = {flow j, flow j - 1}.
std::vector<Deps> append_merged_ring(TaskGraph& g, CollectiveKind kind, const std::vector<int>& devices,
                                     const std::vector<Deps>& ready, double bytes, const FlowTag& tag);
// Only device q's two flows of append_merged_ring (into it from q - 1 and out of it to q + 1), built as
// append_merged_ring builds them: result[q] = {flow q, flow q - 1}, the others empty. The rank fold's ring
// (core/lower.h FoldLayout): the other flows, on links of their own alike these, end with them.
std::vector<Deps> append_merged_ring_at(TaskGraph& g, CollectiveKind kind, const std::vector<int>& devices,
                                        const std::vector<Deps>& ready, double bytes, const FlowTag& tag,
                                        size_t q);
// The merged-ring collective over several rings at once (NCCL's channels, one per NIC: the rings of
// multi_ring_orders, as indices into `devices`), each carrying bytes / rings; a device holds the
// result once its flows of every ring are done. One order: append_merged_ring.
std::vector<Deps> append_merged_rings(TaskGraph& g, CollectiveKind kind, const std::vector<int>& devices,
                                      const std::vector<std::vector<size_t>>& orders,
                                      const std::vector<Deps>& ready, double bytes, const FlowTag& tag);
// NCCL's double binary tree all-reduce of S bytes (AllReduceAlgorithm::Tree): per channel (one per
// NIC, as multi_ring_orders) and tree, S / (2 m) bytes in k = ceil(S / (2 m) / chunk_bytes) chunks
// (NCCL's Simple chunk, 512 KiB; at most kMaxTreeChunks, larger chunks beyond). Chunk c leaves a device
// for its parent once the device is ready, chunk c arrived from each child and its chunk c - 1 left;
// the root sends chunk c down once it arrived from every child, a device forwards it down once it
// arrived from the parent; each down-link sends its chunks in order. A device holds the result once
// the last chunk of every tree arrived from its parent (the root: from its children).
inline constexpr double kTreeChunkBytes = 512.0 * 1024;
inline constexpr int kMaxTreeChunks = 64;
std::vector<Deps> append_double_tree(TaskGraph& g, const Cluster& c, const std::vector<int>& devices,
                                     const std::vector<Deps>& ready, double bytes, const FlowTag& tag,
                                     double chunk_bytes = kTreeChunkBytes);
// Flows append_double_tree adds: 2 (trees) x channels x chunks x 2 (n - 1).
size_t double_tree_flows(const Cluster& c, const std::vector<int>& devices, double bytes,
                         double chunk_bytes = kTreeChunkBytes);
// The two trees over `nodes` machines, as each machine's parent (-1: the root). The first: machine 0
// is the root, with one child, the largest power of two below `nodes`; any other machine i, whose lowest
// set bit is 2^b, hangs below i - 2^b + 2^(b+1) (i with bit b cleared and bit b + 1 set), or below i
// - 2^b where that is past the end (the in-order binary tree of the blog's Figure 1). The second is
// the first mirrored (machine i in the place of nodes - 1 - i) for an even count, shifted by one
// (i + 1 mod nodes) for an odd one, so that no machine is an inner node of both for an even count
// and at most one for an odd count (at most one is a leaf of both).
std::array<std::vector<int>, 2> double_binary_trees(int nodes);

// Ring shift (one step of a point-to-point ring, as ring attention's K/V exchange): device j sends S
// bytes to device j + 1 once both of them are ready (an isend / irecv pair); device j holds its result
// once its flows out and in are done: result[j] = {flow j, flow j - 1}.
std::vector<Deps> append_ring_shift(TaskGraph& g, const std::vector<int>& devices,
                                    const std::vector<Deps>& ready, double bytes, const FlowTag& tag);
// All-to-all: devices[i] sends bytes[i][j] to devices[j] (i != j; zero sends nothing), every flow
// once both ends are ready; a device holds its result once all its flows out and in are done (in the
// order: out by destination, then in by source).
std::vector<Deps> append_all_to_all(TaskGraph& g, const std::vector<int>& devices,
                                    const std::vector<Deps>& ready,
                                    const std::vector<std::vector<double>>& bytes, const FlowTag& tag);
// DeepEP's de-duplicating dispatch (DeepSeek-V3, arXiv 2412.19437, section 3.2.2; github.com/
// deepseek-ai/DeepEP, its "normal" kernels): a token crosses to another node at most once, over the
// inter-node network to the device at its sender's position in that node, which forwards it over the
// node's own links to each device holding at least one of its experts, once per device; the two hops
// run at once (the report: IB and NVLink traffic "fully overlapped", the forwarding not blocked by
// later tokens). As an all-to-all's byte matrix over a group whose devices sit `per_node` to a node
// (node_position as node_layout gives it), `token_bytes` the tokens a device routes (one copy each):
//   same node, other device: token_bytes x hit_device x nodes (its own tokens and those it forwards
//   from the other nodes' devices at its position);
//   other node, same position: token_bytes x hit_node; other pairs: nothing;
// hit_device (hit_node): the probability that a token's experts include one of a device's (a node's);
// routed_hit_probability (core/moe.h) for balanced routing. The combine returns the same bytes.
std::vector<std::vector<double>> deduplicated_dispatch_bytes(
    const std::vector<std::pair<int, int>>& node_position, int per_node, double token_bytes,
    double hit_device, double hit_node);
// The node-aggregated form of a uniform all-to-all (every ordered pair `bytes`, as under balanced
// routing), for groups whose devices sit `per_node` to a node in every node they span:
// `node_position(i)` = {node index in the group, position in that node}. Each device sends two flows
// instead of n - 1: its (per_node - 1) x bytes for its own node's peers to the next device of its
// node, its (n - per_node) x bytes for the other nodes to the device at its position in the next node.
// Every device then sends and receives, on its intra-node and on its inter-node path, what it does in
// the pairwise exchange; where those paths' first and last links are the bottleneck (CM02's max-min
// sharing on a non-blocking fabric) it ends when the pairwise exchange does. What it changes is which
// switch-to-switch links carry the traffic: docs/moe.md and tests/sim/collective_algorithms_test.cc
// state and measure it. A device holds its result once its two flows out and two in are done.
std::vector<Deps> append_node_aggregated_all_to_all(TaskGraph& g, const std::vector<int>& devices,
                                                    const std::vector<std::pair<int, int>>& node_position,
                                                    int per_node, const std::vector<Deps>& ready,
                                                    double bytes, const FlowTag& tag);
// Flows each device of such a group sends: one per kind of peer it has (its node's, other nodes').
inline int node_aggregated_flows(int n, int per_node) {
  return (per_node > 1 ? 1 : 0) + (n > per_node ? 1 : 0);
}
// {node index, position in the node} of each device of a group, in the group's order, and the devices
// per node; nullopt unless every node the group spans holds equally many of its devices.
std::optional<std::pair<std::vector<std::pair<int, int>>, int>> node_layout(const Cluster& c,
                                                                            const std::vector<int>& devices);
// Broadcast of S bytes from devices[0] along the chain devices[0] -> devices[1] -> ..., in `chunks`
// chunks (pipelined: chunk k leaves device j once it arrived there and chunk k - 1 has left).
std::vector<Deps> append_chain_broadcast(TaskGraph& g, const std::vector<int>& devices,
                                         const std::vector<Deps>& ready, double bytes, int chunks,
                                         const FlowTag& tag);
// One transfer of S bytes from `from` to `to` after every task of `after`; returns its task.
int32_t append_send(TaskGraph& g, int from, int to, double bytes, const Deps& after, const FlowTag& tag);

// The data-parallel gradient collective by `algorithm`: an all-reduce (kind AllReduce), or the
// distributed optimizer's reduce-scatter (kind ReduceScatter), as TransferKind::DataParallel tasks of
// stage `stage` (stage = peer_stage, micro-batch -1). ready[j] is the task after which devices[j]
// holds its input, or -1 for "from the start". Tree and Nccl are resolved by resolve_allreduce (Nccl
// with a Router made for the call: callers that lower many resolve first, with their own).
std::vector<Deps> append_data_parallel(TaskGraph& g, CollectiveKind kind, AllReduceAlgorithm algorithm,
                                       const Cluster& c, const std::vector<int>& devices,
                                       const std::vector<int32_t>& ready, double bytes, int32_t stage = -1);
// The same with a set of tasks per device after which it holds its input (empty: from the start).
std::vector<Deps> append_data_parallel(TaskGraph& g, CollectiveKind kind, AllReduceAlgorithm algorithm,
                                       const Cluster& c, const std::vector<int>& devices,
                                       const std::vector<Deps>& ready_sets, double bytes, int32_t stage = -1);
// append_data_parallel's all-reduce.
std::vector<Deps> append_allreduce(TaskGraph& g, AllReduceAlgorithm algorithm, const Cluster& c,
                                   const std::vector<int>& devices, const std::vector<int32_t>& ready,
                                   double bytes, int32_t stage = -1);

// The algorithm `algorithm` runs for one collective of `kind` over `devices`: Nccl resolved by NCCL's
// model (core/nccl_tuning.h; the channels' bandwidth from `router`), Tree and Nccl for anything
// but an all-reduce MultiRing; otherwise `algorithm` itself.
AllReduceAlgorithm resolve_allreduce(AllReduceAlgorithm algorithm, CollectiveKind kind, const Cluster& c,
                                     const Router& router, const std::vector<int>& devices, double bytes);

// The rings AllReduceAlgorithm::MultiRing runs over `devices`, as indices into `devices`: m rings
// (each to carry bytes / m) when the devices sit m >= 2 to a machine on two or more machines, ring k
// visiting the machines in order of first appearance and each machine's devices from its k-th;
// otherwise one ring, `devices` in the order given.
std::vector<std::vector<size_t>> multi_ring_orders(const Cluster& c, const std::vector<int>& devices);

// The rings a group collective (tensor, context or expert tensor-parallel ring) runs over, as NCCL
// runs it on GPUs: multi_ring_orders' (one ring per NIC across machines); one ring, in the order
// given, where a device is not a GPU.
std::vector<std::vector<size_t>> group_ring_orders(const Cluster& c, const std::vector<int>& devices);

// Whether every device of the cluster is a GPU (the NCCL defaults apply).
bool all_gpus(const Cluster& c);

// Bytes one device sends in the merged-ring collective of `bytes` (the whole tensor) among t
// devices: 2 (t - 1) / t x bytes for an all-reduce, (t - 1) / t x bytes for an all-gather or a
// reduce-scatter. On a ring of equal links with no latency, one such flow per device takes exactly
// the time of the 2 (t - 1) (or t - 1) pipelined steps of the ring algorithm.
double ring_flow_bytes(CollectiveKind k, double bytes, int t);

// ---- (b) Closed forms ------------------------------------------------------------------------

// The cost of one hop of a collective on an uncontended network: a flow of S bytes takes
// latency + S / bandwidth. For a ring, the slowest of its hops stands for all (add each hop).
struct LinkCost {
  double latency = 0;
  double bandwidth = std::numeric_limits<double>::infinity();
  // Fixed cost of each collective call (a collective engine's, Cluster::engine); every closed form
  // below but send() adds it once.
  double call = 0;
  void add_hop(double hop_latency, double hop_bandwidth) {
    latency = std::max(latency, hop_latency);
    bandwidth = std::min(bandwidth, hop_bandwidth);
  }
};
// The slowest hop of the ring devices[0] -> devices[1] -> ... -> devices[0] (routes by `router`);
// a hop between two devices on the cluster's collective engine with its costs (latency + step,
// bandwidth at most the engine's), and the call where the ring has such a hop.
Result<LinkCost> ring_link_cost(const Router& router, const std::vector<int>& devices);
// One hop of such a ring, from -> to over `route`, added to `cost` (shared with the planners' cached
// routes, RouteCache::ring).
void add_ring_hop(LinkCost& cost, const Cluster& c, int from, int to, const Route& route);

// The collective engine's costs on the flows g.tasks[first ..] of one collective call over `devices`,
// on each flow between two devices on the engine (Cluster::on_engine; in a collective over GPUs and
// FPGAs, the FPGA-to-FPGA flows): it waits engine.step before it enters the network (Task::duration
// of a transfer), and each flow that waits on no other flow of the call (the host's invocation on
// every board at the start, in parallel: a ring's first step, a tree's leaves) also engine.call.
// Its bandwidth is applied where flows run (the replay's engine ports, sim/platform.h; the evaluator:
// Cluster::engine_rate). The collectives pipegrid lowers (data-parallel and group collectives) all
// pass through it.
void charge_engine(TaskGraph& g, size_t first, const Cluster& c, const std::vector<int>& devices);

namespace closed_form {
// Ring all-reduce: call + 2 (n - 1) a + 2 (n - 1)/n x S / B (0 for n < 2).
double ring_allreduce(int n, double bytes, const LinkCost& hop);
// Ring reduce-scatter or all-gather of S bytes: call + (n - 1) a + (n - 1)/n x S / B.
double ring_reduce_scatter(int n, double bytes, const LinkCost& hop);
double ring_allgather(int n, double bytes, const LinkCost& hop);
// Merged ring: call + a + ring_flow_bytes(kind, S, n) / B (0 for n < 2).
double merged_ring(CollectiveKind kind, int n, double bytes, const LinkCost& hop);
// Multi-ring over L machines of m devices (n = L m), the rings' hops inside a machine costing
// `intra` and across machines `inter`, each device's intra-machine port shared by the m - 1 rings
// that stay inside and its NIC by the one that leaves: 2 (n - 1) steps, each
// max(intra.a + (m - 1) c / intra.B, inter.a + c / inter.B) with c = S / (m n). L < 2 or m < 2:
// the ring over the slower of the two.
double multiring_allreduce(int machines, int per_machine, double bytes, const LinkCost& intra,
                           const LinkCost& inter);
// Hierarchical over L machines of m devices, `leader` the route between a device and its machine's
// leader and `inter` the leaders' ring hop: reduce and broadcast each leader.a + (m - 1) S / leader.B
// (the m - 1 flows share the leader's port), plus the leaders' ring all-reduce.
double hierarchical_allreduce(int machines, int per_machine, double bytes, const LinkCost& leader,
                              const LinkCost& inter);
// All-to-all of c bytes per ordered pair among n devices, each with one port (`port`: a device's
// route to any other, every route through the device's own link of bandwidth B): every device sends
// (n - 1) c and receives as much through its port: a + (n - 1) c / B.
double all_to_all(int n, double bytes_per_pair, const LinkCost& port);
// All-to-all of c bytes per ordered pair among L machines of m devices, each device with one port
// inside its machine (`intra`: its route to a device of its machine) and one out of it (`inter`: its
// route to a device of another machine, not through the intra port, as a DGX's NIC): the two ports
// carry (m - 1) c and (L - 1) m c at once: max(intra.a + (m - 1) c / intra.B, inter.a + (L - 1) m c /
// inter.B). One machine: all_to_all over intra.
double all_to_all(int machines, int per_machine, double bytes_per_pair, const LinkCost& intra,
                  const LinkCost& inter);
// The de-duplicating dispatch (deduplicated_dispatch_bytes) over L machines of m devices with one port
// inside and one out of each machine per device, as all_to_all above: max(intra.a + (m - 1) L T
// hit_device / intra.B, inter.a + (L - 1) T hit_node / inter.B), T the device's token bytes.
double deduplicated_all_to_all(int machines, int per_machine, double token_bytes, double hit_device,
                               double hit_node, const LinkCost& intra, const LinkCost& inter);
// Chain broadcast of S bytes in k chunks over n devices: (n - 2 + k) (a + S / (k B)).
double chain_broadcast(int n, double bytes, int chunks, const LinkCost& hop);
// Send/receive: a + S / B.
double send(double bytes, const LinkCost& hop);
// Ring shift of S bytes per device (n >= 2), every device's port full duplex: a + S / B (0 for n < 2).
double ring_shift(int n, double bytes, const LinkCost& hop);
}  // namespace closed_form

// The time of concurrent stepped rings (an all-reduce, AllReduceAlgorithm::Ring, or with `kind`
// ReduceScatter / AllGather, the ring of n - 1 steps), one of `bytes` per ring, all
// rings of the same size n >= 2 and ready at time 0, as the analytic evaluator (core/evaluate.h) runs
// their transfers, computed step by step without a task graph: in each of the 2 (n - 1) steps, device
// j sends a chunk of bytes / n to j + 1 once it has the previous step's chunk from j - 1 and its link
// has sent the previous step's bytes (FIFO); a flow takes its route's latency + the longest that one
// channel of its route is held in a step, where every flow of the step (over every ring) holds each
// channel of its route for chunk / its route's bandwidth (shared channels carry them in turn; for k
// flows of equal routes on a channel, k x chunk / B). For one ring of equal routes that share no channel:
// closed_form::ring_allreduce exactly; with shared channels it charges every flow the whole queue (the
// evaluator lets the first ones through earlier: an upper bound there). 0 for rings of one device.
// Where every ring's devices are on the collective engine, with its costs (charge_engine's).
// Fails when two devices of a ring are not connected.
Result<double> concurrent_ring_time(const Cluster& c, const Router& router,
                                    const std::vector<std::vector<int>>& rings, double bytes,
                                    CollectiveKind kind = CollectiveKind::AllReduce);

}  // namespace pipegrid
