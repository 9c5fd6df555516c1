#include "tools/input/experiment_yaml.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "core/backends.h"
#include "core/collectives.h"
#include "core/models/builder.h"
#include "core/partitioners/megatron.h"
#include "core/planner.h"
#include "core/strategy.h"
#include "core/units.h"
#include "tools/input/backends_yaml.h"
#include "tools/input/cluster_yaml.h"
#include "tools/input/workload_yaml.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {
namespace {

std::vector<std::string_view> names_of(auto table) {
  std::vector<std::string_view> out;
  for (const auto& t : table) out.push_back(t.name);
  return out;
}

bool is_one_of(auto table, std::string_view name) {
  for (const auto& t : table)
    if (t.name == name) return true;
  return false;
}

// The names of the entries of a registry table that `has` a capability, as a message lists them:
// "a", "a and b", "a, b and c" (`last`: " and " or " or ").
std::string names_with(auto table, auto has, std::string_view last) {
  std::vector<std::string_view> names;
  for (const auto& t : table)
    if (has(t)) names.push_back(t.name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += fmt::format("{}{}", i == 0 ? "" : i + 1 == names.size() ? last : ", ", names[i]);
  return out;
}

// What a strategy's names resolve to in the registry: the parser checks each key against their
// capabilities instead of naming them.
struct Chosen {
  const PlannerInfo& planner;  // the planner that runs (planner_for)
  const PartitionStrategy& partitioner;
  const ScheduleStrategy& schedule;
};

// `planner`, `partitioner`, `schedule`. One model of the names: a planner decides the whole plan
// (stages, devices, schedule, micro-batches); a partitioner only cuts the stages, run by the default
// planner `partitioner` with the schedule given. A name of the other kind is pointed there instead
// of refused plainly.
Chosen parse_names(const Node& n, StrategySpec& s) {
  if (auto p = n.get("planner")) {
    const std::string name = p->is_scalar() ? p->yaml().Scalar() : "";
    if (!is_one_of(planners(), name) && is_one_of(partition_strategies(), name))
      p->fail(
          fmt::format("\"{}\" is a partitioner, not a planner: write `partitioner: {}` (the default planner, "
                      "`partitioner`, runs it with the schedule given); planners: {}",
                      name, name, join(names_of(planners()))));
    s.planner = p->choice(names_of(planners()), "a planner");
  }
  if (auto p = n.get("partitioner")) {
    const std::string name = p->is_scalar() ? p->yaml().Scalar() : "";
    if (!is_one_of(partition_strategies(), name) && is_one_of(planners(), name))
      p->fail(
          fmt::format("\"{}\" is a planner, not a partitioner: write `planner: {}` (it chooses the stages, "
                      "their devices, the schedule and the micro-batches itself); partitioners: {}",
                      name, name, join(names_of(partition_strategies()))));
    s.partitioner = p->choice(names_of(partition_strategies()), "a partitioner");
    // A planner other than the default cuts the stages itself (bapipe around its own partition step).
    if (n.get("planner") && s.planner != kDefaultPlanner && s.partitioner != s.planner)
      p->fail(
          fmt::format("planner {} cuts the stages itself: a partitioner given here would be ignored; "
                      "expected no partitioner with planner: {} (partitioners run under planner: {})",
                      s.planner, s.planner, kDefaultPlanner));
  }
  if (auto p = n.get("schedule")) {
    s.schedule = p->choice(names_of(schedule_strategies()), "a schedule");
    s.schedule_given = true;
    // Luo's planner orders the micro-batches with its own scheduler (core/planners/luo_schedule.cc).
    if (s.planner == "luo")
      p->fail(
          "the luo planner orders the micro-batches with its own scheduler: a schedule given here would "
          "be ignored; expected no schedule with planner: luo");
  }
  // The names are valid now: choice() refused any other.
  return {**planner_for(s), **find_partitioner(s.partitioner), **find_schedule(s.schedule)};
}

// `chunks`, the model chunks per rank of the schedules that interleave them.
void parse_chunks(const Node& n, StrategySpec& s, const Chosen& chosen) {
  // A schedule that places stages on ranks itself runs on stages cut in rank order: the default
  // planner's with uniform, balanced or megatron. The other planners and partitioners place their own
  // (dapple and piper dropped the chunks silently, the others failed inside the schedule).
  if (chosen.schedule.places_stages &&
      (!chosen.planner.runs_partitioner || !chosen.partitioner.stages_in_rank_order))
    n.need("schedule", "a schedule")
        .fail(fmt::format(
            "{} places stage s on a rank itself, so it needs stages cut in rank order, and {} {} places its "
            "own; "
            "expected the partitioner {} (planner: partitioner), or another schedule",
            s.schedule, chosen.planner.runs_partitioner ? "partitioner" : "planner",
            chosen.planner.runs_partitioner ? chosen.partitioner.name : chosen.planner.name,
            names_with(
                partition_strategies(), [](const auto& p) { return p.stages_in_rank_order; }, " or ")));
  if (auto ch = n.get("chunks")) {
    s.chunks = static_cast<int>(ch->integer(1, kMaxCount, "a positive integer"));
    if (s.chunks > 1 && !chosen.schedule.takes_chunks)
      ch->fail(fmt::format("expected 1 for schedule {} (chunks need {}), got {}", s.schedule,
                           names_with(
                               schedule_strategies(), [](const auto& t) { return t.takes_chunks; }, " or "),
                           s.chunks));
  }
  // DualPipeV runs two chunks per rank in a V (its reference's layout), never more.
  if (auto ch = n.get("chunks"); ch && chosen.schedule.name == "dualpipev" && s.chunks != 2)
    ch->fail(fmt::format("expected 2 for dualpipev (two model chunks per rank, in a V), got {}", s.chunks));
  // interleaved-1f1b with one chunk per rank is 1F1B: running it so would hide a missing key.
  if (chosen.schedule.needs_chunks && s.chunks < 2) {
    if (auto ch = n.get("chunks"))
      ch->fail(fmt::format("expected at least 2 model chunks per rank for {} (with 1 it is 1f1b), got 1",
                           s.schedule));
    n.need("schedule", "a schedule")
        .fail(fmt::format("{} needs strategy.chunks, the model chunks per rank ({})", s.schedule,
                          s.schedule == "dualpipev" ? "2, in a V" : "at least 2; with 1 it is 1f1b"));
  }
}

// The keys of the batch: strategy.global_batch (or mini_batch, its older name), strategy.micro_batch_size,
// strategy.micro_batches, and the older workload.micro_batch_size.
struct BatchKeys {
  std::optional<Node> global, per_replica, count, legacy;
};

BatchKeys batch_keys(const Node& strategy, const Node& workload) {
  BatchKeys k{strategy.get("global_batch"), strategy.get("micro_batch_size"), strategy.get("micro_batches"),
              workload.get("micro_batch_size")};
  if (auto mini = strategy.get("mini_batch")) {
    if (k.global) mini->fail("the older name of global_batch, given with it: give one of them");
    k.global = mini;
  }
  return k;
}

long long positive(const Node& n) {
  return n.integer(1, kMaxCount, "a positive integer");
}

// Where the strategy's d comes from, for messages: "d = 4: strategy.replicas".
std::string d_source(const Chosen& chosen, long long d) {
  return chosen.partitioner.replicas == ReplicaChoice::AllDevices
             ? fmt::format("d = {}: the {} partitioner's devices", d, chosen.partitioner.name)
             : fmt::format("d = {}: strategy.replicas", d);
}

// workload.micro_batch_size, the samples of a micro-batch over all of a stage's replicas: kept
// where it cannot be misread (d = 1, or a planner or partitioner that chooses each stage's
// replicas), refused with its rewrite where the strategy fixes d > 1 (Megatron's micro-batch size,
// which a user copies, is per replica).
void check_legacy(const BatchKeys& k, long long d) {
  if (!k.legacy) return;
  const Node& n = *k.legacy;
  if (k.per_replica)
    n.fail(
        "given with strategy.micro_batch_size (per replica, Megatron's --micro-batch-size): leave this one "
        "out");
  const long long w = positive(n);
  if (d > 1 && w % d == 0)
    n.fail(
        fmt::format("{} is the samples of one micro-batch over all {} replicas of a stage; write "
                    "strategy.micro_batch_size: {} (per replica, Megatron's --micro-batch-size)",
                    w, d, w / d));
  if (d > 1)
    n.fail(
        fmt::format("{} is the samples of one micro-batch over all {} replicas of a stage, {:g} per replica; "
                    "write strategy.micro_batch_size, the whole samples per replica (Megatron's "
                    "--micro-batch-size): a micro-batch is then {} times that",
                    w, d, static_cast<double>(w) / static_cast<double>(d), d));
  if (k.global && !k.count)
    n.fail(fmt::format(
        "not used with {} alone (every micro-batch size dividing it is tried): leave it out, or give "
        "strategy.micro_batches too (micro-batches of {} / micro_batches samples)",
        k.global->path(), k.global->path()));
}

// A micro-batch that d replicas split into fractional samples (the workload's default micro-batch
// under a fixed d > 1, no batch key given: 6 samples over 4 replicas) is refused at the key that
// fixes d, unless `allow_fractional_samples: true` asks for the linear costing of the fraction (what
// pipegrid did before issue 55, with a warning). A fractional micro-batch (a scaled profile) has no
// whole samples to keep (whole_samples_per_replica, core/strategy.h).
void check_whole_samples(const Node& n, const Chosen& chosen, const Experiment& e, long long d) {
  bool allow = false;
  if (auto a = n.get("allow_fractional_samples")) allow = a->boolean();
  const double size = e.micro_batch_size > 0 ? e.micro_batch_size : e.workload.micro_batch_size;
  if (allow || d <= 1 || e.strategy.partitioner_options.round_robin ||
      whole_samples_per_replica(size, static_cast<int>(d)))
    return;
  const std::optional<Node> key = n.get("replicas") ? n.get("replicas") : n.get("partitioner");
  const Node& at = key ? *key : n;
  at.fail(
      fmt::format("{} replicas would split the workload's micro-batch of {:g} sample{} into {:g} samples "
                  "each ({}), which no data "
                  "loader does: give strategy.micro_batch_size (whole samples per replica, Megatron's "
                  "--micro-batch-size) "
                  "or a d that divides {:g}; allow_fractional_samples: true costs the fraction linearly",
                  d, size, size == 1 ? "" : "s", size / static_cast<double>(d), d_source(chosen, d), size));
}

// The batch in Megatron-LM's vocabulary (docs/experiment-files.md, "Batch"): global_batch G
// (samples per iteration, --global-batch-size), micro_batch_size b (samples per data-parallel
// replica and micro-batch, --micro-batch-size) and micro_batches m, with G = b d m for the d the
// strategy fixes (fixed_replicas): any two give the third. G alone keeps the exploration of every
// micro-batch size dividing it (StrategySpec::mini_batch). Core plans with the pipeline's
// micro-batch, the b d samples a stage's replicas share (Experiment::micro_batch_size).
void parse_batch(const Node& n, const Node& workload, const Chosen& chosen, Experiment& e,
                 bool batch_required) {
  StrategySpec& s = e.strategy;
  const BatchKeys k = batch_keys(n, workload);
  const long long d = fixed_replicas(s, e.cluster.devices.size());
  check_legacy(k, d);
  if (k.per_replica && d == 0)
    k.per_replica->fail(fmt::format(
        "a micro-batch per replica is not defined where {} chooses each stage's replicas: give "
        "strategy.global_batch and strategy.micro_batches (its replicas split the pipeline's micro-batch of "
        "global_batch / micro_batches samples)",
        chosen.planner.runs_partitioner ? fmt::format("the {} partitioner", chosen.partitioner.name)
                                        : fmt::format("the {} planner", chosen.planner.name)));
  const long long g = k.global ? positive(*k.global) : 0;
  const long long b = k.per_replica ? positive(*k.per_replica) : 0;
  long long m = k.count ? positive(*k.count) : 0;
  // The pipeline's micro-batch: the samples of one micro-batch over a stage's replicas (0: not given).
  long long size = b > 0 ? b * d : k.legacy ? positive(*k.legacy) : 0;
  if (g > 0 && m == 0 && size == 0) {
    s.mini_batch = static_cast<int>(g);
    return;
  }
  if (g == 0 && m == 0 && !batch_required) return;  // the search sets its own batch
  if (g == 0) {
    m = positive(n.need("micro_batches", "a positive integer (or global_batch)"));
  } else if (m == 0) {  // b given: check_legacy refused the older size without micro_batches
    if (g % size != 0)
      k.global->fail(
          fmt::format("expected a multiple of micro_batch_size x d = {} x {} = {} ({}) for a whole number of "
                      "micro-batches, got {}",
                      b, d, size, d_source(chosen, d), g));
    m = g / size;
  } else if (size == 0) {
    const long long per = m * std::max(1LL, d);
    if (g % per != 0)
      k.global->fail(
          d > 0 ? fmt::format("expected a multiple of micro_batches x d = {} x {} = {} ({}) for whole "
                              "samples per replica, got {}",
                              m, d, per, d_source(chosen, d), g)
                : fmt::format("expected a multiple of micro_batches ({}) for whole samples per "
                              "micro-batch, got {}",
                              m, g));
    size = g / m;
  } else if (g != size * m) {
    k.global->fail(
        b > 0 ? fmt::format("expected micro_batch_size x d x micro_batches = {} x {} x {} = {} ({}), got {}",
                            b, d, m, size * m, d_source(chosen, d), g)
              : fmt::format("expected workload.micro_batch_size x micro_batches = {} x {} = {}, got {}", size,
                            m, size * m, g));
  }
  s.micro_batches = static_cast<int>(m);
  if (size > 0 && !(k.legacy && b == 0)) e.micro_batch_size = static_cast<double>(size);
  if (batch_required) check_whole_samples(n, chosen, e, d);  // the search sets its own batch
}

// Where a key is used by the default planner's partitioners with a capability only.
std::string used_by_partitioners(auto has) {
  return fmt::format("used by the {} partitioners", names_with(partition_strategies(), has, " and "));
}
std::string used_by_planners(auto has) {
  return fmt::format("used by the {} planner", names_with(planners(), has, " and "));
}

// The devices of a stage: `replicas` (d), `allreduce`, `tensor_parallel` (t) with
// `sequence_parallel`, `tp_overlap` and `tp_wgrad_overlap`.
void parse_replication(const Node& n, StrategySpec& s, const Chosen& chosen, const Cluster& c) {
  const auto given = [](const PartitionStrategy& p) { return p.replicas == ReplicaChoice::Given; };
  const auto runs_partitioner = [](const PlannerInfo& p) { return p.runs_partitioner; };
  if (auto r = n.get("replicas")) {
    s.replicas = static_cast<int>(r->integer(1, kMaxCount, "a positive integer"));
    if (s.replicas > 1 && !given(chosen.partitioner))
      r->fail(fmt::format("{}, not {}", used_by_partitioners(given), s.partitioner));
    if (s.replicas > 1 && !chosen.planner.runs_partitioner)
      r->fail(fmt::format("{}, not {}", used_by_planners(runs_partitioner), chosen.planner.name));
    if (static_cast<size_t>(s.replicas) > c.devices.size())
      r->fail(fmt::format("expected at most {} replicas (the cluster has {} devices), got {}",
                          c.devices.size(), c.devices.size(), s.replicas));
  }
  // Default: NCCL's pick (its tree or a ring per NIC, core/collectives.h) on GPUs; one ring where the
  // cluster has other devices (FPGAs run their own collective engines).
  s.allreduce = all_gpus(c) ? AllReduceAlgorithm::Nccl : AllReduceAlgorithm::Ring;
  if (auto a = n.get("allreduce")) {
    s.allreduce =
        *parse_allreduce(a->choice({"ring", "hierarchical", "multi-ring", "tree", "nccl"}, "an all-reduce"));
    if (s.allreduce == AllReduceAlgorithm::Nccl && !all_gpus(c))
      a->fail(
          "expected ring, hierarchical, multi-ring or tree on a cluster with devices other than GPUs "
          "(nccl is NCCL's pick, a GPU library), got \"nccl\"");
  }
  if (auto t = n.get("tensor_parallel")) {
    s.tensor_parallel = static_cast<int>(t->integer(1, kMaxCount, "a positive integer"));
    if (s.tensor_parallel > 1 && !chosen.partitioner.takes_tensor_parallel)
      t->fail(fmt::format("{}, not {}",
                          used_by_partitioners([](const auto& p) { return p.takes_tensor_parallel; }),
                          s.partitioner));
    if (s.tensor_parallel > 1 && !chosen.planner.runs_partitioner)
      t->fail(fmt::format("{}, not {}", used_by_planners(runs_partitioner), chosen.planner.name));
    if (static_cast<size_t>(s.tensor_parallel) * s.replicas > c.devices.size())
      t->fail(
          fmt::format("expected at most {} devices per stage (the cluster has {}), got {} replicas x "
                      "tensor_parallel {}",
                      c.devices.size(), c.devices.size(), s.replicas, s.tensor_parallel));
  }
  for (const char* key : {"sequence_parallel", "tp_overlap"})
    if (auto b = n.get(key)) {
      const bool on = b->boolean();
      if (on && s.tensor_parallel <= 1)
        b->fail(
            fmt::format("expected false without tensor_parallel > 1 (it changes nothing then), got true"));
      (std::string_view(key) == "sequence_parallel" ? s.sequence_parallel : s.tp_overlap) = on;
    }
  if (auto b = n.get("tp_wgrad_overlap")) {
    s.tp_wgrad_overlap = b->boolean();
    if (!s.tp_wgrad_overlap && s.tensor_parallel <= 1)
      b->fail(
          "expected true or no key without tensor_parallel > 1 (no tensor-parallel collective to overlap), "
          "got false");
  }
}

// `routing`: balanced, {zipf: s}, or a list of each expert's share of the token copies. A token's
// top_k copies go to top_k different experts, so no expert takes more than 1 / top_k of them.
std::vector<double> parse_routing(const Node& r, double experts, double top_k) {
  const double most = 1 / std::max(1.0, top_k);
  const std::string why = fmt::format("a token's {:g} copies go to {:g} different experts", top_k, top_k);
  if (r.is_scalar()) {
    r.choice({"balanced"}, "a routing (balanced, {zipf: exponent} or a list of shares)");
    return {};
  }
  if (r.is_map()) {
    r.check_keys({"zipf"});
    const Node z = r.need("zipf", "the exponent of a Zipf law over the experts (0: balanced)");
    const double s = z.number("an exponent from 0 to 100");
    if (!(s >= 0) || s > 100) z.expected("an exponent from 0 to 100");
    std::vector<double> shares = zipf_shares(static_cast<int>(experts), s);
    if (!shares.empty() && shares.front() > most * (1 + 1e-9)) {
      double lo = 0, hi = s;  // the largest exponent whose first share is at most 1 / top_k
      for (int i = 0; i < 60; ++i)
        (zipf_shares(static_cast<int>(experts), (lo + hi) / 2).front() <= most ? lo : hi) = (lo + hi) / 2;
      z.fail(
          fmt::format("gives the most popular expert {:.4g} of the token copies, above the 1/{:g} a top-{:g} "
                      "router can give one expert ({}); expected an exponent of at most {:.4g}",
                      shares.front(), top_k, top_k, why, lo));
    }
    return shares;
  }
  std::vector<double> shares;
  for (const Node& x : r.items("a list of each expert's share of the token copies")) {
    const double v = x.number("a share from 0 to 1");
    if (!(v >= 0 && v <= 1)) x.expected("a share from 0 to 1");
    if (v > most * (1 + 1e-9))
      x.expected(fmt::format("a share of at most 1/{:g} = {:.4g} ({})", top_k, most, why));
    shares.push_back(v);
  }
  if (shares.size() != static_cast<size_t>(experts))
    r.fail(fmt::format("expected {:g} shares (one per expert of the workload's MoE blocks), got {}", experts,
                       shares.size()));
  double total = 0;
  for (double v : shares) total += v;
  if (std::abs(total - 1) > 1e-6)
    r.fail(fmt::format("expected shares summing to 1, got a sum of {:.6g}", total));
  return shares;
}

// What the lowering would refuse about the expert sizes, located where the file sets them: Megatron-Core's
// sequence parallelism under t > 1, etp dividing the experts' FFN (check_moe), and ep x etp dividing a
// stage's t x cp x d devices where `stages` and `replicas` fix them (etp defaults to t, as Megatron's).
void check_expert_sizes(const Node& n, const StrategySpec& s, const Chosen& chosen, const Workload& w) {
  const Layer* block = nullptr;
  for (size_t l = 0; l < w.layer_count() && !block; ++l)
    if (w.layer(l).split.kind == TensorSplitKind::MoeBlock) block = &w.layer(l);
  if (!block) return;
  const int etp = s.expert_tensor_parallel > 0 ? s.expert_tensor_parallel : std::max(1, s.tensor_parallel);
  const std::string etp_text = s.expert_tensor_parallel > 0
                                   ? ""
                                   : fmt::format(" (expert_tensor_parallel defaults to tensor_parallel)");
  auto at = [&](const char* key) { return n.get(key) ? *n.get(key) : n; };
  if (s.tensor_parallel > 1 && !s.sequence_parallel)
    at("tensor_parallel")
        .fail(fmt::format("the workload has mixture-of-experts blocks, and Megatron-Core requires sequence "
                          "parallelism with them under tensor parallelism; expected sequence_parallel: true "
                          "beside tensor_parallel {}",
                          s.tensor_parallel));
  if (std::fmod(block->split.moe.expert_ffn, etp) != 0)
    at(s.expert_tensor_parallel > 0 ? "expert_tensor_parallel" : "tensor_parallel")
        .fail(fmt::format(
            "expected an expert tensor-parallel size dividing the experts' FFN width {:g}{}, got {}",
            block->split.moe.expert_ffn, etp_text, etp));
  if (!n.get("stages") || !chosen.planner.runs_partitioner ||
      chosen.partitioner.replicas != ReplicaChoice::Given || s.replicas <= 0)
    return;
  const int devices = std::max(1, s.tensor_parallel) * std::max(1, s.context_parallel) * s.replicas;
  const int ep = std::max(1, s.expert_parallel);
  if (devices % (ep * etp) != 0)
    at(n.get("expert_parallel") ? "expert_parallel" : "expert_tensor_parallel")
        .fail(fmt::format(
            "expected expert_parallel x expert_tensor_parallel to divide a stage's tensor_parallel x "
            "context_parallel x replicas = {} devices (Megatron folds the MoE layers' etp x ep x edp over "
            "them), got {} x {}{}",
            devices, ep, etp, etp_text));
}

// Expert parallelism of the MoE blocks (core/moe.h): `expert_parallel`, `expert_tensor_parallel` and
// the `moe` options (dispatcher, capacity factor, routing, overlap of the all-to-alls, their flows).
void parse_experts(const Node& n, StrategySpec& s, const Chosen& chosen, const Workload& w,
                   const Cluster& c) {
  const double experts = routed_experts(w);
  auto needs_moe = [&](const Node& x) {
    if (experts == 0)
      x.fail(
          fmt::format("the workload \"{}\" has no mixture-of-experts block (models mixtral-8x7b, "
                      "qwen3-30b-a3b, deepseek-v3, ...)",
                      w.name));
  };
  if (auto e = n.get("expert_parallel")) {
    s.expert_parallel = static_cast<int>(e->integer(1, kMaxCount, "a positive integer"));
    if (s.expert_parallel > 1) {
      needs_moe(*e);
      if (!chosen.partitioner.takes_tensor_parallel || !chosen.planner.runs_partitioner)
        e->fail(fmt::format(
            "{}, not {}", used_by_partitioners([](const auto& p) { return p.takes_tensor_parallel; }),
            chosen.planner.runs_partitioner ? s.partitioner : std::string(chosen.planner.name)));
      if (std::fmod(experts, s.expert_parallel) != 0)
        e->fail(fmt::format("expected a divisor of the {:g} experts (each device holds E / ep), got {}",
                            experts, s.expert_parallel));
      if (static_cast<size_t>(s.expert_parallel) > c.devices.size())
        e->expected(fmt::format("at most the cluster's {} devices", c.devices.size()));
    }
  }
  if (auto e = n.get("expert_tensor_parallel")) {
    needs_moe(*e);
    s.expert_tensor_parallel = static_cast<int>(e->integer(1, kMaxCount, "a positive integer"));
  }
  check_expert_sizes(n, s, chosen, w);
  auto m = n.get("moe");
  if (!m) return;
  needs_moe(*m);
  m->require_map(
      "a mapping of MoE options (dispatcher, capacity_factor, routing, overlap, all_to_all, router_fusion, "
      "permute_fusion, fused_grouped_mlp)");
  m->check_keys({"dispatcher", "capacity_factor", "routing", "overlap", "all_to_all", "router_fusion",
                 "permute_fusion", "fused_grouped_mlp"});
  if (auto d = m->get("dispatcher")) {
    s.moe.dispatcher = *parse_dispatcher(
        d->choice({std::begin(kMoeDispatcherNames), std::end(kMoeDispatcherNames)}, "a token dispatcher"));
    if (s.moe.dispatcher == MoeDispatcher::DeepEP && s.expert_parallel == 1)
      d->fail(
          "deepep de-duplicates tokens sent to other devices of the expert-parallel group, and at "
          "expert_parallel 1 there are none (the same run as alltoall); expected alltoall, or "
          "expert_parallel "
          "> 1 beside it");
  }
  if (auto f = m->get("capacity_factor")) {
    const std::string expectation = fmt::format(
        "a capacity factor above 0 and at most the {:g} experts (leave it out: dropless)", experts);
    s.moe.capacity_factor = f->number(expectation);
    if (!(s.moe.capacity_factor > 0) || s.moe.capacity_factor > experts) f->expected(expectation);
  }
  if (auto r = m->get("routing")) s.moe.expert_shares = parse_routing(*r, experts, moe_routing(w).top_k);
  // What DeepEP's de-duplication takes (balanced, dropless routing): located at the dispatcher.
  if (auto d = m->get("dispatcher"); d && s.moe.dispatcher == MoeDispatcher::DeepEP)
    for (size_t l = 0; l < w.layer_count(); ++l)
      if (w.layer(l).split.kind == TensorSplitKind::MoeBlock) {
        if (Status st = check_moe(w.layer(l), {}, s.moe); !st) d->fail(st.error().message);
        break;
      }
  if (auto o = m->get("overlap")) {
    s.moe_overlap = o->boolean();
    // Megatron-Core's rules (core/moe.h moe_overlap_refusal), located here where the file sets ep and
    // the stages; the plan is checked again (a planner chooses the stages, a search varies ep).
    if (s.moe_overlap)
      if (auto why = moe_overlap_refusal(n.get("expert_parallel") ? s.expert_parallel : 2, s.moe.dispatcher,
                                         std::max(1, s.stages), chosen.schedule.name))
        o->fail(fmt::format("{}; expected false or no overlap", *why));
  }
  // Megatron-Core's fused router and permutation (MoeOptions): the all-to-all dispatcher's launches.
  for (auto [key, flag] :
       {std::pair{"router_fusion", &s.moe.router_fusion}, std::pair{"permute_fusion", &s.moe.permute_fusion}})
    if (auto f = m->get(key)) {
      *flag = f->boolean();
      if (s.moe.dispatcher != MoeDispatcher::AllToAll)
        f->fail(
            fmt::format("counts the alltoall dispatcher's kernel launches, but the dispatcher is {}: it "
                        "would be ignored; expected no {} with this dispatcher",
                        to_string(s.moe.dispatcher), key));
    }
  // Transformer Engine's op fuser: it fuses fc2's bias and a clamped GLU and groups mxfp8's
  // quantization, one of which must be there.
  if (auto f = m->get("fused_grouped_mlp")) {
    s.moe.fused_grouped_mlp = f->boolean();
    if (s.moe.fused_grouped_mlp && eager_expert_work(w).empty() && w.precision != Precision::AMP_MXFP8)
      f->fail(
          "fuses the experts' fc2 bias and clamped GLU and groups their mxfp8 quantization, and this "
          "workload's MoE blocks have neither bias nor clamp, nor mxfp8: it would change nothing; expected "
          "false or no fused_grouped_mlp");
  }
  if (auto a = m->get("all_to_all")) {
    const std::string flows = a->choice({"auto", "pairwise", "by-node"}, "how an all-to-all is lowered");
    using Flows = MoeOptions::AllToAllFlows;
    s.moe.all_to_all = flows == "pairwise"  ? Flows::Pairwise
                       : flows == "by-node" ? Flows::ByNode
                                            : Flows::Auto;
    if (s.moe.dispatcher == MoeDispatcher::DeepEP && s.moe.all_to_all != Flows::Auto)
      a->fail(
          fmt::format("the deepep dispatcher sends its own flows (one per other node, one per device of the "
                      "node), so all_to_all: {} would be ignored; expected auto or no all_to_all",
                      flows));
    if (s.expert_parallel <= 1 && s.moe.all_to_all != Flows::Auto)
      a->fail(fmt::format(
          "lowers the expert-parallel all-to-alls, and at expert_parallel 1 there are none, so "
          "all_to_all: {} would be ignored; expected auto or no all_to_all, or expert_parallel > 1",
          flows));
    if (s.moe.dispatcher == MoeDispatcher::AllGather && s.moe.all_to_all != Flows::Auto)
      a->fail(
          fmt::format("the allgather dispatcher sends no all-to-all (it all-gathers the tokens), so "
                      "all_to_all: {} would be ignored; expected auto or no all_to_all",
                      flows));
  }
}

// Sequence parallelism splits each context-parallel rank's s / cp tokens of a block t ways (Megatron's
// rule), located at `sequence_parallel` with the file's sequence (the lowering names a rank's share).
void check_sequence_split(const Node& n, const StrategySpec& s, const Workload& w) {
  auto sp = n.get("sequence_parallel");
  if (!sp || !s.sequence_parallel || s.tensor_parallel <= 1) return;
  for (size_t l = 0; l < w.layer_count(); ++l) {
    if (!is_block(w.layer(l).split.kind)) continue;
    const double seq = w.layer(l).split.sequence, per_rank = seq / std::max(1, s.context_parallel);
    if (per_rank == std::floor(per_rank) && std::fmod(per_rank, s.tensor_parallel) != 0)
      sp->fail(fmt::format(
          "splits a block's {:g} tokens{} over tensor_parallel {}, which does not divide them; expected a "
          "sequence divisible by tensor_parallel{}",
          per_rank,
          s.context_parallel > 1
              ? fmt::format(" (the sequence {:g} / context_parallel {})", seq, s.context_parallel)
              : "",
          s.tensor_parallel, s.context_parallel > 1 ? " x context_parallel" : ""));
    return;
  }
}

// Context parallelism (core/context_parallel.h): `context_parallel` (cp), `cp_algorithm` and
// `cp_load_balance`; cp must split every block's sequence (a2a: its heads per device) as the algorithm
// needs, and t x cp divide the cluster's devices.
void parse_context(const Node& n, StrategySpec& s, const Chosen& chosen, const Workload& w,
                   const Cluster& c) {
  auto cp = n.get("context_parallel");
  if (cp) {
    s.context_parallel = static_cast<int>(cp->integer(1, kMaxCount, "a positive integer"));
    if (s.context_parallel > 1 &&
        (!chosen.partitioner.takes_tensor_parallel || !chosen.planner.runs_partitioner))
      cp->fail(fmt::format("{}, not {}",
                           used_by_partitioners([](const auto& p) { return p.takes_tensor_parallel; }),
                           chosen.planner.runs_partitioner ? s.partitioner : chosen.planner.name));
  }
  if (auto a = n.get("cp_algorithm"))
    s.context.algorithm =
        *parse_cp_algorithm(a->choice({"p2p", "all_gather", "a2a"}, "a context-parallel algorithm"));
  if (auto b = n.get("cp_load_balance")) s.context.load_balance = b->boolean();
  for (const char* key : {"cp_algorithm", "cp_load_balance"})
    if (auto x = n.get(key); x && s.context_parallel <= 1)
      x->fail(fmt::format("expected context_parallel > 1 beside it (it changes nothing without), got {}",
                          n.has("context_parallel") ? "context_parallel 1" : "none"));
  check_sequence_split(n, s, w);
  if (s.context_parallel <= 1) return;
  if (auto b = n.get("cp_load_balance");
      b && !s.context.load_balance && s.context.algorithm == CpAlgorithm::AllToAll)
    b->fail(
        "balances causal attention over ranks that each hold a part of the sequence, and under cp_algorithm "
        "a2a each rank attends over the whole sequence for its heads: it would change nothing; expected true "
        "or no cp_load_balance");
  const size_t group = static_cast<size_t>(s.tensor_parallel) * s.context_parallel;
  if (c.devices.size() % group != 0 || group * s.replicas > c.devices.size())
    cp->fail(
        fmt::format("expected tensor_parallel {} x context_parallel x replicas {} to fit and tensor_parallel "
                    "x context_parallel to divide the cluster's {} devices, got {}",
                    s.tensor_parallel, s.replicas, c.devices.size(), s.context_parallel));
  bool blocks = false;
  for (size_t l = 0; l < w.layer_count(); ++l) {
    if (Status st = check_context_parallel(w.layer(l), s.tensor_parallel, s.context_parallel, s.context); !st)
      cp->fail(st.error().message);
    blocks = blocks || is_block(w.layer(l).split.kind);
  }
  if (!blocks)
    cp->fail(
        fmt::format("splits the sequence of a transformer's blocks, and the workload \"{}\" has none; "
                    "expected context_parallel 1",
                    w.name));
}

// `stages`: the pipeline ranks, within the devices and the layers.
void parse_stages(const Node& n, StrategySpec& s, const Chosen& chosen, const Workload& w, const Cluster& c) {
  auto st = n.get("stages");
  if (!st) return;
  // The other planners choose the stages themselves: a count given here would be ignored.
  if (!chosen.planner.runs_partitioner)
    st->fail(fmt::format("used by the partitioner planner, not {} (it chooses the stages itself)",
                         chosen.planner.name));
  s.stages = static_cast<int>(st->integer(1, kMaxCount, "a positive integer"));
  if (s.replicas > 1 && s.tensor_parallel == 1 &&
      static_cast<size_t>(s.stages) * s.replicas > c.devices.size())
    st->fail(fmt::format("expected at most {} stages of {} replicas (the cluster has {} devices), got {}",
                         c.devices.size() / s.replicas, s.replicas, c.devices.size(), s.stages));
  if (s.context_parallel > 1 &&
      static_cast<size_t>(s.stages) * s.replicas * s.tensor_parallel * s.context_parallel > c.devices.size())
    st->fail(
        fmt::format("expected at most {} stages of {} replicas x tensor_parallel {} x context_parallel {} "
                    "(the cluster has "
                    "{} devices), got {}",
                    c.devices.size() / (s.replicas * s.tensor_parallel * s.context_parallel), s.replicas,
                    s.tensor_parallel, s.context_parallel, c.devices.size(), s.stages));
  if (s.tensor_parallel > 1 &&
      static_cast<size_t>(s.stages) * s.replicas * s.tensor_parallel > c.devices.size())
    st->fail(
        fmt::format("expected at most {} stages of {} replicas x tensor_parallel {} (the cluster has {} "
                    "devices), got {}",
                    c.devices.size() / (s.replicas * s.tensor_parallel), s.replicas, s.tensor_parallel,
                    c.devices.size(), s.stages));
  if (static_cast<size_t>(s.stages) > c.devices.size())
    st->fail(fmt::format("expected at most {} stages (the cluster has {} devices), got {}", c.devices.size(),
                         c.devices.size(), s.stages));
  if (static_cast<size_t>(s.stages) * s.chunks > w.layer_count())
    st->fail(s.chunks == 1
                 ? fmt::format("expected at most {} stages (the workload has {} layers), got {}",
                               w.layer_count(), w.layer_count(), s.stages)
                 : fmt::format("expected at most {} stages of {} chunks (the workload has {} layers), got {}",
                               w.layer_count() / s.chunks, s.chunks, w.layer_count(), s.stages));
}

// Megatron-Core's uneven pipeline split (core/partitioners/megatron.h): `first_stage_blocks` and
// `last_stage_blocks`, `account_for_embedding` and `account_for_loss`, or `layout`; checked here against
// the workload's blocks so that a split that does not fit is an error at the key at fault.
void parse_megatron_split(const Node& n, StrategySpec& s, const Chosen& chosen, const Workload& w) {
  MegatronSplit& m = s.partitioner_options.megatron;
  std::optional<Node> given;
  if (auto k = n.get("layout")) {
    m.layout = k->string("a Megatron-Core pipeline layout, e.g. \"Et*4|(t*4|)*14tmL\"");
    if (m.layout.empty())
      k->fail("expected a Megatron-Core pipeline layout, e.g. \"Et*4|(t*4|)*14tmL\", got \"\"");
    given = k;
  }
  for (const char* key : {"first_stage_blocks", "last_stage_blocks"})
    if (auto k = n.get(key)) {
      (std::string_view(key) == "first_stage_blocks" ? m.first_stage_blocks : m.last_stage_blocks) =
          static_cast<int>(k->integer(1, kMaxCount, "a positive number of transformer blocks"));
      given = k;
    }
  for (const char* key : {"account_for_embedding", "account_for_loss"})
    if (auto k = n.get(key)) {
      bool& on =
          std::string_view(key) == "account_for_embedding" ? m.account_for_embedding : m.account_for_loss;
      on = k->boolean();
      if (on) given = k;
    }
  if (!m.uneven()) {
    // An even split needs the blocks a multiple of the stages (x chunks): located at `stages` where
    // the file sets them, under every schedule (DualPipe's and DualPipeV's included).
    auto st = n.get("stages");
    if (!st || s.partitioner != "megatron" || !chosen.planner.runs_partitioner) return;
    const int blocks = megatron_blocks(w).blocks;
    if (blocks == 0) return;
    const MegatronLayout layout = megatron_layout(blocks, s.stages, std::max(1, s.chunks), s.schedule, m);
    if (!layout.ok()) st->fail(layout.problem);
    return;
  }
  if (s.partitioner != "megatron" || !chosen.planner.runs_partitioner)
    given->fail(
        fmt::format("used by the megatron partitioner (partitioner: megatron), not {}",
                    chosen.planner.runs_partitioner ? s.partitioner : std::string(chosen.planner.name)));
  if (s.stages == 0)
    given->fail(
        "needs strategy.stages, the pipeline ranks the blocks are split over (Megatron's "
        "--pipeline-model-parallel-size)");
  const auto [blocks, mtp] = megatron_blocks(w);
  if (blocks == 0) given->fail(fmt::format("the workload \"{}\" has no transformer block to split", w.name));
  const MegatronLayout layout = megatron_layout(blocks, s.stages, std::max(1, s.chunks), s.schedule, m, mtp);
  if (!layout.ok()) n.get(layout.key).value_or(*given).fail(layout.problem);
}

// Data-parallel gradients (core/lower.h): `dp_overlap`, overlapped with the first stage's last
// backward, and `gradient_reduce`, reduced in another precision than the workload's.
void parse_gradients(const Node& n, StrategySpec& s, const Chosen& chosen) {
  if (auto b = n.get("dp_overlap")) {
    s.dp_overlap = b->boolean();
    // Where `replicas` alone decides the replication (the other partitioners and planners choose it).
    if (s.dp_overlap && chosen.planner.runs_partitioner &&
        chosen.partitioner.replicas == ReplicaChoice::Given && s.replicas <= 1 && s.context_parallel <= 1)
      b->fail(
          fmt::format("expected false without replicas > 1 or context_parallel > 1 (the {} partitioner then "
                      "replicates no stage: no gradient is all-reduced), got true",
                      s.partitioner));
  }
  if (auto g = n.get("gradient_reduce")) {
    const std::string p =
        g->choice({"fp32", "bf16", "fp16"}, "the precision the data-parallel gradients are reduced in");
    s.gradient_reduce_bytes = p == "fp32" ? 4 : 2;
  }
}

// `hierarchy`: PipeDream's machine levels, innermost first.
void parse_hierarchy(const Node& h, StrategySpec& s, const Cluster& c) {
  long long machines = 1;
  const std::vector<Node> levels =
      h.items("a list of levels, innermost first, like [{workers: 4, bandwidth: 25GBps}]");
  for (size_t i = 0; i < levels.size(); ++i) {
    const Node& level = levels[i];
    level.require_map("a level: {workers: N, bandwidth: B}");
    level.check_keys({"workers", "bandwidth"});
    const int workers = static_cast<int>(
        level.need("workers", "a positive integer").integer(1, kMaxCount, "a positive integer"));
    const double bw = level.need("bandwidth", describe(Dimension::Bandwidth, "positive"))
                          .quantity(Dimension::Bandwidth, Sign::Positive);
    s.partitioner_options.hierarchy.emplace_back(workers, bw);
    // Checked level by level: the product stays below kMaxCount^2 (no overflow).
    machines *= workers;
    if (machines > static_cast<long long>(c.devices.size()))
      h.fail(fmt::format("expected at most {} machines in all (the cluster has {} devices), got {}{}",
                         c.devices.size(), c.devices.size(), machines,
                         i + 1 < levels.size() ? " or more" : ""));
  }
}

// `replica_mode`: how a stage's data-parallel replicas share the micro-batches. `split` (each takes
// b / d samples of every micro-batch, as Megatron and DAPPLE run) or `round-robin` (each takes whole
// micro-batches in turn, as PipeDream runs them: any replica count keeps whole samples). Default:
// round-robin with `partitioner: pipedream`, split otherwise. Only the default planner runs it, on
// stages without tensor, context or expert parallelism.
void parse_replica_mode(const Node& n, StrategySpec& s, const Chosen& chosen) {
  const std::optional<Node> v = n.get("replica_mode");
  const bool runs_partitioner = chosen.planner.runs_partitioner;
  s.partitioner_options.round_robin = runs_partitioner && s.partitioner == "pipedream";
  if (!v) return;
  s.partitioner_options.round_robin = v->choice({"split", "round-robin"}, "a replica mode") == "round-robin";
  if (!runs_partitioner)
    v->fail(
        fmt::format("only used by the default planner (`partitioner: ...`); planner {} places its replicas "
                    "itself and splits each micro-batch between them",
                    chosen.planner.name));
  if (s.partitioner_options.round_robin &&
      (s.tensor_parallel > 1 || s.context_parallel > 1 || s.expert_parallel > 1))
    v->fail(
        "round-robin replicas are for data-parallel replicas without tensor, context or expert parallelism "
        "(write replica_mode: split)");
}

// Planner and partitioner settings: PipeDream's command-line options, luo's `baselines`.
void parse_planner_settings(const Node& n, StrategySpec& s, const Chosen& chosen, const Cluster& c) {
  const auto pipedream = [](const PartitionStrategy& p) { return p.takes_pipedream_options; };
  for (const char* key :
       {"straight", "memory_constraint", "linearize", "activation_compression_ratio", "hierarchy"})
    if (auto v = n.get(key); v && !(chosen.planner.runs_partitioner && pipedream(chosen.partitioner)))
      v->fail(
          fmt::format("used by partitioner: {} only (PipeDream's options), not {}; it would be ignored",
                      names_with(partition_strategies(), pipedream, " or "),
                      chosen.planner.runs_partitioner ? s.partitioner : std::string(chosen.planner.name)));
  if (auto v = n.get("straight")) s.partitioner_options.straight = v->boolean();
  if (auto v = n.get("memory_constraint")) s.partitioner_options.memory_constraint = v->boolean();
  if (auto v = n.get("linearize")) s.partitioner_options.linearize = v->boolean();
  if (auto v = n.get("baselines")) {
    s.planner_baselines = v->boolean();
    if (!chosen.planner.takes_baselines) {
      const auto takes = [](const auto& p) { return p.takes_baselines; };
      v->fail(fmt::format("{} only (planner: {}), not {}", used_by_planners(takes),
                          names_with(planners(), takes, " or planner: "),
                          s.planner.empty() ? "the default planner" : s.planner));
    }
  }
  if (auto v = n.get("activation_compression_ratio")) {
    if (v->is_scalar() && v->yaml().Scalar() == "none") {
      s.partitioner_options.activation_compression_ratio.reset();
    } else {
      const double r = v->number("a positive number, or none");
      if (!(r > 0)) v->expected("a positive number, or none");
      s.partitioner_options.activation_compression_ratio = r;
    }
  }
  if (auto h = n.get("hierarchy")) parse_hierarchy(*h, s, c);
  parse_replica_mode(n, s, chosen);
}

// `schedule_file`, the CSV that a schedule reading one runs.
void parse_schedule_file(const Node& n, StrategySpec& s, const Chosen& chosen) {
  if (auto f = n.get("schedule_file")) {
    if (!chosen.schedule.reads_file)
      f->fail(fmt::format(
          "only used with schedule: {} (the schedule is {})",
          names_with(
              schedule_strategies(), [](const auto& t) { return t.reads_file; }, " or schedule: "),
          s.schedule));
    const std::string path = resolve_path(f->document(), f->string("a path to a CSV schedule"));
    s.schedule_text = read_referenced_file(*f, path);
    s.schedule_source = path;
  } else if (chosen.schedule.reads_file) {
    n.need("schedule_file", fmt::format("a path to a CSV schedule (schedule: {} reads it)", s.schedule));
  }
}

// DualPipe's and DualPipeV's conditions on the ranks N (`stages`) and the micro-batches M, as their
// reference asserts them (core/schedules/dualpipe.cc), located where the file sets both.
void check_dual_pipelines(const Node& n, const StrategySpec& s, const Chosen& chosen) {
  const std::string_view name = chosen.schedule.name;
  // m is the file's where no planner chooses it and global_batch alone does not explore it.
  if ((name != "dualpipe" && name != "dualpipev") || !n.get("stages") || !chosen.planner.runs_partitioner ||
      s.mini_batch > 0 || s.micro_batches <= 0)
    return;
  if (auto why = dual_pipeline_refusal(name, s.stages, s.micro_batches)) n.get("stages")->fail(*why);
}

// The `strategy` section, in named steps; the batch keys (parse_batch) also read the workload's.
void parse_strategy(const Node& n, const Node& workload, Experiment& e, bool batch_required) {
  n.require_map("a mapping describing the strategy");
  // clang-format off
  n.check_keys({"planner", "partitioner", "schedule", "global_batch", "micro_batch_size", "micro_batches",
                "mini_batch", "stages", "chunks", "schedule_file", "straight", "hierarchy",
                "activation_compression_ratio", "memory_constraint", "linearize", "replicas", "allreduce",
                "baselines", "tensor_parallel", "sequence_parallel", "tp_overlap", "tp_wgrad_overlap", "dp_overlap",
                "gradient_reduce", "expert_parallel", "expert_tensor_parallel", "moe", "context_parallel",
                "cp_algorithm", "cp_load_balance", "first_stage_blocks", "last_stage_blocks",
                "account_for_embedding", "account_for_loss", "layout", "allow_fractional_samples", "replica_mode"});
  // clang-format on
  StrategySpec& s = e.strategy;
  const Chosen chosen = parse_names(n, s);
  parse_chunks(n, s, chosen);
  parse_replication(n, s, chosen, e.cluster);
  parse_context(n, s, chosen, e.workload, e.cluster);
  parse_stages(n, s, chosen, e.workload, e.cluster);
  parse_megatron_split(n, s, chosen, e.workload);
  parse_experts(n, s, chosen, e.workload, e.cluster);
  // A stage without tensor, context or expert parallelism costs the workload's own blocks: give them
  // the MoE options' kernels too.
  if (const MoeOptions& m = s.moe; !m.router_fusion || !m.permute_fusion || m.fused_grouped_mlp)
    use_moe_kernels(e.workload, m.router_fusion, m.permute_fusion, m.fused_grouped_mlp);
  parse_gradients(n, s, chosen);
  parse_planner_settings(n, s, chosen, e.cluster);
  parse_schedule_file(n, s, chosen);
  parse_batch(n, workload, chosen, e, batch_required);
  check_dual_pipelines(n, s, chosen);
}

// `recompute_modules: [core_attn, layernorm, ...]`: what selective recomputation re-runs, by
// Megatron-Core's names (core/memory.h); only under `recompute: selective`, as in Megatron.
RecomputeModules parse_recompute_modules(const Node& n, Recompute recompute) {
  if (recompute != Recompute::Selective)
    n.fail(
        fmt::format("applies to recompute: selective (Megatron's --recompute-granularity selective), but "
                    "recompute is {}: set recompute: selective, or leave recompute_modules out",
                    to_string(recompute)));
  RecomputeModules m;
  m.core_attn = false;
  std::vector<std::string_view> names(kRecomputeModuleNames.begin(), kRecomputeModuleNames.end());
  for (const Node& i : n.items("a list of Megatron-Core's recompute modules")) {
    if (i.is_scalar() && i.yaml().Scalar() == "moe")
      i.fail(
          "recomputing the whole MoE layer (Megatron's `moe` module: its dispatch and combine re-run in the "
          "backward) is not modelled; moe_act and layernorm are");
    *module_flag(m, i.choice(names, "a recompute module")) = true;
  }
  return m;
}

// `reserve` (bytes kept from every device for the CUDA context, NCCL and fragmentation) goes to `reserve`.
MemoryOptions parse_memory(const Node& n, std::optional<Node>& reserve) {
  n.require_map("a mapping describing the memory model");
  n.check_keys({"optimizer", "optimizer_kernels", "optimizer_passes", "optimizer_moments", "master_weights",
                "grad_accumulation", "bytes_per_parameter", "recompute", "recompute_modules",
                "activation_fp8_input_store", "zero", "reserve"});
  reserve = n.get("reserve");
  MemoryOptions m;
  if (auto o = n.get("optimizer"))
    m.optimizer = *parse_optimizer(o->choice({"sgd", "momentum", "adam", "mixed-adam"}, "an optimizer"));
  // How the step runs (core/device.h, optimizer_step_bytes_per_parameter): fused by default.
  if (auto k = n.get("optimizer_kernels"))
    m.optimizer_kernels = k->choice({"fused", "unfused"}, "how the optimizer step runs") == "unfused"
                              ? OptimizerKernels::Unfused
                              : OptimizerKernels::Fused;
  // The passes of a script's own unfused loop; a fused step has no passes to count.
  if (auto p = n.get("optimizer_passes")) {
    if (m.optimizer_kernels != OptimizerKernels::Unfused)
      p->fail(
          "counts the passes of an unfused step, but optimizer_kernels is fused (the default): set "
          "optimizer_kernels: unfused, or leave optimizer_passes out");
    m.optimizer_passes = static_cast<int>(
        p->integer(1, 1000, "a whole number of element-wise passes over the parameters per step"));
  }
  // How micro-batches' weight gradients accumulate (core/memory.h, GradAccumulation): fused by default.
  if (auto g = n.get("grad_accumulation"))
    m.grad_accumulation = *parse_grad_accumulation(
        g->choice({"fused", "unfused", "main-grad"}, "how the weight gradients of micro-batches accumulate"));
  // The optimizer state's precision (core/memory.h, MemoryOptions::moment_bytes).
  if (auto p = n.get("optimizer_moments")) {
    if (m.optimizer == Optimizer::SGD)
      p->fail(
          "sets the precision of the optimizer's state tensors, but sgd keeps none: leave optimizer_moments "
          "out");
    m.moment_bytes =
        p->choice({"fp32", "bf16", "fp16"}, "the precision of the optimizer's moments") == "fp32" ? 4 : 2;
  }
  if (auto w = n.get("master_weights"))
    m.master_bytes =
        w->choice({"fp32", "remainders"}, "how the optimizer keeps its master weights") == "fp32" ? 4 : 2;
  if (auto b = n.get("bytes_per_parameter")) {
    if (n.get("optimizer_moments") || n.get("master_weights"))
      b->fail(
          "gives the static bytes per parameter whole, which optimizer_moments and master_weights would "
          "change: give one or the other");
    double v = b->number("a non-negative number of bytes");
    if (v < 0) b->expected("a non-negative number of bytes");
    m.bytes_per_parameter = v;
  }
  if (auto r = n.get("recompute"))
    m.recompute = *parse_recompute(r->choice({"none", "full", "selective"}, "a recomputation mode"));
  if (auto mods = n.get("recompute_modules")) m.modules = parse_recompute_modules(*mods, m.recompute);
  if (auto a = n.get("activation_fp8_input_store")) m.activation_fp8_input_store = a->boolean();
  if (auto z = n.get("zero"))
    m.zero1 = z->integer(0, 1, "0 or 1 (ZeRO stage 1 shards the optimizer state)") == 1;
  return m;
}

// `backends: FILE` or `backends: {catalog: FILE, use: [names]}`: the catalog and the backends the
// placement may use, for place_backends (core/experiment.h) to place the workload's layers on.
BackendRequest parse_backends(const Node& n) {
  const Node c = n.is_map() ? n.need("catalog", "a backend catalog file (YAML)") : n;
  if (n.is_map())
    n.check_keys({"catalog", "use"});
  else if (!n.is_scalar())
    n.expected("a backend catalog file, or a mapping with catalog and use");
  BackendRequest r;
  r.catalog_name = c.string("a backend catalog file (YAML)");
  r.where = n.where();
  const std::string path = resolve_path(c.document(), r.catalog_name);
  const Document doc = load_document_text(read_referenced_file(c, path), path);
  r.catalog = parse_backend_catalog(Node::root(doc));
  if (auto u = n.is_map() ? n.get("use") : std::nullopt) {
    std::vector<std::string_view> names;
    for (const Backend& b : r.catalog.backends) names.push_back(b.name);
    for (const Node& i : u->items("a list of backend names")) {
      const std::string name = i.choice(names, fmt::format("a backend of {}", r.catalog_name));
      r.allowed.push_back(static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin()));
    }
    if (r.allowed.empty()) u->expected("a non-empty list of backend names");
  }
  return r;
}

}  // namespace

