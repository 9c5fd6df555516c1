#include "tools/input/jobs_yaml.h"

#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <unordered_map>

#include "core/file_io.h"
#include "core/jobs.h"
#include "core/units.h"
#include "tools/input/cluster_yaml.h"
#include "tools/input/experiment_yaml.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {
namespace {

// A job's devices as its entry gives them: a list of names, or a count to place.
struct DeviceRequest {
  Node where;
  int count = 0;  // > 0: place this many
  JobPlacement placement = JobPlacement::Packed;
  uint64_t seed = 1;
};

class JobsParser {
 public:
  explicit JobsParser(std::shared_ptr<const Document> doc) : doc_(std::move(doc)) {
    out_.documents.push_back(doc_);
  }

  JobsSpec parse() {
    const Node root = Node::root(*doc_);
    if (root.is_null()) root.fail("expected a mapping with keys cluster and jobs, got an empty document");
    root.require_map("a mapping with keys cluster and jobs");
    root.check_keys({"name", "cluster", "iterations", "jobs", "queue"});
    if (auto n = root.get("name")) out_.name = n->string("a name");
    out_.cluster = parse_cluster(root.need("cluster", "a mapping describing the shared cluster"));
    taken_.assign(out_.cluster.devices.size(), false);
    owner_.assign(out_.cluster.devices.size(), -1);
    if (auto q = root.get("queue")) {
      for (const char* key : {"jobs", "iterations"})
        if (auto k = root.get(key)) k->fail(fmt::format("{} and queue: one or the other", key));
      parse_queue(*q);
      return std::move(out_);
    }
    const int iterations = iterations_of(root, 3);
    const Node list = root.need("jobs", "a list of jobs");
    const std::vector<Node> items = list.items("a list of jobs");
    if (items.empty()) list.expected("a non-empty list of jobs");
    std::vector<DeviceRequest> requests;
    for (size_t i = 0; i < items.size(); ++i) requests.push_back(read_job(items[i], i, iterations));
    for (size_t i = 0; i < items.size(); ++i)  // counts are placed after every given list, in file order
      if (requests[i].count > 0) place(requests[i], i);
    for (size_t i = 0; i < items.size(); ++i) read_experiment(items[i], out_.jobs[i]);
    return std::move(out_);
  }

 private:
  // queue: {placement, seed, replay_iterations, jobs: [...] or generate: {...}}
  void parse_queue(const Node& q) {
    q.require_map("a mapping with placement, seed, replay_iterations and jobs or generate");
    q.check_keys({"placement", "seed", "replay_iterations", "jobs", "generate"});
    QueueSpec& spec = out_.queue.emplace();
    if (auto p = q.get("placement")) spec.placement = placement_of(*p);
    if (auto s = q.get("seed")) {
      if (spec.placement != JobPlacement::Random) s->fail("the queue's seed is for placement random");
      spec.seed = static_cast<uint64_t>(s->integer(0, kMaxCount, "a seed of 0 to 1000000"));
    }
    if (auto r = q.get("replay_iterations"))
      spec.replay_iterations = static_cast<int>(r->integer(1, 100, "iterations per replay, 1 to 100"));
    const auto jobs = q.get("jobs");
    const auto generate = q.get("generate");
    if (jobs.has_value() == generate.has_value())
      q.expected("jobs (a list) or generate (a mapping), one of them");
    if (jobs) {
      const std::vector<Node> items = jobs->items("a list of jobs");
      if (items.empty()) jobs->expected("a non-empty list of jobs");
      for (size_t i = 0; i < items.size(); ++i) {
        spec.jobs.push_back(queue_job(items[i], i));
        for (size_t k = 0; k < i; ++k)
          if (spec.jobs[k].name == spec.jobs[i].name) second_name(items[i], spec.jobs[i].name);
      }
    } else {
      generate_jobs(*generate, spec);
    }
  }

  static JobPlacement placement_of(const Node& p) {
    const std::string name = p.choice({"packed", "spread", "random"}, "a placement");
    return name == "packed"   ? JobPlacement::Packed
           : name == "spread" ? JobPlacement::Spread
                              : JobPlacement::Random;
  }

