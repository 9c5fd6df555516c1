#include "tools/input/workload_yaml.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/models/builder.h"
#include "core/models/chain.h"
#include "core/models/pipedream_profile.h"
#include "core/models/zoo.h"
#include "tools/input/device_yaml.h"
#include "tools/input/model_yaml.h"

namespace pipegrid::input {
namespace {

// Keys every form of the workload section takes besides its own.
const std::vector<std::string_view> kCommon = {"micro_batch_size", "optimizer_step"};

std::vector<std::string_view> with_common(std::vector<std::string_view> keys) {
  keys.insert(keys.end(), kCommon.begin(), kCommon.end());
  return keys;
}

std::optional<Precision> precision_of(const Node& n) {
  if (auto p = n.get("precision")) return *parse_precision(p->choice(precision_names(), "a precision"));
  return std::nullopt;
}

Workload parse_chain(const Node& n) {
  n.check_keys({"kind", "layers", "forward", "backward", "backward_weight", "activation", "parameters",
                "samples_per_micro_batch", "optimizer_step", "precision"});
  ChainSpec c;
  c.layers = static_cast<int>(
      n.need("layers", "a positive integer")
          .integer(1, kMaxLayers, fmt::format("a positive integer, at most {}", kMaxLayers)));
  c.forward_s = n.need("forward", describe(Dimension::Time, "non-negative"))
                    .quantity(Dimension::Time, Sign::NonNegative);
  c.backward_s = n.need("backward", describe(Dimension::Time, "non-negative"))
                     .quantity(Dimension::Time, Sign::NonNegative);
  if (auto bw = n.get("backward_weight")) {
    c.backward_weight_s = bw->quantity(Dimension::Time, Sign::NonNegative);
    if (c.backward_weight_s > c.backward_s)
      bw->fail(fmt::format("expected at most the whole backward ({}), got \"{}\"", format_time(c.backward_s),
                           bw->yaml().Scalar()));
  }
  c.activation_bytes = n.need("activation", describe(Dimension::Bytes, "non-negative"))
                           .quantity(Dimension::Bytes, Sign::NonNegative);
  c.parameter_bytes = n.need("parameters", describe(Dimension::Bytes, "non-negative"))
                          .quantity(Dimension::Bytes, Sign::NonNegative);
  if (auto s = n.get("samples_per_micro_batch"))
    c.samples_per_micro_batch = static_cast<double>(s->integer(1, kMaxCount, "a positive integer"));
  if (auto s = n.get("optimizer_step")) c.optimizer_step_s = s->quantity(Dimension::Time, Sign::NonNegative);
  if (auto p = precision_of(n)) c.precision = *p;
  return make_chain(c);
}

// workload: {model: resnet50, micro_batch_size: 32, precision: fp16, <the model's parameters>}
Workload parse_model(const Node& n) {
  const Node name = n.need("model", "a model name");
  std::vector<std::string_view> models;
  for (const ModelInfo& m : model_zoo()) models.push_back(m.name);
  const std::string which = name.choice(models, "a model from the zoo");
  const ModelInfo* info = *find_model(which);
  std::vector<std::string_view> keys = with_common({"model", "precision", "attention", "kernel_fusion"});
  for (const auto& d : info->defaults) keys.push_back(d.first);
  n.check_keys(keys);
  ModelArgs args;
  for (const auto& d : info->defaults)
    if (auto v = n.get(d.first)) {
      const ParameterRange range = parameter_range(d.first);
      args[std::string(d.first)] = static_cast<double>(v->integer(range.lo, range.hi, range.text()));
    }
  Result<Workload> w = build_model(*info, args, precision_of(n).value_or(Precision::FP32));
  if (!w) {
    // An error about a parameter names it ("model X: router_group_topk 2 limits ...", "layer
    // \"layer0\": top_k must be ..."): located at the first parameter it names that the file gives,
    // else at the workload.
    const std::string& message = w.error().message;
    const std::string prefix = fmt::format("model {}: ", info->name);
    const std::string rest = message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
    for (size_t i = 0; i < rest.size();) {
      const size_t end = rest.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_", i);
      const std::string word = rest.substr(i, end == std::string::npos ? std::string::npos : end - i);
      const bool parameter = std::any_of(info->defaults.begin(), info->defaults.end(),
                                         [&](const auto& d) { return d.first == word; });
      if (parameter)
        if (auto k = n.get(word); k && k->is_scalar()) k->fail(message);
      if (end == std::string::npos) break;
      i = end + 1;
    }
    n.fail(message);
  }
  // How the attention core runs (core/models/builder.h): unfused, as the published rows ran, or
  // fused (FlashAttention).
  if (auto a = n.get("attention")) {
    const bool fused = a->choice({"unfused", "fused"}, "an attention implementation") == "fused";
    if (Status st = use_attention(*w, fused ? AttentionImpl::Fused : AttentionImpl::Unfused); !st)
      a->fail(st.error().message);
  }
  // Element-wise kernels as Megatron-LM fuses them (after use_attention: the blocks are rebuilt).
  if (auto f = n.get("kernel_fusion")) {
    if (f->choice({"none", "megatron"}, "a kernel fusion") == "megatron") {
      if (Status st = use_megatron_fusion(*w); !st) f->fail(st.error().message);
    } else {
      use_unfused_elementwise(*w);  // the MoE zoo's blocks are built fused
    }
  }
  return std::move(*w);
}

// workload: {profile: graph.txt, batch: 128, device: v100}
Workload parse_profile(const Node& n) {
  n.check_keys(with_common({"profile", "batch", "device"}));
  const Node file = n.need("profile", "a path to a PipeDream profile (graph.txt)");
  const std::string path = resolve_path(file.document(), file.string("a path to a PipeDream profile"));
  ProfileOptions o;
  if (auto b = n.get("batch")) o.batch = static_cast<double>(b->integer(1, kMaxCount, "a positive integer"));
  if (auto d = n.get("device")) {
    o.device_kind = d->string("a device kind (catalog name), or \"any\"");
    // A kind no device has (a catalog name or "custom", a device given by its figures) matches none.
    if (std::string problem = profile_device_kind_problem(o.device_kind); !problem.empty()) d->fail(problem);
    if (o.device_kind == "any") o.device_kind.clear();
  }
  Result<Workload> w = parse_pipedream_profile(read_referenced_file(file, path), path, o);
  if (!w) throw InputError(w.error().message);  // names the profile's file and line
  return std::move(*w);
}

}  // namespace

Workload parse_workload(const Node& n) {
  n.require_map("a mapping describing the workload");
  const std::vector<std::string_view> forms = {"kind", "model", "file", "profile", "layers"};
  std::vector<std::string_view> present;
  for (std::string_view f : forms)
    // A chain's `layers` and a zoo model's `layers` (gpt, mmt, ...) are counts, not a layer list.
    if (n.has(f) && !(f == "layers" && (n.has("kind") || n.has("model")))) present.push_back(f);
  if (present.size() != 1)
    n.fail(present.empty()
               ? "expected one of kind: chain, model: NAME, file: MODEL.yaml, profile: GRAPH.txt or layers: "
                 "[...], "
                 "got none of them"
               : fmt::format("expected one of kind, model, file, profile or layers, got both {} and {}",
                             present[0], present[1]));
  Workload w;
  const std::string_view form = present.front();
  if (form == "kind") {
    n.need("kind", "a workload kind (chain)").choice({"chain"}, "a workload kind");
    return parse_chain(n);  // the chain has its own micro-batch key (samples_per_micro_batch)
  }
  if (form == "model") {
    w = parse_model(n);
  } else if (form == "profile") {
    w = parse_profile(n);
  } else if (form == "file") {
    n.check_keys(with_common({"file", "precision"}));
    const Node file = n.need("file", "a path to a model file (YAML)");
    w = load_model_file(file, resolve_path(file.document(), file.string("a path to a model file")),
                        precision_of(n));
  } else {
    n.check_keys(with_common({"layers", "name", "precision"}));
    w = parse_layers(*n.get("layers"), n.has("name") ? n.get("name")->string("a model name") : "model",
                     precision_of(n).value_or(Precision::FP32));
  }
  if (auto m = n.get("micro_batch_size"))
    w.micro_batch_size = static_cast<double>(m->integer(1, kMaxCount, "a positive integer"));
  if (auto s = n.get("optimizer_step")) w.optimizer_step_s = s->quantity(Dimension::Time, Sign::NonNegative);
  return w;
}

}  // namespace pipegrid::input
