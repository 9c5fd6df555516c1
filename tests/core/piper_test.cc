// The Piper-style planner (core/planners/piper.h): hand-computed optima on chains, and its DP's objective
// against a brute-force enumeration, written here, of every contiguous partition and per-stage (t, d) of a
// small GPT (stage costs from the lowering's stage_costs on whole stages, not the planner's per-layer sums).
#include "core/planners/piper.h"

#include <doctest/doctest.h>

#include <functional>
#include <limits>

#include "core/experiment.h"
#include "core/lower.h"
#include "core/memory.h"
#include "core/models/zoo.h"
#include "core/tensor_parallel.h"
#include "tests/support/approx.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

// Identical chain layers, F `f` + B `2 f` per micro-batch of 4 samples; activations `activation` bytes
// per micro-batch; `weights` bytes of fp32 weights per layer; no optimizer step time.
Workload chain(int layers, double activation, double weights, double f = 1e-3) {
  ChainSpec c;
  c.layers = layers;
  c.forward_s = f;
  c.backward_s = 2 * f;
  c.activation_bytes = activation;
  c.parameter_bytes = weights;
  c.samples_per_micro_batch = 4;
  return make_chain(c);
}

Result<PiperSolution> solve(const Workload& w, const Cluster& c, int m, const MemoryOptions& mem = {},
                            double micro_batch = 4) {
  StrategySpec s;
  s.planner = "piper";
  const PlanRequest r{w, c, s, mem, {{micro_batch, m}}, nullptr};
  return piper_partition(r, {micro_batch, m});
}

std::string shape(const PiperSolution& s) {
  std::string out;
  for (const PiperStage& st : s.stages)
    out += "[" + std::to_string(st.first) + "," + std::to_string(st.last) + ") t" + std::to_string(st.t) +
           " d" + std::to_string(st.d) + " ";
  return out;
}

}  // namespace

TEST_CASE("piper: 4 equal layers on 4 devices, heavy weights: four stages of one device") {
  // F 1 ms + B 2 ms per layer and micro-batch of 4 samples, 1 MB of activations per micro-batch, 1 GB of
  // weights per layer, 100 GB/s per link (2 hops through the switch, no latency), m = 8. By hand:
  //  - 4 stages x 1 device: 3 ms each, + the activation forward and its gradient back on the first three:
  //    2 x 1 MB / 100 GB/s = 20 us: bottleneck 3.02 ms;
  //  - any stage with d >= 2 replicas pays its ring all-reduce amortised over m: at least
  //    2 x 1/2 x 1 GB / 100 GB/s / 8 = 1.25 ms on top of >= 3 ms of compute per device;
  //  - fewer devices than 4 at d = 1: a stage of >= 2 layers, >= 6 ms.
  const Cluster c = make_switch_cluster(4, "gpu", test_device(), 100e9, 0);
  Result<PiperSolution> s = solve(chain(4, 1e6, 1e9), c, 8);
  REQUIRE_MESSAGE(s.ok(), s.error().message);
  INFO(shape(*s));
  CHECK(s->bottleneck_s == approx(3.02e-3));
  REQUIRE(s->stages.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(s->stages[i].first == static_cast<int>(i));
    CHECK(s->stages[i].d == 1);
    CHECK(s->stages[i].t == 1);
    CHECK(s->stages[i].first_device == static_cast<int>(i));
  }
}

