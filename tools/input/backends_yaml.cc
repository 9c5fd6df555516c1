#include "tools/input/backends_yaml.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/models/zoo.h"
#include "tools/input/device_yaml.h"
#include "tools/input/model_yaml.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {
namespace {

double fraction(const Node& n) {
  const double v = n.number("a number in (0, 1]");
  if (!(v > 0 && v <= 1)) n.expected("a number in (0, 1]");
  return v;
}

void per_class(const Node& n, std::string_view expectation, std::array<double, kKernelClassCount>& out) {
  n.require_map(expectation);
  std::vector<std::string_view> keys;
  for (KernelClass k : kKernelClasses) keys.push_back(to_string(k));
  n.check_keys(keys);
  for (KernelClass k : kKernelClasses)
    if (auto v = n.get(to_string(k))) out[static_cast<int>(k)] = fraction(*v);
}

// The cost keys shared by a backend (its defaults) and a pattern (which refines them).
constexpr std::string_view kCostKeys[] = {"efficiency", "memory_efficiency", "launch", "overhead",
                                          "measured"};

void parse_cost(const Node& n, PatternCost& c) {
  if (auto e = n.get("efficiency"))
    per_class(*e, "a mapping from kernel class to a fraction of peak, like {gemm: 0.7, attention: 0.5}",
              c.compute_efficiency);
  if (auto e = n.get("memory_efficiency"))
    per_class(*e,
              "a mapping from kernel class to a fraction of the memory bandwidth, like {elementwise: 0.8}",
              c.memory_efficiency);
  if (auto v = n.get("launch")) c.launch_s = v->quantity(Dimension::Time, Sign::NonNegative);
  if (auto v = n.get("overhead")) c.overhead_s = v->quantity(Dimension::Time, Sign::NonNegative);
  if (auto m = n.get("measured")) {
    m->require_map(
        "a mapping with forward, backward and batch, like {forward: 1ms, backward: 2ms, batch: 8}");
    m->check_keys({"forward", "backward", "backward_weight", "batch"});
    MeasuredCost mc;
    mc.forward_s = m->need("forward", "a time like \"1ms\"").quantity(Dimension::Time, Sign::NonNegative);
    mc.backward_s = m->need("backward", "a time like \"2ms\"").quantity(Dimension::Time, Sign::NonNegative);
    if (auto w = m->get("backward_weight")) {
      mc.backward_weight_s = w->quantity(Dimension::Time, Sign::NonNegative);
      if (mc.backward_weight_s > mc.backward_s) w->expected("a time at most the backward time");
    }
    const Node b = m->need("batch", "a positive number of samples");
    mc.batch = b.number("a positive number of samples");
    if (!(mc.batch > 0)) b.expected("a positive number of samples");
    c.measured = mc;
  }
}

PatternOp parse_op(const Node& n) {
  const std::string text = n.string("a layer kind (conv2d), a kernel class (class:gemm) or \"*\"");
  PatternOp op;
  op.text = text;
  if (text.empty()) n.expected("a layer kind (conv2d), a kernel class (class:gemm) or \"*\"");
  if (text == "*") {
    op.kind = PatternOp::Kind::Any;
  } else if (text.rfind("class:", 0) == 0) {
    const std::string cls = text.substr(6);
    auto k = parse_kernel_class(cls);
    if (!k) {
      std::vector<std::string_view> names;
      for (KernelClass kc : kKernelClasses) names.push_back(to_string(kc));
      n.fail(fmt::format("expected a kernel class after \"class:\" ({}), got \"{}\"", join(names), cls));
    }
    op.kind = PatternOp::Kind::Class;
    op.cls = *k;
  } else {
    // A kind no model has would match nothing, and the backend would be left out without a word.
    std::vector<std::string_view> kinds = layer_kinds();
    for (std::string_view k : zoo_layer_kinds())
      if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
    if (std::find(kinds.begin(), kinds.end(), text) == kinds.end()) {
      const std::vector<std::string> close = close_matches(text, kinds);
      n.fail(fmt::format(
          "unknown layer kind \"{}\" ({}expected a layer kind of the model format or the zoo: "
          "{}; a kernel class as class:gemm; or \"*\")",
          text, close.empty() ? "" : fmt::format("did you mean \"{}\"? ", close.front()), join(kinds)));
    }
  }
  return op;
}

void parse_ops(const Node& ops, BackendPattern& p) {
  if (ops.is_scalar()) {
    p.ops.push_back(parse_op(ops));
    return;
  }
  const std::vector<Node> items = ops.items("a list of ops, like [conv2d, add, relu]");
  if (items.empty()) ops.expected("a non-empty list of ops");
  if (items.size() > 16) ops.expected("a chain of at most 16 ops");
  for (const Node& o : items) p.ops.push_back(parse_op(o));
}

BackendPattern parse_pattern(const Node& n, const PatternCost& defaults, const std::string& backend_source) {
  BackendPattern p;
  p.cost = defaults;
  p.source = backend_source;
  constexpr std::string_view kExpect =
      "a layer kind, a list of ops (a fused chain), or a mapping with ops and cost keys";
  if (n.is_scalar()) {
    p.ops.push_back(parse_op(n));
    return p;
  }
  // (No Node assignment here: yaml-cpp's assignment writes through to the document.)
  if (n.is_map()) {
    std::vector<std::string_view> keys = {"ops", "source"};
    keys.insert(keys.end(), std::begin(kCostKeys), std::end(kCostKeys));
    n.check_keys(keys);
    parse_cost(n, p.cost);
    if (auto s = n.get("source")) p.source = s->string();
    parse_ops(n.need("ops", "a list of ops, like [conv2d, add, relu]"), p);
  } else if (n.is_list()) {
    parse_ops(n, p);
  } else {
    n.expected(kExpect);
  }
  return p;
}

}  // namespace

