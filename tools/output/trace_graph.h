// A lowered TaskGraph as an execution-trace graph (Chakra's node kinds), and back. This file is the
// one place that knows how TaskGraph tasks map to trace nodes: a new TaskKind or TransferKind (the
// tensor-parallel collectives, say) is one case in trace_graph.cc. tools/chakra.py turns the JSON
// below into Chakra's protobuf files (one per rank) and back; docs/import-export.md has the format.
//
// The JSON ("pipegrid-trace-graph", version 1): {"ranks": R, "samples_per_iteration": S,
// "nodes": [...]} with nodes in an order where every dependency comes earlier, each one of
//   {"id", "rank", "type": "comp", "name", "duration_s", "deps": [ids]}
//   {"id", "rank", "type": "send", "peer", "bytes", "tag", "deps"}     (rank sends to peer)
//   {"id", "rank", "type": "recv", "peer", "bytes", "tag", "deps"}     (rank receives from peer)
// (a send may carry "duration_s", a fixed time besides its bytes; a pair may carry "channel", the
// connection of a collective's flow: NCCL's trees, sim/replay.cc)
//   {"id", "rank", "type": "allreduce", "group": [ranks, ring order], "bytes", "deps"}
// Dependencies are between nodes of one rank; a send and a receive pair up by (sender, receiver,
// tag). A compute node's name is its task: "F s2 m3" (forward of stage 2, micro-batch 3), "B ...",
// "W ...", "step s2" (optimizer); other names import as forwards of stage 0.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/result.h"
#include "core/task_graph.h"

namespace pipegrid::output {

struct TraceExportOptions {
  // Ring all-reduces as one collective node per rank (what ASTRA-sim runs with its own algorithm);
  // false: every ring step as a send / receive pair (exactly what pipegrid replays).
  bool collectives = true;
  // Where to say which stages' gradient reductions are not one ring all-reduce (with collectives:
  // they are written as send / receive pairs); null: nowhere.
  std::vector<std::string>* notes = nullptr;
};

// Every compute node also depends on the rank's previous compute node (the device order).
Result<nlohmann::json> to_trace_graph(const TaskGraph& g, size_t devices, const TraceExportOptions& o = {});

// The TaskGraph of a trace graph on cluster c (ranks are c's devices by index): sends and receives
// become one transfer each (after the send's and the receive's dependencies), collectives
// core/collectives.h's ring all-reduce, compute nodes tasks in each rank's node order. Errors name
// the node.
Result<TaskGraph> from_trace_graph(const nlohmann::json& j, const Cluster& c);

}  // namespace pipegrid::output
