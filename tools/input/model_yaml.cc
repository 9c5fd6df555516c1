#include "tools/input/model_yaml.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/models/builder.h"

namespace pipegrid::input {
namespace {

const std::vector<std::string_view> kLayerKinds = {
    "input",     "linear",        "conv2d",  "maxpool", "avgpool",   "adaptive_avgpool",
    "batchnorm", "layernorm",     "relu",    "gelu",    "dropout",   "elementwise",
    "add",       "concat",        "flatten", "lstm",    "attention", "transformer_block",
    "embedding", "embedding_bag", "custom"};

// Keys each kind takes besides name, kind and inputs.
std::vector<std::string_view> kind_keys(const std::string& kind) {
  if (kind == "input") return {"shape"};
  if (kind == "linear") return {"in_features", "out_features", "bias", "tied_to"};
  if (kind == "conv2d")
    return {"in_channels", "out_channels", "kernel",    "stride", "padding",
            "groups",      "bias",         "batchnorm", "relu"};
  if (kind == "maxpool" || kind == "avgpool") return {"kernel", "stride", "padding"};
  if (kind == "adaptive_avgpool") return {"output"};
  if (kind == "lstm") return {"hidden", "bidirectional"};
  if (kind == "attention") return {"heads"};
  if (kind == "transformer_block") return {"heads", "ffn"};
  if (kind == "embedding") return {"vocabulary", "dim", "tied_to"};
  if (kind == "embedding_bag") return {"rows", "dim", "bag", "pooled"};
  if (kind == "custom")
    return {"forward_flops", "backward_flops", "backward_weight_flops",
            "forward_bytes", "backward_bytes", "parameters",
            "output_shape",  "output",         "stash",
            "forward",       "backward",       "backward_weight",
            "batch",         "device",         "tied_to"};
  return {};
}

int64_t count(const Node& n, std::string_view key, std::optional<int64_t> fallback = std::nullopt) {
  if (auto v = n.get(key)) return v->integer(1, 1'000'000'000'000, "a positive integer");
  if (fallback) return *fallback;
  return n.need(key, "a positive integer").integer(1, 1, "a positive integer");  // throws
}

int64_t offset(const Node& n, std::string_view key) {
  if (auto v = n.get(key)) return v->integer(0, 1'000'000, "a non-negative integer");
  return 0;
}

bool flag(const Node& n, std::string_view key, bool fallback) {
  if (auto v = n.get(key)) return v->boolean();
  return fallback;
}

Shape shape_of(const Node& n) {
  Shape s;
  for (const Node& d : n.items("a list of positive dimensions, like [3, 224, 224]"))
    s.push_back(d.integer(1, 1'000'000'000'000, "a positive dimension"));
  if (s.empty()) n.expected("a list of positive dimensions, like [3, 224, 224]");
  double elements = 1;
  for (int64_t d : s) elements *= static_cast<double>(d);
  if (elements > kMaxElements)
    n.fail(fmt::format("{} has {:.4g} elements per sample, more than a model can hold ({:.0e})",
                       shape_text(s), elements, kMaxElements));
  return s;
}

struct Entry {
  Node node;
  std::string name;
  std::string kind;
  std::vector<int> inputs;  // entry indices
};

Layer custom_costs(const Node& n) {
  Layer l;
  auto q = [&](std::string_view key, Dimension d) {
    auto v = n.get(key);
    return v ? v->quantity(d, Sign::NonNegative) : 0.0;
  };
  l.forward_flops = q("forward_flops", Dimension::Flops);
  const double backward = q("backward_flops", Dimension::Flops);
  l.backward_weight_flops = q("backward_weight_flops", Dimension::Flops);
  if (l.backward_weight_flops > backward && n.has("backward_weight_flops"))
    n.get("backward_weight_flops")->fail("expected at most backward_flops");
  l.backward_input_flops = backward - l.backward_weight_flops;
  l.forward_bytes = q("forward_bytes", Dimension::Bytes);
  l.backward_bytes = q("backward_bytes", Dimension::Bytes);
  if (auto p = n.get("parameters"))
    l.parameters = static_cast<double>(p->integer(0, 1'000'000'000'000'000, "a parameter count"));
  l.stash_bytes = q("stash", Dimension::Bytes);
  l.output_bytes = q("output", Dimension::Bytes);
  if (n.has("forward") || n.has("backward")) {
    MeasuredCost m;
    m.forward_s = q("forward", Dimension::Time);
    m.backward_s = q("backward", Dimension::Time);
    m.backward_weight_s = q("backward_weight", Dimension::Time);
    if (m.backward_weight_s > m.backward_s)
      n.get("backward_weight")->fail("expected at most the whole backward");
    m.batch = n.has("batch") ? static_cast<double>(count(n, "batch")) : 1;
    if (auto d = n.get("device")) m.device_kind = d->string("a device kind (catalog name)");
    l.measured = m;
  } else {
    for (std::string_view key : {"backward_weight", "batch", "device"})
      if (auto v = n.get(key))
        v->fail(fmt::format("{} applies only to measured times: give forward and/or backward with it", key));
  }
  if (n.has("output") && n.has("output_shape"))
    n.get("output")->fail("expected output (bytes) or output_shape, not both");
  return l;
}

}  // namespace

const std::vector<std::string_view>& layer_kinds() {
  return kLayerKinds;
}

// The layers' entries in file order, each name once (`by_name`: its index).
std::vector<Entry> read_entries(const Node& layers, std::map<std::string, int, std::less<>>& by_name) {
  std::vector<Entry> entries;
  std::vector<Node> items = layers.items("a list of layers");
  if (items.empty()) layers.expected("a non-empty list of layers");
  for (const Node& item : items) {
    item.require_map("a layer: a mapping with name, kind and its shape parameters");
    Entry e{item,
            item.need("name", "a layer name").string("a layer name"),
            item.need("kind", "a layer kind").choice(kLayerKinds, "a layer kind"),
            {}};
    std::vector<std::string_view> keys = {"name", "kind", "inputs"};
    for (std::string_view k : kind_keys(e.kind)) keys.push_back(k);
    if (e.kind != "input") keys.push_back("multi_token_prediction");
    item.check_keys(keys);
    if (by_name.count(e.name))
      item.need("name", "").fail(fmt::format("a layer named \"{}\" comes earlier", e.name));
    by_name.emplace(e.name, static_cast<int>(entries.size()));
    entries.push_back(std::move(e));
  }
  return entries;
}

// Each entry's inputs as entry indices: the named ones, or the layer before (an input layer: none).
void link_inputs(std::vector<Entry>& entries, const std::map<std::string, int, std::less<>>& by_name) {
  std::vector<std::string_view> names;
  for (const Entry& e : entries) names.push_back(e.name);
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    if (auto in = e.node.get("inputs")) {
      for (const Node& x : in->items("a list of layer names")) {
        const std::string ref = x.string("a layer name");
        auto it = by_name.find(ref);
        if (it == by_name.end()) {
          std::vector<std::string> close = close_matches(ref, names);
          x.fail(fmt::format("no layer is named \"{}\"{}", ref,
                             close.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", close.front())));
        }
        e.inputs.push_back(it->second);
      }
    } else if (e.kind != "input") {
      if (i == 0)
        e.node.fail(fmt::format("the first layer, \"{}\", needs `inputs` (or kind: input)", e.name));
      e.inputs.push_back(static_cast<int>(i) - 1);
    }
    if (e.kind == "input" && !e.inputs.empty()) e.node.get("inputs")->fail("an input layer takes no inputs");
  }
}

// A topological order of the named inputs; a cycle is named. Iterative depth-first search: the input
// controls the depth (a 100k-layer file listed last-first).
std::vector<int> build_order(const std::vector<Entry>& entries) {
  std::vector<int> state(entries.size(), 0), order;
  std::vector<std::pair<int, size_t>> stack;  // (layer, index of the next input to visit)
  for (size_t root = 0; root < entries.size(); ++root) {
    if (state[root] != 0) continue;
    state[root] = 1;
    stack.push_back({static_cast<int>(root), 0});
    while (!stack.empty()) {
      auto& [i, next] = stack.back();
      if (next == entries[i].inputs.size()) {
        state[i] = 2;
        order.push_back(i);
        stack.pop_back();
        continue;
      }
      const int in = entries[i].inputs[next++];
      if (state[in] == 2) continue;
      if (state[in] == 1) {
        // The stack runs from `in` through layers it takes input from; print the data flow instead.
        const auto from =
            std::find_if(stack.begin(), stack.end(), [&](const auto& f) { return f.first == in; });
        std::string cycle = entries[in].name;
        for (auto it = stack.end(); it != from + 1;) cycle += " -> " + entries[(--it)->first].name;
        entries[in].node.fail(fmt::format("the layers form a cycle: {} -> {}", cycle, entries[in].name));
      }
      state[in] = 1;
      stack.push_back({in, 0});
    }
  }
  return order;
}

// One entry's layer, from the builder's ids of its inputs.
Result<int> add_layer(ModelBuilder& b, const Entry& e, const std::vector<int>& in, Precision precision) {
  const Node& n = e.node;
  auto one = [&] {
    if (in.size() != 1) n.fail(fmt::format("a {} layer takes exactly 1 input, got {}", e.kind, in.size()));
    return in.front();
  };
  Result<int> r = Error{""};
  if (e.kind == "input") {
    r = b.input(e.name, shape_of(n.need("shape", "the input's shape, like [3, 224, 224]")));
  } else if (e.kind == "linear") {
    r = b.linear(e.name, one(), count(n, "in_features"), count(n, "out_features"), flag(n, "bias", true));
  } else if (e.kind == "conv2d") {
    ModelBuilder::Conv c{count(n, "in_channels"), count(n, "out_channels"),    count(n, "kernel"),
                         count(n, "stride", 1),   offset(n, "padding"),        count(n, "groups", 1),
                         flag(n, "bias", true),   flag(n, "batchnorm", false), flag(n, "relu", false)};
    r = b.conv2d(e.name, one(), c);
  } else if (e.kind == "maxpool" || e.kind == "avgpool") {
    const int64_t k = count(n, "kernel");
    r = b.pool(e.name, one(), k, count(n, "stride", k), offset(n, "padding"));
  } else if (e.kind == "adaptive_avgpool") {
    Shape o = shape_of(n.need("output", "the output size [height, width]"));
    if (o.size() != 2) n.get("output")->expected("the output size [height, width]");
    r = b.adaptive_pool(e.name, one(), o[0], o[1]);
  } else if (e.kind == "batchnorm" || e.kind == "layernorm") {
    r = b.norm(e.name, one(), e.kind == "layernorm");
  } else if (e.kind == "relu" || e.kind == "gelu" || e.kind == "dropout" || e.kind == "elementwise") {
    r = b.elementwise(e.name, e.kind, one());
  } else if (e.kind == "add") {
    r = b.add(e.name, in);
  } else if (e.kind == "concat") {
    r = b.concat(e.name, in);
  } else if (e.kind == "flatten") {
    r = b.flatten(e.name, one());
  } else if (e.kind == "lstm") {
    r = b.lstm(e.name, in, count(n, "hidden"), flag(n, "bidirectional", false));
  } else if (e.kind == "attention") {
    r = b.attention(e.name, in, count(n, "heads", 1));
  } else if (e.kind == "transformer_block") {
    const int64_t hidden = b.shape(one()).empty() ? 0 : b.shape(one()).back();
    r = b.transformer_block(e.name, one(), count(n, "heads"), count(n, "ffn", 4 * hidden));
  } else if (e.kind == "embedding") {
    r = b.embedding(e.name, one(), count(n, "vocabulary"), count(n, "dim"));
  } else if (e.kind == "embedding_bag") {
    r = b.embedding_bag(e.name, one(), count(n, "rows"), count(n, "dim"), count(n, "bag"),
                        flag(n, "pooled", true));
  } else {  // custom
    Layer costs = custom_costs(n);
    costs.parameter_bytes = costs.parameters * element_bytes(precision);
    Shape out = n.has("output_shape")
                    ? shape_of(*n.get("output_shape"))
                    : Shape{static_cast<int64_t>(costs.output_bytes / element_bytes(precision))};
    r = b.custom(e.name, in, costs, out);
  }
  return r;
}

// `tied_to` (linear, embedding, custom): the layer computes with the named layer's weight
// (Layer::tied_to). A linear's or an embedding's own matrix (in x out, vocabulary x dim) must be the
// source's whole weight and leaves its parameters; a custom layer's shares the source's whole weight.
void tie_weights(Workload& w, const std::vector<Entry>& entries,
                 const std::map<std::string, int, std::less<>>& by_name, const std::vector<int>& id) {
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::optional<Node> v = entries[i].node.get("tied_to");
    if (!v) continue;
    const std::string name = v->string("the name of the layer whose weight this one uses");
    const auto it = by_name.find(name);
    if (it == by_name.end())
      v->fail(
          fmt::format("expected the name of the layer whose weight this one uses, got \"{}\": no layer "
                      "has that name",
                      name));
    if (static_cast<size_t>(it->second) == i) v->fail("expected another layer's name, got the layer's own");
    const Entry& source = entries[static_cast<size_t>(it->second)];
    if (source.node.has("tied_to"))
      v->fail(
          fmt::format("expected a layer with a weight of its own, got \"{}\", itself tied_to another", name));
    Layer& l = w.graph[static_cast<size_t>(id[i])];
    const Layer& from = w.layer(static_cast<size_t>(id[static_cast<size_t>(it->second)]));
    // A linear's or an embedding's matrix (its bias apart); a custom layer's whole parameters.
    auto matrix = [](const Entry& e, const Layer& layer) {
      if (e.kind == "linear")
        return static_cast<double>(count(e.node, "in_features")) *
               static_cast<double>(count(e.node, "out_features"));
      if (e.kind == "embedding")
        return static_cast<double>(count(e.node, "vocabulary")) * static_cast<double>(count(e.node, "dim"));
      return layer.parameters;
    };
    const double have = matrix(source, from);
    const double weight = entries[i].kind == "custom" ? have : matrix(entries[i], l);
    if (have <= 0 || weight != have)
      v->fail(
          fmt::format("expected a layer whose weight is this {} layer's ({:.0f} parameters), got \"{}\" with "
                      "{:.0f}",
                      entries[i].kind, weight, name, have));
    if (entries[i].kind != "custom") l.parameters -= weight;  // counted at the source
    l.parameter_bytes = l.parameters * element_bytes(w.precision);
    l.tied_to = id[static_cast<size_t>(it->second)];
    l.tied_parameters = weight;
  }
}

// `multi_token_prediction: true`: the layer belongs to a multi-token-prediction module (DeepSeek-V3's;
// Megatron-Core's MTP layers, outside --num-layers): no partitioner counts such a transformer block among
// the model's, and the modules go with the head (docs/moe.md). Megatron-Core runs them after the last
// block, so no block outside a module may depend on one.
void mark_multi_token_prediction(Workload& w, const std::vector<Entry>& entries, const std::vector<int>& id) {
  std::vector<int> entry_of(w.layer_count(), -1);
  for (size_t i = 0; i < entries.size(); ++i) {
    entry_of[static_cast<size_t>(id[i])] = static_cast<int>(i);
    if (auto v = entries[i].node.get("multi_token_prediction"))
      w.graph[static_cast<size_t>(id[i])].multi_token_prediction = v->boolean();
  }
  // Each layer's first marked layer it depends on (itself if marked; -1: none), in one topological pass.
  std::vector<int> marked_source(w.layer_count(), -1);
  for (int v : topological_order(w)) {
    int& src = marked_source[static_cast<size_t>(v)];
    if (w.layer(v).multi_token_prediction) src = v;
    for (auto [it, end] = boost::in_edges(static_cast<size_t>(v), w.graph); it != end && src < 0; ++it)
      src = marked_source[boost::source(*it, w.graph)];
    if (src >= 0 && is_layout_block(w.layer(v)) && entry_of[static_cast<size_t>(src)] >= 0)
      entries[static_cast<size_t>(entry_of[static_cast<size_t>(src)])]
          .node.get("multi_token_prediction")
          ->fail(fmt::format(
              "expected a layer after the model's transformer blocks (Megatron-Core runs the "
              "multi-token-prediction modules after the last), got one that block \"{}\" depends on",
              w.layer(v).name));
  }
}

Workload parse_layers(const Node& layers, const std::string& name, Precision precision) {
  std::map<std::string, int, std::less<>> by_name;
  std::vector<Entry> entries = read_entries(layers, by_name);
  link_inputs(entries, by_name);
  const std::vector<int> order = build_order(entries);
  ModelBuilder b(name, precision);
  std::vector<int> id(entries.size(), -1);
  for (int i : order) {
    std::vector<int> in;
    for (int x : entries[i].inputs) in.push_back(id[x]);
    Result<int> r = add_layer(b, entries[i], in, precision);
    if (!r) entries[i].node.fail(r.error().message);
    id[i] = *r;
  }
  Workload w = b.finish();
  tie_weights(w, entries, by_name, id);
  mark_multi_token_prediction(w, entries, id);
  return w;
}

Workload load_model_file(const Node& where, const std::string& path, std::optional<Precision> precision) {
  Document doc;
  try {
    doc = load_document_file(path);
  } catch (const InputError& e) {
    // A missing or unreadable file is the referencing key's error; a syntax error is the file's.
    if (std::string(e.what()).rfind("cannot read", 0) == 0) where.fail(e.what());
    throw;
  }
  return parse_model_document(doc, precision);
}

Workload parse_model_document(const Document& doc, std::optional<Precision> precision) {
  Node root = Node::root(doc);
  if (root.is_null()) root.fail("expected a model (a mapping with a `layers` list), got an empty document");
  root.require_map("a model: a mapping with a `layers` list");
  root.check_keys({"name", "precision", "micro_batch_size", "layers"});
  std::string name = root.has("name") ? root.get("name")->string("a model name") : std::string("model");
  Precision p = Precision::FP32;
  if (auto pr = root.get("precision")) p = *parse_precision(pr->choice(precision_names(), "a precision"));
  if (precision) p = *precision;
  Workload w = parse_layers(root.need("layers", "a list of layers"), name, p);
  if (auto m = root.get("micro_batch_size"))
    w.micro_batch_size = static_cast<double>(m->integer(1, kMaxCount, "a positive integer"));
  return w;
}

Result<Workload> load_model_text(const std::string& text, const std::string& name,
                                 std::optional<Precision> precision) {
  try {
    return parse_model_document(load_document_text(text, name), precision);
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

Result<Workload> load_model_file(const std::string& path, std::optional<Precision> precision) {
  try {
    Document doc{"<command line>", YAML::Node()};
    Node where = Node::root(doc);
    return load_model_file(where, path, precision);
  } catch (const InputError& e) {
    std::string msg = e.what();
    const std::string prefix = "<command line>: ";
    if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
    return Error{msg};
  }
}

}  // namespace pipegrid::input
