// The figures a run is compared by outside pipegrid (tokens/s, model FLOP/s per device, MFU, time to
// train) and the one line of assumptions that change its answer: shared by run (text and JSON) and
// search.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/experiment.h"
#include "core/metrics.h"
#include "core/model_flops.h"

namespace pipegrid::output {

// Throughput in tokens and model FLOPs (core/model_flops.h) of a run on its devices in use.
struct TokenFigures {
  ModelFlops model;
  double devices = 0;       // in use
  double tokens_per_s = 0;  // samples/s x the blocks' sequence
  double tokens_per_s_per_device = 0;
  double model_flops_per_s_per_device = 0;     // flops_per_token x tokens/s / devices
  double peak_flops_per_device = 0;            // the mean over the devices in use, at the workload's math
  Precision peak_precision = Precision::BF16;  // the format that peak is in (fp8 trainings: bf16)
  double mfu = 0;                              // model FLOP/s over the devices' summed peak
  double dropped = 0;          // MoE: the share of routed token copies a capacity factor drops (still in N)
  double tokens = 0;           // a token budget (0: none)
  double time_to_train_s = 0;  // tokens / tokens_per_s (0: no budget)
};

// nullopt where the workload has no transformer blocks (no tokens) or the run has no throughput.
// `tokens` > 0: a token budget to time.
std::optional<TokenFigures> token_figures(const Experiment& e, const Metrics& m, double tokens = 0);

// The summary's lines: "tokens ...", "model FLOP/s ...", the formula, and "time to train" with a
// budget; each begins with its 17-character label.
std::vector<std::string> token_lines(const TokenFigures& f);

// run --json's "model_flops": null where token_figures is nullopt.
nlohmann::json token_json(const std::optional<TokenFigures>& f);

// MFU of 6 N tokens / (time x devices x peak), N every parameter, no attention: the count `search`
// ranks by, printed beside Megatron's.
double six_n_mfu(const ModelFlops& f, double tokens_per_s, double devices, double peak);

// The assumptions that change a run's answer, in words: attention implementation and kernel fusion
// (transformer workloads), the data-parallel all-reduce, the memory reserve, the gradients' bytes,
// the gradients' accumulation over micro-batches, the fp8 recipe (fp8 trainings).
std::string assumptions_note(const Experiment& e);
// How micro-batches' weight gradients accumulate (core/memory.h, GradAccumulation), in words.
std::string grad_accumulation_note(GradAccumulation g);
// The cluster's FPGA collective engine and its figures (Cluster::engine), or "" / null without one.
std::string engine_note(const Cluster& c);
nlohmann::json engine_json(const Cluster& c);
// What NCCL's model picked for the data-parallel all-reduces (TaskGraph::nccl_picks), or "" when the
// run's all-reduces are not `allreduce: nccl`.
std::string nccl_note(const std::array<int32_t, 3>& picks);
// The same as JSON ({tree, ring_per_nic, merged_rings}); null when nothing was picked.
nlohmann::json nccl_json(const std::array<int32_t, 3>& picks);
nlohmann::json assumptions_json(const Experiment& e);

}  // namespace pipegrid::output
