// SimGrid platform XML (the importer), with a default device for hosts without pipegrid properties
// (as `cluster: {file: p.xml, device: v100}`), so that every host is accepted.
#include "tests/fuzz/fuzz.h"
#include "tools/input/cluster_yaml.h"
#include "tools/input/simgrid_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::optional<pipegrid::DeviceSpec> device = *pipegrid::input::catalog_device("v100");
  pipegrid::fuzz::check(
      pipegrid::input::read_simgrid_xml(pipegrid::fuzz::text_of(data, size), "fuzz/p.xml", device));
  return 0;
}
