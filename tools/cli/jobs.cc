// pipegrid jobs JOBS.yaml [--json] [--top N]: several jobs on one cluster, replayed together on its one
// network (core/jobs.h, docs/jobs.md): each job's iteration times, its slowdown against the job alone
// on the same devices, and the links where the jobs met.
#include "core/jobs.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>

#include "core/experiment.h"
#include "core/job_queue.h"
#include "core/metrics.h"
#include "core/units.h"
#include "tools/cli/cli.h"
#include "tools/cli/progress.h"
#include "tools/input/jobs_yaml.h"
#include "tools/input/yaml_node.h"
#include "tools/output/device_groups.h"
#include "tools/output/report.h"
#include "tools/output/safe_write.h"
#include "tools/process/isolated_replay.h"

namespace pipegrid::cli {
namespace {

struct JobsOptions {
  std::string file;
  bool json = false;
  int top = 8;             // shared links listed
  bool top_given = false;  // --top was on the command line
  int phase_shift = 0;     // --phase-shift N: start offsets tried per job (0: none)
  std::string trace;       // --trace FILE: one lane per job
};

// What the replays say about one job.
struct JobOutcome {
  PreparedRun run;
  std::vector<double> times;      // per iteration, in the shared replay
  double alone_s = 0;             // one iteration alone on the same devices
  Timeline first;                 // its first iteration in the shared replay, from its start
  Metrics metrics;                // of that first iteration
  double start_s = 0, end_s = 0;  // its start (given or shifted) and its last task's end
  double mean() const {
    return std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size());
  }
  double worst() const { return *std::max_element(times.begin(), times.end()); }
};

// What --phase-shift did: the mean slowdown over the jobs at their given starts, and how many
// replays it took to choose the new ones.
struct PhaseShift {
  double period_s = 0;  // one iteration of the first job alone: the offsets' range
  double before = 0;
  int tried = 0;
};

struct JobsResult {
  std::vector<JobOutcome> jobs;
  SharedTraffic shared;
  std::optional<PhaseShift> shift;
};

Result<std::vector<JobOutcome>> plan_jobs(const input::JobsSpec& spec) {
  const process::SimGridJudge judge;
  std::vector<JobOutcome> out;
  for (const input::JobSpec& job : spec.jobs) {
    Result<PreparedRun> p = prepare(job.experiment, &judge);
    if (!p) return Error{fmt::format("job \"{}\": {}", job.name, p.error().message)};
    for (const std::string& w : output::plan_warnings(job.experiment, *p))
      fmt::print(std::cerr, "pipegrid: warning: job {}: {}\n", job.name, w);
    if (const std::string idle = output::idle_devices_note(job.experiment.cluster, p->partition);
        !idle.empty())
      fmt::print(std::cerr, "pipegrid: warning: job {}: {}: the job holds them idle\n", job.name, idle);
    out.push_back({std::move(*p), {}, 0, {}, {}});
  }
  return out;
}

// One iteration of a job alone on its devices.
Result<double> time_alone(const Cluster& c, const JobRun& job) {
  const JobRun alone{job.graph, job.devices, 1, 0};
  Result<JobsGraph> single = join_jobs(c.devices.size(), {&alone, 1});
  if (!single) return single.error();
  Result<sim::Replay> a = process::replay_isolated(c, single->graph);
  if (!a) return a.error();
  return a->timeline.makespan();
}

// The mean slowdown of jobs 0 .. k replayed together (their iteration times' mean over `alone`).
Result<double> slowdown_together(const Cluster& c, std::span<const JobRun> runs,
                                 const std::vector<double>& alone) {
  Result<JobsGraph> joined = join_jobs(c.devices.size(), runs);
  if (!joined) return joined.error();
  Result<sim::Replay> r = process::replay_isolated(c, joined->graph);
  if (!r) return r.error();
  double sum = 0;
  for (size_t j = 0; j < runs.size(); ++j) {
    const std::vector<double> t = iteration_times(*joined, r->timeline, static_cast<int>(j));
    sum += std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(t.size()) / alone[j];
  }
  return sum / static_cast<double>(runs.size());
}

// --phase-shift N (CASSINI's idea, NSDI'24, as a greedy search): for each job after the first in
// order, N start offsets spread over one iteration of the first job alone are tried, each added to
// the job's own start, with the jobs before it at their chosen starts; the offset whose replay of
// those jobs has the smallest mean slowdown is kept.
Result<PhaseShift> shift_phases(const Cluster& c, std::vector<JobRun>& runs, const std::vector<double>& alone,
                                int n) {
  PhaseShift out;
  out.period_s = alone[0];
  Result<double> before = slowdown_together(c, runs, alone);
  if (!before) return before.error();
  out.before = *before;
  for (size_t k = 1; k < runs.size(); ++k) {
    const double given = runs[k].start_s;
    double best = given, best_slowdown = std::numeric_limits<double>::infinity();
    for (int i = 0; i < n; ++i) {
      runs[k].start_s = given + out.period_s * i / n;
      Result<double> s = slowdown_together(c, std::span(runs).first(k + 1), alone);
      if (!s) return s.error();
      ++out.tried;
      if (*s < best_slowdown) best_slowdown = *s, best = runs[k].start_s;
    }
    runs[k].start_s = best;
  }
  return out;
}

// Replays each job alone, shifts the phases when asked, then replays the jobs together.
Result<JobsResult> replay_jobs(const input::JobsSpec& spec, std::vector<JobOutcome> outcomes,
                               const JobsOptions& o) {
  const Cluster& c = spec.cluster;
  std::vector<JobRun> runs;
  std::vector<double> alone;
  for (size_t j = 0; j < spec.jobs.size(); ++j) {
    runs.push_back(
        {&outcomes[j].run.graph, spec.jobs[j].devices, spec.jobs[j].iterations, spec.jobs[j].start_s});
    Result<double> a = time_alone(c, runs.back());
    if (!a) return a.error();
    alone.push_back(outcomes[j].alone_s = *a);
  }
  JobsResult r;
  if (o.phase_shift > 0 && runs.size() > 1) {
    Result<PhaseShift> shift = shift_phases(c, runs, alone, o.phase_shift);
    if (!shift) return shift.error();
    r.shift = *shift;
  }
  Result<JobsGraph> joined = join_jobs(c.devices.size(), runs);
  if (!joined) return joined.error();
  Result<sim::Replay> together = process::replay_isolated(c, joined->graph);
  if (!together) return together.error();
  for (size_t j = 0; j < runs.size(); ++j) {
    JobOutcome& out = outcomes[j];
    out.start_s = runs[j].start_s;
    out.times = iteration_times(*joined, together->timeline, static_cast<int>(j));
    out.first = iteration_timeline(*joined, together->timeline, static_cast<int>(j), 0);
    out.metrics = compute_metrics(spec.jobs[j].experiment.cluster, out.run.graph, out.first);
    const std::vector<double>& end = together->timeline.end;
    out.end_s = *std::max_element(end.begin() + joined->begin[j], end.begin() + joined->begin[j + 1]);
  }
  Result<SharedTraffic> shared = shared_links(c, *joined, together->timeline, static_cast<size_t>(o.top));
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
               name_w, devices[j], devices_w, job.placement, placement_w, format_time(o.start_s),
               o.times.size(), format_time(o.times.front()), format_time(o.mean()), format_time(o.worst()),
               format_time(o.alone_s), o.mean() / o.alone_s);
  }
}

