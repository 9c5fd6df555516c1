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

#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/experiment.h"
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

struct JobsSpec {
  std::string name;
  Cluster cluster;
  std::vector<JobSpec> jobs;
  std::vector<std::string> notes;  // what the output must state (a job file's cluster not used)
};

Result<JobsSpec> load_jobs_file(const std::string& path);

}  // namespace pipegrid::input
