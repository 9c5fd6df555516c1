#include <doctest/doctest.h>

#include "tools/input/device_yaml.h"

using namespace pipegrid;
using namespace pipegrid::input;

namespace {

DeviceSpec parse(const std::string& yaml) {
  Document doc = load_document_text(yaml, "t.yaml");
  return parse_device_spec(*Node::root(doc).get("device"));
}

std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the compiled-in catalog holds the GPUs with hardware.md's figures") {
  const CatalogDevice* a100 = find_catalog_device("a100");
  REQUIRE(a100 != nullptr);
  CHECK(a100->kind == "gpu");
  CHECK(a100->spec.memory_bytes == 80e9);
  CHECK(a100->spec.memory_bandwidth == 2039e9);
  CHECK(a100->spec.peak(Precision::FP16) == 312e12);
  CHECK(a100->spec.peak(Precision::FP32) == 19.5e12);
  CHECK(find_catalog_device("v100")->spec.peak(Precision::FP16) == 125e12);
  CHECK(find_catalog_device("h100")->spec.memory_bandwidth == 3350e9);
  CHECK(find_catalog_device("nope") == nullptr);
}

TEST_CASE("a device is a catalog name or a mapping that overrides one") {
  CHECK(parse("device: v100").memory_bytes == 16e9);
  DeviceSpec d = parse("device: {model: a100, memory: 40GB, peak: {fp16: 100TFLOPS}}");
  CHECK(d.kind == "a100");
  CHECK(d.memory_bytes == 40e9);
  CHECK(d.peak(Precision::FP16) == 100e12);
  CHECK(d.peak(Precision::FP32) == 19.5e12);  // kept from the catalog
  DeviceSpec custom = parse("device: {memory: 16GiB, flops: 10TFLOPS, efficiency: 0.4}");
  CHECK(custom.kind == "custom");
  CHECK(custom.peak(Precision::INT8) == 10e12);
  CHECK(custom.efficiency == 0.4);
}

TEST_CASE("device errors: unknown names list close matches") {
  CHECK(error_of("device: a10") == "t.yaml:1:9: device: unknown device \"a10\" (did you mean \"a100\"? known: v100, a100, h100, vu9p, u280)");
  CHECK(error_of("device: {model: h10O}") ==
        "t.yaml:1:17: device.model: unknown device \"h10O\" (did you mean \"h100\"? known: v100, a100, h100, vu9p, u280)");
  CHECK(error_of("device: {flops: 1TFLOPS}") ==
        "t.yaml:1:9: device.memory: expected a positive byte size like \"16GiB\", got nothing (the key is missing)");
  CHECK(error_of("device: {memory: 1GB, efficiency: 1.5}") ==
        "t.yaml:1:35: device.efficiency: expected a number in (0, 1], got \"1.5\"");
}
