// Tensor parallelism in the core: Korthikanti et al.'s activation memory (arXiv 2205.05198, section 4,
// Table 2), Megatron's collectives per layer, published parameter counts, and the errors.
#include "core/tensor_parallel.h"

#include <doctest/doctest.h>

#include <cmath>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/lower.h"
#include "core/models/builder.h"
#include "core/models/zoo.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

struct Config {
  const char* name;
  int layers, hidden, heads, t, p;
};
// Korthikanti et al., Table 3: the four configurations (s = 2048, vocabulary 51200 as Megatron pads it).
constexpr Config kConfigs[] = {{"22B", 48, 6144, 64, 8, 1},
                               {"175B", 96, 12288, 96, 8, 8},
                               {"530B", 105, 20480, 128, 8, 35},
                               {"1T", 128, 25600, 160, 8, 64}};
constexpr double kSeq = 2048;

Workload gpt(const Config& c) {
  ModelArgs a{{"layers", c.layers},
              {"hidden", c.hidden},
              {"heads", c.heads},
              {"sequence", kSeq},
              {"vocabulary", 51200}};
  return *build_model(**find_model("gpt"), a, Precision::AMP);
}

// Table 2, bytes per transformer layer and sample (16-bit activations).
double table2(const Config& c, Recompute r, bool sp) {
  const double s = kSeq, h = c.hidden, a = c.heads, t = c.t;
  switch (r) {
    case Recompute::None:
      return sp ? s * h * (34 / t + 5 * a * s / (h * t)) : s * h * (10 + 24 / t + 5 * a * s / (h * t));
    case Recompute::Selective:
      return sp ? s * h * 34 / t : s * h * (10 + 24 / t);
    case Recompute::Full:
      return 2 * s * h;
  }
  return 0;
}

int count(const TaskGraph& g, TransferKind k) {
  int n = 0;
  for (const Task& t : g.tasks) n += t.kind == TaskKind::Transfer && t.transfer == k;
  return n;
}

}  // namespace

TEST_CASE("tensor parallelism: activation memory per layer is Korthikanti et al.'s Table 2, every mode") {
  for (const Config& c : kConfigs)
    for (bool sp : {false, true}) {
      const Workload w = gpt(c);
      const Layer& block = w.layer(3);  // tokens, embedding, positions, then the blocks
      REQUIRE(block.split.kind == TensorSplitKind::Transformer);
      Result<TpLayer> l = tensor_parallel_layer(block, c.t, {sp, false}, w.precision);
      REQUIRE(l.ok());
      INFO(c.name << (sp ? " with SP" : ""));
      CHECK(close_rel(l->stash_none, table2(c, Recompute::None, sp), 1e-12));
      CHECK(close_rel(l->stash_selective, table2(c, Recompute::Selective, sp), 1e-12));
      CHECK(close_rel(l->stash_full, table2(c, Recompute::Full, sp), 1e-12));
    }
}

TEST_CASE(
    "tensor parallelism: a stage of the four 2205.05198 configurations stashes L/p layers' Table 2 bytes") {
  for (const Config& c : kConfigs) {
    if (c.p == 1) continue;  // its one stage also holds the embedding and the head
    for (bool sp : {false, true})
      for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        Experiment e;
        e.workload = gpt(c);
        e.cluster = line_cluster(c.t * c.p, 100e9, 1e-6);
        for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
        e.strategy.partitioner = "megatron";
        e.strategy.stages = c.p;
        e.strategy.tensor_parallel = c.t;
        e.strategy.sequence_parallel = sp;
        e.strategy.micro_batches = 1;
        e.micro_batch_size = 1;
        e.memory.recompute = r;
        Result<PreparedRun> run = prepare(e);
        REQUIRE_MESSAGE(run.ok(), run.error().message);
        auto costs = stage_costs(e.workload, e.cluster, run->partition, 1, r, {sp, false});
        REQUIRE(costs.ok());
        const StageCost& middle = (*costs)[1][0];  // stage 1: transformer blocks only
        INFO(c.name << " recompute " << to_string(r) << (sp ? " SP" : ""));
        CHECK(close_rel(middle.stash_bytes, c.layers / c.p * table2(c, r, sp), 1e-12));
      }
  }
}