  long long device_count(const Node& n, const std::string& job) const {
    const auto D = static_cast<long long>(out_.cluster.devices.size());
    return n.integer(1, D,
                     fmt::format("job \"{}\"'s devices: a count of 1 to {} (the cluster's devices)", job, D));
  }

  // A queue's job: {name, experiment (or workload, strategy, ...), devices, arrival, iterations}; its
  // experiment is read once on the first free devices of the cluster to check it.
  QueueJobSpec queue_job(const Node& item, size_t i) {
    item.require_map("a mapping describing a job");
    item.check_keys({"name", "experiment", "devices", "arrival", "iterations", "workload", "strategy",
                     "memory", "backends"});
    QueueJobSpec job;
    job.name = item.get("name") ? item.get("name")->string("a job name") : fmt::format("job{}", i);
    job.devices = static_cast<int>(device_count(item.need("devices", "a count of devices"), job.name));
    if (auto a = item.get("arrival")) job.arrival_s = a->quantity(Dimension::Time, Sign::NonNegative);
    job.iterations = static_cast<double>(item.need("iterations", "the job's length in iterations")
                                             .integer(1, 1'000'000'000, "iterations, 1 to 1e9"));
    job.experiment = experiment_maker(item, job.name, static_cast<size_t>(job.devices), job.source);
    check_on_first_devices(job);
    return job;
  }

  void check_on_first_devices(const QueueJobSpec& job) const {
    std::vector<int> first(static_cast<size_t>(job.devices));
    std::iota(first.begin(), first.end(), 0);
    Result<Cluster> c = job_cluster(out_.cluster, first);
    if (!c) throw InputError(fmt::format("job \"{}\": {}", job.name, c.error().message));
    (void)job.experiment(std::move(*c));
  }

  // generate: {count, seed, mean_interarrival, iterations: [LO, HI], mix: [{experiment, devices}, ...]}:
  // arrivals 0, then exponential gaps of the mean (inverse transform of mt19937_64's 53-bit uniforms),
  // lengths uniform in [LO, HI], each job's kind drawn uniformly from the mix.
  void generate_jobs(const Node& g, QueueSpec& spec) {
    g.require_map("a mapping with count, seed, mean_interarrival, iterations and mix");
    g.check_keys({"count", "seed", "mean_interarrival", "iterations", "mix"});
    const int count =
        static_cast<int>(g.need("count", "a number of jobs").integer(1, 10000, "1 to 10000 jobs"));
    const auto seed = static_cast<uint64_t>(
        g.get("seed") ? g.get("seed")->integer(0, kMaxCount, "a seed of 0 to 1000000") : 1);
    const double mean = g.need("mean_interarrival", "a time").quantity(Dimension::Time, Sign::Positive);
    const Node range = g.need("iterations", "[LO, HI] iterations");
    const std::vector<Node> lohi = range.items("[LO, HI] iterations");
    if (lohi.size() != 2) range.expected("[LO, HI] iterations");
    const long long lo = lohi[0].integer(1, 1'000'000'000, "iterations, 1 to 1e9");
    const long long hi = lohi[1].integer(lo, 1'000'000'000, fmt::format("iterations, {} to 1e9", lo));
    std::vector<QueueJobSpec> kinds;
    const Node mix = g.need("mix", "a list of {experiment, devices}");
    const std::vector<Node> items = mix.items("a list of {experiment, devices}");
    if (items.empty()) mix.expected("a non-empty list of {experiment, devices}");
    for (size_t k = 0; k < items.size(); ++k) {
      items[k].require_map("a mapping {experiment, devices}");
      items[k].check_keys({"experiment", "devices"});
      QueueJobSpec kind;
      kind.name = fmt::format("mix[{}]", k);
      kind.devices =
          static_cast<int>(device_count(items[k].need("devices", "a count of devices"), kind.name));
      items[k].need("experiment", "an experiment file");
      kind.experiment = experiment_maker(items[k], kind.name, static_cast<size_t>(kind.devices), kind.source);
      check_on_first_devices(kind);
      kind.kind = static_cast<int>(k);
      kinds.push_back(std::move(kind));
    }
    std::mt19937_64 rng(seed);
    auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
    double arrival = 0;
    for (int i = 0; i < count; ++i) {
      if (i > 0) arrival += -mean * std::log1p(-uniform());
      QueueJobSpec job = kinds[rng() % kinds.size()];
      job.name = fmt::format("job{}", i);
      job.arrival_s = arrival;
      job.iterations =
          static_cast<double>(lo + static_cast<long long>(rng() % static_cast<uint64_t>(hi - lo + 1)));
      spec.jobs.push_back(std::move(job));
    }
    spec.generated = fmt::format(
        "{} jobs drawn by seed {}: exponential gaps of mean {}, {} to {} iterations, kinds "
        "drawn uniformly from {} experiments",
        count, seed, format_time(mean), lo, hi, kinds.size());
  }

  static int iterations_of(const Node& n, int otherwise) {
    auto it = n.get("iterations");
    return it ? static_cast<int>(it->integer(1, 1000, "a number of iterations, 1 to 1000")) : otherwise;
  }

  // A job whose name (its own, or job<position> by default) an earlier job has.
  [[noreturn]] static void second_name(const Node& item, const std::string& name) {
    if (auto n = item.get("name")) n->fail(fmt::format("job \"{}\": a second job of that name", name));
    item.fail(
        fmt::format("job \"{}\" (the name a job without one gets from its position): another job "
                    "has that name; name this one",
                    name));
  }

  DeviceRequest read_job(const Node& item, size_t i, int iterations) {
    item.require_map("a mapping describing a job");
    item.check_keys({"name", "experiment", "devices", "placement", "seed", "start", "iterations", "workload",
                     "strategy", "memory", "backends"});
    JobSpec& job = out_.jobs.emplace_back();
    job.name = fmt::format("job{}", i);
    if (auto n = item.get("name")) job.name = n->string("a job name");
    for (size_t k = 0; k + 1 < out_.jobs.size(); ++k)
      if (out_.jobs[k].name == job.name) second_name(item, job.name);
    job.iterations = iterations_of(item, iterations);
    if (auto s = item.get("start")) job.start_s = s->quantity(Dimension::Time, Sign::NonNegative);
    DeviceRequest r{
        item.need("devices", fmt::format("job \"{}\"'s devices: a count or a list of names", job.name))};
    if (r.where.is_list()) {
      for (const char* key : {"placement", "seed"})
        if (auto p = item.get(key))
          p->fail(
              fmt::format("job \"{}\": {} is for a device count, and its devices are listed", job.name, key));
      take_listed(r.where, i);
    } else {
      const auto D = static_cast<long long>(out_.cluster.devices.size());
      r.count = static_cast<int>(r.where.integer(
          1, D,
          fmt::format("job \"{}\"'s devices: a count of 1 to {} (the cluster's devices) or a list of names",
                      job.name, D)));
      if (auto p = item.get("placement")) r.placement = placement_of(*p);
      if (auto s = item.get("seed")) {
        if (r.placement != JobPlacement::Random)
          s->fail(fmt::format("job \"{}\": seed is for placement random", job.name));
        r.seed = static_cast<uint64_t>(s->integer(0, kMaxCount, "a seed of 0 to 1000000"));
      }
    }
    return r;
  }

  void take(int d, size_t job, const Node& where) {
    if (taken_[d])
      where.fail(fmt::format("job \"{}\": device {} is job \"{}\"'s too", out_.jobs[job].name,
                             out_.cluster.devices[d].name, out_.jobs[owner_[d]].name));
    taken_[d] = true;
    owner_[d] = static_cast<int>(job);
    out_.jobs[job].devices.push_back(d);
  }

  void take_listed(const Node& list, size_t job) {
    if (index_.empty())
      for (size_t d = 0; d < out_.cluster.devices.size(); ++d)
        index_.emplace(out_.cluster.devices[d].name, d);
    const std::vector<Node> names = list.items("a list of device names");
    if (names.empty()) list.expected("a non-empty list of device names");
    for (const Node& n : names) {
      const std::string name = n.string("a device name");
      auto it = index_.find(name);
      if (it == index_.end())
        n.fail(fmt::format("job \"{}\": no device named \"{}\" in cluster {} ({} devices)",
                           out_.jobs[job].name, name, out_.cluster.name, out_.cluster.devices.size()));
      take(static_cast<int>(it->second), job, n);
    }
    out_.jobs[job].placement = "given";
  }

  void place(const DeviceRequest& r, size_t job) {
    Result<std::vector<int>> devices = place_job(out_.cluster, taken_, r.count, r.placement, r.seed);
    if (!devices) r.where.fail(fmt::format("job \"{}\": {}", out_.jobs[job].name, devices.error().message));
    for (int d : *devices) take(d, job, r.where);
    out_.jobs[job].placement = r.placement == JobPlacement::Random ? fmt::format("random (seed {})", r.seed)
                                                                   : std::string(to_string(r.placement));
  }

  // The job's workload, strategy and memory (from its file or its entry) on its view of the cluster.
  void read_experiment(const Node& item, JobSpec& job) {
    Result<Cluster> cluster = job_cluster(out_.cluster, job.devices);
    if (!cluster)
      item.need("devices", "").fail(fmt::format("job \"{}\": {}", job.name, cluster.error().message));
    job.experiment = experiment_maker(item, job.name, job.devices.size(), job.source)(std::move(*cluster));
  }

  // A function that reads the job's experiment (its file's or its entry's keys) on a cluster; its
  // errors end with the job's name and its place in the jobs file. The file is read and checked here.
  ExperimentMaker experiment_maker(const Node& item, const std::string& name, size_t devices,
                                   std::string& source) {
    const std::string suffix = fmt::format(" (job \"{}\", {}:{})", name, doc_->name, item.mark().line + 1);
    std::shared_ptr<const Document> file;
    if (auto f = item.get("experiment")) {
      for (const char* key : {"workload", "strategy", "memory", "backends"})
        if (auto k = item.get(key))
          k->fail(
              fmt::format("job \"{}\": {} beside experiment: a job with an experiment file takes its {} "
                          "from that file; expected it there, not here",
                          name, key, key));
      source = resolve_path(*doc_, f->string("an experiment file"));
      Result<std::string> text = read_input_file(source);
      if (!text) f->fail(fmt::format("job \"{}\": {}", name, text.error().message));
      file =
          std::make_shared<const Document>(load_document_text(*text, source));  // YAML errors name the file
      try {
        check_file(Node::root(*file), name, devices, source);
      } catch (const InputError& e) {
        throw InputError(e.what() + suffix);
      }
    } else {
      source = fmt::format("{} line {}", doc_->name, item.mark().line + 1);
    }
    const Node root = file ? Node::root(*file) : item;
    return [file, root, suffix, keep = doc_](Cluster c) {
      try {
        return parse_job_experiment(root, std::move(c));
      } catch (const InputError& e) {
        throw InputError(e.what() + suffix);
      }
    };
  }

  // A job's experiment file: a mapping of an experiment's keys, without faults; its cluster is not
  // used (noted).
  void check_file(const Node& root, const std::string& name, size_t devices, const std::string& path) {
    root.require_map("an experiment: a mapping with keys workload and strategy");
    root.check_keys({"name", "workload", "cluster", "strategy", "memory", "backends", "faults"});
    if (auto f = root.get("faults"))
      f->fail("faults of one job on a shared cluster are not supported (write the job without them)");
    if (root.get("cluster"))
      out_.notes.push_back(
          fmt::format("job {}: the cluster section of {} is not used; the job runs on {} devices of "
                      "the shared cluster {}",
                      name, path, devices, out_.cluster.name));
  }

  std::shared_ptr<const Document> doc_;
  JobsSpec out_;
  std::vector<bool> taken_;
  std::vector<int> owner_;  // per device: its job, or -1
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace

Result<JobsSpec> load_jobs_file(const std::string& path) {
  try {
    return JobsParser(std::make_shared<const Document>(load_document_file(path))).parse();
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

Result<JobsSpec> load_jobs_text(const std::string& text, const std::string& name) {
  try {
    return JobsParser(std::make_shared<const Document>(load_document_text(text, name))).parse();
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

}  // namespace pipegrid::input
