// Model FLOPs per token (core/model_flops.h) against hand counts from the models' configurations and
// against Megatron-LM's eq. 3 (Narayanan et al., arXiv 2104.04473) written out independently.
#include <doctest/doctest.h>

#include <cmath>

#include "core/model_flops.h"
#include "core/models/zoo.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using pipegrid::testing::close_rel;

namespace {

Workload model(const char* name, const ModelArgs& args = {}) {
  Result<const ModelInfo*> info = find_model(name);
  REQUIRE(info.ok());
  Result<Workload> w = build_model(**info, args, Precision::AMP_BF16);
  if (!w) FAIL(w.error().message);
  return std::move(*w);
}

}  // namespace

TEST_CASE("model FLOPs: GPT-3 175B is 6 N + 12 L h s per token, Megatron's eq. 3 to 1e-4") {
  const double L = 96, h = 12288, s = 2048, V = 50257;
  const std::optional<ModelFlops> f = model_flops(model("gpt3-175b"));
  REQUIRE(f.has_value());
  // A GPT block: QKV and output projections 4h^2 + 4h biases, MLP 8h^2 + 5h biases, two LayerNorms
  // 4h; the tied head multiplies by the V x h embedding.
  const double block = 12 * h * h + 13 * h;
  CHECK(close_rel(f->active_parameters, L * block + V * h, 1e-12));
  CHECK(close_rel(f->attention_flops_per_token, 12 * L * h * s, 1e-12));
  CHECK(f->blocks == 96);
  CHECK(f->sequence == s);
  CHECK_FALSE(f->moe);
  // Megatron's eq. 3 without the recomputed forward: 72 B s l h^2 (1 + s / 6h + V / 12lh) per batch
  // of B sequences; it leaves out biases and norms (13h per block), hence 1e-4.
  const double megatron = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
  CHECK(close_rel(f->flops_per_token(), megatron, 1e-4));
  CHECK_FALSE(close_rel(f->flops_per_token(), megatron, 1e-6));
  // The 6 N count search prints beside it: every parameter (the positions' s x h too).
  CHECK(close_rel(f->total_parameters, L * block + V * h + s * h + 2 * h, 1e-12));
}

TEST_CASE("model FLOPs: Mixtral 8x7B counts the active parameters (top 2 of 8 experts)") {
  const double L = 32, h = 4096, s = 4096, V = 32000, f_ffn = 14336;
  const std::optional<ModelFlops> f = model_flops(model("mixtral-8x7b", {{"sequence", s}}));
  REQUIRE(f.has_value());
  // Attention: Q and O 32 heads x 128, K and V 8 heads x 128, two RMSNorms; the router h x 8; two
  // SwiGLU experts of 3 h f each. The untied head V x h; the input embedding is a lookup.
  const double attention = h * 4096 + 2 * h * 1024 + 4096 * h + 2 * h;
  const double active_block = attention + h * 8 + 2 * 3 * h * f_ffn;
  CHECK(f->moe);
  CHECK(close_rel(f->active_parameters, L * active_block + V * h, 1e-12));
  CHECK(close_rel(f->attention_flops_per_token, 12 * L * h * s, 1e-12));
  CHECK(close_rel(f->flops_per_token(), 6 * (L * active_block + V * h) + 12 * L * h * s, 1e-12));
}

TEST_CASE("model FLOPs: none for a workload without transformer blocks") {
  CHECK_FALSE(model_flops(model("resnet50")).has_value());
}
