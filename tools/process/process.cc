#include "tools/process/process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>

extern "C" char** environ;

namespace pipegrid::process {

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, std::string& out) {
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    out.append(buf, static_cast<size_t>(n));
  }
}

bool ChildResult::exited() const {
  return started() && WIFEXITED(status);
}
int ChildResult::exit_code() const {
  return exited() ? WEXITSTATUS(status) : -1;
}
int ChildResult::signal() const {
  return started() && WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

namespace {

using Clock = std::chrono::steady_clock;

// A child started and not yet reaped.
struct Running {
  size_t index;
  pid_t pid;
  int answer = -1;         // read end of the answer pipe; -1 once at end of file
  int out = -1, err = -1;  // memory files (capture_output)
  Clock::time_point start;
  ChildResult result;
};

// The whole content of a memory file the child wrote through its own descriptor.
std::string memory_file_text(int fd) {
  std::string text;
  ::lseek(fd, 0, SEEK_SET);
  read_all(fd, text);
  return text;
}

void close_fds(Running& r) {
  for (int* fd : {&r.answer, &r.out, &r.err})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
}

ChildResult start_failure(const char* what) {
  ChildResult r;
  r.start_errno = errno;
  r.start_error = fmt::format("{}: {}", what, std::strerror(r.start_errno));
  return r;
}

// In the child: never returns.
[[noreturn]] void child_main(pid_t parent, int answer_fd, const Running& fds, const ChildOptions& o,
                             const std::function<int(int)>& job) {
  if (o.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before the request took effect
  }
  if (o.capture_output) {
    ::dup2(fds.out, STDOUT_FILENO);
    ::dup2(fds.err, STDERR_FILENO);
  }
  int rc = 1;
  try {
    rc = job(answer_fd);
  } catch (const std::exception& e) {
    fmt::print(std::cerr, "pipegrid: internal error: {}\n", e.what());
  }
  ::close(answer_fd);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(rc);
}

// Forks the child of job i; on failure the returned Running has its result's start_error set.
Running start_child(size_t i, const std::function<int(size_t, int)>& job, const ChildOptions& o) {
  Running r{i, -1, -1, -1, -1, Clock::now(), {}};
  if (o.capture_output) {
    r.out = ::memfd_create("pipegrid-child-stdout", MFD_CLOEXEC);
    r.err = r.out < 0 ? -1 : ::memfd_create("pipegrid-child-stderr", MFD_CLOEXEC);
    if (r.err < 0) {
      r.result = start_failure("cannot create a memory file");
      close_fds(r);
      return r;
    }
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.result = start_failure("cannot create a pipe");
    close_fds(r);
    return r;
  }
  const pid_t parent = ::getpid();
  std::cout.flush();  // the child must not inherit buffered output
  std::fflush(nullptr);
  r.start = Clock::now();
  r.pid = ::fork();
  if (r.pid < 0) {
    r.result = start_failure("cannot fork");
    ::close(fds[0]);
    ::close(fds[1]);
    close_fds(r);
    return r;
  }
  if (r.pid == 0) {
    ::close(fds[0]);
    child_main(parent, fds[1], r, o, [&](int fd) { return job(i, fd); });
  }
  ::close(fds[1]);
  r.answer = fds[0];
  return r;
}

// Reaps a child whose answer pipe is at end of file (it has exited, or is about to).
ChildResult finish_child(Running& r) {
  int status = 0;
  while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.result.status = status;
  r.result.wall_s = std::chrono::duration<double>(Clock::now() - r.start).count();
  if (r.out >= 0) r.result.out = memory_file_text(r.out);
  if (r.err >= 0) r.result.err = memory_file_text(r.err);
  close_fds(r);
  return std::move(r.result);
}

// Reads what the running children sent, waiting until at least one pipe has something (or its end).
// Returns the keys of the children whose pipes reached end of file.
std::vector<pid_t> read_answers(std::map<pid_t, Running>& running) {
  std::vector<pollfd> polled;
  for (const auto& [pid, r] : running) polled.push_back({r.answer, POLLIN, 0});
  int ready;
  while ((ready = ::poll(polled.data(), polled.size(), -1)) < 0 && errno == EINTR) {
  }
  std::vector<pid_t> ended;
  size_t k = 0;
  for (auto& [pid, r] : running) {
    const short revents = polled[k++].revents;
    if (ready < 0) {  // poll itself failed: wait for every child instead of spinning
      ended.push_back(pid);
      continue;
    }
    if (revents == 0) continue;
    char buf[1 << 16];
    ssize_t n;
    while ((n = ::read(r.answer, buf, sizeof buf)) < 0 && errno == EINTR) {
    }
    if (n > 0)
      r.result.answer.append(buf, static_cast<size_t>(n));
    else
      ended.push_back(pid);  // end of file, or an error: the child is done writing either way
  }
  return ended;
}

void kill_all(std::map<pid_t, Running>& running) {
  for (auto& [pid, r] : running) {
    ::kill(pid, SIGKILL);
    finish_child(r);
  }
  running.clear();
}

}  // namespace

bool run_pool(size_t count, int parallel, const std::function<int(size_t, int)>& job,
              const std::function<bool(size_t, ChildResult&&)>& on_done, const ChildOptions& options) {
  const size_t width = static_cast<size_t>(std::max(1, parallel));
  std::map<pid_t, Running> running;
  size_t next = 0;
  while (next < count || !running.empty()) {
    while (next < count && running.size() < width) {
      Running r = start_child(next, job, options);
      if (r.pid > 0) {
        running.emplace(r.pid, std::move(r));
        ++next;
        continue;
      }
      if (!running.empty()) break;  // try again once one of them ends
      ++next;
      if (!on_done(r.index, std::move(r.result))) return false;
    }
    if (running.empty()) continue;
    for (pid_t pid : read_answers(running)) {
      auto it = running.find(pid);
      const size_t i = it->second.index;
      ChildResult result = finish_child(it->second);
      running.erase(it);
      if (!on_done(i, std::move(result))) {
        kill_all(running);
        return false;
      }
    }
  }
  return true;
}

ChildResult run_child(const ChildJob& job, const ChildOptions& options) {
  ChildResult out;
  run_pool(
      1, 1, [&](size_t, int fd) { return job(fd); },
      [&](size_t, ChildResult&& r) {
        out = std::move(r);
        return true;
      },
      options);
  return out;
}

// Wire format: one byte, 1 for success, then the answer's bytes or the error's message.
int send_answer(int answer_fd, const Result<std::string>& answer) {
  const char ok = answer.ok() ? 1 : 0;
  const std::string& body = answer.ok() ? *answer : answer.error().message;
  return write_all(answer_fd, &ok, 1) && write_all(answer_fd, body.data(), body.size()) ? 0 : 1;
}

Result<std::string> answer_of(const ChildResult& r, std::string_view what) {
  if (!r.started()) return Error{r.start_error};
  if (r.signal() != 0) return Error{fmt::format("{} died ({})", what, strsignal(r.signal()))};
  if (r.exit_code() != 0 || r.answer.empty()) return Error{fmt::format("{} failed without an answer", what)};
  if (r.answer[0] != 1) return Error{r.answer.substr(1)};
  return r.answer.substr(1);
}

// --- commands -----------------------------------------------------------------------------------

int spawn(const std::vector<std::string>& argv, Output output) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (output == Output::Quiet) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  } else if (output == Output::ToStderr) {
    posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  }
  std::cout.flush();  // this process's pending output comes before the command's
  std::fflush(nullptr);
  pid_t pid;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::optional<std::string> python_with(std::string_view module) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("PIPEGRID_PYTHON"); env != nullptr && *env != '\0') {
    candidates.push_back(env);  // the one chosen: no other in its place
  } else {
    candidates.push_back("/usr/bin/python3");
    candidates.push_back("python3");
  }
  for (const std::string& py : candidates)
    if (spawn({py, "-c",
               fmt::format("import importlib.util, sys; sys.exit(importlib.util.find_spec('{}') is None)",
                           module)},
              Output::Quiet) == 0)
      return py;
  return std::nullopt;
}

std::string python_advice() {
  const char* env = std::getenv("PIPEGRID_PYTHON");
  if (env == nullptr || *env == '\0') return "or set PIPEGRID_PYTHON";
  return fmt::format(
      "or fix PIPEGRID_PYTHON=\"{}\": it cannot be run or lacks the module (unset, pipegrid "
      "tries /usr/bin/python3, then python3)",
      env);
}

}  // namespace pipegrid::process
