// Child processes, in one place: a function run in a forked child whose answer comes back as bytes,
// a pool that runs many such children a few at a time, commands spawned and waited for, and whole
// reads and writes on file descriptors. SimGrid allows one simulation per process, so every replay
// after a process's first runs in a child (tools/process/isolated_replay.h, `pipegrid search`,
// `pipegrid sweep`).
//
// A forked child is a copy of this process without exec: it has the program and its libraries
// loaded already, which is most of what a small sweep point costs as a new process (docs/speed.md,
// "Start-up"). Before each fork every stdio and iostream buffer is flushed (the child must not
// write the parent's pending output a second time); the child leaves with _exit after flushing its
// own, so nothing of the parent's (a database connection, atexit handlers) is closed twice.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace pipegrid::process {

// Writes the n bytes at data to fd, across short writes and EINTR. False on an error (errno says
// which).
bool write_all(int fd, const void* data, size_t n);

// Appends what fd holds, up to end of file, to out, across EINTR. False on a read error (what was
// read before it stays in out).
bool read_all(int fd, std::string& out);

// --- forked children ----------------------------------------------------------------------------

// How a child ended, and what it sent back.
struct ChildResult {
  // Not empty: no child ran ("cannot create a pipe: ...", "cannot fork: ..."); start_errno is the
  // failed call's errno. The fields below are then empty.
  std::string start_error;
  int start_errno = 0;
  int status = 0;        // waitpid's status word
  std::string answer;    // every byte the job wrote on its answer descriptor
  std::string out, err;  // its standard output and error (ChildOptions::capture_output only)
  double wall_s = 0;     // seconds from the fork to the child's end, by the steady clock

  bool started() const { return start_error.empty(); }
  bool exited() const;    // ended by _exit / exit (not by a signal)
  int exit_code() const;  // its exit status; -1 unless exited()
  int signal() const;     // the signal that ended it; 0 unless it was one
};

struct ChildOptions {
  // The child's standard output and error go to memory files (memfd), returned in out and err:
  // unlike pipes they never fill, whatever the child prints.
  bool capture_output = false;
  // The child gets SIGKILL when this process dies (Linux's PR_SET_PDEATHSIG), so that a killed
  // parent leaves no child running.
  bool die_with_parent = false;
};

// What a child runs: it writes its answer, if any, on answer_fd (write_all, send_answer) and
// returns the child's exit status. An exception that escapes it ends the child with status 1 and
// "pipegrid: internal error: WHAT" on its standard error, as the binary's main does.
using ChildJob = std::function<int(int answer_fd)>;

// Runs job in a forked child and waits for it. The answer is read while the child runs, so an
// answer of any size comes back (a pipe holds 64 KiB: a parent that read only after waitpid would
// wait forever on a child blocked writing a larger one).
ChildResult run_child(const ChildJob& job, const ChildOptions& options = {});

// Runs jobs 0 .. count - 1, each in a forked child, at most `parallel` (at least 1) at a time,
// started in index order. on_done(i, result) runs in this process as each child ends, in the order
// they end. A child that cannot start while others run is tried again when one of them ends; with
// none running, its ChildResult (start_error set) goes to on_done. If on_done returns false, the
// children still running are killed (SIGKILL) and reaped, none is started, and run_pool returns
// false; true once every job was handed to on_done.
bool run_pool(size_t count, int parallel, const std::function<int(size_t i, int answer_fd)>& job,
              const std::function<bool(size_t i, ChildResult&& result)>& on_done,
              const ChildOptions& options = {});

// An answer in two parts: success and its bytes, or failure and its message. A job writes it with
// send_answer (returning its value as the exit status: 0 when the answer was written, 1 if not);
// answer_of reads it back, or says why there is none, naming the child `what` ("the simulation
// process"): "WHAT died (Killed)", "WHAT failed without an answer", or the start error.
int send_answer(int answer_fd, const Result<std::string>& answer);
Result<std::string> answer_of(const ChildResult& r, std::string_view what);

// --- commands -----------------------------------------------------------------------------------

enum class Output {
  Inherit,   // this process's standard streams
  ToStderr,  // standard output and error to this process's standard error (keeps stdout for --json)
  Quiet,     // both to /dev/null
};

// Runs argv (argv[0] searched in PATH) and waits for it. Returns its exit status, or -1 if it could
// not be started or did not exit normally (a signal).
int spawn(const std::vector<std::string>& argv, Output output);

// A Python interpreter that can import `module`: $PIPEGRID_PYTHON when set (only it: a chosen
// interpreter that is missing is not replaced by another), else Debian's /usr/bin/python3, then
// python3 in PATH. It finds the module without importing it (importing matplotlib costs about half
// a second, which the script that needs it pays once anyway).
std::optional<std::string> python_with(std::string_view module);
// The end of a message saying no python_with was found: "or set PIPEGRID_PYTHON", or, when it is
// set, that it cannot be run or lacks the module.
std::string python_advice();

}  // namespace pipegrid::process