TEST_CASE("piper: memory forces two stages where one replicated stage is faster") {
  // Two layers (F 1 ms + B 2 ms per micro-batch of 4), 1 GB of fp32 weights each, 100 MB of activations
  // per micro-batch, 2 devices at 100 GB/s, m = 64. By hand:
  //  - one stage, d = 2: (2 x 3 ms) / 2 = 3 ms + all-reduce 2 x 1/2 x 2 GB / 100 GB/s / 64 = 0.3125 ms
  //    = 3.3125 ms (the optimum with enough memory);
  //  - two stages of one layer: 3 ms + the first stage's activation and gradient, 2 x 100 MB / 100 GB/s
  //    = 2 ms: 5 ms.
  // A device holding 1.5 layers of static memory (weights, gradients, Adam: 16 bytes per parameter)
  // plus 1 GB for activations cannot hold both layers: two stages.
  const Cluster big = make_switch_cluster(2, "gpu", test_device(), 100e9, 0);
  Result<PiperSolution> a = solve(chain(2, 1e8, 1e9), big, 64);
  REQUIRE_MESSAGE(a.ok(), a.error().message);
  INFO(shape(*a));
  CHECK(a->bottleneck_s == approx(3.3125e-3));
  REQUIRE(a->stages.size() == 1);
  CHECK(a->stages[0].d == 2);

  const double one = total(static_memory(1e9 / 4, 1e9, MemoryOptions{}));
  const Cluster small = make_switch_cluster(2, "gpu", test_device(1.5 * one + 1e9), 100e9, 0);
  Result<PiperSolution> b = solve(chain(2, 1e8, 1e9), small, 64);
  REQUIRE_MESSAGE(b.ok(), b.error().message);
  INFO(shape(*b));
  CHECK(b->bottleneck_s == approx(5e-3));
  REQUIRE(b->stages.size() == 2);
  CHECK(b->stages[0].d == 1);
  CHECK(b->stages[1].d == 1);

  // Half a layer per device: nothing fits, an error that says so.
  const Cluster tiny = make_switch_cluster(2, "gpu", test_device(0.5 * one), 100e9, 0);
  Result<PiperSolution> none = solve(chain(2, 1e8, 1e9), tiny, 64);
  REQUIRE(!none.ok());
  CHECK(none.error().message.find("piper: no stage assignment fits") != std::string::npos);
}

TEST_CASE("piper: a heavier layer gets more replicas than a light one") {
  // Layer 0: F 2 ms + B 4 ms; layer 1: F 1 ms + B 2 ms (per micro-batch of 4); 1 MB of weights and 1 MB
  // of activations per micro-batch; 3 devices at 100 GB/s; m = 8. d must divide 4 (whole samples), so
  // d = 3 is out. By hand:
  //  - [layer 0 on d = 2][layer 1 on d = 1]: 6 / 2 = 3 ms + activation and gradient 2 x 0.5 MB / 100 GB/s
  //    = 10 us + all-reduce 2 x 1/2 x 1 MB / 100 GB/s / 8 = 1.25 us; then 3 ms: bottleneck 3.01125 ms;
  //  - [layer 0, d = 1][layer 1, d = 2]: 6 ms; one stage of both on d = 2: 4.5 ms; on d = 1: 9 ms.
  Workload w = chain(2, 1e6, 1e6);
  w.graph[0].measured->forward_s = 2e-3;
  w.graph[0].measured->backward_s = 4e-3;
  const Cluster c = make_switch_cluster(3, "gpu", test_device(), 100e9, 0);
  Result<PiperSolution> s = solve(w, c, 8);
  REQUIRE_MESSAGE(s.ok(), s.error().message);
  INFO(shape(*s));
  CHECK(s->bottleneck_s == approx(3.01125e-3));
  REQUIRE(s->stages.size() == 2);
  CHECK(s->stages[0].d == 2);
  CHECK(s->stages[1].d == 1);
  CHECK(s->devices == 3);
}