// activation_fp8_input_store at the stage level, on both cost paths (t = 1 sums the workload's own
// figures, t = 2 the tensor-parallel blocks'): Llama 2 7B's fused SwiGLU (kernel_fusion: megatron)
// saves its 2 s f input at 1 byte
// instead of 2, for each of a middle stage's 8 blocks, split t ways under sequence parallelism.
TEST_CASE("activation_fp8_input_store: a middle stage keeps 8 x 2 s f / t bytes less, t = 1 and 2") {
  Result<const ModelInfo*> info = find_model("llama2-7b");
  REQUIRE(info.ok());
  Result<Workload> w = build_model(**info, {}, Precision::AMP_BF16);
  REQUIRE(w.ok());
  REQUIRE(use_megatron_fusion(*w).ok());  // Megatron's fused SwiGLU, which stores the fp8 input
  const double s = 4096, f = 11008;
  for (int t : {1, 2})
    for (Recompute r : {Recompute::None, Recompute::Selective}) {
      Experiment e;
      e.workload = *w;
      e.cluster = line_cluster(4 * t, 100e9, 1e-6);
      for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::BF16)] = 312e12;
      e.strategy.partitioner = "megatron";
      e.strategy.stages = 4;
      e.strategy.tensor_parallel = t;
      e.strategy.sequence_parallel = t > 1;
      e.strategy.micro_batches = 1;
      e.micro_batch_size = 1;
      e.memory.recompute = r;
      Result<PreparedRun> run = prepare(e);
      REQUIRE_MESSAGE(run.ok(), run.error().message);
      double stash[2];
      for (bool store : {false, true}) {
        TensorParallelOptions o{t > 1, false};
        o.activation_fp8_input_store = store;
        auto costs = stage_costs(e.workload, e.cluster, run->partition, 1, r, o);
        REQUIRE_MESSAGE(costs.ok(), costs.error().message);
        stash[store] = (*costs)[1][0].stash_bytes;  // stage 1: blocks 8 to 15
      }
      INFO("t = " << t << ", recompute " << to_string(r));
      CHECK(close_rel(stash[0] - stash[1], 8 * 2 * s * f / t, 1e-9));
    }
}

// At t = 1 full recomputation is Megatron's too, not GPipe's whole-stage one: each block keeps its
// input (Table 2: 2 s h bytes per layer and sample), the backward re-materialises one block at a
// time (Table 2's no-recomputation bytes at t = 1: s h (34 + 5 a s / h)) and re-runs the blocks'
// forward only, not the head's. Selective likewise: Table 2's 34 s h kept, one block's 5 a s^2
// scores re-materialised at a time.
TEST_CASE("recomputation at t = 1 is Megatron's: Table 2's bytes per block, one block re-materialised") {
  const Config c{"175B at t = 1", 96, 12288, 96, 1, 8};
  Experiment e;
  e.workload = gpt(c);
  e.cluster = line_cluster(c.p, 100e9, 1e-6);
  for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
  e.strategy.partitioner = "megatron";
  e.strategy.stages = c.p;
  e.strategy.micro_batches = 1;
  e.micro_batch_size = 1;
  e.memory.recompute = Recompute::Full;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  auto costs = stage_costs(e.workload, e.cluster, run->partition, 1, Recompute::Full, {});
  REQUIRE(costs.ok());
  const StageCost& middle = (*costs)[1][0];      // 12 blocks
  const StageCost& last = (*costs)[c.p - 1][0];  // 12 blocks, the final norm and the head
  const double s = kSeq, h = c.hidden, a = c.heads;
  CHECK(close_rel(middle.stash_bytes, c.layers / c.p * 2 * s * h, 1e-12));
  CHECK(close_rel(middle.recompute_bytes, s * h * (34 + 5 * a * s / h), 1e-12));
  CHECK(close_rel(middle.recompute_s, middle.times.forward, 1e-12));
  CHECK(close_rel(last.recompute_s, middle.recompute_s, 1e-12));
  // The head's forward, not re-run: at least its 2 s h V FLOPs at the 312 TFLOP/s peak.
  CHECK(last.times.forward - last.recompute_s >= 2 * s * h * 51200 / 312e12);
  // Selective: 34 s h per block kept, one block's scores (5 a s^2) re-materialised at a time.
  auto sel = stage_costs(e.workload, e.cluster, run->partition, 1, Recompute::Selective, {});
  REQUIRE(sel.ok());
  CHECK(close_rel((*sel)[1][0].stash_bytes, c.layers / c.p * 34 * s * h, 1e-12));
  CHECK(close_rel((*sel)[1][0].recompute_bytes, 5 * a * s * s, 1e-12));
  CHECK((*sel)[1][0].recompute_s > 0);
}

