// Cluster YAML files (cluster: {file: c.yaml}, pipegrid cluster show FILE).
#include "tests/fuzz/fuzz.h"
#include "tools/input/cluster_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipegrid::fuzz::check(
      pipegrid::input::load_cluster_text(pipegrid::fuzz::text_of(data, size), "fuzz/c.yaml"));
  return 0;
}
