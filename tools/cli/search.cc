// pipegrid search EXPERIMENT --global-batch B [--top K] [--json]: the 3D search (core/planners/search3d.h)
// over the experiment's workload and cluster, ranked by the analytic evaluator; the best K replayed in
// SimGrid (each in its own process) and ranked by the replay. docs/3d-search.md.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/metrics.h"
#include "core/model_flops.h"
#include "core/moe.h"
#include "core/planners/search3d.h"
#include "core/units.h"
#include "sim/replay.h"
#include "tools/cli/cli.h"
#include "tools/cli/search_emit.h"
#include "tools/input/experiment_yaml.h"
#include "tools/input/yaml_node.h"
#include "tools/output/report.h"
#include "tools/output/safe_write.h"
#include "tools/process/folded_replay.h"
#include "tools/process/process.h"

namespace pipegrid::cli {
namespace {

struct SearchOptions {
  std::string file;
  int global_batch = 0;
  int top = 5;
  bool json = false;
  std::string sweep;  // write the ranked candidates as a sweep file here
  std::string emit;   // write the winner as an experiment file here
  std::vector<int> tensor_parallel, pipeline, micro_batch_sizes, chunks;
  std::vector<std::string> schedules, recompute;
  std::vector<int> expert_parallel, expert_tensor_parallel;  // --ep, --etp
  std::vector<std::string> dispatchers;                      // --dispatcher
  std::vector<std::string> moe_overlap;                      // --moe-overlap: false, true
  std::vector<int> context_parallel;                         // --cp
  std::vector<std::string> cp_algorithms;                    // --cp-algorithm
  std::vector<std::string> overrides;
  std::string memory_margin;  // --memory-margin: memory.reserve
  bool exact = false;         // --exact-ranking
  bool tp_folded = false;  // --tp-folded: replay each TP group as its rank 0 (Search3dEstimator::tp_folded)
  int jobs = 2;            // replays at a time
};

struct Replayed {
  Search3dCandidate c;
  double simulated_s = 0;
  Metrics metrics;
  bool folded = false;  // replayed replica-folded (tools/process/folded_replay.h)
};

nlohmann::json candidate_json(const Search3dCandidate& c) {
  nlohmann::json j = {{"t", c.t},
                      {"p", c.p},
                      {"d", c.d},
                      {"micro_batch_size", c.b},
                      {"micro_batches", c.micro_batches},
                      {"schedule", c.schedule},
                      {"chunks", c.v},
                      {"uneven", c.uneven},
                      {"layout", c.layout},
                      {"recompute", std::string(to_string(c.recompute))},
                      {"sequence_parallel", c.sequence_parallel},
                      {"distributed_optimizer", c.distributed_optimizer},
                      {"analytic_iteration_time_s", c.iteration_time_s},
                      {"analytic_throughput_samples_per_s", c.throughput_samples_per_s},
                      {"analytic_mfu", c.mfu},
                      {"peak_memory_bytes", output::json_number(c.peak_memory_bytes)},
                      {"analytic_breakdown", output::breakdown_json(c.breakdown, c.moe, c.cp > 1)}};
  if (c.cp > 1) {
    j["context_parallel"] = c.cp;
    j["cp_algorithm"] = to_string(c.cp_algorithm);
  }
  if (c.moe) {
    j["expert_parallel"] = c.ep;
    j["expert_tensor_parallel"] = c.etp;
    j["dispatcher"] = to_string(c.dispatcher);
    j["moe_overlap"] = c.moe_overlap;
  }
  return j;
}

// One candidate replayed in SimGrid, as a child process sends it back.
struct ReplayOutcome {
  std::string error;  // empty: replayed
  double simulated_s = 0, throughput = 0;
  TimeBreakdown breakdown;
  bool folded = false;
};

// What a child sends back: iteration time, throughput, the eight parts of the breakdown and whether
// the replay was folded (1) or whole (0).
constexpr size_t kFigures = 11;
constexpr std::string_view kChild = "the simulation process";

// In the child: replays run (of experiment e: lowered folded where large, process::replay_prepared) and
// encodes its figures.
Result<std::string> replay_figures(const Experiment& e, Result<PreparedRun> run) {
  if (!run) return run.error();
  sim::ReplayOptions ro;
  ro.schedule = &run->schedule;
  Result<process::ChosenReplay> chosen = process::replay_prepared(e, *run, ro, process::FoldMode::Auto);
  if (!chosen) return chosen.error();
  const Timeline& timeline = chosen->replay.timeline;
  const Metrics m = compute_metrics(e.cluster, run->graph, timeline, run->fold ? &*run->fold : nullptr);
  const TimeBreakdown& b = m.breakdown;
  const double f[kFigures] = {timeline.makespan(),
                              m.throughput_samples_per_s,
                              b.compute_s,
                              b.optimizer_s,
                              b.tensor_parallel_s,
                              b.pipeline_s,
                              b.data_parallel_s,
                              b.bubble_s,
                              b.expert_parallel_s,
                              b.context_parallel_s,
                              chosen->mode.folded ? 1.0 : 0.0};
  return std::string(reinterpret_cast<const char*>(f), sizeof f);
}

ReplayOutcome outcome_of(const process::ChildResult& child) {
  ReplayOutcome o;
  Result<std::string> answer = process::answer_of(child, kChild);
  if (!answer) {
    o.error = answer.error().message;
  } else if (answer->size() != sizeof(double) * kFigures) {
    o.error = fmt::format("{} failed without an answer", kChild);
  } else {
    double f[kFigures];
    std::memcpy(f, answer->data(), sizeof f);
    o.simulated_s = f[0];
    o.throughput = f[1];
    o.breakdown = {f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]};
    o.folded = f[10] != 0;
  }
  return o;
}

// Replays each experiment in its own child process, `jobs` at a time (SimGrid runs one simulation per
// process): the child lowers the candidate, replays it and sends back its iteration time, throughput
// and breakdown (a few numbers), so this process never holds a whole task graph.
// Replays count runs: in the child, run i's experiment from experiment_i and its task graph from
// prepare_i.
std::vector<ReplayOutcome> replay_in_children(
    size_t count, const std::function<Experiment(size_t)>& experiment_i,
    const std::function<Result<PreparedRun>(const Experiment&, size_t)>& prepare_i, int jobs,
    const std::function<void(size_t)>& progress) {
  std::vector<ReplayOutcome> out(count);
  size_t finished = 0;
  process::run_pool(
      count, jobs,
      [&](size_t i, int fd) {
        const Experiment e = experiment_i(i);
        return process::send_answer(fd, replay_figures(e, prepare_i(e, i)));
      },
      [&](size_t i, process::ChildResult&& child) {
        out[i] = outcome_of(child);
        if (progress) progress(++finished);
        return true;
      });
  return out;
}

// Why the winner beats the runner-up: the part of the breakdown that differs most.
std::string why(const Replayed& w, const Replayed& r) {
  const TimeBreakdown& a = w.metrics.breakdown;
  const TimeBreakdown& b = r.metrics.breakdown;
  const std::pair<const char*, double> parts[] = {
      {"compute", b.compute_s - a.compute_s},
      {"optimizer step", b.optimizer_s - a.optimizer_s},
      {"exposed TP communication", b.tensor_parallel_s - a.tensor_parallel_s},
      {"exposed expert all-to-all", b.expert_parallel_s - a.expert_parallel_s},
      {"exposed context-parallel exchange", b.context_parallel_s - a.context_parallel_s},
      {"pipeline communication", b.pipeline_s - a.pipeline_s},
      {"data-parallel communication", b.data_parallel_s - a.data_parallel_s},
      {"bubble", b.bubble_s - a.bubble_s}};
  if (r.simulated_s <= w.simulated_s)
    return fmt::format("{} ties in SimGrid with {} ({}); the analytic ranking put it first", w.c.label(),
                       r.c.label(), format_time(w.simulated_s));
  const auto* best = std::max_element(std::begin(parts), std::end(parts),
                                      [](const auto& x, const auto& y) { return x.second < y.second; });
  return fmt::format("{} wins: {} faster in SimGrid than {}, mostly {} less {} per device", w.c.label(),
                     format_time(r.simulated_s - w.simulated_s), r.c.label(), format_time(best->second),
                     best->first);
}

// Schedules that are one run: without a pipeline (p = 1), 1f1b, zb-h1 and zb-h2 run the same passes in
// the same order (each micro-batch's B and W back to back on the one rank); with one micro-batch, zb-h1
// and zb-h2 (their warm-ups, p - r and 2 (p - r) - 1 forwards, are both the one forward, and nothing
// follows but its B and W). Where their estimates are equal (to 1e-9) they are kept once, where it
// ranks best, under the first of their names in the order 1f1b, zb-h1, zb-h2, the others counted as
// left out. With the TP
// collectives beside the weight-gradient GEMMs (tp_wgrad_overlap) the zero-bubble schedules'
// input-gradient pass leaves them exposed, a different run, listed apart.
void drop_same_schedule_runs(Search3dResult& res) {
  // The name the candidate's run goes by among its alike schedules, or "" where it has none.
  const auto alike = [](const Search3dCandidate& c) -> std::string_view {
    const bool zb = c.schedule == "zb-h1" || c.schedule == "zb-h2";
    if (c.p == 1 && (zb || c.schedule == "1f1b")) return "1f1b";
    if (c.micro_batches == 1 && zb) return "zb-h1";
    return "";
  };
  std::vector<Search3dCandidate> kept;
  for (Search3dCandidate& c : res.ranked) {
    const auto same = std::find_if(kept.begin(), kept.end(), [&](const Search3dCandidate& k) {
      return !alike(c).empty() && alike(c) == alike(k) && k.p == c.p && k.micro_batches == c.micro_batches &&
             k.t == c.t && k.d == c.d && k.b == c.b && k.recompute == c.recompute &&
             k.sequence_parallel == c.sequence_parallel &&
             k.distributed_optimizer == c.distributed_optimizer && k.ep == c.ep && k.etp == c.etp &&
             k.dispatcher == c.dispatcher && k.moe_overlap == c.moe_overlap && k.cp == c.cp &&
             k.cp_algorithm == c.cp_algorithm &&
             std::abs(k.iteration_time_s - c.iteration_time_s) <= 1e-9 * k.iteration_time_s;
    });
    if (same == kept.end()) {
      kept.push_back(std::move(c));
      continue;
    }
    const auto order = [](const std::string& s) { return s == "1f1b" ? 0 : s == "zb-h1" ? 1 : 2; };
    if (order(c.schedule) < order(same->schedule)) same->schedule = c.schedule;
    ++res.left_out
          [alike(c) == "1f1b"
               ? "1f1b, zb-h1 and zb-h2 at p = 1 with the same time: one run (no pipeline), listed once, "
                 "under the first of these names"
               : "zb-h1 and zb-h2 with 1 micro-batch and the same time: one run, listed once as zb-h1"];
  }
  res.ranked = std::move(kept);
}

// One zip axis of the search's sweep file: its key, whether the file has it, a candidate's value.
struct SweepAxis {
  const char* key;
  bool written;
  std::function<std::string(const Search3dCandidate&)> value;
};

// The ranked candidates as one zip group of a sweep file over the experiment (tools/sweep/sweep.h).
Status write_sweep(const SearchOptions& o, const Search3dResult& res, bool load_balance) {
  const auto any = [&](auto pred) { return std::any_of(res.ranked.begin(), res.ranked.end(), pred); };
  const bool uneven = any([](const auto& c) { return c.uneven; });
  const bool layout = any([](const auto& c) { return !c.layout.empty(); });
  const bool context = any([](const auto& c) { return c.cp > 1; });
  const bool moe = !res.ranked.empty() && res.ranked[0].moe;
  const auto flag = [](bool x) { return std::string(x ? "true" : "false"); };
  using C = Search3dCandidate;
  // A null value (~) leaves the key out (set_path): no layout, and at cp = 1 the loader refuses both
  // context keys.
  const std::vector<SweepAxis> axes = {
      {"strategy.partitioner", true, [](const C&) { return std::string("megatron"); }},
      {"strategy.tensor_parallel", true, [](const C& c) { return std::to_string(c.t); }},
      {"strategy.stages", true, [](const C& c) { return std::to_string(c.p); }},
      {"strategy.replicas", true, [](const C& c) { return std::to_string(c.d); }},
      {"strategy.micro_batch_size", true, [](const C& c) { return std::to_string(c.b); }},
      {"strategy.micro_batches", true, [](const C& c) { return std::to_string(c.micro_batches); }},
      {"strategy.schedule", true, [](const C& c) { return c.schedule; }},
      {"strategy.chunks", true, [](const C& c) { return std::to_string(c.v); }},
      {"memory.recompute", true, [](const C& c) { return std::string(to_string(c.recompute)); }},
      {"strategy.sequence_parallel", true, [&](const C& c) { return flag(c.sequence_parallel); }},
      {"memory.zero", true, [](const C& c) { return std::string(c.distributed_optimizer ? "1" : "0"); }},
      {"strategy.account_for_embedding", uneven, [&](const C& c) { return flag(c.uneven); }},
      {"strategy.account_for_loss", uneven, [&](const C& c) { return flag(c.uneven); }},
      {"strategy.layout", layout,
       [](const C& c) { return c.layout.empty() ? std::string("~") : fmt::format("\"{}\"", c.layout); }},
      {"strategy.context_parallel", context, [](const C& c) { return std::to_string(c.cp); }},
      {"strategy.cp_algorithm", context,
       [](const C& c) { return c.cp > 1 ? std::string(to_string(c.cp_algorithm)) : "~"; }},
      {"strategy.cp_load_balance", context, [&](const C& c) { return c.cp > 1 ? flag(load_balance) : "~"; }},
      {"strategy.expert_parallel", moe, [](const C& c) { return std::to_string(c.ep); }},
      {"strategy.expert_tensor_parallel", moe, [](const C& c) { return std::to_string(c.etp); }},
      {"strategy.moe.dispatcher", moe, [](const C& c) { return std::string(to_string(c.dispatcher)); }},
      {"strategy.moe.overlap", moe, [&](const C& c) { return flag(c.moe_overlap); }}};
  std::string text = fmt::format(
      "# pipegrid search {} --global-batch {}: the {} candidates that fit memory, fastest (analytic) first.\n"
      "base: \"{}\"\nzip:\n",
      o.file, o.global_batch, res.ranked.size(), std::filesystem::absolute(o.file).string());
  for (const SweepAxis& a : axes) {
    if (!a.written) continue;
    std::vector<std::string> values;
    for (const C& c : res.ranked) values.push_back(a.value(c));
    text += fmt::format("  {}: [{}]\n", a.key, fmt::join(values, ", "));
  }
  return output::write_file_safely(o.sweep, text);
}

// The search's options from the command line's; an Error for a mode --recompute does not know.
// The values in the order given, each once: a value given twice made every candidate of it twice.
template <class T>
std::vector<T> each_once(const std::vector<T>& values) {
  std::vector<T> out;
  for (const T& x : values)
    if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  return out;
}

Result<Search3dOptions> search_options(const SearchOptions& given, bool tty) {
  SearchOptions o = given;
  for (std::vector<int>* axis : {&o.tensor_parallel, &o.pipeline, &o.micro_batch_sizes, &o.chunks,
                                 &o.expert_parallel, &o.expert_tensor_parallel, &o.context_parallel})
    *axis = each_once(*axis);
  for (std::vector<std::string>* axis : {&o.schedules, &o.recompute, &o.dispatchers, &o.cp_algorithms})
    *axis = each_once(*axis);
  Search3dOptions so;
  so.global_batch = o.global_batch;
  so.tensor_parallel = o.tensor_parallel;
  so.pipeline = o.pipeline;
  so.micro_batch_sizes = o.micro_batch_sizes;
  if (!o.chunks.empty()) so.chunks = o.chunks;
  so.exact = o.exact;
  if (!o.schedules.empty()) so.schedules = o.schedules;
  if (!o.recompute.empty()) {
    so.recompute.clear();
    for (const std::string& r : o.recompute) {
      std::optional<Recompute> rc = parse_recompute(r);
      if (!rc) return Error{fmt::format("--recompute: \"{}\" is not none, selective or full", r)};
      so.recompute.push_back(*rc);
    }
  }
  so.expert_parallel = o.expert_parallel;
  so.expert_tensor_parallel = o.expert_tensor_parallel;
  if (!o.dispatchers.empty()) {
    so.dispatchers.clear();
    for (const std::string& d : o.dispatchers) {
      const std::optional<MoeDispatcher> parsed = parse_dispatcher(d);
      if (!parsed) return Error{fmt::format("--dispatcher: \"{}\" is not alltoall, allgather or deepep", d)};
      so.dispatchers.push_back(*parsed);
    }
  }
  for (const std::string& x : each_once(o.moe_overlap)) {
    if (x != "false" && x != "true")
      return Error{fmt::format("--moe-overlap: \"{}\" is not false or true", x)};
    so.moe_overlap.push_back(x == "true");
  }
  so.context_parallel = o.context_parallel;
  if (!o.cp_algorithms.empty()) {
    so.cp_algorithms.clear();
    for (const std::string& a : o.cp_algorithms) {
      std::optional<CpAlgorithm> x = parse_cp_algorithm(a);
      if (!x) return Error{fmt::format("--cp-algorithm: \"{}\" is not p2p, all_gather or a2a", a)};
      so.cp_algorithms.push_back(*x);
    }
  }
  if (tty)
    so.progress = [](size_t done, size_t total) {
      if (done == total || done % 16 == 0)
        fmt::print(std::cerr, "\rsearch: {}/{} candidates evaluated", done, total);
      if (done == total) fmt::print(std::cerr, "\n");
    };
  return so;
}

// The best `--top` candidates replayed in SimGrid, fastest first; an Error names the first that failed.
Result<std::vector<Replayed>> replay_best(const SearchOptions& o, const Experiment& exp,
                                          const Search3dResult& res, bool tty) {
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(0, o.top)), res.ranked.size());
  // Whole graphs (every rank of every TP group), or TP-folded ones (Search3dEstimator::tp_folded).
  auto experiment_i = [&](size_t i) { return search3d_experiment(exp, res.ranked[i]); };
  auto prepare_i = [&](const Experiment& e, size_t i) -> Result<PreparedRun> {
    if (o.tp_folded) return Search3dEstimator(exp).tp_folded(res.ranked[i]);
    return prepare(e, nullptr, false, GraphForm::FoldedIfLarge);
  };
  if (tty && k > 0)
    fmt::print(std::cerr, "search: replaying {} in SimGrid{}, {} at a time", k,
               o.tp_folded ? " (TP-folded)" : "", o.jobs);
  const std::vector<ReplayOutcome> outcomes =
      replay_in_children(k, experiment_i, prepare_i, o.jobs, [&](size_t done) {
        if (tty)
          fmt::print(std::cerr, "\rsearch: replayed {}/{} in SimGrid ({} at a time)   ", done, k, o.jobs);
      });
  std::vector<Replayed> replayed;
  for (size_t i = 0; i < k; ++i) {
    const Search3dCandidate& c = res.ranked[i];
    if (!outcomes[i].error.empty())
      return Error{fmt::format("{}: {}: {}", o.file, c.label(), outcomes[i].error)};
    Replayed rp{c, outcomes[i].simulated_s, {}};
    rp.metrics.iteration_time_s = outcomes[i].simulated_s;
    rp.metrics.throughput_samples_per_s = outcomes[i].throughput;
    rp.metrics.breakdown = outcomes[i].breakdown;
    rp.folded = outcomes[i].folded;
    replayed.push_back(std::move(rp));
  }
  if (tty && k > 0) fmt::print(std::cerr, "\n");
  std::stable_sort(replayed.begin(), replayed.end(),
                   [](const Replayed& a, const Replayed& b) { return a.simulated_s < b.simulated_s; });
  return replayed;
}

