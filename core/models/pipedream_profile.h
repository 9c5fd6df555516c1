// PipeDream's measured layer profiles (graph.txt; format in workloads/profiles/pipedream/SOURCE.md)
// as a workload: each node a layer with its measured forward and backward times for the profiled
// mini-batch on the profiled device kind, its output (activation) bytes and parameter bytes.
//
// Rules (documented in the README): times are valid on `device_kind` only (on other kinds the
// layer has no FLOP count, so a run there fails with a message), and scale linearly with the
// micro-batch size; activation sizes are stored per sample (divided by `batch`; a list `[a; b]`
// is summed); parameters count 4 bytes each (fp32); nodes whose description starts with "Input"
// carry data loading, not training: their times are dropped (PipeDream's planner does the same),
// their output bytes kept (the model's input).
#pragma once

#include <string>
#include <string_view>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

struct ProfileOptions {
  double batch = 128;                // samples the profile was measured with
  std::string device_kind = "v100";  // device kind it was measured on; empty = valid on every device
};

// Errors name "<name>:<line>: ...".
Result<Workload> parse_pipedream_profile(std::string_view text, std::string_view name,
                                         const ProfileOptions& o);

}  // namespace pipegrid
