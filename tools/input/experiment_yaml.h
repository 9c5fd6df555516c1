// Experiment files (YAML): `workload`, `cluster`, `strategy` and optional `memory` sections.
// Every error names file:line:column, the key path, what was expected and what was found.
#pragma once

#include <string>

#include "core/experiment.h"
#include "core/result.h"

namespace pipegrid::input {

Result<Experiment> load_experiment_file(const std::string& path);
Result<Experiment> load_experiment_text(const std::string& text, const std::string& name);

}  // namespace pipegrid::input