// What search found, for printing: the experiment, the search's result, the replayed candidates.
struct Found {
  const SearchOptions& o;
  const Experiment& exp;
  const Search3dResult& res;
  const std::vector<Replayed>& replayed;

  // Model FLOPs utilisation at an iteration time (6 x parameters x tokens / (time x N x peak)).
  double mfu(double time) const {
    const double n = static_cast<double>(exp.cluster.devices.size());
    return res.peak_flops > 0 ? 6 * res.parameters * res.tokens_per_iteration / (time * n * res.peak_flops)
                              : 0;
  }
  // The same with Megatron-LM's model FLOPs per token (core/model_flops.h: 6 N + 12 L h s, N active).
  double model_mfu(double time) const {
    const std::optional<ModelFlops> f = model_flops(exp.workload);
    const double n = static_cast<double>(exp.cluster.devices.size());
    return f && res.peak_flops > 0
               ? f->flops_per_token() * res.tokens_per_iteration / (time * n * res.peak_flops)
               : 0;
  }
  // What the analytic estimate approximates that the SimGrid replays of the best K run whole: the
  // overlapped pairs of the MoE all-to-all overlap and of DualPipe (docs/3d-search.md), or "" when no
  // candidate has them.
  std::string estimate_leaves_out() const {
    std::vector<std::string> pairs;
    if (std::any_of(res.ranked.begin(), res.ranked.end(),
                    [](const Search3dCandidate& c) { return c.moe_overlap; }))
      pairs.push_back("the all-to-all overlap's (moe.overlap)");
    if (std::any_of(res.ranked.begin(), res.ranked.end(),
                    [](const Search3dCandidate& c) { return c.schedule.rfind("dualpipe", 0) == 0; }))
      pairs.push_back("DualPipe's");
    if (pairs.empty()) return "";
    return fmt::format(
        "the estimate times the overlapped pairs, {}, in closed form on one representative (each pass's "
        "collectives beside the other's compute, no other replica's flows; within 14% of the whole graph, "
        "mostly faster: docs/3d-search.md); the SimGrid replays of the best run them whole",
        fmt::join(pairs, " and "));
  }
  // The schedules a MoE workload's search did not try because they are opt-in (DualPipe's), or {}.
  std::vector<std::string> schedules_not_searched() const {
    if (routed_experts(exp.workload) <= 0) return {};
    std::vector<std::string> out;
    for (const char* s : {"dualpipe", "dualpipev"})  // o.schedules empty: the default, without them
      if (std::find(o.schedules.begin(), o.schedules.end(), s) == o.schedules.end()) out.push_back(s);
    return out;
  }
  // The MoE options every candidate keeps from the experiment (the search varies ep, etp, the
  // dispatcher and, with --moe-overlap, the overlap), or "" for a dense workload.
  std::string moe_from_experiment() const {
    if (routed_experts(exp.workload) <= 0) return "";
    const MoeOptions& m = exp.strategy.moe;
    std::string s =
        fmt::format("router {}, permutation {} (alltoall's launches)", m.router_fusion ? "fused" : "unfused",
                    m.permute_fusion ? "fused" : "unfused");
    if (m.fused_grouped_mlp) s += "; experts' MLP fused by Transformer Engine's op fuser";
    if (o.moe_overlap.size() > 1)
      s += "; all-to-alls overlapped with another micro-batch's compute and not (searched)";
    else if (!o.moe_overlap.empty() ? o.moe_overlap[0] == "true" : exp.strategy.moe_overlap)
      s += "; all-to-alls overlapped with another micro-batch's compute";
    else
      s += "; all-to-alls not overlapped";
    s += m.capacity_factor > 0 ? fmt::format("; capacity factor {:g}", m.capacity_factor) : "; dropless";
    s += m.expert_shares.empty() ? "; balanced routing" : "; routing as given";
    return s;
  }
  std::vector<output::CostModelCheck> checks() const {
    std::vector<int> all_devices(exp.cluster.devices.size());
    for (size_t d = 0; d < all_devices.size(); ++d) all_devices[d] = static_cast<int>(d);
    return output::cost_model_checks(exp, all_devices);
  }
};