// Every device's memory_reserve_bytes: `reserve` (memory.reserve, --memory-margin) where given, else
// default_memory_reserve (core/device.h). A reserve must leave some of every device's memory.
static void reserve_memory(Cluster& c, const std::optional<Node>& reserve) {
  const double given = reserve ? reserve->quantity(Dimension::Bytes, Sign::NonNegative) : -1;
  for (Device& d : c.devices) {
    d.spec.memory_reserve_bytes = given >= 0 ? given : default_memory_reserve(d.spec);
    if (reserve && !(d.spec.usable_memory() > 0))
      reserve->fail(fmt::format("a reserve of {} leaves nothing of device \"{}\"'s {}", format_bytes(given),
                                d.name, format_bytes(d.spec.memory_bytes)));
  }
}

// faults: stragglers and degraded links, applied to the cluster (issue 53, item 1):
//   slow_devices: [{device: gpu3, factor: 2}]              every compute task on gpu3 takes 2x
//   slow_links: [{between: [gpu0, ib-switch], factor: 0.5}]  the link's bandwidth x 0.5, both ways
//   down_links: [{between: [edge0-0, agg0-0]}]             the link removed; routes go around it
namespace {

// A fault slows: a device's time by a factor from 1 to 1e6 (slowdown), or a link's bandwidth by one
// above 0 and at most 1 (a factor on the other side would speed it up, and read as "slower").
enum class Fault { Slowdown, Bandwidth };
double factor_of(const Node& item, Fault kind) {
  const char* what = kind == Fault::Slowdown ? "a slowdown from 1 to 1e6 (times as long)"
                                             : "a share of the link's bandwidth, above 0 and at most 1";
  const Node f = item.need("factor", what);
  const double x = f.number(what);
  if (kind == Fault::Slowdown ? !(x >= 1 && x <= 1e6) : !(x > 0 && x <= 1)) f.expected(what);
  return x;
}

struct FaultParser {
  Experiment& e;

