#include "tools/input/device_yaml.h"

#include <fmt/format.h>

#include <algorithm>

#include "tools/builtin_catalog.h"

namespace pipegrid::input {
namespace {

const std::vector<std::string_view> kSpecKeys = {"model",      "memory",     "memory_bandwidth", "flops",
                                                 "peak",       "efficiency", "layer_overhead"};

std::vector<std::string_view> catalog_names() {
  std::vector<std::string_view> out;
  for (const CatalogDevice& d : device_catalog()) out.push_back(d.name);
  return out;
}

std::string join(const std::vector<std::string_view>& v) {
  std::string out;
  for (std::string_view s : v) out += fmt::format("{}{}", out.empty() ? "" : ", ", s);
  return out;
}

DeviceSpec lookup(const Node& n) {
  std::string name = n.string("a device name from the catalog");
  if (const CatalogDevice* d = find_catalog_device(name)) return d->spec;
  std::vector<std::string> close = close_matches(name, catalog_names());
  n.fail(fmt::format("unknown device \"{}\" ({}known: {})", name,
                     close.empty() ? "" : fmt::format("did you mean \"{}\"? ", close.front()), join(catalog_names())));
}

void apply_overrides(const Node& n, DeviceSpec& spec) {
  if (auto m = n.get("memory")) spec.memory_bytes = m->quantity(Dimension::Bytes, Sign::Positive);
  if (auto m = n.get("memory_bandwidth")) spec.memory_bandwidth = m->quantity(Dimension::Bandwidth, Sign::Positive);
  if (auto f = n.get("flops")) spec.peak_flops.fill(f->quantity(Dimension::FlopRate, Sign::Positive));
  if (auto p = n.get("peak")) {
    p->require_map("a mapping from precision to compute rate, like {fp32: 19.5TFLOPS, fp16: 312TFLOPS}");
    p->check_keys({"fp32", "fp16", "bf16", "int8"});
    for (Precision prec : {Precision::FP32, Precision::FP16, Precision::BF16, Precision::INT8})
      if (auto v = p->get(to_string(prec)))
        spec.peak_flops[static_cast<int>(prec)] = v->quantity(Dimension::FlopRate, Sign::Positive);
  }
  if (auto e = n.get("efficiency")) {
    double v = e->number("a number in (0, 1]");
    if (!(v > 0 && v <= 1)) e->expected("a number in (0, 1]");
    spec.efficiency = v;
  }
  if (auto o = n.get("layer_overhead")) spec.layer_overhead_s = o->quantity(Dimension::Time, Sign::NonNegative);
}

std::vector<CatalogDevice> load_catalog() {
  const Document doc = load_document_text(kBuiltinCatalog, "topologies/devices.yaml");
  Node root = Node::root(doc);
  root.require_map("the device catalog");
  std::vector<CatalogDevice> out;
  for (const auto& kv : doc.root) {
    CatalogDevice d;
    d.name = kv.first.Scalar();
    Node n = *root.get(d.name);
    n.require_map("a device description");
    std::vector<std::string_view> keys = kSpecKeys;
    keys.insert(keys.end(), {"kind", "description", "source"});
    n.check_keys(keys);
    d.kind = n.need("kind", "gpu or fpga").choice({"gpu", "fpga"}, "a device kind");
    if (auto s = n.get("description")) d.description = s->string();
    if (auto s = n.get("source")) d.source = s->string();
    d.spec.kind = d.name;
    apply_overrides(n, d.spec);
    if (!(d.spec.memory_bytes > 0)) n.need("memory", "a positive byte size");
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

const std::vector<CatalogDevice>& device_catalog() {
  static const std::vector<CatalogDevice> catalog = load_catalog();
  return catalog;
}

const CatalogDevice* find_catalog_device(std::string_view name) {
  for (const CatalogDevice& d : device_catalog())
    if (d.name == name) return &d;
  return nullptr;
}

DeviceSpec parse_device_spec(const Node& n, const std::vector<std::string_view>& extra_keys) {
  if (n.is_scalar()) return lookup(n);
  n.require_map("a device: a catalog name like \"a100\" or a mapping like {model: a100, memory: 40GB}");
  std::vector<std::string_view> keys = extra_keys;
  keys.insert(keys.end(), kSpecKeys.begin(), kSpecKeys.end());
  n.check_keys(keys);
  DeviceSpec spec;
  if (auto m = n.get("model")) spec = lookup(*m);
  apply_overrides(n, spec);
  if (!(spec.memory_bytes > 0)) n.need("memory", describe(Dimension::Bytes, "positive"));
  return spec;
}

}  // namespace pipegrid::input