// The base experiment's settings the search replaces with its axes (docs/3d-search.md), as
// "strategy.tensor_parallel 4": said beside the results, since they would otherwise be read as kept.
std::vector<std::string> replaced_by_search(const Experiment& e) {
  const StrategySpec& s = e.strategy;
  std::vector<std::string> out;
  auto add = [&](bool set, std::string text) {
    if (set) out.push_back(std::move(text));
  };
  add(s.stages > 0, fmt::format("strategy.stages {}", s.stages));
  add(s.tensor_parallel > 1, fmt::format("strategy.tensor_parallel {}", s.tensor_parallel));
  add(s.sequence_parallel, "strategy.sequence_parallel true");
  add(s.context_parallel > 1, fmt::format("strategy.context_parallel {}", s.context_parallel));
  add(s.expert_parallel > 1, fmt::format("strategy.expert_parallel {}", s.expert_parallel));
  add(s.expert_tensor_parallel > 0,
      fmt::format("strategy.expert_tensor_parallel {}", s.expert_tensor_parallel));
  add(s.moe.dispatcher != MoeDispatcher::AllToAll,
      fmt::format("strategy.moe.dispatcher {}", to_string(s.moe.dispatcher)));
  add(s.context_parallel > 1, fmt::format("strategy.cp_algorithm {}", to_string(s.context.algorithm)));
  add(s.replicas > 1, fmt::format("strategy.replicas {}", s.replicas));
  add(s.schedule_given, fmt::format("strategy.schedule {}", s.schedule));
  add(s.chunks > 1, fmt::format("strategy.chunks {}", s.chunks));
  add(s.micro_batches > 1, fmt::format("strategy.micro_batches {}", s.micro_batches));
  add(e.memory.recompute != Recompute::None,
      fmt::format("memory.recompute {}", to_string(e.memory.recompute)));
  add(e.memory.zero1, "memory.zero 1");
  const MegatronSplit& m = s.partitioner_options.megatron;  // the search picks even or accounted splits
  add(m.first_stage_blocks > 0, fmt::format("strategy.first_stage_blocks {}", m.first_stage_blocks));
  add(m.last_stage_blocks > 0, fmt::format("strategy.last_stage_blocks {}", m.last_stage_blocks));
  add(m.account_for_embedding, "strategy.account_for_embedding true");
  add(m.account_for_loss, "strategy.account_for_loss true");
  add(!m.layout.empty(), fmt::format("strategy.layout \"{}\"", m.layout));
  return out;
}