  int node_index(const Node& name_node, bool device_only) const {
    const std::string name = name_node.string("a device name");
    for (size_t i = 0; i < e.cluster.devices.size(); ++i)
      if (e.cluster.devices[i].name == name) return static_cast<int>(i);
    if (!device_only)
      for (size_t i = 0; i < e.cluster.switches.size(); ++i)
        if (e.cluster.switches[i] == name) return static_cast<int>(e.cluster.devices.size() + i);
    name_node.fail(fmt::format("no {} named \"{}\" in cluster {} ({} devices{})",
                               device_only ? "device" : "device or switch", name, e.cluster.name,
                               e.cluster.devices.size(),
                               device_only ? "" : fmt::format(", {} switches", e.cluster.switches.size())));
  }
  // The link `between: [A, B]` names (its index) and "A - B", or a located error.
  std::pair<size_t, std::string> link_of(const Node& ends) const {
    const std::vector<Node> ab = ends.items("the link's two ends, [A, B]");
    if (ab.size() != 2) ends.expected("the link's two ends, [A, B]");
    const int a = node_index(ab[0], false), b = node_index(ab[1], false);
    for (size_t i = 0; i < e.cluster.links.size(); ++i) {
      const Link& l = e.cluster.links[i];
      if ((l.a == a && l.b == b) || (l.a == b && l.b == a))
        return {i, ab[0].string() + " - " + ab[1].string()};
    }
    ends.fail(fmt::format("no link between \"{}\" and \"{}\"", ab[0].string(), ab[1].string()));
  }
  void slow_devices(const Node& list) {
    std::vector<int> listed;
    for (const Node& item : list.items("a list of {device, factor}")) {
      item.require_map("a mapping {device, factor}");
      item.check_keys({"device", "factor"});
      const int d = node_index(item.need("device", "a device name"), true);
      if (std::find(listed.begin(), listed.end(), d) != listed.end())
        item.get("device")->fail(
            fmt::format("\"{}\" is listed twice; expected each device once (give one factor)",
                        e.cluster.devices[static_cast<size_t>(d)].name));
      listed.push_back(d);
      const double x = factor_of(item, Fault::Slowdown);
      e.cluster.devices[static_cast<size_t>(d)].slowdown *= x;
      e.faults.push_back(
          x == 1 ? fmt::format("{} at factor 1 (no slowdown)", e.cluster.devices[static_cast<size_t>(d)].name)
                 : fmt::format("{} {:g}x slower", e.cluster.devices[static_cast<size_t>(d)].name, x));
    }
  }
  void slow_links(const Node& list) {
    for (const Node& item : list.items("a list of {between: [A, B], factor}")) {
      item.require_map("a mapping {between, factor}");
      item.check_keys({"between", "factor"});
      const auto [i, name] = link_of(item.need("between", "the link's two ends, [A, B]"));
      const double x = factor_of(item, Fault::Bandwidth);
      e.cluster.links[i].bandwidth *= x;
      e.faults.push_back(fmt::format("link {} at {:g}% bandwidth", name, 100 * x));
    }
  }
  // stragglers: {fraction, factor, seed}: round(fraction x machines) machines, drawn by the seed, with
  // every device on them `factor` times slower (MegaScale: about 0.5% of machines, some 10% slower).
  void stragglers(const Node& n) {
    n.require_map("a mapping {fraction, factor, seed}");
    n.check_keys({"fraction", "factor", "seed"});
    const Node fn = n.need("fraction", "a fraction of the machines, above 0 and at most 1");
    const double fraction = fn.number("a fraction of the machines, above 0 and at most 1");
    if (!(fraction > 0 && fraction <= 1)) fn.expected("a fraction of the machines, above 0 and at most 1");
    const double x = factor_of(n, Fault::Slowdown);
    const long long seed =
        n.get("seed") ? n.need("seed", "").integer(0, kMaxCount, "a seed of 0 to 1000000") : 1;
    std::map<std::string, std::vector<size_t>> by_machine;
    for (size_t d = 0; d < e.cluster.devices.size(); ++d)
      by_machine[e.cluster.machine_of(static_cast<int>(d))].push_back(d);
    const size_t count = static_cast<size_t>(std::llround(fraction * static_cast<double>(by_machine.size())));
    if (count == 0)
      fn.fail(fmt::format("{:g} of {} machines is none (at least {:.3g} picks one)", fraction,
                          by_machine.size(), 0.5 / static_cast<double>(by_machine.size())));
    std::vector<const std::vector<size_t>*> machines;
    for (const auto& [name, devs] : by_machine) machines.push_back(&devs);
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    std::shuffle(machines.begin(), machines.end(), rng);
    std::vector<std::string> names;
    for (size_t i = 0; i < count; ++i)
      for (size_t d : *machines[i]) {
        e.cluster.devices[d].slowdown *= x;
        names.push_back(e.cluster.devices[d].name);
      }
    std::sort(names.begin(), names.end());
    const std::string listed =
        names.size() <= 8 ? fmt::format("{}", fmt::join(names, ", "))
                          : fmt::format("{}, ... ({} devices)",
                                        fmt::join(names.begin(), names.begin() + 8, ", "), names.size());
    e.faults.push_back(fmt::format("stragglers: {} of {} machines {:g}x slower (seed {}: {})", count,
                                   by_machine.size(), x, seed, listed));
  }
  void down_links(const Node& list) {
    std::vector<size_t> down;
    for (const Node& item : list.items("a list of {between: [A, B]}")) {
      item.require_map("a mapping {between}");
      item.check_keys({"between"});
      const Node ends = item.need("between", "the link's two ends, [A, B]");
      if (!e.cluster.routes.empty())
        ends.fail("a link down on a cluster with explicit routes, which would cross it (not supported)");
      const auto [i, name] = link_of(ends);
      const Link& l = e.cluster.links[i];
      if (e.cluster.fat_tree) e.cluster.fat_tree->down.emplace_back(l.a, l.b);
      e.cluster.machine_symmetry.reset();  // the machines are no longer alike
      e.faults.push_back(fmt::format("link {} down", name));
      down.push_back(i);
    }
    std::sort(down.begin(), down.end());
    down.erase(std::unique(down.begin(), down.end()), down.end());
    for (auto it = down.rbegin(); it != down.rend(); ++it)
      e.cluster.links.erase(e.cluster.links.begin() + static_cast<std::ptrdiff_t>(*it));
    // Routes go around a link down where another way exists; where none does, say so here, not as an
    // unlocated "not connected" from the planner.
    if (!down.empty())
      if (Status st = check_connected(e.cluster); !st)
        list.fail(fmt::format("these links down cut the cluster: {}; expected links with another way around",
                              st.error().message));
  }
};

}  // namespace

