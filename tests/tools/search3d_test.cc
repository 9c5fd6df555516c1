// The 3D search (core/planners/search3d.h): its enumeration counted by hand, and its analytic ranking
// against SimGrid's on cases small enough to replay every feasible candidate.
#include "core/planners/search3d.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "core/evaluate.h"
#include "core/partitioners/megatron.h"
#include "sim/replay.h"
#include "tests/support/approx.h"
#include "tools/input/experiment_yaml.h"
#include "tools/process/isolated_replay.h"

using namespace pipegrid;

namespace {

// A small GPT (8 blocks, h 1024, 16 heads) on two DGX A100 (16 GPUs).
constexpr const char* kGpt = R"(name: small GPT on two DGX A100
workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocabulary: 51200, precision: amp}
cluster: {preset: dgx-a100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron, micro_batches: 1, allreduce: ring}  # replaced by each candidate's
)";

// A small Llama (8 blocks, h 2048, 16 heads, 4 KV heads, SwiGLU) on two DGX H100 (16 GPUs).
constexpr const char* kLlama = R"(name: small Llama on two DGX H100
workload: {model: llama, layers: 8, hidden: 2048, heads: 16, kv_heads: 4, ffn: 5632, sequence: 2048,
           vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron, micro_batches: 1, allreduce: ring}  # replaced by each candidate's
)";

// Small MoE decoders on two DGX H100 (16 GPUs): Mixtral-8x7B's shape with 2 blocks, and a small one
// (4 blocks, h 1024, 8 experts of FFN 1024, top-2) whose whole graphs lower in milliseconds.
constexpr const char* kMixtral2 = R"(name: Mixtral-8x7B, 2 blocks, on two DGX H100
workload: {model: mixtral-8x7b, layers: 2, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron, micro_batches: 1, allreduce: ring}  # replaced by each candidate's
)";
constexpr const char* kMoe = R"(name: small MoE on two DGX H100
workload: {model: mixtral-8x7b, layers: 4, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2048, expert_ffn: 1024,
           experts: 8, sequence: 1024, vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron, micro_batches: 1, allreduce: ring}  # replaced by each candidate's
)";

// A small Llama with a 16k sequence (4 blocks, h 1024, 16 heads, 4 KV heads) on two DGX H100: the
// default cp axis tries 1, 2 and 4 (at least 4,096 tokens per rank).
constexpr const char* kLongLlama = R"(name: small long-context Llama on two DGX H100
workload: {model: llama, layers: 4, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2816, sequence: 16384,
           vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron, micro_batches: 1, allreduce: ring}  # replaced by each candidate's
)";

// The experiment text with `extra` added to its strategy (e.g. "allreduce: multi-ring", which
// replaces the bases' one ring: they were measured with it, before NCCL's ring per NIC became the
// default, issue 55, item 10).
std::string with_strategy(std::string text, const std::string& extra) {
  const std::string plain = "strategy: {partitioner: megatron, micro_batches: 1, allreduce: ring}";
  const std::string kept = extra.find("allreduce:") != std::string::npos ? "" : ", allreduce: ring";
  text.replace(text.find(plain), plain.size(),
               "strategy: {partitioner: megatron, micro_batches: 1" + kept + ", " + extra + "}");
  return text;
}

Experiment load(const char* text) {
  Result<Experiment> e = input::load_experiment_text(text, "search.yaml");
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  return *e;
}

// Spearman's rho, written here independently of search3d's: average ranks for ties, then Pearson.
std::vector<double> average_ranks(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    double less = 0, equal = 0;
    for (double x : v) less += x < v[i], equal += x == v[i];
    r[i] = less + (equal + 1) / 2;
  }
  return r;
}
double rho(const std::vector<double>& x, const std::vector<double>& y) {
  const std::vector<double> a = average_ranks(x), b = average_ranks(y);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n,
               mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += (a[i] - ma) * (b[i] - mb);
    aa += (a[i] - ma) * (a[i] - ma);
    bb += (b[i] - mb) * (b[i] - mb);
  }
  return ab / std::sqrt(aa * bb);
}

struct Agreement {
  size_t candidates = 0;
  double analytic_choice_vs_fastest = 0;  // SimGrid time of the analytic choice / SimGrid's fastest
  double spearman = 0;
  double worst_vs_simgrid = 0;  // the largest |analytic / SimGrid - 1|
};

Agreement replay_all(const Experiment& base, const Search3dOptions& o) {
  Result<Search3dResult> res = search3d(base, o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  REQUIRE(res->ranked.size() >= 8);
  std::vector<double> analytic, simulated;
  for (const Search3dCandidate& c : res->ranked) {
    const Experiment e = search3d_experiment(base, c);
    Result<PreparedRun> run = prepare(e);
    REQUIRE_MESSAGE(run.ok(), (run.ok() ? "" : run.error().message));
    Result<sim::Replay> r = process::replay_isolated(e.cluster, run->graph);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    analytic.push_back(c.iteration_time_s);
    simulated.push_back(r->timeline.makespan());
  }
  Agreement a;
  a.candidates = analytic.size();
  a.analytic_choice_vs_fastest = simulated.front() / *std::min_element(simulated.begin(), simulated.end());
  a.spearman = rho(analytic, simulated);
  for (size_t i = 0; i < analytic.size(); ++i)
    a.worst_vs_simgrid = std::max(a.worst_vs_simgrid, std::abs(analytic[i] / simulated[i] - 1));
  return a;
}

// |TP-folded replay / whole graph's replay - 1| of candidate c, both in SimGrid.
double folded_against_whole(const Experiment& base, Search3dEstimator& folded, const Search3dCandidate& c) {
  const Experiment e = search3d_experiment(base, c);
  Result<PreparedRun> whole = prepare(e);
  REQUIRE_MESSAGE(whole.ok(), (whole.ok() ? "" : whole.error().message));
  Result<sim::Replay> a = process::replay_isolated(e.cluster, whole->graph);
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  Result<PreparedRun> f = folded.tp_folded(c);
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? "" : f.error().message));
  Result<sim::Replay> b = process::replay_isolated(base.cluster, f->graph);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().message));
  return std::abs(b->timeline.makespan() / a->timeline.makespan() - 1);
}

}  // namespace

