#include "core/models/builder.h"

#include <fmt/format.h>

#include <numeric>

namespace pipegrid {

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

ModelBuilder::ModelBuilder(std::string name, Precision precision) {
  w_.name = std::move(name);
  w_.precision = precision;
}

double ModelBuilder::elems(const Shape& s) const {
  double n = 1;
  for (int64_t d : s) n *= static_cast<double>(d);
  return n;
}

int ModelBuilder::add_layer(Layer l, Shape out, const std::vector<int>& in) {
  l.output_bytes = bytes(out);
  const int id = w_.add_layer(std::move(l));
  shapes_.push_back(std::move(out));
  for (int i : in) w_.add_edge(i, id);
  return id;
}

Error ModelBuilder::mismatch(const std::string& name, const std::string& expected, int in) const {
  return Error{fmt::format("layer \"{}\" expects {}, but \"{}\" produces {}", name, expected, this->name(in),
                           shape_text(shape(in)))};
}

int ModelBuilder::input(const std::string& name, Shape shape) {
  Layer l;
  l.name = name;
  l.kind = "input";
  return add_layer(std::move(l), std::move(shape), {});
}

Result<int> ModelBuilder::linear(const std::string& name, int in, int64_t in_features, int64_t out_features,
                                 bool bias) {
  const Shape& s = shape(in);
  if (s.empty() || s.back() != in_features)
    return mismatch(name, fmt::format("{} input features (last dimension)", in_features), in);
  Shape out = s;
  out.back() = out_features;
  const double rows = elems(s) / static_cast<double>(in_features);
  Layer l;
  l.name = name;
  l.kind = "linear";
  l.forward_flops = 2.0 * rows * in_features * out_features;
  l.backward_input_flops = l.forward_flops;
  l.backward_weight_flops = l.forward_flops;
  l.forward_bytes = bytes(s) + bytes(out);
  l.backward_bytes = 2 * l.forward_bytes;
  l.parameters = static_cast<double>(in_features) * out_features + (bias ? out_features : 0);
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  l.stash_bytes = bytes(out);
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::conv2d(const std::string& name, int in, const Conv& c) {
  const Shape& s = shape(in);
  if (s.size() != 3 || s[0] != c.in_channels)
    return mismatch(name, fmt::format("[{}, H, W] (channels, height, width)", c.in_channels), in);
  if (c.groups < 1 || c.in_channels % c.groups || c.out_channels % c.groups)
    return Error{fmt::format("layer \"{}\": {} groups do not divide {} and {} channels", name, c.groups,
                             c.in_channels, c.out_channels)};
  const int64_t h = (s[1] + 2 * c.padding - c.kernel) / c.stride + 1;
  const int64_t w = (s[2] + 2 * c.padding - c.kernel) / c.stride + 1;
  if (h < 1 || w < 1)
    return Error{fmt::format("layer \"{}\": a {}x{} kernel does not fit its input {}", name, c.kernel,
                             c.kernel, shape_text(s))};
  Shape out{c.out_channels, h, w};
  Layer l;
  l.name = name;
  l.kind = "conv2d";
  const double macs =
      static_cast<double>(c.out_channels) * (c.in_channels / c.groups) * c.kernel * c.kernel * h * w;
  l.forward_flops = 2 * macs;
  l.backward_input_flops = l.forward_flops;
  l.backward_weight_flops = l.forward_flops;
  l.forward_bytes = bytes(s) + bytes(out) * (c.batchnorm ? 2 : 1);
  l.backward_bytes = 2 * l.forward_bytes;
  l.parameters = static_cast<double>(c.out_channels) * (c.in_channels / c.groups) * c.kernel * c.kernel +
                 (c.bias ? c.out_channels : 0) + (c.batchnorm ? 2 * c.out_channels : 0);
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  l.stash_bytes = bytes(out) * (c.batchnorm ? 2 : 1);  // the BatchNorm input too
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::pool(const std::string& name, int in, int64_t kernel, int64_t stride,
                               int64_t padding) {
  const Shape& s = shape(in);
  if (s.size() != 3) return mismatch(name, "[C, H, W]", in);
  const int64_t h = (s[1] + 2 * padding - kernel) / stride + 1;
  const int64_t w = (s[2] + 2 * padding - kernel) / stride + 1;
  if (h < 1 || w < 1)
    return Error{fmt::format("layer \"{}\": a {}x{} window does not fit its input {}", name, kernel, kernel,
                             shape_text(s))};
  Shape out{s[0], h, w};
  Layer l;
  l.name = name;
  l.kind = "pool";
  l.forward_bytes = bytes(s) + bytes(out);
  l.backward_bytes = l.forward_bytes;
  l.stash_bytes = bytes(out);
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::adaptive_pool(const std::string& name, int in, int64_t out_h, int64_t out_w) {
  const Shape& s = shape(in);
  if (s.size() != 3) return mismatch(name, "[C, H, W]", in);
  Shape out{s[0], out_h, out_w};
  Layer l;
  l.name = name;
  l.kind = "pool";
  l.forward_bytes = bytes(s) + bytes(out);
  l.backward_bytes = l.forward_bytes;
  l.stash_bytes = 0;
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::norm(const std::string& name, int in, bool layernorm) {
  const Shape& s = shape(in);
  if (s.empty()) return mismatch(name, "a tensor", in);
  Layer l;
  l.name = name;
  l.kind = layernorm ? "layernorm" : "batchnorm";
  l.parameters = 2.0 * static_cast<double>(layernorm ? s.back() : s.front());
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  l.forward_bytes = 2 * bytes(s);
  l.backward_bytes = 3 * bytes(s);
  l.stash_bytes = bytes(s);
  return add_layer(std::move(l), s, {in});
}

Result<int> ModelBuilder::elementwise(const std::string& name, const std::string& kind, int in) {
  const Shape& s = shape(in);
  Layer l;
  l.name = name;
  l.kind = kind;
  l.forward_bytes = 2 * bytes(s);
  l.backward_bytes = 2 * bytes(s);
  l.stash_bytes = bytes(s);
  return add_layer(std::move(l), s, {in});
}

Result<int> ModelBuilder::add(const std::string& name, const std::vector<int>& in) {
  if (in.size() < 2)
    return Error{fmt::format("layer \"{}\" (add) needs at least 2 inputs, got {}", name, in.size())};
  for (int i : in)
    if (shape(i) != shape(in.front()))
      return mismatch(name, shape_text(shape(in.front())) + " like its first input", i);
  Layer l;
  l.name = name;
  l.kind = "add";
  l.forward_bytes = static_cast<double>(in.size() + 1) * bytes(shape(in.front()));
  l.backward_bytes = l.forward_bytes;
  return add_layer(std::move(l), shape(in.front()), in);
}

Result<int> ModelBuilder::concat(const std::string& name, const std::vector<int>& in) {
  if (in.size() < 2)
    return Error{fmt::format("layer \"{}\" (concat) needs at least 2 inputs, got {}", name, in.size())};
  Shape out = shape(in.front());
  if (out.empty()) return mismatch(name, "a tensor", in.front());
  for (size_t k = 1; k < in.size(); ++k) {
    const Shape& s = shape(in[k]);
    if (s.size() != out.size() || !std::equal(s.begin(), s.end() - 1, out.begin()))
      return mismatch(name,
                      fmt::format("{} with any last dimension, like its first input",
                                  shape_text(Shape(out.begin(), out.end() - 1)) + "[..., *]"),
                      in[k]);
    out.back() += s.back();
  }
  Layer l;
  l.name = name;
  l.kind = "concat";
  l.forward_bytes = 2 * bytes(out);
  l.backward_bytes = l.forward_bytes;
  return add_layer(std::move(l), std::move(out), in);
}

Result<int> ModelBuilder::flatten(const std::string& name, int in) {
  Layer l;
  l.name = name;
  l.kind = "flatten";
  return add_layer(std::move(l), Shape{static_cast<int64_t>(elems(shape(in)))}, {in});
}

Result<int> ModelBuilder::lstm(const std::string& name, const std::vector<int>& in, int64_t hidden,
                               bool bidirectional) {
  if (in.empty()) return Error{fmt::format("layer \"{}\" (lstm) needs an input", name)};
  // Several inputs are concatenated along the features (GNMT's decoder: previous layer + context).
  const int64_t steps = shape(in.front()).empty() ? 0 : shape(in.front()).front();
  int64_t features = 0;
  for (int i : in) {
    const Shape& s = shape(i);
    if (s.size() != 2 || s[0] != steps)
      return mismatch(name, fmt::format("[{}, features] (steps, features)", steps), i);
    features += s[1];
  }
  const double dirs = bidirectional ? 2 : 1;
  Layer l;
  l.name = name;
  l.kind = "lstm";
  const double per_token = 8.0 * hidden * (features + hidden);  // 4 gates of (i + h) x h, 2 FLOP per MAC
  l.forward_flops = dirs * per_token * steps;
  l.backward_input_flops = l.forward_flops;
  l.backward_weight_flops = l.forward_flops;
  l.parameters = dirs * (4.0 * hidden * (features + hidden) + 8.0 * hidden);
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  Shape out{steps, static_cast<int64_t>(dirs) * hidden};
  l.forward_bytes = dirs * steps * (features + 6.0 * hidden) * element_bytes(w_.precision);
  l.backward_bytes = 2 * l.forward_bytes;
  l.stash_bytes = dirs * steps * 6.0 * hidden * element_bytes(w_.precision);  // 4 gates + cell + hidden
  return add_layer(std::move(l), std::move(out), in);
}

Result<int> ModelBuilder::attention(const std::string& name, const std::vector<int>& in, int64_t heads) {
  if (in.size() == 2) {
    // Additive (Bahdanau, normalised as in GNMT) attention of a query sequence over a memory.
    const Shape& q = shape(in[0]);
    const Shape& m = shape(in[1]);
    if (q.size() != 2) return mismatch(name, "a query [steps, hidden]", in[0]);
    if (m.size() != 2 || m[1] != q[1])
      return mismatch(name, fmt::format("a memory [steps, {}]", q[1]), in[1]);
    const double h = static_cast<double>(q[1]), tq = static_cast<double>(q[0]),
                 tm = static_cast<double>(m[0]);
    Layer l;
    l.name = name;
    l.kind = "attention";
    const double projections = 2 * tq * h * h + 2 * tm * h * h;
    l.forward_flops = projections + 4 * tq * tm * h;
    l.backward_weight_flops = projections;
    l.backward_input_flops = projections + 8 * tq * tm * h;
    l.parameters = 2 * h * h + 2 * h + 1;  // query and key projections, score vector, bias, scale
    l.parameter_bytes = l.parameters * element_bytes(w_.precision);
    l.weight_bytes = l.parameter_bytes;
    l.forward_bytes = (2 * tq * h + 2 * tm * h + tq * tm) * element_bytes(w_.precision);
    l.backward_bytes = 2 * l.forward_bytes;
    l.stash_bytes = (tq * h + tm * h + tq * tm) * element_bytes(w_.precision);
    return add_layer(std::move(l), q, in);
  }
  if (in.size() != 1)
    return Error{fmt::format("layer \"{}\" (attention) needs 1 or 2 inputs, got {}", name, in.size())};
  const Shape& s = shape(in[0]);
  if (s.size() != 2) return mismatch(name, "[sequence, hidden]", in[0]);
  if (heads < 1 || s[1] % heads)
    return Error{fmt::format("layer \"{}\": {} heads do not divide the hidden size {}", name, heads, s[1])};
  const double seq = static_cast<double>(s[0]), h = static_cast<double>(s[1]);
  Layer l;
  l.name = name;
  l.kind = "attention";
  const double projections = 8 * seq * h * h;  // Q, K, V and output
  const double scores = 4 * seq * seq * h;     // Q K^T and attention x V
  l.forward_flops = projections + scores;
  l.backward_weight_flops = projections;
  l.backward_input_flops = projections + 2 * scores;
  l.parameters = 4 * h * h + 4 * h;
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.weight_bytes = l.parameter_bytes;
  const double eb = element_bytes(w_.precision);
  l.forward_bytes = (6 * seq * h + 2 * heads * seq * seq) * eb;
  l.backward_bytes = 2 * l.forward_bytes;
  // Korthikanti et al. for the attention half of a block: 11 s h + 5 a s^2 bytes at 16 bits.
  l.stash_bytes = (11 * seq * h + 5 * heads * seq * seq) * eb / 2;
  l.selective_stash_bytes = 11 * seq * h * eb / 2;
  l.selective_recompute_fraction = scores / l.forward_flops;
  return add_layer(std::move(l), s, in);
}

Result<int> ModelBuilder::transformer_block(const std::string& name, int in, int64_t heads, int64_t ffn) {
  const Shape& s = shape(in);
  if (s.size() != 2) return mismatch(name, "[sequence, hidden]", in);
  if (heads < 1 || s[1] % heads)
    return Error{fmt::format("layer \"{}\": {} heads do not divide the hidden size {}", name, heads, s[1])};
  const double seq = static_cast<double>(s[0]), h = static_cast<double>(s[1]), f = static_cast<double>(ffn);
  const double eb = element_bytes(w_.precision);
  Layer l;
  l.name = name;
  l.kind = "transformer_block";
  const double weighted = 8 * seq * h * h + 4 * seq * h * f;  // QKV, output projection, two MLP matrices
  const double scores = 4 * seq * seq * h;
  l.forward_flops = weighted + scores;
  l.backward_weight_flops = weighted;
  l.backward_input_flops = weighted + 2 * scores;
  l.parameters = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h;  // attention, MLP, two LayerNorms
  l.parameter_bytes = l.parameters * eb;
  l.weight_bytes = l.parameter_bytes;
  l.forward_bytes = (10 * seq * h + 2 * seq * f + 2 * heads * seq * seq) * eb;
  l.backward_bytes = 2 * l.forward_bytes;
  // Korthikanti et al. 2022: s h (34 + 5 a s / h) bytes at 16 bits; 34 s h with selective
  // recomputation of the attention core (its scores re-run in the backward).
  l.stash_bytes = seq * h * (34 + 5 * heads * seq / h) * eb / 2;
  l.selective_stash_bytes = 34 * seq * h * eb / 2;
  l.selective_recompute_fraction = scores / l.forward_flops;
  return add_layer(std::move(l), s, {in});
}

Result<int> ModelBuilder::embedding(const std::string& name, int in, int64_t vocabulary, int64_t dim) {
  const Shape& s = shape(in);
  if (s.size() != 1) return mismatch(name, "[tokens] (token ids)", in);
  Shape out{s[0], dim};
  Layer l;
  l.name = name;
  l.kind = "embedding";
  l.parameters = static_cast<double>(vocabulary) * dim;
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  l.forward_bytes = 2 * bytes(out);   // gather the rows, write the output
  l.backward_bytes = 2 * bytes(out);  // scatter-add the gradients
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::embedding_bag(const std::string& name, int in, int64_t rows, int64_t dim,
                                        int64_t bag, bool pooled) {
  Shape out{pooled ? dim : bag * dim};
  Layer l;
  l.name = name;
  l.kind = "embedding_bag";
  l.parameters = static_cast<double>(rows) * dim;
  l.parameter_bytes = l.parameters * element_bytes(w_.precision);
  const double looked_up = static_cast<double>(bag) * dim * element_bytes(w_.precision);
  l.forward_bytes = looked_up + bytes(out);
  l.backward_bytes = looked_up + bytes(out);
  return add_layer(std::move(l), std::move(out), {in});
}

Result<int> ModelBuilder::custom(const std::string& name, const std::vector<int>& in, const Layer& costs,
                                 Shape output) {
  Layer l = costs;
  l.name = name;
  if (l.kind.empty()) l.kind = "custom";
  const double given_output = l.output_bytes;
  int id = add_layer(std::move(l), std::move(output), in);
  if (given_output > 0) w_.graph[id].output_bytes = given_output;
  return id;
}

Workload ModelBuilder::finish(double default_micro_batch_size) {
  w_.micro_batch_size = default_micro_batch_size;
  w_.input_bytes_per_sample = 0;
  for (size_t i = 0; i < w_.layer_count(); ++i)
    if (w_.layer(i).kind == "input") w_.input_bytes_per_sample += w_.layer(i).output_bytes;
  shapes_.clear();
  return std::move(w_);
}

}  // namespace pipegrid