static void parse_on_cluster(const Node& root, const Node& workload, Experiment& e, bool batch_required);

static void parse_faults(const Node& n, Experiment& e) {
  n.require_map("a mapping with slow_devices, stragglers, slow_links and down_links");
  n.check_keys({"slow_devices", "stragglers", "slow_links", "down_links"});
  FaultParser f{e};
  if (auto list = n.get("slow_devices")) f.slow_devices(*list);
  if (auto st = n.get("stragglers")) f.stragglers(*st);
  if (auto list = n.get("slow_links")) f.slow_links(*list);
  if (auto list = n.get("down_links")) f.down_links(*list);
}

Experiment parse_experiment(const Document& doc, bool batch_required) {
  Node root = Node::root(doc);
  if (root.is_null())
    root.fail("expected a mapping with keys workload, cluster, strategy, got an empty document");
  root.require_map("a mapping with keys workload, cluster, strategy");
  root.check_keys({"name", "workload", "cluster", "strategy", "memory", "backends", "faults"});
  Experiment e;
  if (auto n = root.get("name")) e.name = n->string("a name");
  const Node workload = root.need("workload", "a mapping describing the workload");
  e.workload = parse_workload(workload);
  e.cluster = parse_cluster(root.need("cluster", "a mapping describing the cluster"));
  if (auto f = root.get("faults")) parse_faults(*f, e);
  parse_on_cluster(root, workload, e, batch_required);
  return e;
}