void print_json(const Found& f) {
  const Search3dResult& res = f.res;
  nlohmann::json j;
  j["schema_version"] = output::kJsonSchemaVersion;
  j["command"] = "search";
  j["global_batch"] = f.o.global_batch;
  j["devices"] = f.exp.cluster.devices.size();
  j["combinations"] = res.combinations;
  j["evaluated"] = res.evaluated;
  j["feasible"] = res.ranked.size();
  j["left_out"] = res.left_out;
  j["replaced_base_settings"] = replaced_by_search(f.exp);
  nlohmann::json ranked = nlohmann::json::array();
  for (const Search3dCandidate& c : res.ranked) ranked.push_back(candidate_json(c));
  j["analytic_ranking"] = ranked;
  nlohmann::json sim = nlohmann::json::array();
  for (const Replayed& r : f.replayed) {
    nlohmann::json x = candidate_json(r.c);
    x["simulated_iteration_time_s"] = r.simulated_s;
    x["simulated_throughput_samples_per_s"] = r.metrics.throughput_samples_per_s;
    x["simulated_mfu"] = f.mfu(r.simulated_s);
    x["simulated_model_flops_mfu"] = f.model_mfu(r.simulated_s);
    x["simulated_breakdown"] = output::breakdown_json(r.metrics.breakdown, r.c.moe, r.c.cp > 1);
    x["simulated_replay"] = r.folded ? "replica-folded" : "whole graph";
    sim.push_back(x);
  }
  j["simgrid_ranking"] = sim;
  const bool any_folded =
      std::any_of(f.replayed.begin(), f.replayed.end(), [](const Replayed& r) { return r.folded; });
  j["simgrid_replays"] = f.o.tp_folded ? "tp-folded"
                         : any_folded  ? "replica-folded where exact (simulated_replay)"
                                       : "whole graph";
  if (f.replayed.size() >= 2) j["why"] = why(f.replayed[0], f.replayed[1]);
  if (const std::string x = f.estimate_leaves_out(); !x.empty()) j["estimate_leaves_out"] = x;
  if (const std::vector<std::string> x = f.schedules_not_searched(); !x.empty())
    j["schedules_not_searched"] = x;
  if (const std::string x = f.moe_from_experiment(); !x.empty()) j["moe_from_experiment"] = x;
  j["cost_model_checks"] = output::cost_model_checks_json(f.checks());
  std::cout << j.dump(2) << "\n";
}