void print_shared(std::ostream& out, const input::JobsSpec& spec, const JobsResult& r, size_t top) {
  if (r.shared.links.empty()) {
    fmt::print(out, "\nshared links: none (no link direction carried flows of two jobs)\n");
    return;
  }
  fmt::print(out, "\nshared links (carrying flows of two or more jobs; {}):\n",
             top == 0 ? "all of them, by bytes" : fmt::format("the top {} by bytes", top));
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

double mean_slowdown(const JobsResult& r) {
  double sum = 0;
  for (const JobOutcome& o : r.jobs) sum += o.mean() / o.alone_s;
  return sum / static_cast<double>(r.jobs.size());
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
  if (r.shift)
    fmt::print(out,
               "phase shift: {} start offsets tried (over one iteration of {} alone, {}): the jobs' mean "
               "slowdown {:.3f}x at the given starts, {:.3f}x at the starts above\n",
               r.shift->tried, spec.jobs[0].name, format_time(r.shift->period_s), r.shift->before,
               mean_slowdown(r));
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
                    {"start_s", output::json_number(o.start_s)},
                    {"iteration_times_s", o.times},
                    {"mean_s", output::json_number(o.mean())},
                    {"worst_s", output::json_number(o.worst())},
                    {"alone_s", output::json_number(o.alone_s)},
                    {"slowdown", output::json_number(o.mean() / o.alone_s)},
                    {"end_s", output::json_number(o.end_s)},
                    {"on_shared_links", busy},
                    {"first_iteration", output::to_json(report)}});
  }
  nlohmann::json links = nlohmann::json::array();
  for (const SharedLink& l : r.shared.links) {
    nlohmann::json bytes = nlohmann::json::array();  // per job, whole when whole
    for (double b : l.bytes) bytes.push_back(output::json_number(b));
    links.push_back({{"link", link_name(spec.cluster, l)}, {"bytes", bytes}, {"together_s", l.together_s}});
  }
  nlohmann::json shift = nullptr;
  if (r.shift)
    shift = {{"period_s", r.shift->period_s},
             {"tried", r.shift->tried},
             {"mean_slowdown_given", r.shift->before},
             {"mean_slowdown_shifted", mean_slowdown(r)}};
  return {{"schema_version", output::kJsonSchemaVersion},
          {"command", "jobs"},
          {"phase_shift", shift},
          {"name", spec.name},
          {"cluster", spec.cluster.name},
          {"jobs", jobs},
          {"shared_links", links},
          {"notes", spec.notes}};
}