TEST_CASE("tensor parallelism: Megatron's collectives per layer and micro-batch") {
  // Without SP: 2 all-reduces in the forward and 2 in the backward per transformer layer, +2 forward ones
  // re-run under full recomputation (which checkpoints the transformer layers only); with SP each
  // becomes an all-gather and a reduce-scatter. Each collective is one flow per device of the group;
  // the embedding adds 1 forward (and 1 backward with SP), the head 1 forward (the cross-entropy's
  // statistics), 1 backward and, with SP, the all-gather of its input. With SP and the weight-gradient
  // overlap (Megatron's LinearWithGradAccumulationAndAsyncCommunication), each column-parallel
  // linear's backward re-gathers its input: QKV and the MLP's first GEMM per layer, and the head.
  const Config c{"small", 4, 1024, 16, 4, 1};
  for (bool overlap : {true, false})
    for (bool sp : {false, true})
      for (Recompute r : {Recompute::None, Recompute::Full}) {
        Experiment e;
        e.workload = gpt(c);
        e.cluster = line_cluster(c.t, 100e9, 1e-6);
        for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
        e.strategy.partitioner = "megatron";
        e.strategy.stages = 1;
        e.strategy.tensor_parallel = c.t;
        e.strategy.sequence_parallel = sp;
        const int m = 3;
        e.strategy.micro_batches = m;
        e.micro_batch_size = 1;
        e.memory.recompute = r;
        e.strategy.tp_wgrad_overlap = overlap;
        Result<PreparedRun> run = prepare(e);
        REQUIRE_MESSAGE(run.ok(), run.error().message);
        const int regathers = sp && overlap ? 1 : 0;
        const int per_layer = (sp ? 2 : 1) * (4 + (r == Recompute::Full ? 2 : 0)) + 2 * regathers;
        const int embedding = sp ? 2 : 1, head = (sp ? 3 : 2) + regathers;
        INFO((sp ? "SP " : "") << to_string(r) << (overlap ? " overlapped" : ""));
        CHECK(count(run->graph, TransferKind::TensorParallel) ==
              (c.layers * per_layer + embedding + head) * m * c.t);
      }
}

TEST_CASE(
    "tensor parallelism: per-device weights are 1/t of the split matrices, norms and row biases whole") {
  const Config c{"x", 2, 1024, 16, 4, 1};
  const Workload w = gpt(c);
  const Layer& block = w.layer(3);
  const double h = c.hidden;
  Result<TpLayer> l = tensor_parallel_layer(block, c.t, {}, w.precision);
  REQUIRE(l.ok());
  // QKV 3h^2 + 3h, projection h^2, MLP 8h^2 + 4h split; projection and MLP-down biases (2h) and two
  // LayerNorms (4h) on every device.
  CHECK(close_rel(l->parameters, (12 * h * h + 7 * h) / c.t + 6 * h, 1e-12));
  Result<TpLayer> one = tensor_parallel_layer(block, 1, {}, w.precision);
  CHECK(close_rel(one->parameters, block.parameters, 1e-12));
}

TEST_CASE("llama: the zoo's parameter counts are the published ones") {
  // Meta's model cards (Llama 2: arXiv 2307.09288; Llama 3: arXiv 2407.21783), counted exactly.
  const std::pair<const char*, double> published[] = {
      {"llama2-7b", 6738415616.0}, {"llama2-13b", 13015864320.0}, {"llama2-70b", 68976648192.0},
      {"llama3-8b", 8030261248.0}, {"llama3-70b", 70553706496.0}, {"llama3-405b", 405853388800.0}};
  for (const auto& row : published) {
    const std::string name = row.first;
    INFO(name);
    Result<Workload> w = build_model(**find_model(name), {}, Precision::AMP_BF16);
    REQUIRE(w.ok());
    CHECK(total_parameters(*w) == row.second);
  }
}

TEST_CASE("tensor parallelism: errors name the layer and what t must divide") {
  Experiment e;
  e.workload = gpt({"x", 2, 1024, 16, 3, 1});
  e.cluster = line_cluster(3, 100e9, 1e-6);
  for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
  e.strategy.partitioner = "megatron";
  e.strategy.stages = 1;
  e.strategy.tensor_parallel = 3;
  Result<PreparedRun> run = prepare(e);
  REQUIRE(!run.ok());
  CHECK(run.error().message.find("tensor_parallel 3 does not divide its") != std::string::npos);

  e.workload = *build_model(**find_model("resnet50"), {}, Precision::AMP);
  e.strategy.partitioner = "uniform";
  e.cluster = line_cluster(2, 100e9, 1e-6);
  e.strategy.tensor_parallel = 2;
  run = prepare(e);
  REQUIRE(!run.ok());
  CHECK(run.error().message.find("has no tensor-parallel split") != std::string::npos);
  CHECK(run.error().message.find("conv") != std::string::npos);
}

