// The workload: a DAG of layers (Boost.Graph) with per-layer costs.
//
// Costs are per sample (FLOPs, bytes moved, activation bytes) so that they scale with the
// micro-batch size; parameters are per model. A layer may instead (or also) carry measured times
// for one micro-batch on one device kind (trace-driven workloads, the synthetic chain); see cost.h
// for how a time is chosen.
#pragma once

#include <boost/graph/adjacency_list.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace pipegrid {

enum class Precision { FP32, FP16, BF16, INT8 };
inline constexpr int kPrecisionCount = 4;

double element_bytes(Precision p);
std::string_view to_string(Precision p);
std::optional<Precision> parse_precision(std::string_view s);  // "fp32", "fp16", "bf16", "int8"

// Times measured (or given) for one micro-batch of `batch` samples.
struct MeasuredCost {
  double forward_s = 0;
  double backward_s = 0;         // whole backward: input gradient + weight gradient
  double backward_weight_s = 0;  // the weight-gradient part of backward_s (0: not known / not split)
  double batch = 1;              // samples the times belong to
  std::string device_kind;       // device kind they were measured on; empty = valid on every device
};

struct Layer {
  std::string name;
  std::string kind;         // "linear", "conv2d", "chain", "input", or a profiled module's class
  std::string description;  // free text (a profiled module's description)
  // Per sample.
  double forward_flops = 0;
  double backward_input_flops = 0;
  double backward_weight_flops = 0;
  double forward_bytes = 0;   // memory traffic of the forward pass (memory-bound layers)
  double backward_bytes = 0;  // memory traffic of the whole backward pass
  double output_bytes = 0;    // activation output: what a consumer in another stage receives
  double stash_bytes = 0;     // kept from the forward until the backward (freed after it)
  // Selective recomputation (Korthikanti et al.): what the layer stashes instead (< 0: the same as
  // stash_bytes, i.e. nothing to recompute) and the fraction of its forward the backward re-runs.
  double selective_stash_bytes = -1;
  double selective_recompute_fraction = 0;
  // Per model.
  double parameters = 0;       // count
  double parameter_bytes = 0;  // bytes of the weights in the training precision
  // Memory traffic of each pass that does not grow with the batch: the weights read once per
  // micro-batch by the forward and the input-gradient pass, the weight gradient written once by
  // the weight-gradient pass (dense layers: parameter_bytes; gathers such as embeddings: 0, their
  // rows are in the per-sample bytes). It is what makes small micro-batches memory-bound.
  double weight_bytes = 0;
  std::optional<MeasuredCost> measured;
};

using LayerGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Layer>;

struct Workload {
  std::string name;
  LayerGraph graph;
  Precision precision = Precision::FP32;
  double micro_batch_size = 1;        // default samples per micro-batch
  double optimizer_step_s = 0;        // one optimizer step on any device; 0 = free
  double input_bytes_per_sample = 0;  // the model's input (what stage 0 receives)

  size_t layer_count() const { return boost::num_vertices(graph); }
  const Layer& layer(size_t i) const { return graph[i]; }
  int add_layer(Layer layer) { return static_cast<int>(boost::add_vertex(std::move(layer), graph)); }
  void add_edge(int from, int to) { boost::add_edge(from, to, graph); }
};

// Fails if the layer graph has a cycle; the message names one ("a -> b -> c -> a").
Status check_acyclic(const Workload& w);

// A topological order; ties are broken by layer index (so builders that add layers in
// topological order get them back unchanged). Precondition: acyclic.
std::vector<int> topological_order(const Workload& w);

// Totals over all layers (per sample / per model).
double total_parameters(const Workload& w);
double total_parameter_bytes(const Workload& w);
double total_forward_flops(const Workload& w);

}  // namespace pipegrid