namespace {

// A small GPT (2 blocks, h 1024, 16 heads, s 512, vocabulary 51,200, amp), optionally with a custom layer
// (no tensor-parallel split) appended after the head.
Workload small_gpt(bool custom) {
  ModelArgs a{{"layers", 2}, {"hidden", 1024}, {"heads", 16}, {"sequence", 512}, {"vocabulary", 51200}};
  Workload w = *build_model(**find_model("gpt"), a, Precision::AMP);
  if (custom) {
    const int last = static_cast<int>(w.layer_count()) - 1;
    Layer l;
    l.name = "custom";
    l.kind = "custom";
    l.forward_flops = 2e9;
    l.backward_input_flops = 2e9;
    l.backward_weight_flops = 2e9;
    l.output_bytes = 4;
    l.stash_bytes = 1e6;
    l.parameters = 1e6;
    l.parameter_bytes = 2e6;
    const int v = w.add_layer(std::move(l));
    w.add_edge(last, v);
  }
  return w;
}

Cluster one_node(int n, double bandwidth, double latency) {
  DeviceSpec d = test_device(80e9);
  d.peak_flops[static_cast<int>(Precision::FP16)] = 312e12;
  d.peak_flops[static_cast<int>(Precision::FP32)] = 19.5e12;
  Cluster c = make_switch_cluster(n, "gpu", d, bandwidth, latency);
  for (Device& x : c.devices) x.node = "node0";
  return c;
}

// The planner's documented objective (core/planners/piper.h), computed for a whole stage [i, j) of the
// topological order with the lowering's stage_costs, on a one-machine switch cluster (every placement
// alike). Infinite when the stage does not fit memory.
double stage_time(const Workload& w, const Cluster& c, const MemoryOptions& mem,
                  const std::vector<int>& order, int i, int j, int t, int d, int after, double b, int m) {
  const int n = static_cast<int>(order.size());
  std::vector<int> stage_of(w.layer_count());
  std::vector<std::vector<int>> devices;
  int mine = 0;
  if (i > 0) devices.push_back({0});
  mine = static_cast<int>(devices.size());
  devices.push_back({});
  for (int q = 0; q < t; ++q) devices.back().push_back(q);
  if (j < n) devices.push_back({0});
  for (int q = 0; q < n; ++q) stage_of[order[q]] = q < i ? 0 : q < j ? mine : mine + 1;
  Result<Partition> p = make_partition(w, stage_of, devices, c.devices.size());
  REQUIRE(p.ok());
  p->graph[mine].tensor_parallel = t;
  Result<std::vector<std::vector<StageCost>>> costs = stage_costs(w, c, *p, b / d, mem.recompute, {});
  REQUIRE_MESSAGE(costs.ok(), costs.error().message);
  const StageCost& sc = (*costs)[mine][0];
  const double bw = c.links[0].bandwidth, lat = 2 * c.links[0].latency;  // device - switch - device
  double time = sc.times.forward + sc.times.backward() + sc.recompute_s;
  for (const TpProgram* prog : {&sc.tp_forward, &sc.tp_backward})
    for (size_t x = 0; x < prog->collectives(); ++x)
      time += lat + ring_flow_bytes(prog->kinds[x], prog->bytes[x], t) / bw;
  if (j < n) {
    const double cut = p->graph[boost::edge(mine, mine + 1, p->graph).first].bytes_per_sample;
    time += 2 * (lat + cut * b / (t * d) / bw);
  }
  double sync = w.optimizer_step_s >= 0
                    ? w.optimizer_step_s
                    : optimizer_step_time(sc.parameters, mem.optimizer, w.precision, c.devices[0].spec);
  if (d > 1) sync += 2.0 * (d - 1) * lat + 2.0 * (d - 1) / d * sc.parameter_bytes / bw;
  time += sync / m;
  const double need = total(static_memory(sc.parameters, sc.parameter_bytes, mem)) +
                      std::min(m, after + 1) * sc.stash_bytes + sc.recompute_bytes + sc.workspace_bytes;
  return need > c.devices[0].spec.memory_bytes ? std::numeric_limits<double>::infinity() : time;
}

// Every contiguous partition of the order, every (t, d) per stage with t d devices in all at most the
// cluster's: the smallest bottleneck.
double brute_force(const Workload& w, const Cluster& c, const MemoryOptions& mem, int b, int m) {
  const std::vector<int> order = topological_order(w);
  const int n = static_cast<int>(order.size());
  const int D = static_cast<int>(c.devices.size());
  auto t_allowed = [&](int i, int j, int t) {
    if (t == 1) return true;
    bool any_split = false;
    for (int q = i; q < j; ++q) {
      const Layer& l = w.layer(order[q]);
      if (l.split.kind == TensorSplitKind::Undefined || !tensor_parallel_layer(l, t, {}, w.precision).ok())
        return false;
      any_split = any_split || l.split.kind == TensorSplitKind::Transformer ||
                  l.split.kind == TensorSplitKind::VocabEmbedding ||
                  l.split.kind == TensorSplitKind::VocabHead;
    }
    return any_split;
  };
  double best = std::numeric_limits<double>::infinity();
  // Cut positions as a bit mask; stages listed first to last.
  for (int mask = 0; mask < (1 << (n - 1)); ++mask) {
    std::vector<std::pair<int, int>> stages;
    int from = 0;
    for (int q = 1; q < n; ++q)
      if (mask & (1 << (q - 1))) stages.push_back({from, q}), from = q;
    stages.push_back({from, n});
    const int S = static_cast<int>(stages.size());
    if (S > D) continue;
    std::function<void(int, int, double)> assign = [&](int s, int used, double slowest) {
      if (slowest >= best) return;
      if (s == S) {
        best = slowest;
        return;
      }
      for (int t = 1; t <= D; ++t)
        for (int d = 1; used + t * d + (S - s - 1) <= D; ++d) {
          if (b % d != 0 || !t_allowed(stages[s].first, stages[s].second, t)) continue;
          const double x =
              stage_time(w, c, mem, order, stages[s].first, stages[s].second, t, d, S - s - 1, b, m);
          assign(s + 1, used + t * d, std::max(slowest, x));
        }
    };
    assign(0, 0, 0);
  }
  return best;
}

}  // namespace

