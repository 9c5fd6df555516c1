// The synthetic chain: `layers` identical layers in a line, with times given per micro-batch.
// It is the workload closed forms are checked with.
#pragma once

#include "core/workload.h"

namespace pipegrid {

struct ChainSpec {
  int layers = 1;
  double forward_s = 0;          // per layer, per micro-batch
  double backward_s = 0;         // per layer, per micro-batch (whole backward)
  double backward_weight_s = 0;  // the weight-gradient part of backward_s (0: not split)
  double activation_bytes = 0;   // per layer output, per micro-batch
  double parameter_bytes = 0;    // per layer
  double samples_per_micro_batch = 1;
  double optimizer_step_s = 0;
  Precision precision = Precision::FP32;
};

// Layers are named layer0, layer1, ...; times are valid on every device; each layer stashes its
// output until its backward; parameter count = parameter_bytes / element size of the precision.
Workload make_chain(const ChainSpec& spec);

}  // namespace pipegrid
