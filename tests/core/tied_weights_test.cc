// Tied weights across pipeline stages (Layer::tied_to, partition.h TiedCopy): a language-model head
// tied to the token embedding keeps a copy of the weight on a stage without the embedding, with its
// gradient, optimizer state and step, and all-reduces the copy's gradient with the embedding's
// (Megatron-Core: the output layer's copy on the last pipeline stage, _allreduce_word_embedding_grads
// in finalize_model_grads). Oracles: the untied model of the same shapes (whose head holds exactly
// the weight the copy holds), hand counts of h x V and Megatron's padded vocabulary, and the ring
// all-reduce of two devices over one link by hand.
#include <doctest/doctest.h>

#include "core/evaluate.h"
#include "core/experiment.h"
#include "core/lower.h"
#include "core/partition.h"
#include "core/partitioners/pipedream.h"
#include "core/planner.h"
#include "core/planners/block_profile.h"
#include "core/stage_costs.h"
#include "core/tensor_parallel.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

constexpr double kHidden = 256, kVocab = 50257;

Workload small_gpt(bool tied, Precision p = Precision::FP32) {
  ModelArgs a{{"layers", 2},     {"hidden", kHidden},    {"heads", 4},
              {"sequence", 128}, {"vocabulary", kVocab}, {"tied_embeddings", tied ? 1 : 0}};
  Result<Workload> w = build_model(**find_model("gpt"), a, p);
  REQUIRE(w.ok());
  return *w;
}

int layer_named(const Workload& w, const std::string& name) {
  for (size_t i = 0; i < w.layer_count(); ++i)
    if (w.layer(i).name == name) return static_cast<int>(i);
  return -1;
}

// The GPT above on a line of `devices` devices that only compute (1 TFLOP/s, no memory limit), links
// of `bandwidth` bytes/s without latency, Megatron's partitioner into `stages` stages at t, one
// micro-batch per stage, ring all-reduces, no optimizer time.
Experiment experiment(bool tied, int devices, int stages, int t, double bandwidth = 1e9) {
  Experiment e;
  e.name = "tied";
  e.workload = small_gpt(tied);
  e.workload.optimizer_step_s = 0;
  e.cluster = line_cluster(devices, bandwidth, 0);
  for (Device& d : e.cluster.devices) d.spec.peak_flops[static_cast<int>(Precision::FP32)] = 1e12;
  e.strategy.partitioner = "megatron";
  e.strategy.stages = stages;
  e.strategy.tensor_parallel = t;
  e.strategy.micro_batches = stages;
  e.strategy.allreduce = AllReduceAlgorithm::Ring;
  e.micro_batch_size = 1;
  return e;
}

std::vector<std::vector<StageCost>> costs_of(const Experiment& e, const PreparedRun& run) {
  Result<std::vector<std::vector<StageCost>>> c =
      stage_costs(e.workload, e.cluster, run.partition, run.micro_batch_size, e.memory.recompute,
                  tensor_parallel_options(e.strategy, e.memory));
  REQUIRE(c.ok());
  return *c;
}

double static_bytes(const TaskGraph& g, size_t d) {
  double s = 0;
  for (double x : g.static_memory[d]) s += x;
  return s;
}

}  // namespace

TEST_CASE("tied weights: GPT's and BERT's heads name the token embedding and hold h x V of it") {
  const Workload w = small_gpt(true);
  const Layer& head = w.layer(static_cast<size_t>(layer_named(w, "lm_head")));
  CHECK(head.tied_to == layer_named(w, "embedding.words"));
  CHECK(head.parameters == 0);
  CHECK(head.tied_parameters == kHidden * kVocab);
  CHECK(head.weight_bytes == kHidden * kVocab * 4);  // the GEMM reads the shared weight
  const Workload untied = small_gpt(false);
  CHECK(total_parameters(untied) - total_parameters(w) == kHidden * kVocab);  // counted once when tied
  CHECK(untied.layer(static_cast<size_t>(layer_named(untied, "lm_head"))).tied_to == -1);

  Result<Workload> bert = build_model(
      **find_model("bert-large"),
      ModelArgs{{"layers", 1}, {"hidden", 128}, {"heads", 2}, {"mlm_positions", 20}}, Precision::FP32);
  REQUIRE(bert.ok());
  const Layer& decoder = bert->layer(static_cast<size_t>(layer_named(*bert, "mlm.decoder")));
  CHECK(decoder.tied_to == layer_named(*bert, "embedding.words"));
  CHECK(decoder.tied_parameters == 128.0 * 30522);  // BERT's WordPiece vocabulary
  CHECK(decoder.parameters == 30522);               // its own bias
}