TEST_CASE("ring_flow_bytes: one flow per device carries the ring's 2(t-1)/t (all-reduce) or (t-1)/t") {
  CHECK(ring_flow_bytes(CollectiveKind::AllReduce, 8e6, 8) == 14e6);
  CHECK(ring_flow_bytes(CollectiveKind::AllGather, 8e6, 8) == 7e6);
  CHECK(ring_flow_bytes(CollectiveKind::ReduceScatter, 8e6, 4) == 6e6);
  CHECK(ring_flow_bytes(CollectiveKind::AllReduce, 8e6, 1) == 0);
}

TEST_CASE("selective recomputation re-runs the attention core's share of a block's forward, a finite time") {
  // Per block and sample: weighted GEMMs 24 s h^2 (FFN 4h), the core 4 s^2 h (Megatron's counts).
  // The fraction was divided by a total not yet summed (infinite: every backward never ended).
  const Config c{"x", 2, 1024, 16, 1, 1};
  const Workload w = gpt(c);
  const Layer& block = w.layer(3);
  const double s = kSeq, h = c.hidden;
  CHECK(
      close_rel(block.selective_recompute_fraction, 4 * s * s * h / (24 * s * h * h + 4 * s * s * h), 1e-12));
  Experiment e;
  e.workload = w;
  e.cluster = line_cluster(2, 100e9, 1e-6);
  for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
  e.strategy.partitioner = "megatron";
  e.strategy.stages = 2;
  e.strategy.micro_batches = 2;
  e.micro_batch_size = 1;
  e.memory.recompute = Recompute::Selective;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  for (const Task& t : run->graph.tasks) CHECK(std::isfinite(t.duration));
}

TEST_CASE(
    "the language-model head at t = 1 is VocabHead's at t = 1: the logits' GEMM and the fp32 cross-entropy") {
  // Hand count, amp (2-byte activations), s 128, h 256, V 1024: the GEMM reads s h and writes s V
  // elements, 2 s h V FLOPs; the cross-entropy makes 3 fp32 passes over the s V logits (read,
  // exponentiate, normalise) in 2 launches, the same backward.
  const double s = 128, h = 256, V = 1024;
  for (const char* name : {"gpt", "llama"}) {
    CAPTURE(name);
    ModelArgs a{{"layers", 1}, {"hidden", h}, {"heads", 4}, {"sequence", s}, {"vocabulary", V}};
    if (std::string(name) == "llama") {
      a["kv_heads"] = 4;
      a["ffn"] = 512;
    }
    Result<Workload> w = build_model(**find_model(name), a, Precision::AMP);
    REQUIRE(w.ok());
    const Layer& head = w->layer(w->layer_count() - 1);
    REQUIRE(head.name == "lm_head");
    REQUIRE(head.kernels.size() == 2);
    CHECK(head.forward_flops == approx(2 * s * h * V));
    CHECK(head.forward_bytes == approx((s * h + s * V) * 2 + 3 * s * V * 4));
    CHECK(head.kernels[1].calls == 2);
    // The zoo's head takes its kernels from vocab_head_kernels, as tensor_parallel_layer does at
    // every t: the same totals at t = 1 (the hand count above is the oracle).
    Result<TpLayer> one = tensor_parallel_layer(head, 1, {}, w->precision);
    REQUIRE(one.ok());
    double fwd_bytes = 0, fwd_flops = 0, bwd_bytes = 0, calls = 0;
    for (const TpPiece& p : one->forward)
      for (const Kernel& k : p.kernels) {
        fwd_bytes += k.forward_bytes;
        fwd_flops += k.forward_flops;
        calls += k.calls;
      }
    for (const TpPiece& p : one->backward)
      for (const Kernel& k : p.kernels) bwd_bytes += k.backward_bytes;
    CHECK(fwd_bytes == approx(head.forward_bytes));
    CHECK(fwd_flops == approx(head.forward_flops));
    CHECK(bwd_bytes == approx(head.backward_bytes));
    CHECK(calls == 3);
  }
}

