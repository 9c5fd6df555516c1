#include "tools/input/jobs_yaml.h"

#include <fmt/format.h>

#include <optional>
#include <unordered_map>

#include "core/file_io.h"
#include "core/jobs.h"
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
  explicit JobsParser(const Document& doc) : doc_(doc) {}

  JobsSpec parse() {
    const Node root = Node::root(doc_);
    if (root.is_null()) root.fail("expected a mapping with keys cluster and jobs, got an empty document");
    root.require_map("a mapping with keys cluster and jobs");
    root.check_keys({"name", "cluster", "iterations", "jobs"});
    if (auto n = root.get("name")) out_.name = n->string("a name");
    out_.cluster = parse_cluster(root.need("cluster", "a mapping describing the shared cluster"));
    taken_.assign(out_.cluster.devices.size(), false);
    owner_.assign(out_.cluster.devices.size(), -1);
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
  static int iterations_of(const Node& n, int otherwise) {
    auto it = n.get("iterations");
    return it ? static_cast<int>(it->integer(1, 1000, "a number of iterations, 1 to 1000")) : otherwise;
  }

  DeviceRequest read_job(const Node& item, size_t i, int iterations) {
    item.require_map("a mapping describing a job");
    item.check_keys({"name", "experiment", "devices", "placement", "seed", "start", "iterations", "workload",
                     "strategy", "memory", "backends"});
    JobSpec& job = out_.jobs.emplace_back();
    job.name = fmt::format("job{}", i);
    if (auto n = item.get("name")) {
      job.name = n->string("a job name");
      for (size_t k = 0; k + 1 < out_.jobs.size(); ++k)
        if (out_.jobs[k].name == job.name)
          n->fail(fmt::format("job \"{}\": a second job of that name", job.name));
    }
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
      if (auto p = item.get("placement")) {
        const std::string name = p->choice({"packed", "spread", "random"}, "a placement");
        r.placement = name == "packed"   ? JobPlacement::Packed
                      : name == "spread" ? JobPlacement::Spread
                                         : JobPlacement::Random;
      }
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
    std::optional<Document> file;
    if (auto f = item.get("experiment")) {
      for (const char* key : {"workload", "strategy", "memory", "backends"})
        if (auto k = item.get(key))
          k->fail(fmt::format("job \"{}\": {} is in its experiment file, given here too", job.name, key));
      job.source = resolve_path(doc_, f->string("an experiment file"));
      Result<std::string> text = read_input_file(job.source);
      if (!text) f->fail(fmt::format("job \"{}\": {}", job.name, text.error().message));
      file.emplace(load_document_text(*text, job.source));  // a YAML error names the file: not wrapped
    }
    try {
      if (file) {
        read_file(*file, job, std::move(*cluster));
      } else {
        job.experiment = parse_job_experiment(item, std::move(*cluster));
        job.source = fmt::format("{} line {}", doc_.name, item.mark().line + 1);
      }
    } catch (const InputError& e) {
      throw InputError(
          fmt::format("{} (job \"{}\", {}:{})", e.what(), job.name, doc_.name, item.mark().line + 1));
    }
  }

  // The job's experiment file: its workload, strategy and memory; its cluster is not used (noted).
  void read_file(const Document& sub, JobSpec& job, Cluster cluster) {
    const Node root = Node::root(sub);
    root.require_map("an experiment: a mapping with keys workload and strategy");
    root.check_keys({"name", "workload", "cluster", "strategy", "memory", "backends", "faults"});
    if (auto f = root.get("faults"))
      f->fail("faults of one job on a shared cluster are not supported (write the job without them)");
    job.experiment = parse_job_experiment(root, std::move(cluster));
    if (root.get("cluster"))
      out_.notes.push_back(
          fmt::format("job {}: the cluster section of {} is not used; the job runs on {} devices of "
                      "the shared cluster {}",
                      job.name, job.source, job.devices.size(), out_.cluster.name));
  }

  const Document& doc_;
  JobsSpec out_;
  std::vector<bool> taken_;
  std::vector<int> owner_;  // per device: its job, or -1
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace

Result<JobsSpec> load_jobs_file(const std::string& path) {
  try {
    const Document doc = load_document_file(path);
    return JobsParser(doc).parse();
  } catch (const InputError& e) {
    return Error{e.what()};
  }
}

}  // namespace pipegrid::input