TEST_CASE("tied weights: the last of two stages keeps a copy of h x V, one stage keeps none") {
  for (int stages : {1, 2}) {
    CAPTURE(stages);
    const Experiment e = experiment(true, 2, stages, 1);
    Result<PreparedRun> run = prepare(e);
    REQUIRE(run.ok());
    const auto costs = costs_of(e, *run);
    double held = 0;
    for (size_t s = 0; s < costs.size(); ++s) {
      double own = 0;  // the stage's layers' own parameters
      for (int l : run->partition.stage(s).layers) own += e.workload.layer(static_cast<size_t>(l)).parameters;
      const bool last = stages == 2 && s == 1;
      CHECK(costs[s][0].tied_parameters == (last ? kHidden * kVocab : 0));
      CHECK(costs[s][0].parameters == approx(own + (last ? kHidden * kVocab : 0)));
      held += costs[s][0].parameters;
    }
    CHECK(held == approx(total_parameters(e.workload) + (stages == 2 ? kHidden * kVocab : 0)));
    CHECK(tied_copies(e.workload, run->partition).size() == (stages == 2 ? 1u : 0u));
  }
}

TEST_CASE("tied weights: at t = 2 the copy is h x Megatron's padded vocabulary / 2 on each rank") {
  // 50,257 padded to 50,432 at t = 2 (394 x 128).
  const Experiment e = experiment(true, 4, 2, 2);
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  const auto costs = costs_of(e, *run);
  for (size_t j = 0; j < 2; ++j) {
    CHECK(costs[0][j].tied_parameters == 0);
    CHECK(costs[1][j].tied_parameters == approx(kHidden * 50432 / 2));
  }
}

TEST_CASE("tied weights: the copy's memory is the untied head's, its gradient all-reduce costs n / B") {
  // Two stages on two devices joined by one full-duplex link of B = 1 GB/s. The untied model's last
  // stage holds the head's own h x V weight, the tied one's a copy of the embedding's: the same static
  // memory on both devices, the same compute. The tied model adds one all-reduce of the copy's
  // gradient, n = h V x 4 bytes (fp32), between the two devices after the first stage's last backward
  // (it finishes last under 1F1B): a ring of two, a reduce-scatter step and an all-gather step of n / 2
  // each way, n / B in all, and the optimizer steps (0 s here) wait for it.
  const double B = 1e9, n = kHidden * kVocab * 4;
  Result<PreparedRun> tied = prepare(experiment(true, 2, 2, 1, B));
  Result<PreparedRun> untied = prepare(experiment(false, 2, 2, 1, B));
  REQUIRE(tied.ok());
  REQUIRE(untied.ok());
  for (size_t d = 0; d < 2; ++d)
    CHECK(static_bytes(tied->graph, d) == approx(static_bytes(untied->graph, d)));
  int flows = 0;
  double bytes = 0;
  for (const Task& t : tied->graph.tasks)
    if (t.kind == TaskKind::Transfer && t.transfer == TransferKind::DataParallel) ++flows, bytes += t.bytes;
  CHECK(flows == 4);
  CHECK(bytes == approx(2 * n));
  const Experiment e = experiment(true, 2, 2, 1, B);
  Result<Timeline> a = evaluate(tied->graph, e.cluster);
  Result<Timeline> b = evaluate(untied->graph, e.cluster);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->makespan() - b->makespan() == approx(n / B));
}