TEST_CASE("Megatron's padded vocabulary: GPT-2's 50,257 split by any t, every rank a multiple of 128") {
  // Megatron-LM pads the vocabulary to a multiple of 128 t (--make-vocab-size-divisible-by 128):
  // by hand, 50,257 -> 50,432 at t = 2 (394 x 128), 50,688 at t = 4 (99 x 512), 51,200 at t = 8
  // (50 x 1,024); 32,000 (Llama 2) at t = 2 stays 32,000 (125 x 256). A rank's head then holds
  // h V_padded / t parameters and its logits' GEMM does 2 s h V_padded / t FLOPs.
  CHECK(megatron_padded_vocabulary(50257, 1) == 50257);
  CHECK(megatron_padded_vocabulary(50257, 2) == 50432);
  CHECK(megatron_padded_vocabulary(50257, 4) == 50688);
  CHECK(megatron_padded_vocabulary(50257, 8) == 51200);
  CHECK(megatron_padded_vocabulary(32000, 2) == 32000);
  const double s = 128, h = 256;
  Result<Workload> w = build_model(**find_model("gpt"),
                                   ModelArgs{{"layers", 1},
                                             {"hidden", h},
                                             {"heads", 4},
                                             {"sequence", s},
                                             {"vocabulary", 50257},
                                             {"tied_embeddings", 0}},
                                   Precision::AMP);
  REQUIRE(w.ok());
  const Layer& head = w->layer(w->layer_count() - 1);
  const Layer& embedding = w->layer(1);
  REQUIRE(head.name == "lm_head");
  REQUIRE(embedding.split.kind == TensorSplitKind::VocabEmbedding);
  for (auto [t, padded] : {std::pair{2, 50432.0}, std::pair{8, 51200.0}}) {
    CAPTURE(t);
    Result<TpLayer> r = tensor_parallel_layer(head, t, {}, w->precision);
    REQUIRE(r.ok());
    CHECK(r->parameters == approx(h * padded / t));
    double flops = 0;
    for (const TpPiece& p : r->forward)
      for (const Kernel& k : p.kernels) flops += k.forward_flops;
    CHECK(flops == approx(2 * s * h * padded / t));
    Result<TpLayer> e = tensor_parallel_layer(embedding, t, {}, w->precision);
    REQUIRE(e.ok());
    CHECK(e->parameters == approx(h * padded / t));
  }
}

namespace {

// A GPT of `layers` blocks at t = 4 on a line of 4 devices whose only cost is FLOPs at 312 TFLOP/s
// (no memory-bandwidth limit, no kernel start-up) and whose links move `bandwidth` bytes/s without
// latency; one micro-batch of one sample; the analytic evaluator's iteration time.
double iteration(int layers, bool sp, bool overlap, double bandwidth) {
  const Config c{"x", layers, 1024, 16, 4, 1};
  Experiment e;
  e.workload = gpt(c);
  e.cluster = line_cluster(c.t, bandwidth, 0);
  for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
  e.strategy.partitioner = "megatron";
  e.strategy.stages = 1;
  e.strategy.tensor_parallel = c.t;
  e.strategy.sequence_parallel = sp;
  e.strategy.tp_wgrad_overlap = overlap;
  e.strategy.micro_batches = 1;
  e.micro_batch_size = 1;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  Result<Timeline> t = evaluate(run->graph, e.cluster);
  REQUIRE(t.ok());
  return t->makespan();
}

}  // namespace

