// pipegrid goodput EXPERIMENT.yaml --tokens N: a whole training run with failures, checkpoints and
// restarts (core/goodput.h): the replayed iteration time, a failure model, a checkpoint policy, a seeded
// Monte Carlo beside Daly's closed form (docs/goodput.md).
#include "core/goodput.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/experiment.h"
#include "core/memory.h"
#include "core/metrics.h"
#include "core/model_flops.h"
#include "core/units.h"
#include "tools/cli/cli.h"
#include "tools/cli/progress.h"
#include "tools/input/experiment_yaml.h"
#include "tools/output/report.h"
#include "tools/output/run_figures.h"
#include "tools/process/folded_replay.h"
#include "tools/process/isolated_replay.h"

namespace pipegrid::cli {
namespace {

struct GoodputOptions {
  std::string file;
  double tokens = 0, iterations = 0;
  std::string failures = "llama3";           // llama3 | rsc1 | rsc2 | none
  std::string mtbf;                          // a job MTBF instead of the failure model
  bool failures_given = false;               // --failures was on the command line (not its default)
  bool storage_given = false;                // --storage-bandwidth was on the command line
  std::vector<std::string> failure_options;  // --restart, --trials, --seed given (no use without failures)
  std::string interval = "auto";             // the checkpoint interval, or auto
  std::string write;              // the checkpoint's blocking write (default: state / storage bandwidth)
  std::string storage = "2TBps";  // aggregate storage bandwidth (Llama 3, section 3.3.1)
  // From a failure to training again: Kokolis et al. (arXiv 2410.21680) take u0 = 5-20 min; MegaScale
  // (arXiv 2402.15627, section 6.3) detects and diagnoses in under 10 min.
  std::string restart = "600s";
  int trials = 1000;
  long long seed = 1;
  bool json = false;
  std::vector<std::string> overrides;
};

// Llama 3 405B's unexpected interruptions in a 54-day snapshot on 16,384 H100s (Dubey et al., arXiv
// 2407.21783, section 3.3.4, Table 5: counts; its "30.1%" for faulty GPUs is not 148 / 419), as
// rates per GPU-day: the job's GPUs scale every category (an assumption: the paper gives no
// per-component populations).
struct Llama3Row {
  const char* component;
  int count;
};
constexpr Llama3Row kLlama3Table5[] = {{"faulty GPU", 148},
                                       {"GPU HBM3 memory", 72},
                                       {"software bug", 54},
                                       {"network switch/cable", 35},
                                       {"host maintenance", 32},
                                       {"GPU SRAM memory", 19},
                                       {"GPU system processor", 17},
                                       {"NIC", 7},
                                       {"NCCL watchdog timeouts", 7},
                                       {"silent data corruption", 6},
                                       {"GPU thermal interface + sensor", 6},
                                       {"SSD", 3},
                                       {"power supply", 3},
                                       {"server chassis", 2},
                                       {"IO expansion board", 2},
                                       {"dependency", 2},
                                       {"CPU", 2},
                                       {"system memory", 2}};
constexpr double kLlama3Days = 54, kLlama3Gpus = 16384;

std::vector<FailureClass> llama3_failures(double gpus) {
  std::vector<FailureClass> out;
  for (const Llama3Row& r : kLlama3Table5)
    out.push_back({r.component, r.count / (kLlama3Days * kLlama3Gpus), gpus});
  return out;
}

// Kokolis et al. (arXiv 2410.21680): failures per node-day of jobs above 128 GPUs on Meta's research
// clusters, RSC-1 (16k A100s) 6.50 and RSC-2 (8k A100s) 2.34 per 1,000 node-days (as transcribed:
// docs/goodput.md); a job's MTTF 1 / (nodes x rate): 1.8 h at 16,384 GPUs on RSC-1, as the paper says.
constexpr double kRsc1PerNodeDay = 6.50e-3, kRsc2PerNodeDay = 2.34e-3;

Result<double> time_option(const std::string& name, const std::string& text) {
  Result<double> v = parse_quantity(text, Dimension::Time);
  if (!v) return Error{fmt::format("{}: {}", name, v.error().message)};
  return v;
}

// The model state a checkpoint saves, once for the whole job: the weights and the optimizer state
// (fp32 master weights and moments under mixed precision), not the gradients.
double checkpoint_bytes(const Experiment& e) {
  MemoryOptions o = e.memory;
  o.zero1 = false;
  const MemoryBytes m = static_memory(total_parameters(e.workload), total_parameter_bytes(e.workload), o);
  return m[static_cast<int>(MemoryCategory::Weights)] + m[static_cast<int>(MemoryCategory::OptimizerState)];
}

std::string in_days(double seconds) {
  return fmt::format("{:.2f} days", seconds / 86400);
}

// A run's durations in the unit a person reads them in: "3.09 h", "10.9 min", "45 s".
std::string duration(double seconds) {
  if (!std::isfinite(seconds)) return "infinite";
  if (seconds >= 2 * 86400) return in_days(seconds);
  if (seconds >= 3600) return fmt::format("{:.3g} h", seconds / 3600);
  if (seconds >= 60) return fmt::format("{:.3g} min", seconds / 60);
  return format_time(seconds);
}

struct GoodputSetup {
  double iteration_s = 0, tokens_per_iteration = 0, iterations = 0, gpus = 0, nodes = 0;
  double nodeless = 0;  // devices in use without a node, each counted as one
  double not_gpus = 0;  // of the devices in use (`gpus`), those not GPUs (FPGAs, hand-described ones)
  std::string failures_note;
  double state_bytes = 0, storage_bps = 0;
  std::vector<FailureClass> classes;
  RunModel model;
  std::string interval_note, write_note, replay_note;
  std::vector<std::string> faults;  // the experiment's faults (slow devices, links down), as run states them
  bool feasible = true;             // the plan fits every device's memory
};

Status model_run(const GoodputOptions& o, const Experiment& e, GoodputSetup& s) {
  if (o.failures != "llama3" && o.failures != "rsc1" && o.failures != "rsc2" && o.failures != "none")
    return Error{fmt::format("--failures: expected llama3, rsc1, rsc2 or none, got \"{}\"", o.failures)};
  if (o.failures == "llama3") {
    s.classes = llama3_failures(s.gpus);
    s.failures_note = fmt::format(
        "Llama 3 405B's 419 unexpected interruptions in 54 days on 16,384 H100s (arXiv 2407.21783, Table 5), "
        "per "
        "GPU-day, on {:.0f} {}; its 47 planned ones not modelled",
        s.gpus,
        s.not_gpus == 0 ? std::string("GPUs")
                        : fmt::format("devices ({:g} of them not GPUs, given the H100's rates)", s.not_gpus));
  } else if (o.failures != "none") {
    const bool one = o.failures == "rsc1";
    s.classes = {{one ? "node (RSC-1)" : "node (RSC-2)", one ? kRsc1PerNodeDay : kRsc2PerNodeDay, s.nodes}};
    s.failures_note = fmt::format(
        "Meta's {} rate, {:.2f} failures per 1,000 node-days (Kokolis et al., arXiv 2410.21680), "
        "on {:.0f} nodes{}",
        one ? "RSC-1" : "RSC-2", one ? 6.50 : 2.34, s.nodes,
        s.nodeless == 0
            ? std::string()
            : fmt::format(" ({:.0f} of them devices without a node in the cluster, each counted as "
                          "one)",
                          s.nodeless));
  }
  s.model.mtbf_s = job_mtbf_s(s.classes);
  if (o.failures == "none" && o.mtbf.empty() && !o.failure_options.empty()) {
    std::string given;
    for (const std::string& x : o.failure_options) given += (given.empty() ? "" : ", ") + x;
    return Error{fmt::format("{} {} for failures, and --failures none has none: it would change nothing",
                             given, o.failure_options.size() == 1 ? "is" : "are")};
  }
  if (!o.mtbf.empty()) {
    if (o.failures_given)
      return Error{
          fmt::format("--mtbf replaces the failure model, and --failures {} was given too; expected one "
                      "of them",
                      o.failures)};
    Result<double> m = time_option("--mtbf", o.mtbf);
    if (!m) return m.error();
    if (*m <= 0) return Error{fmt::format("--mtbf: expected a positive time, got \"{}\"", o.mtbf)};
    s.model.mtbf_s = *m;
    s.classes.clear();
  }
  Result<double> restart = time_option("--restart", o.restart);
  if (!restart) return restart.error();
  s.model.restart_s = *restart;
  s.state_bytes = checkpoint_bytes(e);
  Result<double> storage = parse_quantity(o.storage, Dimension::Bandwidth);
  if (!storage || *storage <= 0)
    return Error{fmt::format("--storage-bandwidth: expected a positive bandwidth like \"2TBps\", got \"{}\"",
                             o.storage)};
  s.storage_bps = *storage;
  if (o.write.empty()) {
    s.model.write_s = s.state_bytes / s.storage_bps;
    s.write_note = fmt::format(
        "{} of weights and optimizer state at {} (Llama 3's storage, sustained: arXiv "
        "2407.21783, section 3.3.1; --storage-bandwidth)",
        format_bytes(s.state_bytes), format_bandwidth(s.storage_bps));
  } else {
    if (o.storage_given)
      return Error{fmt::format(
          "--storage-bandwidth sets the checkpoint's write time, and --checkpoint-write {} was given too; "
          "expected one of them",
          o.write)};
    Result<double> w = time_option("--checkpoint-write", o.write);
    if (!w) return w.error();
    s.model.write_s = *w;
    s.write_note = "--checkpoint-write";
  }
  s.model.work_s = s.iterations * s.iteration_s;
  if (o.interval == "auto") {
    s.model.interval_s = best_interval_s(s.model, s.iteration_s);
    s.interval_note = fmt::format(
        "auto: whole iterations minimising the expected time; Daly's optimum {}, "
        "Young's {}",
        duration(daly_optimal_interval_s(s.model.write_s, s.model.mtbf_s)),
        duration(young_interval_s(s.model.write_s, s.model.mtbf_s)));
  } else {
    Result<double> t = time_option("--checkpoint-interval", o.interval);
    if (!t) return t.error();
    if (*t <= 0)
      return Error{
          fmt::format("--checkpoint-interval: expected a positive time or auto, got \"{}\"", o.interval)};
    s.model.interval_s = std::max(1.0, std::round(*t / s.iteration_s)) * s.iteration_s;
    s.interval_note = "--checkpoint-interval, in whole iterations";
    if (s.model.work_s > 0 && s.model.interval_s >= s.model.work_s)
      s.interval_note +=
          fmt::format("; longer than the {} of training: no checkpoint is written before the end",
                      duration(s.model.work_s));
  }
  return {};
}

// The time failures cost (rework and restarts) by cause: each class's share of the job's failure rate
// (failures are a Poisson process: a failure is of class c with probability rate_c / rate), largest
// first.
std::vector<std::pair<std::string, double>> lost_by_cause(const GoodputSetup& s, const MonteCarlo& mc) {
  std::vector<std::pair<std::string, double>> out;
  const double rate = 1.0 / job_mtbf_s(s.classes);
  for (const FailureClass& c : s.classes)
    out.emplace_back(c.name, (mc.mean.rework_s + mc.mean.restart_s) * c.rate_per_s() / rate);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

void print_text(const GoodputOptions& o, const Experiment& e, const GoodputSetup& s, const MonteCarlo& mc) {
  std::vector<double> w = mc.wall_s;
  std::sort(w.begin(), w.end());
  const double p5 = w[static_cast<size_t>(0.05 * (w.size() - 1))],
               p95 = w[static_cast<size_t>(0.95 * (w.size() - 1))];
  const double daly = daly_run_time_s(s.model);
  fmt::print("{}\n", e.name.empty() ? o.file : e.name);
  fmt::print("iteration   {} replayed ({}){}\n", format_time(s.iteration_s), s.replay_note,
             s.tokens_per_iteration > 0 ? fmt::format(", {:.4g} tokens", s.tokens_per_iteration) : "");
  fmt::print("target      {:.4g} iteration{}{}, {} of training without failures\n", s.iterations,
             s.iterations == 1 ? "" : "s",
             o.iterations > 0 && o.iterations != s.iterations
                 ? fmt::format(" (--iterations {:g} rounded up to whole iterations)", o.iterations)
                 : "",
             duration(s.model.work_s));
  if (!s.faults.empty())
    fmt::print("faults      {} (the iteration replayed with them)\n", fmt::join(s.faults, ", "));
  if (!s.feasible)
    fmt::print(
        "INFEASIBLE  the plan exceeds a device's memory (`pipegrid run` says which): these figures are for a "
        "run that could not start\n");
  if (s.classes.empty())
    fmt::print("failures    {}\n", std::isfinite(s.model.mtbf_s)
                                       ? fmt::format("job MTBF {} (--mtbf)", duration(s.model.mtbf_s))
                                       : std::string("none (--failures none)"));
  else
    fmt::print("failures    job MTBF {}: {}\n", duration(s.model.mtbf_s), s.failures_note);
  fmt::print(
      "checkpoint  every {} ({}); write {} ({}); restart {} (--restart; Kokolis et al.'s 5-20 min, "
      "MegaScale's "
      "detection and diagnosis under 10 min)\n",
      duration(s.model.interval_s), s.interval_note, format_time(s.model.write_s), s.write_note,
      duration(s.model.restart_s));
  fmt::print(
      "expected    {} to target (95% interval of the mean +-{}; 5th-95th percentile of runs {} - {}); "
      "Daly's closed form {}\n",
      duration(mc.mean.wall_s), o.trials > 1 ? duration(mc.wall_ci95_s) : std::string("? (one trial)"),
      duration(p5), duration(p95), duration(daly));
  fmt::print("ETTR        {:.2f}% (useful training time / elapsed time)\n", 100 * mc.ettr());
  if (s.tokens_per_iteration > 0)
    fmt::print("goodput     {:.4g} tokens/s (useful tokens per second of elapsed time)\n",
               s.model.work_s / s.iteration_s * s.tokens_per_iteration / mc.mean.wall_s);
  else
    fmt::print(
        "goodput     {:.4g} iterations/s (useful iterations per second of elapsed time; the workload "
        "has no sequence to count tokens in)\n",
        s.model.work_s / s.iteration_s / mc.mean.wall_s);
  fmt::print("lost        {:.1f} failures: rework {}, restarts {}, checkpoint writes {}\n", mc.mean.failures,
             duration(mc.mean.rework_s), duration(mc.mean.restart_s), duration(mc.mean.checkpoint_s));
  if (s.classes.size() > 1) {  // Llama 3's Table 5 classes (RSC-1 and RSC-2 have one, the node)
    std::string causes;
    const auto lost = lost_by_cause(s, mc);
    for (size_t i = 0; i < lost.size() && i < 5; ++i)
      causes += fmt::format("{}{} {}", i ? ", " : "", lost[i].first, duration(lost[i].second));
    fmt::print("by cause    {}{} (rework and restarts, by Table 5's shares)\n", causes,
               lost.size() > 5 ? fmt::format(", {} more", lost.size() - 5) : "");
  }
  fmt::print("trials      {} (seed {}; Monte Carlo of Daly's restart-dump model: docs/goodput.md)\n",
             o.trials, o.seed);
}

// ETTR against the checkpoint interval by Daly's closed form: 40 intervals in whole iterations, from
// one iteration (or a 32nd of the chosen interval) to 16 times the chosen one, spaced geometrically.
nlohmann::json interval_curve(const GoodputSetup& s) {
  nlohmann::json curve = nlohmann::json::array();
  const double lo = std::max(s.iteration_s, s.model.interval_s / 32), hi = s.model.interval_s * 16;
  double last = 0;
  for (int i = 0; i < 40; ++i) {
    RunModel m = s.model;
    const double tau = lo * std::pow(hi / lo, i / 39.0);
    m.interval_s = std::max(1.0, std::round(tau / s.iteration_s)) * s.iteration_s;
    if (m.interval_s == last) continue;
    last = m.interval_s;
    const double t = daly_run_time_s(m);
    curve.push_back({{"interval_s", m.interval_s}, {"expected_time_s", t}, {"ettr", m.work_s / t}});
  }
  return curve;
}

nlohmann::json to_json(const GoodputOptions& o, const GoodputSetup& s, const MonteCarlo& mc) {
  return {
      {"schema_version", output::kJsonSchemaVersion},
      {"command", "goodput"},
      {"iteration_time_s", s.iteration_s},
      {"feasible", s.feasible},
      {"faults", s.faults},
      {"gpus", output::json_number(s.gpus)},
      {"nodes", output::json_number(s.nodes)},
      {"iterations", output::json_number(s.iterations)},
      {"tokens_per_iteration", output::json_number(s.tokens_per_iteration)},
      {"mtbf_s", output::json_number(s.model.mtbf_s)},
      {"checkpoint_interval_s", s.model.interval_s},
      {"checkpoint_write_s", s.model.write_s},
      {"checkpoint_bytes", output::json_number(s.state_bytes)},
      {"restart_s", s.model.restart_s},
      {"expected_time_s", mc.mean.wall_s},
      {"expected_time_ci95_s", o.trials > 1 ? nlohmann::json(mc.wall_ci95_s) : nlohmann::json()},
      {"daly_time_s", daly_run_time_s(s.model)},
      {"ettr", mc.ettr()},
      {"failures", mc.mean.failures},
      {"lost_s",
       {{"rework", mc.mean.rework_s}, {"restart", mc.mean.restart_s}, {"checkpoint", mc.mean.checkpoint_s}}},
      {"trials", o.trials},
      {"seed", o.seed},
      {"lost_by_cause_s", lost_by_cause(s, mc)},
      {"interval_curve", interval_curve(s)}};
}

constexpr double kMaxIterations = 9007199254740992.0;  // 2^53

// The options' errors before minutes of replay: the same parses model_run makes.
Status check_options(const GoodputOptions& o) {
  if ((o.tokens > 0) == (o.iterations > 0))
    return Error{"goodput: give the target as --tokens or --iterations (one of them), a positive number"};
  if (o.tokens < 0 || o.iterations < 0) return Error{"goodput: --tokens and --iterations must be positive"};
  if (!std::isfinite(o.tokens) || !std::isfinite(o.iterations))
    return Error{"goodput: --tokens and --iterations must be finite numbers"};
  if (o.trials > 10'000'000)
    return Error{
        fmt::format("goodput: --trials: expected at most 1e+07 (each trial's time is kept for the "
                    "percentiles), got {}",
                    o.trials)};
  if (o.iterations > kMaxIterations)
    return Error{
        fmt::format("goodput: --iterations: expected at most {:g} (2^53: iterations are counted "
                    "exactly), got {:g}",
                    kMaxIterations, o.iterations)};
  GoodputSetup probe;
  probe.iteration_s = 1;
  probe.iterations = 1;
  Experiment none;
  return model_run(o, none, probe);
}

int run(const GoodputOptions& o) {
  if (Status st = check_options(o); !st) return bad_input(st.error().message);
  Result<Experiment> exp = input::load_experiment_file(o.file, o.overrides);
  if (!exp) return bad_input(exp.error().message);
  Progress progress("planning");
  // The plan `run` and `plan` replay: a planner's finalists judged in SimGrid, as theirs are.
  const process::SimGridJudge judge;
  Result<PreparedRun> run = prepare(*exp, &judge, false, GraphForm::FoldedIfLarge);
  progress.done();
  if (!run) return bad_input(fmt::format("{}: {}", o.file, run.error().message));
  sim::ReplayOptions ro;
  ro.schedule = &run->schedule;
  Progress replaying("simulating one iteration");
  Result<process::ChosenReplay> replay = process::replay_prepared(*exp, *run, ro, process::FoldMode::Auto);
  replaying.done();
  if (!replay) return bad_input(fmt::format("{}: {}", o.file, replay.error().message));
  const Metrics m =
      compute_metrics(exp->cluster, run->graph, replay->replay.timeline, run->fold ? &*run->fold : nullptr);
  GoodputSetup s;
  s.iteration_s = m.iteration_time_s;
  s.faults = exp->faults;
  s.feasible = m.feasible();
  s.replay_note = replay->mode.folded ? "SimGrid, replica-folded" : "SimGrid";
  std::set<std::string> machines;
  for (size_t d = 0; d < m.devices.size(); ++d)
    if (m.devices[d].used) {
      s.gpus += 1;
      s.not_gpus += exp->cluster.devices[d].spec.family != "gpu";
      machines.insert(exp->cluster.machine_of(static_cast<int>(d)));
      s.nodeless += exp->cluster.devices[d].node.empty();
    }
  s.nodes = static_cast<double>(machines.size());
  const std::optional<output::TokenFigures> tf = output::token_figures(*exp, m);
  // Counted, not through the time (tokens/s x seconds can land a hair below a whole batch's tokens,
  // and --tokens would then ask for one iteration more).
  s.tokens_per_iteration = tf ? m.samples_per_iteration * tf->model.sequence : 0;
  if (o.tokens > 0 && s.tokens_per_iteration <= 0)
    return bad_input(
        "goodput: --tokens needs a workload with a sequence length (a transformer); use --iterations");
  s.iterations = o.tokens > 0 ? std::ceil(o.tokens / s.tokens_per_iteration) : std::ceil(o.iterations);
  if (s.iterations > kMaxIterations)
    return bad_input(
        fmt::format("goodput: --tokens {:g} is {:g} iterations of {:g} tokens; expected at most "
                    "{:g} (2^53: iterations are counted exactly)",
                    o.tokens, s.iterations, s.tokens_per_iteration, kMaxIterations));
  if (Status st = model_run(o, *exp, s); !st) return bad_input(st.error().message);
  Result<MonteCarlo> mc = simulate_run(s.model, o.trials, static_cast<uint64_t>(o.seed));
  if (!mc) return bad_input(fmt::format("goodput: {}", mc.error().message));
  if (o.json)
    std::cout << to_json(o, s, *mc).dump(2) << "\n";
  else
    print_text(o, *exp, s, *mc);
  return kOk;
}

}  // namespace

Command add_goodput_command(CLI::App& parent) {
  auto o = std::make_shared<GoodputOptions>();
  CLI::App* app = parent.add_subcommand(
      "goodput", "A training run with failures, checkpoints and restarts: expected time to a target, ETTR");
  app->add_option("experiment", o->file, "Experiment file (YAML)")->required()->check(kNonEmpty);
  app->add_option("--tokens", o->tokens, "The target in tokens (e.g. 15e12)");
  app->add_option("--iterations", o->iterations, "The target in iterations");
  CLI::Option* failures =
      app->add_option(
             "--failures", o->failures,
             "The failure model: llama3 (Llama 3 405B's Table 5, per GPU-day), rsc1 or rsc2 (Meta's research "
             "clusters, per node-day) or none")
          ->capture_default_str();
  app->add_option("--mtbf", o->mtbf,
                  "The job's mean time between failures instead of the failure model (e.g. 10800s)");
  app->add_option("--checkpoint-interval", o->interval, "Compute between checkpoints (e.g. 1800s), or auto")
      ->capture_default_str();
  app->add_option("--checkpoint-write", o->write,
                  "A checkpoint's blocking write (default: the model state over --storage-bandwidth)");
  CLI::Option* storage = app->add_option("--storage-bandwidth", o->storage, "Aggregate checkpoint bandwidth")
                             ->capture_default_str();
  CLI::Option* restart = app->add_option("--restart", o->restart,
                                         "From a failure to training again: detection, rescheduling, loading")
                             ->capture_default_str();
  CLI::Option* trials = app->add_option("--trials", o->trials, "Monte Carlo trials")
                            ->capture_default_str()
                            ->check(kPositiveCount);
  CLI::Option* seed = app->add_option("--seed", o->seed, "The Monte Carlo's seed")->capture_default_str();
  app->add_flag("--json", o->json, "Print one JSON object");
  add_set_option(*app, o->overrides);
  return {app, [o, failures, storage, restart, trials, seed] {
            o->failures_given = failures->count() > 0;
            o->storage_given = storage->count() > 0;
            for (const CLI::Option* x : {restart, trials, seed})
              if (x->count() > 0) o->failure_options.push_back(x->get_name());
            return run(*o);
          }};
}

}  // namespace pipegrid::cli