TEST_CASE("tied weights: the planners' block sums count the copy where the range lacks the embedding") {
  const Workload w = small_gpt(true);
  const std::vector<int> order = topological_order(w);
  const BlockProfile profile(w, order);
  const int n = profile.blocks();
  int embedding = -1, head = -1;
  for (int q = 0; q < n; ++q) {
    if (order[static_cast<size_t>(q)] == layer_named(w, "embedding.words")) embedding = q;
    if (order[static_cast<size_t>(q)] == layer_named(w, "lm_head")) head = q;
  }
  REQUIRE(embedding >= 0);
  REQUIRE(head > embedding);
  auto own = [&](int j, int k) {  // the layers' own parameters over positions [j, k)
    double x = 0;
    for (int q = j; q < k; ++q) x += w.layer(static_cast<size_t>(order[static_cast<size_t>(q)])).parameters;
    return x;
  };
  CHECK(profile.parameters(0, n) == approx(total_parameters(w)));  // the embedding in range: no copy
  CHECK(profile.parameters(head, head + 1) == approx(kHidden * kVocab));
  CHECK(profile.parameter_bytes(head, head + 1) == approx(kHidden * kVocab * 4));
  CHECK(profile.parameters(embedding + 1, n) == approx(own(embedding + 1, n) + kHidden * kVocab));
  CHECK(profile.parameters(embedding, n) == approx(own(embedding, n)));
  CHECK(profile.parameters(0, head) == approx(own(0, head)));  // the head out of range: no copy
  CHECK(profile.tied_copy(embedding + 1, n, false) == kHidden * kVocab);
}

TEST_CASE("pipedream's partitioner counts a tied layer's copy where its stage lacks the source") {
  // embedding -> body -> head, the head tied to the embedding's 64 MiB weight (and holding none of
  // its own). 0.5, 0.5 and 3 ms per mini-batch; 4 machines at 1 TB/s. PipeDream's best plan puts the
  // embedding and the body on one machine (1 ms) and replicates the head on three; that stage takes
  // (3 ms + 4 (3 - 1) / (3 x 1e12) x 64 MiB) / 3 = 1.05965 ms with the copy in its data-parallel
  // term (one stage on all four: (4 ms + 4 x 3 / (4 x 1e12) x 128 MiB) / 4 = 1.10066 ms; the head on
  // two: 1.567 ms). The oracle: the untied chain whose head holds the same 64 MiB itself plans the
  // same. Before the copy was counted the head's stage had no parameters, and the plan was timed 1 ms.
  const double bytes = 64.0 * (1 << 20);
  auto chain = [&](bool tied) {
    Workload w;
    w.precision = Precision::FP32;
    for (const char* name : {"embedding", "body", "head"}) {
      Layer l;
      l.name = name;
      l.kind = "chain";
      l.parameter_bytes = bytes;
      l.parameters = bytes / 4;
      if (tied && std::string(name) == "head") {
        l.parameter_bytes = 0;
        l.parameters = 0;
        l.tied_to = 0;
        l.tied_parameters = bytes / 4;
      }
      const int v = w.add_layer(std::move(l));
      if (v > 0) w.add_edge(v - 1, v);
    }
    return w;
  };
  const std::vector<double> time = {0.5e-3, 0.5e-3, 3e-3}, act = {1e3, 1e3, 1e3};
  PipeDreamOptions o;
  o.levels = {{4, 1e12}};
  Result<PipeDreamPlan> tied = plan_pipedream(chain(true), time, act, o);
  Result<PipeDreamPlan> untied = plan_pipedream(chain(false), time, act, o);
  REQUIRE(tied.ok());
  REQUIRE(untied.ok());
  CHECK(tied->time_per_stage == approx((3e-3 + 4.0 * 2 / (3 * 1e12) * bytes) / 3).epsilon(1e-12));
  CHECK(tied->time_per_stage == untied->time_per_stage);
  REQUIRE(tied->stages.size() == 2);
  CHECK(tied->stages[1].layers == std::vector<int>{2});
  CHECK(tied->stages[1].replicas == 3);
}
