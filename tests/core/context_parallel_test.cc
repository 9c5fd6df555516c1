// Context parallelism (core/context_parallel.h): the attention work per rank and step, the groups,
// the divisibility rules, and the activation memory per rank against Korthikanti et al.'s Table 2
// with s / cp tokens, for each recomputation mode.
#include "core/context_parallel.h"

#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/models/builder.h"
#include "core/stage_costs.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double kS = 512, kH = 1024, kHeads = 16, kF = 4096;

Workload one_block(double sequence = kS, double heads = kHeads) {
  return causal_block(sequence, kH, heads, kF);
}

double sum(const std::vector<double>& v) {
  double x = 0;
  for (double w : v) x += w;
  return x;
}

}  // namespace

TEST_CASE("context parallelism: attention work per step, balanced and contiguous, sums to s^2 / 2") {
  for (int cp : {2, 3, 4, 8}) {
    INFO("cp=" << cp);
    double balanced = 0, contiguous = 0;
    for (int r = 0; r < cp; ++r) {
      const std::vector<double> b = attention_step_work({cp, r}, {CpAlgorithm::P2P, true}, true);
      const std::vector<double> n = attention_step_work({cp, r}, {CpAlgorithm::P2P, false}, true);
      REQUIRE(b.size() == static_cast<size_t>(cp));
      CHECK(sum(b) == cp / 2.0);  // every rank the same: 1 / cp of the causal total
      CHECK(sum(n) == r + 0.5);   // rank r: r earlier ranks' blocks and its own triangle
      balanced += sum(b);
      contiguous += sum(n);
      // One step for the other algorithms, with the same total.
      CHECK(attention_step_work({cp, r}, {CpAlgorithm::AllGather, false}, true) ==
            std::vector<double>{r + 0.5});
      CHECK(attention_step_work({cp, r}, {CpAlgorithm::AllToAll, false}, true) ==
            std::vector<double>{cp / 2.0});
      CHECK(sum(attention_step_work({cp, r}, {CpAlgorithm::P2P, true}, false)) == cp);
    }
    // In blocks of (s / cp)^2 scores: cp^2 / 2 blocks = s^2 / 2 scores, however split.
    CHECK(balanced == cp * cp / 2.0);
    CHECK(contiguous == cp * cp / 2.0);
  }
}

TEST_CASE("context parallelism: groups in Megatron's tp-cp-dp order") {
  // t = 2, cp = 2, two replicas: positions (j cp + c) t + i.
  CHECK(group_members(CommGroup::Context, 0, 2, {}, 2) == std::vector<int>{0, 2});
  CHECK(group_members(CommGroup::Context, 3, 2, {}, 2) == std::vector<int>{1, 3});
  CHECK(group_members(CommGroup::Context, 6, 2, {}, 2) == std::vector<int>{4, 6});
  CHECK(group_members(CommGroup::Tensor, 6, 2, {}, 2) == std::vector<int>{6, 7});
  CHECK(group_members(CommGroup::Context, 5, 1, {}, 4) == std::vector<int>{4, 5, 6, 7});
}

TEST_CASE("context parallelism: the sequence and the heads must split as the algorithm needs") {
  const Workload w = one_block(102);
  const Layer& block = w.layer(1);
  REQUIRE(block.split.kind == TensorSplitKind::Transformer);
  CHECK_FALSE(check_context_parallel(block, 1, 2, {CpAlgorithm::P2P, true}).ok());  // 102 / 4 chunks
  CHECK(check_context_parallel(block, 1, 2, {CpAlgorithm::P2P, false}).ok());       // 102 / 2
  CHECK(check_context_parallel(block, 1, 2, {CpAlgorithm::AllToAll, true}).ok());
  const Workload h12 = one_block(kS, 12);
  CHECK_FALSE(check_context_parallel(h12.layer(1), 1, 8, {CpAlgorithm::AllToAll, true}).ok());
  CHECK(check_context_parallel(h12.layer(1), 1, 4, {CpAlgorithm::AllToAll, true}).ok());
  CHECK_FALSE(
      check_context_parallel(h12.layer(1), 2, 4, {CpAlgorithm::AllToAll, true}).ok());  // 6 per device
}

// Per block and sample at t = 1, fp16 (2-byte units = bytes), s_l = s / cp tokens per device:
// none s_l h (34 + 5 a s / h) (the unfused core's scores of its queries against all s keys), selective
// 34 s_l h, full 2 s_l h (the block's input). The backward's workspace: the output gradient of s_l
// tokens and the algorithm's exchange buffers (p2p: two [K/V; dK/dV] buffers, 4 x 2 s_l h).
TEST_CASE("context parallelism: activation memory per rank is Table 2's with s / cp tokens, every mode") {
  for (int cp : {2, 4}) {
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      Experiment e;
      e.workload = one_block();
      e.cluster = line_cluster(cp, 100e9, 1e-6);
      for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 100e12;
      e.strategy.partitioner = "uniform";
      e.strategy.stages = 1;
      e.strategy.micro_batches = 1;
      e.strategy.context_parallel = cp;
      e.micro_batch_size = 1;
      e.memory.recompute = r;
      Result<PreparedRun> run = prepare(e);
      REQUIRE_MESSAGE(run.ok(), run.error().message);
      auto costs = stage_costs(e.workload, e.cluster, run->partition, 1, r, {});
      REQUIRE(costs.ok());
      const double sl = kS / cp, h = kH, a = kHeads;
      const double none = sl * h * 34 + 5 * a * sl * kS;
      for (int rank = 0; rank < cp; ++rank) {
        const StageCost& sc = (*costs)[0][static_cast<size_t>(rank)];
        INFO("cp=" << cp << " rank " << rank << " recompute " << to_string(r));
        const double stash = r == Recompute::None        ? none
                             : r == Recompute::Selective ? 34 * sl * h
                                                         : 2 * sl * h;
        CHECK(close_rel(sc.stash_bytes, stash, 1e-12));
        const double recomputed = r == Recompute::None        ? 0
                                  : r == Recompute::Selective ? 5 * a * sl * kS
                                                              : none;
        CHECK(close_rel(sc.recompute_bytes + 1, recomputed + 1, 1e-12));
        CHECK(close_rel(sc.workspace_bytes, sl * h * 2 + 4 * (2 * sl * h * 2), 1e-12));
      }
    }
  }
}
