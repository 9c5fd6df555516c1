// Jobs files (YAML, pipegrid jobs): several jobs on one shared cluster (docs/jobs.md).
//
//   name: two GPT jobs                  optional
//   cluster: {preset: ...}              the shared cluster, as in experiment files
//   iterations: 3                       each job's, unless it gives its own (default 3)
//   jobs:
//     - name: a                         default job<i>
//       experiment: a.yaml              its workload, strategy, memory (the file's cluster is not
//                                       used: the output says so), or those keys written here
//       devices: 32                     a count, placed by `placement`, or a list of device names
//       placement: packed               packed | spread | random (with `seed`), for a count
//       start: 10ms                     when its first iteration may start (default 0s)
//       iterations: 2
// Every error names file:line:column and the job.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/experiment.h"
#include "core/jobs.h"
#include "core/result.h"

namespace pipegrid::input {

struct JobSpec {
  std::string name;
  Experiment experiment;     // on the shared cluster seen from its devices (core/jobs.h job_cluster)
  std::vector<int> devices;  // the shared cluster's devices, in the job's order
  std::string placement;     // "given", "packed", "spread", "random (seed 1)"
  std::string source;        // where its workload and strategy come from
  int iterations = 3;
  double start_s = 0;
};

struct Document;
// Reads a job's experiment on the cluster given (its view of the shared cluster); throws InputError,
// whose message names the job.
using ExperimentMaker = std::function<Experiment(Cluster)>;

// A job of a queue: placed when it starts, so its experiment is read then, on its devices.
struct QueueJobSpec {
  std::string name;
  std::string source;
  double arrival_s = 0;
  int devices = 0;
  double iterations = 0;
  ExperimentMaker experiment;
  int kind = -1;  // a generator's kind (its mix entry): jobs of one kind plan alike; -1: listed
};

struct QueueSpec {
  JobPlacement placement = JobPlacement::Packed;
  uint64_t seed = 1;          // random placement
  int replay_iterations = 3;  // iterations per replay of a running set
  std::vector<QueueJobSpec> jobs;
  std::string generated;  // how a generator made the jobs; empty when listed
};

struct JobsSpec {
  std::string name;
  Cluster cluster;
  std::vector<JobSpec> jobs;       // `jobs:`, placed up front
  std::optional<QueueSpec> queue;  // `queue:` instead
  std::vector<std::string> notes;  // what the output must state (a job file's cluster not used)
  std::vector<std::shared_ptr<const Document>> documents;  // what the makers read
};

Result<JobsSpec> load_jobs_file(const std::string& path);
// A jobs file's text; `name` names it in messages and its experiment paths resolve against it.
Result<JobsSpec> load_jobs_text(const std::string& text, const std::string& name);

}  // namespace pipegrid::input