// What the two MFU columns count.
void print_mfu_formulas(const Found& f) {
  fmt::print(
      "\nMFU       6 N x tokens / (time x devices x peak), N = {:.4g} B ({}), attention "
      "not counted: the search's figure\n",
      f.res.parameters / 1e9,
      routed_experts(f.exp.workload) > 0 ? "the active parameters: a token's share of the experts"
                                         : "every parameter");
  if (const std::optional<ModelFlops> m = model_flops(f.exp.workload))
    fmt::print(
        "MFU(Meg)  (6 N + 12 L h s) x tokens / (time x devices x peak), N = {:.4g} B {}parameters, 12 L h s "
        "= "
        "{} per token: Megatron-LM's model FLOPs (arXiv 2104.04473, eq. 3; PaLM, arXiv 2204.02311, "
        "app. B), as `run` prints it\n",
        m->active_parameters / 1e9, m->moe ? "active " : "", format_flops(m->attention_flops_per_token));
}

// One row of the ranking table: SimGrid's figures (simulated_s > 0) or the analytic ones alone.
struct Row {
  const Search3dCandidate& c;
  double simulated_s = 0, throughput = 0;
  const TimeBreakdown& breakdown;
};

// The ranking table, its configuration column as wide as its longest label (interleaved schedules
// with recomputation, SP and the distributed optimizer run past 44 characters). TP-folded replays
// fold the TP collectives into the passes: their TP time is inside compute, and the column says so.
void print_table(const Found& f, const std::vector<Row>& rows) {
  size_t width = std::string_view("configuration").size();
  for (const Row& r : rows) width = std::max(width, r.c.label().size());
  const bool sim = !rows.empty() && rows[0].simulated_s > 0;
  // After TP's exposed time: the context-parallel exchanges' (when a row has cp > 1) and the expert
  // all-to-all's (MoE).
  const bool context = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.c.cp > 1; });
  const bool moe = !rows.empty() && rows[0].c.moe;
  fmt::print(
      "\n{:<4} {:<{}} {:>11} {:>11} {:>12} {:>6} {:>8} {:>10}  compute / TP / {}{}pipeline / DP / bubble / "
      "optimizer\n",
      "rank", "configuration", width, sim ? "SimGrid" : "-", "analytic", "samples/s", "MFU", "MFU(Meg)",
      "peak mem", context ? "CP / " : "", moe ? "EP / " : "");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const TimeBreakdown& b = r.breakdown;
    const double time = sim ? r.simulated_s : r.c.iteration_time_s;
    const bool folded = sim && f.o.tp_folded && r.c.t > 1;
    fmt::print(
        "{:<4} {:<{}} {:>11} {:>11} {:>12.4g} {:>5.1f}% {:>7.1f}% {:>10}  {} / {} / {} / {} / {} / {}\n",
        i + 1, r.c.label(), width, sim ? format_time(r.simulated_s) : "-", format_time(r.c.iteration_time_s),
        sim ? r.throughput : r.c.throughput_samples_per_s, 100 * f.mfu(time), 100 * f.model_mfu(time),
        format_bytes(r.c.peak_memory_bytes), format_time(b.compute_s),
        (folded ? std::string("in compute") : format_time(b.tensor_parallel_s)) +
            (context ? " / " + format_time(b.context_parallel_s) : std::string()) +
            (moe ? " / " + format_time(b.expert_parallel_s) : std::string()),
        format_time(b.pipeline_s), format_time(b.data_parallel_s), format_time(b.bubble_s),
        format_time(b.optimizer_s));
  }
}