TEST_CASE("search3d: the combinations of t, p, d and b counted by hand, and what is left out") {
  // 16 GPUs, 8 devices per node, 8 blocks, 16 heads, global batch 16, one schedule and mode. The 15
  // ordered (t, p, d) with t p d = 16: (16, 1, 1) has t above a node and (1, 16, 1) p not dividing
  // the 8 blocks. For the other 13, b runs over the divisors of 16 / d:
  //   t = 1: d = 16, 8, 4, 2 -> 1 + 2 + 3 + 4 = 10;  t = 2: d = 8, 4, 2, 1 -> 2 + 3 + 4 + 5 = 14;
  //   t = 4: d = 4, 2, 1 -> 3 + 4 + 5 = 12;          t = 8: d = 2, 1 -> 4 + 5 = 9;  45 in all.
  const Experiment base = load(kGpt);
  Search3dOptions o;
  o.global_batch = 16;
  o.schedules = {"1f1b"};
  o.recompute = {Recompute::None};
  o.sequence_parallel = {false};
  o.distributed_optimizer = {false};
  size_t calls = 0, last_done = 0, last_total = 0;
  o.progress = [&](size_t done, size_t total) {
    ++calls;
    last_done = done;
    last_total = total;
  };
  Result<Search3dResult> res = search3d(base, o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  CHECK(res->combinations == 45);
  CHECK(calls == 45);
  CHECK(last_done == 45);
  CHECK(last_total == 45);
  CHECK(res->left_out.at("(t, p, d): t above the 8 devices of a node") == 1);
  CHECK(
      res->left_out.at("(t, p, d): p above the 8 transformer blocks with the embedding, the loss and the MTP "
                       "modules as one more each (a stage would hold nothing)") == 1);
  size_t configurations_left_out = 0;
  for (const auto& [reason, n] : res->left_out)
    if (reason.rfind("(t, p, d)", 0) != 0) configurations_left_out += n;
  CHECK(res->ranked.size() + configurations_left_out == 45);
  for (size_t i = 1; i < res->ranked.size(); ++i)
    CHECK(res->ranked[i - 1].iteration_time_s <= res->ranked[i].iteration_time_s);
  // Every candidate keeps the global batch: b d m = 16.
  for (const Search3dCandidate& c : res->ranked) CHECK(c.b * c.d * c.micro_batches == 16);

  // Sequence parallelism at t = 1 and the distributed optimizer at d = cp = 1 are the same runs as without.
  o.sequence_parallel = {false, true};
  o.distributed_optimizer = {false, true};
  res = search3d(base, o);
  REQUIRE(res.ok());
  CHECK(res->combinations == 45 * 4);
  // b-configurations at t = 1: 10 (each with SP on, two optimizer settings); at d = 1: t = 2, 4, 8 with
  // p = 8, 4, 2: 5 + 5 + 5 b values, each with SP off (SP on: t > 1 is fine) and the distributed optimizer.
  CHECK(res->left_out.at("sequence parallelism at t = 1 (the same run as without)") == 10 * 2);
  CHECK(res->left_out.at("distributed optimizer at d = cp = 1 (the same run as without)") == 15 * 2);
}

TEST_CASE("search3d: errors") {
  {
    const std::string text = with_strategy(kGpt, "allreduce: hierarchical");
    Search3dOptions o;
    o.global_batch = 16;
    Result<Search3dResult> r = search3d(load(text.c_str()), o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("hierarchical") != std::string::npos);
  }
  Experiment base = load(kGpt);
  Search3dOptions o;
  CHECK(!search3d(base, o).ok());  // no global batch
  o.global_batch = 16;
  o.schedules = {"gpipe"};
  CHECK(!search3d(base, o).ok());
  // Expert-parallel sizes for a dense workload are an error, not ignored; so is no dispatcher for MoE.
  o.schedules = {"1f1b"};
  o.expert_parallel = {2};
  Result<Search3dResult> r = search3d(base, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("no mixture-of-experts blocks") != std::string::npos);
  Search3dOptions m;
  m.global_batch = 16;
  m.dispatchers.clear();
  r = search3d(load(kMoe), m);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("no token dispatcher") != std::string::npos);
}

