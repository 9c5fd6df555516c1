#include "core/models/chain.h"

namespace pipegrid {

Workload make_chain(const ChainSpec& spec) {
  Workload w;
  w.name = "chain";
  w.precision = spec.precision;
  w.micro_batch_size = spec.samples_per_micro_batch;
  w.optimizer_step_s = spec.optimizer_step_s;
  const double per_sample = spec.activation_bytes / spec.samples_per_micro_batch;
  w.input_bytes_per_sample = per_sample;
  for (int i = 0; i < spec.layers; ++i) {
    Layer l;
    l.name = "layer" + std::to_string(i);
    l.kind = "chain";
    l.output_bytes = per_sample;
    l.stash_bytes = per_sample;
    l.parameter_bytes = spec.parameter_bytes;
    l.parameters = spec.parameter_bytes / element_bytes(spec.precision);
    l.measured = MeasuredCost{spec.forward_s, spec.backward_s, spec.backward_weight_s, spec.samples_per_micro_batch, ""};
    int v = w.add_layer(std::move(l));
    if (i > 0) w.add_edge(v - 1, v);
  }
  return w;
}

}  // namespace pipegrid
