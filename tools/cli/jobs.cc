// pipegrid jobs JOBS.yaml [--json] [--top N]: several jobs on one cluster, replayed together on its one
// network (core/jobs.h, docs/jobs.md): each job's iteration times, its slowdown against the job alone
// on the same devices, and the links where the jobs met.
#include "core/jobs.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/experiment.h"
#include "core/metrics.h"
#include "core/units.h"
#include "tools/cli/cli.h"
#include "tools/cli/progress.h"
#include "tools/input/jobs_yaml.h"
#include "tools/output/device_groups.h"
#include "tools/output/report.h"
#include "tools/process/isolated_replay.h"

namespace pipegrid::cli {
namespace {

struct JobsOptions {
  std::string file;
  bool json = false;
  int top = 8;  // shared links listed
};

// What the replays say about one job.
struct JobOutcome {
  PreparedRun run;
  std::vector<double> times;  // per iteration, in the shared replay
  double alone_s = 0;         // one iteration alone on the same devices
  Timeline first;             // its first iteration in the shared replay, from its start
  Metrics metrics;            // of that first iteration
  double mean() const {
    return std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size());
  }
  double worst() const { return *std::max_element(times.begin(), times.end()); }
};

struct JobsResult {
  std::vector<JobOutcome> jobs;
  SharedTraffic shared;
  std::vector<std::pair<double, double>> span;  // per job: its first start and its last end
};

Result<std::vector<JobOutcome>> plan_jobs(const input::JobsSpec& spec) {
  const process::SimGridJudge judge;
  std::vector<JobOutcome> out;
  for (const input::JobSpec& job : spec.jobs) {
    Result<PreparedRun> p = prepare(job.experiment, &judge);
    if (!p) return Error{fmt::format("job \"{}\": {}", job.name, p.error().message)};
    for (const std::string& w : output::plan_warnings(job.experiment, *p))
      fmt::print(std::cerr, "pipegrid: warning: job {}: {}\n", job.name, w);
    out.push_back({std::move(*p), {}, 0, {}, {}});
  }
  return out;
}

// Replays the jobs together, then each alone for one iteration.
Result<JobsResult> replay_jobs(const input::JobsSpec& spec, std::vector<JobOutcome> outcomes, size_t top) {
  const Cluster& c = spec.cluster;
  std::vector<JobRun> runs;
  for (size_t j = 0; j < spec.jobs.size(); ++j)
    runs.push_back(
        {&outcomes[j].run.graph, spec.jobs[j].devices, spec.jobs[j].iterations, spec.jobs[j].start_s});
  Result<JobsGraph> joined = join_jobs(c.devices.size(), runs);
  if (!joined) return joined.error();
  Result<sim::Replay> together = process::replay_isolated(c, joined->graph);
  if (!together) return together.error();
  JobsResult r;
  for (size_t j = 0; j < runs.size(); ++j) {
    JobOutcome& o = outcomes[j];
    o.times = iteration_times(*joined, together->timeline, static_cast<int>(j));
    o.first = iteration_timeline(*joined, together->timeline, static_cast<int>(j), 0);
    o.metrics = compute_metrics(spec.jobs[j].experiment.cluster, o.run.graph, o.first);
    const std::vector<double>& end = together->timeline.end;
    r.span.emplace_back(spec.jobs[j].start_s, *std::max_element(end.begin() + joined->begin[j],
                                                                end.begin() + joined->begin[j + 1]));
    const JobRun alone{runs[j].graph, runs[j].devices, 1, 0};
    Result<JobsGraph> single = join_jobs(c.devices.size(), {&alone, 1});
    if (!single) return single.error();
    Result<sim::Replay> a = process::replay_isolated(c, single->graph);
    if (!a) return a.error();
    o.alone_s = a->timeline.makespan();
  }
  Result<SharedTraffic> shared = shared_links(c, *joined, together->timeline, top);
  if (!shared) return shared.error();
  r.shared = std::move(*shared);
  r.jobs = std::move(outcomes);
  return r;
}

std::string link_name(const Cluster& c, const SharedLink& l) {
  const Link& k = c.links[l.link];
  const std::string a = c.node_name(l.reverse ? k.b : k.a), b = c.node_name(l.reverse ? k.a : k.b);
  return k.duplex == Duplex::Shared ? fmt::format("{} -- {}", a, b) : fmt::format("{} -> {}", a, b);
}

void print_jobs_table(std::ostream& out, const input::JobsSpec& spec, const JobsResult& r) {
  std::vector<std::string> devices;
  size_t name_w = 3, devices_w = 7, placement_w = 9;
  for (const input::JobSpec& job : spec.jobs) {
    devices.push_back(output::device_ranges(spec.cluster, job.devices, 2));
    name_w = std::max(name_w, job.name.size());
    devices_w = std::max(devices_w, devices.back().size());
    placement_w = std::max(placement_w, job.placement.size());
  }
  fmt::print(out, "{:<{}}  {:<{}}  {:<{}} {:>9} {:>5} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "job", name_w,
             "devices", devices_w, "placement", placement_w, "start", "iter", "first", "mean", "worst",
             "alone", "slowdown");
  for (size_t j = 0; j < spec.jobs.size(); ++j) {
    const input::JobSpec& job = spec.jobs[j];
    const JobOutcome& o = r.jobs[j];
    fmt::print(out, "{:<{}}  {:<{}}  {:<{}} {:>9} {:>5} {:>10} {:>10} {:>10} {:>10} {:>7.3f}x\n", job.name,
               name_w, devices[j], devices_w, job.placement, placement_w, format_time(job.start_s),
               o.times.size(), format_time(o.times.front()), format_time(o.mean()), format_time(o.worst()),
               format_time(o.alone_s), o.mean() / o.alone_s);
  }
}

void print_shared(std::ostream& out, const input::JobsSpec& spec, const JobsResult& r, size_t top) {
  if (r.shared.links.empty()) {
    fmt::print(out, "\nshared links: none (no link direction carried flows of two jobs)\n");
    return;
  }
  fmt::print(out, "\nshared links (carrying flows of two or more jobs; the {} with the most bytes):\n",
             top == 0 ? "all" : fmt::format("top {}", top));
  fmt::print(out, "{:<40}", "link");
  for (const input::JobSpec& job : spec.jobs) fmt::print(out, " {:>12}", job.name);
  fmt::print(out, " {:>14}\n", "jobs together");
  for (const SharedLink& l : r.shared.links) {
    fmt::print(out, "{:<40}", link_name(spec.cluster, l));
    for (double b : l.bytes) fmt::print(out, " {:>12}", format_bytes(b));
    fmt::print(out, " {:>14}\n", format_time(l.together_s));
  }
  fmt::print(out, "(jobs together: time with flows of two or more jobs in flight on the link)\n");
}

void print_summary(std::ostream& out, const input::JobsSpec& spec, const JobsResult& r, size_t top) {
  const Cluster& c = spec.cluster;
  fmt::print(out, "pipegrid jobs{}: {} on cluster {} ({}), one SimGrid replay of the shared network\n",
             spec.name.empty() ? "" : " " + spec.name,
             output::plural(static_cast<double>(spec.jobs.size()), "job", "jobs"), c.name,
             output::plural(static_cast<double>(c.devices.size()), "device", "devices"));
  fmt::print(out,
             "each job is lowered on its own devices; its iterations end with a barrier (Megatron's step "
             "synchronises every rank: docs/jobs.md)\n\n");
  print_jobs_table(out, spec, r);
  fmt::print(out,
             "(iteration times in the shared replay; alone: one iteration of the job alone on the same "
             "devices; slowdown: mean / alone)\n");
  print_shared(out, spec, r, top);
  fmt::print(out, "\n");
  for (size_t j = 0; j < spec.jobs.size(); ++j) {
    const input::JobSpec& job = spec.jobs[j];
    const JobOutcome& o = r.jobs[j];
    const std::string& title = job.experiment.name;
    fmt::print(out, "job {}: {}{}, {}; first iteration: bubble {:.1f}%{}\n", job.name,
               title.empty() || title == job.name ? "" : title + ", ", job.source,
               strategy_label(job.experiment, o.run), 100 * o.metrics.bubble_ratio,
               o.metrics.feasible()
                   ? ""
                   : fmt::format(", INFEASIBLE: {} devices over memory", o.metrics.over_capacity.size()));
  }
  for (const std::string& n : spec.notes) fmt::print(out, "note: {}\n", n);
}

nlohmann::json to_json(const input::JobsSpec& spec, const JobsResult& r) {
  nlohmann::json jobs = nlohmann::json::array();
  for (size_t j = 0; j < spec.jobs.size(); ++j) {
    const input::JobSpec& job = spec.jobs[j];
    const JobOutcome& o = r.jobs[j];
    const output::RunReport report{job.experiment, o.run, o.first, o.metrics, false, 0, {}, {}};
    nlohmann::json busy = nlohmann::json::array();
    for (const auto& [a, b] : r.shared.busy[j])
      busy.push_back({output::json_number(a), output::json_number(b)});
    jobs.push_back({{"name", job.name},
                    {"source", job.source},
                    {"devices", output::device_ranges(spec.cluster, job.devices)},
                    {"device_count", job.devices.size()},
                    {"placement", job.placement},
                    {"start_s", output::json_number(job.start_s)},
                    {"iteration_times_s", o.times},
                    {"mean_s", output::json_number(o.mean())},
                    {"worst_s", output::json_number(o.worst())},
                    {"alone_s", output::json_number(o.alone_s)},
                    {"slowdown", output::json_number(o.mean() / o.alone_s)},
                    {"end_s", output::json_number(r.span[j].second)},
                    {"on_shared_links", busy},
                    {"first_iteration", output::to_json(report)}});
  }
  nlohmann::json links = nlohmann::json::array();
  for (const SharedLink& l : r.shared.links)
    links.push_back({{"link", link_name(spec.cluster, l)}, {"bytes", l.bytes}, {"together_s", l.together_s}});
  return {{"command", "jobs"}, {"name", spec.name},     {"cluster", spec.cluster.name},
          {"jobs", jobs},      {"shared_links", links}, {"notes", spec.notes}};
}

int run(const JobsOptions& o) {
  Result<input::JobsSpec> spec = input::load_jobs_file(o.file);
  if (!spec) return bad_input(spec.error().message);
  Progress progress("planning the jobs");
  Result<std::vector<JobOutcome>> planned = plan_jobs(*spec);
  if (!planned) return bad_input(fmt::format("{}: {}", o.file, planned.error().message));
  progress.stage("replaying the jobs together, then each alone");
  Result<JobsResult> r = replay_jobs(*spec, std::move(*planned), static_cast<size_t>(o.top));
  progress.done();
  if (!r) return bad_input(fmt::format("{}: {}", o.file, r.error().message));
  if (o.json)
    std::cout << to_json(*spec, *r).dump(2) << "\n";
  else
    print_summary(std::cout, *spec, *r, static_cast<size_t>(o.top));
  return kOk;
}

}  // namespace

Command add_jobs_command(CLI::App& parent) {
  auto o = std::make_shared<JobsOptions>();
  CLI::App* app = parent.add_subcommand(
      "jobs", "Several jobs on one cluster, replayed together: iteration times, slowdowns, shared links");
  app->add_option("jobs", o->file, "Jobs file (YAML; docs/jobs.md)")->required()->check(kNonEmpty);
  app->add_flag("--json", o->json, "Print one JSON object");
  app->add_option("--top", o->top, "Shared links listed (0: all)")->capture_default_str()->check(kCount);
  return {app, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
