// `pipegrid search --emit FILE`: one search candidate as an experiment file that `pipegrid run`
// runs as the search ran it (tools/cli/search_emit.cc).
#pragma once

#include <string>
#include <vector>

#include "core/experiment.h"
#include "core/planners/search3d.h"
#include "core/result.h"

namespace pipegrid::cli {

struct EmitRequest {
  std::string base_file;               // the search's experiment file
  std::vector<std::string> overrides;  // its --set arguments
  const Experiment& base;              // as the search read it
  const Search3dCandidate& candidate;
  int global_batch = 0;
  std::string out_file;
  std::string comment;  // the file's first line, after "# "
};

// Writes the candidate's experiment to r.out_file: the base document with the candidate's strategy
// (megatron partitioner, t, p, d, schedule, chunks, SP; micro_batch_size b per replica and
// global_batch) and memory (recompute, zero), paths rewritten relative to the new file's folder.
// The text is read back and checked against search3d_experiment before it is written; an Error
// says what failed (nothing is written then).
Status emit_candidate(const EmitRequest& r);

}  // namespace pipegrid::cli
