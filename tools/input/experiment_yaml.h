// Experiment files (YAML): `workload`, `cluster`, `strategy` and optional `memory` sections.
// Every error names file:line:column, the key path, what was expected and what was found.
#pragma once

#include <string>
#include <vector>

#include "core/experiment.h"
#include "core/result.h"

namespace pipegrid::input {

// `overrides`: `--set KEY=VALUE` arguments applied to the document before it is read
// (input::apply_overrides); their errors name the argument. `batch_required` false: the strategy may
// leave the batch out (no global_batch, micro_batches or micro_batch_size needed), for the 3D
// search's base experiment, whose batch the search sets (its --global-batch).
Result<Experiment> load_experiment_file(const std::string& path,
                                        const std::vector<std::string>& overrides = {},
                                        bool batch_required = true);
Result<Experiment> load_experiment_text(const std::string& text, const std::string& name,
                                        const std::vector<std::string>& overrides = {});

struct Document;
// Reads an experiment document whose tree may have been changed (overrides, sweep points) and runs
// its backend placement (place_backends: the workload returned is the placed one); throws
// InputError.
Experiment parse_experiment(const Document& doc, bool batch_required = true);

class Node;
// A job of a jobs file (pipegrid jobs): the experiment's `name`, `workload`, `strategy`, `memory` and
// `backends` read from `root` (its keys are the caller's to check) on the cluster the caller gives:
// the shared cluster seen from the job's devices. Throws InputError.
Experiment parse_job_experiment(const Node& root, Cluster cluster, bool batch_required = true);

}  // namespace pipegrid::input
