#include "core/model_flops.h"

#include <algorithm>

#include "core/tensor_parallel.h"

namespace pipegrid {

namespace {

// 6 s x heads x (d_qk + d_v) for one block: QK^T and the product with V, 2 FLOPs per multiply-add,
// times 3 for the forward and the backward (two products per product).
double attention_flops(const TensorSplit& s) {
  const double head = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  const double qk = s.mla.enabled() ? head + s.mla.rope_dim : head;
  const double v = s.mla.enabled() ? s.mla.v_dim : head;
  const double keys = s.window > 0 ? std::min(s.window, s.sequence) : s.sequence;
  return 6 * keys * s.heads * (qk + v);
}

}  // namespace

std::optional<ModelFlops> model_flops(const Workload& w) {
  ModelFlops f;
  f.total_parameters = total_parameters(w);
  for (size_t l = 0; l < w.layer_count(); ++l) {
    const Layer& layer = w.layer(static_cast<int>(l));
    const TensorSplit& s = layer.split;
    if (is_block(s.kind)) {
      ++f.blocks;
      f.sequence = s.sequence;
      f.moe = f.moe || s.kind == TensorSplitKind::MoeBlock;
      f.active_parameters += block_active_parameters(s);
      f.attention_flops_per_token += attention_flops(s);
    } else if (s.kind == TensorSplitKind::VocabHead) {
      f.active_parameters += s.vocabulary * s.hidden;
    } else if (layer.multi_token_prediction && layer.kind == "linear") {
      f.active_parameters += layer.parameters;  // a multi-token-prediction module's eh_proj: every token
    }
  }
  if (f.blocks == 0 || !(f.sequence > 0)) return std::nullopt;
  return f;
}

}  // namespace pipegrid