TEST_CASE("piper: the DP's bottleneck equals a brute force over every partition and (t, d), small GPT") {
  // 4 devices in one machine (one switch), micro-batches of 4, m = 4. Two networks: a fast one (tensor
  // parallelism pays off) and a slow one (it does not); with a custom layer at the end (no split: its
  // stage runs at t = 1) and without.
  for (bool custom : {false, true})
    for (double bw : {300e9, 5e9}) {
      const Workload w = small_gpt(custom);
      const Cluster c = one_node(4, bw, 1e-6);
      MemoryOptions mem;
      mem.optimizer = Optimizer::MixedAdam;
      Result<PiperSolution> s = solve(w, c, 4, mem, 4);
      REQUIRE_MESSAGE(s.ok(), s.error().message);
      INFO("custom " << custom << ", " << bw << " B/s: " << shape(*s));
      CHECK(static_cast<size_t>(s->blocks) == w.layer_count());  // small enough: one block per layer
      const double oracle = brute_force(w, c, mem, 4, 4);
      CHECK(s->bottleneck_s == approx(oracle).epsilon(1e-9));
      const std::vector<int> order = topological_order(w);
      for (const PiperStage& st : s->stages)
        for (int q = st.first; q < st.last; ++q)
          if (w.layer(order[q]).split.kind == TensorSplitKind::Undefined) CHECK(st.t == 1);
    }
}

TEST_CASE("piper: tensor-parallel groups stay inside a machine") {
  // Two machines of 2 devices: t is at most 2 and each group of 2 is one machine's pair.
  Cluster c = one_node(4, 300e9, 1e-6);
  c.devices[2].node = c.devices[3].node = "node1";
  MemoryOptions mem;
  mem.optimizer = Optimizer::MixedAdam;
  Result<PiperSolution> s = solve(small_gpt(false), c, 4, mem, 4);
  REQUIRE_MESSAGE(s.ok(), s.error().message);
  INFO(shape(*s));
  for (const PiperStage& st : s->stages) {
    CHECK(st.t <= 2);
    for (int j = 0; j < st.d; ++j) {
      const int a = st.first_device + j * st.t;
      for (int q = 1; q < st.t; ++q) CHECK(c.machine_of(a + q) == c.machine_of(a));
    }
  }
}

TEST_CASE(
    "piper: the plan gives every replica whole samples and lowers, and nothing fitting is a located error") {
  // Through the whole pipeline (prepare): every micro-batch size dividing the mini-batch is planned and
  // the one the analytic evaluator finds fastest kept; each stage's replicas divide it.
  Experiment e;
  e.workload = small_gpt(true);
  e.cluster = one_node(4, 300e9, 1e-6);
  e.memory.optimizer = Optimizer::MixedAdam;
  e.strategy.planner = "piper";
  e.strategy.mini_batch = 12;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), run.error().message);
  INFO(run->exploration);
  CHECK(run->planner == "piper");
  CHECK(12 % static_cast<int>(run->micro_batch_size) == 0);
  CHECK(run->micro_batches * run->micro_batch_size == 12);
  for (size_t s = 0; s < run->partition.stage_count(); ++s) {
    const Stage& st = run->partition.stage(s);
    CHECK(static_cast<int>(run->micro_batch_size) % st.replicas() == 0);
    for (int l : st.layers)
      if (e.workload.layer(l).split.kind == TensorSplitKind::Undefined) CHECK(st.tensor_parallel == 1);
  }
  CHECK(run->tried.size() == 6);  // 1, 2, 3, 4, 6, 12

  e.cluster = one_node(4, 300e9, 1e-6);
  for (Device& d : e.cluster.devices) d.spec.memory_bytes = 1e6;
  Result<PreparedRun> none = prepare(e);
  REQUIRE(!none.ok());
  CHECK(none.error().message.find("piper: no stage assignment fits the devices' memory") == 0);
}
