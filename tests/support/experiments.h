// Small experiments built in code for tests (no YAML).
#pragma once

#include <cmath>
#include <string>

#include "core/experiment.h"
#include "core/models/builder.h"
#include "core/models/chain.h"
#include "core/models/zoo.h"
#include "core/task_graph.h"
#include "core/topologies/generators.h"

namespace pipegrid::testing {

// An activation transfer of `bytes` from device `from` to device `to`, with no dependencies.
inline Task transfer(int from, int to, double bytes) {
  Task t;
  t.kind = TaskKind::Transfer;
  t.transfer = TransferKind::Activation;
  t.device = from;
  t.peer = to;
  t.bytes = bytes;
  return t;
}

inline DeviceSpec test_device(double memory = 1e12) {
  DeviceSpec d;
  d.memory_bytes = memory;
  return d;
}

// p devices in a line: gpu0 -- gpu1 -- ... (one full-duplex link between neighbours), so that
// activations and gradients never share a link direction.
// A U280-like FPGA (Alveo U280 on its HBM2: 9,024 DSPs at 300 MHz, 460 GB/s), with `dsps` DSPs.
inline DeviceSpec u280_like(double dsps = 9024) {
  DeviceSpec d;
  d.kind = "u280";
  d.memory_bytes = 8e9;
  d.memory_bandwidth = 460e9;
  d.efficiency = 0.7;
  d.layer_overhead_s = 2e-6;
  FpgaSpec f;
  f.dsps = dsps;
  f.clock_hz = 300e6;
  f.macs_per_dsp = {0.2, 0, 1, 1, 2};  // fp32, tf32 (none), fp16, bf16, int8
  f.port_bandwidth = 12.5e9;
  f.ports = 2;
  d.fpga = f;
  d.derive_peaks();
  return d;
}

// ResNet-50 in fp16 with mixed-precision Adam on a ring of `boards` U280-like boards with `dsps`
// DSPs each, mini-batch `mini_batch`: the case where bapipe's pipeline estimate misranked its options
// (FPGA what-if study). Strategy left to the caller.
inline Experiment resnet50_on_u280_ring(int boards, double dsps, int mini_batch) {
  FpgaClusterSpec spec;
  spec.dims = {boards};
  spec.device = u280_like(dsps);
  Experiment e;
  e.workload = *build_model(**find_model("resnet50"), {}, Precision::FP16);
  e.cluster = *make_fpga_cluster(spec);
  e.memory.optimizer = Optimizer::MixedAdam;
  e.strategy.mini_batch = mini_batch;
  return e;
}

inline Cluster line_cluster(int p, double bandwidth, double latency) {
  Cluster c;
  c.name = "line";
  for (int i = 0; i < p; ++i) c.devices.push_back({"gpu" + std::to_string(i), test_device(), ""});
  for (int i = 0; i + 1 < p; ++i) c.links.push_back({i, i + 1, bandwidth, latency, Duplex::Full});
  return c;
}

// A chain of p layers (one per stage), T_F and T_BW per stage, activation bytes per boundary.
inline Experiment chain_experiment(int p, int m, double tf, double tbw, const std::string& schedule,
                                   Cluster cluster, double activation = 1 << 20) {
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

// Whether schedule `name` takes p ranks and m micro-batches: DualPipe (as DeepSeek's reference
// asserts) needs p and m even and m >= 2p, DualPipeV m >= 2p; the others take any.
inline bool schedule_takes(const std::string& name, int p, int m) {
  if (name == "dualpipe") return p % 2 == 0 && m % 2 == 0 && m >= 2 * p;
  if (name == "dualpipev") return m >= 2 * p;
  return true;
}

// An experiment that exercises schedule `name` on p devices and m micro-batches: a chain of
// p x chunks layers (T_F, T_B, T_W per rank's share), chunks for interleaved-1f1b, and for `file`
// the CSV of 1f1b's schedule.
inline Experiment schedule_experiment(const std::string& name, int p, int m, Cluster cluster, int chunks = 2,
                                      double tf = 1e-3, double tb = 1e-3, double tw = 1e-3,
                                      double activation = 1024) {
  const int v = name == "interleaved-1f1b" ? chunks : name == "dualpipev" ? 2 : 1;
  ChainSpec c;
  c.layers = p * v;
  c.forward_s = tf / v;
  c.backward_s = (tb + tw) / v;
  c.backward_weight_s = tw / v;
  c.activation_bytes = activation;
  c.parameter_bytes = 1 << 20;
  Experiment e;
  e.name = name;
  e.workload = make_chain(c);
  e.cluster = std::move(cluster);
  e.strategy.schedule = name;
  e.strategy.micro_batches = m;
  e.strategy.stages = p;
  e.strategy.chunks = v;
  if (name == "file") {
    Experiment base = e;
    base.strategy.schedule = "1f1b";
    Result<PreparedRun> run = prepare(base);
    if (run) e.strategy.schedule_text = to_csv(run->schedule);
    e.strategy.schedule_source = "1f1b.csv";
  }
  return e;
}

inline bool close_rel(double a, double b, double rel) {
  return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b));
}

// One causal Transformer block (ungated FFN, no biases, unfused core, as many KV heads as heads) over
// an input of [sequence, hidden], fp16, no optimizer time: the context-parallelism tests' model.
inline Workload causal_block(double sequence, double hidden, double heads, double ffn) {
  ModelBuilder b("cp", Precision::FP16);
  int x = b.input("x", {static_cast<int64_t>(sequence), static_cast<int64_t>(hidden)});
  TensorSplit s;
  s.kind = TensorSplitKind::Transformer;
  s.heads = s.kv_heads = heads;
  s.ffn = ffn;
  s.gated = false;
  s.biases = false;
  s.causal = true;
  x = *b.decoder_block("block", x, s);
  Workload w = b.finish();
  w.optimizer_step_s = 0;
  return w;
}

}  // namespace pipegrid::testing
