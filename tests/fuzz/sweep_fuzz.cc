// Sweep files (pipegrid sweep FILE): the reader (axes, ranges, scale factors, zips, the where/skip
// expression language) and, for the first points, the filters, the labels and each point's
// experiment as `pipegrid sweep point` reads it.
#include <algorithm>

#include "tests/fuzz/fuzz.h"
#include "tools/input/experiment_yaml.h"
#include "tools/input/yaml_node.h"
#include "tools/sweep/sweep.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipegrid;
  try {
    const sweep::Sweep s = sweep::Sweep::load_text(fuzz::text_of(data, size), "fuzz/sweep.yaml");
    for (size_t point = 0; point < std::min<size_t>(s.grid_size(), 16); ++point) {
      if (!s.selected(point)) continue;
      (void)s.describe(point);
      (void)s.axis_values(point);
      (void)input::parse_experiment(s.experiment_document(point));
    }
  } catch (const input::InputError& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
