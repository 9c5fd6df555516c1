// Runs a command as a child process and captures its exit status, stdout and stderr.
#pragma once

#include <string>
#include <vector>

namespace pipegrid::testing {

struct CommandResult {
  int exit_code = -1;  // -1 if it did not exit normally
  std::string out;
  std::string err;
};

CommandResult run_command(const std::vector<std::string>& argv, const std::string& cwd = "");

std::string read_file(const std::string& path);

}  // namespace pipegrid::testing
