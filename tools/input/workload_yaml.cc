#include "tools/input/workload_yaml.h"

#include <fmt/format.h>

#include "core/models/chain.h"

namespace pipegrid::input {
namespace {

Workload parse_chain(const Node& n) {
  n.check_keys({"kind", "layers", "forward", "backward", "backward_weight", "activation", "parameters",
                "samples_per_micro_batch", "optimizer_step", "precision"});
  ChainSpec c;
  c.layers = static_cast<int>(n.need("layers", "a positive integer").integer(1, kMaxCount, "a positive integer"));
  c.forward_s = n.need("forward", describe(Dimension::Time, "non-negative")).quantity(Dimension::Time, Sign::NonNegative);
  c.backward_s = n.need("backward", describe(Dimension::Time, "non-negative")).quantity(Dimension::Time, Sign::NonNegative);
  if (auto bw = n.get("backward_weight")) {
    c.backward_weight_s = bw->quantity(Dimension::Time, Sign::NonNegative);
    if (c.backward_weight_s > c.backward_s)
      bw->fail(fmt::format("expected at most the whole backward ({}), got \"{}\"", format_time(c.backward_s),
                           bw->yaml().Scalar()));
  }
  c.activation_bytes =
      n.need("activation", describe(Dimension::Bytes, "non-negative")).quantity(Dimension::Bytes, Sign::NonNegative);
  c.parameter_bytes =
      n.need("parameters", describe(Dimension::Bytes, "non-negative")).quantity(Dimension::Bytes, Sign::NonNegative);
  if (auto s = n.get("samples_per_micro_batch"))
    c.samples_per_micro_batch = static_cast<double>(s->integer(1, kMaxCount, "a positive integer"));
  if (auto s = n.get("optimizer_step")) c.optimizer_step_s = s->quantity(Dimension::Time, Sign::NonNegative);
  if (auto p = n.get("precision")) c.precision = *parse_precision(p->choice({"fp32", "fp16", "bf16", "int8"}, "a precision"));
  return make_chain(c);
}

}  // namespace

Workload parse_workload(const Node& n) {
  n.require_map("a mapping describing the workload");
  n.need("kind", "a workload kind (chain)").choice({"chain"}, "a workload kind");
  return parse_chain(n);
}

}  // namespace pipegrid::input
