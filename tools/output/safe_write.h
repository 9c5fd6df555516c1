// Output files that never lose data: the content goes to a temporary file in the target's folder,
// every write, the fsync and the close are checked (ENOSPC, EFBIG, ...), and only a complete file
// is renamed over the target. The target must be a regular file or absent (a directory, device,
// FIFO or symbolic link is refused), and its folder must exist (it is not created). On any failure
// the temporary file is removed and whatever existed before is left as it was.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace pipegrid::output {

// Errors name the path and the OS's reason, e.g.
//   cannot write "out/trace.json": File too large (nothing was changed)
Status write_file_safely(const std::string& path, std::string_view content);

// A path the command line names, with the option that names it ("--trace", "the experiment").
struct NamedPath {
  std::string what;
  std::string path;
};

// Fails if an output is the same file as an input or as another output (compared after resolving
// "." and "..", symbolic links and hard links), e.g.
//   --trace "exp.yaml" is the experiment file: an output must not overwrite an input
// Empty paths, "-" (standard input/output) and inputs that are not files (preset names) are skipped.
Status check_distinct_outputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

}  // namespace pipegrid::output