// A queue's replays (core/job_queue.h): each job planned on the devices it got, each running set
// replayed together for the queue's replay_iterations, both cached.
class QueueReplays {
 public:
  explicit QueueReplays(const input::JobsSpec& spec) : spec_(spec), queue_(*spec.queue) {}

  // Each job's mean iteration time over a replay of the set together.
  Result<std::vector<double>> times(const std::vector<RunningJob>& set) {
    SetKey key;
    for (const RunningJob& r : set) key.emplace_back(alike(r.job), r.devices);
    if (auto it = sets_.find(key); it != sets_.end()) return it->second;
    std::vector<JobRun> runs;
    for (const RunningJob& r : set) {
      Result<const PreparedRun*> p = plan(r);
      if (!p) return p.error();
      runs.push_back({&(*p)->graph, r.devices, queue_.replay_iterations, 0});
    }
    Result<JobsGraph> joined = join_jobs(spec_.cluster.devices.size(), runs);
    if (!joined) return joined.error();
    Result<sim::Replay> replay = process::replay_isolated(spec_.cluster, joined->graph);
    if (!replay) return replay.error();
    std::vector<double> out;
    for (size_t j = 0; j < runs.size(); ++j) {
      const std::vector<double> t = iteration_times(*joined, replay->timeline, static_cast<int>(j));
      out.push_back(std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(t.size()));
    }
    return sets_[key] = out;
  }
  size_t replays() const { return sets_.size(); }

 private:
  using SetKey = std::vector<std::pair<int, std::vector<int>>>;
  // Jobs of one generator kind plan and replay alike on the same devices (their lengths differ, not
  // their iterations): one key per kind; a listed job is its own (a negative key).
  int alike(int job) const { return queue_.jobs[job].kind >= 0 ? queue_.jobs[job].kind : -1 - job; }
  struct Planned {
    Experiment experiment;
    PreparedRun run;
  };

  Result<const PreparedRun*> plan(const RunningJob& r) {
    auto key = std::make_pair(alike(r.job), r.devices);
    if (auto it = plans_.find(key); it != plans_.end()) return &it->second->run;
    const input::QueueJobSpec& job = queue_.jobs[r.job];
    Result<Cluster> c = job_cluster(spec_.cluster, r.devices);
    if (!c) return Error{fmt::format("job \"{}\": {}", job.name, c.error().message)};
    auto planned = std::make_unique<Planned>();
    try {
      planned->experiment = job.experiment(std::move(*c));
    } catch (const input::InputError& e) {
      return Error{e.what()};
    }
    const process::SimGridJudge judge;
    Result<PreparedRun> p = prepare(planned->experiment, &judge);
    if (!p)
      return Error{fmt::format("job \"{}\" on {}: {}", job.name,
                               output::device_ranges(spec_.cluster, r.devices, 2), p.error().message)};
    planned->run = std::move(*p);
    return &(plans_[key] = std::move(planned))->run;
  }

  const input::JobsSpec& spec_;
  const input::QueueSpec& queue_;
  std::map<std::pair<int, std::vector<int>>, std::unique_ptr<Planned>> plans_;
  std::map<SetKey, std::vector<double>> sets_;
};

struct QueueReport {
  QueueOutcome outcome;
  std::vector<double> alone_s;  // per job: an iteration alone on its devices
  size_t replays = 0;           // of running sets (alike sets once)
  size_t alone_replays = 0;     // of jobs alone on their devices, not already replayed as a set
};