TEST_CASE(
    "tensor parallelism: a column-parallel linear's input-gradient collective runs beside its "
    "weight-gradient "
    "GEMM, as Megatron-LM's backward issues them") {
  // Megatron-LM (megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsync-
  // Communication.backward; commit cf7efd4f5a of 2021-08-30 without SP, 02bb1f5c86 of 2022-03-02
  // with it): the input-gradient GEMM, then the all-reduce (reduce-scatter with SP) started
  // asynchronously, then the weight-gradient GEMM, then the wait; with SP the saved 1/t of the input
  // is re-gathered asynchronously before the input-gradient GEMM and waited for before the
  // weight-gradient one. The column-parallel linears of a GPT at t = 4: each block's QKV (3h columns)
  // and first MLP GEMM (4h), and the head (V = 51,200 columns). s = 2048, h = 1024, one sample.
  const double s = kSeq, h = 1024, t = 4, V = 51200, peak = 312e12, eb = 2;
  const int layers = 2;
  const double wgrad = (layers * 2 * s * h * (3 * h + 4 * h) + 2 * s * h * V) / t / peak;
  SUBCASE("without SP, on slow links the all-reduce hides exactly the weight gradient's GEMMs") {
    // Links at 100 MB/s: each all-reduce takes milliseconds, far longer than any weight-gradient GEMM
    // (at most 2 s h V / t / peak = 0.17 ms), so each linear saves its weight gradient's time.
    const double off = iteration(layers, false, false, 100e6), on = iteration(layers, false, true, 100e6);
    CHECK(close_rel(off - on, wgrad, 1e-9));
  }
  SUBCASE("without SP, on fast links the weight gradient hides exactly the all-reduce") {
    // At 1 PB/s each all-reduce (a merged ring: 2 (t - 1) / t of s h eb per device on its own link
    // direction) is far shorter than the weight-gradient GEMM beside it: 3 column-parallel linears per
    // ... 2 blocks and the head, each saving its all-reduce.
    const double bw = 1e15, allreduce = 2 * (t - 1) / t * s * h * eb / bw;
    const double off = iteration(layers, false, false, bw), on = iteration(layers, false, true, bw);
    CHECK(close_rel(off - on, (2 * layers + 1) * allreduce, 1e-6));
  }
  SUBCASE("with SP on slow links, the re-gathered input costs its all-gather") {
    // With SP: [before] all-gather (beside) [input gradient] reduce-scatter (beside) [weight gradient]
    // against [before, input gradient, weight gradient] reduce-scatter. On links this slow the
    // all-gather ((t - 1) / t of s h eb per device) outlasts the input gradient; the reduce-scatter
    // queues behind it on the same links (FIFO in the evaluator) and the weight gradient runs beside
    // it: each linear takes all-gather - input gradient - weight gradient longer. The input and weight
    // gradients have equal FLOPs (2 s h n / t each).
    const double bw = 100e6, gather = (t - 1) / t * s * h * eb / bw;
    const double off = iteration(layers, true, false, bw), on = iteration(layers, true, true, bw);
    CHECK(close_rel(on - off, (2 * layers + 1) * gather - 2 * wgrad, 1e-9));
  }
}

// The host's state carried across a stage's layers (HostCarry): with a host far slower than the
// device (1 s a launch against microseconds of work), each layer started afresh costs (n - 1) launches
// of host time plus its last kernel (its first launch issued while the layer before ran); carried,
// the stage's pass is one stream, (N - 1) launches plus the last kernel: the carried pass is longer by
// exactly (L - 1) launches, the first launch of every layer but the first, in the forward and in the
// backward, to within the kernels' microseconds.
TEST_CASE("host dispatch carried across a stage's layers: one stream, (L - 1) launches more than afresh") {
  const Config c{"small", 4, 1024, 16, 1, 1};
  Experiment e;
  e.workload = gpt(c);
  e.cluster = line_cluster(1, 100e9, 1e-6);
  const double D = 1.0;
  for (Device& d : e.cluster.devices) {
    d.spec.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
    d.spec.kernel_dispatch_s = D;
    d.spec.kernel_startup_s = 1e-6;
    d.spec.layer_overhead_s = 0;
  }
  e.strategy.partitioner = "megatron";
  e.strategy.stages = 1;
  e.strategy.micro_batches = 1;
  e.micro_batch_size = 1;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  auto costs = stage_costs(e.workload, e.cluster, run->partition, 1, Recompute::None, {});
  REQUIRE(costs.ok());
  const PassTimes& carried = (*costs)[0][0].times;
  PassTimes afresh;
  int layers = 0, backward_layers = 0;
  for (int l : run->partition.stage(0).layers) {
    PassTimes t = *layer_times(e.workload.layer(l), e.workload.precision, e.cluster.devices[0].spec, 1);
    afresh.forward += t.forward;
    afresh.backward_input += t.backward_input;
    afresh.backward_weight += t.backward_weight;
    // A layer issues launches where the device spends time on it: every launch pays the start-up.
    DeviceSpec free_host = e.cluster.devices[0].spec;
    free_host.kernel_dispatch_s = 0;
    PassTimes device = *layer_times(e.workload.layer(l), e.workload.precision, free_host, 1);
    layers += device.forward > 0;
    backward_layers += device.backward() > 0;
  }
  REQUIRE(layers > 2);
  REQUIRE(backward_layers > 2);
  // The kernels' device times (milliseconds at most here) against seconds of host time.
  CHECK(close_rel(carried.forward - afresh.forward, (layers - 1) * D, 1e-3));
  CHECK(close_rel(carried.backward() - afresh.backward(), (backward_layers - 1) * D, 1e-3));
}