TEST_CASE("search3d MoE: the expert axes counted by hand, with Megatron-Core's rules") {
  // Mixtral-8x7B's shape with 2 blocks (8 experts, expert FFN 14,336 = 2^11 x 7) on two DGX H100, t 1,
  // p 1, so d 16 and b 1 (global batch 16). ep runs over the divisors of 16 dividing 8 (1, 2, 4, 8),
  // etp over the divisors of 16 (1, 2, 4, 8, 16), two dispatchers, SP off and on: 4 x 5 x 2 x 2 = 80.
  // Left out: SP at t = 1, 40; of the other 40, ep x etp not dividing 16 for (2, 16), (4, 8), (4, 16),
  // (8, 4), (8, 8), (8, 16): 6 x 2 = 12; etp 16 above a node at ep 1: 2; the all-gather dispatcher at
  // ep = etp = 1: 1. 25 ranked.
  Search3dOptions o;
  o.global_batch = 16;
  o.tensor_parallel = {1};
  o.pipeline = {1};
  o.schedules = {"1f1b"};
  o.recompute = {Recompute::None};
  o.distributed_optimizer = {false};
  Result<Search3dResult> res = search3d(load(kMixtral2), o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  CHECK(res->combinations == 80);
  CHECK(res->left_out.at("sequence parallelism at t = 1 (the same run as without)") == 40);
  CHECK(res->left_out.at("MoE: ep x etp does not divide t x cp x d (a stage's devices)") == 12);
  CHECK(res->left_out.at("MoE: etp above the 8 devices of a node") == 2);
  CHECK(res->left_out.at("MoE: the all-gather dispatcher at ep = etp = 1 (the same run as all-to-all)") == 1);
  CHECK(res->ranked.size() == 25);
  for (const Search3dCandidate& c : res->ranked) {
    CHECK(c.moe);
    CHECK(16 % (c.ep * c.etp) == 0);
    CHECK(c.label().find(" ep") != std::string::npos);
  }
  // MFU counts the active parameters (a token's top-2 of the 8 experts), below the total.
  CHECK(res->parameters < total_parameters(load(kMixtral2).workload) / 2);

  // Under t > 1 MoE needs sequence parallelism (Megatron-Core asserts it): left out without.
  o.tensor_parallel = {2};
  o.micro_batch_sizes = {2};
  o.expert_parallel = {8};
  o.expert_tensor_parallel = {1};
  o.dispatchers = {MoeDispatcher::AllToAll};
  res = search3d(load(kMixtral2), o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  CHECK(res->combinations == 2);
  CHECK(res->left_out.at(
            "MoE: t > 1 without sequence parallelism (Megatron-Core requires it with experts)") == 1);
  REQUIRE(res->ranked.size() == 1);
  CHECK(res->ranked[0].label() == "t2 p1 d8 ep8 etp1 b2 m1 1f1b none sp alltoall");
}

// Restricted axes keep each case under a few hundred replays' worth of time: micro-batch sizes 1 and
// 2, 1F1B and interleaved (v = 2), no recomputation and full, SP on and off, no distributed optimizer
// (it changes memory, not time, here).
TEST_CASE(
    "search3d: on a small GPT on two DGX A100, the analytic choice is SimGrid's fastest within 2%, rho >= "
    "0.9") {
  Search3dOptions o;
  o.global_batch = 16;
  o.micro_batch_sizes = {1, 2};
  o.schedules = {"1f1b", "interleaved-1f1b"};
  o.chunks = {2};
  o.recompute = {Recompute::None, Recompute::Full};
  o.distributed_optimizer = {false};
  const Agreement a = replay_all(load(kGpt), o);
  MESSAGE("GPT: " << a.candidates << " candidates, choice / fastest " << a.analytic_choice_vs_fastest
                  << ", Spearman " << a.spearman << ", worst |analytic / SimGrid - 1| "
                  << a.worst_vs_simgrid);
  CHECK(a.analytic_choice_vs_fastest <= 1.02);
  CHECK(a.spearman >= 0.9);
}

TEST_CASE(
    "search3d: on a small Llama on two DGX H100, the analytic choice is SimGrid's fastest within 2%, rho >= "
    "0.9") {
  Search3dOptions o;
  o.global_batch = 16;
  o.micro_batch_sizes = {1, 2};
  o.schedules = {"1f1b", "zb-h1"};
  o.recompute = {Recompute::None, Recompute::Full};
  o.distributed_optimizer = {false};
  const Agreement a = replay_all(load(kLlama), o);
  MESSAGE("Llama: " << a.candidates << " candidates, choice / fastest " << a.analytic_choice_vs_fastest
                    << ", Spearman " << a.spearman << ", worst |analytic / SimGrid - 1| "
                    << a.worst_vs_simgrid);
  CHECK(a.analytic_choice_vs_fastest <= 1.02);
  CHECK(a.spearman >= 0.9);
}

// The one-replica estimate (the default ranking) against the whole graph's analytic evaluation
// (Search3dOptions::exact, the oracle: every replica, rank and micro-batch lowered), over every axis.
// The estimate misses the FIFO contention between replicas' or ranks' flows on shared links, chiefly
// a pipeline transfer sharing NVSwitch links with the TP collectives when a pipeline boundary falls
// inside a node (t d < 8 on 8-GPU nodes): docs/3d-search.md states the differences measured here.
namespace {
struct EstimateAgreement {
  size_t both = 0, only_exact = 0, only_estimate = 0, equal = 0;         // equal: within 1e-9
  double worst_time = 0, worst_time_across_nodes = 0, worst_memory = 0;  // largest relative differences
  double worst_time_t1 = 0;                                              // without tensor parallelism
  std::string worst_label;
};
EstimateAgreement compare_estimate(const Experiment& base, Search3dOptions o, int per_node) {
  o.exact = true;
  Result<Search3dResult> exact = search3d(base, o);
  REQUIRE_MESSAGE(exact.ok(), (exact.ok() ? "" : exact.error().message));
  o.exact = false;
  Result<Search3dResult> fast = search3d(base, o);
  REQUIRE_MESSAGE(fast.ok(), (fast.ok() ? "" : fast.error().message));
  CHECK(fast->combinations == exact->combinations);
  std::map<std::string, const Search3dCandidate*> by_label;
  for (const Search3dCandidate& c : exact->ranked) by_label[c.label()] = &c;
  EstimateAgreement a;
  for (const Search3dCandidate& c : fast->ranked) {
    auto it = by_label.find(c.label());
    if (it == by_label.end()) {
      ++a.only_estimate;
      continue;
    }
    ++a.both;
    const double dt = std::abs(c.iteration_time_s / it->second->iteration_time_s - 1);
    const double dm = std::abs(c.peak_memory_bytes / it->second->peak_memory_bytes - 1);
    a.equal += dt <= 1e-9;
    if (dt > a.worst_time) a.worst_time = dt, a.worst_label = c.label();
    if (c.p == 1 || c.t * c.d >= per_node)
      a.worst_time_across_nodes = std::max(a.worst_time_across_nodes, dt);
    a.worst_memory = std::max(a.worst_memory, dm);
    if (c.t == 1) a.worst_time_t1 = std::max(a.worst_time_t1, dt);
  }
  a.only_exact = exact->ranked.size() - a.both;
  return a;
}
}  // namespace

TEST_CASE("search3d: the one-replica estimate against the whole graph's evaluation, every axis") {
  struct Case {
    std::string text;
    double worst;        // the largest relative difference allowed, as measured (docs/3d-search.md)
    double equal = 0.7;  // the least fraction of candidates whose times agree within 1e-9
  };
  // Also with TP communication overlapped with the compute piece after it (tp_overlap; the base's
  // tensor_parallel is only there because the option needs it: the search sets t), and with the
  // data-parallel gradients all-reduced as NCCL's rings over a node's NICs (multi-ring).
  for (const Case& k :
       {Case{kGpt, 0.002}, Case{kLlama, 0.021},
        Case{with_strategy(kGpt, "tensor_parallel: 2, tp_overlap: true"), 0.002},
        Case{with_strategy(kLlama, "tensor_parallel: 2, tp_overlap: true"), 0.02},
        Case{with_strategy(kGpt, "allreduce: multi-ring"), 0.002},
        // The first stage's gradients in buckets during its last backward, fp32
        // (replicas only there because the option needs them: the search sets d).
        // The estimate times the buckets alone on their links; in the whole graph
        // they share NVLink with the backward's TP collectives (t > 1) and wait in
        // turn behind them (the evaluator's FIFO): measured 5.9% (GPT) and 31.1%
        // (Llama, t 2 p 1 d 8), where SimGrid's sharing gives 14% (docs/3d-search.md).
        // (The base's replicas are there for dp_overlap only; its batch is the candidates': opted in.)
        // 579 of 840 equal since the tied head's gradient all-reduce between the first and last
        // ranks (2026-12-05; 588 or more before): in the whole graph its flows share links with the
        // other ranks' bucketed reductions still running.
        Case{
            with_strategy(
                kGpt, "replicas: 2, allow_fractional_samples: true, dp_overlap: true, gradient_reduce: fp32"),
            0.07, 0.68},
        Case{with_strategy(kLlama, "replicas: 2, allow_fractional_samples: true, dp_overlap: true"), 0.34,
             0.23},
        // 367 of 708 equal: a GPU's NVSwitch channel carries the flows of several of
        // its group's rings per step, each charged the channel's whole step
        Case{with_strategy(kLlama, "allreduce: multi-ring"), 0.021, 0.5}}) {
    Search3dOptions o;
    o.global_batch = 16;
    o.micro_batch_sizes = {1, 2};
    const EstimateAgreement a = compare_estimate(load(k.text.c_str()), o, 8);
    MESSAGE(a.both << " candidates in both, " << a.equal << " equal within 1e-9, " << a.only_exact
                   << " only exact, " << a.only_estimate << " only estimated; worst time difference "
                   << a.worst_time << " (" << a.worst_label << "), with no pipeline boundary inside a node "
                   << a.worst_time_across_nodes << "; worst memory difference " << a.worst_memory);
    CHECK(a.both >= 500);
    CHECK(a.only_exact == 0);
    CHECK(a.only_estimate == 0);
    CHECK(a.worst_memory <= 1e-9);                            // memory: the same peaks
    CHECK(static_cast<double>(a.equal) >= k.equal * a.both);  // most candidates: the same time
    CHECK(a.worst_time_across_nodes <= std::max(0.002, k.worst));
    MESSAGE("without tensor parallelism: worst time difference " << a.worst_time_t1);
    CHECK(a.worst_time_t1 <= 0.002);
    CHECK(a.worst_time <= k.worst);
  }
}

// The MoE search's analytic choice against SimGrid's fastest, every feasible candidate of restricted
// axes replayed (whole graphs, every all-to-all as flows under SimGrid's max-min sharing).
TEST_CASE(
    "search3d MoE: on a small MoE on two DGX H100, the analytic choice is SimGrid's fastest within 2%") {
  Search3dOptions o;
  o.global_batch = 16;
  o.micro_batch_sizes = {1, 2};
  o.schedules = {"1f1b", "interleaved-1f1b"};
  o.chunks = {2};
  o.recompute = {Recompute::None};
  o.distributed_optimizer = {false};
  const Agreement a = replay_all(load(kMoe), o);
  MESSAGE("MoE: " << a.candidates << " candidates, choice / fastest " << a.analytic_choice_vs_fastest
                  << ", Spearman " << a.spearman << ", worst |analytic / SimGrid - 1| "
                  << a.worst_vs_simgrid);
  CHECK(a.analytic_choice_vs_fastest <= 1.02);
  CHECK(a.spearman >= 0.9);
  // Measured 0.011 (0.171 before the group collectives across machines ran a ring per NIC: the
  // all-gather dispatcher over all 16 devices, ep x etp = 16 across both nodes; docs/3d-search.md);
  // 0.074 since a device's expert gradients reduce after its dense ones, as Megatron's
  // finalize_model_grads runs them without overlap: this test's stepped ring (allreduce: ring) of 8
  // across two nodes reaches its devices up to 0.35 ms apart, and the expert ring waits for the last,
  // where the closed form has one end for the ring (t2 p1 d8 ep8: 7.29 ms replayed, 6.75 estimated).
  // NCCL's ring per NIC, the default, ends on every device at once.
  CHECK(a.worst_vs_simgrid <= 0.08);
}

// Context parallelism: the analytic choice against SimGrid's fastest, every feasible candidate of
// restricted axes replayed whole, and the estimate against the whole graph's evaluation.
TEST_CASE("search3d CP: on a long-context Llama on two DGX H100, the analytic choice is SimGrid's fastest") {
  Search3dOptions o;
  o.global_batch = 8;
  o.micro_batch_sizes = {1};
  o.schedules = {"1f1b"};
  o.recompute = {Recompute::Selective};
  o.distributed_optimizer = {false};
  Result<Search3dResult> res = search3d(load(kLongLlama), o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  std::set<int> cps;
  for (const Search3dCandidate& c : res->ranked) cps.insert(c.cp);
  CHECK(cps == std::set<int>{1, 2, 4});  // 16,384 / 4 = 4,096 tokens per rank at the most
  const Agreement a = replay_all(load(kLongLlama), o);
  MESSAGE("CP: " << a.candidates << " candidates, choice / fastest " << a.analytic_choice_vs_fastest
                 << ", Spearman " << a.spearman << ", worst |analytic / SimGrid - 1| " << a.worst_vs_simgrid);
  CHECK(a.analytic_choice_vs_fastest <= 1.02);
  CHECK(a.spearman >= 0.9);
  CHECK(a.worst_vs_simgrid <= 0.005);  // measured 0.04%
  Search3dOptions e = o;
  e.micro_batch_sizes = {1, 2};
  e.recompute = {Recompute::None, Recompute::Selective};
  e.distributed_optimizer = {false, true};
  const EstimateAgreement x = compare_estimate(load(kLongLlama), e, 8);
  MESSAGE(x.both << " candidates in both, " << x.equal << " equal within 1e-9; worst time difference "
                 << x.worst_time << " (" << x.worst_label << "); worst memory difference " << x.worst_memory);
  CHECK(x.only_exact == 0);
  CHECK(x.only_estimate == 0);
  CHECK(x.worst_memory <= 1e-9);
  CHECK(x.worst_time <= 0.005);  // measured 0.22% (a candidate without CP), 380 of 444 equal
  // The distributed optimizer shards over the dp x cp group (Megatron's): at d 1 and cp > 1 it is a
  // candidate of its own, with less memory than the same run without it (left out until 2026-12-05).
  Search3dOptions z = o;
  z.distributed_optimizer = {false, true};
  Result<Search3dResult> zr = search3d(load(kLongLlama), z);
  REQUIRE_MESSAGE(zr.ok(), (zr.ok() ? "" : zr.error().message));
  int sharded = 0;
  for (const Search3dCandidate& c : zr->ranked)
    if (c.d == 1 && c.cp > 1 && c.distributed_optimizer)
      for (const Search3dCandidate& u : zr->ranked)
        if (!u.distributed_optimizer && u.t == c.t && u.p == c.p && u.cp == c.cp && u.d == 1 && u.b == c.b &&
            u.cp_algorithm == c.cp_algorithm && u.uneven == c.uneven &&
            u.sequence_parallel == c.sequence_parallel) {
          ++sharded;
          CHECK(c.peak_memory_bytes < u.peak_memory_bytes);
        }
  CHECK(sharded > 0);
}

// MoE at d = cp = 1: the distributed optimizer still shards the experts' state over their expert
// data-parallel group, t x cp x d / (ep x etp) = 4 devices at t 4, ep = etp = 1 (it was left out as
// "the same run as without"). The small MoE at t 4, p 4 holds one block per stage, each device all 8
// experts of 3 x 1024 x 1024 parameters (25,165,824): sharding 12 bytes of fp32 state per parameter
// (mixed-adam's master weights and two moments) over 4 saves 3/4 of it, 226,492,416 bytes.
TEST_CASE("search3d MoE: the distributed optimizer at d = cp = 1 shards the experts' state") {
  Search3dOptions o;
  o.global_batch = 16;
  o.tensor_parallel = {4};
  o.pipeline = {4};
  o.micro_batch_sizes = {2};
  o.expert_parallel = {1};
  o.expert_tensor_parallel = {1};
  o.dispatchers = {MoeDispatcher::AllToAll};
  o.schedules = {"1f1b"};
  o.recompute = {Recompute::None};
  o.sequence_parallel = {true};
  o.distributed_optimizer = {false, true};
  Result<Search3dResult> res = search3d(load(kMoe), o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  REQUIRE(res->ranked.size() == 2);
  const Search3dCandidate& a = res->ranked[0].distributed_optimizer ? res->ranked[1] : res->ranked[0];
  const Search3dCandidate& z = res->ranked[0].distributed_optimizer ? res->ranked[0] : res->ranked[1];
  REQUIRE(z.distributed_optimizer);
  REQUIRE_FALSE(a.distributed_optimizer);
  CHECK(a.peak_memory_bytes - z.peak_memory_bytes == pipegrid::testing::approx(0.75 * 12 * 25165824.0));
  // At ep x etp = t nothing is left to shard: the same run, left out.
  o.expert_parallel = {4};
  res = search3d(load(kMoe), o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  CHECK(res->left_out.at("distributed optimizer at d = cp = 1 and ep x etp = t (the same run as without)") ==
        1);
}

// The contiguous split (cp_load_balance false): the last context rank attends to the whole sequence
// before its part, the first to its own part only, so the busiest rank sets the pace. The estimate
// costed rank 0 (half the attention of the mean) and ranked large cp first, 2.1x fast against the
// replay; it costs the busiest position now. a2a, which splits evenly, is left out with the base's
// cp_load_balance false (the loader refuses the pair).
TEST_CASE("search3d CP: without the load-balanced split the estimate costs the busiest context rank") {
  const Experiment base =
      load(with_strategy(kLongLlama, "context_parallel: 2, cp_load_balance: false").c_str());
  Search3dOptions o;
  o.global_batch = 8;
  o.tensor_parallel = {1, 2};
  o.pipeline = {1};
  o.micro_batch_sizes = {1};
  o.schedules = {"1f1b"};
  o.recompute = {Recompute::None};
  o.context_parallel = {2, 4, 8};
  const EstimateAgreement x = compare_estimate(base, o, 8);
  MESSAGE(x.both << " candidates in both; worst time difference " << x.worst_time << " (" << x.worst_label
                 << ")");
  CHECK(x.both > 0);
  CHECK(x.only_exact == 0);
  CHECK(x.only_estimate == 0);
  CHECK(x.worst_time <= 0.01);  // measured 0.75% (t2 cp8 all_gather); rank 0's costs were about 2x fast
  Result<Search3dResult> res = search3d(base, o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  CHECK(
      res->left_out.count(
          "CP: a2a beside the base's cp_load_balance false (a2a splits the sequence evenly; Megatron and run "
          "refuse the pair)") == 1);
  for (const Search3dCandidate& c : res->ranked) CHECK(c.cp_algorithm != CpAlgorithm::AllToAll);
}

// Uneven stages (issue 51, items 3 and 5): where p x v does not divide the blocks but divides them with
// the embedding and the loss counted as blocks, the candidate uses Megatron-Core's
// --account-for-embedding/loss-in-pipeline-split. A 10-block GPT on 16 GPUs: p 4 takes 12 slots,
// 3 per rank: the first rank holds the embedding and 2 blocks, the middle ranks 3, the last 2 and the
// loss; p 8 (12 slots over 8) stays out.
TEST_CASE("search3d layouts where no even or accounted split fits: slots spread by hand") {
  // The embedding, the loss and each MTP module one slot; every stage slots / stages, the remainder one
  // more on the middle stages, then the first.
  CHECK(search3d_layout(9, 0, 2) == "Et*5|t*4L");        // 11 slots: 6, 5
  CHECK(search3d_layout(9, 0, 4) == "Et*2|t*3|t*3|tL");  // 11: 2 each, 3 left: stages 1, 2, then 0
  CHECK(search3d_layout(4, 1, 2) == "Et*3|tmL");         // 7: 4, 3 (the module and the loss in the 3)
  // DeepSeek-V3's 61 blocks and one module on 16 stages: 64 slots, 4 each.
  std::string deepseek = "Et*3";
  for (int s = 0; s < 14; ++s) deepseek += "|t*4";
  CHECK(search3d_layout(61, 1, 16) == deepseek + "|t*2mL");
  CHECK(search3d_layout(8, 0, 16).empty());  // 10 slots for 16 stages
  CHECK(search3d_layout(3, 2, 4).empty());   // 7 slots: the last stage's 1 cannot hold 2 modules and the loss
  CHECK(search3d_layout(8, 0, 1).empty());   // one stage: no layout needed
  // Each is a layout the megatron partitioner takes (the counts by hand).
  MegatronSplit split;
  split.layout = search3d_layout(61, 1, 16);
  CHECK(megatron_layout(61, 16, 1, "1f1b", split, 1).blocks ==
        std::vector<int>{3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2});
}

namespace {
// The transformer blocks of each stage of a candidate's experiment, as the megatron partitioner splits them.
std::vector<int> stage_blocks(const Experiment& base, const Search3dCandidate& c) {
  Result<PreparedRun> run = prepare(search3d_experiment(base, c));
  REQUIRE_MESSAGE(run.ok(), (run.ok() ? "" : run.error().message));
  std::vector<int> blocks;
  for (size_t s = 0; s < run->partition.stage_count(); ++s) {
    int n = 0;
    for (int l : run->partition.graph[s].layers) n += is_block(base.workload.layer(l).split.kind);
    blocks.push_back(n);
  }
  return blocks;
}
}  // namespace

TEST_CASE("search3d: uneven stages where p does not divide the blocks, laid out as Megatron-Core does") {
  std::string text = kGpt;
  text.replace(text.find("layers: 8"), 9, "layers: 10");
  const Experiment base = load(text.c_str());
  Search3dOptions o;
  o.global_batch = 16;
  o.micro_batch_sizes = {1, 2};
  o.schedules = {"1f1b", "interleaved-1f1b"};
  o.chunks = {3};
  o.recompute = {Recompute::None};
  Result<Search3dResult> res = search3d(base, o);
  REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
  size_t uneven = 0, laid_out = 0;
  for (const Search3dCandidate& c : res->ranked) {
    const int stages = c.p * c.v;
    CHECK(c.uneven == (10 % stages != 0 && 12 % stages == 0));
    // p 8 (v 1): neither 10 nor 12 over 8 stages; a layout of the 12 slots, 1 each and the 4 left over
    // on stages 1-4: 0, 2, 2, 2, 2, 1, 1, 0 blocks.
    CHECK(c.layout.empty() == (stages != 8));
    if (!c.layout.empty()) {
      ++laid_out;
      CHECK(c.layout == "E|t*2|t*2|t*2|t*2|t|t|L");
      CHECK(c.label().find("1f1b layout") != std::string::npos);
      CHECK(stage_blocks(base, c) == std::vector<int>{0, 2, 2, 2, 2, 1, 1, 0});
    }
    if (!c.uneven || c.v != 1) continue;
    ++uneven;
    CHECK(c.p == 4);
    CHECK(c.label().find("1f1b uneven") != std::string::npos);
    CHECK(stage_blocks(base, c) == std::vector<int>{2, 3, 3, 2});
  }
  CHECK(uneven > 0);
  CHECK(laid_out > 0);
  // The estimate against the whole graph on them (p 4, v 1 and v 3: 12 slots, one per chunk; p 8: the
  // layout).
  const EstimateAgreement a = compare_estimate(base, o, 8);
  MESSAGE(a.both << " candidates in both, " << a.equal << " equal within 1e-9; worst time difference "
                 << a.worst_time << " (" << a.worst_label << "); worst memory difference " << a.worst_memory);
  CHECK(a.only_exact == 0);
  CHECK(a.only_estimate == 0);
  CHECK(a.worst_memory <= 1e-9);
  CHECK(a.worst_time <= 0.002);  // measured 1.6e-5 (100 of 102 equal within 1e-9)
}

// The estimate of MoE candidates against the whole graph's evaluation (the oracle: every device's
// expert all-to-all lowered as flows, every expert data-parallel ring). The estimate times the all-to-all
// in closed form over the group's machines and the expert gradients after the dense ones; what it
// misses is measured here and stated in docs/3d-search.md ("Expert parallelism").
// The MoE comparisons' axes: the small MoE's candidates at global batch 16, micro-batch 1 or 2, 1F1B
// or interleaved (v 2), no recomputation, the given dispatchers (empty: the search's default).
namespace {
EstimateAgreement moe_estimate_agreement(std::vector<MoeDispatcher> dispatchers = {}) {
  Search3dOptions o;
  o.global_batch = 16;
  o.micro_batch_sizes = {1, 2};
  o.schedules = {"1f1b", "interleaved-1f1b"};
  o.chunks = {2};
  o.recompute = {Recompute::None};
  if (!dispatchers.empty()) o.dispatchers = std::move(dispatchers);
  return compare_estimate(load(kMoe), o, 8);
}
}  // namespace

TEST_CASE("search3d MoE: the one-replica estimate against the whole graph's evaluation") {
  const EstimateAgreement a = moe_estimate_agreement();
  MESSAGE(a.both << " candidates in both, " << a.equal << " equal within 1e-9, " << a.only_exact
                 << " only exact, " << a.only_estimate << " only estimated; worst time difference "
                 << a.worst_time << " (" << a.worst_label << "), without tensor parallelism "
                 << a.worst_time_t1 << "; worst memory difference " << a.worst_memory);
  CHECK(a.both >= 700);
  CHECK(a.only_exact == 0);
  CHECK(a.only_estimate == 0);
  CHECK(a.worst_memory <= 1e-9);
  // Measured: 148 of 778 equal within 1e-9 (178 before group collectives across machines ran a ring
  // per NIC, issue 55, item 10), the worst 19.5% under (t2 p1 d8 ep8 etp2: the evaluator
  // queues the expert groups' all-to-all flows FIFO on shared ports, which the closed form shares), and
  // 18.1% at t 1 (the expert and dense gradients' rings interleaving on the same NICs). SimGrid's
  // replays side with the estimate there (the test above).
  CHECK(static_cast<double>(a.equal) >= 0.18 * a.both);
  CHECK(a.worst_time <= 0.2);
}

// The same with the deepep dispatcher (docs/moe.md): its all-to-alls in closed form against the
// evaluation of the whole graph's de-duplicated flows.
TEST_CASE("search3d MoE: the one-replica estimate against the whole graph's evaluation, deepep") {
  const EstimateAgreement d = moe_estimate_agreement({MoeDispatcher::DeepEP});
  MESSAGE(d.both << " candidates in both, " << d.equal << " equal within 1e-9; worst time difference "
                 << d.worst_time << " (" << d.worst_label << "); worst memory difference " << d.worst_memory);
  CHECK(d.both >= 100);
  CHECK(d.only_exact == 0);
  CHECK(d.only_estimate == 0);
  CHECK(d.worst_memory <= 1e-9);
  // Measured (2026-12-03): 28 of 252 equal within 1e-9, the worst 18.1% at t 1 p 1 d 16 ep 2, the case
  // the alltoall test above names (the expert and dense gradients' rings interleaving on the NICs).
  CHECK(d.worst_time <= 0.2);
}

// The TP-folded replay (Search3dEstimator::tp_folded: every replica and pipeline rank, each TP group
// as its rank 0 with its collectives folded into its passes) against the whole graph, both in
// SimGrid, for every candidate of the restricted axes. The oracle is the whole graph's replay (every
// rank lowered with its TP flows). Where a TP group fills its node (t = 8 here) nothing else shares
// its NVSwitch links, and the two agree to rounding; where several groups share a node, their TP
// flows contend with the pipeline and data-parallel flows there, which the fold does not see
// (docs/3d-search.md states the differences measured).
// DualPipe's pairs in the TP-folded replay: its passes carry their groups' collectives folded in, and
// each pair is shortened to its interleaved time (the estimate's closed form), where the whole graph
// runs each chunk's collectives beside the other chunk's compute as flows. Measured 2026-12-06, 22
// candidates each at t 2 and 4: at most 1e-5 (GPT) and 0.17% (Llama) apart; without the shortening the
// folded replay was 3.5% slower (the Llama at t 2).
TEST_CASE("search3d DualPipe: the TP-folded replay against the whole graph's, both in SimGrid") {
  for (const char* text : {kGpt, kLlama}) {
    const Experiment base = load(text);
    Search3dOptions o;
    o.global_batch = 64;
    o.micro_batch_sizes = {1};
    o.schedules = {"dualpipe", "dualpipev"};
    o.recompute = {Recompute::None};
    o.distributed_optimizer = {false};
    o.tensor_parallel = {2, 4};
    Result<Search3dResult> res = search3d(base, o);
    REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
    REQUIRE(res->ranked.size() >= 8);
    Search3dEstimator folded(base);
    double worst = 0;
    std::string worst_label;
    for (const Search3dCandidate& c : res->ranked) {
      const double diff = folded_against_whole(base, folded, c);
      if (diff > worst) worst = diff, worst_label = c.label();
    }
    MESSAGE(res->ranked.size() << " candidates: worst difference " << worst << " (" << worst_label << ")");
    CHECK(worst <= 0.005);
  }
}

TEST_CASE("search3d: the TP-folded replay against the whole graph's, both in SimGrid") {
  struct Case {
    std::string text;
    bool has_t8;  // the Llama's 4 KV heads allow t <= 4
  };
  for (const Case& k :
       {Case{kGpt, true}, Case{kLlama, false}, Case{with_strategy(kGpt, "allreduce: multi-ring"), true},
        Case{with_strategy(kLlama, "allreduce: multi-ring"), false}}) {
    const Experiment base = load(k.text.c_str());
    Search3dOptions o;
    o.global_batch = 16;
    o.micro_batch_sizes = {1, 2};
    o.schedules = {"1f1b", "interleaved-1f1b"};
    o.chunks = {2};
    o.recompute = {Recompute::None, Recompute::Selective};
    Result<Search3dResult> res = search3d(base, o);
    REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
    REQUIRE(res->ranked.size() >= 50);
    Search3dEstimator folded(base);
    size_t filled = 0;
    double worst_filled = 0, worst = 0;
    for (const Search3dCandidate& c : res->ranked) {
      const double diff = folded_against_whole(base, folded, c);
      worst = std::max(worst, diff);
      if (c.t == 8) {
        ++filled;
        worst_filled = std::max(worst_filled, diff);
      }
    }
    MESSAGE(res->ranked.size() << " candidates, " << filled << " with t = 8: worst difference "
                               << worst_filled << "; over all " << worst);
    if (k.has_t8) CHECK(filled >= 10);
    CHECK(worst_filled <= 1e-9);
    CHECK(worst <= 0.005);
  }
}

// DualPipe and DualPipeV as search axes (named in --schedules): the estimate against the whole graph's
// evaluation (the oracle: both pipelines' every stage lowered, each stage's gradients reduced with its
// mirror's over both ranks' replicas, as the lowering does), and the candidates counted by hand.
TEST_CASE("search3d DualPipe: candidates by DeepSeek's rules, the estimate against the whole graph") {
  Search3dOptions o;
  o.global_batch = 64;
  o.micro_batch_sizes = {1, 2};
  o.schedules = {"dualpipe", "dualpipev"};
  o.recompute = {Recompute::None};
  o.sequence_parallel = {false};
  o.distributed_optimizer = {false};
  o.tensor_parallel = {1};
  // By hand, t 1 on 16 devices, 8 blocks: (p, d) in (1, 16), (2, 8), (4, 4), (8, 2), (16, 1), b in {1, 2},
  // m = 64 / (b d). DualPipe needs p and m even and m >= 2p: p 2, 4 and 8 at both b (m 8 and 4, 16 and 8,
  // 32 and 16); p 1 is odd and p 16 has more stages than the 8 blocks + 2 slots. DualPipeV needs m >= 2p
  // and 2p stages: p 1, 2 and 4 at both b (m 4 and 2, 8 and 4, 16 and 8); p 8's 16 stages exceed them.
  std::set<std::string> want;
  for (int p : {2, 4, 8})
    for (int b : {1, 2})
      want.insert(fmt::format("t1 p{} d{} b{} m{} dualpipe none", p, 16 / p, b, 64 * p / (16 * b)));
  for (int p : {1, 2, 4})
    for (int b : {1, 2})
      want.insert(fmt::format("t1 p{} d{} b{} m{} dualpipev none", p, 16 / p, b, 64 * p / (16 * b)));
  for (const char* text : {kGpt, kLlama}) {
    Result<Search3dResult> res = search3d(load(text), o);
    REQUIRE_MESSAGE(res.ok(), (res.ok() ? "" : res.error().message));
    std::set<std::string> got;
    for (const Search3dCandidate& c : res->ranked) got.insert(c.label());
    CHECK(got == want);
    // Measured 2026-12-06: 12 in both, the worst 2.1e-5 (GPT) and 0.59% (Llama, t1 p8 d2: every rank
    // pair's ring crosses the two nodes; the closed form times each pair's rings alone, the whole graph's
    // share the nodes' links with each other and with the pipeline's transfers).
    const EstimateAgreement a = compare_estimate(load(text), o, 8);
    MESSAGE(a.both << " candidates in both, " << a.equal << " equal within 1e-9; worst time difference "
                   << a.worst_time << " (" << a.worst_label << ")");
    CHECK(a.both == want.size());
    CHECK(a.only_exact == 0);
    CHECK(a.only_estimate == 0);
    CHECK(a.worst_memory <= 1e-9);
    CHECK(a.worst_time <= 0.006);
  }
  // With tensor or expert parallelism the estimate times each overlapped pair in closed form, its two
  // passes' pieces interleaved (each one's collectives beside the other's compute) on one
  // representative, without the other replicas' flows sharing the links. Measured 2026-12-06 on the
  // Llama at t 2 with SP: 6 in both, the worst 2.5% (t2 p4 d2 dualpipe).
  o.tensor_parallel = {2};
  o.sequence_parallel = {true};
  o.micro_batch_sizes = {1};
  const EstimateAgreement tp = compare_estimate(load(kLlama), o, 8);
  MESSAGE("t 2: " << tp.both << " candidates in both; worst time difference " << tp.worst_time << " ("
                  << tp.worst_label << ")");
  CHECK(tp.both == 6);  // by hand as above at t 2, b 1: dualpipe at p 2, 4, 8; dualpipev at p 1, 2, 4
  CHECK(tp.only_exact + tp.only_estimate == 0);
  CHECK(tp.worst_memory <= 1e-9);
  CHECK(tp.worst_time <= 0.03);
  // MoE: each stage's expert gradients reduced with its mirror's over both ranks' expert data-parallel
  // groups. Measured 2026-12-06: 74 in both, time at most 12.4% off (t1 p1 d16 ep8 etp2 dualpipev, the
  // estimate faster), memory at most 1.4% above the whole graph's (the folded passes are one piece each,
  // so the pairs' activations are not spread over pieces as the whole graph's are).
  o.tensor_parallel = {1};
  o.sequence_parallel = {false};
  o.global_batch = 32;
  const EstimateAgreement a = compare_estimate(load(kMoe), o, 8);
  MESSAGE("MoE: " << a.both << " candidates in both, " << a.equal
                  << " equal within 1e-9; worst time difference " << a.worst_time << " (" << a.worst_label
                  << "), memory " << a.worst_memory);
  CHECK(a.both >= 70);
  CHECK(a.only_exact == 0);
  CHECK(a.only_estimate == 0);
  CHECK(a.worst_memory <= 0.015);
  CHECK(a.worst_time <= 0.13);
  // The breakdown charges each stage's exposed collectives per micro-batch it runs (DualPipe's two
  // pipelines run half of them each: charging all made DeepSeek-V3's compute negative), less what the
  // pairs hide, and the graph it is read from carries no gradient reduction (the closed form's): every
  // part >= 0. 1F1B runs stage r's m micro-batches on rank r and DualPipe half of stage r's and half of
  // stage p - 1 - r's, the same stages, so without the pairs' overlap the mean exposed all-to-all
  // would be the same: with it, DualPipe's is at most 1F1B's.
  o.schedules = {"1f1b", "dualpipe"};
  Result<Search3dResult> moe = search3d(load(kMoe), o);
  REQUIRE_MESSAGE(moe.ok(), (moe.ok() ? "" : moe.error().message));
  std::map<std::string, double> ep_1f1b;
  for (const Search3dCandidate& c : moe->ranked)
    if (c.schedule == "1f1b") ep_1f1b[c.label()] = c.breakdown.expert_parallel_s;
  int paired = 0;
  for (const Search3dCandidate& c : moe->ranked) {
    const TimeBreakdown& b = c.breakdown;
    for (double x : {b.compute_s, b.tensor_parallel_s, b.expert_parallel_s, b.pipeline_s, b.data_parallel_s,
                     b.bubble_s, b.optimizer_s})
      CHECK(x >= -1e-12);
    if (c.schedule != "dualpipe") continue;
    std::string twin = c.label();
    twin.replace(twin.find("dualpipe"), 8, "1f1b");
    if (auto it = ep_1f1b.find(twin); it != ep_1f1b.end()) {
      ++paired;
      CHECK(b.expert_parallel_s <= it->second * (1 + 1e-9));
    }
  }
  CHECK(paired >= 10);
}

TEST_CASE("search3d MoE: the all-to-all overlap's pairs, estimated against the whole graph, both values") {
  // The small MoE with --moe-overlap false true at t 1 and 2, 1F1B and interleaved v 2: the estimate
  // times each pair in closed form on one representative, the whole graph's evaluation runs every pair
  // with every replica's flows; under interleaving both pair Megatron-Core's steady state only (one more
  // warm-up forward). Measured 2026-12-06 (docs/3d-search.md).
  Search3dOptions o;
  o.global_batch = 32;
  o.tensor_parallel = {1, 2};
  o.schedules = {"1f1b", "interleaved-1f1b"};
  o.chunks = {2};
  o.recompute = {Recompute::None};
  o.micro_batch_sizes = {1, 2};
  o.dispatchers = {MoeDispatcher::AllToAll};
  o.moe_overlap = {false, true};
  const Experiment base = load(kMoe);
  o.exact = true;
  Result<Search3dResult> exact = search3d(base, o);
  REQUIRE_MESSAGE(exact.ok(), (exact.ok() ? "" : exact.error().message));
  o.exact = false;
  Result<Search3dResult> fast = search3d(base, o);
  REQUIRE_MESSAGE(fast.ok(), (fast.ok() ? "" : fast.error().message));
  std::map<std::string, double> whole;
  for (const Search3dCandidate& c : exact->ranked) whole[c.label()] = c.iteration_time_s;
  std::vector<double> est, ref, diff;
  size_t overlapped = 0, interleaved_pairs = 0;
  for (const Search3dCandidate& c : fast->ranked) {
    auto it = whole.find(c.label());
    REQUIRE(it != whole.end());
    if (!c.moe_overlap) continue;
    ++overlapped;
    interleaved_pairs += c.schedule == "interleaved-1f1b";
    est.push_back(c.iteration_time_s);
    ref.push_back(it->second);
    diff.push_back(std::abs(c.iteration_time_s / it->second - 1));
  }
  REQUIRE(overlapped >= 20);
  CHECK(interleaved_pairs >= 5);
  CHECK(fast->ranked.size() == exact->ranked.size());
  std::vector<double> sorted = diff;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], p90 = sorted[sorted.size() * 9 / 10],
               worst = sorted.back();
  MESSAGE(overlapped << " overlapped candidates (" << interleaved_pairs
                     << " interleaved), median |difference| " << median << ", 90th percentile " << p90
                     << ", worst " << worst << ", Spearman " << rho(est, ref));
  CHECK(median <= 0.03);
  CHECK(worst <= 0.15);
  CHECK(rho(est, ref) >= 0.98);
}

TEST_CASE("search3d MoE: dp_overlap buckets the first stage's expert gradients during its last backward") {
  // Experts of FFN 4096 (8 x 3 x 1024 x 4096 = 100.7 M parameters a block): at ep 2 a device holds 201 M
  // expert parameters, 5 buckets of max(40 M, 1 M x d) (Megatron-Core's expert_parallel_buffers),
  // reduced over the expert data-parallel group during the last backward beside the dense buckets.
  // (Against the whole graph's analytic evaluation the estimate is far off on this case, 27% before the
  // expert buckets and 38% with them at t1 p1 d16 ep2 etp1, measured 2026-12-06: the expert gradients
  // are 4x the compute, and the evaluator runs flows that share a link in turn, so the reduction's flows
  // hold back the backward's all-to-alls, where SimGrid shares the links.)
  const std::string text = std::string(R"(name: small MoE with large experts on two DGX H100
workload: {model: mixtral-8x7b, layers: 4, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2048, expert_ffn: 4096,
           experts: 8, sequence: 1024, vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron, micro_batches: 1, allreduce: ring, replicas: 2, allow_fractional_samples: true,
           dp_overlap: true, gradient_reduce: fp32}
)");
  // In the whole graph of p 1, d 16, ep 2 (8 expert data-parallel groups of 8) the expert reduction
  // starts before the last backward ends: its first buckets' flows leave during it. Device 0's dense
  // ring (all 16 devices) sends to device 1, its expert ring (devices 0, 2, .., 14) to device 2.
  Search3dCandidate c;
  c.p = 1, c.d = 16, c.b = 1, c.micro_batches = 1, c.schedule = "1f1b", c.moe = true, c.ep = 2, c.etp = 1;
  const Experiment e = search3d_experiment(load(text.c_str()), c);
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), (run.ok() ? "" : run.error().message));
  Result<Timeline> tl = evaluate(run->graph, e.cluster);
  REQUIRE(tl.ok());
  double last_backward = 0, first_reduction = 1e30;
  size_t reductions = 0;
  for (size_t i = 0; i < run->graph.tasks.size(); ++i) {
    const Task& t = run->graph.tasks[i];
    if (t.device != 0) continue;
    if (t.kind == TaskKind::Backward) last_backward = std::max(last_backward, tl->end[i]);
    if (t.transfer == TransferKind::DataParallel && t.peer == 2) {
      ++reductions;
      first_reduction = std::min(first_reduction, tl->start[i]);
    }
  }
  // The expert buffer's buckets 0 .. K - 2 together, then the last: two stepped-ring all-reduces over 8
  // devices, 2 (8 - 1) steps each (one, 14 steps, after the last backward until 2026-12-06).
  CHECK(reductions == 2 * 14);
  CHECK(first_reduction < last_backward);
}