void print_queue(std::ostream& out, const input::JobsSpec& spec, const QueueReport& r) {
  const input::QueueSpec& q = *spec.queue;
  fmt::print(out,
             "pipegrid jobs{}: a queue of {} on cluster {} ({}), first come first served, placement {}\n",
             spec.name.empty() ? "" : " " + spec.name,
             output::plural(static_cast<double>(q.jobs.size()), "job", "jobs"), spec.cluster.name,
             output::plural(static_cast<double>(spec.cluster.devices.size()), "device", "devices"),
             q.placement == JobPlacement::Random ? fmt::format("random (seed {})", q.seed)
                                                 : std::string(to_string(q.placement)));
  if (!q.generated.empty()) fmt::print(out, "{}\n", q.generated);
  size_t name_w = 3, devices_w = 7;
  std::vector<std::string> devices;
  for (size_t j = 0; j < q.jobs.size(); ++j) {
    devices.push_back(output::device_ranges(spec.cluster, r.outcome.jobs[j].devices, 2));
    name_w = std::max(name_w, q.jobs[j].name.size());
    devices_w = std::max(devices_w, devices.back().size());
  }
  fmt::print(out, "\n{:<{}}  {:<{}} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "job", name_w,
             "devices", devices_w, "arrival", "start", "end", "JCT", "iterations", "iteration", "alone",
             "slowdown");
  for (size_t j = 0; j < q.jobs.size(); ++j) {
    const QueueOutcome::Job& o = r.outcome.jobs[j];
    const double per_iteration = (o.end_s - o.start_s) / q.jobs[j].iterations;
    fmt::print(out, "{:<{}}  {:<{}} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7.3f}x\n",
               q.jobs[j].name, name_w, devices[j], devices_w, format_time(q.jobs[j].arrival_s),
               format_time(o.start_s), format_time(o.end_s), format_time(o.end_s - q.jobs[j].arrival_s),
               q.jobs[j].iterations, format_time(per_iteration), format_time(r.alone_s[j]),
               per_iteration / r.alone_s[j]);
  }
  fmt::print(
      out,
      "(JCT: job completion time, end - arrival; iteration: its mean over the run; alone: an iteration alone "
      "on its devices)\n\nmakespan {}, utilisation {:.1f}% (device time held by jobs), {} running set{} "
      "replayed and {} job{} alone ({} iteration{} each)\n",
      format_time(r.outcome.makespan_s), 100 * r.outcome.utilisation, r.replays, r.replays == 1 ? "" : "s",
      r.alone_replays, r.alone_replays == 1 ? "" : "s", q.replay_iterations,
      q.replay_iterations == 1 ? "" : "s");
  for (const std::string& n : spec.notes) fmt::print(out, "note: {}\n", n);
}

nlohmann::json queue_json(const input::JobsSpec& spec, const QueueReport& r) {
  const input::QueueSpec& q = *spec.queue;
  nlohmann::json jobs = nlohmann::json::array();
  for (size_t j = 0; j < q.jobs.size(); ++j) {
    const QueueOutcome::Job& o = r.outcome.jobs[j];
    const double per_iteration = (o.end_s - o.start_s) / q.jobs[j].iterations;  // as the text table
    jobs.push_back({{"name", q.jobs[j].name},
                    {"source", q.jobs[j].source},
                    {"devices", output::device_ranges(spec.cluster, o.devices)},
                    {"arrival_s", output::json_number(q.jobs[j].arrival_s)},
                    {"start_s", output::json_number(o.start_s)},
                    {"end_s", output::json_number(o.end_s)},
                    {"iterations", output::json_number(q.jobs[j].iterations)},
                    {"mean_s", output::json_number(per_iteration)},
                    {"alone_s", output::json_number(r.alone_s[j])},
                    {"slowdown", output::json_number(per_iteration / r.alone_s[j])}});
  }
  return {{"schema_version", output::kJsonSchemaVersion},
          {"command", "jobs"},
          {"name", spec.name},
          {"cluster", spec.cluster.name},
          {"queue", jobs},
          {"makespan_s", r.outcome.makespan_s},
          {"utilisation", r.outcome.utilisation},
          {"running_sets_replayed", r.replays},
          {"alone_replayed", r.alone_replays},
          {"generated", q.generated},
          {"notes", spec.notes}};
}

