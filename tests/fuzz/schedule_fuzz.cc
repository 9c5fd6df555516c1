// Schedule CSV (schedule: file): read, then checked against a plan and lowered as `pipegrid run`
// does before replaying (structure, lowering to a task graph, deadlock check): an 8-layer chain on
// 4 devices in 4 stages with 4 micro-batches, and 2 chunks per device (stages r and r + 4 on rank r) when the
// input's length is odd.
#include <cstdio>
#include <cstdlib>

#include "core/experiment.h"
#include "tests/fuzz/fuzz.h"
#include "tools/input/experiment_yaml.h"

namespace {

const pipegrid::Experiment& base(bool interleaved) {
  static const auto make = [](bool chunks) {
    const std::string text = std::string(R"(
workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 1MiB, parameters: 1MiB}
cluster: {kind: switch, count: 4, device: {name: gpu, memory: 16GiB}, bandwidth: 10GBps, latency: 1us}
strategy: {partitioner: uniform, micro_batches: 4, )") +
                             (chunks ? "schedule: interleaved-1f1b, chunks: 2}" : "schedule: 1f1b}");
    pipegrid::Result<pipegrid::Experiment> e = pipegrid::input::load_experiment_text(text, "<fuzz base>");
    if (!e) {
      std::fprintf(stderr, "schedule_fuzz: the base experiment does not load: %s\n",
                   e.error().message.c_str());
      std::abort();
    }
    return std::move(*e);
  };
  static const pipegrid::Experiment plain = make(false), two_chunks = make(true);
  return interleaved ? two_chunks : plain;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipegrid::Experiment e = base(size % 2 == 1);
  const std::string text = pipegrid::fuzz::text_of(data, size);
  e.strategy.schedule = "file";
  e.strategy.schedule_text = text;
  e.strategy.schedule_source = "fuzz/s.csv";
  pipegrid::fuzz::check(pipegrid::prepare(e));
  return 0;
}
