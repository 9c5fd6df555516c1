// Small experiments built in code for tests (no YAML).
#pragma once

#include <cmath>
#include <string>

#include "core/experiment.h"
#include "core/models/chain.h"
#include "core/topologies/generators.h"

namespace pipegrid::testing {

inline DeviceSpec test_device(double memory = 1e12) {
  DeviceSpec d;
  d.memory_bytes = memory;
  return d;
}

// p devices in a line: gpu0 -- gpu1 -- ... (one full-duplex link between neighbours), so that
// activations and gradients never share a link direction.
inline Cluster line_cluster(int p, double bandwidth, double latency) {
  Cluster c;
  c.name = "line";
  for (int i = 0; i < p; ++i) c.devices.push_back({"gpu" + std::to_string(i), test_device(), ""});
  for (int i = 0; i + 1 < p; ++i) c.links.push_back({i, i + 1, bandwidth, latency, Duplex::Full});
  return c;
}

// A chain of p layers (one per stage), T_F and T_BW per stage, activation bytes per boundary.
inline Experiment chain_experiment(int p, int m, double tf, double tbw, const std::string& schedule, Cluster cluster,
                                   double activation = 1 << 20) {
  ChainSpec c;
  c.layers = p;
  c.forward_s = tf;
  c.backward_s = tbw;
  c.activation_bytes = activation;
  c.parameter_bytes = 1 << 20;
  Experiment e;
  e.name = "test";
  e.workload = make_chain(c);
  e.cluster = std::move(cluster);
  e.strategy.partitioner = "uniform";
  e.strategy.schedule = schedule;
  e.strategy.micro_batches = m;
  return e;
}

inline bool close_rel(double a, double b, double rel) { return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b)); }

}  // namespace pipegrid::testing
