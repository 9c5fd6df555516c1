// Model files (workload: {file: m.yaml}): layers, shapes, sizes.
#include "tests/fuzz/fuzz.h"
#include "tools/input/model_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipegrid::fuzz::check(
      pipegrid::input::load_model_text(pipegrid::fuzz::text_of(data, size), "fuzz/m.yaml", std::nullopt));
  return 0;
}
