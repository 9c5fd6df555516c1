// Subcommands of the `pipegrid` command line. Each lives in its own file, registers its options on
// the application, and returns the function that runs it once the arguments are parsed. Exit
// statuses: 0 success, 2 bad input or usage, 1 internal error.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipegrid::cli {

inline constexpr int kOk = 0;
inline constexpr int kInternal = 1;
inline constexpr int kBadInput = 2;

// Prints "pipegrid: <message>" on stderr and returns kBadInput.
int bad_input(const std::string& message);

// Option checks CLI11 lacks: CLI::PositiveNumber lets nan and inf through; an empty path is not
// "no path".
inline const CLI::Validator kFinitePositive(
    [](std::string& v) -> std::string {
      double x = 0;
      if (!CLI::detail::lexical_cast(v, x)) return "expected a number, got \"" + v + "\"";
      if (!std::isfinite(x) || x <= 0) return "expected a finite positive number, got " + v;
      return {};
    },
    "POSITIVE");
// Whole counts (--global-batch, --jobs, --top): CLI::PositiveNumber's message for 0 printed its
// range as two doubles of 309 digits.
inline std::string count_error(const std::string& v, long long min) {
  long long x = 0;
  if (!CLI::detail::lexical_cast(v, x)) return "expected a whole number, got \"" + v + "\"";
  if (x < min)
    return (min == 1 ? "expected a positive whole number, got " : "expected a whole number >= 0, got ") + v;
  return {};
}
inline const CLI::Validator kPositiveCount([](std::string& v) { return count_error(v, 1); }, "COUNT");
inline const CLI::Validator kCount([](std::string& v) { return count_error(v, 0); }, "COUNT");
// Samples per micro-batch on the command line: whole (a fractional sample is no real batch; `run`
// refuses it unless allow_fractional_samples) and at most an experiment's 1,000,000 (kMaxCount).
inline const CLI::Validator kSampleCount(
    [](std::string& v) -> std::string {
      if (std::string e = count_error(v, 1); !e.empty()) return e + " (samples per micro-batch)";
      if (long long x = 0; CLI::detail::lexical_cast(v, x) && x > 1'000'000)
        return "expected at most 1000000 samples per micro-batch, got " + v;
      return {};
    },
    "SAMPLES");
inline const CLI::Validator kNonEmpty(
    [](std::string& v) -> std::string {
      return v.empty() ? "expected a file name, got an empty string" : "";
    },
    "");

// A cluster preset's description: the first comment line of its file (tools/cli/cluster.cc).
std::string preset_description(std::string_view text);

// `--set KEY=VALUE` (repeatable): sets any key of the experiment before it is read.
void add_set_option(CLI::App& app, std::vector<std::string>& overrides);

// `--devices groups|all`: the device tables of run and plan grouped by role with ranges (the default),
// or every device by name.
void add_devices_option(CLI::App& app, std::string& devices);

// `--fold` / `--whole`: the replica fold forced where the plan folds, or never (default: from
// kFoldThresholdTasks tasks; tools/process/folded_replay.h).
void add_fold_options(CLI::App& app, bool& fold, bool& whole);

// `--memory-margin BYTES`: the memory kept from every device for the CUDA context, NCCL buffers and
// fragmentation (the experiment's memory.reserve; default core/device.h default_memory_reserve).
void add_memory_margin_option(CLI::App& app, std::string& margin);
// The --set overrides with --memory-margin's as memory.reserve (a bare 0 as 0B); unchanged without one.
std::vector<std::string> with_memory_margin(std::vector<std::string> overrides, const std::string& margin);
// An error about that override names the option the user gave: "--memory-margin 100GiB: ..." for
// "--set memory.reserve=100GiB: ...".
std::string margin_message(std::string message, const std::string& margin);

}  // namespace pipegrid::cli
namespace pipegrid {
struct Experiment;
}
namespace pipegrid::cli {

// `pipegrid run --json` on an experiment already read (`where` names it in messages).
int run_loaded(const Experiment& exp, const std::string& where);

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_run_command(CLI::App& parent);
Command add_list_command(CLI::App& parent);
Command add_schedule_command(CLI::App& parent);
Command add_workload_command(CLI::App& parent);
Command add_device_command(CLI::App& parent);
Command add_plan_command(CLI::App& parent);
Command add_place_command(CLI::App& parent);
Command add_cluster_command(CLI::App& parent);
Command add_sweep_command(CLI::App& parent);
Command add_import_command(CLI::App& parent);  // tools/cli/interop.cc
Command add_export_command(CLI::App& parent);
Command add_replay_command(CLI::App& parent);
Command add_search_command(CLI::App& parent);
Command add_goodput_command(CLI::App& parent);  // tools/cli/goodput.cc
Command add_jobs_command(CLI::App& parent);     // tools/cli/jobs.cc

}  // namespace pipegrid::cli
