#include "core/memory.h"

#include <algorithm>

namespace pipegrid {

std::string_view to_string(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Weights:
      return "weights";
    case MemoryCategory::Gradients:
      return "gradients";
    case MemoryCategory::OptimizerState:
      return "optimizer";
    case MemoryCategory::Activations:
      return "activations";
    case MemoryCategory::Workspace:
      return "workspace";
  }
  return "?";
}

std::string_view to_string(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Full:
      return "full";
    case Recompute::Selective:
      return "selective";
  }
  return "?";
}

bool* module_flag(RecomputeModules& m, std::string_view name) {
  bool* flags[] = {&m.core_attn, &m.moe_act, &m.layernorm, &m.mla_up_proj, &m.mlp, &m.shared_experts};
  for (size_t i = 0; i < kRecomputeModuleNames.size(); ++i)
    if (kRecomputeModuleNames[i] == name) return flags[i];
  return nullptr;
}

std::string to_string(const RecomputeModules& m) {
  RecomputeModules copy = m;
  std::string out;
  for (std::string_view name : kRecomputeModuleNames)
    if (*module_flag(copy, name)) out += (out.empty() ? "" : ", ") + std::string(name);
  return out.empty() ? "none" : out;
}

std::optional<Recompute> parse_recompute(std::string_view s) {
  for (Recompute r : {Recompute::None, Recompute::Full, Recompute::Selective})
    if (to_string(r) == s) return r;
  return std::nullopt;
}

std::string_view to_string(GradAccumulation g) {
  switch (g) {
    case GradAccumulation::Fused:
      return "fused";
    case GradAccumulation::Unfused:
      return "unfused";
    case GradAccumulation::MainGrad:
      return "main-grad";
  }
  return "?";
}

std::optional<GradAccumulation> parse_grad_accumulation(std::string_view s) {
  for (GradAccumulation g : {GradAccumulation::Fused, GradAccumulation::Unfused, GradAccumulation::MainGrad})
    if (to_string(g) == s) return g;
  return std::nullopt;
}

std::string_view to_string(Optimizer o) {
  switch (o) {
    case Optimizer::SGD:
      return "sgd";
    case Optimizer::Momentum:
      return "momentum";
    case Optimizer::Adam:
      return "adam";
    case Optimizer::MixedAdam:
      return "mixed-adam";
  }
  return "?";
}

std::optional<Optimizer> parse_optimizer(std::string_view s) {
  for (Optimizer o : {Optimizer::SGD, Optimizer::Momentum, Optimizer::Adam, Optimizer::MixedAdam})
    if (to_string(o) == s) return o;
  return std::nullopt;
}

int optimizer_state_tensors(Optimizer o) {
  return o == Optimizer::SGD ? 0 : o == Optimizer::Momentum ? 1 : 2;
}

MemoryBytes static_memory(double parameters, double parameter_bytes, const MemoryOptions& o) {
  MemoryBytes m{};
  auto& w = m[static_cast<int>(MemoryCategory::Weights)];
  auto& g = m[static_cast<int>(MemoryCategory::Gradients)];
  auto& s = m[static_cast<int>(MemoryCategory::OptimizerState)];
  if (o.bytes_per_parameter) {
    // Weights and gradients as stored; whatever is left of the given total is optimizer state.
    w = parameter_bytes;
    g = parameter_bytes;
    s = *o.bytes_per_parameter * parameters - 2 * parameter_bytes;
    if (s < 0) {
      g = *o.bytes_per_parameter * parameters - parameter_bytes;
      s = 0;
    }
    return m;
  }
  const int state = optimizer_state_tensors(o.optimizer);
  // A state tensor's bytes: the moments' precision where given, else fp32 under mixed precision and
  // the weights' own otherwise.
  const auto state_bytes = [&](double fallback) {
    return o.moment_bytes > 0 ? o.moment_bytes * parameters * state : fallback * state;
  };
  const double master = (o.master_bytes > 0 ? o.master_bytes : 4) * parameters;
  if (o.optimizer == Optimizer::MixedAdam) {
    // fp16/bf16 working weights and gradients, fp32 master weights and state.
    w = 2 * parameters;
    g = 2 * parameters;
    s = master + state_bytes(4 * parameters);
  } else if (o.mixed_precision) {
    // Working weights and gradients as stored; fp32 master weights and fp32 state tensors.
    w = parameter_bytes;
    g = parameter_bytes;
    s = master + state_bytes(4 * parameters);
  } else {
    w = parameter_bytes;
    g = parameter_bytes;
    s = state_bytes(parameter_bytes);
  }
  g = std::max(g, o.gradient_bytes * parameters);
  return m;
}

}  // namespace pipegrid