// Without replays (--top 0): the analytic ranking's best, so that the command still answers.
constexpr size_t kAnalyticRows = 5;

void print_text(const Found& f) {
  const Search3dResult& res = f.res;
  fmt::print("{}: {} devices, global batch {}\n", f.exp.name.empty() ? f.o.file : f.exp.name,
             f.exp.cluster.devices.size(), f.o.global_batch);
  fmt::print("searched    {} combinations, {} lowered, {} fit memory\n", res.combinations, res.evaluated,
             res.ranked.size());
  if (const std::vector<std::string> replaced = replaced_by_search(f.exp); !replaced.empty())
    fmt::print("base        {} replaced by the search's axes\n", fmt::join(replaced, ", "));
  for (const auto& [reason, count] : res.left_out) fmt::print("left out    {:>6}  {}\n", count, reason);
  if (res.ranked.empty()) fmt::print("no candidate fits\n");
  if (res.ranked.empty()) return;
  std::vector<Row> rows;
  if (f.replayed.empty()) {
    const size_t k = std::min(kAnalyticRows, res.ranked.size());
    fmt::print("\nnothing replayed in SimGrid (--top 0): the analytic ranking's best {}\n", k);
    for (size_t i = 0; i < k; ++i) rows.push_back({res.ranked[i], 0, 0, res.ranked[i].breakdown});
  } else {
    if (f.o.tp_folded)
      fmt::print(
          "\nSimGrid replays TP-folded: each tensor-parallel group as its rank 0, its collectives folded "
          "into its passes (their time is in compute; docs/3d-search.md)\n");
    for (const Replayed& r : f.replayed)
      rows.push_back({r.c, r.simulated_s, r.metrics.throughput_samples_per_s, r.metrics.breakdown});
  }
  print_table(f, rows);
  print_mfu_formulas(f);
  if (const std::string x = f.moe_from_experiment(); !x.empty())
    fmt::print("MoE       every candidate, from the experiment: {}\n", x);
  const size_t folded = static_cast<size_t>(
      std::count_if(f.replayed.begin(), f.replayed.end(), [](const Replayed& r) { return r.folded; }));
  if (folded > 0)
    fmt::print(
        "\nSimGrid replays replica-folded for {} of the {} (from 2^20 tasks, exact and checked: "
        "docs/scale.md)\n",
        folded, f.replayed.size());
  if (f.replayed.size() >= 2) fmt::print("\n{}\n", why(f.replayed[0], f.replayed[1]));
  if (const std::string x = f.estimate_leaves_out(); !x.empty()) fmt::print("\nleaves out  {}\n", x);
  if (const std::vector<std::string> x = f.schedules_not_searched(); !x.empty())
    fmt::print("schedules {} not searched: --schedules names them (docs/3d-search.md)\n",
               fmt::join(x, " and "));
  const std::vector<output::CostModelCheck> checks = f.checks();
  if (!checks.empty()) fmt::print("\n");
  for (const output::CostModelCheck& c : checks) fmt::print("cost model  {}\n", c.note);
}

