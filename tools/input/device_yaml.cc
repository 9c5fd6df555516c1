#include "tools/input/device_yaml.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/units.h"
#include "tools/builtin_catalog.h"

namespace pipegrid::input {
namespace {

const std::vector<std::string_view> kSpecKeys = {
    "model",          "memory",          "memory_bandwidth",   "flops",
    "peak",           "efficiency",      "compute_efficiency", "memory_efficiency",
    "kernel_startup", "kernel_dispatch", "layer_overhead",     "dsps",
    "clock",          "macs_per_dsp",    "onchip_memory",      "ports",
    "port_bandwidth", "winograd",        "recurrent_step",     "microscaling"};

// Per-precision mapping {fp32: ..., tf32: ..., fp16: ..., bf16: ..., int8: ..., fp8: ...} (the
// arithmetic formats of kMathPrecisions: amp runs at fp16's figures), each read by `read`.
template <class Read>
void per_precision(const Node& n, std::string_view expectation, Read read) {
  n.require_map(expectation);
  std::vector<std::string_view> keys;
  for (Precision prec : kMathPrecisions) keys.push_back(to_string(prec));
  n.check_keys(keys);
  for (Precision prec : kMathPrecisions)
    if (auto v = n.get(to_string(prec))) read(prec, *v);
}

double fraction(const Node& n) {
  double v = n.number("a number in (0, 1]");
  if (!(v > 0 && v <= 1)) n.expected("a number in (0, 1]");
  return v;
}

// {gemm: 0.8, conv: 0.6, ...} over the given classes.
template <size_t N>
void per_class(const Node& n, const std::array<KernelClass, N>& classes, std::string_view expectation,
               std::array<double, kKernelClassCount>& out) {
  n.require_map(expectation);
  std::vector<std::string_view> keys;
  for (KernelClass k : classes) keys.push_back(to_string(k));
  n.check_keys(keys);
  for (KernelClass k : classes)
    if (auto v = n.get(to_string(k))) out[static_cast<int>(k)] = fraction(*v);
}

std::vector<std::string_view> catalog_names() {
  std::vector<std::string_view> out;
  for (const CatalogDevice& d : device_catalog()) out.push_back(d.name);
  return out;
}

DeviceSpec lookup(const Node& n) {
  std::string name = n.string("a device name from the catalog");
  if (const CatalogDevice* d = find_catalog_device(name)) return d->spec;
  std::vector<std::string> close = close_matches(name, catalog_names());
  if (close.size() > 3) close.resize(3);
  std::string guess;
  for (const std::string& c : close)
    guess += fmt::format("{}\"{}\"", guess.empty() ? "did you mean " : " or ", c);
  n.fail(fmt::format("unknown device \"{}\" ({}{}`pipegrid device list` shows the catalog)", name, guess,
                     guess.empty() ? "" : "? "));
}

// FPGA figures (dsps, clock, macs_per_dsp, onchip_memory, ports, port_bandwidth): any of them makes the
// device an FPGA whose peak is derived. Returns whether any was given.
bool parse_fpga_figures(const Node& n, DeviceSpec& spec) {
  const bool fpga_keys = n.has("dsps") || n.has("clock") || n.has("macs_per_dsp") || n.has("onchip_memory") ||
                         n.has("ports") || n.has("port_bandwidth");
  if (fpga_keys) {
    // A GPU's figures are its peaks: an FPGA key on one would silently turn it into an FPGA whose
    // peak comes from DSPs it does not have (0 when no MACs per DSP are given).
    if (spec.family == "gpu" && !spec.fpga)
      for (std::string_view key :
           {"dsps", "clock", "macs_per_dsp", "onchip_memory", "ports", "port_bandwidth"})
        if (auto v = n.get(key))
          v->fail(
              fmt::format("an FPGA figure, but this device is a GPU{} (set `peak` to change a GPU's "
                          "rates, or name an FPGA model such as u280)",
                          n.has("model") ? fmt::format(" ({})", n.get("model")->string("a device name"))
                                         : std::string()));
    if (!spec.fpga) spec.fpga = FpgaSpec{};
    spec.family = "fpga";
    FpgaSpec& f = *spec.fpga;
    if (auto v = n.get("dsps"))
      f.dsps = static_cast<double>(v->integer(1, 100'000'000, "a positive number of DSPs"));
    if (auto v = n.get("clock")) f.clock_hz = v->quantity(Dimension::Frequency, Sign::Positive);
    if (auto v = n.get("macs_per_dsp"))
      per_precision(*v, "a mapping from precision to MACs per DSP per cycle, like {fp32: 0.2, int8: 2}",
                    [&](Precision p, const Node& x) {
                      double m = x.number("a non-negative number of MACs per cycle");
                      if (m < 0) x.expected("a non-negative number of MACs per cycle");
                      f.macs_per_dsp[static_cast<int>(p)] = m;
                    });
    if (auto v = n.get("onchip_memory")) f.onchip_bytes = v->quantity(Dimension::Bytes, Sign::NonNegative);
    if (auto v = n.get("ports"))  // 0 would read as "not stated" (no limit on the links)
      f.ports = static_cast<int>(v->integer(1, 1024, "a number of network ports, from 1"));
    if (auto v = n.get("port_bandwidth"))
      f.port_bandwidth = v->quantity(Dimension::Bandwidth, Sign::Positive);
  }
  return fpga_keys;
}

void apply_overrides(const Node& n, DeviceSpec& spec) {
  if (auto m = n.get("memory")) spec.memory_bytes = m->quantity(Dimension::Bytes, Sign::Positive);
  if (auto m = n.get("memory_bandwidth"))
    spec.memory_bandwidth = m->quantity(Dimension::Bandwidth, Sign::Positive);
  const bool fpga_keys = parse_fpga_figures(n, spec);
  spec.derive_peaks();
  if (spec.fpga) {
    // Derived figures are checked as given ones are (at most 1e21 FLOP/s): DSPs x clock x MACs per
    // DSP x 2 of 1e308 MACs is infinite, which SimGrid cannot simulate.
    for (int p = 0; p < kPrecisionCount; ++p)
      if (!(spec.peak_flops[p] <= 1e21))
        n.fail(
            fmt::format("the derived {} peak (DSPs x clock x MACs per DSP x 2) is {:g} FLOP/s, out of range: "
                        "at most 1e21 FLOP/s",
                        to_string(static_cast<Precision>(p)), spec.peak_flops[p]));
    if (fpga_keys && *std::max_element(spec.peak_flops.begin(), spec.peak_flops.end()) <= 0 &&
        !n.has("flops") && !n.has("peak"))
      n.fail("an FPGA with a peak of 0 FLOP/s in every precision: give its macs_per_dsp (or dsps and clock)");
  }
  // An FPGA's peak derives from the figures beside it: a rate given with them would replace what they
  // derive, and they would change nothing.
  for (const char* rate : {"flops", "peak"})
    if (auto r = n.get(rate); r && (n.has("dsps") || n.has("clock") || n.has("macs_per_dsp")))
      r->fail(
          fmt::format("replaces the peak an FPGA derives from its dsps x clock x macs_per_dsp, also given "
                      "here (they would change nothing); expected either {} or those figures",
                      rate));
  if (auto f = n.get("flops")) spec.peak_flops.fill(f->quantity(Dimension::FlopRate, Sign::Positive));
  if (auto p = n.get("peak"))
    per_precision(*p, "a mapping from precision to compute rate, like {fp32: 19.5TFLOPS, fp16: 312TFLOPS}",
                  [&](Precision prec, const Node& v) {
                    spec.peak_flops[static_cast<int>(prec)] = v.quantity(Dimension::FlopRate, Sign::Positive);
                  });
  if (auto e = n.get("efficiency")) spec.efficiency = fraction(*e);
  if (auto e = n.get("compute_efficiency"))
    per_precision(*e, "a mapping from precision to {gemm: ..., conv: ..., attention: ..., recurrent: ...}",
                  [&](Precision prec, const Node& v) {
                    per_class(v, kComputeClasses,
                              "a mapping from compute kernel class (gemm, conv, attention, recurrent) to a "
                              "fraction of peak like {gemm: 0.8, conv: 0.6}",
                              spec.compute_efficiency[static_cast<int>(prec)]);
                  });
  if (auto e = n.get("memory_efficiency")) {
    if (e->is_scalar())
      spec.memory_efficiency_default = fraction(*e);
    else
      per_class(*e, kKernelClasses,
                "a fraction of the memory bandwidth (0.8), or a mapping from kernel class to one like "
                "{elementwise: 0.8, gather: 0.5}",
                spec.memory_efficiency);
  }
  // One start-up for every kernel class, or {gemm: 10us, elementwise: 50us, ...}: the classes named
  // take theirs, the others keep the entry's.
  if (auto o = n.get("kernel_startup")) {
    if (o->is_scalar()) {
      spec.set_startup(o->quantity(Dimension::Time, Sign::NonNegative));
    } else {
      o->require_map(
          "a time (5us), or a mapping from kernel class to one like {gemm: 10us, elementwise: 5us}");
      std::vector<std::string_view> keys;
      for (KernelClass k : kKernelClasses) keys.push_back(to_string(k));
      o->check_keys(keys);
      for (KernelClass k : kKernelClasses)
        if (auto v = o->get(to_string(k)))
          spec.kernel_startup_class[static_cast<int>(k)] = v->quantity(Dimension::Time, Sign::NonNegative);
    }
  }
  // One host time per launch for every kernel class, or {gemm: 14us, grouped-gemm: 50us, ...}: the
  // classes named take theirs, the others keep the entry's.
  if (auto o = n.get("kernel_dispatch")) {
    if (o->is_scalar()) {
      spec.kernel_dispatch_s = o->quantity(Dimension::Time, Sign::NonNegative);
      spec.kernel_dispatch_class = DeviceSpec::unset_per_class();
    } else {
      o->require_map(
          "a time (13us), or a mapping from kernel class to one like {gemm: 13us, grouped-gemm: 50us}");
      std::vector<std::string_view> keys;
      for (KernelClass k : kKernelClasses) keys.push_back(to_string(k));
      o->check_keys(keys);
      for (KernelClass k : kKernelClasses)
        if (auto v = o->get(to_string(k)))
          spec.kernel_dispatch_class[static_cast<int>(k)] = v->quantity(Dimension::Time, Sign::NonNegative);
    }
  }
  if (auto o = n.get("layer_overhead"))
    spec.layer_overhead_s = o->quantity(Dimension::Time, Sign::NonNegative);
  if (auto r = n.get("recurrent_step"))
    per_precision(*r, "a mapping from precision to the time per recurrent step, like {fp16: 31us}",
                  [&](Precision prec, const Node& v) {
                    spec.recurrent_step_s[static_cast<int>(prec)] =
                        v.quantity(Dimension::Time, Sign::NonNegative);
                  });
  // Precisions whose 3x3 stride-1 convolutions run as Winograd F(2x2, 3x3) (core/device.h); the
  // list replaces the entry's.
  if (auto w = n.get("winograd")) {
    spec.winograd.fill(false);
    std::vector<std::string_view> names;
    for (Precision prec : kMathPrecisions) names.push_back(to_string(prec));
    for (const Node& item :
         w->items("a list of math precisions whose 3x3 stride-1 convolutions run as Winograd, like [fp32]"))
      spec.winograd[static_cast<int>(*parse_precision(item.choice(names, "a math precision")))] = true;
  }
  // Microscaling tensor cores (core/device.h): what an mxfp8 training needs.
  if (auto m = n.get("microscaling")) spec.microscaling = m->boolean();
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
    keys.insert(keys.end(), {"family", "description", "source"});
    n.check_keys(keys);
    d.family = n.need("family", "gpu or fpga").choice({"gpu", "fpga"}, "a device family");
    if (auto s = n.get("description")) d.description = s->string();
    if (auto s = n.get("source")) d.source = s->string();
    d.spec.kind = d.name;
    d.spec.family = d.family;
    apply_overrides(n, d.spec);
    if (!(d.spec.memory_bytes > 0)) n.need("memory", "a positive byte size");
    // A YAML alias of an earlier entry (`a100: *a100_80gb`) is that device under an older name: say so.
    size_t i = 0;
    for (const auto& prev : doc.root) {
      if (i++ >= out.size()) break;
      if (prev.second.is(kv.second)) {
        d.alias_of = prev.first.Scalar();
        d.description += fmt::format(" (alias of {})", d.alias_of);
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

// Whether a memory size names a part of `total` bytes: within 10%, since a datasheet's "40 GB" (40e9
// or 40 GiB as written) and nvidia-smi's total (the catalog's 40,536 MiB) differ by a few per cent.
bool names_part(double bytes, double total) {
  return std::abs(bytes / total - 1) <= 0.1;
}

// A GPU entry given another part's memory size, where the catalog holds that part with its own
// bandwidth (`{model: a100, memory: 40GB}`: the A100 40 GB has 1,555 GB/s, not the 80 GB part's
// 2,039), would silently run at the wrong bandwidth: refuse it and name the entry to use.
void refuse_other_part(const Node& n, const DeviceSpec& spec) {
  const std::optional<Node> mem = n.get("memory");
  if (!mem || n.has("memory_bandwidth") || spec.family != "gpu") return;
  const double bytes = mem->quantity(Dimension::Bytes, Sign::Positive);
  if (names_part(bytes, spec.memory_bytes)) return;
  const std::string base = spec.kind.substr(0, spec.kind.find('-'));
  for (const CatalogDevice& d : device_catalog())
    if (d.name != spec.kind && d.name.rfind(base + "-", 0) == 0 && d.family == "gpu" &&
        names_part(bytes, d.spec.memory_bytes) && d.spec.memory_bandwidth != spec.memory_bandwidth)
      mem->fail(
          fmt::format("\"{}\" has {} at {:.0f} GB/s; the {} part is \"{}\" ({}, {:.0f} GB/s): use "
                      "model: {} (or give memory_bandwidth too)",
                      spec.kind, format_bytes(spec.memory_bytes), spec.memory_bandwidth / 1e9,
                      mem->yaml().Scalar(), d.name, d.description, d.spec.memory_bandwidth / 1e9, d.name));
}

}  // namespace

const std::vector<CatalogDevice>& device_catalog() {
  static const std::vector<CatalogDevice> catalog = load_catalog();
  return catalog;
}

YAML::Node catalog_value(std::string_view device, std::string_view key) {
  static const YAML::Node root = YAML::Load(kBuiltinCatalog);
  const YAML::Node entry = root[std::string(device)];
  if (!entry.IsDefined() || !entry.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node v = entry[std::string(key)];
  return v.IsDefined() ? v : YAML::Node(YAML::NodeType::Undefined);
}

const CatalogDevice* find_catalog_device(std::string_view name) {
  for (const CatalogDevice& d : device_catalog())
    if (d.name == name) return &d;
  return nullptr;
}

std::vector<std::string> device_names_alike(std::string_view name) {
  const CatalogDevice* d = find_catalog_device(name);
  if (!d) return {std::string(name)};
  const std::string root = d->alias_of.empty() ? d->name : d->alias_of;
  std::vector<std::string> out;
  for (const CatalogDevice& c : device_catalog())
    if (c.name == root || c.alias_of == root) out.push_back(c.name);
  return out;
}

std::string profile_device_kind_problem(std::string_view kind) {
  if (kind == "any" || kind == "custom" || find_catalog_device(kind)) return {};
  std::vector<std::string_view> names = {"any", "custom"};
  for (const CatalogDevice& c : device_catalog()) names.push_back(c.name);
  const std::vector<std::string> close = close_matches(kind, names);
  return fmt::format(
      "unknown device kind \"{}\" ({}expected a catalog name, \"custom\" or \"any\"; "
      "`pipegrid device list` shows the catalog)",
      kind, close.empty() ? "" : fmt::format("did you mean \"{}\"? ", close.front()));
}

DeviceSpec parse_device_spec(const Node& n, const std::vector<std::string_view>& extra_keys) {
  if (n.is_scalar()) return lookup(n);
  n.require_map("a device: a catalog name like \"a100\" or a mapping like {model: v100, memory: 32GB}");
  std::vector<std::string_view> keys = extra_keys;
  keys.insert(keys.end(), kSpecKeys.begin(), kSpecKeys.end());
  n.check_keys(keys);
  DeviceSpec spec;
  if (auto m = n.get("model")) {
    spec = lookup(*m);
    refuse_other_part(n, spec);
  }
  apply_overrides(n, spec);
  if (!(spec.memory_bytes > 0)) n.need("memory", describe(Dimension::Bytes, "positive"));
  return spec;
}

}  // namespace pipegrid::input