int run_queue_file(const JobsOptions& o, const input::JobsSpec& spec) {
  const input::QueueSpec& q = *spec.queue;
  QueueReplays replays(spec);
  std::vector<QueuedJob> jobs;
  for (const input::QueueJobSpec& j : q.jobs) jobs.push_back({j.arrival_s, j.devices, j.iterations});
  Progress progress("replaying the queue's running sets");
  Result<QueueOutcome> r = run_queue(spec.cluster, jobs, q.placement, q.seed,
                                     [&](const std::vector<RunningJob>& set) { return replays.times(set); });
  if (!r) return bad_input(fmt::format("{}: {}", o.file, r.error().message));
  QueueReport report{std::move(*r), {}, replays.replays(), 0};
  for (size_t j = 0; j < jobs.size(); ++j) {
    Result<std::vector<double>> alone =
        replays.times({{static_cast<int>(j), report.outcome.jobs[j].devices}});
    if (!alone) return bad_input(fmt::format("{}: {}", o.file, alone.error().message));
    report.alone_s.push_back(alone->front());
  }
  report.alone_replays = replays.replays() - report.replays;
  progress.done();
  if (o.json)
    std::cout << queue_json(spec, report).dump(2) << "\n";
  else
    print_queue(std::cout, spec, report);
  return kOk;
}

// --trace FILE: a Chrome trace (chrome://tracing, Perfetto) with one process per job: its iterations
// on one lane, its flows on shared links (merged) on another.
std::string jobs_trace(const input::JobsSpec& spec, const JobsResult& r) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t j = 0; j < r.jobs.size(); ++j) {
    const int pid = static_cast<int>(j) + 1;
    events.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", spec.jobs[j].name}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "iterations"}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", 2},
                      {"args", {{"name", "on shared links"}}}});
    double start = r.jobs[j].start_s;
    for (size_t i = 0; i < r.jobs[j].times.size(); ++i) {
      events.push_back({{"ph", "X"},
                        {"name", fmt::format("iteration {}", i)},
                        {"pid", pid},
                        {"tid", 1},
                        {"ts", 1e6 * start},
                        {"dur", 1e6 * r.jobs[j].times[i]}});
      start += r.jobs[j].times[i];
    }
    for (const auto& [a, b] : r.shared.busy[j])
      events.push_back({{"ph", "X"},
                        {"name", "flows on shared links"},
                        {"pid", pid},
                        {"tid", 2},
                        {"ts", 1e6 * a},
                        {"dur", 1e6 * (b - a)}});
  }
  return nlohmann::json{{"displayTimeUnit", "ms"}, {"traceEvents", events}}.dump() + "\n";
}

int run(const JobsOptions& o) {
  if (Status s = output::check_distinct_outputs({{"--trace", o.trace}}, {{"the jobs file", o.file}}); !s)
    return bad_input(s.error().message);
  Result<input::JobsSpec> spec = input::load_jobs_file(o.file);
  if (!spec) return bad_input(spec.error().message);
  if (spec->queue) {
    if (o.phase_shift > 0 || !o.trace.empty() || o.top_given)
      return bad_input(
          fmt::format("{} is for a jobs file's jobs, not a queue", o.phase_shift > 0  ? "--phase-shift"
                                                                   : !o.trace.empty() ? "--trace"
                                                                                      : "--top"));
    return run_queue_file(o, *spec);
  }
  if (o.phase_shift > 0 && spec->jobs.size() < 2)
    return bad_input(fmt::format(
        "--phase-shift shifts the starts of the jobs after the first, and {} has one job: it would change "
        "nothing",
        o.file));
  Progress progress("planning the jobs");
  Result<std::vector<JobOutcome>> planned = plan_jobs(*spec);
  if (!planned) return bad_input(fmt::format("{}: {}", o.file, planned.error().message));
  progress.stage("replaying the jobs together, then each alone");
  Result<JobsResult> r = replay_jobs(*spec, std::move(*planned), o);
  progress.done();
  if (!r) return bad_input(fmt::format("{}: {}", o.file, r.error().message));
  if (!o.trace.empty())
    if (Status s = output::write_file_safely(o.trace, jobs_trace(*spec, *r)); !s)
      return bad_input(s.error().message);
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
  app->add_option(
         "--phase-shift", o->phase_shift,
         "Shift each job's start after the first: N offsets over one iteration of the first job tried, "
         "the least slowdown kept (docs/jobs.md)")
      ->check(kCount)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // Each offset is one replay of the jobs so far, per job: 10^6 of them ran for minutes.
            long long x = 0;
            return CLI::detail::lexical_cast(v, x) && x > 1000
                       ? "expected at most 1000 offsets (each one replay per job), got " + v
                       : "";
          },
          "N"));
  app->add_option("--trace", o->trace,
                  "Write a Chrome trace: one process per job, its iterations and its flows on shared links");
  CLI::Option* top =
      app->add_option("--top", o->top, "Shared links listed (0: all)")->capture_default_str()->check(kCount);
  return {app, [o, top] {
            o->top_given = top->count() > 0;
            return run(*o);
          }};
}

}  // namespace pipegrid::cli