// The overrides the base is read with: --set's, --memory-margin's reserve, and an empty strategy
// where the base has none (the search sets every strategy key it needs; a base of workload and
// cluster alone was refused for the missing mapping).
std::vector<std::string> base_overrides(const SearchOptions& o) {
  std::vector<std::string> overrides = with_memory_margin(o.overrides, o.memory_margin);
  try {
    const input::Document doc = input::load_document_file(o.file);
    if (doc.root.IsMap() && !doc.root["strategy"]) overrides.insert(overrides.begin(), "strategy={}");
  } catch (const input::InputError&) {
    // Reading the base again reports it, located.
  }
  return overrides;
}

// --emit: the winner (SimGrid's fastest, or the analytic ranking's first without replays) as an
// experiment file.
Status emit_winner(const SearchOptions& o, const std::vector<std::string>& overrides, const Experiment& exp,
                   const Search3dResult& res, const std::vector<Replayed>& replayed) {
  if (res.ranked.empty()) return Error{fmt::format("--emit {}: no candidate fits, nothing to write", o.emit)};
  const Search3dCandidate& c = replayed.empty() ? res.ranked[0] : replayed[0].c;
  const std::string how = replayed.empty() ? fmt::format("analytic {}", format_time(c.iteration_time_s))
                                           : fmt::format("SimGrid {}{}", format_time(replayed[0].simulated_s),
                                                         o.tp_folded ? ", TP-folded" : "");
  const std::string comment =
      fmt::format("pipegrid search {} --global-batch {}: the winner, {} ({} per iteration)", o.file,
                  o.global_batch, c.label(), how);
  // The overrides the search read the base with, --memory-margin's reserve included, so that `run`
  // of the file has the memory the search judged the candidate against.
  if (Status st = emit_candidate({o.file, overrides, exp, c, o.global_batch, o.emit, comment}); !st)
    return st;
  fmt::print(std::cerr, "search: the winner ({}) written to {} (run it with `pipegrid run {}`)\n", c.label(),
             o.emit, o.emit);
  return {};
}

// The longest sequence of the workload's layers (0 without transformer layers).
double longest_sequence(const Workload& w) {
  double sequence = 0;
  for (size_t l = 0; l < w.layer_count(); ++l)
    sequence = std::max(sequence, w.layer(static_cast<int>(l)).split.sequence);
  return sequence;
}

// --tp-folded replays each tensor-parallel group as its rank 0, which a context-parallel group is
// not: refused where the cp axis would try cp > 1 (given, or by default on a long sequence), before
// a search whose first replay would fail.
Status check_tp_folded(const SearchOptions& o, const Experiment& exp) {
  if (!o.tp_folded) return {};
  const bool given =
      std::any_of(o.context_parallel.begin(), o.context_parallel.end(), [](int c) { return c > 1; });
  const double sequence = longest_sequence(exp.workload);
  if (given || (o.context_parallel.empty() && sequence / 2 >= kSearch3dCpMinTokens))
    return Error{fmt::format(
        "--tp-folded folds tensor-parallel groups only, and the search would try cp > 1 ({}): give --cp 1, "
        "or leave --tp-folded out",
        given ? "--cp gives it"
              : fmt::format("by default where each rank keeps {:g} tokens of the sequence of {:g}",
                            kSearch3dCpMinTokens, sequence))};
  return {};
}

// What the search would otherwise run in vain or ignore, refused before it starts: outputs that
// are the experiment or each other (the sweep file replaced the experiment), axis values no
// candidate can take, and options of an axis the workload does not have.
Status check_before_search(const SearchOptions& o, const Experiment& exp) {
  if (Status st = output::check_distinct_outputs({{"--emit", o.emit}, {"--sweep", o.sweep}},
                                                 {{"the experiment file", o.file}});
      !st)
    return st;
  const int n = static_cast<int>(exp.cluster.devices.size());
  for (int t : o.tensor_parallel)
    if (t < 1 || n % t != 0)
      return Error{fmt::format("--tensor-parallel {}: expected a divisor of the cluster's {} devices", t, n)};
  for (int p : o.pipeline)
    if (p < 1 || n % p != 0)
      return Error{fmt::format("--pipeline {}: expected a divisor of the cluster's {} devices", p, n)};
  for (int cp : o.context_parallel)
    if (cp < 1 || n % cp != 0)
      return Error{fmt::format("--cp {}: expected a divisor of the cluster's {} devices", cp, n)};
  for (int etp : o.expert_tensor_parallel)
    if (etp < 1 || n % etp != 0)
      return Error{fmt::format("--etp {}: expected a divisor of the cluster's {} devices", etp, n)};
  if (Status st = check_tp_folded(o, exp); !st) return st;
  for (int b : o.micro_batch_sizes)
    if (b < 1 || o.global_batch % b != 0)
      return Error{
          fmt::format("--micro-batch {}: expected a divisor of the global batch {}", b, o.global_batch)};
  for (int v : o.chunks)
    if (v < 2)
      return Error{fmt::format(
          "--chunks {}: expected at least 2 (model chunks per rank of interleaved-1f1b; 1 is 1f1b)", v)};
  if (!o.dispatchers.empty() && routed_experts(exp.workload) == 0)
    return Error{fmt::format("--dispatcher: workload \"{}\" has no mixture-of-experts blocks to dispatch to",
                             exp.workload.name)};
  if (!o.moe_overlap.empty() && routed_experts(exp.workload) == 0)
    return Error{
        fmt::format("--moe-overlap: workload \"{}\" has no mixture-of-experts blocks, no all-to-all to "
                    "overlap",
                    exp.workload.name)};
  if (!o.cp_algorithms.empty()) {
    const double sequence = longest_sequence(exp.workload);
    const bool given =
        std::any_of(o.context_parallel.begin(), o.context_parallel.end(), [](int c) { return c > 1; });
    if (!given && (!o.context_parallel.empty() || sequence / 2 < kSearch3dCpMinTokens))
      return Error{fmt::format(
          "--cp-algorithm: the search tries no cp > 1 ({}), so the algorithm would change nothing",
          !o.context_parallel.empty()
              ? "--cp gives none"
              : fmt::format(
                    "by default only where each rank keeps {:g} tokens, and the sequence is {:g}: give --cp",
                    kSearch3dCpMinTokens, sequence))};
  }
  return {};
}