Experiment parse_job_experiment(const Node& root, Cluster cluster, bool batch_required) {
  Experiment e;
  if (auto n = root.get("name")) e.name = n->string("a name");
  const Node workload = root.need("workload", "a mapping describing the workload");
  e.workload = parse_workload(workload);
  e.cluster = std::move(cluster);
  parse_on_cluster(root, workload, e, batch_required);
  return e;
}

// An fp8 training needs fp8 tensor cores: Transformer Engine refuses fp8 below Hopper/Ada, so a
// device without an fp8 rate would run a training no stack runs (its GEMMs timed in bf16, its
// activations stashed in fp8 bytes).
static void check_fp8_devices(const Node& workload, const Experiment& e) {
  if (!fp8_training(e.workload.precision)) return;
  for (const Device& d : e.cluster.devices)
    if (d.spec.peak_flops[static_cast<int>(Precision::FP8)] <= 0) {
      const std::string what = fmt::format(
          "{} trains with fp8 GEMMs, and the cluster's device \"{}\" ({}) has no fp8 rate (Transformer "
          "Engine's fp8 needs Hopper, Ada or later); expected amp-bf16 or a device with an fp8 peak",
          to_string(e.workload.precision), d.name, d.spec.kind);
      if (auto p = workload.get("precision")) p->fail(what);
      workload.fail(what);
    }
  if (e.workload.precision != Precision::AMP_MXFP8) return;
  for (const Device& d : e.cluster.devices)
    if (!d.spec.microscaling) {
      const std::string what = fmt::format(
          "mxfp8 needs tensor cores with microscaling (Transformer Engine's MXFP8BlockScaling: Blackwell "
          "data-centre GPUs, compute capability 10.x), and the cluster's device \"{}\" ({}) has none; "
          "expected "
          "fp8 or fp8-blockwise, or a device with microscaling: true",
          d.name, d.spec.kind);
      if (auto p = workload.get("precision")) p->fail(what);
      workload.fail(what);
    }
}