BackendCatalog parse_backend_catalog(const Node& root) {
  if (root.is_null()) root.fail("expected a mapping with keys backends, conversions, got an empty document");
  root.require_map("a mapping with keys backends, conversions");
  root.check_keys({"backends", "conversions", "description", "source"});
  BackendCatalog c;
  const Node bs = root.need("backends", "a mapping from backend name to its description");
  bs.require_map("a mapping from backend name to its description");
  std::vector<std::string_view> devices;
  for (const CatalogDevice& d : device_catalog()) devices.push_back(d.name);
  for (const auto& kv : bs.yaml()) {
    Backend b;
    b.name = kv.first.Scalar();
    const Node n = *bs.get(b.name);
    n.require_map("a backend description (device, patterns, ...)");
    std::vector<std::string_view> keys = {"device", "description", "source", "patterns"};
    keys.insert(keys.end(), std::begin(kCostKeys), std::end(kCostKeys));
    n.check_keys(keys);
    const Node dev = n.need("device", "a device catalog name like a100");
    b.device_kind = dev.choice(devices, "a device of the catalog");
    for (std::string& alike : device_names_alike(b.device_kind))
      if (alike != b.device_kind) b.device_aliases.push_back(std::move(alike));
    if (auto s = n.get("description")) b.description = s->string();
    std::string source;
    if (auto s = n.get("source")) source = s->string();
    PatternCost defaults;
    parse_cost(n, defaults);
    const Node ps = n.need("patterns", "a list of patterns");
    const std::vector<Node> items = ps.items("a list of patterns, like [conv2d, [conv2d, add, relu]]");
    if (items.empty()) ps.expected("a non-empty list of patterns");
    for (const Node& p : items) b.patterns.push_back(parse_pattern(p, defaults, source));
    c.backends.push_back(std::move(b));
  }
  if (c.backends.empty()) bs.expected("at least one backend");
  if (auto cs = root.get("conversions")) {
    std::vector<std::string_view> names = {"*"};
    for (const Backend& b : c.backends) names.push_back(b.name);
    for (const Node& n : cs->items("a list of conversions, like [{from: \"*\", to: \"*\", latency: 5us}]")) {
      n.require_map("a conversion (from, to, latency, bandwidth)");
      n.check_keys({"from", "to", "latency", "bandwidth", "source"});
      Conversion cv;
      if (auto f = n.get("from")) cv.from = f->choice(names, "a backend of this catalog or \"*\"");
      if (auto t = n.get("to")) cv.to = t->choice(names, "a backend of this catalog or \"*\"");
      if (auto l = n.get("latency")) cv.latency_s = l->quantity(Dimension::Time, Sign::NonNegative);
      if (auto b = n.get("bandwidth")) cv.bandwidth = b->quantity(Dimension::Bandwidth, Sign::Positive);
      if (auto s = n.get("source")) cv.source = s->string();
      c.conversions.push_back(std::move(cv));
    }
  }
  return c;
}

Result<BackendCatalog> load_backend_catalog_file(const std::string& path) {
  try {
    const Document doc = load_document_file(path);
    return parse_backend_catalog(Node::root(doc));
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

Result<BackendCatalog> load_backend_catalog_text(const std::string& text, const std::string& name) {
  try {
    const Document doc = load_document_text(text, name);
    return parse_backend_catalog(Node::root(doc));
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

}  // namespace pipegrid::input