int run(const SearchOptions& o) {
  // The base's batch keys are not needed: --global-batch sets the batch.
  const std::vector<std::string> overrides = base_overrides(o);  // the emitted winner is read with them too
  Result<Experiment> exp = input::load_experiment_file(o.file, overrides, false);
  if (!exp) return bad_input(margin_message(exp.error().message, o.memory_margin));
  const bool tty = isatty(STDERR_FILENO) == 1;
  if (Status st = check_before_search(o, *exp); !st) return bad_input(st.error().message);
  // Before the search, not after minutes of it: the folder --emit writes into must exist.
  if (const std::filesystem::path dir = std::filesystem::path(o.emit).parent_path();
      !o.emit.empty() && !dir.empty() && !std::filesystem::is_directory(dir))
    return bad_input(fmt::format("--emit {}: no folder {}", o.emit, dir.string()));
  if (o.tp_folded && routed_experts(exp->workload) > 0)
    return bad_input(fmt::format(
        "{}: --tp-folded folds tensor-parallel groups only; workload \"{}\" has mixture-of-experts blocks, "
        "whose expert groups span the replicas: replay whole graphs (leave --tp-folded out)",
        o.file, exp->workload.name));
  Result<Search3dOptions> so = search_options(o, tty);
  if (!so) return bad_input(so.error().message);
  Result<Search3dResult> res = search3d(*exp, *so);
  if (!res) return bad_input(fmt::format("{}: {}", o.file, res.error().message));
  drop_same_schedule_runs(*res);
  if (!o.sweep.empty()) {
    if (Status st = write_sweep(o, *res, exp->strategy.context.load_balance); !st)
      return bad_input(st.error().message);
    fmt::print(std::cerr, "search: {} candidates written to {} (run them with `pipegrid sweep {}`)\n",
               res->ranked.size(), o.sweep, o.sweep);
  }
  Result<std::vector<Replayed>> replayed = replay_best(o, *exp, *res, tty);
  if (!replayed) return bad_input(replayed.error().message);
  const Found found{o, *exp, *res, *replayed};
  if (!o.emit.empty()) {
    if (Status st = emit_winner(o, overrides, *exp, *res, *replayed); !st)
      return bad_input(st.error().message);
  }
  if (o.json)
    print_json(found);
  else
    print_text(found);
  return kOk;
}

}  // namespace

Command add_search_command(CLI::App& parent) {
  auto o = std::make_shared<SearchOptions>();
  CLI::App* app = parent.add_subcommand(
      "search", "Search tensor x pipeline x data parallelism, micro-batching, schedules and recomputation");
  app->add_option("experiment", o->file, "Experiment file (YAML): its workload, cluster and optimizer")
      ->required()
      ->check(kNonEmpty);
  app->add_option("--global-batch", o->global_batch, "Samples per iteration")
      ->required()
      ->check(kPositiveCount);
  app->add_option("--top", o->top,
                  "Replay the best K in SimGrid (0: none; the analytic ranking's best 5 are printed)")
      ->check(kCount);
  app->add_option("--tensor-parallel", o->tensor_parallel, "Only these t (default: every t allowed)");
  app->add_option("--pipeline", o->pipeline, "Only these p (default: every p allowed)");
  app->add_option("--micro-batch", o->micro_batch_sizes, "Only these micro-batch sizes per replica");
  app->add_option(
      "--schedules", o->schedules,
      "Only these schedules (1f1b, interleaved-1f1b, zb-h1, zb-h2; dualpipe and dualpipev when named)");
  app->add_option("--chunks", o->chunks,
                  "Only these chunks per rank for interleaved-1f1b (default: 2, 3 and 4)")
      ->check(CLI::Range(1, 1024));
  app->add_option("--recompute", o->recompute, "Only these recomputation modes (none, selective, full)");
  app->add_option("--ep", o->expert_parallel,
                  "MoE: only these expert-parallel sizes (default: every ep dividing the experts and t x d)")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--etp", o->expert_tensor_parallel,
                  "MoE: only these expert tensor-parallel sizes (default: every etp allowed)")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--dispatcher", o->dispatchers,
                  "MoE: only these token dispatchers (alltoall, allgather, deepep; default the first two)");
  app->add_option("--moe-overlap", o->moe_overlap,
                  "MoE: the all-to-all overlap (moe.overlap) as an axis: false, true or both (default: the "
                  "experiment's, not searched)");
  app->add_option(
         "--cp", o->context_parallel,
         "Only these context-parallel sizes (default: 1, and every cp leaving each rank 4,096 tokens)")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--cp-algorithm", o->cp_algorithms,
                  "Only these context-parallel algorithms for cp > 1 (p2p, all_gather, a2a)");
  app->add_flag("--json", o->json, "Print one JSON object");
  app->add_flag("--tp-folded", o->tp_folded,
                "Replay each tensor-parallel group as its rank 0 with its collectives folded into its passes "
                "(t times fewer devices, no TP flows; docs/3d-search.md)");
  app->add_flag("--exact-ranking", o->exact,
                "Rank by lowering every candidate whole (every replica and rank) instead of the one-replica "
                "estimate: slow at scale");
  app->add_option("--jobs", o->jobs, "SimGrid replays at a time, each in its own process")
      ->check(kPositiveCount);
  app->add_option("--sweep", o->sweep, "Also write the candidates that fit as a sweep file (pipegrid sweep)")
      ->check(kNonEmpty);
  add_memory_margin_option(*app, o->memory_margin);
  app->add_option("--emit", o->emit,
                  "Also write the winner as an experiment file that `pipegrid run` runs as the search did")
      ->check(kNonEmpty);
  add_set_option(*app, o->overrides);
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