// The strategy, memory and backends of `root`, read against e's workload and cluster.
static void parse_on_cluster(const Node& root, const Node& workload, Experiment& e, bool batch_required) {
  check_fp8_devices(workload, e);
  parse_strategy(root.need("strategy", "a mapping describing the strategy"), workload, e, batch_required);
  std::optional<Node> reserve;
  if (auto m = root.get("memory")) e.memory = parse_memory(*m, reserve);
  reserve_memory(e.cluster, reserve);
  if (auto b = root.get("backends")) e.backends = std::make_shared<const BackendRequest>(parse_backends(*b));
  e.memory.mixed_precision = mixed_precision(e.workload.precision);
  // Transformer Engine rebuilds an fp32 master weight from its remainder and a bf16 working weight only.
  if (e.memory.master_bytes == 2 &&
      (math_precision(e.workload.precision) != Precision::BF16 ||
       !(e.memory.mixed_precision || e.memory.optimizer == Optimizer::MixedAdam)))
    root.get("memory")
        ->get("master_weights")
        ->fail(fmt::format(
            "remainders rebuild fp32 master weights from bf16 working weights (Transformer Engine's "
            "store_param_remainders), but precision {} keeps no bf16 working weights beside fp32 master "
            "weights: use amp-bf16 or an fp8 recipe, or leave master_weights out",
            to_string(e.workload.precision)));
  // The gradient buffer in the reduce's precision (the workload's by default; mixed-adam's 2-byte
  // gradients of an fp32 workload are reduced, so kept, at 4), never narrower than the weights.
  e.memory.gradient_bytes = e.strategy.gradient_reduce_bytes > 0 ? e.strategy.gradient_reduce_bytes
                                                                 : element_bytes(e.workload.precision);
  // A static total below the weights and their gradients as stored would make the rest negative.
  if (e.memory.bytes_per_parameter && *e.memory.bytes_per_parameter < 2 * element_bytes(e.workload.precision))
    root.get("memory")
        ->get("bytes_per_parameter")
        ->expected(
            fmt::format("at least {:g} bytes per parameter (the {} weights and their gradients, {:g} each; "
                        "the optimizer state is the rest)",
                        2 * element_bytes(e.workload.precision), to_string(e.workload.precision),
                        element_bytes(e.workload.precision)));
  // Placed here as well as in prepare: the 3D search and the reports read the workload's costs.
  if (Status s = place_backends(e); !s) throw InputError(s.error().message);
}

// An experiment's name with the --set overrides that changed it: a title must not describe the file's
// 16 boards when 32 were simulated.
static std::string with_overrides(std::string name, const std::vector<std::string>& overrides) {
  if (name.empty() || overrides.empty()) return name;
  std::string sets;
  for (const std::string& o : overrides) sets += (sets.empty() ? "" : ", ") + o;
  return fmt::format("{} [{}]", name, sets);
}

Result<Experiment> load_experiment_file(const std::string& path, const std::vector<std::string>& overrides,
                                        bool batch_required) {
  try {
    Document doc = load_document_file(path);
    apply_overrides(doc, overrides);
    Experiment e = parse_experiment(doc, batch_required);
    e.name = with_overrides(std::move(e.name), overrides);
    return e;
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

Result<Experiment> load_experiment_text(const std::string& text, const std::string& name,
                                        const std::vector<std::string>& overrides) {
  try {
    Document doc = load_document_text(text, name);
    apply_overrides(doc, overrides);
    Experiment e = parse_experiment(doc);
    e.name = with_overrides(std::move(e.name), overrides);
    return e;
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

}  // namespace pipegrid::input
