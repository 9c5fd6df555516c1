// Experiment YAML (pipegrid run FILE): the whole reader, workload and cluster included.
#include "tests/fuzz/fuzz.h"
#include "tools/input/experiment_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipegrid::fuzz::check(
      pipegrid::input::load_experiment_text(pipegrid::fuzz::text_of(data, size), "fuzz/exp.yaml"));
  return 0;
}
